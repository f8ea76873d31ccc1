"""A run's model as a plain Hugging Face folder, checked by reloading it (`invoke export` runs this in the image):

    python -m dockyard.train.export --run-dir DIR --out EMPTY_DIR [--merge]

Full fine-tunes: the saved model and tokenizer. LoRA/QLoRA: the adapter (load it onto the base with peft), or with
--merge the base with the adapters merged into its weights (QLoRA: onto the 16-bit base, not the 4-bit one it
trained on), loadable with transformers alone. Either way the written folder is reloaded and its logits compared,
on a few inputs, with the run's own model (base as trained, 4-bit for QLoRA, plus adapter); the largest difference
and the tolerance are printed, and a folder outside it is an error.
"""

from __future__ import annotations

import argparse
import math
import reprlib
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError

from dockyard.common import runfolder
from dockyard.common.errors import DockyardError, json_object
from dockyard.common.model_config import ADAPTER, check_shards_inside
from dockyard.common.run_settings import MAX_LORA
from dockyard.common.units import duration
from dockyard.train import environment

TEXTS = ["The harbour master counts the ships.", "Which port is number two?", "a b c d e f g"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dockyard.train.export", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path, help="an empty folder to write into")
    p.add_argument("--merge", action="store_true", help="merge LoRA/QLoRA adapters into the base")
    opts = p.parse_args(argv)
    quiet()
    try:
        export(opts.run_dir, opts.out, opts.merge)
    except DockyardError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError, RuntimeError, AssertionError,
            SafetensorError, StrictDataclassError) as e:
        # a run folder a container changed (an adapter_config.json of no module, a broken tokenizer.json, a
        # pad_token_id past the vocabulary: torch's AssertionError)
        from dockyard.train.model import error_words

        print(f"error: cannot export run {opts.run_dir.name}: its model folder does not load ({type(e).__name__}: "
              f"{error_words(e)}); nothing was kept", file=sys.stderr)
        return 1
    return 0


def quiet() -> None:
    """The console says what was exported and how it compared, without the libraries' noise the trainer leaves out
    too; the bars of each load and save as a run has them by default (disable_tqdm): on a terminal (minutes for a
    large model), not in a pipe or a log file."""
    environment.quiet_libraries()
    environment.weight_bars(disable_tqdm=True)


def export(run_dir: Path, out: Path, merge: bool) -> dict[str, Any]:
    """Write the folder, reload it, compare; returns what was checked."""
    m = read_manifest(run_dir)
    check_saved_files(m, run_dir)
    if out.exists() and any(out.iterdir()):
        raise DockyardError(f"{out} is not empty: pick a new --out folder")
    out.mkdir(parents=True, exist_ok=True)
    try:
        adapter = m["model"]["format"] == "adapter"
        dtype = getattr(torch, m["probe"]["dtype"])
        if adapter and merge:
            what = f"{m['strategy']['peft']} adapters merged into the {m['probe']['dtype']} base"
            step(m, f"merging its adapters into the {m['probe']['dtype']} base and saving that to {out}")
            load_run_model(m, run_dir, dtype, quantized=False).merge_and_unload().save_pretrained(out)
        else:
            what = "adapter (load it onto the base with peft)" if adapter else "model"
            if merge:
                print(f"note: run {m['run_id']} trained the whole model: there are no adapters to merge")
            step(m, f"copying its {'adapter' if adapter else 'model'} to {out}")
            for f in (run_dir / "model").iterdir():  # what the Trainer saved, as it is: weights (or adapter), config
                if f.is_file() and f.name != "training_args.bin":
                    shutil.copy2(f, out / f.name)
        tokenizer(run_dir / "model").save_pretrained(out)
        runfolder.share_weights(out)
        step(m, "reloading the export to compare its logits with the run's model")
        check = compare(m, run_dir, out, dtype, reload_adapter=adapter and not merge)
        # since the process started: the libraries' import and the checks are part of the user's wait
        print(f"exported {what} of run {m['run_id']} to {out} in {duration(environment.seconds_since_start())}")
        print(f"  reloaded and compared with the run's own model on {check['inputs']} inputs: largest logit difference "
              f"{check['max_abs_diff']:.2e} (tolerance {check['tolerance']:.1e}{', ' + check['why'] if check['why'] else ''})")
        if "vs_4bit_as_trained" in check:
            print(f"  the 4-bit model as trained differs from it by up to {check['vs_4bit_as_trained']:.2e} (the base's "
                  "4-bit rounding: merging onto the 16-bit base undoes it)")
        if "vs_probe" in check:
            if check["vs_probe"] > check["probe_tolerance"]:
                print(f"warning: the run's model/ differs from the model as training ended (the logits its manifest "
                      f"recorded, its probe) by up to {check['vs_probe']:.3g} (> {check['probe_tolerance']:.1e}): its "
                      "weights were changed or replaced since the run, or saved wrong; the export holds model/ as it is "
                      "now", file=sys.stderr)
            else:  # a success said as one: "differs" here read as a fault to a user who met it first
                print(f"  the run's model/ is the model as training ended: its logits match those the manifest recorded "
                      f"then (its probe) to {check['vs_probe']:.2e} (tolerance {check['probe_tolerance']:.1e})")
        if check["max_abs_diff"] > check["tolerance"]:
            raise DockyardError(f"the exported model's logits differ from the run's by {check['max_abs_diff']:.3g} "
                                f"(> {check['tolerance']:.1e}): nothing was kept")
    except BaseException:
        empty(out)  # what was written so far goes (the folder was empty), so the next try does not find it "not empty"
        raise
    return check


def step(m: dict[str, Any], doing: str) -> None:
    """A long step said as it starts, on stderr at once: a large model's load, save or reload takes minutes, and in
    a log (or the image, which has no terminal) no bar shows them."""
    print(f"export of run {m['run_id']}: {doing} ...", file=sys.stderr, flush=True)


def empty(folder: Path) -> None:
    for f in folder.iterdir():
        if f.is_dir() and not f.is_symlink():
            shutil.rmtree(f)
        else:
            f.unlink()


DTYPES = ("float32", "bfloat16", "float16")  # what the trainer records as the probe's (and the weights') dtype


PROBE_TOKENS = 32  # the probe the trainer records: an example's first 32 tokens (millions took the export hours)


def read_manifest(run_dir: Path) -> dict[str, Any]:
    """The run's manifest, read as untrusted (any run's container can write it), in a folder holding no link."""
    runfolder.check(run_dir)
    record = runfolder.read_manifest(run_dir)
    if record is None:
        raise DockyardError(f"{run_dir} holds no run (no manifest.json): give a run id from the runs folder")
    m = record.model_dump()
    if m["status"] != "completed":
        raise DockyardError(f"run {m['run_id']} did not complete (status {m['status']}): it saved no model to export")
    if not (run_dir / "model").is_dir():
        raise DockyardError(f"run {m['run_id']} completed, but its folder holds no model/ folder (removed or replaced "
                            "since): nothing to export; train it again")
    model, probe = m.get("model"), m.get("probe")
    if not (isinstance(model, dict) and model.get("format") in ("full", "adapter") and isinstance(model.get("base"), str)
            and isinstance(probe, dict) and probe.get("dtype") in DTYPES and isinstance(probe.get("input_ids"), list)
            and 0 < len(probe["input_ids"]) <= PROBE_TOKENS and all(type(i) is int for i in probe["input_ids"])
            and m["strategy"] is not None):
        raise DockyardError(f"{run_dir}/manifest.json is not a manifest the trainer writes (model, probe): refused")
    task, saved = m.get("task") or "causal_lm", _saved_task(run_dir / "model", m["model"]["format"])
    if saved and saved[0] != task:
        raise DockyardError(f"run {m['run_id']}: its manifest.json says task {task}, but its model/ holds {saved[1]}: "
                            "the manifest was edited or the model replaced since the run; nothing was exported")
    return m


def check_saved_files(m: dict[str, Any], run_dir: Path) -> None:
    """The config.json the model is built from and the adapter's settings, held to what the trainer takes before it
    loads them: any run's container can write them, and the trainer writes none of the values refused (50,000,000
    layers were built for minutes, an adapter of rank 100,000,000 took 25 GB)."""
    from dockyard.train import model as models

    adapter = m["model"]["format"] == "adapter"
    folder = Path(m["model"]["base"]) if adapter else run_dir / "model"
    if (folder / "config.json").is_file():  # (a base that is not here is said when it is loaded)
        try:
            models.model_shape(folder)  # the trainer's sizes, counted on the meta device before it loads the model
        except DockyardError as e:  # (torch's asserts building a layer are among model_shape's CONFIG_ERRORS)
            raise DockyardError(f"{e}; {changed(folder, run_dir)}") from None
    if not (adapter and (run_dir / "model" / ADAPTER).is_file()):
        return
    path = run_dir / "model" / ADAPTER
    settings = json_object(path, "an adapter's settings")
    ranks = [("r", settings.get("r"))]
    for key in ("rank_pattern", "alpha_pattern"):
        pattern = settings.get(key) or {}
        if not isinstance(pattern, dict):
            raise DockyardError(f"{path}: `{key}` is {reprlib.repr(pattern)}, not a mapping of module names to "
                                f"numbers; {changed(path, run_dir)}")
        ranks += [(f"{key}[{name!r}]", value) for name, value in pattern.items()]
    for key, value in ranks:  # peft allocates each layer's adapter at its rank before reading the weights
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LORA:
            raise DockyardError(f"{path}: `{key}` is {reprlib.repr(value)}, outside the 1..{MAX_LORA} the trainer "
                                f"takes for lora_r; {changed(path, run_dir)}")


def check_adapter_patterns(adapter_dir: Path, base: Any, run_dir: Path) -> None:
    """The expressions of adapter_config.json that peft matches against every module name of the base (target_modules
    as one string, exclude_modules, the rank and alpha patterns' keys): each compiles and matches within the
    trainer's time limit. A list of names is matched as names."""
    from dockyard.train.model import check_module_pattern

    path = adapter_dir / ADAPTER
    settings = json_object(path, "an adapter's settings")
    patterns = [(key, settings.get(key)) for key in ("target_modules", "exclude_modules")]
    for key in ("rank_pattern", "alpha_pattern"):
        patterns += [(f"{key} key", name) for name in settings.get(key) or {}]
    for key, pattern in patterns:
        if isinstance(pattern, str):
            check_module_pattern(pattern, base, f"{path}: `{key}`", changed(path, run_dir))


def changed(path: Path, run_dir: Path) -> str:
    """What a refusal of a value the trainer would not have taken says about where it came from."""
    where = "the run folder" if path.absolute().is_relative_to(run_dir.absolute()) else "the model folder"
    return (f"the trainer refuses this and writes no such value: {where} was changed after the run; nothing was "
            "exported")


def _saved_task(folder: Path, fmt: str) -> tuple[str, str] | None:
    """The task the saved model was trained for, read from its own files (a classifier's head, or the adapter's
    task_type), and the words naming it; None where they do not say."""
    if fmt == "adapter":
        if not (folder / "adapter_config.json").is_file():
            return None
        kind = json_object(folder / "adapter_config.json", "an adapter's settings").get("task_type")
        tasks = {"SEQ_CLS": "seq_cls", "CAUSAL_LM": "causal_lm"}
        return (tasks[kind], f"an adapter of task_type {kind}") if kind in tasks else None
    if not (folder / "config.json").is_file():
        return None
    names = json_object(folder / "config.json", "a model's config").get("architectures")
    if not (isinstance(names, list) and names and all(isinstance(n, str) for n in names)):
        return None
    classifier = any(n.endswith("ForSequenceClassification") for n in names)
    return ("seq_cls" if classifier else "causal_lm"), f"a {names[0][:80]!r}"


def _auto(m: dict[str, Any]) -> Any:
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    return AutoModelForSequenceClassification if m.get("task") == "seq_cls" else AutoModelForCausalLM


def load_run_model(m: dict[str, Any], run_dir: Path, dtype: torch.dtype, quantized: bool,
                   adapter_dir: Path | None = None) -> Any:
    """The run's model: its saved weights, or its base (4-bit for QLoRA when `quantized`) plus the adapter."""
    if m["model"]["format"] != "adapter":
        check_shards_inside(adapter_dir or run_dir / "model")
        return _auto(m).from_pretrained(adapter_dir or run_dir / "model", dtype=dtype, trust_remote_code=False)
    from peft import PeftModel

    kwargs: dict[str, Any] = {}
    if quantized and m["strategy"]["peft"] == "qlora":
        from dockyard.train.model import quantization_config

        kwargs["quantization_config"] = quantization_config(dtype)
    base = m["model"]["base"]
    if not Path(base).is_dir():
        raise DockyardError(f"the run's base model {base} is not here: give the same --model as the run")
    from dockyard.train.model import peft_quietly

    check_shards_inside(Path(base))
    with peft_quietly():
        model = _auto(m).from_pretrained(base, dtype=dtype, trust_remote_code=False, **kwargs)
        check_adapter_patterns(adapter_dir or run_dir / "model", model, run_dir)
        return PeftModel.from_pretrained(model, adapter_dir or run_dir / "model")


def tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, trust_remote_code=False)


def logits(model: Any, batches: list[list[int]]) -> torch.Tensor:
    vocab = model.get_input_embeddings().num_embeddings
    if outside := sorted({i for ids in batches for i in ids if not 0 <= i < vocab}):
        # the manifest's probe (any container can write it), or a tokenizer of another model than the weights
        raise DockyardError(f"token id(s) {', '.join(map(str, outside[:5]))} are outside the model's vocabulary of "
                            f"{vocab}: the run's manifest.json (its probe) or its tokenizer is not this model's; "
                            "nothing was kept")
    model.eval()
    rows = []
    with torch.no_grad():
        for ids in batches:
            out = model(input_ids=torch.tensor([ids], device=model.device)).logits.float().cpu()
            rows.append(out[0, -1] if out.dim() == 3 else out[0])
    return torch.stack(rows)


def compare(m: dict[str, Any], run_dir: Path, out: Path, dtype: torch.dtype, reload_adapter: bool) -> dict[str, Any]:
    """Logits of the written folder, reloaded as a user would, against the run's own model. A merged QLoRA model
    is held to the 16-bit base plus the adapter (what merging computes), and its distance from the 4-bit model
    that trained is reported beside (the base's 4-bit rounding, not an error)."""
    tok = tokenizer(out)
    batches = [m["probe"]["input_ids"]] + [tok(t)["input_ids"] for t in TEXTS]
    merged_qlora = not reload_adapter and m["strategy"]["peft"] == "qlora"
    own = logits(load_run_model(m, run_dir, dtype, quantized=not merged_qlora), batches)
    if reload_adapter:
        got = logits(load_run_model(m, run_dir, dtype, quantized=True, adapter_dir=out), batches)
    else:
        got = logits(_auto(m).from_pretrained(out, dtype=dtype, trust_remote_code=False), batches)
    scale = max(1.0, float(own.abs().max()))
    tol, why = (1e-4 * scale, "") if dtype == torch.float32 else (2e-2 * scale, f"{m['probe']['dtype']} weights")
    check = {"inputs": len(batches), "max_abs_diff": float((got - own).abs().max()), "tolerance": tol, "why": why}
    as_trained = own
    if merged_qlora:
        as_trained = logits(load_run_model(m, run_dir, dtype, quantized=True), batches)
        check["why"] += "; against the 16-bit base + adapter"
        check["vs_4bit_as_trained"] = float((got - as_trained).abs().max())
    if recorded := probe_logits(m["probe"]):  # the model/ that was saved against the model that ended training
        first = as_trained[0, :len(recorded)]
        check["vs_probe"] = float((first - torch.tensor(recorded)).abs().max())
        # the trainer's device and kernels, not this one's (bf16 on a GPU against bf16 here): loose, as tests/gpu
        check["probe_tolerance"] = 5e-2 * max(1.0, float(first.abs().max()))
    return check


def probe_logits(probe: dict[str, Any]) -> list[float] | None:
    """The first logits the trainer recorded for the probe, or None where there are none to compare: a run that
    diverged records NaN as null (and the manifest is untrusted: anything but a short list of numbers is none)."""
    values = probe.get("logits")
    if not (isinstance(values, list) and 0 < len(values) <= 16
            and all(type(v) in (int, float) and math.isfinite(v) for v in values)):
        return None
    return [float(v) for v in values]


if __name__ == "__main__":
    sys.exit(main())
