"""What of the host a run sees: the user's model and data, and the recipes, mounted read-only into the container.

- `--data=PATH`, `--model=PATH` (or the invoke.yaml settings of the same names, or a trainer override
  `-- --data PATH` / `--eval_data PATH` / `--model PATH` naming a host path, or the recipe's own `settings:` of
  those names) → the file or folder mounted read-only under /workspace/inputs/, and the trainer told the path it
  has inside.
- The checkout's recipes/ is mounted over the image's copy, so an edited recipe applies to the next run
  without a build (nodes without the checkout use the image's copy); `--recipe=/any/folder` is mounted too.
- DOCKYARD_HOST_PATHS tells the trainer which host path each inside path is, for the manifest's record.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dockyard.common import envvars, tree
from dockyard.common.data_files import HUB_ID  # a hub id as the trainer reads one
from dockyard.common.errors import DockyardError, cut
from dockyard.common.model_config import cached_snapshot
from dockyard.common.recipes import load_recipe
from dockyard.launch import scriptwords
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
        return {envvars.HOST_PATHS: json.dumps(self.host_paths, sort_keys=True)} if self.host_paths else {}


def read_only_mounts(settings: Settings, recipe: str, overrides: list[str], *, data: str = "", model: str = "",
                checkout_recipes: bool = True, separators: str = ":",
                recipe_settings: Mapping[str, Any] | None = None) -> Mounts:
    """The mounts of one run (pure: reads only whether the paths exist). Flags win over the invoke.yaml
    settings, which win over the recipe's own `settings:` (those of `recipe`, or `recipe_settings`); a host path
    given as an override is mounted the same way (overrides win over all). A path holding one of `separators`
    (docker's -v splits on ':'; pyxis's and Apptainer's mount lists on ',' too) is refused."""
    m = Mounts()
    m.overrides = strip_keys(overrides, override_values(overrides))
    if recipe_settings is None:
        recipe_settings = load_recipe(recipe).settings if recipe else {}
    for key, value, where in resolved(settings, overrides, data=data, model=model, recipe_settings=recipe_settings):
        host = host_path(value, where, settings, key)
        if host is None:  # a hub id (model or dataset in the Hugging Face cache): passed as it is
            m.overrides += [f"--{key}", value]
            continue
        scriptwords.mount_path(str(host), where, separators)
        # a file is mounted under the name it was given: a link's target may have none of a data file's suffixes
        # (the Hugging Face cache's snapshots/REV/train.jsonl -> blobs/<sha256>; DVC, git-annex), and the trainer
        # reads a file by its suffix
        inside = f"{INPUTS}/{key}" + ("" if host.is_dir() else f"/{given_name(value, host)}")
        scriptwords.mount_path(inside, where, separators)  # the link's own name may hold what its target does not
        m.volumes.append((host, inside, True))
        m.host_paths[inside] = str(host)
        m.overrides += [f"--{key}", inside]
    m.recipe = recipe
    folder = Path(os.path.expanduser(recipe))
    if recipe and (folder / "recipe.yaml").is_file():
        folder = folder.resolve()
        if checkout_recipes and folder.parent == (ROOT / "recipes").resolve():
            m.recipe = folder.name  # one of the checkout's own: found in the recipes/ mounted below
        else:
            scriptwords.mount_path(str(folder), "--recipe", separators)
            inside = f"{USER_RECIPES}/{folder.name}"
            m.volumes.append((folder, inside, True))
            m.host_paths[inside] = str(folder)
            m.recipe = inside
    if checkout_recipes:
        recipes = (ROOT / "recipes").resolve()
        scriptwords.mount_path(str(recipes), "this checkout's folder", separators)
        m.volumes.append((recipes, f"{IMAGE_ROOT}/recipes", True))
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


def resolved(settings: Settings, overrides: list[str], *, data: str = "", model: str = "",
             recipe_settings: Mapping[str, Any] | None = None):
    """(key, value, where it came from) of each input the run is given: an override wins over the flag, the flag
    over the invoke.yaml setting, that over the recipe's own `settings:` (a relative path in either is relative to
    the project root, where it names one: as a native run reads it). The recipe's is mounted like the others: the
    trainer in the container would read its host path inside the image, where nothing is."""
    given = override_values(overrides)
    recipe_settings = recipe_settings or {}
    for key, flag in (("model", model), ("data", data), ("eval_data", "")):
        if key in given:
            yield key, given[key], f"-- --{key}"
        elif flag:
            yield key, flag, f"--{key}"
        elif value := getattr(settings, key, "") or "":
            # the variable wins over invoke.yaml: one set in a shell long ago is named, or the user looks in the file
            env = f"INVOKE_DOCKYARD_{key.upper()}"
            yield key, setting_input(settings, value), f"setting {key}" + (f" (from {env})" if os.environ.get(env) else "")
        elif value := recipe_settings.get(key):
            if not isinstance(value, str):
                raise DockyardError(f"the recipe's settings: {key}: {value!r}: takes a file or folder's path, or a "
                                    "hub id, as text")
            yield key, setting_input(settings, value), f"the recipe's settings: {key}"


def setting_input(settings: Settings, value: str) -> str:
    """An input named in invoke.yaml: a relative path is the project root's (where it names one, or looks like a
    path); anything else, a hub id, stays as written."""
    in_root = settings.path(value)
    return str(in_root) if in_root.exists() or looks_like_path(value) else value


def host_path(value: str, where: str, settings: Settings, key: str = "data") -> Path | None:
    """The host file or folder `value` names, or None for a hub id.

    The rule: a value that exists on this host is that file or folder. One that does not is a hub id only when it
    has the form org/name and that model or dataset is in the Hugging Face cache (the `hf_cache` setting): runs are
    offline, so it could not be found anywhere else. Anything else is refused before the run starts."""
    p = Path(os.path.expanduser(value))
    try:
        found = p.exists()
    except OSError as e:  # ENAMETOOLONG: the catch-all's "<the path, whole>: File name too long", naming no setting
        raise DockyardError(f"{where} {cut(value)}: no path this host can have ({e.strerror}: a name holds at most "
                            "255 bytes, a path 4,096); give an existing file or folder") from None
    if found:
        return p.resolve()
    if not looks_like_path(value) and HUB_ID.fullmatch(value) and in_hub_cache(settings, value, key):
        home = settings.path(settings.hf_cache)
        if key == "model" and cached_snapshot(home, value) is None:  # the trainer's from_pretrained finds nothing
            raise DockyardError(f"{where} {value}: the Hugging Face cache {home} holds this model's folder but no "
                                "complete snapshot of it (none with a config.json: a download that stopped?): on a "
                                f"machine with internet, `hf download {value}` again, then copy its "
                                "~/.cache/huggingface into that folder")
        return None
    if HUB_ID.fullmatch(value) and not looks_like_path(value):  # models/x: a hub id's form, and a folder's
        kind, what = (" --repo-type dataset", "file or folder") if key in ("data", "eval_data") else ("", "folder")
        raise DockyardError(f"{where} {value}: neither a {what} on this host (if you meant one: no such {what} "
                            f"./{value} in {Path.cwd()}) nor a hub id in the Hugging Face cache "
                            f"{settings.path(settings.hf_cache)} (runs are offline: on a machine with internet, "
                            f"`hf download{kind} {value}`, then copy its ~/.cache/huggingface into that folder)")
    hub = ""
    if re.fullmatch(r"[A-Za-z0-9][\w.-]*", value) and not looks_like_path(value):  # gpt2: a hub id of old, no org
        named = "model is named org/name (gpt2 is openai-community/gpt2)" if key == "model" else \
            "dataset is named org/name (squad is rajpurkar/squad)"
        hub = f"; a hub {named} and read from the Hugging Face cache {settings.path(settings.hf_cache)}"
    meant = tree.near(p) if looks_like_path(value) or "/" in value else None  # chat.jsnl for chat.jsonl
    raise DockyardError(f"{where} {value}: no such file or folder on this host (" + (
        f"did you mean {cut(str(meant))}?" if meant else "give an existing file or folder; it is mounted read-only "
        "into the run") + f"){hub}")


def given_name(value: str, host: Path) -> str:
    """The file name `value` gives (a link's own name, not its target's); the host path's where it gives none."""
    return Path(os.path.expanduser(value)).name or host.name


def looks_like_path(value: str) -> bool:
    """Absolute, ./, ~, or a data file's suffix: a path whatever else it might look like."""
    return value.startswith(("/", ".", "~")) or Path(value).suffix in FILE_SUFFIXES


def in_hub_cache(settings: Settings, repo_id: str, key: str) -> bool:
    """The hub cache's folder of a model or dataset (hub/models--org--name), or the datasets library's own cache."""
    home = settings.path(settings.hf_cache)
    org, name = repo_id.split("/")
    kinds = ("models",) if key == "model" else ("datasets",)
    return any((home / "hub" / f"{kind}--{org}--{name}").is_dir() for kind in kinds) \
        or (key != "model" and (home / "datasets" / f"{org}___{name}").is_dir())
