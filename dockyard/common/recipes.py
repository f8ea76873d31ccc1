"""The recipe registry: what every strategy means, written once, and the recipe folders that use them.

A recipe is a folder, recipes/<name>/recipe.yaml, naming one strategy below (and, optionally, adapters).
A strategy says which engine trains (ddp, deepspeed, fsdp), its ZeRO stage and offloads, which file the
recipe folder must hold, what the strategy-in-effect check expects to find, and how the planner counts its
memory. The trainer (recipe validation, guards, the strategy check), `invoke plan`, `invoke recipes`, the
benchmarks and the GPU tests all read this module, so:

- a new recipe with an existing strategy is one folder, nothing else;
- a new strategy is one entry in STRATEGIES (the order there is the listing order) plus its folder.

Imports only the standard library, PyYAML and pydantic: the host (no torch) and the image both import it.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from dockyard import ROOT
from dockyard.common import tree
from dockyard.common.errors import (
    DockyardError,
    MiB,
    cut,
    json_object,
    on_one_line,
    problems,
    read_bounded,
    short,
    shown,
    yaml_problem,
)

RECIPES = ROOT / "recipes"
# What yaml.safe_load raises besides YAMLError: its constructors convert tagged and date-like scalars with int(),
# float() and datetime (`0x_`, `!!float x`, `0000-00-00`: ValueError; `!!float`: IndexError; `!!timestamp x`:
# AttributeError), and it recurses once per nesting level.
YAML_ERRORS = (yaml.YAMLError, ValueError, IndexError, AttributeError, TypeError, RecursionError)
BUFFER = 1.5          # DeepSpeed's additional_buffer_factor for host memory
FULL_STATES = 18      # bytes per trained parameter: fp32 weights 4 + grads 4 + Adam 8 + bf16 working copy 2
NF4_BYTES = 0.5625    # 4-bit NF4 per quantised weight: half a byte, and an fp32 scale per 64 (train/fourbit.py)


INT, FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"


class Yaml11Number(yaml.constructor.ConstructorError):
    """A plain scalar YAML 1.1 reads as another number than the one written (see yaml11_surprise)."""


def yaml11_surprise(node: yaml.Node) -> str:
    """Why `node` (a plain scalar) would be read as a number other than the one its text says, and what to write;
    "" where it is read as written. PyYAML reads YAML 1.1, where `1:00` is 60 (a number in base 60) and `010` is 8
    (octal); YAML 1.2 and the other readers of these files (an editor, yq, a person) see the text `1:00` and ten.
    `0x1f` (hex), `0b101` and `1_000` say what they are and stay the numbers they are."""
    if not isinstance(node, yaml.ScalarNode) or node.style or node.tag not in (INT, FLOAT):
        return ""
    text, value = node.value, yaml.safe_load(node.value)
    if ":" in text:
        how, meant = "a:b as a number in base 60", ""
    elif re.fullmatch(r"[-+]?0[0-7_]+", text) and node.tag == INT and value != (digits := int(text.replace("_", ""))):
        how, meant = "a leading 0 as octal", f" (or {digits}, as the digits say)"
    else:
        return ""
    return (f"{text} would be read as {value} (YAML 1.1 reads {how}): write {value}{meant}, or quote '{text}' where "
            "text is meant")


class Yaml11Numbers(yaml.SafeLoader):
    """yaml.safe_load's loader, refusing a plain scalar that YAML 1.1 reads as another number than the one written
    (yaml11_surprise): `max_steps: 1:00` trained 60 steps and `seed: 010` seeded 8, without a word. A mapping's value is
    named by its key."""

    def construct_document(self, node):  # noqa: ANN001, ANN201 - PyYAML's own signature
        stack, seen = [(node, "")], set()
        while stack:  # not recursive: the composer has already met the nesting, which may be deep
            n, key = stack.pop()
            if id(n) in seen:  # an alias: the same node again
                continue
            seen.add(id(n))
            if why := yaml11_surprise(n):
                raise Yaml11Number(None, None, f"{key}: {why}" if key else why, n.start_mark)
            if isinstance(n, yaml.MappingNode):
                stack += [(v, k.value if isinstance(k, yaml.ScalarNode) else "") for k, v in reversed(n.value)]
            elif isinstance(n, yaml.SequenceNode):
                stack += [(v, "") for v in reversed(n.value)]  # the first in the file is said first
        return super().construct_document(node)


class _OneOfEachKey(Yaml11Numbers):
    """yaml.safe_load's loader, refusing a key written twice in one mapping: PyYAML keeps the last without a word, so
    a second `learning_rate:` further down a recipe silently replaced the first. A merge (`<<: *base`) may still be
    overridden by the mapping's own keys, as YAML means it to."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    repeated = key in seen
                except TypeError:  # an unhashable key: the constructor below says so
                    continue
                if repeated:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"{key!r} is set twice (keep one: the second would silently replace the first)",
                        key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep)


def read_yaml(text: str, path: Path | str) -> Any:
    """yaml.safe_load of a file of the user's (a recipe, defaults.yaml, an FSDP file), a key set twice refused, and a
    number YAML 1.1 would read as another (Yaml11Numbers), said of the file `path` and its line."""
    try:
        return yaml.load(text, Loader=_OneOfEachKey)  # noqa: S506 - a SafeLoader
    except Yaml11Number as e:  # valid YAML, read as the user did not mean it
        raise DockyardError(f"{path}, line {e.problem_mark.line + 1}: {e.problem}") from None



@dataclass(frozen=True)
class Sizes:
    """What a memory formula needs: parameter counts and where the processes run."""

    params: int           # all parameters (tied ones once)
    largest_layer: int    # parameters of the largest single module (DeepSpeed's "largest layer")
    world_size: int
    gpus_per_node: int
    linear_params: int = 0  # the decoder's linear weights: what QLoRA quantises
    lora_params: int = 0    # trainable parameters of the adapters
    loaded_bytes: int = 4   # bytes a weight takes in host memory while each process loads the model (2: 16-bit)

    @property
    def nodes(self) -> int:
        return max(1, math.ceil(self.world_size / self.gpus_per_node))


Formula = Callable[[Sizes], "tuple[int, int]"]  # → (GPU bytes per device, host bytes per node)


@dataclass(frozen=True)
class Strategy:
    """One way to spread training over processes. `model_states` is the planner's memory formula;
    zero2/zero3 and their offloads are DeepSpeed's own estimators with zero.Init (tests pin them; zero2-offload's
    host memory per node on several nodes is counted for that node's processes: _zero2_offload)."""

    name: str
    engine: str                      # "ddp" | "deepspeed" | "fsdp"
    model_states: Formula
    zero_stage: int | None = None
    offload_optimizer: bool = False
    offload_param: bool = False
    fsdp_version: int | None = None
    recommend: bool = True           # False: shown by `invoke plan`, never the recipe it recommends
    # the recipe.yaml key naming the strategy's own file in the recipe folder (None: no file)
    file_key: str | None = None

    @property
    def offloads(self) -> bool:
        return self.offload_optimizer or self.offload_param

    @property
    def casts_weights_to_half(self) -> bool:
        """Under 16-bit mixed precision the engine casts the model's weights to that type and makes the optimizer's
        float32 copy from the cast ones (DeepSpeed ZeRO-1/2, without zero.Init): weights loaded in float32 end exactly
        as weights loaded in 16 bits, having cost every process twice the host memory while loading."""
        return self.engine == "deepspeed" and self.zero_stage in (1, 2)

    @property
    def shards_parameters(self) -> bool:
        """Every rank holds only a shard of the weights (ZeRO-3, FSDP)."""
        return self.zero_stage == 3 or self.engine == "fsdp"

    def in_words(self, adapters: str = "") -> str:
        """How it spreads the model's states, for `invoke recipes`: "ZeRO-2: gradients and optimizer sharded";
        `adapters`: what trains where the recipe trains adapters alone."""
        engine = {"ddp": "DDP", "deepspeed": f"ZeRO-{self.zero_stage}", "fsdp": f"FSDP{self.fsdp_version or ''}"}
        sharded = [what for what, yes in (("weights", self.shards_parameters), ("gradients", self.engine != "ddp"),
                                          ("optimizer", self.engine != "ddp")) if yes]
        in_host = [what for what, yes in (("weights", self.offload_param), ("gradients", self.offload_optimizer),
                                          ("optimizer", self.offload_optimizer)) if yes]
        said = [f"{_and(sharded)} sharded" + (", in host RAM" if in_host == sharded else "")] if sharded else []
        said += [f"{_and(in_host)} in host RAM"] if in_host and in_host != sharded else []
        said += [adapters] if adapters else []
        return f"{engine[self.engine]}: " + ("; ".join(said) or "every GPU holds the whole model")

    def in_effect(self, world_size: int) -> dict[str, Any]:
        """What the wrapped model must look like once the Trainer has set this strategy up."""
        # One DDP process has nothing to synchronise: the Trainer (rightly) does not wrap the model.
        engine = "single" if self.engine == "ddp" and world_size == 1 else self.engine
        return {"engine": engine, "zero_stage": self.zero_stage,
                "offload_optimizer": "cpu" if self.offload_optimizer else None,
                "offload_param": "cpu" if self.offload_param else None, "fsdp_version": self.fsdp_version}


def _and(words: list[str]) -> str:
    return ", ".join(words[:-1]) + f" and {words[-1]}" if len(words) > 1 else words[0]


def _replicated(s: Sizes) -> tuple[int, int]:
    return FULL_STATES * s.params, int(s.params * s.loaded_bytes * s.gpus_per_node * BUFFER)


def _zero2(s: Sizes) -> tuple[int, int]:
    return (2 * s.params + int(FULL_STATES * s.params / s.world_size),
            int(s.params * s.loaded_bytes * s.gpus_per_node * BUFFER))


def _zero2_offload(s: Sizes) -> tuple[int, int]:
    # Per node: each of its processes loads a copy (4 bytes a weight, 2 in 16 bits, × its GPUs), then its share of the optimizer
    # partitions stays pinned (16 bytes / nodes), as DeepSpeed's ZeRO-3 estimator counts without zero.Init. DeepSpeed's
    # ZeRO-2 one takes 4 × every GPU of every node, which on one node is the same figure and on 4 nodes of 8 asked a
    # node for 1.4 TiB to train 8B parameters (the trainer refused the run)
    return 2 * s.params, int(s.params * max(s.loaded_bytes * s.gpus_per_node, 16 / s.nodes) * BUFFER)


def _zero3(s: Sizes) -> tuple[int, int]:
    return (4 * s.largest_layer + int(FULL_STATES * s.params / s.world_size),
            int(s.largest_layer * 4 * s.gpus_per_node * BUFFER))


def _zero3_offload(s: Sizes) -> tuple[int, int]:  # parameters and optimizer both in host memory
    return 4 * s.largest_layer, int(s.params * FULL_STATES * (1 / s.nodes) * BUFFER)


def _fsdp(s: Sizes) -> tuple[int, int]:
    """ZeRO-3's GPU figure; in host memory the whole fp32 model, which the first process of a node loads before it
    hands each process its shard (recipes/fsdp: cpu_ram_efficient_loading). ZeRO-3's zero.Init figure (4L per
    process) said 23.5 GiB where Llama-3.1-8B's fp32 copy alone is 29.9."""
    return _zero3(s)[0], int(4 * s.params * BUFFER)


# From the fastest (least memory saved per GPU) to the slowest: recipes are listed in this order, and
# `invoke plan` recommends the first that fits.
STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    Strategy("ddp", "ddp", _replicated),
    Strategy("zero2", "deepspeed", _zero2, zero_stage=2, file_key="deepspeed"),
    Strategy("zero2-offload", "deepspeed", _zero2_offload, zero_stage=2, offload_optimizer=True,
             file_key="deepspeed"),
    Strategy("zero3", "deepspeed", _zero3, zero_stage=3, file_key="deepspeed"),
    Strategy("zero3-offload", "deepspeed", _zero3_offload, zero_stage=3, offload_optimizer=True,
             offload_param=True, file_key="deepspeed"),
    # FULL_SHARD shards like ZeRO-3 and needs what it needs: shown, but zero3 is the one recommended.
    Strategy("fsdp", "fsdp", _fsdp, fsdp_version=2, recommend=False, file_key="fsdp"),
)}


def _lora(s: Sizes) -> tuple[int, int]:
    return 2 * s.params + FULL_STATES * s.lora_params, int(s.params * 2 * s.gpus_per_node * BUFFER)


def _qlora(s: Sizes) -> tuple[int, int]:
    frozen = int(NF4_BYTES * s.linear_params) + 2 * (s.params - s.linear_params)
    return frozen + FULL_STATES * s.lora_params, int(s.params * 2 * s.gpus_per_node * BUFFER)


# Adapters: the base stays frozen on every GPU (bf16, or NF4 for the quantised linear layers) and only the
# adapters train, with full optimizer states. Listed after full fine-tuning, in this order.
ADAPTERS: dict[str, Formula] = {"lora": _lora, "qlora": _qlora}


def strategy(name: str) -> Strategy:
    if name not in STRATEGIES:
        raise DockyardError(f"unknown strategy {name!r}; valid: {', '.join(STRATEGIES)}")
    return STRATEGIES[name]


def model_states(strategy_name: str, peft: str | None, sizes: Sizes) -> tuple[int, int]:
    """(GPU bytes per device, host bytes per node) for weights, gradients and optimizer states. Host memory
    without offload is what loading the checkpoint takes (every rank holds a copy while loading)."""
    formula = ADAPTERS[peft] if peft else strategy(strategy_name).model_states
    return formula(sizes)


# --- the recipe folders -------------------------------------------------------------------------------

NOT_IN_THE_FILE = {"name", "folder", "command"}  # a recipe's name is its folder's, its command the file's first line
# What the recipe itself decides; a run may not change them with overrides (that would be another recipe).
STRATEGY_KEYS = ("deepspeed", "fsdp", "fsdp_config")


class Recipe(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    folder: Path
    command: str
    when: str
    strategy: str
    peft: str | None = None
    deepspeed: str | None = None      # file in the recipe folder
    fsdp: str | None = None           # file in the recipe folder: TrainingArguments' fsdp and fsdp_config
    settings: dict[str, Any] = {}     # this recipe's changes to recipes/defaults.yaml

    @field_validator("settings", mode="before")
    @classmethod
    def _empty_settings(cls, v: Any) -> Any:
        return {} if v is None else v  # `settings:` with nothing under it (YAML's null): none, not a refusal

    @field_validator("strategy")
    @classmethod
    def _known_strategy(cls, v: str) -> str:
        if v not in STRATEGIES:
            # the value is the formatter's to quote (errors.problems), once, as it quotes every field's
            raise ValueError(f"is not a known strategy; give one of {', '.join(STRATEGIES)}")
        return v

    @field_validator("peft")
    @classmethod
    def _known_adapter(cls, v: str | None) -> str | None:
        if v is not None and v not in ADAPTERS:
            raise ValueError(f"is not a known adapter; give one of {', '.join(ADAPTERS)}, or leave peft out")
        return v

    @field_validator("deepspeed", "fsdp")
    @classmethod
    def _in_the_folder(cls, v: str | None) -> str | None:
        if v is not None and (not v or "/" in v or "\\" in v or v in (".", "..")):
            raise ValueError("is not the name of a file in the recipe folder; name one there (a recipe travels as "
                             "one folder)")
        return v

    @model_validator(mode="after")
    def _one_strategy_file(self):
        if self.deepspeed and self.fsdp:
            raise ValueError("a recipe uses DeepSpeed or FSDP, not both: remove one of `deepspeed:` and `fsdp:`")
        wants = STRATEGIES[self.strategy].file_key
        for key in ("deepspeed", "fsdp"):
            if key == wants and not getattr(self, key):
                raise ValueError(f"strategy {self.strategy} needs `{key}:` naming its file in the recipe folder")
            if key != wants and getattr(self, key):
                raise ValueError(f"strategy {self.strategy} takes no `{key}:` file")
        for key in STRATEGY_KEYS:
            if key in self.settings:
                raise ValueError(f"`{key}` is set by the strategy file, not under `settings:`")
        if self.peft == "qlora" and STRATEGIES[self.strategy].engine == "fsdp":
            # what HF documents for FSDP-QLoRA (the 4-bit weights stored in the compute dtype, which
            # model.quantization_config already does, and cpu_ram_efficient_loading) is FSDP1's. Under FSDP2, the only
            # FSDP here, fully_shard turns each Params4bit into a plain DTensor without its quant_state, and the 4-bit
            # layers compute with the packed bytes (bitsandbytes#1945, open; axolotl patches it in its own code); and
            # accelerate 1.15's fsdp2_prepare_model skips cpu_ram_efficient_loading (rank 0's weights sent to the
            # others) for a model holding Params4bit. Refused where the recipe is read: invoke run --dry, the trainer
            raise ValueError("peft: qlora does not train under strategy fsdp: FSDP2, the only FSDP here, loses the "
                             "4-bit weights' quantization state when it shards them (bitsandbytes#1945), and "
                             "accelerate does no cpu_ram_efficient_loading of a 4-bit model; use the qlora recipe "
                             "(DDP: each GPU holds the whole 4-bit base)")
        return self

    @property
    def strategy_spec(self) -> Strategy:
        """What the recipe's strategy (its name, `strategy`) is: engine, stage, offloads, memory formula."""
        return STRATEGIES[self.strategy]

    def file(self, name: str) -> Path:
        return self.folder / name

    def deepspeed_ops(self) -> set[str]:
        """The ops DeepSpeed loads as a run of this recipe makes its optimizer (compiling one the image lacks into
        torch's extensions folder, under a lock every other run loading it waits on): none but DeepSpeed's."""
        return optimizer_ops(read_deepspeed_config(self.file(self.deepspeed))) if self.deepspeed else set()


def closest_recipe(given: str, names: list[str]) -> str:
    """The recipe a mistyped name most likely meant (`ZeRO2`, `zero-2`, `zero_3`, `zero2offload`), "" where none is
    close; `deepspeed` is the default, DeepSpeed's ZeRO-2."""
    def plain(name: str) -> str:
        return re.sub(r"[\W_]", "", name.lower())

    if plain(given) in ("deepspeed", "ds", "zero") and "zero2" in names:
        return "zero2 (DeepSpeed ZeRO-2)"
    same = [n for n in names if plain(n) == plain(given)]
    near = same or difflib.get_close_matches(given.lower(), names, n=1, cutoff=0.75)
    return near[0] if near else ""


def folder_names() -> list[str]:
    """The names of the folders under recipes/ that hold a recipe.yaml, loaded or not: what a misspelt name is held
    against (closest_recipe)."""
    return sorted(p.parent.name for p in RECIPES.glob("*/recipe.yaml"))


def load_recipe(name_or_dir: str | Path) -> Recipe:
    """A recipe by name (recipes/<name>/) or by the path of a folder holding a recipe.yaml."""
    folder = Path(name_or_dir)
    if not (folder / "recipe.yaml").is_file():
        folder = RECIPES / str(name_or_dir)
    path = folder / "recipe.yaml"
    if not path.is_file():
        names = folder_names()
        if Path(name_or_dir).is_dir():  # a folder of one's own, without its recipe.yaml (a name is looked up first)
            # its contents (/.), since the folder is there: `cp -r DIR FOLDER` would copy DIR into it; by the
            # checkout's path, since the user may stand anywhere (invoke -r)
            source = shlex.quote(f"{RECIPES / 'zero2'}/.")
            raise DockyardError(f"the folder {str(name_or_dir)!r} holds no recipe.yaml: copy a recipe's folder to "
                                f"start from (cp -r {shown(source)} {shown(shlex.quote(str(name_or_dir)))}), or pick "
                                f"one of {', '.join(names)}")
        given = Path(name_or_dir)
        if given.name == "recipe.yaml" and given.is_file():  # the file itself (--recipe=mine/recipe.yaml)
            raise DockyardError(f"--recipe {str(name_or_dir)!r} is a file: give the folder that holds it, "
                                f"--recipe={shown(shlex.quote(str(given.parent)))}")
        if "/" in str(name_or_dir):  # a path, not a name: a folder of one's own that is not there (a typo in it)
            near = tree.near(given, lambda p: (p / "recipe.yaml").is_file())  # the folder of one's recipe, mistyped
            raise DockyardError(f"unknown recipe {str(name_or_dir)!r}: no such folder" + (
                f" (did you mean {shown(str(near))}?)" if near else "") + ": give a folder that holds a recipe.yaml, or "
                f"pick one of {', '.join(names)}")
        near = closest_recipe(str(name_or_dir), names)
        raise DockyardError(f"unknown recipe {str(name_or_dir)!r}: " + (f"did you mean {near}? " if near else "")
                            + f"pick one of {', '.join(names)} or give a folder that holds a recipe.yaml")
    files_inside(folder)
    try:
        text = read_bounded(path, MiB, "recipe.yaml").decode("utf-8-sig")  # a BOM (Windows editors) left out
    except UnicodeDecodeError as e:
        raise DockyardError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}): save it as UTF-8") from None
    first = text.splitlines()[0] if text else ""
    if not first.startswith("#"):  # `#invoke run ...` is a comment too
        named = folder.name if folder.parent == RECIPES else shown(shlex.quote(str(name_or_dir)))
        raise DockyardError(f"{path}: the first line must be a comment giving the command that runs the recipe: "
                            f"add `# invoke run --recipe={named}` as its first line")
    try:
        raw = read_yaml(text, path) or {}
    except YAML_ERRORS as e:
        raise DockyardError(f"{path} is not valid YAML: {yaml_problem(e)}") from None
    if not isinstance(raw, dict):
        raise DockyardError(f"{path}: expected `key: value` lines (when, strategy, ...)")
    if given := sorted(NOT_IN_THE_FILE & set(map(str, raw))):
        raise DockyardError(f"{path}: {', '.join(given)} cannot be set here: a recipe's name is its folder's name, and "
                            "its command is the file's first line (a comment); remove the key")
    try:
        recipe = Recipe(name=folder.name, folder=folder.resolve(), command=first.lstrip("#").strip(), **raw)
    except (ValidationError, TypeError) as e:
        known = [k for k in Recipe.model_fields if k not in NOT_IN_THE_FILE]
        raise DockyardError(f"{path}: {problems(e, 'recipe', known=known)}") from None
    for f in (recipe.deepspeed, recipe.fsdp):
        if f and not recipe.file(f).is_file():
            raise DockyardError(f"{path}: names {f}, which is not in {folder}")
    if recipe.fsdp:
        read_fsdp_file(recipe.file(recipe.fsdp))
    if recipe.deepspeed:
        deepspeed_matches(read_deepspeed_config(recipe.file(recipe.deepspeed)), recipe.strategy_spec,
                          recipe.file(recipe.deepspeed))
    return recipe


def deepspeed_matches(cfg: dict, spec: Strategy, path: Path) -> None:
    """The ZeRO stage and offloads of a recipe's DeepSpeed JSON are the ones its `strategy:` names. The trainer
    checks what runs against the strategy once the model is wrapped (train/strategy.py): a zero2 recipe whose file
    says stage 3 stopped there, minutes in, after the model had loaded on every GPU."""
    if "zero_optimization" not in cfg:
        raise DockyardError(f"{path}: no zero_optimization section: the {spec.name} strategy needs one, with "
                            f'"stage": {spec.zero_stage}')
    zero = cfg["zero_optimization"]
    stage = zero.get("stage", 0)
    wrong = [f"zero_optimization.stage is {stage}, {spec.name} is stage {spec.zero_stage}"] \
        if stage != spec.zero_stage else []
    # ZeRO-2 has no parameters to offload: DeepSpeed leaves an offload_param there unused, as the trainer's check does
    offloads = (("offload_optimizer", spec.offload_optimizer), ("offload_param", spec.offload_param))[:1 + (stage == 3)]
    for key, wanted in offloads:
        section = zero.get(key)
        device = section.get("device", "none") if isinstance(section, dict) else "none" if section is None else section
        if device == "nvme":  # DeepSpeed's third device: the strategy check then found 'nvme', once the model loaded
            raise DockyardError(f'{path}: zero_optimization.{key}.device "nvme": no strategy here offloads to NVMe '
                                '(the offload recipes use host RAM): write "cpu" with an -offload strategy '
                                '(zero2-offload, zero3-offload), or "none"')
        if (device not in ("none", None)) != wanted:  # any device but none is an offload
            wrong.append(f"zero_optimization.{key}.device is {device!r}, {spec.name} "
                         + ("offloads it to the CPU (\"cpu\")" if wanted else "keeps it on the GPU (\"none\")"))
    if wrong:
        match = [s.name for s in STRATEGIES.values() if s.engine == "deepspeed" and s.zero_stage == stage]
        raise DockyardError(f"{path}: {'; '.join(wrong)}: the run would stop once the model had loaded, with a "
                            f"strategy mismatch. Make the file say what `strategy: {spec.name}` is, or change the "
                            f"recipe's strategy" + (f" ({' or '.join(match)} for this stage)" if match else ""))


# The fsdp_config keys TrainingArguments reads (each may start with fsdp_, which it drops): any other it ignores
FSDP_KEYS = ("version", "min_num_params", "transformer_layer_cls_to_wrap", "cpu_offload", "auto_wrap_policy",
             "cpu_ram_efficient_loading", "state_dict_type", "activation_checkpointing", "reshard_after_forward",
             "forward_prefetch", "backward_prefetch", "use_orig_params", "sync_module_states", "limit_all_gathers",
             "xla", "xla_fsdp_v2", "xla_fsdp_grad_ckpt", "xla_fsdp_settings")
FSDP_RENAMED = {"offload_params": "cpu_offload"}  # accelerate's config files' names, which TrainingArguments does not read


def read_fsdp_file(path: Path) -> dict[str, Any]:
    """A recipe's FSDP file: `fsdp: true` and `fsdp_config:` (TrainingArguments' settings of those names), FSDP2.
    Read by the host (`run --dry`, `invoke recipes`) and the trainer. Anything else started a run that stopped only
    once the model had loaded, with a traceback or a strategy mismatch."""
    try:
        raw = read_yaml(read_bounded(path, MiB, path.name).decode("utf-8-sig"), path) or {}
    except (*YAML_ERRORS, UnicodeDecodeError) as e:
        raise DockyardError(f"{path} is not valid YAML: {yaml_problem(e)}") from None
    if not isinstance(raw, dict):
        raise DockyardError(f"{path}: expected `fsdp:` and `fsdp_config:` lines")
    extra = sorted(set(raw) - {"fsdp", "fsdp_config"}, key=str)  # keys of YAML's any type: 1 beside "x"
    if extra:
        raise DockyardError(f"{path}: only `fsdp` and `fsdp_config` belong here, not "
                            f"{cut(on_one_line(', '.join(map(str, extra))))}")
    if raw.get("fsdp") is not True:  # false or left out: no FSDP at all; text or a list: transformers' deprecated form
        raise DockyardError(f"{path}: fsdp {short(raw.get('fsdp'))}: write `fsdp: true` (the sharding, offload and "
                            "wrapping go under fsdp_config:, as in recipes/fsdp/fsdp.yaml)")
    settings = raw.get("fsdp_config") or {}
    if not isinstance(settings, dict):
        raise DockyardError(f"{path}: fsdp_config {short(settings)}: takes `key: value` lines of FSDP settings")
    for key in settings:  # transformers reads these alone (a leading fsdp_ dropped), and the rest not at all
        name = str(key).removeprefix("fsdp_")
        if name not in FSDP_KEYS:
            near = FSDP_RENAMED.get(name) or next(iter(difflib.get_close_matches(name, FSDP_KEYS, n=1)), "")
            hint = (f" (accelerate's name: write {near})" if name in FSDP_RENAMED else
                    f" (did you mean {near}?)" if near else "")
            raise DockyardError(f"{path}: fsdp_config.{cut(on_one_line(str(key)), 60)}: not a setting transformers "
                                f"reads{hint}, which it would drop without a word; check the spelling against "
                                "TrainingArguments' fsdp_config")
    version = settings.get("version", settings.get("fsdp_version", 2))
    if version != STRATEGIES["fsdp"].fsdp_version:
        raise DockyardError(f"{path}: fsdp_config version {short(version)}: the fsdp strategy is FSDP2, `version: 2` "
                            "(1 is torch's deprecated FSDP, which the run's checks refuse once the model has loaded)")
    return {**raw, "fsdp_config": settings}


def files_inside(folder: Path) -> None:
    """A recipe is one folder (mounted alone into the run, hashed into the manifest): a file in it that is a link
    to somewhere else (`ds_config.json -> ~/x.json`) is refused, so nothing outside it is read on the host either."""
    root = folder.resolve()
    for p in tree.paths(folder):
        if not p.is_symlink():
            continue
        try:
            target = p.resolve(strict=False)
        except (RuntimeError, OSError):  # a loop of links (RuntimeError before Python 3.13)
            raise DockyardError(f"{p} is a link that leads back to itself ({os.readlink(p)}): remove it, or "
                                "copy the file it was meant to be into the recipe folder") from None
        if not target.is_relative_to(root):
            raise DockyardError(f"{p} is a link to {os.readlink(p)}, outside the recipe folder {folder}: a recipe is "
                                "one folder and travels as one; copy the file into the folder instead of linking it")


# Top-level keys DeepSpeed reads. It looks each one up by name with a default, so a misspelt key is
# silently ignored and the default used: we refuse keys not in this list instead.
DEEPSPEED_KEYS = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
    "optimizer", "scheduler", "zero_optimization", "bf16", "bfloat16", "fp16", "amp", "torch_autocast",
    "steps_per_print", "wall_clock_breakdown", "memory_breakdown", "dump_state", "prescale_gradients",
    "gradient_predivide_factor", "communication_data_type", "seq_parallel_communication_data_type",
    "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "activation_checkpointing",
    "aio", "flops_profiler", "comms_logger", "monitor_config", "tensorboard", "wandb", "csv_monitor", "comet",
    "checkpoint", "data_types", "elasticity", "compression_training", "data_efficiency", "curriculum_learning",
    "autotuning", "nebula", "pipeline", "sparse_attention", "dataloader_drop_last", "disable_allgather",
    "load_universal_checkpoint", "use_node_local_storage", "graph_harvesting", "compile", "timers",
    "weight_quantization", "hybrid_engine", "use_data_before_expert_parallelism", "tensor_parallel",
    "sequence_parallel_size", "gradient_accumulation_dtype", "grad_accum_dtype", "log_level", "zenflow",
}


def read_deepspeed_config(path: Path) -> dict:
    """A recipe's DeepSpeed JSON, refused when it is not an object of keys DeepSpeed reads. Called by the host
    (`run --dry`, `invoke recipes`: before any container starts) and by the trainer."""
    cfg = json_object(path, "DeepSpeed settings", one_of_each_key=True)
    unknown = sorted(set(cfg) - DEEPSPEED_KEYS)
    if unknown:
        raise DockyardError(f"{path}: unknown DeepSpeed key(s) {', '.join(unknown)} (DeepSpeed would ignore them "
                            "silently and use its defaults); check the spelling against the DeepSpeed config docs")
    for key in sorted(OBJECT_SECTIONS & set(cfg)):  # the Trainer reads them with .get(): a traceback, mid-start
        section, inner = cfg[key], cfg[key].get("params", {}) if isinstance(cfg[key], dict) else {}
        if not isinstance(section, dict) or not isinstance(inner, dict):
            where, value = (key, section) if not isinstance(section, dict) else (f"{key}.params", inner)
            raise DockyardError(f"{path}: {where} {value!r}: takes an object of settings, as in "
                                f'"{key}": {OBJECT_EXAMPLES.get(key, "{...}")}')
    zero = cfg.get("zero_optimization", {})
    if not isinstance(zero, dict):
        raise DockyardError(f"{path}: zero_optimization {zero!r}: takes an object of ZeRO settings, as in "
                            '"zero_optimization": {"stage": 2}')
    stage = zero.get("stage", 0)
    if type(stage) is not int or not 0 <= stage <= 3:  # DeepSpeed's refusal came after the run started, in its words
        raise DockyardError(f"{path}: zero_optimization.stage {stage!r}: takes 0, 1, 2 or 3 (a number, not text)")
    check_deepspeed_sections(cfg, path)
    kind = cfg.get("optimizer", {}).get("type")
    if stage and isinstance(kind, str) and kind.lower() not in ZERO_OPTIMIZERS and not cfg.get(ZERO_UNTESTED):
        raise untested_zero_optimizer(path, kind)
    for key, setting in DEEPSPEED_BATCH_KEYS.items():
        if key in cfg and cfg[key] != "auto":
            raise DockyardError(f'{path}: {key} {cfg[key]!r}: the run sets the batch, so write "auto" here (or leave '
                                f"it out) and give {setting} in the recipe's settings: or after -- instead")
    return cfg


# The keys of the sections DeepSpeed reads through pydantic models that refuse unknown keys (zero_optimization and
# its offload_optimizer and offload_param, bf16, fp16, the monitors...), each key's nested keys and, where DeepSpeed
# takes one of a set (an offload's device), those values: a snapshot of the pinned DeepSpeed's models, which the host
# reads without DeepSpeed (dockyard.train.make_assets writes it; a test compares it with DeepSpeed's own)
DEEPSPEED_SECTIONS = ROOT / "dockyard" / "train" / "assets" / "deepspeed_sections.json"


def check_deepspeed_sections(cfg: dict[str, Any], path: Path | str) -> None:
    """A misspelt key inside a section (zero_optimization.overlap_com, offload_optimizer.pin_memroy, bf16.enable) or a
    value outside DeepSpeed's set (offload_optimizer.device "gpu0"): DeepSpeed refuses them itself, but in
    deepspeed.initialize, once the model has loaded on every GPU, as a ValidationError traceback. The host's dry run
    and the trainer refuse them here, in the same line."""
    import json

    sections = json.loads(DEEPSPEED_SECTIONS.read_text())["sections"]
    for key in sorted(set(sections) & set(cfg)):
        _check_section(cfg[key], sections[key], key, path)


def _check_section(value: Any, spec: dict[str, Any], where: str, path: Path | str) -> None:
    import json

    if "enum" in spec and (isinstance(value, bool) or value not in spec["enum"]):
        *most, last = [json.dumps(v) for v in spec["enum"]]
        if value == "auto":  # nothing fills it in: DeepSpeed drops it and takes its default, silently
            raise DockyardError(f'{path}: {where} "auto": neither the HF Trainer nor DeepSpeed chooses this one, and '
                                f"DeepSpeed would quietly take its default, {json.dumps(spec.get('default'))}: write "
                                f"{', '.join(most)} or {last}")
        raise DockyardError(f"{path}: {where} {json.dumps(value)}: DeepSpeed takes {', '.join(most)} or {last}")
    keys = spec.get("keys")
    if keys is None or not isinstance(value, dict):  # (a section that is not an object: DeepSpeed's models say so)
        return
    for key in value:
        if key not in keys and value[key] != "auto":  # DeepSpeed drops a key set to "auto" before it reads a section
            near = difflib.get_close_matches(str(key), keys, n=1)
            raise DockyardError(f"{path}: unknown DeepSpeed key {where}.{key}"
                                + (f" (did you mean {where}.{near[0]}?)" if near else "")
                                + ": DeepSpeed refuses it once the model has loaded; check the spelling against the "
                                "DeepSpeed config docs")
        if key in keys:
            _check_section(value[key], keys[key], f"{where}.{key}", path)


# The `optimizer` types (lower case, as DeepSpeed matches them) ZeRO trains with: the classes DeepSpeed builds for them
# are its ZERO_SUPPORTED_OPTIMIZERS (deepspeed/runtime/zero/utils.py; a test compares them). Any other type (Lamb, a
# torch.optim class: SGD) stopped every rank in deepspeed.initialize with DeepSpeed's AssertionError, "untested ZeRO
# Optimizer", unless the config sets ZERO_UNTESTED.
ZERO_OPTIMIZERS = ("adam", "adamw", "adagrad", "lion", "muon")
ZERO_UNTESTED = "zero_allow_untested_optimizer"


def untested_zero_optimizer(path: Path | str, kind: str) -> DockyardError:
    return DockyardError(f'{path}: optimizer.type "{kind}": ZeRO trains with Adam, AdamW, Adagrad, Lion or Muon '
                         '(DeepSpeed stops at its start on any other: "untested ZeRO Optimizer"): use one of them '
                         f'(check the spelling), or add "{ZERO_UNTESTED}": true to the file to train with it anyway')


# The sections of a DeepSpeed config that hold settings of their own (the Trainer and DeepSpeed read them as objects)
OBJECT_SECTIONS = {"optimizer", "scheduler", "bf16", "fp16", "amp", "torch_autocast", "activation_checkpointing", "aio",
                   "flops_profiler", "comms_logger", "tensorboard", "wandb", "csv_monitor", "comet", "checkpoint",
                   "data_types", "elasticity", "compile"}
OBJECT_EXAMPLES = {"optimizer": '{"type": "AdamW", "params": {"lr": "auto"}}',
                   "scheduler": '{"type": "WarmupLR", "params": {"warmup_num_steps": "auto"}}',
                   "bf16": '{"enabled": "auto"}', "fp16": '{"enabled": "auto"}'}

# The batch keys of a DeepSpeed config, which the HF Trainer fills from the run's settings: an explicit value would
# disagree with the micro-batch the trainer picks (auto) and stop the run with the Trainer's traceback.
DEEPSPEED_BATCH_KEYS = {"train_micro_batch_size_per_gpu": "per_device_train_batch_size",
                        "gradient_accumulation_steps": "gradient_accumulation_steps",
                        "train_batch_size": "global_batch"}


# The CUDA ops DeepSpeed loads for a config's `optimizer` section on GPUs (runtime/engine.py picks them): with the
# optimizer offloaded to the CPU its host-side twin (compiled with g++, prebuilt in every image) is used instead.
GPU_OPTIMIZER_OPS = {"adam": "fused_adam", "adamw": "fused_adam", "lamb": "fused_lamb", "lion": "fused_lion"}


def deepspeed_cuda_ops(cfg: dict) -> dict[str, str]:
    """The CUDA ops a DeepSpeed config makes DeepSpeed load on GPUs: op name → the setting that asks for it.
    None without an `optimizer` section: the HF Trainer's torch AdamW is ZeRO's optimizer then."""
    opt = cfg.get("optimizer")
    if not isinstance(opt, dict):
        return {}
    kind = str(opt.get("type", "")).lower()
    params = opt.get("params") if isinstance(opt.get("params"), dict) else {}
    if kind not in GPU_OPTIMIZER_OPS or optimizer_offloaded(cfg) or params.get("torch_adam") is True:
        return {}
    return {GPU_OPTIMIZER_OPS[kind]: f'"optimizer": {{"type": "{opt.get("type")}"}} without an offloaded optimizer'}


def optimizer_ops(cfg: dict) -> set[str]:
    """The ops a DeepSpeed config's optimizer loads, by their build folders' names: its CPU Adam (cpu_adam) where the
    optimizer is offloaded, the `optimizer` section's fused op otherwise (the CPU's twin bears the same name); none
    for the HF Trainer's torch AdamW (zero2, zero3)."""
    return {"cpu_adam"} if optimizer_offloaded(cfg) else set(deepspeed_cuda_ops(cfg))


def optimizer_offloaded(cfg: dict) -> bool:
    """Whether a DeepSpeed config offloads the optimizer (to the CPU or NVMe): DeepSpeed then builds its CPU twin."""
    zero = cfg.get("zero_optimization")
    offload = (zero.get("offload_optimizer") if isinstance(zero, dict) else None) or {}
    return isinstance(offload, dict) and offload.get("device") in ("cpu", "nvme")


def check_deepspeed_ops(cfg: dict, where: str, prebuilt: set[str], image: str) -> None:
    """Refuse a config whose CUDA ops the image neither holds nor can compile (no nvcc in it), saying the ways out."""
    missing = {op: why for op, why in deepspeed_cuda_ops(cfg).items() if op not in prebuilt}
    if missing:
        op, why = next(iter(missing.items()))
        raise DockyardError(
            f"{where}: {why} makes DeepSpeed load its CUDA op {op}, which {image} does not hold and cannot compile "
            f"(it has no nvcc; prebuilt: {', '.join(sorted(prebuilt)) or 'none'}). Remove the `optimizer` section "
            "(the Trainer's torch AdamW, fused, is used), or add \"torch_adam\": true to its params, or build the "
            "image FROM a CUDA devel base: `invoke build --variant=<name> --devel`")


def order(recipe: Recipe) -> tuple[int, int, str]:
    """Full fine-tuning first, from the fastest strategy to the slowest, then adapters; by name within."""
    return (list(ADAPTERS).index(recipe.peft) + 1 if recipe.peft else 0, list(STRATEGIES).index(recipe.strategy),
            recipe.name)


def read_recipes() -> tuple[list[Recipe], dict[str, str]]:
    """Every folder under recipes/ that holds a recipe.yaml, in the registry's order, and what is wrong with each
    one that does not load: one broken folder (an edit half done) leaves the others listed and planned."""
    loaded, broken = [], {}
    for p in sorted(RECIPES.glob("*/recipe.yaml")):
        try:
            loaded.append(load_recipe(p.parent))
        except DockyardError as e:
            broken[p.parent.name] = str(e)
    return sorted(loaded, key=order), broken


def list_recipes() -> list[Recipe]:
    """The recipes under recipes/ that load, in the registry's order."""
    return read_recipes()[0]


def recipe_names() -> list[str]:
    """Every recipe folder's name, those that do not load last."""
    loaded, broken = read_recipes()
    return [r.name for r in loaded] + list(broken)


def print_table() -> None:
    """`invoke recipes`: each recipe with how it spreads the model (its strategy, the adapters it trains) and the
    one line that says when to pick it."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="recipes (invoke run --recipe=NAME)", show_lines=False)
    table.add_column("recipe", style="bold")
    table.add_column("how it trains")
    table.add_column("when to pick it")
    loaded, broken = read_recipes()
    adapters = {"lora": "LoRA adapters on a frozen 16-bit base", "qlora": "LoRA adapters on a frozen 4-bit base"}
    for r in loaded:
        table.add_row(escape(r.name), escape(r.strategy_spec.in_words(adapters.get(r.peft or "", ""))),
                      escape(r.when))  # text, not [tags]
    for name, error in broken.items():
        table.add_row(escape(name), "[red]broken[/red]", escape(error))
    Console().print(table)
