"""How a trainer process ends: its manifest written once, on every way out (completed, failed, stopped by
torchrun's SIGTERM, Ctrl-C, a lost node, a launcher that died), its one error line said by one process, and its exit
status. The run's own errors, raised anywhere below, are DockyardErrors; SIGTERM raises Stopped (begin), recorded
as one."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, NoReturn

from dockyard.common import envvars, runfolder
from dockyard.common.errors import (
    DockyardError,
    Stopped,
    causes,
    loads,
    on_host,
    raised_outside_a_class_being_built,
    shown,
)
from dockyard.train import LAUNCHER, manifest, nodes
from dockyard.train.record import Run

log = logging.getLogger("dockyard.train")
_signalled = threading.Event()  # the SIGTERM that stops this process came (_stopped)
_recorded = threading.Event()  # the manifest is written: a SIGTERM now only ends the process (_stopped)
_finishing = threading.Lock()  # finish() runs once: the main thread and the heartbeat (a lost node) may both call it
PEER_GONE_S = 3.0  # seconds a process whose peer hung up waits for the signal that stops it too (torchrun's)
SAY_ONCE_S = 5  # seconds the other processes of a node wait, refusing what its first refuses and says, before exiting


def begin() -> None:
    """From here on torchrun's SIGTERM raises Stopped, so that the run is recorded on the way out. Once per
    process, but main() may be called again in one (the tests). Neither it nor Ctrl-C's KeyboardInterrupt
    (interrupt_at_ctrl_c) is raised inside a class being built (raised_outside_a_class_being_built): Python 3.11 raised
    it there wrapped in "RuntimeError: Error calling __set_name__ ...", which a library's `except Exception` around an
    import took for its own failure (liger-kernel's "does not import", huggingface_hub's "not in the cache"), the
    stop spent and the run going on, or recorded as that failure."""
    _signalled.clear()
    _recorded.clear()
    signal.signal(signal.SIGTERM, raised_outside_a_class_being_built(_stopped))


def interrupt_at_ctrl_c() -> None:
    """Ctrl-C from here on raises KeyboardInterrupt, as Python's own handler does, for the run's clean-up."""
    signal.signal(signal.SIGINT, raised_outside_a_class_being_built(signal.default_int_handler))


def finish(run: Run, error: str | None) -> None:
    """The first process of each node writes the manifest: node 0's is the run's, the others' sit beside it.
    Once: the main thread and the heartbeat's (a lost node) may both get here."""
    with _finishing:
        if not run.finished:
            _finish(run, error)
            run.finished = True  # after: a Ctrl-C inside _finish left no manifest, and no later call wrote one
            _recorded.set()
            if run.training_lock is not None:  # the run is over: a resume may take it
                os.close(run.training_lock)
                run.training_lock = None


def _finish(run: Run, error: str | None) -> None:
    if not run.run_dir_ok:
        return  # never touch a folder that holds another run
    if run.manifest_found and not run.training:
        return  # a resume refused before it trained: the run's record stays as it was (the error is on stderr)
    stopped = error is not None and error.startswith(STOPPED)  # by torchrun: the cause is another process's
    verdict = run.heartbeat.verdict_for(error, run.record.nodes_seen or []) if run.heartbeat and error else None
    if error and verdict and not error.startswith("lost "):
        error = f"{verdict}: {error}"  # e.g. torchrun's SIGTERM, when this node's other process stopped first
    elif error and run.record.nodes_seen:
        error = nodes.explain(error, run.opts.run_dir, run.record.nodes_seen)
    run.error = error
    if not nodes.first_of_node():
        if error and not stopped:
            _tell_the_writer(run, error)
        return
    # stopped by torchrun, or cut off from this node's other process, and not already explained by a lost node:
    # the process that failed first says why in its note
    if error and (error.startswith(STOPPED) or (not error.startswith("lost ") and nodes.CUT_OFF.search(error))):
        error = _first_failure(run) or error
    # the record is read on the host (invoke runs, the run's summary, a user): its paths, not the container's
    extra = {**run.record.to_json(), **({"error": on_host(error)} if error else {})}
    measured = run.metrics or {**measured_so_far(run.log), **_largest_peak(run)}
    record = manifest.build(run.opts.run_dir, run.recipe, run.status, run.world_size,
                            run.check.in_effect if run.check else None, measured, extra)
    try:
        manifest.write(run.opts.run_dir, record, runfolder.manifest_file(nodes.node_rank()))
    except OSError as e:  # a full disk: the error above is what the user needs
        print(on_host(f"error: cannot write {run.opts.run_dir / runfolder.manifest_file(nodes.node_rank())}: "
                      f"{e.strerror}"), file=sys.stderr)


def measured_so_far(log: Any) -> dict[str, Any]:
    """A run that stopped (failed, interrupted): the steps it trained, the rate of the logging windows it closed, the
    time it took to its first step and spent saving and evaluating up to then, as a completed run reports them (its
    manifest had them null, "no throughput measured" after 14 windows in metrics.jsonl, and its steps were the last
    logged one: "steps 1" where checkpoint-2 was complete and the run said to continue from it)."""
    if log is None:
        return {}
    steady = log.steady_state()  # rank 0's record of the windows (their tokens summed over the ranks as each closed)
    rate = {"tokens_per_second": steady["tokens_per_second"], "mfu": steady["mfu"], "steady_state": steady} \
        if steady else {}
    return {**({"steps": log.steps_done} if log.steps_done else {}), **rate,
            "seconds_to_first_step": log.seconds_to_first_step, "seconds_saving": round(log.seconds_saving, 3),
            "seconds_evaluating": round(log.seconds_evaluating, 3)}


def _largest_peak(run: Run) -> dict[str, Any]:
    """A run that stopped: the largest peak memory any rank reached, and that rank, without a collective (a rank may
    be gone): this process's own, every rank's as of the last logging window (callbacks.MetricsLog), and that of each
    rank that failed, from its note (_tell_the_writer). A completed run measures it over the ranks at its end (its
    manifest had rank 0's alone where rank 1 had run out of memory)."""
    rank = os.environ.get("RANK", "0").strip()
    found = [(manifest.peak_memory_bytes(), int(rank) if rank.isascii() and rank.isdecimal() else 0)]
    if run.log is not None and run.log.peak_memory:
        found.append(run.log.peak_memory)
    found += [(note["peak_memory_bytes"], note["rank"]) for note in _notes(run)
              if type(note.get("peak_memory_bytes")) is int and 0 <= note["peak_memory_bytes"] < 2**63]
    peak, rank_of_peak = max(found)
    return {"peak_memory_bytes": peak, "peak_memory_kind": manifest.peak_memory_kind(), "peak_memory_rank": rank_of_peak}


def _attempt() -> str:
    """This start of the run: torchrun's run id and restart count (a file of an earlier attempt is not this one's)."""
    return f"{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{restarts()}"


def _tell_the_writer(run: Run, error: str) -> None:
    """A process that writes no manifest failed: say why in the run folder, before torchrun stops the others."""
    rank = os.environ.get("RANK", "0")
    try:
        runfolder.write(run.opts.run_dir, f"{runfolder.RANK_FAILED}{rank}",
                        json.dumps({"attempt": _attempt(), "rank": int(rank), "error": error[:4000],
                                    "peak_memory_bytes": manifest.peak_memory_bytes()}))
    except (OSError, DockyardError, ValueError):
        pass  # its error is on its stderr anyway


def _first_failure(run: Run) -> str | None:
    """The error of the lowest rank of this attempt that failed, from its note."""
    found = [(note["rank"], note["error"]) for note in _notes(run) if isinstance(note.get("error"), str)]
    if not found:
        return None
    rank, error = min(found)
    return f"{error} (rank {rank}; torchrun then stopped the others)"


def _notes(run: Run) -> list[dict[str, Any]]:
    """The notes this attempt's failed ranks left (_tell_the_writer), read as untrusted: checked, never followed."""
    found = []
    try:
        names = [n for n in os.listdir(run.opts.run_dir) if n.startswith(runfolder.RANK_FAILED)]
        for name in names:
            note = loads(runfolder.read_text(run.opts.run_dir, name, limit=1 << 16) or "null")
            if (isinstance(note, dict) and note.get("attempt") == _attempt() and type(note.get("rank")) is int
                    and 0 <= note["rank"] < 2**31):
                found.append(note)
    except (OSError, ValueError, DockyardError):
        return []
    return found


def lost(run: Run, message: str) -> NoReturn:
    """Another node stopped answering (nodes.Heartbeat, from its thread): whatever the main thread waits for,
    the node's first process says so and writes the manifest, and every process of this node exits."""
    if nodes.first_of_node():
        print(on_host(f"error: {message}"), file=sys.stderr, flush=True)
        finish(run, message)
    else:
        time.sleep(nodes.GRACE)
    leave(0 if run.status == "completed" else 1)


def leave(code: int) -> NoReturn:
    """Exit without the interpreter's finalisation. After a ZeRO-3 run DeepSpeed still references the engine
    from module globals (zero.Init, groups._WORLD_GROUP, every parameter's ds_process_group), so its gloo
    process groups and their threads outlive destroy_process_group and would be torn down in whatever order
    finalisation takes: the likely cause of a zero3-offload rank aborting after saving with "terminate called
    without an active exception" (once in two runs). Everything the run leaves is written by now; only the
    logs need flushing."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


STOPPED = "stopped by SIGTERM"
# what a process stopped so records: it cannot tell which, nor where a failed process said why (on another node, maybe)
SIGNALLED = f"{STOPPED}: a process failed, on this node or another, or the run was cancelled"
LAUNCHER_GONE = ("torchrun, which started this process, was killed (with `invoke run`'s process group, or out of "
                 "memory), and the run with it")
INTERRUPTED = 128 + signal.SIGINT
# what a resumed run's manifest says from its first step until the run records how it ended (__main__.began): the
# node that wrote it may have been killed since
UNRECORDED = "then stopped without a record of how"


def _said_by_the_first() -> bool:
    """A refusal every process of the node makes alike is said by its first (local rank 0), which then exits, and
    torchrun stops the others: this one waits SAY_ONCE_S for that. Not stopped by then, the first did not refuse
    (the error was this process's own after all): False, and this one says it."""
    try:
        time.sleep(SAY_ONCE_S)
    except Stopped:  # _stopped: torchrun's SIGTERM
        return True
    return False


def failed(raised: BaseException, run: Run | None) -> int:
    """The exit status of a run that raised, its manifest written and its one line said; an error of no known kind
    is recorded, then raised again (its traceback is the one to read)."""
    if threading.current_thread() is threading.main_thread():  # a second Ctrl-C would cut the record short
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    e = ours_within(raised)
    if not isinstance(e, (DockyardError, KeyboardInterrupt)):
        e = _the_stop_that_follows(e)
    if isinstance(e, DockyardError):
        # torchrun's SIGTERM: torchrun, which sent it, says why (which rank failed first, on this node or another, or
        # that it was stopped itself); this process cannot know, and "its error is above" was untrue on a node that
        # outlived another node's failure. Without torchrun, a SIGTERM is the run cancelled: said here.
        stopped_by_torchrun = str(e).startswith(STOPPED) and (under_torchrun() or not nodes.first_of_node())
        if not stopped_by_torchrun and (nodes.first_of_node() or (run is not None and not run.same_everywhere)
                                       or not _said_by_the_first()):
            with contextlib.suppress(OSError):  # a pipe whose reader died with the launcher: the manifest says it
                # a config.json's escape sequence stays text; the container's paths are said as the host's
                print(on_host(f"error: {shown(str(e))}"), file=sys.stderr)
        if run:
            finish(run, str(e))
        return e.exit_code
    if isinstance(e, KeyboardInterrupt):  # Ctrl-C, passed on by torchrun: its traceback (one per process)
        _signalled.set()  # torchrun's SIGTERM, which follows the Ctrl-C it got too, cannot cut this record short
        said = f"interrupted (SIGINT): the run stopped; {_how_to_continue(run)}"
        if nodes.first_of_node():
            with contextlib.suppress(OSError):
                print(f"error: {said}", file=sys.stderr)
        if run:
            finish(run, said)
        return INTERRUPTED
    if isinstance(e, OSError) and launcher_gone():  # a write to the closed pipe came before the SIGTERM
        if run:
            finish(run, f"{STOPPED}: {LAUNCHER_GONE}")
        return 128 + signal.SIGTERM
    if run:
        finish(run, "".join(traceback.format_exception_only(type(e), e)).strip())
        if run.error and nodes.LOST_SAID.match(run.error):
            # a collective cut off by another node lost (gloo's "Connection reset by peer" from its address): said in
            # one line as it was recorded (nodes.explain, or the heartbeat's verdict), not in a traceback per rank
            return 1
    raise raised


def _the_stop_that_follows(e: BaseException) -> BaseException:
    """A collective that failed because another process hung up (gloo's "Connection reset by peer") is most often
    that process stopping first: torchrun passes Ctrl-C's SIGINT on to its workers one at a time, and sends SIGTERM to
    the rest once one has failed. This one's signal is then a moment away: waited for (PEER_GONE_S), the run is
    recorded as interrupted, or stopped with the first failure's reason, not as this error with its traceback (a
    Ctrl-C test saw one run in five or so print rank 0's "RuntimeError: ... Connection reset by peer"). No signal by
    then: the connection's error is the run's."""
    if threading.current_thread() is not threading.main_thread() or not nodes.CUT_OFF.search(str(e)):
        return e
    interrupted = threading.Event()
    signal.signal(signal.SIGINT, lambda signum, frame: interrupted.set())
    try:
        deadline = time.monotonic() + PEER_GONE_S
        while not interrupted.is_set() and time.monotonic() < deadline:
            time.sleep(0.05)
    except Stopped as stopped:  # _stopped: torchrun's SIGTERM
        return ours_within(stopped)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return KeyboardInterrupt() if interrupted.is_set() else e


def say_done(run: Run) -> None:
    """One line on rank 0 where no command prints the run's summary after it (run.sh, an sbatch script, a pod): the
    run's console ended on a progress bar of the last save, without a word of how it went or where the model is."""
    if not run.is_main or os.environ.get(envvars.SUMMARISED) == "1":
        return
    m = runfolder.read_manifest(run.opts.run_dir)
    if m is None or m.status != "completed" or m.metrics is None:
        return
    met = m.metrics
    said = [f"run {m.run_id} completed: {met.steps} steps"]
    if met.loss_first is not None and met.loss_last is not None:
        said.append(f"loss {met.loss_first:.4f} → {met.loss_last:.4f}")
    if met.tokens_per_second:
        said.append(f"{met.tokens_per_second:.0f} tokens/s" + (f", MFU {met.mfu:.1%}" if met.mfu else ""))
    log.info("%s; the model is in %s, the record in %s", " · ".join(said), run.opts.run_dir / runfolder.MODEL,
             run.opts.run_dir / runfolder.MANIFEST)


def ours_within(raised: BaseException) -> BaseException:
    """The run's own error or interrupt where a library re-raised it as one of its own: DeepSpeed turns whatever
    stops its compile of cpu_adam (our SIGTERM's DockyardError) into "RuntimeError: DeepSpeedCPUAdam requires the
    cpu_adam op, which failed to build/load", 150 lines per rank for a cancelled run, recorded as its error. A
    library that dropped the chain still raised while this process was being stopped: stopped, then."""
    ours = [DockyardError(str(e), exit_code=e.exit_code) if isinstance(e, Stopped) else e
            for e in causes(raised) if isinstance(e, (DockyardError, Stopped, KeyboardInterrupt))]
    if ours:
        # Ctrl-C reaches torchrun too, whose SIGTERM then lands while the workers unwind the KeyboardInterrupt: the
        # run was interrupted, not "stopped by SIGTERM"
        interrupt = next((e for e in ours if isinstance(e, KeyboardInterrupt)), None)
        return interrupt if interrupt and str(ours[0]).startswith(STOPPED) else ours[0]
    if _signalled.is_set():
        return DockyardError(SIGNALLED, exit_code=128 + signal.SIGTERM)
    return raised


def _how_to_continue(run: Run | None) -> str:
    """What a stopped run can be continued from: its last complete checkpoint, or nothing yet."""
    done = runfolder.complete_checkpoints(Path(run.opts.run_dir)) if run is not None and run.run_dir_ok else []
    if done:
        return f"continue it from {done[-1].name} with --resume"
    return "no checkpoint was saved yet, so --resume would start it again from the first step"


def _stopped(signum: int, frame: Any) -> None:
    """torchrun stops every rank with SIGTERM when one fails: record the run as failed on the way out. Not while
    the manifest is being written (finish): the process is on its way out already, and an error raised there would
    leave no manifest (torchrun's SIGKILL follows its grace period of 30 s if finishing takes longer). Once: a second
    SIGTERM (a dying launcher's signal comes once per thread it hands this process to) would raise out of the
    handling of the first, before the manifest is written."""
    if _finishing.locked() or _signalled.is_set():  # (a Ctrl-C recorded as such, say: it exits 130 as it is)
        return
    if _recorded.is_set():  # in the barrier after a completed run's record, say: nothing is left to record
        raise SystemExit(128 + signum)
    _signalled.set()
    if launcher_gone():
        raise Stopped(f"{STOPPED}: {LAUNCHER_GONE}", exit_code=128 + signum)
    raise Stopped(SIGNALLED, exit_code=128 + signum)


def under_torchrun() -> bool:
    """This process was started by torchrun's agent (which stops every worker with SIGTERM when one fails)."""
    return "TORCHELASTIC_RUN_ID" in os.environ


def launcher_gone() -> bool:
    """Whether torchrun's agent, which started this worker, has died (environment.die_with_launcher then sends
    SIGTERM); if so, nothing reads this process's output any more, and it goes to /dev/null: a print would raise
    BrokenPipeError, and the manifest would never be written. The agent's threads die one by one: its workers are
    handed to another of them first, with the signal, so the parent is watched for a moment before it counts as
    alive (a SIGTERM it sent because another rank failed waits that moment, well inside torchrun's 30 s grace)."""
    if not under_torchrun():
        return False
    deadline = time.monotonic() + 1.0
    while os.getppid() == LAUNCHER:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    silence = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            os.dup2(silence, stream.fileno())
    return True


def restarted() -> bool:
    """torchrun --max-restarts (`invoke run/k8s --max-restarts`) starts the same command again after a failure: that
    is this run continued, from its last complete checkpoint (or from the start when it failed before one), not a new
    run, which the folder the first attempt wrote would refuse ("already holds a run") on every restart."""
    return restarts() > 0


def restarts() -> int:
    """How many times torchrun started this node's workers again: its own count, which is only this node's failures,
    or the image's torchrun's count of the nodes' meetings, which is every restart (a node whose workers were well was
    restarted with a count of 0 when another node's failed and rejoined, and its workers began the run anew in the
    folder the first attempt wrote, while the other node's resumed)."""
    counts = (os.environ.get("TORCHELASTIC_RESTART_COUNT", ""), os.environ.get(envvars.ATTEMPT, ""))
    own, met = (int(c) if c.isascii() and c.isdecimal() and len(c) <= 6 else 0 for c in counts)
    return max(own, met - 1)
