"""Recipes and settings: pure parsing, no torch."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

from dockyard.common.errors import DockyardError
from dockyard.common.overrides import parse_overrides
from dockyard.common.recipes import RECIPES, list_recipes, load_recipe, recipe_names
from dockyard.common.run_settings import resolve_settings


def test_recipes_and_settings_read_without_torch():
    """The host lists recipes and resolves settings with no training stack installed."""
    code = ("import sys; import dockyard.common.recipes as r, dockyard.common.run_settings as s; "
            "s.resolve_settings(r.load_recipe('zero2'), {}); print(len(r.list_recipes())); "
            "assert not {'torch', 'transformers', 'rich'} & set(sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert int(out) == len(list(RECIPES.glob("*/recipe.yaml")))


def test_every_recipe_says_how_to_run_it_and_when_to_pick_it():
    recipes = list_recipes()
    assert {r.name for r in recipes} >= {"zero2"}
    for r in recipes:
        assert r.command == f"invoke run --recipe={r.name}"
        assert r.when.endswith(".") and len(r.when.split()) > 6


def test_invoke_recipes_says_how_each_recipe_spreads_the_model():
    """`invoke recipes`' second column repeated the recipe's own name for six of the eight ("zero2 | zero2"): it now
    says what each GPU holds, from the strategy's own fields, so a recipe folder of a user's is described too."""
    from tests.support.cli import invoke_here

    listed = invoke_here("recipes", env={"COLUMNS": "200"})
    assert listed.returncode == 0, listed.stderr
    rows = {cells[0]: cells[1] for line in listed.stdout.splitlines()
            if len(cells := [c.strip() for c in line.strip("│ ").split("│")]) == 3}
    assert rows["ddp"] == "DDP: every GPU holds the whole model"
    assert rows["zero2"] == "ZeRO-2: gradients and optimizer sharded"
    assert rows["zero2-offload"] == "ZeRO-2: gradients and optimizer sharded, in host RAM"
    assert rows["zero3"] == rows["zero3-offload"].removesuffix(", in host RAM") == (
        "ZeRO-3: weights, gradients and optimizer sharded")
    assert rows["fsdp"] == "FSDP2: weights, gradients and optimizer sharded"
    assert rows["lora"] == "DDP: LoRA adapters on a frozen 16-bit base"
    assert rows["qlora"] == "DDP: LoRA adapters on a frozen 4-bit base"
    assert set(rows) >= {r.name for r in list_recipes()}


def test_unknown_recipe_lists_the_valid_names():
    with pytest.raises(DockyardError, match="unknown recipe 'zero9'.*zero2"):
        load_recipe("zero9")


@pytest.mark.parametrize("given,meant", [("zero-2", "zero2"), ("ZeRO2", "zero2"), ("Zero3", "zero3"),
                                         ("zero3offload", "zero3-offload"), ("qlor", "qlora"),
                                         ("deepspeed", "zero2 (DeepSpeed ZeRO-2)")])
def test_a_mistyped_recipe_is_answered_with_the_one_it_likely_meant(given, meant):
    """The newcomer audit: `--recipe=ZeRO2`, `zero-2` or `deepspeed` were answered with the list alone."""
    with pytest.raises(DockyardError) as e:
        load_recipe(given)
    assert str(e.value).startswith(f"unknown recipe {given!r}: did you mean {meant}? pick one of ddp, "), str(e.value)


def test_a_name_near_no_recipe_gets_the_list_alone():
    with pytest.raises(DockyardError, match=r"^unknown recipe 'sgd': pick one of ddp, fsdp, "):
        load_recipe("sgd")


def test_a_folder_without_its_recipe_yaml_is_said_to_be_one_and_the_copy_it_says_makes_it_a_recipe(tmp_path):
    """`--recipe=/tmp/mine` (a folder made for a recipe, its recipe.yaml not there yet) was "unknown recipe
    '/tmp/mine': ... or give a folder that holds a recipe.yaml", as if it were no folder. The copy it then said,
    `cp -r recipes/zero2 /tmp/mine`, put zero2/ inside the folder (which is there: that is this case), and from
    any folder but the checkout (`invoke -r`) found no recipes/: the same refusal followed. Typed where the user
    stands, the copy it says now makes the folder a recipe."""
    mine, elsewhere = tmp_path / "my recipe", tmp_path / "elsewhere"
    mine.mkdir()
    elsewhere.mkdir()
    with pytest.raises(DockyardError, match=f"the folder '{mine}' holds no recipe.yaml: copy a recipe's folder to "
                                            "start from \\(cp ") as e:
        load_recipe(str(mine))
    copy = re.search(r"\((cp [^)]*)\)", str(e.value)).group(1)
    subprocess.run(shlex.split(copy), cwd=elsewhere, check=True)
    assert load_recipe(str(mine)).strategy == load_recipe("zero2").strategy


def test_a_path_to_a_recipe_folder_with_a_slip_in_it_is_said_to_be_no_folder_and_the_one_meant_loads(tmp_path):
    """The newcomer's walk: `--recipe=/tmp/nc75min` (their folder is /tmp/nc75mine) and `--recipe=mine/recipe.yaml`
    were "unknown recipe '...': pick one of ddp, ... or give a folder that holds a recipe.yaml", as if a folder had
    been given (on a node, after run.sh had started the image). A path that is not there is said to be no folder,
    with the folder beside it that holds a recipe and was likely meant; the file, with its folder; each then loads."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "recipe.yaml").write_text("# invoke run --recipe=mine\nwhen: Mine.\nstrategy: ddp\n")
    (tmp_path / "mind").mkdir()  # a folder as close, but holding no recipe: not the one meant
    with pytest.raises(DockyardError) as e:
        load_recipe(str(tmp_path / "mien"))
    assert str(e.value).startswith(f"unknown recipe '{tmp_path}/mien': no such folder (did you mean {mine}?): give a "
                                   "folder that holds a recipe.yaml, or pick one of ddp, "), str(e.value)
    assert load_recipe(str(mine)).name == "mine"
    with pytest.raises(DockyardError, match=r"^unknown recipe '\.\./x': no such folder: give a folder that holds"):
        load_recipe("../x")
    with pytest.raises(DockyardError) as e:
        load_recipe(str(mine / "recipe.yaml"))
    assert str(e.value) == f"--recipe '{mine}/recipe.yaml' is a file: give the folder that holds it, --recipe={mine}"


def test_a_recipe_folder_outside_the_project_loads(tmp_path):
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 3}}')
    (tmp_path / "recipe.yaml").write_text("# invoke run --recipe=mine\nwhen: Mine.\nstrategy: zero3\n"
                                          "deepspeed: ds.json\n")
    r = load_recipe(tmp_path)
    assert (r.name, r.strategy, r.file(r.deepspeed)) == (tmp_path.name, "zero3", tmp_path / "ds.json")


def test_a_recipe_without_its_command_line_is_told_the_line_to_add_and_any_comment_is_one(tmp_path):
    """A recipe.yaml copied without its first line was refused with "the first line must be a comment giving the
    command that runs the recipe", and no line to write; `#invoke run ...` (no blank after the #), a comment to
    YAML and to any reader, was refused in the same words."""
    mine = tmp_path / "my recipe"
    mine.mkdir()
    (mine / "recipe.yaml").write_text("when: Mine.\nstrategy: ddp\n")
    with pytest.raises(DockyardError) as e:
        load_recipe(str(mine))
    assert f"add `# invoke run --recipe='{mine}'` as its first line" in str(e.value), e.value
    (mine / "recipe.yaml").write_text("#invoke run --recipe=mine\nwhen: Mine.\nstrategy: ddp\n")
    assert load_recipe(str(mine)).command == "invoke run --recipe=mine"


@pytest.mark.parametrize("body, problem", [
    ("strategy: zero2\ndeepspeed: ds.json\nfsdp: fsdp.yaml\n", "not both"),
    ("strategy: zero2\n", "needs `deepspeed:`"),
    ("strategy: ddp\nfsdp: fsdp.yaml\n", "takes no `fsdp:`"),
    ("strategy: zero2\ndeepspeed: ds.json\nsettings: {fsdp: true}\n", "set by the strategy file"),
    ("strategy: zero5\ndeepspeed: ds.json\n", "strategy 'zero5': is not a known strategy; give one of ddp, "),
    ("strategy: ddp\npeft: dora\n", "peft 'dora': is not a known adapter; give one of lora, qlora"),
])
def test_invalid_recipes_are_refused(tmp_path, body, problem):
    for name in ("ds.json", "fsdp.yaml"):
        (tmp_path / name).write_text("{}")
    (tmp_path / "recipe.yaml").write_text("# invoke run --recipe=x\nwhen: Never.\n" + body)
    with pytest.raises(DockyardError, match=problem):
        load_recipe(tmp_path)


def test_an_empty_settings_key_is_no_settings(tmp_path):
    """`settings:` with nothing under it (YAML's null, as an editor leaves it once the last line under it is removed)
    was refused: "settings: Input should be a valid dictionary". An empty `peft:` or `deepspeed:` stays what it means:
    none (the strategy's own rules still apply)."""
    (tmp_path / "recipe.yaml").write_text("# invoke run --recipe=mine\nwhen: Mine.\nstrategy: ddp\npeft:\nsettings:\n")
    r = load_recipe(tmp_path)
    assert (r.settings, r.peft, r.deepspeed) == ({}, None, None)
    assert resolve_settings(r, {})[0] == resolve_settings(load_recipe("ddp"), {})[0]
    (tmp_path / "recipe.yaml").write_text("# invoke run --recipe=mine\nwhen: Mine.\nstrategy: zero2\ndeepspeed:\n")
    with pytest.raises(DockyardError, match="strategy zero2 needs `deepspeed:` naming its file"):
        load_recipe(tmp_path)
    (tmp_path / "recipe.yaml").write_text("# invoke run --recipe=mine\nwhen: Mine.\nstrategy: ddp\nsettings: [1]\n")
    with pytest.raises(DockyardError, match="settings \\[1\\]: takes `key: value` entries \\(a mapping\\)"):
        load_recipe(tmp_path)


def test_qlora_under_fsdp_is_refused_in_one_line_by_the_dry_run_and_the_trainer(tmp_path):
    """A copy of recipes/fsdp with `peft: qlora` passed as a recipe: the only FSDP here is FSDP2, which loses the
    4-bit weights' quantization state when it shards them (bitsandbytes#1945), and accelerate does no
    cpu_ram_efficient_loading of a 4-bit model. The host's dry run and the trainer read the recipe alike."""
    import shutil

    from tests.support.cli import invoke_here, short_error

    mine = tmp_path / "fsdp-qlora"
    shutil.copytree(RECIPES / "fsdp", mine)
    text = (mine / "recipe.yaml").read_text().replace("strategy: fsdp\n", "strategy: fsdp\npeft: qlora\n")
    (mine / "recipe.yaml").write_text(text)
    said = "peft: qlora does not train under strategy fsdp: FSDP2, the only FSDP here, loses the 4-bit weights'"
    with pytest.raises(DockyardError, match=re.escape(said)):
        load_recipe(mine)  # what the trainer reads the recipe with
    dry = invoke_here("run", "--dry", f"--recipe={mine}")
    short_error(dry, said)
    assert "use the qlora recipe (DDP: each GPU holds the whole 4-bit base)" in dry.stderr, dry.stderr
    (mine / "recipe.yaml").write_text(text.replace("peft: qlora", "peft: lora"))
    assert load_recipe(mine).peft == "lora"


def test_overrides_are_read_as_yaml_scalars():
    assert parse_overrides(["--max_steps", "50", "--learning_rate", "1e-4", "--bf16", "--model=/m",
                            "--lora-r", "4", "--report_to", "none"]) == {
        "max_steps": 50, "learning_rate": 1e-4, "bf16": True, "model": "/m", "lora_r": 4, "report_to": "none"}
    with pytest.raises(DockyardError, match="--key value"):
        parse_overrides(["max_steps", "5"])


@pytest.mark.parametrize(("typed", "write"), [("max_steps=10", "--max_steps 10"), ("-max_steps", "--max_steps"),
                                              ("max_steps", "--max_steps"), ("run_name=a b", "--run_name 'a b'")])
def test_an_override_typed_as_a_name_is_answered_with_how_to_write_it(typed, write):
    """`invoke run -- max_steps=10` (Hydra's or a key=value habit) said "override 'max_steps=10' is not of the form
    --key value", leaving the user to work out the rest; it now says how that one is written."""
    with pytest.raises(DockyardError) as e:
        parse_overrides([typed])
    assert str(e.value) == f"override {typed!r} is not of the form --key value: write it {write}"
    with pytest.raises(DockyardError) as stray:  # a value with no name before it: no flag to make up
        parse_overrides(["--max_steps", "5", "6"])
    assert str(stray.value) == "override '6' is not of the form --key value"



def test_a_number_in_exponent_form_in_a_recipe_file_is_a_number(tmp_path):
    """YAML 1.1 (PyYAML) reads `1e-3` as text: `learning_rate: 1e-3` in a recipe was refused as "takes a finite
    number", the form the README and the command line use. A text setting keeps its text."""
    (tmp_path / "recipe.yaml").write_text("# invoke run --recipe=mine\nwhen: Mine, for a test of numbers.\n"
                                          "strategy: ddp\nsettings: {learning_rate: 1e-3, warmup_ratio: 5E-2, "
                                          "run_name: 1e-3}\n")
    settings, training = resolve_settings(load_recipe(tmp_path), {})
    assert (training["learning_rate"], training["warmup_ratio"], training["run_name"]) == (1e-3, 0.05, "1e-3")

def test_settings_layer_defaults_recipe_and_overrides():
    recipe = load_recipe("zero2")
    settings, training = resolve_settings(recipe, {"task": "seq_cls", "max_steps": 7})
    assert settings.task == "seq_cls" and settings.data_path.name == "sample-classify.jsonl"
    assert training["max_steps"] == 7 and training["learning_rate"] > 0
    assert "task" not in training and "model" not in training


def test_the_strategy_cannot_be_overridden_per_run():
    with pytest.raises(DockyardError, match="the recipe is the strategy"):
        resolve_settings(load_recipe("zero2"), {"deepspeed": "other.json"})


def test_bad_setting_values_are_named():
    with pytest.raises(DockyardError, match="task"):
        resolve_settings(load_recipe("zero2"), {"task": "translate"})


def test_recipes_folder_is_found_next_to_the_package():
    assert (RECIPES / "defaults.yaml").is_file() and "zero2" in recipe_names()


@pytest.mark.parametrize("text, says", [
    ("max_steps: [\n", "defaults.yaml is not valid YAML: expected the node content, but found '<stream end>' at line 2"),
    ("- max_steps\n- 50\n", "defaults.yaml: expected `key: value` lines"),
    ("1: 2\n", "defaults.yaml: expected `key: value` lines"),
])
def test_a_broken_defaults_file_is_one_error_line(tmp_path, monkeypatch, text, says):
    """A slip in recipes/defaults.yaml (read by every run, on the host and in the trainer) was PyYAML's ParserError
    traceback, or `ValueError: dictionary update sequence element #0` for a list, in `invoke run --dry` too."""
    from dockyard.common import run_settings

    (tmp_path / "defaults.yaml").write_text(text)
    monkeypatch.setattr(run_settings, "RECIPES", tmp_path)
    with pytest.raises(DockyardError, match=re.escape(says)) as refused:
        resolve_settings(load_recipe("ddp"), {})
    assert "\n" not in str(refused.value)


def test_a_recipe_file_that_is_not_yaml_is_one_error_line(tmp_path):
    """PyYAML's own several lines (with a caret under the column) were the refusal."""
    (tmp_path / "recipe.yaml").write_text("# invoke run --recipe=x\nwhen: [a\n")
    with pytest.raises(DockyardError, match=r"recipe.yaml is not valid YAML: expected ',' or '\]', but got "
                                            r"'<stream end>' at line 3, column 1$"):
        load_recipe(tmp_path)


def test_the_shipped_zero_recipes_keep_their_memory_to_ddps():
    """pitfalls.md: ZeRO-2 took more memory than DDP with DeepSpeed's own defaults (overlap_comm on, 5e8-element
    all-gather buckets, each a full-precision copy). The shipped ZeRO recipes keep overlap_comm off and, where they set
    it, the all-gather bucket at 2e8, as the plan's memory model counts them (dockyard/common/memory.py)."""
    import json

    zero = [r for r in list_recipes() if load_recipe(r.name).deepspeed]
    assert {r.name for r in zero} >= {"zero2", "zero2-offload", "zero3", "zero3-offload"}
    for recipe in zero:
        section = json.loads((RECIPES / recipe.name / "ds_config.json").read_text())["zero_optimization"]
        assert section["overlap_comm"] is False, recipe.name
        assert section.get("allgather_bucket_size", 2e8) <= 2e8, recipe.name
