"""The model: which weights, in which dtype, where, quantized or not, with or without LoRA."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import reprlib
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from huggingface_hub.errors import StrictDataclassError

from dockyard.common import memory, model_config, runfolder
from dockyard.common import precision as common_precision
from dockyard.common.errors import DockyardError, first_line, json_object
from dockyard.common.model_config import check_model_folder, check_pad_token, check_shards_inside, check_sizes
from dockyard.common.recipes import Recipe
from dockyard.common.run_settings import TINY_MODEL, RunSettings
from dockyard.train import guards, precision
from dockyard.train.limits import TooSlow, time_limit

log = logging.getLogger("dockyard.train")

# What transformers raises for a config.json it cannot make a model of: huggingface_hub's strict dataclasses (a
# vocab_size given as text, heads that do not divide the width) raise an error that is none of Python's own.
CONFIG_ERRORS = (ValueError, TypeError, AttributeError, KeyError, RuntimeError, ArithmeticError,
                 StrictDataclassError, AssertionError)  # torch's asserts: a pad_token_id past the embedding's rows

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def weights_dtype(settings: RunSettings, recipe: Recipe, half: str = "") -> torch.dtype:
    """The dtype the weights load in (resolved_dtype says why). `half`: the run's mixed precision ("bf16", "fp16"
    or ""), which only a full fine-tune's auto reads."""
    return DTYPES[resolved_dtype(settings, recipe, half)[0]]


def resolved_dtype(settings: RunSettings, recipe: Recipe, half: str) -> tuple[str, str]:
    """(dtype, why). auto: a LoRA base is frozen, so 16-bit weights lose nothing (bf16, or fp16 on GPUs without bf16);
    a full fine-tune keeps fp32 weights and trains in mixed precision where the GPU has it, except under an engine
    that casts the weights to the 16-bit type itself before it makes the optimizer's fp32 copy (ZeRO-1/2): loaded in
    that type, they train bit for bit the same, and each process holds half the bytes while loading."""
    if settings.dtype != "auto":
        return settings.dtype, "given"
    if recipe.peft:
        fp16 = common_precision.half_dtype(precision.capability()) == "fp16"
        return ("float16" if fp16 else "bfloat16"), (f"{recipe.peft}: the base is frozen, so 16 bits lose nothing"
                                                     + (" (float16: this GPU has no fast bfloat16)" if fp16 else ""))
    if half and recipe.strategy_spec.casts_weights_to_half:
        return ({"bf16": "bfloat16", "fp16": "float16"}[half],
                f"{recipe.strategy}: DeepSpeed casts the weights to {half} for {half} mixed precision and makes its "
                "float32 optimizer copy from those, so loading them in float32 would only double the host memory "
                "each process takes while loading")
    return "float32", "full fine-tuning: the optimizer updates float32 weights" + (
        f" ({half} mixed precision computes in 16 bits)" if half else "")


def materialize_tiny_model(folder: Path) -> None:
    """The default model: Llama-shaped, tiny, made from the config shipped in the package, with a seeded
    initialisation, written once as a normal checkpoint so every rank and every later reload (LoRA's base
    included) reads the same weights. Every width is a multiple of 32: bitsandbytes' 4-bit CPU kernels
    (used for inference on CPUs with AVX512-BF16) refuse other widths.

    Called by every rank before torch.distributed exists (under ZeRO-3 building a model is itself a
    collective): each writes a private copy and renames it into place; the first rename wins, and the
    copies are identical anyway."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if (folder / "config.json").is_file():
        return
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY_MODEL))
    # A unique folder, not one named by the pid: on a run folder shared by several nodes, ranks of different
    # containers have the same pids.
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
    tmp.chmod(0o755)  # mkdtemp's 0700 would hide the model from other users of the run folder
    import transformers

    # a kilobyte model: its "Writing model shards" bar was the console's first line, before the run had said anything
    shown = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()
    try:
        model.save_pretrained(tmp)
    finally:
        if shown:
            transformers.utils.logging.enable_progress_bar()
    AutoTokenizer.from_pretrained(TINY_MODEL).save_pretrained(tmp)
    runfolder.share_weights(tmp)
    try:
        tmp.rename(folder)
    except OSError:  # another rank was first
        shutil.rmtree(tmp)


def resolve_model(name: str) -> str:
    """A model folder, or a hub id found in the Hugging Face cache (HF_HOME; the image runs offline)."""
    if Path(name).is_dir():
        return name
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(name)
    except Exception as e:  # noqa: BLE001 - every failure here means the same thing to the user
        raise DockyardError(f"model {name!r} is neither a folder nor in the Hugging Face cache "
                            f"({os.environ.get('HF_HOME', '~/.cache/huggingface')}): {type(e).__name__}. Give "
                            f"a folder holding config.json and the weights, or download the model into the cache "
                            f"first") from None


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")  # the usual


def error_words(e: BaseException) -> str:
    """A library's error as one line: its first, but huggingface_hub's whole (it says the field on its first line and
    what is wrong with it on the next)."""
    return (" ".join(str(e).split()) if isinstance(e, StrictDataclassError) else first_line(e))[:300]


def bad_config(folder: Path, e: BaseException) -> DockyardError:
    return DockyardError(f"{folder / 'config.json'}: transformers cannot build a model from it ({type(e).__name__}: "
                         f"{error_words(e)}): fix that setting, or copy the model folder again")


def load_tokenizer(model_dir: str) -> Any:
    """The model folder's tokenizer: a weights-only export has none, which transformers says in a traceback."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - a folder's files raise anything: KeyError for a tokenizer.json of other
        # keys, huggingface_hub's validation error for a config of heads that do not divide its width, ...
        if asks_for_code(e):
            raise runs_code(model_dir) from None
        if isinstance(e, (StrictDataclassError, ArithmeticError)):  # from config.json (heads 0), not the tokenizer
            raise bad_config(Path(model_dir), e) from None
        if not any((Path(model_dir) / name).is_file() for name in TOKENIZER_FILES):
            why = f"it holds no tokenizer: none of {', '.join(TOKENIZER_FILES)}"
        else:
            why = f"{type(e).__name__}: {first_line(e, 200)}"
        raise DockyardError(f"{model_dir}: cannot load its tokenizer ({why}); copy the tokenizer's files (and "
                            "tokenizer_config.json) of the model it came from into the folder") from None
    if tok.pad_token_id is None:  # Llama-family tokenizers ship without one; padding is masked out anyway
        if tok.eos_token is None:
            raise DockyardError(f"{model_dir}: its tokenizer has neither a padding nor an end-of-sequence token, and "
                                "batches need one to pad with: add \"eos_token\" (or \"pad_token\") to its "
                                "tokenizer_config.json")
        tok.pad_token = tok.eos_token
    # "Token indices sequence length is longer than the specified maximum ... will result in indexing errors": said
    # of a long document before dockyard cuts it at max_seq_length (and the model's positions are checked apart)
    tok.deprecation_warnings["sequence-length-is-longer-than-the-specified-maximum"] = True
    return tok


def asks_for_code(e: BaseException) -> bool:
    """transformers' refusal of a folder whose config or tokenizer needs its own Python code (auto_map)."""
    return "trust_remote_code" in str(e)


def runs_code(model_dir: str | Path) -> DockyardError:
    """A model folder that would run code of its own: never done (with trust_remote_code unset, transformers asked
    on the terminal, and one "y" ran the folder's .py files)."""
    return DockyardError(f"{model_dir}: its config.json or tokenizer_config.json needs Python code from the folder "
                         "(auto_map, for a model_type transformers does not know), and dockyard never runs a model "
                         "folder's code: use a model of an architecture transformers supports")


def _auto_class(task: str):
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    return AutoModelForSequenceClassification if task == "seq_cls" else AutoModelForCausalLM


def quantization_config(dtype: torch.dtype) -> Any:
    """4-bit NF4 for QLoRA. The packed weights are stored in the model's dtype (not uint8) so that ZeRO-3
    and FSDP can flatten them together with everything else ("Must flatten tensors with uniform dtype")."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=dtype, bnb_4bit_quant_storage=dtype)


def load_model(model_dir: str, recipe: Recipe, settings: RunSettings, tokenizer: Any, labels: list[str],
               local_rank: int, half: str = "") -> Any:
    """The base model as the recipe needs it (dtype, placement, 4-bit for QLoRA); adapters come after. `half`: the
    run's mixed precision (weights_dtype)."""
    guards.reject_prequantized(model_dir, recipe.strategy)
    check_shards_inside(Path(model_dir))
    dtype = weights_dtype(settings, recipe, half)
    kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": False,
                              "device_map": guards.device_map(recipe.strategy, local_rank, torch.cuda.is_available())}
    if recipe.peft == "qlora":
        kwargs["quantization_config"] = quantization_config(dtype)
    if settings.task == "seq_cls":
        kwargs.update(num_labels=len(labels), id2label=dict(enumerate(labels)),
                      label2id={name: i for i, name in enumerate(labels)}, pad_token_id=tokenizer.pad_token_id)
    from safetensors import SafetensorError

    try:
        with load_report() as report:
            model, loading = _auto_class(settings.task).from_pretrained(model_dir, output_loading_info=True, **kwargs)
            if only_a_new_head(loading, settings.task):
                report.clear()
                log.info("task seq_cls: the classification head (%s) is new, %d labels, trained from random values%s",
                         ", ".join(new_head(loading)), len(labels),
                         "; the base's language-model head is left out" if loading.get("unexpected_keys") else "")
    except (OSError, ValueError) as e:
        if asks_for_code(e):
            raise runs_code(model_dir) from None
        raise DockyardError(f"cannot load the model from {model_dir}: {e}") from None
    except SafetensorError as e:  # an empty or cut-short weights file: a copy or download that did not finish
        raise DockyardError(f"{model_dir}: a weights file is damaged ({e}): copy or download the model folder "
                            "again") from None
    except ImportError as e:  # a package the folder's config.json asks for and the image has not
        raise missing_package(Path(model_dir), e) from None
    except RuntimeError as e:  # transformers' "size mismatch ... ignore_mismatched_sizes": another model's config
        if "mismatch" not in str(e):
            raise
        heads = mismatched(report)
        if settings.task == "seq_cls" and heads and all(k.startswith(CLASSIFIER_HEADS) for k in heads):
            raise other_classes(Path(model_dir), labels) from None
        raise DockyardError(f"{model_dir}: its weights do not have the shapes its config.json gives "
                            f"({first_line(e, 200)}): config.json belongs to another model; copy or download the "
                            "model folder again, whole") from None
    check_weights_loaded(model_dir, loading, settings.task, len(model.state_dict()),
                         getattr(getattr(model, "config", None), "architectures", None))
    return model


TORCH_ATTENTION = ("sdpa", "eager", "flex_attention")


def missing_package(folder: Path, e: ImportError) -> DockyardError:
    """What the folder's config.json asks for that the image cannot give: a quantization method's package (GPTQ's
    optimum), an attention implementation's (flash-attn). The quantization advice went to both."""
    config = _config(folder)
    said = f"cannot load the model from {folder}: {first_line(e, 200).rstrip('.')}"
    if config.get("quantization_config"):
        return DockyardError(f"{said}: this image trains unquantized checkpoints (qlora quantizes one in 4 bits "
                             "itself); use the model's unquantized weights")
    key = next((k for k in ("_attn_implementation", "attn_implementation")
                if config.get(k) and config[k] not in TORCH_ATTENTION), "")  # torch's own need no package
    if key:
        return DockyardError(f"{said}: {folder / 'config.json'} asks for the attention implementation "
                             f"{config[key]!r} (\"{key}\"), which is not available here; set it to \"sdpa\" (PyTorch's "
                             "own) or remove the key")
    return DockyardError(f"{said}: the model needs a package this environment lacks")


def _config(folder: Path) -> dict[str, Any]:
    """The folder's config.json as a mapping, or {} where it cannot be read (the error at hand is said anyway)."""
    try:
        return json_object(folder / "config.json", "model settings")
    except (DockyardError, OSError):
        return {}


def mismatched(report: list[logging.LogRecord]) -> list[str]:
    """The tensors transformers' held LOAD REPORT calls MISMATCH (its error names none: it points to the table)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(r.getMessage() for r in report))
    return re.findall(r"^\s*(\S+)\s*\|\s*MISMATCH\b", text, re.MULTILINE)


def other_classes(folder: Path, labels: list[str]) -> DockyardError:
    """A classifier's own folder given as the base for data of another number of classes: its head has a row per
    class of its own. Not loaded with transformers' ignore_mismatched_sizes, which would start the head over from
    random values without a word, the classes it learnt gone."""
    config = _config(folder)
    names = config.get("id2label")
    count = len(names) if isinstance(names, dict) and names else config.get("num_labels", "another number of")
    return DockyardError(f"{folder} is a classifier of {count} classes, and the data has {len(labels)} classes "
                         f"({', '.join(labels[:5])}{', ...' if len(labels) > 5 else ''}): its classification head "
                         f"cannot take them. Train from a base model without a classification head (the one it was "
                         f"trained from), or give data of its {count} classes")


def check_examples_fit(model: Any, examples: list[dict[str, Any]], model_dir: str, pad_id: int | None = None) -> None:
    """Every token id, the padding's (`pad_id`) too, has a row in the model's embedding, and no example is longer
    than a model of learned positions (GPT-2's 1024, OPT's 2048) has positions: either ended in torch's "IndexError:
    index out of range in self" on every rank at the first step (on a GPU, a device-side assert)."""
    rows = getattr(model.get_input_embeddings(), "num_embeddings", None)
    top = max((max(ex["input_ids"]) for ex in examples if ex["input_ids"]), default=-1)
    if rows and top >= rows:
        raise DockyardError(f"{model_dir}: the tokenizer gives token id {top}, past the model's {rows} embeddings: "
                            "its tokenizer files belong to another model (or add tokens the model was not resized "
                            "for); put the model's own tokenizer files in the folder")
    if rows and pad_id is not None and pad_id >= rows:  # a pad token added to the tokenizer alone, or its class's
        raise DockyardError(f"{model_dir}: the tokenizer pads with token id {pad_id}, past the model's {rows} "
                            "embeddings (a pad_token the model was not resized for): set \"pad_token\" in its "
                            "tokenizer_config.json to a token the model has, e.g. its eos_token")
    positions = learned_positions(model)
    longest = max((len(ex["input_ids"]) for ex in examples), default=0)
    if positions and longest > positions:
        raise DockyardError(f"the model has {positions} learned positions and examples of {longest} tokens would "
                            f"index past them: set -- --max_seq_length {positions} (or less)")


def learned_positions(model: Any) -> int | None:
    """How many positions a model of a learned position table has (None for rotary and other computed ones)."""
    config = getattr(model, "config", None)
    count = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
    if not isinstance(count, int):
        return None
    inputs = model.get_input_embeddings()
    tables = (m for m in model.modules() if isinstance(m, torch.nn.Embedding) and m is not inputs)
    return count if any(count <= m.num_embeddings <= count + 2 for m in tables) else None  # OPT's table: 2 more


HEADS = ("score.", "classifier.", "lm_head.")  # a classifier's new head; the causal-LM head its base had
CLASSIFIER_HEADS = HEADS[:2]


@contextlib.contextmanager
def load_report() -> Iterator[list[logging.LogRecord]]:
    """transformers' LOAD REPORT (a table of the tensors that were missing, unused or of another shape), held while
    the model loads, and said after unless the caller cleared it. Each rank printed it, and for every classifier,
    whose new head and unused causal-LM head are what a classifier is made of; a real problem it reports is said
    whole (the size mismatch transformers raises after it points to the table)."""
    held: list[logging.LogRecord] = []
    source = logging.getLogger("transformers.modeling_utils")

    def hold(record: logging.LogRecord) -> bool:
        if "LOAD REPORT" in str(record.msg):
            held.append(record)
            return False
        return True

    source.addFilter(hold)
    try:
        yield held
    finally:
        source.removeFilter(hold)
        for record in held:
            source.handle(record)


def new_head(loading: dict[str, Any]) -> list[str]:
    return sorted({k.split(".")[0] for k in loading.get("missing_keys") or []})


def only_a_new_head(loading: dict[str, Any], task: str) -> bool:
    """A classifier loaded from a causal LM's weights as it should be: a new head, the LM head unused, nothing else
    (a classifier's own checkpoint, head included, has nothing to report)."""
    keys = [*(loading.get("missing_keys") or []), *(loading.get("unexpected_keys") or [])]
    return (task == "seq_cls" and bool(loading.get("missing_keys")) and all(k.startswith(HEADS) for k in keys)
            and not loading.get("mismatched_keys") and not loading.get("error_msgs"))


def check_weights_loaded(model_dir: str, loading: dict[str, Any], task: str, tensors: int,
                         architectures: Any = None) -> None:
    """Every tensor of the model came from the folder's weights (only a classifier's new head may start from random
    values), and the weights are not mostly of another model. A config.json saying 4 layers of weights holding 2
    trained layers 3 and 4 from random values, and a run said "completed" (transformers' LOAD REPORT, in a table,
    was all that said so). `architectures`: config.json's, which say a classifier given for a language model."""
    missing = [k for k in loading.get("missing_keys") or [] if not (task == "seq_cls" and k.startswith(HEADS))]
    unused = [k for k in loading.get("unexpected_keys") or [] if not (task == "seq_cls" and k.startswith(HEADS))]
    kinds = [a for a in architectures or [] if isinstance(a, str)]
    if (task != "seq_cls" and missing and all(k.startswith(HEADS) for k in missing) and kinds
            and all(a.endswith("ForSequenceClassification") for a in kinds)):
        raise DockyardError(f"{model_dir} is a sequence classifier ({', '.join(kinds)} in its config.json), and task "
                            f"{task} trains a language model, whose head ({', '.join(sorted(missing))}) a classifier "
                            "has not: give the language model it was trained from, or train it as a classifier "
                            "(--task seq_cls)")
    if missing:
        raise DockyardError(f"{model_dir}: its weights lack {len(missing)} of the model's {tensors} tensors "
                            f"({', '.join(sorted(missing)[:3])}{', ...' if len(missing) > 3 else ''}), which would "
                            "train from random values: config.json describes another model than the weights "
                            "(num_hidden_layers, tie_word_embeddings, ...) or a weights file is missing; copy or "
                            "download the model folder again, whole")
    if unused and len(unused) > 0.1 * tensors:
        raise DockyardError(f"{model_dir}: {len(unused)} tensors of its weights have no place in the model "
                            f"config.json describes ({', '.join(sorted(unused)[:3])}, ...): config.json belongs to "
                            "a smaller model (num_hidden_layers, ...); copy or download the model folder again, whole")
    if unused:
        log.warning("%s: %d tensors of its weights are not used by the model config.json describes (%s)", model_dir,
                    len(unused), ", ".join(sorted(unused)[:3]))


MATCH_SECONDS = 10  # lora_target_modules as an expression against every module name: microseconds when sane


def add_lora(model: Any, recipe: Recipe, settings: RunSettings, gradient_checkpointing: bool) -> Any:
    """LoRA adapters on the frozen base, the same way for a 16-bit (lora) and a 4-bit (qlora) base. Not through
    peft's prepare_model_for_kbit_training: it casts every non-quantized weight (norms, embeddings, the output
    layer) to fp32, which makes the residual stream and the logits fp32 and put QLoRA's peak above full
    fine-tuning's on an H100 (54.5 GiB against 53.4 at micro-batch 8). bf16 norms and head train the adapters as
    well (LoRA always ran that way) and are what the saved adapter is reloaded onto."""
    from peft import LoraConfig, get_peft_model

    if gradient_checkpointing:
        # With the base frozen, checkpointed blocks see inputs that need no grad, and the adapters would
        # receive none: the model would silently not learn.
        model.enable_input_require_grads()
    target = settings.lora_target_modules
    if isinstance(target, str) and target != "all-linear":  # peft matches the expression against every module name
        check_module_pattern(target, model, "lora_target_modules",
                             "give the names of its linear layers (q_proj,v_proj ...), or all-linear")
    config = LoraConfig(r=settings.lora_r, lora_alpha=settings.lora_alpha, lora_dropout=settings.lora_dropout,
                        target_modules=settings.lora_target_modules,
                        task_type="SEQ_CLS" if settings.task == "seq_cls" else "CAUSAL_LM")
    with peft_quietly():
        try:
            model = get_peft_model(model, config)
        except ValueError as e:  # peft's NoMatchingPeftModuleError is one: names that match no layer of the model
            if "not found in the base model" not in str(e):
                raise
            # peft's words quote the names again, whole (a long expression twice): they say nothing more than this
            raise DockyardError(f"lora_target_modules {reprlib.repr(settings.lora_target_modules)}: matches no layer "
                                "of the model; give the names of its linear layers (q_proj,v_proj ...; config.json's "
                                "model_type says which), or all-linear") from None
    if weights_dtype(settings, recipe) == torch.float16:
        precision.upcast_trainable(model)
    return model


def check_module_pattern(pattern: str, model: Any, named: str, then: str) -> None:
    """`pattern`, an expression peft matches against every module name of `model`, compiles and is matched against
    them all within MATCH_SECONDS: `(.*.*)*z` backtracks for hours on a name of 30 characters, silently, on every
    rank (and in an export, which reads it from the run folder's adapter_config.json). `named` says where it came
    from, `then` what to do instead."""
    try:
        with time_limit(MATCH_SECONDS):
            for name, _ in model.named_modules():
                re.fullmatch(pattern, name)
    except (re.error, RecursionError, OverflowError) as e:
        raise DockyardError(f"{named} {reprlib.repr(pattern)}: is not a regular expression ({e}); {then}") from None
    except TooSlow:
        raise DockyardError(f"{named} {reprlib.repr(pattern)}: matching it against the model's module names took "
                            f"more than {MATCH_SECONDS} s (nested repeats backtrack without end); {then}") from None


@contextlib.contextmanager
def peft_quietly() -> Iterator[None]:
    """Around peft's adapter set-up and loading: peft 0.21 reads the model's `is_gradient_checkpointing`, which
    transformers 5 renamed, a FutureWarning in every lora run's log and export that the user can do nothing about."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


def adapter_inputs_as_given(model: Any, recipe: Recipe, args: Any) -> contextlib.AbstractContextManager:
    """While the Trainer trains an adapter recipe in mixed precision: peft's LoRA layers stop casting their input to
    their fp32 weights' dtype. That cast copies every adapted layer's input to fp32 (128 MB per layer and pass for
    the 944M benchmark model at micro-batch 8 × 2048) and autocast at once copies it back to bf16 for the adapter's
    matmul, which runs in bf16 either way: the results are the same to the bit without them (tests/unit/
    test_lora_inputs.py), and the copies were memory traffic that left LoRA below full fine-tuning's tokens/s on an
    H200 (51.5k against 56.1k). Without mixed precision (CPU) there is no autocast to meet a 16-bit input with
    fp32 weights, so the casts stay."""
    from peft.helpers import disable_input_dtype_casting

    return disable_input_dtype_casting(model, active=bool(recipe.peft) and bool(args.bf16 or args.fp16))



def count_4bit_layers(model: Any) -> int:
    """Linear layers really held in 4 bits (a quantization state attached), as the manifest records them."""
    import bitsandbytes as bnb

    return sum(1 for m in model.modules()
               if isinstance(m, bnb.nn.Linear4bit) and getattr(m.weight, "quant_state", None) is not None)


def model_shape(folder: Path) -> Any:
    """The model's exact size, any architecture: built from config.json on the meta device (nothing loaded).
    `invoke plan` on the host reads config.json alone (dockyard.common.model_config); here torch is at hand."""
    import transformers

    check_model_folder(folder, str(folder))
    raw = json_object(folder / "config.json", "model settings")  # cut short or not JSON: said here, not a traceback
    check_sizes(folder / "config.json", raw)  # every layer any count asks for is built below before it is counted
    if isinstance(vocab := raw.get("vocab_size"), int) and vocab > 0:
        check_pad_token(folder / "config.json", raw.get("pad_token_id"), vocab)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # building heads without weights makes it chatty
    try:
        try:
            config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
            layers = getattr(config, "num_hidden_layers", None)
            if isinstance(layers, int) and not isinstance(layers, bool):  # (the model type's own default, too)
                check_sizes(folder / "config.json", layers)
            with torch.device("meta"):
                try:
                    model = transformers.AutoModelForCausalLM.from_config(config)
                except ValueError:  # an encoder (BERT...): no causal-LM head, count the bare model
                    model = transformers.AutoModel.from_config(config)
        except CONFIG_ERRORS as e:
            if asks_for_code(e):
                raise runs_code(folder) from None
            raise bad_config(folder, e) from None  # (a dtype torch has no such name for, ...)
    finally:
        transformers.logging.set_verbosity(verbosity)

    def numel(p) -> int:  # under ZeRO-3 a partitioned parameter holds nothing locally; ds_numel is its size
        return getattr(p, "ds_numel", None) or p.numel()

    params = sum(numel(p) for p in model.parameters())  # parameters() yields tied weights once
    check_sizes(folder / "config.json", 0, params)  # counted on the meta device; loading would allocate that much
    largest = max((sum(numel(p) for p in m.parameters(recurse=False)) for m in model.modules()), default=0)
    linear = lora = 0
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and name.split(".")[-1] not in ("lm_head", "score", "classifier"):
            linear += m.weight.numel()
            lora += memory.LORA_RANK * (m.in_features + m.out_features)
    hidden = getattr(config, "hidden_size", 0) or getattr(config, "n_embd", 0)
    heads = getattr(config, "num_attention_heads", 0) or 1
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    return memory.Shape(params=params, largest_layer=largest, hidden=hidden,
                      layers=getattr(config, "num_hidden_layers", 0) or getattr(config, "n_layer", 0),
                      vocab=getattr(config, "vocab_size", 0),
                      intermediate=getattr(config, "intermediate_size", 0) or 4 * hidden,
                      kv_hidden=kv_heads * head_dim, q_hidden=heads * head_dim, linear_params=linear, lora_params=lora,
                      source=f"{folder}/config.json", model_type=str(getattr(config, "model_type", "") or ""),
                      tied=getattr(config, "tie_word_embeddings", False) is True,
                      context=model_config.context(lambda key: getattr(config, key, None)))
