"""What of the host a run sees: the user's model and data (flags, settings, or host paths given as trainer
overrides) mounted read-only with the paths rewritten, the checkout's recipes over the image's, a recipe folder of
one's own; and what the trainer records of them. Plans only: nothing runs."""

import json

import pytest

from dockyard import ROOT, engine
from dockyard.common.errors import DockyardError
from dockyard.gpus import Host
from dockyard.images import build, variants
from dockyard.launch import command as launch_command
from dockyard.launch import run as launch_run
from dockyard.launch import summary as launch_summary
from dockyard.train import manifest
from tests.support.cli import invoke_here, short_error
from tests.support.data import a_step_of


@pytest.fixture
def files(tmp_path):
    data = tmp_path / "my data.jsonl"
    data.write_text(a_step_of('{"text": "x"}'))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return data, model


def _argv(settings, tmp_path, recipe="ddp", overrides=(), **kw):
    v = variants.resolve(settings, "cpu")[0]
    t = launch_command.validate_topology(0, 1, 0, "", 29500, Host(), v)
    return launch_command.run_command(settings, recipe=recipe, variant=v, host=Host(), engine_info={}, topo=t,
                           run_dir=tmp_path / "runs" / "r1", overrides=list(overrides), **kw).argv


def _volumes(argv):
    return [argv[i + 1] for i, a in enumerate(argv) if a == "-v"]


def test_data_and_model_flags_are_mounted_read_only_and_rewritten(settings, tmp_path, files):
    data, model = files
    argv = _argv(settings, tmp_path, data=str(data), model=str(model), overrides=["--max_steps", "3"])
    assert f"{data}:/workspace/inputs/data/my data.jsonl:ro" in _volumes(argv), "the file alone, not its folder"
    assert f"{model}:/workspace/inputs/model:ro" in _volumes(argv)
    tail = argv[argv.index("--", argv.index("dockyard.train")) + 1:]
    assert tail == ["--max_steps", "3", "--model", "/workspace/inputs/model",
                    "--data", "/workspace/inputs/data/my data.jsonl"]
    env = json.loads(next(a for a in argv if a.startswith("DOCKYARD_HOST_PATHS="))[len("DOCKYARD_HOST_PATHS="):])
    assert env["/workspace/inputs/model"] == str(model)


def test_host_paths_given_as_overrides_are_mounted_the_same_way(settings, tmp_path, files):
    data, model = files
    argv = _argv(settings, tmp_path, overrides=[f"--data={data}", "--model", str(model), "--max_steps", "3"])
    assert f"{model}:/workspace/inputs/model:ro" in _volumes(argv)
    assert str(data) not in argv[argv.index("dockyard.train"):], "no host path reaches the container"
    # a hub id is not a host path: passed as it is, found in the mounted Hugging Face cache
    repo = tmp_path / "hf" / "hub" / "models--Qwen--Qwen2.5-0.5B"
    (repo / "snapshots").mkdir(parents=True)
    hub = settings.model_copy(update={"hf_cache": tmp_path / "hf"})
    # a download that stopped before its config.json: the trainer's from_pretrained would find no model there
    with pytest.raises(DockyardError, match="holds this model's folder but no complete snapshot of it"):
        _argv(hub, tmp_path, overrides=["--model", "Qwen/Qwen2.5-0.5B"])
    (repo / "snapshots" / ("ab" * 20)).mkdir()
    (repo / "snapshots" / ("ab" * 20) / "config.json").write_text("{}")
    argv = _argv(hub, tmp_path, overrides=["--model", "Qwen/Qwen2.5-0.5B"])
    assert argv[-2:] == ["--model", "Qwen/Qwen2.5-0.5B"]


@pytest.mark.parametrize("how", ["flag", "override", "setting"])
def test_a_path_that_does_not_exist_is_a_short_error(settings, tmp_path, how):
    missing = str(tmp_path / "nope.jsonl")
    s, kw, ov = settings, {}, []
    if how == "flag":
        kw = {"data": missing}
    elif how == "override":
        ov = ["--data", missing]
    else:
        s = settings.model_copy(update={"data": missing})
    with pytest.raises(DockyardError, match="nope.jsonl: no such file or folder on this host"):
        _argv(s, tmp_path, overrides=ov, **kw)


def test_a_data_or_model_path_with_a_slip_in_its_name_is_answered_with_the_one_beside_it_which_mounts(settings,
                                                                                                   tmp_path, files):
    """The newcomer's walk: `--data=/tmp/d/chat.jsnl` beside chat.jsonl, or `--model=/tmp/modle`, was "no such file
    or folder on this host (give an existing file or folder ...)" alone. The entry beside it closest by name is
    named (did you mean ...?), and mounts; a path near nothing is said as before."""
    data, model = files
    for key, typed, meant in (("data", tmp_path / "my data.jsnl", data), ("model", tmp_path / "modle", model)):
        with pytest.raises(DockyardError) as e:
            _argv(settings, tmp_path, **{key: str(typed)})
        assert str(e.value) == f"--{key} {typed}: no such file or folder on this host (did you mean {meant}?)"
        assert any(v.startswith(f"{meant}:") for v in _volumes(_argv(settings, tmp_path, **{key: str(meant)})))
    with pytest.raises(DockyardError, match=r"zzz.jsonl: no such file or folder on this host \(give an existing"):
        _argv(settings, tmp_path, data=str(tmp_path / "zzz.jsonl"))


@pytest.mark.parametrize("key,value,says", [
    ("model", "gpt2", "; a hub model is named org/name (gpt2 is openai-community/gpt2) and read from the Hugging Face "
                      "cache "),
    ("data", "squad", "; a hub dataset is named org/name (squad is rajpurkar/squad) and read from the Hugging Face "
                      "cache "),
])
def test_a_bare_name_that_is_no_path_says_how_a_hub_id_is_named(settings, tmp_path, key, value, says):
    """The newcomer audit: `--model=gpt2` (the hub's id of old, without its org) was "no such file or folder on this
    host" alone, where the user meant the hub's model."""
    with pytest.raises(DockyardError) as e:
        _argv(settings, tmp_path, **{key: value})
    assert f"{key} {value}: no such file or folder on this host (give an existing file or folder; it is mounted " \
           f"read-only into the run){says}" in str(e.value), str(e.value)
    with pytest.raises(DockyardError) as e:
        _argv(settings, tmp_path, data=str(tmp_path / "nope.jsonl"))
    assert "hub" not in str(e.value)


def test_checkout_recipes_are_mounted_over_the_images_and_a_recipe_folder_of_ones_own_too(settings, tmp_path,
                                                                                            monkeypatch):
    mine = tmp_path / "my-recipe"
    mine.mkdir()
    (mine / "recipe.yaml").write_text("# invoke run --recipe=my-recipe\nwhen: mine\nstrategy: ddp\n")
    argv = _argv(settings, tmp_path, recipe=str(mine))
    assert f"{(ROOT / 'recipes').resolve()}:/opt/dockyard/recipes:ro" in _volumes(argv)
    assert f"{mine}:/workspace/recipes/my-recipe:ro" in _volumes(argv)
    assert argv[argv.index("--recipe") + 1] == "/workspace/recipes/my-recipe"
    s = settings.model_copy(update={"runs_dir": tmp_path / "runs"})
    monkeypatch.chdir(mine)
    assert launch_run.new_run_dir(s, ".", "", False).name.startswith("my-recipe-"), "named by the folder"
    long = tmp_path / ("r" * 200)  # its name made a run id past 128 letters, refused as a --run-id never given
    long.mkdir()
    (long / "recipe.yaml").write_text((mine / "recipe.yaml").read_text())
    assert launch_run.new_run_dir(s, str(long), "", False).name.startswith("r" * 64 + "-2")


def test_a_recipes_own_data_and_model_are_mounted_as_a_flags_are_and_a_flag_still_wins(settings, tmp_path, files):
    """A recipe folder whose `settings:` names the data and model on this host: the container sees them. The trainer
    in the container read the host path inside the image before, where nothing is."""
    data, model = files
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "recipe.yaml").write_text(f"# invoke run --recipe={mine}\nwhen: mine\nstrategy: ddp\n"
                                      f"settings:\n  data: {json.dumps(str(data))}\n  model: {model}\n")
    argv = _argv(settings, tmp_path, recipe=str(mine))
    assert f"{data}:/workspace/inputs/data/my data.jsonl:ro" in _volumes(argv)
    assert f"{model}:/workspace/inputs/model:ro" in _volumes(argv)
    assert argv[-4:] == ["--model", "/workspace/inputs/model", "--data", "/workspace/inputs/data/my data.jsonl"]
    other = tmp_path / "other.jsonl"
    other.write_text('{"text": "y"}\n')
    argv = _argv(settings, tmp_path, recipe=str(mine), data=str(other))
    assert f"{other}:/workspace/inputs/data/other.jsonl:ro" in _volumes(argv)
    assert not any(v.startswith(str(data)) for v in _volumes(argv)), "the flag wins over the recipe's data"
    (mine / "recipe.yaml").write_text(f"# invoke run --recipe={mine}\nwhen: mine\nstrategy: ddp\n"
                                      f"settings:\n  data: {tmp_path / 'gone.jsonl'}\n")
    with pytest.raises(DockyardError, match="the recipe's settings: data .*gone.jsonl: no such file or folder"):
        _argv(settings, tmp_path, recipe=str(mine))
    with pytest.raises(DockyardError, match="the recipe's settings: data .*gone.jsonl: no such file or folder"):
        launch_run.run(settings.model_copy(update={"runs_dir": tmp_path / "runs"}),
                       launch_run.RunRequest(recipe=str(mine), dry=True, cpu=True))


def test_run_says_when_the_image_holds_other_code(capsys):
    build.warn_if_stale({"Config": {"Labels": {variants.CODE_LABEL: build.code_hash()}}}, "img")
    assert capsys.readouterr().err == ""
    build.warn_if_stale({"Config": {"Labels": {variants.CODE_LABEL: "0" * 64}}}, "img")
    assert "older (or other) code" in capsys.readouterr().err
    # the commits each was made from: which is older is then the user's to see
    build.warn_if_stale({"Config": {"Labels": {variants.CODE_LABEL: "0" * 64, "org.opencontainers.image.revision":
                                               "1f2e3d4c5b6a79881f2e3d4c5b6a79881f2e3d4c-dirty",
                                               "org.opencontainers.image.created": "2026-11-20T10:00:00+00:00"}}},
                        "img")
    here = build.git_revision()
    assert (f"(image built from 1f2e3d4c5b6a-dirty of 2026-11-20T10:00:00+00:00; this checkout is {here[:12]}"
            in capsys.readouterr().err)


def test_the_manifest_records_what_was_used(tmp_path, files, monkeypatch):
    data, model = files
    monkeypatch.setenv("DOCKYARD_HOST_PATHS", json.dumps({"/workspace/inputs/model": "/host/model"}))
    (model / "weights.bin").write_bytes(b"w" * 10)
    rec = manifest.inputs_record({"model": str(model), "data": str(data), "eval_data": ""})
    assert rec["data"]["hash_of"] == "content" and rec["data"]["bytes"] == data.stat().st_size
    assert rec["model"]["hash_of"] == "file list with sizes" and rec["model"]["files"] == 2
    assert "eval_data" not in rec
    rec = manifest.inputs_record({"model": "/workspace/inputs/model"})
    assert rec["model"]["path"] == "/host/model"
    # as the trainer's refusal names the model to `invoke plan --model=...`: the host's path, a hub id as it is
    assert manifest.host_path("/workspace/inputs/model") == "/host/model" and manifest.host_path("org/x") == "org/x"


@pytest.mark.parametrize("how", ["--data", "-- --data", "setting data", "runs_dir", "hf_cache"])
def test_a_path_holding_a_colon_is_refused_naming_where_it_came_from_before_anything_is_made(settings, tmp_path, how):
    """docker's -v splits on ':' and refused the command `invoke run` printed, after the run folder was made."""
    odd = tmp_path / "a:b"
    odd.mkdir()
    (odd / "d.jsonl").write_text(a_step_of('{"text": "x"}'))
    data = str(odd / "d.jsonl")
    args, env = [], {"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")}
    if how == "--data":
        args = [f"--data={data}"]
    elif how == "-- --data":
        args = ["--", "--data", data]
    elif how == "setting data":
        env["INVOKE_DOCKYARD_DATA"] = data
    elif how == "runs_dir":
        env["INVOKE_DOCKYARD_RUNS_DIR"] = str(odd / "runs")
    else:
        env["INVOKE_DOCKYARD_HF_CACHE"] = str(odd / "hf")
    r = invoke_here("run", "--dry", "--variant=cpu", "--recipe=ddp", *args, env=env)
    short_error(r, how)
    assert "':'" in r.stderr and f"{odd}" in r.stderr and "docker run" not in r.stdout + r.stderr
    assert not (tmp_path / "runs").exists() and not (odd / "runs").exists() and not (odd / "hf").exists()


def test_a_data_setting_from_the_environment_that_is_not_there_names_the_variable(tmp_path):
    """`INVOKE_DOCKYARD_DATA=/data/my.jsonl` (the README's example), set in a shell and forgotten, stopped a later
    `invoke run` with 'setting data /data/my.jsonl: no such file or folder', and the user looked for `data:` in
    invoke.yaml, which did not hold it. The variable is named; a setting of the file is said as before."""
    gone = tmp_path / "my.jsonl"
    r = invoke_here("run", "--dry", "--variant=cpu", "--recipe=ddp",
                    env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs"), "INVOKE_DOCKYARD_DATA": str(gone)})
    short_error(r, f"setting data (from INVOKE_DOCKYARD_DATA) {gone}: no such file or folder on this host")


def test_a_dry_run_says_when_the_image_holds_other_code_too(tmp_path, monkeypatch):
    """`invoke run --dry` printed the command and nothing of the image's code; the run then warned."""
    from tests.support.cli import invoke_here

    stale = {"Id": "sha256:" + "c" * 64, "Config": {"Labels": {variants.CODE_LABEL: "0" * 64}}}
    monkeypatch.setattr(launch_run.engine, "image_inspect", lambda settings, ref: stale)
    r = invoke_here("run", "--dry", "--variant=cpu", "--recipe=ddp",
                    env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    assert r.returncode == 0, r.stderr
    assert "holds older (or other) code than this checkout's dockyard/" in r.stderr, r.stderr


def test_the_host_paths_the_trainer_is_told_are_the_docker_run_s_own_mounts_whatever_it_mounts(settings, tmp_path,
                                                                                                files):
    """DOCKYARD_HOST_PATHS was built from a second list of the run's mounts (the runs folder, caches.volumes and the
    inputs', typed again beside docker_run_argv's): one list now makes both, so a mount added to the docker command
    is named to the trainer too. Each kind of mount: the runs folder, the caches, a data file, a model folder, a
    recipe folder of one's own, this checkout's recipes."""
    import shutil

    data, model = files
    mine = tmp_path / "my recipe"
    shutil.copytree(ROOT / "recipes" / "ddp", mine)
    for kw in ({}, {"data": str(data), "model": str(model)}, {"data": str(data), "recipe": str(mine)}):
        argv = _argv(settings, tmp_path, **kw)
        named = json.loads(next(a for a in argv if a.startswith("DOCKYARD_HOST_PATHS=")).partition("=")[2])
        assert named == engine.mounts_of(argv) and len(named) == len(_volumes(argv)), kw
        assert sum(a.startswith("DOCKYARD_HOST_PATHS=") for a in argv) == 1


def test_the_trainer_is_told_the_host_path_of_every_folder_the_run_mounts(settings, tmp_path, files):
    """invoke run told the trainer the host paths of the user's inputs alone: the runs folder's paths in train.log and
    the manifest's error stayed the container's (/workspace/runs/r1/...). It names every mount now, as run.sh does,
    and the summary's error line says a manifest's container paths as this host's."""
    data, _ = files
    argv = _argv(settings, tmp_path, data=str(data))
    env = json.loads(next(a for a in argv if a.startswith("DOCKYARD_HOST_PATHS="))[len("DOCKYARD_HOST_PATHS="):])
    assert env == engine.mounts_of(argv)
    assert env["/workspace/runs"] == str(tmp_path / "runs")
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "manifest.json").write_text(json.dumps({
        "run_id": "r1", "recipe": "ddp", "variant": "cpu", "status": "failed", "world_size": 2, "nodes": 1,
        "error": "/workspace/inputs/data/my data.jsonl: example 41's text is int"}))
    with pytest.raises(DockyardError) as e:
        launch_summary.summarise(run_dir, as_host=engine.container_paths_shown(argv))
    assert str(e.value) == f"run r1 failed: {data}: example 41's text is int"
