"""Where the trainer's log lines go: train.log (rank 0) gets every library's INFO less their noise, the console the
run's own lines and every warning. __main__.start_processes calls setup_logging once the process group has formed."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import transformers  # a lazy module: its submodules load when first used

from dockyard.common import runfolder
from dockyard.common.errors import on_host
from dockyard.common.units import duration


def setup_logging(run_dir: Path, is_main: bool, phase: Callable[[], str] = lambda: "") -> None:
    """train.log (rank 0) gets every library's INFO less LOG_NOISE; the console gets the run's own lines and every
    warning. The libraries' INFO (the model's config printed twice, each file saved, "share your model on
    huggingface.co") made a 6-step run about 130 lines on the console."""
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    console = logging.StreamHandler(sys.stderr)
    console.addFilter(lambda r: r.levelno >= logging.WARNING or r.name.split(".")[0] == "dockyard")
    console.setFormatter(OnHost(fmt))
    handlers: list[logging.Handler] = [console]
    if is_main:
        log = logging.StreamHandler(runfolder.append(run_dir, runfolder.TRAIN_LOG))  # never through a link
        log.addFilter(not_noise)
        log.setFormatter(OnHost(fmt))  # train.log is read on the host: its paths, not the container's
        handlers.append(log)
        quiet = Quiet(phase)
        console.addFilter(quiet.heard)  # after the filter above: a line the console leaves out was not heard
        stop_quiet()  # one per process: a second run's logging in this process (tests, a retry) replaces it
        Quiet.running = quiet
        quiet.start()
    logging.basicConfig(level=logging.INFO if is_main else logging.WARNING, handlers=handlers, force=True)
    # every rank reads the same data: its warnings (fields not trained on, examples cut) once, not once per process;
    # and loads the same model and tokenizer: the Trainer's "The tokenizer has new PAD/BOS/EOS tokens" likewise
    for same_everywhere in ("dockyard.train.data", "transformers.trainer_utils"):
        logging.getLogger(same_everywhere).setLevel(logging.NOTSET if is_main else logging.ERROR)
    transformers.utils.logging.disable_default_handler()
    transformers.utils.logging.enable_propagation()
    transformers.utils.logging.set_verbosity(logging.INFO if is_main else logging.WARNING)


class Quiet(threading.Thread):
    """Rank 0's console says something at least every `every` seconds: a large model's load, DeepSpeed's setup, a
    first step that compiles, a checkpoint's save each take minutes without a line of their own; after `every`
    seconds of silence a line says what the run is doing (`phase`, Run.doing's), "still loading the data and the
    model, 45 s since the last line", in the console and train.log alike."""

    running: Quiet | None = None  # this process's, which stop_quiet() ends

    def __init__(self, phase: Callable[[], str], every: float = 30.0):
        super().__init__(name="dockyard-quiet", daemon=True)
        self.phase, self.every = phase, every
        self.last = time.monotonic()
        self._done = threading.Event()

    def heard(self, record: logging.LogRecord) -> bool:
        """A console filter that lets every line through and notes when the last one came."""
        self.last = time.monotonic()
        return True

    def run(self) -> None:
        while not self._done.wait(self.every / 6):
            silent = time.monotonic() - self.last
            if silent >= self.every and (doing := self.phase()):
                self.last = time.monotonic()  # one line per interval, whatever the console does with it
                logging.getLogger("dockyard.train").info("still %s, %s since the last line", doing, duration(silent))

    def stop(self) -> None:
        self._done.set()


def stop_quiet() -> None:
    """End this process's Quiet, as the run ends: one left running said "still ..." into whatever logging the
    process set up next (a test's captured stream, closed: a "--- Logging error ---" traceback there)."""
    if Quiet.running is not None:
        Quiet.running.stop()
        Quiet.running.join(timeout=5)
        Quiet.running = None


def cpu_adam_to_train_log() -> None:
    """DeepSpeed's CPU Adam (the offload recipes' optimizer) prints from C++ as it is made, "Adam Optimizer #0 is
    created with AVX512 arithmetic capability." and "Config: alpha=0.001000, betas=(...)": lines of no logger, which
    reached the console between the run's own. What its making prints on stdout goes to train.log (logger
    deepspeed.ops.adam, INFO) instead; its build, its stderr and its errors (exceptions) are left as they are."""
    from deepspeed.ops.adam import cpu_adam

    builder = cpu_adam.CPUAdamBuilder
    if getattr(builder, "to_train_log", False):
        return

    class ToTrainLog(builder):
        to_train_log = True

        def load(self, *args, **kwargs):
            return _MadeToTrainLog(super().load(*args, **kwargs))

    cpu_adam.CPUAdamBuilder = ToTrainLog  # what DeepSpeedCPUAdam loads its op with


class _MadeToTrainLog:
    """The cpu_adam op, whose create_adam's printf lines go to train.log."""

    def __init__(self, op: Any):
        self._op = op

    def __getattr__(self, name: str) -> Any:
        return getattr(self._op, name)

    def create_adam(self, *args: Any) -> Any:
        with _stdout_to(logging.getLogger("deepspeed.ops.adam")):
            return self._op.create_adam(*args)


@contextlib.contextmanager
def _stdout_to(logger: logging.Logger):
    """What C code prints on this process's stdout meanwhile, as INFO lines of `logger`. C's stdio holds a pipe's
    output until its buffer fills: flushed before (what was printed earlier goes where it went) and after."""
    libc = ctypes.CDLL(None)
    sys.stdout.flush()
    libc.fflush(None)
    saved = os.dup(1)
    with tempfile.TemporaryFile() as said:
        os.dup2(said.fileno(), 1)
        try:
            yield
        finally:
            libc.fflush(None)
            os.dup2(saved, 1)
            os.close(saved)
            said.seek(0)
            for line in said.read().decode(errors="replace").splitlines():
                if line.strip():
                    logger.info("%s", line.rstrip())


class OnHost(logging.Formatter):
    """The console's lines, naming the host's paths where the trainer runs in a container (errors.on_host)."""

    def format(self, record: logging.LogRecord) -> str:
        return on_host(super().format(record))


# INFO lines of the libraries that train.log leaves out: each config printed whole as JSON (the model's twice, its
# generation config twice: 90 of a 12-step run's 128 lines; the files are in the model folder), the same
# "Offline mode" line before every file read, and the Trainer's "share your model on huggingface.co"
LOG_NOISE = (("transformers.configuration_utils", "Model config "),
             ("transformers.generation.configuration_utils", "Generate config "),
             ("transformers.utils.hub", "Offline mode: forcing"),
             ("transformers.tokenization_utils_base", "Offline mode: forcing"),
             ("transformers.trainer", "\n\nTraining completed. Do not forget to share"))


def not_noise(record: logging.LogRecord) -> bool:
    """False for a library's INFO line of LOG_NOISE."""
    return record.levelno >= logging.WARNING or not any(
        record.name == name and str(record.msg).startswith(start) for name, start in LOG_NOISE)
