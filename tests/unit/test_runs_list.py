"""`invoke runs`: a newcomer's runs folder at a glance (the newcomer audit: after a few runs there was no command that
listed them, `invoke runs` was "no task named 'runs'", and which one completed or could be resumed was a `cat` of
each manifest). Each manifest is read as untrusted, as the run's own summary reads it."""

from __future__ import annotations

import json
import os
from pathlib import PurePosixPath

import pytest

from dockyard.common import runfolder
from dockyard.launch import node
from tests.support.cli import invoke, invoke_here


def _run(runs, name, age, **manifest):
    folder = runs / name
    folder.mkdir(parents=True)
    if manifest:
        (folder / "manifest.json").write_text(json.dumps({"run_id": name, "variant": "cpu", "world_size": 2,
                                                          **manifest}))
    return _aged(folder, age)


def _aged(folder, age):
    os.utime(folder, (1_800_000_000 - age, 1_800_000_000 - age))
    return folder


def _listed(runs):
    r = invoke_here("runs", env={"INVOKE_DOCKYARD_RUNS_DIR": str(runs)})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    return r.stdout


def test_the_runs_are_listed_newest_first_with_their_status_and_loss(tmp_path):
    runs = tmp_path / "runs"
    _run(runs, "lora-old", 300, recipe="lora", status="completed",
         metrics={"steps": 50, "loss_first": 6.2327, "loss_last": 5.3215})
    _run(runs, "zero2-stopped", 200, recipe="zero2", status="failed", metrics={"steps": 20})
    _run(runs, "ddp-native", 100, recipe="ddp", status="completed", variant="native",
         metrics={"steps": 5, "loss_first": 6.0, "loss_last": 5.9})
    _run(runs, "empty", 50)  # stopped before the trainer wrote anything
    for tool in ("slurm", "k8s", "shell"):  # what invoke slurm, k8s and shell write there: no run's
        _run(runs, tool, 0)
    damaged = _run(runs, "damaged", 10)
    (damaged / "manifest.json").write_text('{"run_id": "damaged", "status": "compl')  # cut off as it was written
    _aged(damaged, 10)
    out = _listed(runs)
    lines = out.splitlines()
    order = [next(i for i, line in enumerate(lines) if line.startswith(name + " "))
             for name in ("damaged", "empty", "ddp-native", "zero2-stopped", "lora-old")]
    assert order == sorted(order), out
    row = {line.split()[0]: line for line in lines}
    assert "lora" in row["lora-old"] and "completed" in row["lora-old"] and "6.2327 → 5.3215" in row["lora-old"]
    assert "failed" in row["zero2-stopped"] and " 20 " in row["zero2-stopped"]
    assert "native" in row["ddp-native"]
    assert "no manifest" in row["empty"]
    assert "unreadable" in row["damaged"]
    assert not {"slurm", "k8s", "shell"} & set(row), out
    # the ids whole, whatever the width, and what to do next with one
    assert "invoke run --resume --run-id=ID" in out and "invoke export --run=ID" in out


def test_the_compile_cache_compose_and_k8s_keep_in_the_runs_folder_is_no_run(tmp_path):
    """The newcomer's walk: after a run of compose/train.yml (the pods of `invoke k8s` too), which keeps its compiled
    kernels in the runs folder's .cache/compile, `invoke runs` listed '.cache ... no manifest (stopped before it
    began?)', a run that never was, and a runs folder holding that alone was not 'no runs yet'."""
    runs = tmp_path / "runs"
    cache = runs / PurePosixPath(node.COMPILE_IN_RUNS).relative_to(node.RUNS_INSIDE)
    (cache / "inductor").mkdir(parents=True)  # as the trainer makes it there
    assert "no runs in" in _listed(runs)
    _run(runs, "ddp-compose", 100, recipe="ddp", status="completed", metrics={"steps": 50})
    out = _listed(runs)
    rows = [line.split()[0] for line in out.splitlines()[2:-1]]
    assert rows == ["ddp-compose"], out


def test_the_next_steps_say_a_native_run_needs_native_only_where_one_is_listed(tmp_path):
    """A newcomer's runs made with --native (the README's CPU path) were listed with `where` native, under 'invoke
    export --run=ID ...; invoke run --resume --run-id=ID ...': either as written is refused for such a run ('say so:
    ... --native'). The line now says to add --native where a listed run trained natively, and only there."""
    runs = tmp_path / "runs"
    _run(runs, "lora-image", 100, recipe="lora", status="completed", metrics={"steps": 5})
    last = _listed(runs).splitlines()[-1]
    assert "--native" not in last and "invoke export --run=ID" in last
    _run(runs, "ddp-native", 50, recipe="ddp", status="failed", variant="native", metrics={"steps": 5})
    assert _listed(runs).splitlines()[-1].endswith("; add --native to either for a run whose `where` says native")


def test_a_run_training_now_says_so(tmp_path):
    folder = _run(tmp_path / "runs", "zero2-now", 0)
    fd = runfolder.hold(folder)  # as the trainer holds it while it trains
    try:
        assert "training now" in _listed(tmp_path / "runs")
    finally:
        os.close(fd)


def test_what_a_container_wrote_reaches_the_terminal_escaped(tmp_path):
    runs = tmp_path / "runs"
    _run(runs, "evil\x1b[2J", 0)
    _run(runs, "planted", 5, recipe="lora\x1b[31m", status="completed")
    out = _listed(runs)
    assert "\x1b" not in out and "evil\\x1b[2J" in out
    assert "unreadable" in next(line for line in out.splitlines() if line.startswith("planted"))


def test_no_runs_yet_says_how_to_make_one(tmp_path):
    out = _listed(tmp_path / "nothing-here")
    assert "no runs in" in out and "invoke run --recipe=" in out


def test_a_run_folder_this_user_cannot_open_is_said_and_the_others_listed(tmp_path):
    """Another user's run folder of mode 0700 in a shared runs folder ended `invoke runs` as 'error: /…/runs/theirs:
    Permission denied', no run listed; and the runs an error missing a run id offers were none ('holds no run
    yet'). Played as a user (root without the capabilities that read past file modes)."""
    runs = tmp_path / "runs"
    _run(runs, "mine", 100, recipe="lora", status="completed", metrics={"steps": 5})
    _run(runs, "theirs", 0).chmod(0)
    env = {"INVOKE_DOCKYARD_RUNS_DIR": str(runs)}
    r = invoke("runs", env=env, as_a_user=True)
    assert r.returncode == 0 and not r.stderr, r.stderr
    row = {line.split()[0]: line for line in r.stdout.splitlines()}
    assert "completed" in row["mine"] and "unreadable folder (Permission denied)" in row["theirs"], r.stdout
    missing = invoke("export", "--run=nope", env=env, as_a_user=True)
    assert missing.returncode == 1 and f"the newest in {runs}: mine;" in missing.stderr, missing.stderr


@pytest.mark.parametrize("unlistable", ["no read permission", "a file"])
def test_a_runs_folder_that_cannot_be_listed_is_said_not_listed_as_empty(tmp_path, unlistable):
    """A runs folder this user may not list (mode 0300), or runs_dir naming a file, was 'no runs in /…/runs yet:
    `invoke run --recipe=lora` trains one', exit 0: a folder of runs said to hold none."""
    runs = tmp_path / "runs"
    if unlistable == "a file":
        runs.write_text("")
    else:
        _run(runs, "mine", 0, recipe="lora", status="completed")
        runs.chmod(0o300)
    r = invoke("runs", env={"INVOKE_DOCKYARD_RUNS_DIR": str(runs)}, as_a_user=True)
    assert r.returncode == 1 and "no runs in" not in r.stdout + r.stderr, r.stdout
    assert r.stderr.startswith(f"error: cannot list the runs folder {runs}: ") and "runs_dir" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_link_in_the_runs_folder_is_said_not_followed(tmp_path):
    """A run folder moved to another disk and linked back (or a link a container planted) was left out of `invoke
    runs` without a word, while `invoke export --run=ID` and --resume refuse it as a link: the user saw no such run."""
    runs = tmp_path / "runs"
    _run(runs, "mine", 100, recipe="lora", status="completed")
    moved = _run(tmp_path / "elsewhere", "moved", 0, recipe="lora", status="completed")
    (runs / "moved").symlink_to(moved)
    row = {line.split()[0]: line for line in _listed(runs).splitlines()}
    assert "a link, not a run folder: remove it" in row["moved"] and "completed" not in row["moved"], row
    assert "completed" in row["mine"]


@pytest.mark.parametrize("mtime", [1e15, -1e12])
def test_a_run_folder_of_a_time_no_date_holds_is_listed_not_a_traceback(mtime):
    """tmpfs and btrfs keep any time a folder is given (ext4 stops at 2446): a container's `touch -d @1000000000000000`
    on its run folder (or another user's in a shared runs folder) ended `invoke runs` in fromtimestamp's ValueError
    traceback ('year 31690708 is out of range'), no run listed. On tmpfs (/dev/shm), as a runs folder there is."""
    import shutil
    import tempfile
    from pathlib import Path

    runs = Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        _run(runs, "mine", 100, recipe="lora", status="completed")
        odd = _run(runs, "odd", 0, recipe="lora", status="completed")
        os.utime(odd, (0, mtime))
        assert odd.stat().st_mtime == mtime  # kept as given, as tmpfs keeps it
        row = {line.split()[0]: line for line in _listed(runs).splitlines()}
        assert "completed" in row["mine"] and "completed" in row["odd"] and row["odd"].rstrip().endswith("?"), row
    finally:
        shutil.rmtree(runs)


def test_a_folder_named_with_a_line_break_is_one_row_not_a_forged_one(tmp_path):
    """shown() keeps a line break: a folder a container named 'x<newline>lora-20261207  lora  completed ...' was
    listed as two lines, the second a run that is not there, completed, in the id column."""
    runs = tmp_path / "runs"
    _run(runs, "mine", 100, recipe="lora", status="completed")
    _run(runs, "x\nforged-run  lora  completed  500  1.2 → 0.3  cpu ×2\tx", 0)
    out = _listed(runs)
    assert not any(line.startswith("forged-run") for line in out.splitlines()), out
    assert "x\\nforged-run  lora  completed  500  1.2 → 0.3  cpu ×2\\tx " in out, out


def test_the_runs_an_error_offers_are_each_one_word_not_a_forged_line(tmp_path):
    """The newest run ids an error missing one offers (export --run, run --resume) were written as the folders are
    named: one named 'x<newline>warning: run mine was deleted, retrain it: ...' (a container's mkdir) printed a line
    of its own under dockyard's error, in dockyard's words."""
    runs = tmp_path / "runs"
    _run(runs, "x\nwarning: run mine was deleted, retrain it: invoke run --recipe=lora", 0, recipe="lora",
         status="completed")
    for args in (("export", "--run=nope"), ("run", "--resume", "--run-id=nope", "--dry")):
        r = invoke_here(*args, env={"INVOKE_DOCKYARD_RUNS_DIR": str(runs)})
        error = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
        assert r.returncode == 1 and len(error) == 1, r.stderr
        assert "x\\nwarning: run mine was deleted" in error[0] and "\nwarning: run mine" not in r.stderr, r.stderr


def test_a_planted_manifest_of_a_huge_recipe_name_leaves_the_list_readable(tmp_path):
    """A manifest a container wrote with a recipe of 100,000 letters (up to the 64 MiB a manifest may be) padded every
    row of `invoke runs` to that width: 100 kB of blanks per line, the list lost in them. Cells but the run id are cut
    at 64 characters."""
    runs = tmp_path / "runs"
    _run(runs, "mine", 100, recipe="lora", status="completed", metrics={"steps": 5, "loss_first": 1e300,
                                                                       "loss_last": 0.5})
    _run(runs, "planted", 0, recipe="r" * 100_000, status="completed")
    out = _listed(runs)
    assert max(len(line) for line in out.splitlines()) < 400, max(len(line) for line in out.splitlines())
    row = {line.split()[0]: line for line in out.splitlines()}
    assert "r" * 63 + "…" in row["planted"] and "completed" in row["planted"] and "lora" in row["mine"], out
