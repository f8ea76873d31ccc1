"""Progress where stderr is not a terminal (a log, CI, nohup): rich's bar printed nothing there until the work was
done, and a save of a CUDA image takes minutes. Lines now come every LINE_EVERY seconds, and one at the end; a
clock this test moves stands in for the minutes (test_transport checks a real save's lines)."""

from __future__ import annotations

import pytest

from dockyard import console


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_lines_come_every_half_minute_and_at_the_end_in_words(capsys):
    clock = Clock()
    with console.Lines(things=False, clock=clock) as bar:
        task = bar.add_task("save dockyard-0.1.0-cu132.tar.zst", total=6_900_000_000)
        for _ in range(69):  # 100 MB a second
            clock.now += 1
            bar.advance(task, 100_000_000)
        bar.advance(task, 5_000_000)  # the tar's own headers: past the total
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["save dockyard-0.1.0-cu132.tar.zst: 3.0 GB of 6.9 GB (43%), 30 s, 100.0 MB/s, about 39 s left",
                     "save dockyard-0.1.0-cu132.tar.zst: 6.0 GB of 6.9 GB (87%), 60 s, 100.0 MB/s, about 9 s left",
                     "save dockyard-0.1.0-cu132.tar.zst: 6.9 GB of 6.9 GB (100%) in 69 s, 100.0 MB/s"]


def test_counts_say_so_and_a_failure_leaves_no_last_line(capsys):
    clock = Clock()
    with console.Lines(things=True, clock=clock) as bar:
        task = bar.add_task("reading files", total=600)
        clock.now += 31
        bar.advance(task, 37)
    assert capsys.readouterr().err.splitlines() == ["reading files: 37 of 600 (6%), 31 s, about 7.9 min left"]  # once
    with pytest.raises(KeyError, match="stopped"):  # the failure goes on to the caller, not swallowed by the bar
        with console.Lines(things=False, clock=clock) as bar:
            bar.add_task("copy x", total=None)
            raise KeyError("stopped")
    assert capsys.readouterr().err == "", "the error says what happened; no 100 % after it"


def test_a_log_line_says_the_rate_and_the_time_left_as_a_bar_does(capsys):
    """A terminal's bar showed MB/s; a log's lines said '1.2 GB of 6.9 GB (17%), 41 s' and left the reader of a CI
    log to work out whether the ship of a CUDA image would end in a minute or an hour. A transfer resumed part-way
    (a ship's rsync) counts its rate from where it began this time."""
    clock = Clock()
    with console.Lines(things=False, clock=clock) as bar:
        task = bar.add_task("ship dockyard_0.1.0-cu132.tar.zst", total=2_000_000_000, completed=1_000_000_000)
        for _ in range(100):  # 10 MB a second
            clock.now += 1
            bar.advance(task, 10_000_000)
    with console.Lines(things=False, clock=clock) as bar:
        unknown = bar.add_task("copy model", total=None)
        clock.now += 30
        bar.advance(unknown, 6_000_000)
        clock.now += 1
        bar.advance(unknown, 1_000_000)
    assert capsys.readouterr().err.splitlines() == [
        "ship dockyard_0.1.0-cu132.tar.zst: 1.3 GB of 2.0 GB (65%), 30 s, 10.0 MB/s, about 70 s left",
        "ship dockyard_0.1.0-cu132.tar.zst: 1.6 GB of 2.0 GB (80%), 60 s, 10.0 MB/s, about 40 s left",
        "ship dockyard_0.1.0-cu132.tar.zst: 1.9 GB of 2.0 GB (95%), 1.5 min, 10.0 MB/s, about 10 s left",
        "ship dockyard_0.1.0-cu132.tar.zst: 2.0 GB of 2.0 GB (100%) in 1.7 min, 10.0 MB/s",
        "copy model: 6.0 MB, 30 s, 200.0 kB/s",
        "copy model: 7.0 MB in 31 s, 225.8 kB/s"]


def test_a_log_line_gives_no_time_left_before_the_work_has_really_begun(capsys):
    """`invoke save --variant=cu128 > log`: docker save gathers the layers for a minute before the first byte of the
    8.4 GB comes, and the first line said '512 B of 8.4 GB (0%), 53 s, 10 B/s, about 241729.1 h left'. A rate read
    from under 1% of the work says no time left yet; the lines after it do."""
    clock = Clock()
    with console.Lines(things=False, clock=clock) as bar:
        task = bar.add_task("save dockyard_0.1.0-cu128.tar.zst", total=8_400_000_000)
        clock.now += 53
        bar.advance(task, 512)
        clock.now += 30
        bar.advance(task, 4_200_000_000)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "save dockyard_0.1.0-cu128.tar.zst: 512 B of 8.4 GB (0%), 53 s, 10 B/s"
    assert lines[1].endswith("(50%), 83 s, 50.6 MB/s, about 83 s left")
