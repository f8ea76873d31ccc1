"""`invoke runs`: the runs folder at a glance, one line per run, newest first.

After a few runs the folder holds ids made from the time (lora-20261206-220013): which one completed, which one
stopped and can be resumed, which loss it reached, was a `cat` of each manifest. Each manifest is read as the
summary at the end of a run reads it (runfolder.read_manifest: untrusted, checked, never through a link).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import stat
from pathlib import Path

from dockyard.common import runfolder, tree
from dockyard.common.errors import DockyardError, shown
from dockyard.settings import Settings

LISTED = (stat.S_IFDIR, stat.S_IFLNK)
# a cell's width, but the run id's: a recipe's name is at most 64 characters (runfolder.NAME_MAX); a planted
# manifest's recipe of 60 MB padded every row to that width
WIDEST = 64
HEADER = ("run id", "recipe", "status", "steps", "loss first → last", "where", "last written")


def list_runs(settings: Settings) -> None:
    """Print the runs folder's runs, one line each, newest first, and what to do next with one. Plain columns, the run
    id never cut: it is what the next command takes, whole, however narrow the terminal."""
    runs = settings.path(settings.runs_dir)
    # a folder any container named, a manifest any container wrote: the id whole, the rest at most WIDEST wide
    rows = [(cell(run_id), *(cut(cell(text)) for text in rest)) for run_id, *rest in map(run_line, run_folders(runs))]
    if not rows:
        print(f"no runs in {runs} yet: `invoke run --recipe=lora` trains one (`invoke recipes` lists the others)")
        return
    print(f"runs in {runs}, newest first")
    widths = [max(len(row[i]) for row in (HEADER, *rows)) for i in range(len(HEADER))]
    for row in (HEADER, *rows):
        cells = (text.rjust(w) if i == 3 else text.ljust(w) for i, (text, w) in enumerate(zip(row, widths, strict=True)))
        print("  ".join(cells).rstrip())
    # a run trained with --native is exported and resumed with it (both refuse it without, naming it)
    native = any(row[HEADER.index("where")].startswith("native") for row in rows)
    print("`invoke export --run=ID` writes a completed run's model as a Hugging Face folder; "
          "`invoke run --resume --run-id=ID` continues one that stopped"
          + ("; add --native to either for a run whose `where` says native" if native else ""))


def cell(text: str) -> str:
    """A cell as the list shows it: escaped as every message is (errors.shown), and a line break or a tab too, which
    shown keeps: a folder a container named 'x<newline>lora-0101  lora  completed ...' was a row of its own, a run
    that is not there listed as completed."""
    return shown(text).replace("\n", "\\n").replace("\t", "\\t")


def cut(text: str) -> str:
    return text if len(text) <= WIDEST else text[:WIDEST - 1] + "…"


def newest_runs(runs: Path, count: int = 3, given: str = "") -> str:
    """What an error missing a run id offers: the run id closest to the one `given` (a slip: did you mean), the ids
    of the newest runs (folders holding a manifest), and where to see them all. Never an error of its own: a runs
    folder this user cannot list offers none."""
    meant = tree.near(runs / given, keep=_a_run) if given else None
    return (f"did you mean {cell(meant.name)}? " if meant else "") + _newest(runs, count)


def _a_run(p: Path) -> bool:
    """A run's folder (it holds a manifest), not a link; not a folder this user may not open, or one removed since."""
    with contextlib.suppress(OSError):
        return not p.is_symlink() and (p / runfolder.MANIFEST).is_file()
    return False


def _newest(runs: Path, count: int) -> str:
    latest = []
    with contextlib.suppress(DockyardError):
        for p in run_folders(runs):
            if _a_run(p):  # the rest count
                latest.append(p.name)
            if len(latest) == count:
                break
    return (f"the newest in {runs}: {', '.join(map(cell, latest))}; `invoke runs` lists them all" if latest else
            f"{runs} holds no run yet")


def run_folders(runs: Path) -> list[Path]:
    """The run folders, newest first (the time their folder last changed), and the links among them (no run's
    folder: never followed, but said, as export and --resume refuse them); not the folders other tasks write there
    (runfolder.TOOL_FOLDERS), nor one removed while they are read. A runs folder
    that cannot be read is said, not listed as empty ("no runs yet" of a folder of runs this user may not open)."""
    found = []
    try:
        for p in runs.iterdir():
            with contextlib.suppress(OSError):
                if p.name not in runfolder.TOOL_FOLDERS and stat.S_IFMT((st := p.lstat()).st_mode) in LISTED:
                    found.append((st.st_mtime, p))
    except FileNotFoundError:  # no runs folder yet
        return []
    except OSError as e:
        raise DockyardError(f"cannot list the runs folder {runs}: {e.strerror or e}; give runs_dir (invoke.yaml, or "
                            "INVOKE_DOCKYARD_RUNS_DIR) a folder this user can read") from None
    return [p for _, p in sorted(found, key=lambda seen: seen[0], reverse=True)]


def run_line(run_dir: Path) -> tuple[str, ...]:
    """One run folder's row: run id, recipe, status, steps, loss first → last, where it trained, when its folder last
    changed; from its manifest, or why there is none."""
    try:
        st = run_dir.lstat()
    except OSError:  # removed since the folder was read
        return run_dir.name, "", "removed while listed", "", "", "", ""
    written = when(st.st_mtime)
    if stat.S_ISLNK(st.st_mode):  # one a container planted, or a run moved away and linked back: never followed
        return run_dir.name, "", "a link, not a run folder: remove it", "", "", "", written
    if runfolder.training_now(run_dir):  # a resume's manifest is the attempt before's until this one ends
        return run_dir.name, "", "training now", "", "", "", written
    try:
        m = runfolder.read_manifest(run_dir)
    except OSError as e:  # another user's folder this one may not open: the other runs are listed
        return run_dir.name, "", f"unreadable folder ({e.strerror or e})", "", "", "", written
    except DockyardError:  # a manifest a container damaged, or a run cut off while writing it: the others are listed
        return run_dir.name, "", "unreadable manifest.json", "", "", "", written
    if m is None:
        return run_dir.name, "", "no manifest (stopped before it began?)", "", "", "", written
    met = m.metrics
    loss = (f"{met.loss_first:.4f} → {met.loss_last:.4f}" if met and met.loss_first is not None
            and met.loss_last is not None else "")
    where = "native" if m.variant in runfolder.NATIVE_VARIANTS else m.variant
    return (run_dir.name, m.recipe, m.status, str(met.steps) if met and met.steps is not None else "", loss,
            f"{where} ×{m.world_size}" if m.world_size else where, written)


def when(mtime: float) -> str:
    """A folder's time as the list says it; "?" for one no date holds (a container's `touch -d @1e15` on tmpfs or
    btrfs, which keep any time: fromtimestamp's ValueError ended the whole list in a traceback)."""
    try:
        return dt.datetime.fromtimestamp(mtime).strftime("%Y-%m-%d %H:%M")
    except (ValueError, OverflowError, OSError):
        return "?"
