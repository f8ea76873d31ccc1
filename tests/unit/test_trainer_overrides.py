"""Every value a user gives a number the trainer reads (`invoke run -- --key value`): the project's number settings
(recipes/defaults.yaml, RunSettings) and TrainingArguments numbers, through the real `invoke` CLI in this process.
Whatever is typed, the dry run goes on or stops with one short `error:` line naming the key, exit 1, never a
traceback; nan, inf and words are refused on the host (before minutes of image start-up, not inside the run)."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import tasks  # noqa: F401 - the tasks the CLI runs
from dockyard.common import run_settings, training_args
from dockyard.common.errors import DockyardError, accepted
from dockyard.common.overrides import parse_overrides
from dockyard.common.run_settings import RunSettings
from dockyard.common.training_args import AUTO_TRAINING_ARGUMENTS
from dockyard.launch.node import CPU_NPROC
from tests.support.cli import invoke_here, short_error


def number_range(name: str) -> str:
    """What a number setting takes, as an error says it, from its bounds on RunSettings ("" for the others)."""
    takes = accepted(RunSettings, name)
    return takes if takes.startswith(("a whole number", "a number")) else ""


RUN_NUMBERS = sorted(k for k in RunSettings.model_fields if number_range(k))
TRAINING_NUMBERS = ["learning_rate", "max_steps", "per_device_train_batch_size", "save_steps", "save_total_limit",
                    "warmup_steps"]
KINDS = training_args.training_arguments()
WHOLE = {k for k in RUN_NUMBERS if number_range(k).startswith("a whole")} | {
    k for k in TRAINING_NUMBERS if KINDS[k].startswith("int")}

# what a user types as the value: numbers of every form, YAML's own words for them, and any text
VALUES = st.one_of(
    st.integers(-10**30, 10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["nan", ".nan", "NaN", "inf", "-inf", ".inf", "1e400", "-1e400", "1" * 400, "auto", "true",
                     "null", "~", "", " ", "0x10", "1_0", "2.5", "-0", "+3", "1e-4", "[1]", "{a: 1}", "٣", "two"]),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30),
).filter(lambda v: not v.startswith("--"))  # `--x` is the next key, not a value: refused as a missing value
FEW = settings(max_examples=30, deadline=None)


def test_the_keys_tried_are_numbers():
    assert set(RUN_NUMBERS) == {"eval_fraction", "global_batch", "lora_alpha", "lora_dropout", "lora_r",
                                "max_seq_length"}
    assert all(KINDS[k] for k in TRAINING_NUMBERS), "each a number field of TrainingArguments"


def _must(key: str, value) -> str:
    """What the run must do with the value as the override grammar reads it: "refuse", "take", or "" (either,
    as the key's range and the task's other checks decide)."""
    if isinstance(value, bool) or isinstance(value, (str, list, dict)) and value != "auto":
        return "refuse"  # true, a word, a list: not a number
    if value == "auto":
        return "" if key in ("global_batch", *AUTO_TRAINING_ARGUMENTS) else "refuse"
    if isinstance(value, float) and not math.isfinite(value):
        return "refuse"
    if key == "global_batch" and isinstance(value, int) and value % CPU_NPROC:
        return "refuse"  # not split evenly over a CPU run's processes (--nproc's default)
    if key in WHOLE:
        return "take" if isinstance(value, int) and 1 <= value <= 1000 else "refuse" if isinstance(value, float) else ""
    return "take" if isinstance(value, float) and 0 < value < 1 else ""  # (0: save_steps' range starts above it)


@pytest.mark.parametrize("key", RUN_NUMBERS + TRAINING_NUMBERS)
@FEW
@given(value=VALUES)
@example(value="*0")  # an alias of nothing: the overrides' own reading refuses it
@example(value="010")  # YAML 1.1's octal 8: refused as such
def test_a_trainer_override_is_taken_or_one_short_error_naming_it(key, value, tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    recipe = "lora" if key.startswith("lora_") else "zero2"  # the recipes with adapters read the LoRA settings
    r = invoke_here("run", "--dry", "--variant=cpu", "--native", f"--recipe={recipe}", "--", f"--{key}", value,
                    env={"INVOKE_DOCKYARD_RUNS_DIR": str(runs)})
    assert "Traceback" not in r.stderr + r.stdout
    try:
        must = _must(key, parse_overrides([f"--{key}", value])[key])
    except DockyardError:  # what the overrides' own reading refuses ('*0', '010'): as the command must
        must = "refuse"
    if must == "take":
        assert r.returncode == 0, r.stderr
    if must == "refuse" or r.returncode:
        short_error(r, key)
        assert r.returncode == 1
        assert "-m dockyard.train" not in r.stderr, "refused before the command"


def test_a_hub_token_given_as_a_setting_is_refused_before_it_is_printed_or_saved(tmp_path):
    """`-- --hub_token hf_...` was taken: printed in the docker command (`run --dry`, the echo, ps for every user of
    the host) and saved whole in training_args.bin of every checkpoint and of model/, which the runs are offline
    (HF_HUB_OFFLINE=1) and never use. Now the host and the trainer refuse it, from the overrides or a recipe file,
    without printing it."""
    from dockyard.common.errors import DockyardError
    from dockyard.common.recipes import load_recipe
    from dockyard.common.run_settings import resolve_settings

    token = "hf_" + "Q" * 34
    r = invoke_here("run", "--dry", "--variant=cpu", "--", "--hub_token", token, "--max_steps", "2",
                    env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    short_error(r, "hub_token")
    assert token not in r.stdout + r.stderr and "dockyard.train" not in r.stderr and not (tmp_path / "runs").exists()
    recipe = load_recipe("ddp")
    with pytest.raises(DockyardError, match="hub_token in settings: in .*recipe.yaml"):
        resolve_settings(recipe.model_copy(update={"settings": {**recipe.settings, "hub_token": token}}), {})
    assert resolve_settings(recipe, {"hub_model_id": "me/model"})[1]["hub_model_id"] == "me/model"


def test_push_to_hub_is_refused_before_the_run_as_offline_runs_cannot_push(tmp_path):
    """`push_to_hub: true` in a recipe passed the checks, trained, then ended in huggingface_hub's 60-line
    OfflineModeIsEnabled traceback."""
    from dockyard.common.errors import DockyardError
    from dockyard.common.recipes import load_recipe
    from dockyard.common.run_settings import resolve_settings

    short_error(invoke_here("run", "--dry", "--variant=cpu", "--", "--push_to_hub", "true",
                            env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")}), "push_to_hub")
    assert not (tmp_path / "runs").exists()
    recipe = load_recipe("ddp")
    with pytest.raises(DockyardError, match="push_to_hub in settings: in .*recipe.yaml: runs are offline"):
        resolve_settings(recipe.model_copy(update={"settings": {**recipe.settings, "push_to_hub": True}}), {})
    assert resolve_settings(recipe, {"push_to_hub": False})[1]["push_to_hub"] is False


@pytest.mark.parametrize("key, value, instead", [
    ("output_dir", "/tmp/elsewhere", "name it with --run-id"),
    ("resume_from_checkpoint", "/nonexistent", "continue a run with --resume"),
    ("use_cpu", "false", "invoke run --cpu"),
    ("local_rank", "3", "torchrun gives each process its rank"),
    ("do_train", "false", "the run always trains"),
])
def test_a_training_argument_the_run_sets_itself_is_refused_not_dropped(tmp_path, key, value, instead):
    """Each was taken and then overwritten by the run: `--output_dir /x` wrote nothing there, and
    `--resume_from_checkpoint /nonexistent` trained a fresh run that said "completed"."""
    from dockyard.common.errors import DockyardError
    from dockyard.common.recipes import load_recipe
    from dockyard.common.run_settings import resolve_settings

    r = invoke_here("run", "--dry", "--variant=cpu", "--", f"--{key}", value,
                    env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    short_error(r, f"{key} in the overrides after --: the run sets it itself and would ignore this value; ")
    assert instead in r.stderr
    recipe = load_recipe("ddp")
    with pytest.raises(DockyardError, match=f"{key} in settings: in .*recipe.yaml: the run sets it itself"):
        resolve_settings(recipe.model_copy(update={"settings": {**recipe.settings, key: value}}), {})


@pytest.mark.parametrize("recipe", ["zero2-offload", "zero3-offload"])
def test_an_optimizer_the_recipes_deepspeed_config_chooses_is_not_overridden_in_name_only(tmp_path, recipe):
    """`--optim sgd` on an offload recipe trained with DeepSpeed's AdamW (its ds_config's `optimizer` wins) while the
    manifest's overrides said sgd."""
    from dockyard.common.recipes import load_recipe
    from dockyard.common.run_settings import resolve_settings

    for typed in (["--optim", "sgd"], ["--optim_args", "momentum=0.9"]):
        r = invoke_here("run", "--dry", "--variant=cpu", f"--recipe={recipe}", "--", *typed,
                        env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
        short_error(r, f"{typed[0][2:]} in the overrides after --: recipe {recipe}'s ds_config.json chooses the "
                       "optimizer itself (its `optimizer` section)")
    assert resolve_settings(load_recipe("zero2"), {"optim": "sgd"})[1]["optim"] == "sgd"  # no `optimizer` there


def test_lora_settings_given_to_a_recipe_without_adapters_are_refused_not_ignored(tmp_path):
    """`--recipe ddp -- --lora_r 8` did a full fine-tune and said nothing of the setting."""
    from dockyard.common.recipes import load_recipe
    from dockyard.common.run_settings import resolve_settings

    r = invoke_here("run", "--dry", "--variant=cpu", "--recipe=ddp", "--", "--lora_r", "8",
                    env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    short_error(r, "lora_r in the overrides after --: recipe ddp trains the whole model, with no LoRA adapters")
    assert resolve_settings(load_recipe("lora"), {"lora_r": 8})[0].lora_r == 8
    assert resolve_settings(load_recipe("ddp"), {})[0].lora_r == 16  # defaults.yaml's, for every recipe


def test_float16_weights_for_a_full_fine_tune_under_ddp_are_refused_before_the_run(tmp_path):
    """Red-team pass: `--recipe ddp -- --dtype float16` passed the dry run and trained Adam over float16 weights with
    its state in float16 (eps 1e-8 is 0 there): loss 6.2, 6.1, 18.1, then nan from step 4, and the run said to lower
    the learning rate. DeepSpeed keeps float32 weights for its optimizer and FSDP upcasts them; adapters train in
    float32 over a float16 base."""
    from dockyard.common.recipes import load_recipe
    from dockyard.common.run_settings import resolve_settings

    r = invoke_here("run", "--dry", "--variant=cpu", "--recipe=ddp", "--", "--dtype", "float16",
                    env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    short_error(r, "dtype float16: recipe ddp trains the whole model with DDP, whose optimizer would update float16 "
                   "weights")
    assert not (tmp_path / "runs").exists()
    for name in ("zero2", "zero3", "fsdp", "lora", "qlora"):
        assert resolve_settings(load_recipe(name), {"dtype": "float16"})[0].dtype == "float16"
    assert resolve_settings(load_recipe("ddp"), {"dtype": "bfloat16"})[0].dtype == "bfloat16"


def test_a_resume_leaves_out_what_an_older_run_saved_to_no_effect():
    """A run started before these keys were refused holds them in overrides.json: its --resume was refused for a key
    the user had not given ("in the overrides after --"), with no way to take it out."""
    from dockyard.common.recipes import load_recipe
    from dockyard.common.run_settings import ineffective

    saved = {"lora_r": 8, "output_dir": "/x", "max_steps": 30, "optim": "sgd", "learning_rate": 0.1}
    assert ineffective(load_recipe("ddp"), saved) == ["lora_r", "output_dir"]
    assert ineffective(load_recipe("zero2-offload"), saved) == ["lora_r", "optim", "output_dir"]
    assert ineffective(load_recipe("lora"), saved) == ["output_dir"]


def test_choices_and_names_a_user_may_well_give_are_taken():
    from dockyard.common.recipes import load_recipe
    from dockyard.common.run_settings import resolve_settings
    from dockyard.common.training_args import check_training_numbers

    check_training_numbers({"log_level": "detail", "neftune_noise_alpha": 0, "label_smoothing_factor": 0.1,
                            "accelerator_config": {"even_batches": False}})  # transformers takes them all
    regex = r"model\.layers\.\d{1,2}\.self_attn\.(q_proj|v_proj)"  # peft's own form: a comma inside, no list
    assert resolve_settings(load_recipe("lora"), {"lora_target_modules": regex})[0].lora_target_modules == regex
    assert resolve_settings(load_recipe("lora"), {"lora_target_modules": "q_proj,"})[0].lora_target_modules == \
        ["q_proj"]


@pytest.mark.parametrize("typed", [["--data="], ["--data", "~"], ["--model", "null"]])
def test_a_path_setting_given_no_value_says_so(tmp_path, typed):
    """`-- --data=` said "data: Input should be a valid string", not what was wrong with what was typed."""
    r = invoke_here("run", "--dry", "--variant=cpu", "--", *typed, env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path)})
    key = typed[0].strip("-=")
    short_error(r, f"invalid setting: --{key}: given no value (`--{key}=` with nothing after it, or a bare ~, reads as "
                   f"none): give one, e.g. --{key} PATH")


@pytest.mark.parametrize("typed, says", [
    (["--optim", "adamw_torch_fusd"], "optim 'adamw_torch_fusd': did you mean adamw_torch_fused? "
                                      "TrainingArguments.optim takes one of adamw_torch, "),
    (["--lr_scheduler_type", "cosin"], "lr_scheduler_type 'cosin': did you mean cosine?"),
    (["--save_strategy", "bogus"], "save_strategy 'bogus': TrainingArguments.save_strategy takes one of no, steps, "
                                   "epoch, best"),
])
def test_a_name_transformers_does_not_know_is_refused_on_the_host(tmp_path, typed, says):
    """`--optim foo` passed `invoke run --dry`; the real run started its container, loaded the model and was refused by
    TrainingArguments, the run id spent on a failed run folder."""
    r = invoke_here("run", "--dry", "--variant=cpu", "--", *typed, env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path)})
    short_error(r, says)
    ok = invoke_here("run", "--dry", "--variant=cpu", "--", "--optim", "adamw_torch_fused", "--save_strategy", "no",
                     "--lr_scheduler_type", "linear", env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path)})
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize("typed, says", [
    (["--task", "seq_cls", "--data_format", "text"], "data_format text: task seq_cls reads a text and a label"),
    (["--data_format", "text_label"], "data_format text_label is for sequence classification: add --task seq_cls"),
])
def test_a_data_format_the_task_does_not_read_is_refused(tmp_path, typed, says):
    """seq_cls read text and label whatever data_format said: `--data_format text` was dropped without a word."""
    short_error(invoke_here("run", "--dry", "--variant=cpu", "--", *typed,
                            env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path)}), f"invalid setting: {says}")


def test_a_name_or_a_path_is_the_text_typed_not_what_yaml_makes_of_it():
    """`--run_name yes` was recorded as true and `--run_name 1e5` as a float; `--data 2024` was refused as a number."""
    assert parse_overrides(["--run_name", "yes", "--data", "2024", "--max_steps", "5"]) == \
        {"run_name": "yes", "data": "2024", "max_steps": 5}
    assert parse_overrides(["--run_name", "1e5", "--model=007"]) == {"run_name": "1e5", "model": "007"}
    assert parse_overrides(["--data="]) == {"data": None}  # given nothing: said so, not the sample data
    # YAML's mappings and lists: `::` was refused as a key without a value, `{a}` recorded as {a: null}
    typed = ["::", "{a}", "[1]", "a: b", "[a.jsonl, b.jsonl]"]
    assert [parse_overrides(["--run_name", v, "--model", v]) for v in typed] == [{"run_name": v, "model": v} for v in typed]


def test_a_number_in_exponent_form_is_a_number_within_a_mapping_too(tmp_path):
    """Red-team pass: YAML 1.1 reads `1e-5` as text. A top-level override or recipe setting was read as the number, but
    one inside a mapping was not: `--lr_scheduler_kwargs '{min_lr: 1e-5}'` handed the schedule the text '1e-5' and the
    run stopped with "TypeError: unsupported operand type(s) for /: 'str' and 'float'" (`1.0e-5` was taken)."""
    from dockyard.common.recipes import load_recipe
    from dockyard.common.run_settings import resolve_settings

    given = parse_overrides(["--lr_scheduler_kwargs", "{min_lr: 1e-5, xs: [2E3, q_proj]}", "--run_name", "1e5"])
    assert given == {"lr_scheduler_kwargs": {"min_lr": 1e-5, "xs": [2000.0, "q_proj"]}, "run_name": "1e5"}
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "recipe.yaml").write_text("# invoke run --recipe=mine\nwhen: x\nstrategy: ddp\nsettings:\n"
                                      "  lr_scheduler_type: cosine_with_min_lr\n  lr_scheduler_kwargs: {min_lr: 1e-5}\n")
    assert resolve_settings(load_recipe(str(mine)), {})[1]["lr_scheduler_kwargs"] == {"min_lr": 1e-5}


def test_a_number_yaml_1_1_reads_as_another_is_refused_naming_the_key_and_what_to_write(tmp_path):
    """Red-team pass: PyYAML reads YAML 1.1, where `max_steps: 1:00` is 60 (base 60) and `seed: 010` is 8 (octal): a
    run of 60 steps, seeded 8, without a word, from an override, a recipe's settings: or defaults.yaml. `1e-5` stays
    the number, `0x10` and `1_000` the numbers they say; a name keeps its text (`--run_name 1:00`)."""
    from dockyard.common.errors import DockyardError
    from dockyard.common.recipes import load_recipe

    with pytest.raises(DockyardError, match=r"^--max_steps 1:00 would be read as 60 \(YAML 1.1 reads a:b as a number "
                                            r"in base 60\): write 60, or quote '1:00' where text is meant$"):
        parse_overrides(["--max_steps", "1:00"])
    with pytest.raises(DockyardError, match=r"^--seed 010 would be read as 8 \(YAML 1.1 reads a leading 0 as octal\): "
                                            r"write 8 \(or 10, as the digits say\), or quote '010' where text is meant$"):
        parse_overrides(["--seed=010"])
    with pytest.raises(DockyardError, match=r"^--lr_scheduler_kwargs num_cycles: 1:30.5 would be read as 90.5 "):
        parse_overrides(["--lr_scheduler_kwargs", "{num_cycles: 1:30.5}"])
    assert parse_overrides(["--seed", "0x10", "--max_steps", "1_000", "--warmup_steps", "07", "--learning_rate", "1e-5",
                            "--run_name", "1:00"]) == {"seed": 16, "max_steps": 1000, "warmup_steps": 7,
                                                       "learning_rate": 1e-5, "run_name": "1:00"}
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "recipe.yaml").write_text("# invoke run --recipe=mine\nwhen: x\nstrategy: ddp\nsettings:\n"
                                      "  max_steps: 1:00\n  seed: 010\n")
    with pytest.raises(DockyardError, match=f"^{mine / 'recipe.yaml'}, line 5: max_steps: 1:00 would be read as 60 "):
        load_recipe(str(mine))
    r = invoke_here("run", "--dry", "--variant=cpu", "--", "--seed", "010", env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path)})
    short_error(r, "--seed 010 would be read as 8")


def test_a_field_transformers_5_removed_says_what_took_its_place(tmp_path):
    """`--logging_dir x` was answered "did you mean --logging_first_step?"."""
    r = invoke_here("run", "--dry", "--variant=cpu", "--", "--logging_dir", "x", "--overwrite_output_dir",
                    env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path)})
    short_error(r, "unknown trainer override(s): --logging_dir (transformers 5 has none: the run's logs are in its "
                   "folder, train.log and metrics.jsonl), --overwrite_output_dir (transformers 5 has none, and a run "
                   "never overwrites another: give a new --run-id)")


def test_an_override_holding_yaml_aliases_is_refused_before_anything_expands_it():
    """The twelfth red-team pass: 300 bytes of `&a [*b, ...]` nine levels deep stand for 10**9 values; the run's
    record (overrides.json, the manifest) wrote them out until the host's memory was gone, on every rank."""
    from dockyard.common.errors import DockyardError

    levels = "abcdefghi"
    bomb = "{a: &a [x,x,x,x,x,x,x,x,x,x]" + "".join(
        f", {q}: &{q} [{','.join(['*' + p] * 10)}]" for p, q in zip(levels, levels[1:], strict=False)) + "}"
    with pytest.raises(DockyardError, match=r"--lr_scheduler_kwargs '\{a: &a .*: a YAML alias \(\*a\) repeats a value "
                                            "by reference; write the value out"):
        parse_overrides(["--lr_scheduler_kwargs", bomb])
    assert parse_overrides(["--lr_scheduler_kwargs", "{min_lr: 0.1}"]) == {"lr_scheduler_kwargs": {"min_lr": 0.1}}


@pytest.mark.parametrize("key,says", [
    ("batch_size", "--batch_size (did you mean --per_device_train_batch_size, examples per process, or "
                   "--global_batch, per step over all processes?)"),
    ("lr", "--lr (did you mean --learning_rate?)"),
    ("lora_rank", "--lora_rank (did you mean --lora_r?)"),
    ("dataset", "--dataset (did you mean --data?)"),
    ("epochs", "--epochs (did you mean --num_train_epochs?)"),
    ("model_name_or_path", "--model_name_or_path (did you mean --model?)"),
])
def test_another_trainers_name_for_a_setting_is_answered_with_dockyards(key, says):
    """The newcomer audit: `-- --batch_size 8` was "did you mean --auto_find_batch_size?" (a switch that retries
    on out-of-memory), `--lora_rank` "did you mean --local_rank?", `--dataset` "--data_seed", `--lr` no hint."""
    with pytest.raises(DockyardError) as e:
        run_settings.check_known_overrides({key: 8})
    assert says in str(e.value), str(e.value)


def test_the_other_names_are_not_keys_and_point_at_keys():
    known = run_settings.known_keys()
    assert not set(run_settings.OTHER_NAMES) & known
    for hint in run_settings.OTHER_NAMES.values():
        named = re.findall(r"--(\w+)", hint)
        assert named and set(named) <= known | {"data", "model"}, hint


def test_epochs_given_while_max_steps_ends_the_run_first_are_refused(tmp_path):
    """The newcomer audit: `invoke run -- --num_train_epochs 3` trained defaults.yaml's 50 steps, the epochs ignored
    by the Trainer ("max_steps is given, it will override any value given in num_train_epochs", in train.log only)."""
    env = {"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path)}
    short_error(invoke_here("run", "--dry", "--variant=cpu", "--", "--num_train_epochs", "3", env=env),
                "num_train_epochs in the overrides after --: the Trainer ignores it while max_steps is set (max_steps "
                "50, from recipes/defaults.yaml), and would stop after 50 steps: add --max_steps -1 to train for "
                "num_train_epochs, or leave num_train_epochs out")
    short_error(invoke_here("run", "--dry", "--variant=cpu", "--", "--num_train_epochs", "3", "--max_steps", "8",
                            env=env), "(max_steps 8, from the overrides after --)")
    ok = invoke_here("run", "--dry", "--variant=cpu", "--", "--num_train_epochs", "3", "--max_steps", "-1", env=env)
    assert ok.returncode == 0, ok.stderr
