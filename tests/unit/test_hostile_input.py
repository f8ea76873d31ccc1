"""Bad or hostile input gets a short refusal before anything is made: no traceback, nothing half-done (issue 11).

Property-based where the input is open-ended (hypothesis); everything here is real code, no engine needed
(docker is never reached: each refusal comes before it).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from dockyard import engine
from dockyard.common import recipes
from dockyard.common.errors import DockyardError
from dockyard.images import build
from dockyard.launch import run as launch_run
from dockyard.settings import ROOT, Settings, load
from dockyard.transport import commit, inventory
from dockyard.transport import load as load_mod
from tests.support.cli import invoke, invoke_here, short_error

DOCKER_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]+")  # docker's container-name rule; the run id names one


# --- through the real CLI: what a user types -------------------------------------------------------

def test_trainer_overrides_reach_the_trainer_as_the_user_quoted_them():
    r = invoke("run", "--dry", "--variant=cpu", "--", "--run_name", "a b", "--hub_model_id", "it's")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert "--run_name 'a b' --hub_model_id 'it'\"'\"'s'" in r.stderr  # quoting kept (the echo is on stderr)


@pytest.mark.parametrize("args,says", [
    (["--run-id=a b:c"], "--run-id 'a b:c'"),
    (["--run-id=-q"], "--run-id '-q'"),  # a dash first: not read as a flag
    (["--run-id=" + "a" * 129], "--run-id 'aaaaaaaaaaaa...aaaaaaaaaaaaa' is 129 characters: use at most 128"),
    (["--run-id=" + "é" * 300], "use letters, digits, '_', '.' and '-', starting with a letter or digit, at most 128"),
    (["--recipe=../x"], "unknown recipe '../x'"),
    # `--data=$DATA` with DATA unset trained on the sample data; `--recipe=$R`, the default recipe
    (["--data="], "--data= is given no value (a variable left unset?): give it one, or leave --data out"),
    (["--recipe", ""], "--recipe= is given no value"),
])
def test_bad_run_values_are_refused_before_anything_is_made(args, says, tmp_path):
    r = invoke("run", "--dry", "--variant=cpu", *args, env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    assert r.returncode != 0
    assert says in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "runs").exists()


def broken_recipe(tmp_path, ds_config: str):
    folder = tmp_path / "zero2-broken"
    shutil.copytree(ROOT / "recipes" / "zero2", folder)
    (folder / "ds_config.json").write_text(ds_config)
    return folder


@pytest.mark.parametrize("ds_config,says", [
    ('{"zero_optimization": {"stage": 2},', "is not valid JSON"),
    ('{"zero_optimisation": {"stage": 2}}', "unknown DeepSpeed key(s) zero_optimisation"),
    ('[1, 2]', "expected a JSON object"),
    ('{"zero_optimization": {"stage": "two"}}', "zero_optimization.stage 'two': takes 0, 1, 2 or 3"),
    ('{"zero_optimization": {"stage": NaN}}', "zero_optimization.stage nan: takes 0, 1, 2 or 3"),
    ('{"zero_optimization": {"stage": 4}}', "zero_optimization.stage 4: takes 0, 1, 2 or 3"),
    ('{"zero_optimization": [2]}', "zero_optimization [2]: takes an object of ZeRO settings"),
    # each passed the host's checks, then the trainer stopped with the Trainer's AttributeError traceback
    ('{"optimizer": "adam"}', 'optimizer \'adam\': takes an object of settings, as in "optimizer": {"type": "AdamW"'),
    ('{"bf16": true}', 'bf16 True: takes an object of settings, as in "bf16": {"enabled": "auto"}'),
    ('{"scheduler": {"type": "WarmupLR", "params": "fast"}}', "scheduler.params 'fast': takes an object of settings"),
    # a file that says another strategy than the recipe's: the run stopped once the model had loaded on every GPU
    ('{"zero_optimization": {"stage": 3}}', "zero_optimization.stage is 3, zero2 is stage 2"),
    ('{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}',
     "zero_optimization.offload_optimizer.device is 'cpu', zero2 keeps it on the GPU"),
    # json keeps the last of a key set twice, without a word
    ('{"zero_optimization": {"stage": 2, "overlap_comm": true, "stage": 3}}', "'stage' is set twice in one object"),
    # a key set twice whose name holds the words of Python's digit-limit error: said as a number of too many digits
    ('{"zero_optimization": {"stage": 2}, "integer string conversion": 1, "integer string conversion": 2}',
     "'integer string conversion' is set twice in one object"),
    # NVMe offload passed as "no offload" (only "cpu" was one): the strategy check stopped the run once loaded
    ('{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}}}',
     'zero_optimization.offload_optimizer.device "nvme": no strategy here offloads to NVMe'),
    ('{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "disk"}}}',
     'zero_optimization.offload_optimizer.device "disk": DeepSpeed takes "none", "cpu" or "nvme"'),
    # DeepSpeed's AssertionError on every rank, once the model had loaded: "untested ZeRO Optimizer"
    ('{"zero_optimization": {"stage": 2}, "optimizer": {"type": "SGD", "params": {"lr": "auto", "momentum": 0.9}}}',
     'optimizer.type "SGD": ZeRO trains with Adam, AdamW, Adagrad, Lion or Muon'),
    ('{"zero_optimization": {"stage": 2}, "optimizer": {"type": "LBFGS"}}', 'optimizer.type "LBFGS": ZeRO trains with'),
    ('{"zero_optimization": {"stage": 2}, "optimizer": {"type": "Lamb"}}',
     '"zero_allow_untested_optimizer": true to the file to train with it anyway'),
])
def test_a_broken_ds_config_is_refused_by_the_host(ds_config, says, tmp_path):
    folder = broken_recipe(tmp_path, ds_config)
    with pytest.raises(DockyardError, match="ds_config.json"):
        recipes.load_recipe(folder)
    r = invoke("run", "--dry", "--variant=cpu", f"--recipe={folder}")
    assert r.returncode != 0 and says in r.stderr and "Traceback" not in r.stderr
    assert "docker run" not in r.stdout + r.stderr


@pytest.mark.parametrize("edit,says", [
    (("fsdp: true", "fsdp: false"), "fsdp False: write `fsdp: true`"),
    (("fsdp: true", "fsdp: full_shard auto_wrap"), "fsdp 'full_shard auto_wrap': write `fsdp: true`"),
    (("version: 2", "version: 1"), "fsdp_config version 1: the fsdp strategy is FSDP2"),
    # a key transformers does not read was dropped without a word: a misspelt one, or accelerate's name for the
    # offload (its config files' fsdp_offload_params), which trained with the weights on the GPU, out of memory
    (("version: 2", "version: 2\n  reshard_after_forwrd: false"),
     "fsdp_config.reshard_after_forwrd: not a setting transformers reads (did you mean reshard_after_forward?)"),
    (("version: 2", "version: 2\n  fsdp_offload_params: true"),
     "fsdp_config.fsdp_offload_params: not a setting transformers reads (accelerate's name: write cpu_offload)"),
])
def test_an_fsdp_file_that_is_not_fsdp2_is_refused_by_the_host(edit, says, tmp_path):
    """`fsdp: false` trained with DDP until the strategy check stopped it, once the model had loaded on every GPU;
    FSDP1 the same way. A key of fsdp_config that transformers does not read was dropped silently."""
    folder = tmp_path / "fsdp-mine"
    shutil.copytree(ROOT / "recipes" / "fsdp", folder)
    (folder / "fsdp.yaml").write_text((folder / "fsdp.yaml").read_text().replace(*edit))
    with pytest.raises(DockyardError, match="fsdp.yaml"):
        recipes.load_recipe(folder)
    r = invoke("run", "--dry", "--variant=cpu", f"--recipe={folder}")
    assert r.returncode != 0 and says in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("written,says", [
    (lambda t: t.replace("version: 2", "version: 2\n  " + "k" * 1000 + ": false"),
     "fsdp_config." + "k" * 57 + "...: not a setting"),
    (lambda t: t + "k" * 1000 + ": 1\n", "belong here, not " + "k" * 117 + "..."),
    (lambda t: t.replace("fsdp: true", "fsdp: " + "k" * 5000), "fsdp '" + "k" * 56 + "...: write `fsdp: true`"),
    (lambda t: t.split("fsdp_config:")[0] + "fsdp_config: " + "k" * 5000 + "\n",
     "fsdp_config '" + "k" * 56 + "...: takes `key: value` lines"),
])
def test_an_fsdp_file_says_a_key_or_value_of_thousands_of_characters_by_its_start(written, says, tmp_path):
    """The refusals of a recipe's FSDP file said the key or value at fault whole: a key of 1,000 characters (YAML's
    most) under fsdp_config or beside it, a value of fsdp or fsdp_config of thousands, was written out in full in the
    one line of the error. Each is now said by its start, as the other readers say what a user gave (errors.short,
    errors.cut)."""
    folder = tmp_path / "fsdp-mine"
    shutil.copytree(ROOT / "recipes" / "fsdp", folder)
    (folder / "fsdp.yaml").write_text(written((folder / "fsdp.yaml").read_text()))
    with pytest.raises(DockyardError) as refused:
        recipes.load_recipe(folder)
    assert says in str(refused.value) and len(str(refused.value)) < 500, str(refused.value)[:600]


def test_the_fsdp_config_keys_the_host_takes_are_those_the_installed_transformers_reads():
    """recipes.FSDP_KEYS against TrainingArguments' own reading of fsdp_config (its source: what it gets, indexes or
    sets a default for), so a newer transformers' key is not refused, nor a dropped one taken."""
    import inspect

    from transformers import TrainingArguments

    source = inspect.getsource(TrainingArguments)
    read = set(re.findall(r'(?<!_)fsdp_config(?:\.get\(|\[|\.setdefault\()"(\w+)"', source))
    assert read and read == set(recipes.FSDP_KEYS), read ^ set(recipes.FSDP_KEYS)
    assert not set(recipes.FSDP_RENAMED) & read and set(recipes.FSDP_RENAMED.values()) <= read


@pytest.mark.parametrize("settings,says", [
    ("  learning_rate: 1.0e-4\n  max_steps: 5\n  learning_rate: 1.0\n",
     "'learning_rate' is set twice (keep one: the second would silently replace the first) at line 8"),
    # a merge is overridden by the mapping's own keys, as YAML means it: not a key set twice
    ("  <<: {max_steps: 5, learning_rate: 1.0}\n  learning_rate: 1.0e-4\n", ""),
])
def test_a_key_set_twice_in_a_recipe_is_refused_naming_its_line(settings, says, tmp_path):
    """PyYAML keeps the last of a key set twice: a second `learning_rate:` further down trained at that rate."""
    folder = broken_recipe(tmp_path, (ROOT / "recipes" / "zero2" / "ds_config.json").read_text())
    text = (folder / "recipe.yaml").read_text()
    (folder / "recipe.yaml").write_text(text.split("settings:")[0] + "settings:\n" + settings)
    if not says:
        assert recipes.load_recipe(folder).settings == {"max_steps": 5, "learning_rate": 1e-4}
        return
    with pytest.raises(DockyardError, match="recipe.yaml is not valid YAML"):
        recipes.load_recipe(folder)
    r = invoke("run", "--dry", "--variant=cpu", f"--recipe={folder}")
    assert r.returncode != 0 and says in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_recipe_naming_a_file_outside_its_folder_is_refused(tmp_path):
    folder = broken_recipe(tmp_path, (ROOT / "recipes" / "zero2" / "ds_config.json").read_text())
    shutil.copytree(ROOT / "recipes" / "zero3", tmp_path / "zero3")
    (folder / "recipe.yaml").write_text((folder / "recipe.yaml").read_text().replace(
        "deepspeed: ds_config.json", "deepspeed: ../zero3/ds_config.json"))
    with pytest.raises(DockyardError, match="is not the name of a file in the recipe folder"):
        recipes.load_recipe(folder)


def test_a_recipe_folder_holding_a_loop_of_links_is_one_error(tmp_path):
    folder = broken_recipe(tmp_path, (ROOT / "recipes" / "zero2" / "ds_config.json").read_text())
    (folder / "a").symlink_to("b")
    (folder / "b").symlink_to("a")
    r = invoke("run", "--dry", "--variant=cpu", f"--recipe={folder}")
    assert r.returncode != 0 and "a is a link that leads back to itself" in r.stderr and "Traceback" not in r.stderr


def test_a_data_folder_linking_to_a_file_outside_it_is_refused_before_the_run(tmp_path):
    """The folder alone is mounted into the run: its link pointed at nothing there, and the run failed after the
    container started ("the folder holds no .jsonl"), leaving a run folder behind."""
    (tmp_path / "elsewhere.jsonl").write_text('{"text": "a document"}\n')
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")
    r = invoke("run", "--dry", "--variant=cpu", "--recipe=ddp", f"--data={tmp_path / 'data'}",
               env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    assert r.returncode != 0 and "train.jsonl is a link to" in r.stderr and "outside the folder" in r.stderr, r.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_every_shipped_recipe_passes_the_host_check():
    assert len(recipes.list_recipes()) >= 8


# --- run ids ---------------------------------------------------------------------------------------

@hsettings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_a_run_id_is_refused_or_is_a_valid_container_name_and_folder(run_id):
    s = Settings(runs_dir="/nonexistent/runs")
    try:
        d = launch_run.new_run_dir(s, "zero2", run_id, resume=False)
    except DockyardError as e:
        assert "--run-id" in str(e)
        return
    assert DOCKER_NAME.fullmatch(f"dockyard-{d.name}") and d.name[0].isalnum()
    assert d.parent == s.path(s.runs_dir)  # a plain folder under runs/, never beside or above it


def test_the_default_run_id_of_a_recipe_folder_is_a_valid_name():
    d = launch_run.new_run_dir(Settings(runs_dir="/nonexistent/runs"), str(ROOT / "recipes" / "zero2"), "", False)
    assert d.name.startswith("zero2-") and DOCKER_NAME.fullmatch(f"dockyard-{d.name}")


# --- references ------------------------------------------------------------------------------------

@given(st.text(max_size=30))
def test_a_reference_is_refused_or_cannot_be_read_as_an_option(ref):
    try:
        assert engine.reference(ref) == ref
    except DockyardError:
        return
    assert ref and not ref.startswith("-") and not any(c.isspace() for c in ref)


@pytest.mark.parametrize("container,tag", [("--help", ""), ("c1", "-q"), ("", "")])
def test_commit_refuses_what_is_not_a_reference_before_docker(container, tag, monkeypatch):
    monkeypatch.setattr(engine, "run", lambda *a, **k: pytest.fail(f"docker was called: {a}"))
    with pytest.raises(DockyardError):
        commit.commit(Settings(), container, tag=tag)


def test_image_inspect_never_passes_an_option_to_docker(monkeypatch):
    monkeypatch.setattr(engine, "run", lambda *a, **k: pytest.fail(f"docker was called: {a}"))
    with pytest.raises(DockyardError, match="not a docker reference"):
        engine.image_inspect(Settings(), "--format={{.Id}}")


# --- settings and the engine's host ------------------------------------------------------------------

@pytest.mark.parametrize("value", ["inf", "nan", "lots"])
def test_a_layer_cache_size_that_is_not_a_number_is_a_settings_error(value, monkeypatch):
    monkeypatch.delenv("INVOKE_DOCKYARD_LAYER_CACHE_GB", raising=False)  # the suite's own cap would win over invoke.yaml
    with pytest.raises(DockyardError, match="layer_cache_gb"):
        load({"layer_cache_gb": value})


def test_the_memlock_note_reads_no_local_pid_file_for_a_remote_engine(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "tcp://198.18.0.1:2375")
    monkeypatch.setattr(engine, "Path", lambda p: pytest.fail(f"read {p} for a remote engine"))
    assert engine.daemon_memlock_hard_limit() is None


# --- the image's source label ------------------------------------------------------------------------

def git_repo(tmp_path, origin: str | None):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    if origin is not None:
        subprocess.run(["git", "-C", str(tmp_path), "remote", "add", "origin", origin], check=True)
    return tmp_path


@pytest.mark.parametrize("origin,label", [
    ("https://user:ghp_secret@example.org/team/dockyard.git", "https://example.org/team/dockyard.git"),
    ("git@example.org:team/dockyard.git", "git@example.org:team/dockyard.git"),
    ("/srv/git/dockyard", ""),
    ("file:///srv/git/dockyard", ""),
    (None, ""),
])
def test_the_source_label_is_the_remote_without_credentials_or_nothing(origin, label, tmp_path):
    assert build.repository_url(git_repo(tmp_path, origin)) == label


def test_an_image_built_from_a_checkout_without_remote_carries_no_local_path(monkeypatch):
    monkeypatch.setattr(build, "repository_url", lambda root=ROOT: "")
    from dockyard.images import variants

    s = Settings()
    argv = build.build_steps(s, variants.resolve(s, "cpu")[0]).steps[0][0]
    assert not [a for a in argv if "org.opencontainers.image.source" in a or str(ROOT) + "=" in a]


# --- archive manifests -------------------------------------------------------------------------------

GOOD = {"archive_sha256": "a" * 64, "archive_bytes": 10, "tar_bytes": 20,
        "images": [{"ref": "t:1", "tags": ["t:1"], "id": "sha256:" + "b" * 64, "diff_ids": []}], "thin": None}


@pytest.mark.parametrize("raw,says", [
    (b"{not json", "Invalid JSON"),
    (b"[]", "manifest"),
    (json.dumps({**GOOD, "images": []}).encode(), "images"),
    # 301 images: 37 s of asking the engine about each, then a refusal of 10 kB in one line
    (json.dumps({**GOOD, "images": GOOD["images"] * 301}).encode(), "takes at most 64 entries"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "tar_bytes"}).encode(), "tar_bytes"),
    (json.dumps({**GOOD, "archive_bytes": "10 MB"}).encode(), "archive_bytes"),
    # as load.sh reads them: a JSON number of at most 18 digits ("17920" was taken here, refused there)
    (json.dumps({**GOOD, "tar_bytes": "17920"}).encode(), "tar_bytes '17920': takes a whole number"),
    (json.dumps({**GOOD, "tar_bytes": 10**30}).encode(), "tar_bytes 1000000000000000000000000000000: takes less than 1,000,000,"),
    (json.dumps({**GOOD, "images": [{**GOOD["images"][0], "tags": ["-q"]}]}).encode(), "not a docker reference"),
    (json.dumps({**GOOD, "thin": {"requires": 5}}).encode(), "thin.requires"),
    (json.dumps({**GOOD, "thin": {"requires": [["a"]]}}).encode(), "thin.requires"),
    (json.dumps({**GOOD, "thin": {"requires": "sha256:" + "c" * 64}}).encode(), "thin.requires"),
    (json.dumps({**GOOD, "thin": {"requires": ["sha256:abc"]}}).encode(), "thin.requires"),
    (json.dumps({**GOOD, "thin": ["sha256:" + "c" * 64]}).encode(), "thin"),
])
def test_a_manifest_we_did_not_write_is_refused_with_what_is_wrong(raw, says):
    with pytest.raises(DockyardError, match="is not a manifest") as e:
        load_mod.read_manifest(raw, "x.manifest.json")
    assert says in str(e.value)


def test_a_manifest_we_write_keeps_every_field():
    thin = {"for": "node.json", "target_host": "n2", "omitted": ["sha256:" + "d" * 64], "requires": ["sha256:" + "c" * 64]}
    extra = {**GOOD, "format": 1, "layers": [{"bytes": 3}], "thin": thin}
    m = load_mod.read_manifest(json.dumps(extra).encode(), "x")
    assert m["layers"] == [{"bytes": 3}] and m["thin"] == thin


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                        max_size=3), max_leaves=12)


@hsettings(max_examples=300, deadline=None)
@given(st.one_of(json_values, st.fixed_dictionaries({k: json_values for k in GOOD})))
def test_any_json_is_a_manifest_or_a_refusal(value):
    try:
        m = load_mod.read_manifest(json.dumps(value).encode(), "x")
    except DockyardError:
        return
    assert isinstance(m["tar_bytes"], int) and m["images"]


# --- inventories: a file from another node, or what a node sends over ssh ------------------------------------------

DIGESTS = st.sampled_from(["sha256:" + c * 64 for c in "0af"] + ["sha256:x", "", "-q", "sha256:" + "A" * 64])
GOOD_INVENTORY = {"format": inventory.INVENTORY_FORMAT, "host": "n7", "engine": {"store": "classic"},
                  "chain_ids": ["sha256:" + "0" * 64]}


def inventory_like():
    """Inventories with every field present, each field an arbitrary value or a plausible one."""
    plausible = {"format": st.sampled_from([inventory.INVENTORY_FORMAT, "dockyard-inventory/2"]),
                 "host": st.text(max_size=8),
                 "engine": st.fixed_dictionaries({"store": st.sampled_from(["classic", "containerd", "zfs"])}),
                 "chain_ids": st.lists(DIGESTS, max_size=3)}
    return st.fixed_dictionaries({k: st.one_of(v, json_values) for k, v in plausible.items()})


@hsettings(max_examples=300, deadline=None)
@given(st.one_of(json_values, inventory_like()), st.binary(max_size=40))
def test_any_inventory_file_is_an_inventory_or_a_refusal(tmp_path_factory, value, garbage):
    path = tmp_path_factory.mktemp("inv") / "n.json"
    for content in (json.dumps(value).encode(), garbage):
        path.write_bytes(content)
        try:
            inv = inventory.read_inventory(path)
        except DockyardError as e:
            assert str(path) in str(e)
            continue
        assert inv["engine"]["store"] in ("classic", "containerd")
        assert all(re.fullmatch(r"sha256:[0-9a-f]{64}", c) for c in inv["chain_ids"])
        images = [{"diff_ids": ["sha256:" + "0" * 64], "chain_ids": ["sha256:" + "0" * 64]}]
        assert inventory.omission(images, inv).diff_ids <= {"sha256:" + "0" * 64}


docker_inspect_like = st.lists(st.fixed_dictionaries({
    "Id": st.one_of(st.text(max_size=8), json_values),
    "RepoTags": st.one_of(st.none(), st.lists(st.text(max_size=8), max_size=2), json_values),
    "RootFS": st.one_of(st.fixed_dictionaries({"Layers": st.one_of(st.none(), st.lists(DIGESTS, max_size=3))}),
                        json_values)}), max_size=3)
docker_info_like = st.fixed_dictionaries({"ServerVersion": st.one_of(st.text(max_size=8), json_values),
                                          "DriverStatus": st.one_of(st.none(), json_values,
                                                                    st.lists(st.lists(st.text(max_size=30),
                                                                                      max_size=3), max_size=2))})


@hsettings(max_examples=300, deadline=None)
@given(st.one_of(json_values, docker_info_like), st.one_of(json_values, docker_inspect_like), st.binary(max_size=20))
def test_whatever_a_node_sends_for_its_inventory_is_an_inventory_or_a_refusal_naming_it(info, inspected, garbage):
    for sent in ((json.dumps(info).encode(), json.dumps(inspected).encode()), (garbage, garbage)):
        try:
            inv = inventory.inventory_from_json(*sent, host="node7")
        except DockyardError as e:
            assert "node7" in str(e)
            continue
        assert inv["host"] == "node7" and all(isinstance(c, str) for c in inv["chain_ids"])


# --- recipe files ------------------------------------------------------------------------------------------------

RECIPE_KEYS = {"when": st.text(max_size=10), "strategy": st.sampled_from(["zero2", "ddp", "fsdp", "zero9"]),
               "peft": st.sampled_from(["lora", "qlora", "dora"]), "deepspeed": st.sampled_from(["ds_config.json",
               "../zero3/ds_config.json", "missing.json", "recipe.yaml"]), "fsdp": st.text(max_size=8),
               "settings": st.dictionaries(st.sampled_from(["learning_rate", "deepspeed", "model"]), json_values,
                                           max_size=2), "name": st.text(max_size=4)}
yaml_scalars = st.sampled_from(["2001-02-30", "0x_", "!!float x", "!!timestamp x", "&a [*a]", "[" * 200, "{a: [}",
                                "!!python/object:os.system x", "\x00", "~", "- a\n- b"])


@hsettings(max_examples=300, deadline=None)
@given(st.one_of(
    st.text(max_size=60),
    yaml_scalars,
    st.dictionaries(st.sampled_from(sorted(RECIPE_KEYS)), json_values, max_size=4).map(json.dumps),
    st.fixed_dictionaries({}, optional=RECIPE_KEYS).map(json.dumps),
    st.tuples(st.sampled_from(sorted(RECIPE_KEYS)), yaml_scalars).map(lambda kv: f"{kv[0]}: {kv[1]}")))
def test_any_recipe_file_is_a_recipe_or_a_refusal(tmp_path_factory, body):
    folder = tmp_path_factory.mktemp("recipe")
    shutil.copy(ROOT / "recipes" / "zero2" / "ds_config.json", folder)
    for text in (body, "# invoke run --recipe=x\n" + body):
        (folder / "recipe.yaml").write_text(text, errors="surrogateescape")
        try:
            r = recipes.load_recipe(folder)
        except DockyardError:
            continue
        assert r.strategy in recipes.STRATEGIES and r.folder == folder.resolve()
        assert all((r.folder / f).resolve().parent == r.folder for f in (r.deepspeed, r.fsdp) if f)


# --- trainer overrides (after `--`) --------------------------------------------------------------------------------

override_words = st.one_of(st.text(max_size=12), st.sampled_from(["--max_steps", "--lora_r", "--task", "--data",
                                                                  "--deepspeed", "--eval_fraction", "--x=1", "--"]),
                           yaml_scalars)


@hsettings(max_examples=300, deadline=None)
@given(st.lists(override_words, max_size=6))
def test_any_trainer_overrides_are_settings_or_a_refusal(argv):
    from dockyard.common.overrides import parse_overrides
    from dockyard.common.run_settings import resolve_settings

    try:
        overrides = parse_overrides(argv)
        settings, rest = resolve_settings(recipes.load_recipe("zero2"), overrides)
    except DockyardError:
        return
    assert set(overrides) <= set(type(settings).model_fields) | set(rest)


# --- where a command writes: a file in the way, a folder it may not write ------------------------------------------

@pytest.fixture
def a_file(tmp_path):
    f = tmp_path / "a-file"
    f.write_text("not a folder\n")
    return f


@pytest.mark.parametrize("task", [["slurm"], ["run", "--native", "--variant=cpu"]])
def test_a_runs_folder_under_a_file_is_one_error_naming_it(a_file, task):
    r = invoke_here(*task, env={"INVOKE_DOCKYARD_RUNS_DIR": f"{a_file}/runs"})
    short_error(r, f"{a_file}/runs")
    said = "Not a directory" if task[0] == "slurm" else f"{a_file} is a file, not a folder"  # run: before it makes any
    assert said in r.stderr and "INVOKE_DOCKYARD_RUNS_DIR" in r.stderr
    assert a_file.read_text() == "not a folder\n"


@pytest.mark.parametrize("dry", [["--dry"], []])
def test_a_hugging_face_cache_that_is_a_file_is_refused_by_a_dry_run_as_by_the_run(a_file, tmp_path, dry):
    """`--dry` passed an hf_cache setting naming a file, which the run itself refused."""
    r = invoke_here("run", *dry, "--native", "--variant=cpu",
                    env={"INVOKE_DOCKYARD_HF_CACHE": str(a_file), "INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    short_error(r, str(a_file))
    assert "INVOKE_DOCKYARD_HF_CACHE" in r.stderr and not (tmp_path / "runs").exists()


def test_a_slurm_script_under_a_file_is_one_error_and_into_a_folder_is_written_there(tmp_path, a_file):
    runs = {"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")}
    r = invoke_here("slurm", f"--out={a_file}/x.sbatch", env=runs)
    short_error(r, str(a_file))
    assert f"{a_file} is a file, not a folder" in r.stderr and a_file.read_text() == "not a folder\n"
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    r = invoke_here("slurm", f"--out={jobs}", env=runs)
    assert r.returncode == 0, r.stderr
    assert (jobs / "zero2-2n.sbatch").read_text() == r.stdout and f"written to {jobs / 'zero2-2n.sbatch'}" in r.stderr


def test_a_slurm_script_in_a_folder_it_may_not_write_is_one_error_and_nothing_is_left(tmp_path, monkeypatch):
    closed = tmp_path / "closed"
    closed.mkdir()
    closed.chmod(0o500)
    if os.geteuid() == 0:  # root writes anyway: the refusal a read-only file system gives
        real = os.open

        def read_only(path, flags, *args, **kw):
            if flags & os.O_CREAT:
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
            return real(path, flags, *args, **kw)

        monkeypatch.setattr(os, "open", read_only)
    r = invoke_here("slurm", f"--out={closed}/x.sbatch", env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    monkeypatch.undo()
    short_error(r, f"{closed}/x.sbatch")
    assert "cannot write the script" in r.stderr and ("Permission denied" in r.stderr or "Read-only" in r.stderr)
    assert list(closed.iterdir()) == []


def test_an_export_under_a_file_is_one_error_naming_it(tmp_path, a_file):
    run = tmp_path / "runs" / "n1"
    (run / "model").mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"run_id": "n1", "status": "completed", "variant": "native"}))
    r = invoke_here("export", "--run=n1", "--native", f"--out={a_file}/x",
                    env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    short_error(r, f"{a_file}/x")
    assert f"{a_file} is a file, not a folder" in r.stderr and a_file.read_text() == "not a folder\n"


# --- small files read whole: a pipe, a device, a file of gigabytes, JSON nested past Python's stack ----------------

def archive_set(tmp_path, **files: str):
    """An archive set whose small files (a.sha256, a.manifest.json) are links to the paths given, or pipes."""
    (tmp_path / "a.tar.zst").write_bytes(b"")
    for name, target in {"a_sha256": "", "a_manifest_json": "", **files}.items():
        path = tmp_path / name.replace("_", ".")
        if target == "fifo":
            os.mkfifo(path)
        elif target:
            path.symlink_to(target)
        else:
            path.write_text("{}")
    return str(tmp_path / "a.tar.zst")


@pytest.mark.parametrize("args,env,says", [
    # /dev/zero never ends: read whole, each was a MemoryError traceback after all of the host's memory; a pipe
    # no one writes waited for ever
    (lambda t: ["load", f"--file={archive_set(t, a_sha256='/dev/zero')}"], {},
     "a.sha256: not a plain file (a pipe, device or socket); give the checksum file (.sha256) itself"),
    (lambda t: ["load", f"--file={archive_set(t, a_manifest_json='fifo')}"], {},
     "a.manifest.json: not a plain file (a pipe, device or socket); give the archive manifest"),
    (lambda t: ["doctor"], {"DOCKYARD_NVML_REPLAY": "/dev/zero"}, "/dev/zero: not a plain file"),
    (lambda t: ["run", "--dry"], {"INVOKE_DOCKYARD_VARIANTS_FILE": "/dev/zero"}, "give the variants file itself"),
    (lambda t: ["doctor"], {"DOCKYARD_NVML_REPLAY": "DEEP"}, "is not valid JSON: nested too deeply to read"),
    (lambda t: ["run", "--dry", f"--recipe={broken_recipe(t, '[' * 200_000)}"], {}, "nested too deeply to read"),
    (lambda t: ["load", f"--file={archive_set(t, a_manifest_json=str(t / 'big.json'))}"], {},
     "a.manifest.json: more than 16 MiB, more than any archive manifest (.manifest.json) holds"),
])
def test_a_small_file_that_is_a_pipe_a_device_too_big_or_too_deep_is_one_error(tmp_path, args, env, says):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000)
    with open(tmp_path / "big.json", "wb") as f:
        f.truncate(17 << 20)  # sparse: 17 MiB of NUL that take no disk
    env = {k: str(deep) if v == "DEEP" else v for k, v in env.items()}
    short_error(invoke(*args(tmp_path), env=env, timeout=60), says)


def test_an_inventory_that_is_a_device_is_one_error():
    """`invoke save --thin-for=/dev/zero` (read after the engine is asked for the image)."""
    with pytest.raises(DockyardError, match=r"/dev/zero: not a plain file .*; give the inventory"):
        inventory.read_inventory(Path("/dev/zero"))


@pytest.mark.parametrize("args,env,says", [
    (["k8s", "--recipe=ddp", "--nodes=2"], {"INVOKE_DOCKYARD_IMAGE_NAME": "a..b"}, "a docker repository name"),
    (["k8s", "--recipe=ddp", "--nodes=2"], {"INVOKE_DOCKYARD_IMAGE_NAME": "a___b"}, "a docker repository name"),
    (["build", "--dry", "--variant=cpu"], {"INVOKE_DOCKYARD_WHEELHOUSE_DIR": "/etc/passwd"},
     "/etc/passwd is a file, not a folder; set wheelhouse_dir"),
    (["plan", "--model=8B", "--gpus=1", "--gpu-mem=1e-300"], {}, "--gpu-mem=1e-300: it is in GiB"),
])
def test_values_a_dry_run_took_and_the_real_command_would_not_are_refused(args, env, says, tmp_path):
    """a..b was written into k8s manifests as the image docker then refused ("invalid reference format"); build --dry
    printed commands under /etc/passwd/; plan planned a GPU of 0 bytes ("no recipe fits")."""
    r = invoke_here(*args, env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs"), **env})
    short_error(r, says)


@pytest.mark.parametrize("args", [["save", "--out={out}"], ["k8s", "--recipe=ddp", "--nodes=2", "--out={out}"],
                                  ["slurm", "--recipe=ddp", "--nodes=2", "--out={out}/job.sbatch"],
                                  ["export", "--run=r1", "--out={out}"], ["load", "--file={out}/x.tar.zst"],
                                  ["ship", "--file={out}/x.tar.zst", "--to=ssh://127.0.0.1/tmp/x"],
                                  ["inventory", "--out={out}"], ["inventory", "--out={out}/"],
                                  ["inventory", "--out={out}/x.json"]])
def test_an_out_folder_through_a_loop_of_links_is_one_line_not_a_traceback(args, tmp_path):
    """--out=~/proj/out where ~/proj -> ~/scratch -> ~/proj (a link made twice): invoke save, k8s, slurm and export
    follow the user's links on the way (Path.resolve), and a loop ended them in pathlib's 'RuntimeError: Symlink loop
    from ...' under a traceback, as the runs folder's did before d5d3b6d. Each is one line naming the flag and the
    loop; nothing is made, the engine never asked. invoke inventory's --out, a file or a folder on the way through such
    a loop, said only "cannot write the inventory to ...: File exists" (mkdir's word) after asking the engine."""
    (tmp_path / "proj").symlink_to(tmp_path / "scratch")
    (tmp_path / "scratch").symlink_to(tmp_path / "proj")
    runs = tmp_path / "runs"
    (runs / "r1" / "model").mkdir(parents=True)  # a completed run, for the export
    (runs / "r1" / "manifest.json").write_text(json.dumps({"run_id": "r1", "status": "completed", "variant": "cpu",
                                                           "image": {"ref": "dockyard:0.1.0-cpu", "id": "sha256:x"}}))
    r = invoke_here(*[a.format(out=tmp_path / "proj" / "out") for a in args],
                    env={"INVOKE_DOCKYARD_RUNS_DIR": str(runs), "INVOKE_DOCKYARD_DOCKER": "/bin/false"})
    short_error(r, "round a loop of links")
    assert "--out" in r.stderr or "--file" in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["proj", "runs", "scratch"]
    assert [p.name for p in runs.iterdir()] == ["r1"]
    assert sorted(p.name for p in (runs / "r1").iterdir()) == ["manifest.json", "model"]


@pytest.mark.parametrize("written,says", [
    (lambda t: t + "1: x\nk: y\n", "only `fsdp` and `fsdp_config` belong here, not 1, k"),
    (lambda t: t.replace("version: 2", 'version: 2\n  "sharded\\nweights": true'),
     "fsdp_config.sharded\\nweights: not a setting"),
])
def test_an_fsdp_file_with_keys_of_mixed_types_or_a_newline_is_refused_in_one_line(written, says, tmp_path):
    """Keys beside fsdp of two types (YAML's 1 beside k) ended in "TypeError: '<' not supported between instances of
    'str' and 'int'", a traceback, where one line should say which keys do not belong; a quoted key holding a newline
    split the refusal's line in two."""
    folder = tmp_path / "fsdp-mine"
    shutil.copytree(ROOT / "recipes" / "fsdp", folder)
    (folder / "fsdp.yaml").write_text(written((folder / "fsdp.yaml").read_text()))
    with pytest.raises(DockyardError) as refused:
        recipes.load_recipe(folder)
    assert says in str(refused.value) and "\n" not in str(refused.value), str(refused.value)[:600]
