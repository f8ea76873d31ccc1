"""Rank 0's console between its lines: the model's load, DeepSpeed's setup, a first step that compiles, a checkpoint's
save each took minutes on a large model with not a line (after 'data ...: 2000 training examples', nothing until
'step 1/...'), and a log could not tell a slow start from a hung one."""

from __future__ import annotations

import logging
import time

from dockyard.train import logs


def test_a_silence_longer_than_the_interval_is_broken_by_what_the_run_is_doing(tmp_path, caplog):
    phase = ["loading the data and the model"]
    handler = logging.StreamHandler()
    with caplog.at_level(logging.INFO, logger="dockyard.train"):
        quiet = logs.Quiet(lambda: phase[0], every=0.3)
        handler.addFilter(quiet.heard)
        logging.getLogger("dockyard.train").addHandler(handler)
        try:
            quiet.start()
            time.sleep(0.8)
            phase[0] = "training (or saving a checkpoint)"
            for _ in range(8):  # lines at a shorter interval: nothing is added
                logging.getLogger("dockyard.train").info("step")
                time.sleep(0.1)
            said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("still ")]
        finally:
            quiet.stop()
            logging.getLogger("dockyard.train").removeHandler(handler)
    assert said and all(s.startswith("still loading the data and the model, ") and s.endswith(" since the last line")
                        for s in said), said
    assert len(said) <= 3, said  # one per interval of silence, not one per check
