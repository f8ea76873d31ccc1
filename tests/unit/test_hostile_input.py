"""Bad or hostile input gets a short refusal before anything is made: no traceback, nothing half-done (issue 11).

Property-based where the input is open-ended (hypothesis); everything here is real code, no engine needed
(docker is never reached: each refusal comes before it).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from dockyard import build, engine, launch, recipes
from dockyard.errors import DockyardError
from dockyard.settings import ROOT, Settings, load
from dockyard.transport import commit, verify
from tests.support.cli import invoke

DOCKER_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]+")  # docker's container-name rule; the run id names one


# --- through the real CLI: what a user types -------------------------------------------------------

def test_trainer_overrides_reach_the_trainer_as_the_user_quoted_them():
    r = invoke("run", "--dry", "--variant=cpu", "--", "--note", "a b", "it's")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert "--note 'a b' 'it'\"'\"'s'" in r.stderr  # three arguments, quoting kept (the echo is on stderr)


@pytest.mark.parametrize("args,says", [
    (["--run-id=a b:c"], "--run-id 'a b:c'"),
    (["--run-id=-q"], "--run-id '-q'"),  # a letter no flag of `run` has (-x is --max-restarts)
    (["--recipe=../x"], "unknown recipe '../x'"),
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
])
def test_a_broken_ds_config_is_refused_by_the_host(ds_config, says, tmp_path):
    folder = broken_recipe(tmp_path, ds_config)
    with pytest.raises(DockyardError, match="ds_config.json"):
        recipes.load_recipe(folder)
    r = invoke("run", "--dry", "--variant=cpu", f"--recipe={folder}")
    assert r.returncode != 0 and says in r.stderr and "Traceback" not in r.stderr
    assert "docker run" not in r.stdout + r.stderr


def test_every_shipped_recipe_passes_the_host_check():
    assert len(recipes.list_recipes()) >= 8


# --- run ids ---------------------------------------------------------------------------------------

@hsettings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_a_run_id_is_refused_or_is_a_valid_container_name_and_folder(run_id):
    s = Settings(runs_dir="/nonexistent/runs")
    try:
        d = launch.new_run_dir(s, "zero2", run_id, resume=False)
    except DockyardError as e:
        assert "--run-id" in str(e)
        return
    assert DOCKER_NAME.fullmatch(f"dockyard-{d.name}") and d.name[0].isalnum()
    assert d.parent == s.path(s.runs_dir)  # a plain folder under runs/, never beside or above it


def test_the_default_run_id_of_a_recipe_folder_is_a_valid_name():
    d = launch.new_run_dir(Settings(runs_dir="/nonexistent/runs"), str(ROOT / "recipes" / "zero2"), "", False)
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
def test_a_layer_cache_size_that_is_not_a_number_is_a_settings_error(value):
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
    from dockyard import variants

    s = Settings()
    argv = build.build_plan(s, variants.resolve(s, "cpu")[0]).steps[0][0]
    assert not [a for a in argv if "org.opencontainers.image.source" in a or str(ROOT) + "=" in a]


# --- archive manifests -------------------------------------------------------------------------------

GOOD = {"archive_sha256": "a" * 64, "archive_bytes": 10, "tar_bytes": 20,
        "images": [{"ref": "t:1", "tags": ["t:1"], "id": "sha256:" + "b" * 64, "diff_ids": []}], "thin": None}


@pytest.mark.parametrize("raw,says", [
    (b"{not json", "Invalid JSON"),
    (b"[]", "manifest"),
    (json.dumps({**GOOD, "images": []}).encode(), "images"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "tar_bytes"}).encode(), "tar_bytes"),
    (json.dumps({**GOOD, "archive_bytes": "10 MB"}).encode(), "archive_bytes"),
    (json.dumps({**GOOD, "images": [{**GOOD["images"][0], "tags": ["-q"]}]}).encode(), "not a docker reference"),
])
def test_a_manifest_we_did_not_write_is_refused_with_what_is_wrong(raw, says):
    with pytest.raises(DockyardError, match="is not a manifest") as e:
        verify.read_manifest(raw, "x.manifest.json")
    assert says in str(e.value)


def test_a_manifest_we_write_keeps_every_field():
    extra = {**GOOD, "format": 1, "layers": [{"bytes": 3}]}
    assert verify.read_manifest(json.dumps(extra).encode(), "x")["layers"] == [{"bytes": 3}]


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                        max_size=3), max_leaves=12)


@hsettings(max_examples=300, deadline=None)
@given(st.one_of(json_values, st.fixed_dictionaries({k: json_values for k in GOOD})))
def test_any_json_is_a_manifest_or_a_refusal(value):
    try:
        m = verify.read_manifest(json.dumps(value).encode(), "x")
    except DockyardError:
        return
    assert isinstance(m["tar_bytes"], int) and m["images"]
