"""The package's layers, as the README's layout draws them: dockyard.common is torch-free and imports only
itself; the trainer (image side) imports only dockyard.common; no host family imports the trainer; and imports
between the families go one way (no circle), so `invoke run` goes down the layers without coming back up."""

from __future__ import annotations

import ast
from pathlib import Path

from dockyard import ROOT

PACKAGE = ROOT / "dockyard"
HOST_FAMILIES = ("dockyard.images", "dockyard.launch.run", "dockyard.transport", "dockyard.engine", "dockyard.settings",
                 "dockyard.console")
HOST_SIDE = ("dockyard.launch", "dockyard.machine", "dockyard.transport", "dockyard.images", "dockyard.gpus",
             "dockyard.engine")
FAMILIES = ("common", "images", "launch", "machine", "transport", "train")
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


def test_the_trainer_and_common_import_no_host_side_module():
    for path in _files("train") + _files("common"):
        bad = {m for m in _imports(path) if m.startswith(HOST_SIDE)}
        assert not bad, f"{path.relative_to(ROOT)} imports host-side modules {sorted(bad)}: move what it needs to dockyard.common"


def _family_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "dockyard" and parts[1] in FAMILIES else None


def family_imports() -> dict[str, dict[str, list[str]]]:
    """family -> {family it imports: the files that do}, from every import statement (those inside functions too)."""
    edges: dict[str, dict[str, list[str]]] = {f: {} for f in FAMILIES}
    for family in FAMILIES:
        for path in sorted((PACKAGE / family).rglob("*.py")):
            for module in _imports(path):
                other = _family_of(module)
                if other and other != family:
                    edges[family].setdefault(other, []).append(str(path.relative_to(ROOT)))
    return edges


def _circle(edges: dict[str, dict[str, list[str]]]) -> list[str]:
    """One circle of imports between families, as the path that closes it; [] when there is none."""
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> list[str]:  # path: how the search came to node, node last
        state[node] = "open"
        for nxt in edges[node]:
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = "done"
        return []

    for family in edges:
        if family not in state and (found := visit(family, [family])):
            return found
    return []


def test_no_import_circle_between_the_families():
    edges = family_imports()
    circle = _circle(edges)
    said = "; ".join(f"{a} -> {b} ({', '.join(sorted(set(edges[a][b])))})" for a, b in zip(circle, circle[1:], strict=False))
    assert not circle, f"an import circle between packages: {' -> '.join(circle)}: {said}"


def test_the_circle_finder_finds_one():
    assert _circle({"a": {"b": []}, "b": {"c": []}, "c": {"a": []}}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b": [], "c": []}, "b": {"c": []}, "c": {}}) == []
