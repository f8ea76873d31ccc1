"""Progress where stderr is not a terminal (a log, CI, nohup): rich's bar printed nothing there until the work was
done, and a save of a CUDA image takes minutes. Lines now come every LINE_EVERY seconds, and one at the end; a
clock this test moves stands in for the minutes (test_transport checks a real save's lines)."""

from __future__ import annotations

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
    assert lines == ["save dockyard-0.1.0-cu132.tar.zst: 3.0 GB of 6.9 GB (43%), 30 s",
                     "save dockyard-0.1.0-cu132.tar.zst: 6.0 GB of 6.9 GB (87%), 60 s",
                     "save dockyard-0.1.0-cu132.tar.zst: 6.9 GB of 6.9 GB (100%), 69 s"]


def test_counts_say_so_and_a_failure_leaves_no_last_line(capsys):
    clock = Clock()
    with console.Lines(things=True, clock=clock) as bar:
        task = bar.add_task("reading files", total=600)
        clock.now += 31
        bar.advance(task, 37)
    assert capsys.readouterr().err.splitlines() == ["reading files: 37 of 600 (6%), 31 s"]  # once: nothing since
    try:
        with console.Lines(things=False, clock=clock) as bar:
            bar.add_task("copy x", total=None)
            raise KeyError("stopped")
    except KeyError:
        pass
    assert capsys.readouterr().err == "", "the error says what happened; no 100 % after it"
