"""What of the host a run sees: the user's model and data, and the recipes, mounted read-only into the container.

- `--data=PATH`, `--model=PATH` (or the invoke.yaml settings of the same names, or a trainer override
  `-- --data PATH` / `--eval_data PATH` / `--model PATH` naming a host path) → the file or folder mounted
  read-only under /workspace/inputs/, and the trainer told the path it has inside.
- The checkout's recipes/ is mounted over the image's copy, so an edited recipe applies to the next run
  without a build (nodes without the checkout use the image's copy); `--recipe=/any/folder` is mounted too.
- DOCKYARD_HOST_PATHS tells the trainer which host path each inside path is, for the manifest's record.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from dockyard.errors import DockyardError
from dockyard.settings import ROOT, Settings

INPUTS = "/workspace/inputs"
IMAGE_ROOT = "/opt/dockyard"           # the image's checkout: its recipes/ is what nodes without ours use
USER_RECIPES = "/workspace/recipes"    # a recipe folder from outside the checkout
KEYS = ("model", "data", "eval_data")  # trainer settings that name a host file or folder
FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".txt", ".arrow")


@dataclass
class Mounts:
    """Host → container bind mounts (all read-only) and what the trainer is told."""

    volumes: list[tuple[Path, str, bool]] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)   # the trainer overrides, host paths rewritten
    recipe: str = ""                                     # --recipe as the trainer sees it
    host_paths: dict[str, str] = field(default_factory=dict)  # inside → host, for the manifest

    @property
    def env(self) -> dict[str, str]:
        return {"DOCKYARD_HOST_PATHS": json.dumps(self.host_paths, sort_keys=True)} if self.host_paths else {}


def plan_mounts(settings: Settings, recipe: str, overrides: list[str], *, data: str = "", model: str = "",
                checkout_recipes: bool = True) -> Mounts:
    """The mounts of one run (pure: reads only whether the paths exist). Flags win over the invoke.yaml
    settings; a host path given as an override is mounted the same way (overrides win over both)."""
    m = Mounts()
    given = override_values(overrides)
    rest = strip_keys(overrides, given)
    for key, flag in (("model", model), ("data", data), ("eval_data", "")):
        if key in given:
            value, where = given[key], f"-- --{key}"
        elif flag:
            value, where = flag, f"--{key}"
        else:
            value, where = (getattr(settings, key, "") or ""), f"setting {key}"
            if value:
                value = str(settings.path(value))
        if not value:
            continue
        host = host_path(value, where, settings if where.startswith("setting") else None)
        if host is None:  # a hub id (model or dataset in the Hugging Face cache): passed as it is
            rest += [f"--{key}", value]
            continue
        inside = f"{INPUTS}/{key}" + ("" if host.is_dir() else f"/{host.name}")
        m.volumes.append((host, inside, True))
        m.host_paths[inside] = str(host)
        rest += [f"--{key}", inside]
    m.overrides = rest
    m.recipe = recipe
    folder = Path(recipe).expanduser()
    if recipe and (folder / "recipe.yaml").is_file():
        folder = folder.resolve()
        if checkout_recipes and folder.parent == (ROOT / "recipes").resolve():
            m.recipe = folder.name  # one of the checkout's own: found in the recipes/ mounted below
        else:
            inside = f"{USER_RECIPES}/{folder.name}"
            m.volumes.append((folder, inside, True))
            m.host_paths[inside] = str(folder)
            m.recipe = inside
    if checkout_recipes:
        m.volumes.append(((ROOT / "recipes").resolve(), f"{IMAGE_ROOT}/recipes", True))
    return m


def override_values(overrides: list[str]) -> dict[str, str]:
    """`--data X` / `--data=X` (also `--eval-data`) in the trainer overrides: key → value."""
    found: dict[str, str] = {}
    for i, tok in enumerate(overrides):
        key, eq, value = tok[2:].partition("=") if tok.startswith("--") else ("", "", "")
        key = key.replace("-", "_")
        if key in KEYS:
            if not eq:
                if i + 1 >= len(overrides) or overrides[i + 1].startswith("--"):
                    raise DockyardError(f"-- --{key} needs a value: a file or folder on this host")
                value = overrides[i + 1]
            found[key] = value
    return found


def strip_keys(overrides: list[str], keys: dict[str, str]) -> list[str]:
    """The overrides without the ones `override_values` found (they are added back rewritten)."""
    out, skip = [], False
    for tok in overrides:
        if skip:
            skip = False
            continue
        key, eq, _ = tok[2:].partition("=") if tok.startswith("--") else ("", "", "")
        if key.replace("-", "_") in keys:
            skip = not eq
            continue
        out.append(tok)
    return out


def host_path(value: str, where: str, settings: Settings | None = None) -> Path | None:
    """The host file or folder `value` names, or None for a hub id (`org/name`, found in the cache inside).
    What looks like a path (absolute, ./, ~, a data file's suffix) but is not there is an error."""
    p = Path(value).expanduser()
    if p.exists():
        return p.resolve()
    looks_like_path = value.startswith(("/", ".", "~")) or Path(value).suffix in FILE_SUFFIXES
    if looks_like_path or settings is not None:  # the invoke.yaml settings name host paths only
        raise DockyardError(f"{where} {value}: no such file or folder on this host (give an existing file or "
                            "folder; it is mounted read-only into the run)")
    return None
