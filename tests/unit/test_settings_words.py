"""A wrong setting, wherever it is typed, is said in our words: which setting (and where it came from), what was
given, and what it takes. pydantic's own wording ("Input should be a valid number, unable to parse string as a
number", "Extra inputs are not permitted", "Field required", "String should match pattern '^3\\.\\d{1,2}$'") is a
library's, and named nothing a user could type instead."""

from __future__ import annotations

import pytest
import yaml

from tests.support.cli import invoke_here, short_error

PYDANTIC = ("Input should", "Extra inputs", "Field required", "String should", "Value error", "unable to parse",
            "type=", "errors.pydantic.dev")


def said_in_our_words(r, *parts: str) -> None:
    short_error(r, "")
    for words in PYDANTIC:
        assert words not in r.stderr, r.stderr
    for part in parts:
        assert part in r.stderr, f"{r.stderr!r} does not say {part!r}"


@pytest.mark.parametrize("env, parts", [
    ({"INVOKE_DOCKYARD_LAYER_CACHE_GB": "lots"}, ["INVOKE_DOCKYARD_LAYER_CACHE_GB='lots'", "takes a number from 0 to"]),
    ({"INVOKE_DOCKYARD_LAYER_CACHE_GB": "-1"}, ["INVOKE_DOCKYARD_LAYER_CACHE_GB='-1'", "takes a number from 0 to"]),
])
def test_an_environment_override_of_a_wrong_type_says_what_it_takes(env, parts):
    said_in_our_words(invoke_here("recipes", env=env), *parts)


def test_a_setting_its_validator_refuses_is_quoted_once_and_short_from_a_variable_or_a_file(tmp_path, monkeypatch):
    """The docker and path settings' validators quoted the value as well as the settings' formatter: a variable was
    always said twice (`INVOKE_DOCKYARD_DOCKER='/nope': '/nope' is not an executable docker client`), whole however
    long, and a config file's once after a colon (`dockyard.docker: '/nope' is ...`), twice past 60 characters. Now
    each is `<where> '<value, short>': what is wrong; what to do`, the value once."""
    monkeypatch.delenv("INVOKE_DOCKYARD_DOCKER", raising=False)  # .ci/run sets it, and it overrides the file's
    far = "/nonexistent/" + "d" * 80
    config = tmp_path / "mine.yaml"
    config.write_text(f"dockyard:\n  docker: {far}\n  runs_dir: ' /x'\n")
    for r, quoted in ((invoke_here("recipes", env={"INVOKE_DOCKYARD_DOCKER": far}), f"INVOKE_DOCKYARD_DOCKER='{far[:40]}"),
                      (invoke_here("recipes", env={"INVOKE_DOCKYARD_DOCKER": "/nope"}), "INVOKE_DOCKYARD_DOCKER='/nope': "),
                      (invoke_here("-f", str(config), "recipes"), f"{config} dockyard.docker '{far[:40]}")):
        said_in_our_words(r, quoted, ": is not an executable docker client; give its path")
        assert r.stderr.count("/nonexistent/ddd") + r.stderr.count("'/nope'") == 1 and len(r.stderr) < 500, r.stderr
    said_in_our_words(invoke_here("-f", str(config), "recipes"),
                      f"{config} dockyard.runs_dir ' /x': begins or ends with a space")


def test_a_config_file_setting_of_a_wrong_type_names_the_file_the_value_and_what_it_takes(tmp_path):
    config = tmp_path / "mine.yaml"
    config.write_text("dockyard:\n  image_name: 3\n  hf_cache: [a, b]\n")
    said_in_our_words(invoke_here("-f", str(config), "recipes"), f"{config} dockyard.image_name 3: takes text",
                      f"{config} dockyard.hf_cache ['a', 'b']: takes a path (text)")


@pytest.mark.parametrize("typed, parts", [
    (["--dtype", "float8"], ["--dtype 'float8': takes 'auto', 'bfloat16', 'float16' or 'float32'"]),
    (["--data_format", "csv"], ["--data_format 'csv': takes 'auto', 'text'"]),
    (["--global_batch", "0"], ["--global_batch 0: takes a whole number from 1 to", ", or auto"]),
])
def test_an_override_after_the_dashes_says_what_it_takes(tmp_path, typed, parts):
    r = invoke_here("run", "--dry", "--variant=cpu", "--", *typed, env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path)})
    said_in_our_words(r, *parts)


@pytest.mark.parametrize("body, parts", [
    ("when: x\nstrategy: ddp\nstratgy: ddp\n", ["stratgy: is not a key here", "known: when, strategy,"]),
    ("strategy: ddp\n", ["when: missing"]),
    ("when: x\nstrategy: ddp\nsettings: [1]\n", ["settings [1]: takes `key: value` entries"]),
    ("when: x\nstrategy: ddp\nsettings: {dtype: float8}\n",
     ["dtype 'float8' (settings: in ", "recipe.yaml): takes 'auto', 'bfloat16'"]),
])
def test_a_recipe_file_s_wrong_key_or_value_says_what_it_takes(tmp_path, body, parts):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "recipe.yaml").write_text(f"# invoke run --recipe={folder}\n{body}")
    r = invoke_here("run", "--dry", "--variant=cpu", f"--recipe={folder}",
                    env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    said_in_our_words(r, str(folder / "recipe.yaml"), *parts)


@pytest.mark.parametrize("change, parts", [
    ({"python": "3"}, ["python '3': takes a Python 3 version"]),
    ({"os_packages": ["python3", "-oAPT::x"]}, ["os_packages.1 '-oAPT::x': takes a Debian package's name"]),
    ({"torch_archs": "8.0 sm_90"}, ["torch_archs '8.0 sm_90': takes compute capabilities"]),
])
def test_a_variants_file_s_wrong_value_says_what_it_takes(tmp_path, change, parts):
    from dockyard.settings import ROOT

    raw = yaml.safe_load((ROOT / "images" / "variants.yaml").read_text())
    raw["variants"]["cpu"].update(change)
    (tmp_path / "variants.yaml").write_text(yaml.safe_dump(raw))
    r = invoke_here("build", "--dry", "--variant=cpu",
                    env={"INVOKE_DOCKYARD_VARIANTS_FILE": str(tmp_path / "variants.yaml")})
    said_in_our_words(r, "variant 'cpu'", *parts)


def test_a_recipe_or_variants_value_its_validator_refuses_is_quoted_once_however_long(tmp_path):
    """The recipe file's strategy, peft and strategy-file checks and the variants file's form checks quoted the value
    as well as the formatter: once after a colon (`strategy: unknown strategy 'zero5'`, `python: '3': takes ...`),
    twice past 60 characters. Now `<field> '<value, short>': what is wrong; what to give`, the value once."""
    from dockyard.settings import ROOT

    long = "zero" + "9" * 80
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "recipe.yaml").write_text(f"# invoke run --recipe={folder}\nwhen: x\nstrategy: {long}\n")
    r = invoke_here("run", "--dry", "--variant=cpu", f"--recipe={folder}",
                    env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    said_in_our_words(r, f"strategy '{long[:40]}", ": is not a known strategy; give one of ddp, ")
    assert r.stderr.count("zero999") == 1, r.stderr
    raw = yaml.safe_load((ROOT / "images" / "variants.yaml").read_text())
    raw["variants"]["cpu"]["python"] = "3." + "7" * 80
    (tmp_path / "variants.yaml").write_text(yaml.safe_dump(raw))
    r = invoke_here("build", "--dry", "--variant=cpu",
                    env={"INVOKE_DOCKYARD_VARIANTS_FILE": str(tmp_path / "variants.yaml")})
    said_in_our_words(r, "python '3.777", ": takes a Python 3 version")
    assert r.stderr.count("3.777") == 1, r.stderr


def test_a_number_too_long_to_write_out_is_said_by_its_length_not_a_traceback():
    """A value past Python's 4,300 digits cannot be repr'd (ValueError): the message that quotes it raised instead."""
    import sys

    from pydantic import ValidationError

    from dockyard.common import errors
    from dockyard.common.run_settings import RunSettings

    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        huge = 10**5000
    finally:
        sys.set_int_max_str_digits(limit)
    with pytest.raises(ValidationError) as e:
        RunSettings(max_seq_length=huge)
    [(name, given, takes)] = errors.problem_list(e.value, model=RunSettings)
    assert name == "max_seq_length" and "a number of about 5001 digits" in given and takes.startswith("takes ")


def test_a_yaml_file_holding_a_number_of_thousands_of_digits_is_said_in_our_words(tmp_path):
    """PyYAML reads digits with int(), which past 4,300 refuses in Python's words: a recipe or config file holding
    such a number was "is not valid YAML: Exceeds the limit (4300 digits) for integer string conversion: value has
    5000 digits; use sys.set_int_max_str_digits() to increase the limit", advice for a programmer. Now as JSON's
    (errors.loads): "a number of more digits than can be read (4,300)"."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "recipe.yaml").write_text(f"# invoke run --recipe={folder}\nwhen: x\nstrategy: ddp\nsettings:\n"
                                        f"  max_steps: {'7' * 5000}\n")
    config = tmp_path / "mine.yaml"
    config.write_text(f"dockyard:\n  layer_cache_gb: {'7' * 5000}\n")
    env = {"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")}
    for r, where in ((invoke_here("run", "--dry", "--variant=cpu", f"--recipe={folder}", env=env), folder / "recipe.yaml"),
                     (invoke_here("-f", str(config), "recipes", env=env), config)):
        said_in_our_words(r, f"{where} is not valid YAML: a number of more digits than can be read (4,300)")
        assert "set_int_max_str_digits" not in r.stderr, r.stderr
