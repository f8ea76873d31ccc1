"""The settings as a task uses them: what the model keeps is what is run (a `~` expanded once, where it is checked),
and a command setting that cannot be run is refused by name before any task starts."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from dockyard import ROOT, engine
from dockyard.settings import Settings
from dockyard.transport import remote
from dockyard.transport.remote import Remote
from tests.support.cli import invoke, invoke_here, short_error


def a_client(home) -> str:
    (home / "bin").mkdir(parents=True)
    client = home / "bin" / "docker"
    client.write_text("#!/bin/sh\nexit 1\n")
    client.chmod(0o755)
    return str(client)


def test_a_docker_client_under_home_is_run_by_the_path_it_names(tmp_path, monkeypatch):
    client = a_client(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert engine.docker(Settings(docker="~/bin/docker"), "info")[0] == client
    r = invoke_here("run", "--dry", "--variant=cpu", env={"HOME": str(tmp_path), "INVOKE_DOCKYARD_DOCKER": "~/bin/docker",
                                                        "INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    assert r.returncode == 0, r.stderr
    assert f"+ {client} run --rm" in r.stderr and "'~/bin/docker'" not in r.stderr


@pytest.mark.parametrize("key,value,says", [
    ("SSH", "ssh -o 'x", "cannot be split into words as a shell would (no closing quotation)"),
    ("SSH", "", "must name a command and its options, as in ssh"),
    ("SSH", "   ", "must name a command and its options"),
    ("COMPOSE", 'docker "compose', "no closing quotation"),
    ("COMPOSE", "", "as in docker compose"),
])
def test_a_command_setting_that_cannot_be_run_is_refused_naming_it(key, value, says):
    """`INVOKE_DOCKYARD_SSH="ssh -o 'x"` was a ValueError traceback from shlex in `doctor --peer`, and an empty one
    ssh's "`-G` not found"."""
    r = invoke_here("doctor", "--peer=127.0.0.1", env={f"INVOKE_DOCKYARD_{key}": value})
    short_error(r, f"INVOKE_DOCKYARD_{key}=")
    assert says in r.stderr


@pytest.mark.parametrize("key,value", [("RUNS_DIR", " /tmp/dockyard-runs"), ("COMPILE_CACHE", "/tmp/cc "),
                                       ("DATA", "data/sample.jsonl "), ("HF_CACHE", "  ")])
def test_a_path_setting_with_a_space_at_either_end_is_refused_not_made_a_folder_in_the_checkout(key, value):
    """INVOKE_DOCKYARD_RUNS_DIR=" /scratch/runs" (a space the shell kept in quotes): the run mounted a folder named
    " " in the checkout, holding scratch/runs."""
    r = invoke_here("run", "--dry", "--variant=cpu", env={f"INVOKE_DOCKYARD_{key}": value})
    short_error(r, f"INVOKE_DOCKYARD_{key}='{value}'")
    assert "begins or ends with a space, which would be part of the path; remove it" in r.stderr
    assert not (ROOT / " ").exists()


def test_a_base_image_that_is_no_image_name_is_refused_before_setup_makes_it():
    """base_image_cpu `Dockyard Base`: `invoke setup` ran debootstrap for minutes before docker import refused it."""
    r = invoke_here("setup", "--dry", env={"INVOKE_DOCKYARD_BASE_IMAGE_CPU": "Dockyard Base"})
    short_error(r, "INVOKE_DOCKYARD_BASE_IMAGE_CPU='Dockyard Base': an image name: [registry[:port]/]name[:tag]")


def test_the_ssh_setting_reads_a_config_file_under_home_as_a_shell_would(tmp_path, monkeypatch):
    """invoke.yaml's example `ssh -F ~/.ssh/cluster.conf`: ssh does not expand a `~` given to -F, a shell does."""
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "cluster.conf").write_text("Host node7\n  Port 2299\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    argv = remote.ssh_argv(Settings(ssh="ssh -F ~/.ssh/cluster.conf -o 'User gpu'"), Remote("node7"), "true")
    said = subprocess.run([*argv[:-3], "-G", *argv[-3:-1]], capture_output=True, text=True, check=True).stdout
    assert "port 2299" in said.splitlines() and "user gpu" in said.splitlines()


BROKEN_CONFIG = [
    ("dockyard:\n  runs_dir: [x\n", "is not valid YAML: expected ',' or ']', but got '<stream end>' at line 3, column 1"),
    ("dockyard:\n  runs_dir: runs\n layer_cache: x\n",
     "is not valid YAML: expected <block end>, but found '<block mapping start>' at line 3, column 2"),
    ("- dockyard\n", "expected `key: value` lines at the top level"),
    ("dockyard: {1: x}\n", "the key dockyard.1 is not text: quote it"),
    ("run: 5\n", "run must hold `key: value` lines, as in the config read before this file"),
]


@pytest.mark.parametrize("content,says", BROKEN_CONFIG)
def test_a_project_config_file_invoke_cannot_read_is_one_error_line_even_for_list(tmp_path, content, says):
    """invoke.yaml with a YAML syntax error was a ParserError traceback on every command, `invoke --list` too."""
    shutil.copy(ROOT / "tasks.py", tmp_path)
    (tmp_path / "invoke.yaml").write_text(content)
    for args in (["--list"], ["recipes"]):
        r = invoke(*args, cwd=tmp_path, env={"PYTHONPATH": str(ROOT)}, timeout=120)
        short_error(r, f"{tmp_path / 'invoke.yaml'}")
        assert says in r.stderr and r.returncode == 1


@pytest.mark.parametrize("content,says", [*BROKEN_CONFIG, ("dockyard: 5\n", "dockyard must hold `key: value` lines"),
                                          ("dockyard: {runs_dir: {a: 1}}\n", "dockyard.runs_dir must hold one value")])
def test_a_config_file_given_with_f_that_is_broken_is_one_error_line(tmp_path, content, says):
    """`dockyard: 5` was `TypeError: 'int' object is not iterable` in every task."""
    (tmp_path / "mine.yaml").write_text(content)
    r = invoke_here("-f", str(tmp_path / "mine.yaml"), "recipes")
    short_error(r, says)
    assert r.returncode == 1


def test_a_config_file_that_is_a_folder_or_no_yaml_is_one_error_line(tmp_path):
    (tmp_path / "x.yaml").mkdir()
    short_error(invoke_here("-f", str(tmp_path / "x.yaml"), "recipes"),
                f"cannot read the config file {tmp_path / 'x.yaml'} (Is a directory)")
    short_error(invoke_here("-f", str(tmp_path), "recipes"), f"(from file '{tmp_path}') are not supported")
    # a mistyped -f: Invoke went on without it, and without a word
    short_error(invoke_here("-f", str(tmp_path / "typo.yaml"), "recipes"), f"-f {tmp_path / 'typo.yaml'}: no such file")
    short_error(invoke_here("recipes", env={"INVOKE_RUNTIME_CONFIG": str(tmp_path / "typo.yaml")}),
                f"INVOKE_RUNTIME_CONFIG={tmp_path / 'typo.yaml'}: no such file")
    # a .py config file (Invoke runs it): a tasks file given by mistake, a setting of the wrong shape
    (tmp_path / "cf.py").write_text("dockyard = 5\n")
    short_error(invoke_here("-f", str(tmp_path / "cf.py"), "recipes"), "dockyard must hold `key: value` lines")
    (tmp_path / "tasks_by_mistake.py").write_text("import os\n")
    short_error(invoke_here("-f", str(tmp_path / "tasks_by_mistake.py"), "recipes"),
                "is not one Invoke can take: UnpicklableConfigMember: 'os' is a module")


def test_dockyard_in_invoke_yaml_that_is_not_a_mapping_is_one_error_naming_it(tmp_path):
    """`dockyard: 5` in invoke.yaml was `TypeError: 'int' object is not iterable` in every task."""
    shutil.copy(ROOT / "tasks.py", tmp_path)
    (tmp_path / "invoke.yaml").write_text("dockyard: 5\n")
    r = invoke("recipes", cwd=tmp_path, env={"PYTHONPATH": str(ROOT)}, timeout=120)
    short_error(r, "`dockyard:` in invoke.yaml (or the config file given with -f) holds 5: it must hold the settings")


def test_a_setting_in_the_users_invoke_yaml_is_taken_and_a_bad_one_named(tmp_path):
    """invoke.yaml says a key may be overridden in ~/.invoke.yaml, but Invoke reads the project's file after it and
    invoke.yaml names every setting: `runs_dir: /scratch/runs` there was ignored without a word, and the runs went to
    runs/ of the checkout. It is taken; a -f file and INVOKE_DOCKYARD_* still win over it."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".invoke.yaml").write_text(f"dockyard:\n  runs_dir: {tmp_path / 'mine'}\n")
    said = invoke_here("run", "--dry", "--variant=cpu", "--recipe=ddp", env={"HOME": str(home)})
    assert said.returncode == 0, said.stderr
    assert f"{tmp_path / 'mine'}:/workspace/runs" in said.stdout + said.stderr
    (tmp_path / "f.yaml").write_text(f"dockyard:\n  runs_dir: {tmp_path / 'given'}\n")
    said = invoke_here("-f", str(tmp_path / "f.yaml"), "run", "--dry", "--variant=cpu", "--recipe=ddp",
                       env={"HOME": str(home)})
    assert f"{tmp_path / 'given'}:/workspace/runs" in said.stdout + said.stderr
    said = invoke_here("run", "--dry", "--variant=cpu", "--recipe=ddp",
                       env={"HOME": str(home), "INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "env")})
    assert f"{tmp_path / 'env'}:/workspace/runs" in said.stdout + said.stderr

    (home / ".invoke.yaml").write_text("dockyard:\n  image_name: My Images\n")
    short_error(invoke_here("recipes", env={"HOME": str(home)}),
                f"invalid setting: {home / '.invoke.yaml'} dockyard.image_name 'My Images': a docker repository name")


def test_a_setting_of_another_shape_in_the_users_invoke_yaml_is_blamed_on_that_file(tmp_path):
    """`dockyard: 5` in ~/.invoke.yaml was refused as "/project/invoke.yaml: dockyard must hold one value ...": the
    project's file, which is right, was named, and the user was told to make its settings one value."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".invoke.yaml").write_text("dockyard: 5\n")
    r = invoke_here("recipes", env={"HOME": str(home)})
    short_error(r, f"{home / '.invoke.yaml'}: dockyard must hold `key: value` lines, as in {ROOT / 'invoke.yaml'}, not 5")
    assert r.returncode == 1
    # a key no setting has, there: named in that file (it was "unknown setting(s) in invoke.yaml", the project's)
    (home / ".invoke.yaml").write_text("dockyard:\n  runsdir: /scratch/runs\n")
    short_error(invoke_here("recipes", env={"HOME": str(home)}),
                f"unknown setting(s) in {home / '.invoke.yaml'} (dockyard:): runsdir (did you mean runs_dir?); known: ")


@pytest.mark.parametrize("given, meant", [("RUNSDIR", "RUNS_DIR"), ("RUN_DIR", "RUNS_DIR"), ("HFCACHE", "HF_CACHE"),
                                          ("IMAGE", ""), ("NOPE", "")])
def test_a_misspelt_setting_variable_names_the_one_meant(given, meant):
    """INVOKE_DOCKYARD_RUNSDIR=... was refused with the list of all twenty keys, leaving the user to find runs_dir
    in it; a name far from every key gets the list alone."""
    r = invoke_here("recipes", env={f"INVOKE_DOCKYARD_{given}": "x"})
    short_error(r, f"unknown setting(s) in INVOKE_DOCKYARD_*: INVOKE_DOCKYARD_{given}"
                + (f" (did you mean INVOKE_DOCKYARD_{meant}?); known: " if meant else "; known: "))


def test_a_folder_under_the_home_of_no_user_is_refused_not_made_in_the_checkout():
    """runs_dir ~nosuchuser/x was mounted as <checkout>/~nosuchuser/x."""
    from dockyard.common.errors import DockyardError
    from dockyard.settings import load

    with pytest.raises(DockyardError, match="~nosuchuser/x: no user 'nosuchuser' on this host"):
        load({"runs_dir": "~nosuchuser/x"}).path("~nosuchuser/x")
    assert load({}).path("~/x") == Path.home() / "x"


@pytest.mark.parametrize("key", ["RUNS_DIR", "HF_CACHE"])
def test_a_long_setting_variable_is_said_cut_in_its_refusal(key):
    """INVOKE_DOCKYARD_RUNS_DIR=~<5,000 characters>/runs (a value pasted twice, a generated one) was said whole, twice:
    a refusal of 10,000 characters. It is cut as every other value is said (errors.cut, errors.short)."""
    user = "q" * 5000
    r = invoke_here("run", "--recipe=ddp", "--native", "--cpu", "--dry", env={f"INVOKE_DOCKYARD_{key}": f"~{user}/x"})
    short_error(r, "no user 'qqqq")
    assert "... on this host: give the folder's path" in r.stderr and len(r.stderr) < 400, r.stderr[:600]
