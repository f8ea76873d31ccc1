"""A model's sizes from its config.json alone, without torch: what `invoke plan --model=FOLDER` counts.

The common decoder families (Llama, Mistral, Qwen2/3, Gemma 1/2, Phi-3) are counted exactly, the way
their transformers classes build them (tests compare with a model built on the meta device). Another
model_type is counted as a Llama-style decoder, said so in the result. Standard library only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dockyard.common import runfolder
from dockyard.common.data_files import HUB_ID
from dockyard.common.errors import DockyardError, json_object, loads

# model_type → how its decoder layer differs from Llama's:
#   qkv_bias: q/k/v projections always have a bias (Qwen2); "flag": when `attention_bias` says so (Llama:
#   o_proj too); norms: hidden-sized norms per layer; qk_norm: per-head norms on q and k (Qwen3);
#   fused: q/k/v in one projection and gate/up in another (Phi-3); tied: tie_word_embeddings' default.
FAMILIES = {
    "llama": {"qkv_bias": "flag", "norms": 2, "tied": False},
    "mistral": {"qkv_bias": None, "norms": 2, "tied": False},
    "qwen2": {"qkv_bias": "always", "norms": 2, "tied": False},
    "qwen3": {"qkv_bias": "flag", "norms": 2, "qk_norm": True, "tied": False},
    "gemma": {"qkv_bias": "flag", "norms": 2, "tied": True},
    "gemma2": {"qkv_bias": "flag", "norms": 4, "tied": True},
    "phi3": {"qkv_bias": None, "norms": 2, "fused": True, "tied": False},
}
REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
# a mixture of experts' count of experts per layer (Mixtral, Qwen-MoE/OLMoE, DeepSeek): counted as one dense MLP,
# its parameters came out several times too few
EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts")
MAX_PARAMS = 10**14  # 100T: far past any model trained on one cluster; larger is a typo or a crafted file
# num_hidden_layers, decoder_layers, n_layer, num_layers, ...; ALBERT's num_hidden_groups and inner_group_num
LAYER_KEY = re.compile(r"(^|_)(layers?|groups?|group_num)$")
MAX_LAYERS = 4096    # decoder layers: 30 times the deepest public model's; the trainer builds every one (on the meta
                     # device) before it counts them, which for 5e7 layers of nothing took hours and a terabyte


INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")  # a sharded model's weight_map


ADAPTER = "adapter_config.json"  # what peft saves beside a LoRA/QLoRA adapter's weights


def check_model_folder(folder: Path, named: str) -> None:
    """`folder` (given as `named`) is a model folder from_pretrained can take as a base to train: its config.json, no
    LoRA adapter instead of or beside it, every weights file its index names inside it."""
    has_adapter = (folder / ADAPTER).is_file()
    if not (folder / "config.json").is_file():
        if has_adapter:
            raise DockyardError(f"{named}: a LoRA adapter ({ADAPTER}), not a model: pass the base it was trained "
                                "on, or merge the two into one model folder first (invoke export --run=ID --merge)")
        raise DockyardError(f"{named}: not a model folder (no config.json in it): give the folder `from_pretrained` "
                            "reads (config.json, weights, tokenizer)")
    if has_adapter:  # transformers loads it onto the model and freezes the rest: a full fine-tune would train nothing
        raise DockyardError(f"{named}: holds a LoRA adapter ({ADAPTER}) beside the model, which transformers would "
                            "load on top of it: merge them into one model folder first (invoke export --run=ID "
                            f"--merge), or move {ADAPTER} out to train the base alone")
    check_shards_inside(folder)


def check_shards_inside(folder: Path) -> None:
    """Every weights file a sharded model's index names is a file of the folder: transformers joins each name onto
    the folder unchecked, so an index naming ../../other-run/model.safetensors loaded weights from outside it (in a
    container, another run's), and one naming a system file opened that."""
    for name in INDEXES:
        if not (folder / name).is_file():
            continue
        index = json_object(folder / name, "a sharded model's index")
        shards = index.get("weight_map")
        if not isinstance(shards, dict):
            raise DockyardError(f"{folder / name}: no `weight_map` of tensor names to weights files: copy the model "
                                "folder again")
        for shard in set(map(str, shards.values())):
            if shard in ("", ".", "..") or "/" in shard or "\\" in shard:
                raise DockyardError(f"{folder / name} names the weights file {shard!r}, which is not a file of the "
                                    "folder: an index names the files beside it (copy the model folder again)")


def layer_counts(cfg: Any, depth: int = 0) -> list[tuple[str, int]]:
    """Every count of layers config.json gives, by key (num_hidden_layers, decoder_layers, n_layer, ...; under
    text_config and the like too): transformers builds each layer any of them asks for, one by one."""
    if not isinstance(cfg, dict) or depth > 3:
        return []
    found = [(k, v) for k, v in cfg.items() if isinstance(k, str) and LAYER_KEY.search(k) and isinstance(v, int)
             and not isinstance(v, bool)]
    return found + [x for v in cfg.values() for x in layer_counts(v, depth + 1)]


def check_sizes(path: Path, layers: int | dict, params: int = 0) -> None:
    """Sizes no model has, from a typo or a crafted file: refused before anything is built or planned from them
    (config.json's count here, the trainer's model on the meta device: dockyard.train.model). `layers`: the count of
    num_hidden_layers, or config.json's settings whole (each of its layer counts)."""
    counts = layer_counts(layers) if isinstance(layers, dict) else [("num_hidden_layers", layers)]
    if over := next(((k, n) for k, n in counts if n > MAX_LAYERS), None):
        raise DockyardError(f"{path}: `{over[0]}` is {over[1]}, more than {MAX_LAYERS}: not a model's config.json")
    if params > MAX_PARAMS:
        raise DockyardError(f"{path}: its sizes make {params:.3g} parameters, more than {MAX_PARAMS / 1e12:.0f}T: "
                            "not a model's config.json (check hidden_size, num_hidden_layers, vocab_size)")


def check_pad_token(path: Path, pad: Any, vocab: int) -> None:
    """The embedding's padding row (`pad_token_id`) is one of its rows: torch asserts it when building the model,
    which was a traceback on every rank (negative counts from the end, as torch reads it)."""
    if isinstance(pad, int) and not isinstance(pad, bool) and not -vocab <= pad < vocab:
        raise DockyardError(f"{path}: `pad_token_id` {pad} is no row of the {vocab} embeddings (`vocab_size`): give "
                            f"the model's own config.json, or a pad_token_id from 0 to {vocab - 1}")


def count(folder: Path, lora_rank: int) -> dict:
    """Parameter counts and widths of the model in `folder` (the fields of machine.plan.Shape)."""
    path = folder / "config.json"
    if not path.is_file():
        if (folder / ADAPTER).is_file():
            check_model_folder(folder, str(folder))  # says what an adapter is and what to pass instead
        raise DockyardError(f"{folder} has no config.json: pass a model folder or a count like --model=8B")
    return count_settings(json_object(path, "model settings"), path, lora_rank)


def count_settings(cfg: dict, path: Path, lora_rank: int) -> dict:
    """count() of config.json's settings `cfg` (read from `path`, which messages name): memory.PUBLISHED's models
    are counted by it from their published settings too."""
    kind = cfg.get("model_type") or ""
    if not isinstance(kind, str):
        raise DockyardError(f"{path}: model_type {kind!r}: takes the model's type as text (\"llama\", \"qwen2\")")
    family = FAMILIES.get(kind, FAMILIES["llama"])
    by_count = "give the model's parameter count instead, as in --model=47B (counted as a dense Llama-style model)"
    experts = [cfg[k] for k in EXPERTS if isinstance(cfg.get(k), int) and not isinstance(cfg[k], bool) and cfg[k] > 1]
    if experts:
        raise DockyardError(f"{path}: model_type {kind or '(none)'!r} is a mixture of {experts[0]} experts per layer, "
                            f"which plan does not count from its config.json: {by_count}")
    if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), dict):
        raise DockyardError(f"{path}: model_type {kind or '(none)'!r} is a model of several parts (its language "
                            f"model's settings are under text_config), which plan does not count: {by_count}")

    def size(key: str, default: int | None = None) -> int:
        value = cfg.get(key)
        value = default if value is None else value
        if value is None:
            raise DockyardError(f"{path}: `{key}` is missing; plan needs {', '.join(REQUIRED)}")
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise DockyardError(f"{path}: `{key}` is {value!r}: expected a positive whole number")
        return value

    h, layers, heads, vocab = (size(k) for k in REQUIRED)
    check_sizes(path, layers)
    check_pad_token(path, cfg.get("pad_token_id"), vocab)
    if "intermediate_size" in cfg and cfg["intermediate_size"] is None:  # transformers takes null as given
        raise DockyardError(f"{path}: `intermediate_size` is null: expected a positive whole number")
    inter = size("intermediate_size", 4 * h)
    kv_heads = size("num_key_value_heads", heads)
    if cfg.get("head_dim") is None and h % heads:  # transformers' own check, where the head width comes from h
        raise DockyardError(f"{path}: `hidden_size` {h} is not a multiple of `num_attention_heads` {heads}: not a "
                            "model transformers can build")
    head_dim = size("head_dim", h // heads)
    if heads % kv_heads:  # grouped-query attention: each key/value head serves a whole group of query heads
        raise DockyardError(f"{path}: `num_key_value_heads` {kv_heads} does not divide `num_attention_heads` "
                            f"{heads}: not a model transformers can build")
    q, kv = heads * head_dim, kv_heads * head_dim
    for flag in ("attention_bias", "mlp_bias"):  # "false" is text, which counting by truth took for true
        if not isinstance(cfg.get(flag, False), bool):
            raise DockyardError(f"{path}: {flag} {cfg[flag]!r}: takes true or false (no quotes)")
    bias_flag = cfg.get("attention_bias", False)
    mlp_bias = cfg.get("mlp_bias", False) and (kind == "llama" or kind not in FAMILIES)  # Llama's own

    qkv_bias = family["qkv_bias"] == "always" or (family["qkv_bias"] == "flag" and bias_flag)
    o_bias = family["qkv_bias"] == "flag" and bias_flag
    if family.get("fused"):  # (in, out, has a bias) of every linear layer in one decoder layer
        linears = [(h, q + 2 * kv, False), (q, h, False), (h, 2 * inter, False), (inter, h, False)]
    else:
        linears = [(h, q, qkv_bias), (h, kv, qkv_bias), (h, kv, qkv_bias), (q, h, o_bias),
                   (h, inter, mlp_bias), (h, inter, mlp_bias), (inter, h, mlp_bias)]
    own = [a * b + (b if bias else 0) for a, b, bias in linears]  # each module's own parameters
    norms = family["norms"] * h + (2 * head_dim if family.get("qk_norm") else 0)
    linear = sum(a * b for a, b, _ in linears)
    tied = cfg.get("tie_word_embeddings")
    if tied is None:  # left out, or null: the family's default (transformers' PretrainedConfig reads null so too)
        tied = family["tied"]
    elif not isinstance(tied, bool):  # "false" is text, which counting by truth took for tied
        raise DockyardError(f"{path}: tie_word_embeddings {tied!r}: takes true or false (no quotes)")
    embeddings = vocab * h * (1 if tied else 2)
    params = layers * (sum(own) + norms) + h + embeddings  # h: the final norm
    check_sizes(path, layers, params)
    source = f"{path}" if kind in FAMILIES else \
        f"{path}; model_type {kind or '(none)'!r} counted as a Llama-style decoder (approximate)"
    return {"params": params, "largest_layer": max(vocab * h, *own), "hidden": h, "layers": layers, "vocab": vocab,
            "intermediate": inter, "kv_hidden": kv, "q_hidden": q, "linear_params": layers * linear,
            "lora_params": layers * lora_rank * sum(a + b for a, b, _ in linears), "source": source,
            "model_type": kind, "tied": tied, "context": context(cfg.get)}


# where config.json says how many positions the model was made for (Llama and most: the first; GPT-2: the others)
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "n_ctx")


def context(setting: Callable[[str], Any]) -> int:
    """The positions a model was made for, `setting` reading its config (config.json's dict on the host, the
    transformers config in the trainer); 0 where none says."""
    return next((v for k in CONTEXT_KEYS if type(v := setting(k)) is int and v > 0), 0)


def cached_snapshot(hub_home: Path, repo_id: str) -> Path | None:
    """The folder of a hub model's cached snapshot (the one refs/main names, else the newest with a config.json),
    or None when `repo_id` is no org/name in the cache."""
    if not HUB_ID.fullmatch(repo_id):
        return None
    repo = hub_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    ref = repo / "refs" / "main"
    try:  # a damaged cache (not UTF-8, unreadable) falls back to the snapshots themselves
        commit = ref.read_text().strip() if ref.is_file() else ""
    except (OSError, UnicodeDecodeError):
        commit = ""
    # a revision names one folder (a commit's 40 hex characters): a longer one ("File name too long"), a path, or
    # . and .. is a damaged ref
    named = (repo / "snapshots" / commit if re.fullmatch(r"[\w.-]{1,128}", commit, re.ASCII) and commit not in (".", "..")
             else None)
    if named is not None and (named / "config.json").is_file():
        return named
    found = [d for d in (repo / "snapshots").glob("*") if (d / "config.json").is_file()]
    return max(found, key=lambda d: d.stat().st_mtime, default=None)


def rename_base(folder: Path, as_named: Callable[[str], str]) -> str | None:
    """The base an adapter folder names (adapter_config.json's base_model_name_or_path, where peft's AutoPeftModel
    looks for it), renamed `as_named(base)` there and in peft's model card (README.md); None where the folder holds
    no adapter config naming one. Read and written through no link (a run folder is the containers')."""
    try:
        config = loads(runfolder.read(folder, ADAPTER, 1 << 20) or b"null")
    except (ValueError, DockyardError):
        return None
    base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    if not isinstance(base, str):
        return None
    named = as_named(base)
    if named != base:
        runfolder.write(folder, ADAPTER, json.dumps({**config, "base_model_name_or_path": named}, indent=2) + "\n")
        try:  # peft's model card names the base too; a card past 1 MiB is none of peft's, and left as it is
            card = runfolder.read_text(folder, "README.md", 1 << 20)
        except DockyardError:
            card = None
        if card:
            runfolder.write(folder, "README.md", card.replace(base, named))
    return named
