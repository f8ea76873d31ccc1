"""Rank 0's console between its lines: the model's load, DeepSpeed's setup, a first step that compiles, a checkpoint's
save each took minutes on a large model with not a line (after 'data ...: 2000 training examples', nothing until
'step 1/...'), and a log could not tell a slow start from a hung one."""

from __future__ import annotations

import logging
import time

import pytest

from dockyard.train import logs


def test_a_silence_longer_than_the_interval_is_broken_by_what_the_run_is_doing(tmp_path, caplog):
    """Two lines of silence are waited for, however late a loaded host wakes the thread (a fixed 2.6 s, for lines
    at 1 s, was the host's to miss); they come an interval apart, not at each of the thread's checks (a sixth)."""
    phase = ["loading the data and the model"]
    handler = logging.StreamHandler()

    def still():
        return [r for r in caplog.records if r.getMessage().startswith("still ")]

    with caplog.at_level(logging.INFO, logger="dockyard.train"):
        quiet = logs.Quiet(lambda: phase[0], every=1.0)  # 20x the lines' interval below: a loaded host's late
        # wake-up is no silence
        handler.addFilter(quiet.heard)
        logging.getLogger("dockyard.train").addHandler(handler)
        try:
            quiet.start()
            deadline = time.monotonic() + 60  # not a measure: a Quiet that says nothing fails, not hangs
            while len(still()) < 2:
                assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
                time.sleep(0.05)
            first, second = still()[:2]
            phase[0] = "training (or saving a checkpoint)"
            for _ in range(30):  # lines at a shorter interval: nothing is added
                logging.getLogger("dockyard.train").info("step")
                time.sleep(0.05)
            said = [r.getMessage() for r in still()]
        finally:
            quiet.stop()
            logging.getLogger("dockyard.train").removeHandler(handler)
    assert all(s.startswith("still loading the data and the model, ") and s.endswith(" since the last line")
               for s in said), said
    assert second.created - first.created >= 0.9, said  # one per interval of silence, not one per check


def test_the_run_s_quiet_ends_with_it_and_a_second_set_up_replaces_the_first(tmp_path):
    """The thread was started and never stopped: a trainer run in a test's process left it saying "still ..." into the
    next tests' captured streams, closed by then ("--- Logging error ---" and a traceback in four unrelated tests)."""
    from dockyard.train import __main__ as trainer

    root = logging.getLogger()
    kept = root.handlers[:], root.level
    try:
        logs.setup_logging(tmp_path, True)
        first = logs.Quiet.running
        assert first is not None and first.is_alive()
        logs.setup_logging(tmp_path, True)
        assert not first.is_alive() and logs.Quiet.running is not first
        with pytest.raises(SystemExit):  # a run that fails at once (its flags): its Quiet ends with it all the same
            trainer.main(["--no-such-flag"])
        assert logs.Quiet.running is None
    finally:
        logs.stop_quiet()
        root.handlers[:], _ = kept
        root.setLevel(kept[1])
