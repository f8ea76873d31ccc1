"""The GPU tests' trainer environment: DeepSpeed's CPU accelerator only for the CPU tests."""

from tests.support.training import env


def test_gpu_runs_do_not_inherit_the_cpu_accelerator(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")  # e.g. left in the shell by a CPU run
    assert "DS_ACCELERATOR" not in env(gpu=True)
    assert env()["DS_ACCELERATOR"] == "cpu"
