"""TrainingArguments the run hands the Trainer as given, whose nonsense values passed `invoke run --dry` and stopped the
run minutes later inside the trainer (or trained it wrong): refused on the host now, in one `error:` line naming the
setting, and the values transformers takes (and trains with) still taken. Through the real CLI, in this process."""

from __future__ import annotations

import pytest

import tasks  # noqa: F401 - the tasks the CLI runs
from tests.support.cli import invoke_here, short_error


@pytest.fixture
def dry(tmp_path):
    runs = tmp_path / "runs"

    def run(*overrides: str, recipe: str = "ddp", native: bool = False):
        r = invoke_here("run", "--dry", "--variant=cpu", f"--recipe={recipe}", *(["--native"] if native else []),
                        "--", *overrides, env={"INVOKE_DOCKYARD_RUNS_DIR": str(runs)})
        assert "Traceback" not in r.stdout + r.stderr
        return r

    yield run
    assert not runs.exists() or not any(runs.iterdir()), "a dry run makes no run folder"


def refused(r, *says: str) -> None:
    short_error(r, says[0])
    assert all(s in r.stderr for s in says), r.stderr
    assert "-m dockyard.train" not in r.stderr, "refused before the command"


def test_a_learning_rate_no_run_means_is_refused_and_any_optimizers_own_is_taken(dry):
    """`--learning_rate 1e20` (or 3e4, for 3e-4) passed --dry: torch takes any rate of 0 or more, and the run trained
    to nan."""
    for typed in ("1e20", "3e4", "101"):
        refused(dry("--learning_rate", typed), "learning_rate", "takes a number from 0 to 100")
    for fine in ("1e-4", "0.5", "1", "30"):  # 30: SGD's, in AWD-LSTM
        assert dry("--learning_rate", fine, "--optim", "sgd").returncode == 0
