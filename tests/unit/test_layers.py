"""The package's layers, as the README's layout draws them: dockyard.common is torch-free and imports only
itself; the trainer (image side) imports no host family; no host family imports the trainer."""

from __future__ import annotations

import ast
from pathlib import Path

from dockyard import ROOT

PACKAGE = ROOT / "dockyard"
HOST_FAMILIES = ("dockyard.images", "dockyard.launch.run", "dockyard.transport", "dockyard.engine", "dockyard.settings",
                 "dockyard.console")
TRAINING_STACK = ("torch", "transformers", "deepspeed", "peft", "bitsandbytes", "accelerate", "datasets")


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at its top or inside a function, as a dotted name."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return found


def _files(family: str) -> list[Path]:
    return sorted((PACKAGE / family).glob("*.py"))


def test_common_imports_only_itself_and_no_training_stack():
    for path in _files("common"):
        bad = {m for m in _imports(path) if m.split(".")[0] in TRAINING_STACK
               or (m.startswith("dockyard.") and not m.startswith(("dockyard.common", "dockyard.ROOT")))}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}: dockyard.common stays torch-free, imports itself"


def test_the_trainer_imports_no_host_family():
    for path in _files("train"):
        bad = {m for m in _imports(path) if m.startswith(HOST_FAMILIES)}
        assert not bad, f"{path.relative_to(ROOT)} (image side) imports host modules {sorted(bad)}"


def test_no_host_module_imports_the_trainer():
    host = [p for p in PACKAGE.rglob("*.py") if "train" not in p.relative_to(PACKAGE).parts]
    for path in host:
        bad = {m for m in _imports(path) if m.startswith("dockyard.train")}
        assert not bad, f"{path.relative_to(ROOT)} (host side) imports the trainer: {sorted(bad)}"
