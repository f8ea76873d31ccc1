"""Recipes: a recipe is a strategy; the model, data, task and hyper-parameters are shared settings.

recipes/<name>/recipe.yaml says which strategy (and which DeepSpeed JSON or FSDP file) a recipe uses and
when to pick it; recipes/defaults.yaml holds the settings every recipe shares; a recipe may change a few
of them (`settings:`), and the command line overrides any of them (`-- --max_steps 50`).

Importable without torch: the host's `invoke recipes` lists recipes with this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from dockyard.errors import DockyardError

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"
DATA = ROOT / "data"
TINY_MODEL = Path(__file__).resolve().parent / "assets" / "tiny-llama"

Strategy = Literal["ddp", "zero2", "zero2-offload", "zero3", "zero3-offload", "fsdp"]

# What the recipe itself decides; a run may not change them with overrides (that would be another recipe).
STRATEGY_KEYS = ("deepspeed", "fsdp", "fsdp_config")


class Recipe(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    folder: Path
    command: str
    when: str
    strategy: Strategy
    peft: Literal["lora", "qlora"] | None = None
    deepspeed: str | None = None      # file in the recipe folder
    fsdp: str | None = None           # file in the recipe folder: TrainingArguments' fsdp and fsdp_config
    settings: dict[str, Any] = {}     # this recipe's changes to recipes/defaults.yaml

    @model_validator(mode="after")
    def _one_strategy_file(self):
        if self.deepspeed and self.fsdp:
            raise ValueError("a recipe uses DeepSpeed or FSDP, not both: remove one of `deepspeed:` and `fsdp:`")
        wants = "deepspeed" if self.strategy.startswith("zero") else "fsdp" if self.strategy == "fsdp" else None
        for key in ("deepspeed", "fsdp"):
            if key == wants and not getattr(self, key):
                raise ValueError(f"strategy {self.strategy} needs `{key}:` naming its file in the recipe folder")
            if key != wants and getattr(self, key):
                raise ValueError(f"strategy {self.strategy} takes no `{key}:` file")
        for key in STRATEGY_KEYS:
            if key in self.settings:
                raise ValueError(f"`{key}` is set by the strategy file, not under `settings:`")
        return self

    def file(self, name: str) -> Path:
        return self.folder / name


# From the least to the most memory saved per GPU, then adapters; recipes of your own come after.
ORDER = ("ddp", "zero2", "zero2-offload", "zero3", "zero3-offload", "fsdp", "lora", "qlora")


def recipe_names() -> list[str]:
    names = [p.parent.name for p in RECIPES.glob("*/recipe.yaml")]
    return sorted(names, key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))


def load_recipe(name_or_dir: str | Path) -> Recipe:
    """A recipe by name (recipes/<name>/) or by the path of a folder holding a recipe.yaml."""
    folder = Path(name_or_dir)
    if not (folder / "recipe.yaml").is_file():
        folder = RECIPES / str(name_or_dir)
    path = folder / "recipe.yaml"
    if not path.is_file():
        raise DockyardError(f"unknown recipe {str(name_or_dir)!r}: pick one of {', '.join(recipe_names())} "
                            f"or give a folder that holds a recipe.yaml")
    text = path.read_text()
    first = text.splitlines()[0] if text else ""
    if not first.startswith("# "):
        raise DockyardError(f"{path}: the first line must be a comment giving the command that runs the recipe")
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise DockyardError(f"{path} is not valid YAML: {e}") from None
    try:
        recipe = Recipe(name=folder.name, folder=folder.resolve(), command=first[2:].strip(), **raw)
    except (ValidationError, TypeError) as e:
        raise DockyardError(f"{path}: {_problems(e)}") from None
    for f in (recipe.deepspeed, recipe.fsdp):
        if f and not recipe.file(f).is_file():
            raise DockyardError(f"{path}: names {f}, which is not in {folder}")
    return recipe


def list_recipes() -> list[Recipe]:
    return [load_recipe(name) for name in recipe_names()]


# --- settings ------------------------------------------------------------------------------------

class RunSettings(BaseModel):
    """The project's own settings; every other key in defaults.yaml is a TrainingArguments field."""

    model_config = ConfigDict(extra="forbid")

    model: str = ""               # a model folder; "" = the tiny Llama-shaped model made from its config
    data: str = ""                # JSONL or .txt; "" = the sample shipped in data/
    task: Literal["causal_lm", "seq_cls"] = "causal_lm"
    max_seq_length: int = 128
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    lora_target_modules: str | list[str] = "all-linear"

    @property
    def data_path(self) -> Path:
        if self.data:
            return Path(self.data)
        return DATA / ("sample-classify.jsonl" if self.task == "seq_cls" else "sample.jsonl")


def parse_overrides(argv: list[str]) -> dict[str, Any]:
    """`--key value` / `--key=value` / `--flag` (true) → {key: value}, values read as YAML scalars."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        tok = argv[i]
        if not tok.startswith("--") or tok == "--":
            raise DockyardError(f"override {tok!r} is not of the form --key value")
        key, eq, value = tok[2:].partition("=")
        if not eq:
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                value, i = argv[i + 1], i + 1
            else:
                value = "true"
        out[key.replace("-", "_")] = _scalar(value)
        i += 1
    return out


def _scalar(text: str) -> Any:
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        try:  # YAML 1.1 reads 1e-4 as a string
            return float(text)
        except ValueError:
            return text
    return value


def resolve_settings(recipe: Recipe, overrides: dict[str, Any]) -> tuple[RunSettings, dict[str, Any]]:
    """defaults.yaml ← recipe settings ← overrides, split into the project's settings and TrainingArguments."""
    defaults = yaml.safe_load((RECIPES / "defaults.yaml").read_text()) or {}
    for key in STRATEGY_KEYS:
        if key in overrides or key in defaults:
            where = f"--{key}" if key in overrides else f"`{key}` in recipes/defaults.yaml"
            raise DockyardError(f"{where}: the recipe is the strategy (DeepSpeed or FSDP, never both); pick "
                                f"another recipe (invoke recipes) or make a recipe folder of your own")
    merged = {**defaults, **recipe.settings, **overrides}
    ours = {k: merged.pop(k) for k in list(merged) if k in RunSettings.model_fields}
    try:
        settings = RunSettings(**ours)
    except ValidationError as e:
        raise DockyardError(f"invalid setting: {_problems(e)}") from None
    return settings, merged


def _problems(e: Exception) -> str:
    if isinstance(e, ValidationError):
        return "; ".join(f"{'.'.join(map(str, err['loc'])) or 'recipe'}: {err['msg']}" for err in e.errors())
    return str(e)
