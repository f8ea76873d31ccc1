"""What the trainer finds where it runs: which model types liger-kernel can patch here. liger-kernel is not in this
CPU environment (the CUDA images pin it), so the tests lay out small stand-in packages of that name: one whose
import fails as a real install does against a triton it was not built for, one without the table of model types."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ASK = "from dockyard.train import environment; print(environment.liger_kinds())"


def kinds_with(tmp_path: Path, init: str, monkey_patch: str) -> subprocess.CompletedProcess:
    package = tmp_path / "liger_kernel" / "transformers"
    package.mkdir(parents=True)
    (tmp_path / "liger_kernel" / "__init__.py").write_text("")
    (package / "__init__.py").write_text(init)
    (package / "monkey_patch.py").write_text(monkey_patch)
    return subprocess.run([sys.executable, "-c", ASK], env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)


def test_an_installed_liger_kernel_that_does_not_import_counts_as_absent_and_says_why(tmp_path):
    """Before, its model types were taken from our own list: the auto could turn Liger on, and the Trainer's own
    import of it then failed with a traceback after the model had loaded. Now the manifest's reason, the refusal of
    `use_liger_kernel true` and train.log's warning (dockyard.train.__main__) say why it is off."""
    from dockyard.common import autos
    from dockyard.common.errors import DockyardError
    from dockyard.common.recipes import load_recipe
    from dockyard.common.run_settings import resolve_settings

    h100 = autos.Device("NVIDIA H100 80GB HBM3", 80 * 2**30, (9, 0))
    ddp = load_recipe("ddp")
    settings, overrides = resolve_settings(ddp, {})

    done = kinds_with(tmp_path, "raise ImportError(\"cannot import name 'make_tensor_descriptor' from 'triton'\")\n", "")
    assert done.returncode == 0, done.stderr
    kinds, why = eval(done.stdout)  # noqa: S307 - the tuple printed by the child above
    assert kinds == () and why == ("liger-kernel is installed but does not import (ImportError: cannot import name "
                                   "'make_tensor_descriptor' from 'triton')")
    resolved = autos.resolve(ddp, settings, overrides, world_size=1, gpus_per_node=1, device=h100,
                             shape=None, kind="llama", liger=kinds, liger_broken=why)
    assert resolved.record["use_liger_kernel"] == {"value": False, "why": why}
    with pytest.raises(DockyardError, match="use_liger_kernel true needs liger-kernel: liger-kernel is installed but "
                                            "does not import"):
        autos.resolve(ddp, settings, {**overrides, "use_liger_kernel": True}, world_size=1, gpus_per_node=1,
                      device=h100, shape=None, kind="llama", liger=kinds, liger_broken=why)


def test_a_liger_kernel_without_its_table_of_model_types_gets_ours(tmp_path):
    from dockyard.common.autos import LIGER_TYPES

    done = kinds_with(tmp_path, "def _apply_liger_kernel_to_instance(model, **kw): pass\n", "")
    assert done.returncode == 0 and done.stdout.strip() == str((LIGER_TYPES, "")), done.stderr
    table = kinds_with(tmp_path / "t", "def _apply_liger_kernel_to_instance(model, **kw): pass\n",
                       "MODEL_TYPE_TO_APPLY_LIGER_FN = {'llama': None, 'qwen3': None}\n")
    assert table.stdout.strip() == "(('llama', 'qwen3'), '')", table.stderr
