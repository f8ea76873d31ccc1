"""run.sh with hostile values: every word of the rendered docker command is one sh word, and the file names,
folders, overrides and HF_HOME a user gives reach docker as the words they are (a file named -v included), with
the run's JSON record of host paths still JSON. Run under sh with a recording docker (tests/support/hostile.py);
no attack may run ($MARK never appears)."""

from __future__ import annotations

import itertools
import json
import re
import shlex
import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, Phase, event, example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from dockyard.common.errors import DockyardError
from dockyard.common.recipes import RECIPES
from dockyard.launch import runscript
from tests.support.hostile import PIECES, environment, hostile_value, path_name, recorder, records

DOCKER = """
case "$1" in
image) case "$*" in *dockyard.variant*) echo cpu ;; *) echo sha256:feed ;; esac ;;
run) case "$*" in *"ulimit -H -l"*) echo 8192 ;; esac ;;
esac
"""
EXAMPLES = hsettings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                     phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])  # explaining reruns for minutes
no_nul = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"))


@given(st.text())
def test_a_plain_word_is_one_shell_word(w):
    if any(m in w for m in runscript.MARKS):
        return
    assert shlex.split(runscript.word(w)) == [w]


ATTACK = 'it\'s a "test" `touch "$MARK"` $(touch "$MARK") ${HOME} \\ *'


@EXAMPLES
@example(parts=['"', "/__RUNS__", ATTACK, "__RUN_ID__", "\\"], values=[ATTACK] * len(runscript.MARKS))
@given(parts=st.lists(st.one_of(st.sampled_from(sorted(runscript.MARKS)), no_nul, st.sampled_from(PIECES[:-1]))),
       values=st.lists(no_nul, min_size=len(runscript.MARKS), max_size=len(runscript.MARKS)))
def test_a_word_with_marks_is_one_sh_word_with_the_node_s_values_in_it(tmp_path_factory, parts, values):
    """What sh makes of word(w): w, each mark replaced by its variable's value, whatever the value holds."""
    w = "".join(parts)
    env = dict(zip(runscript.MARKS.values(), values, strict=True))
    want = re.sub("|".join(map(re.escape, runscript.MARKS)), lambda m: env[runscript.MARKS[m.group()]], w)
    mark = tmp_path_factory.mktemp("w") / "pwned"
    p = subprocess.run(["sh", "-c", "printf '%s\\0' " + runscript.word(w)], capture_output=True,
                       env={**env, "PATH": "/usr/bin:/bin", "MARK": str(mark)})
    assert p.returncode == 0, p.stderr
    assert p.stdout.decode().split("\0")[:-1] == [want] and not mark.exists()


def _node(settings, base, *args: str, hf: str = "") -> tuple[subprocess.CompletedProcess, list[str]]:
    """run.sh for the cpu image, run by sh in `base` with a recording docker; the argv of `docker run`."""
    (base / "run.sh").write_text(runscript.render(settings, "dockyard:0.1.0-cpu", "cpu"))
    recorder(base / "bin", "docker", then=DOCKER)
    log = base / "argv"
    # LANG=C: dash reads bytes whatever the locale; bash would also take U+0080-U+009F for control characters
    env = environment(base / "bin", log, base / "pwned", LANG="C", **({"HF_HOME": hf} if hf else {}))
    p = subprocess.run(["sh", "run.sh", *args], cwd=base, env=env, capture_output=True, text=True, timeout=60)
    assert not (base / "pwned").exists(), "a value ran as a command"
    runs = [r["argv"] for r in records(log) if r["argv"][:1] == ["run"] and "--name" in r["argv"]]
    return p, runs[0] if runs else []


def _refused_by_sh(path: str) -> bool:
    """What run.sh refuses in a path: an ASCII control character (JSON needs them escaped; a newline ends sh's
    lines), ':' (docker -v splits on it) and a leading ~NAME (read as a home folder only for ~ and ~/)."""
    return ":" in path or any(ord(c) < 32 or ord(c) == 127 for c in path) or (path[:1] == "~" and path[:2] != "~/")


@EXAMPLES
@example(data="-v", recipe="my recipe's", runs="a b", hf='$(touch "$MARK")', override=ATTACK)
@example(data="d", recipe="r\n", runs="u", hf="h", override="ends in newlines\n\n")  # what $(...) strips
@example(data="d", recipe="r", runs="u\n", hf="h", override="x")
@example(data="d", recipe="r", runs="u", hf="h\n", override="x")
@example(data="~", recipe="r", runs="u", hf="h", override="x")  # ~.jsonl: refused without naming --data (found once)
@given(data=path_name, recipe=path_name, runs=path_name, hf=path_name, override=hostile_value.filter(lambda s: "\0" not in s))
def test_hostile_names_reach_docker_as_the_words_they_are(settings, tmp_path_factory, data, recipe, runs, hf, override):
    base = tmp_path_factory.mktemp("node")
    data += ".jsonl"  # a data file run.sh takes (a file of no known type is refused before docker)
    (base / data).write_text("{}\n")
    folder = base / "recipes" / recipe
    shutil.copytree(RECIPES / "ddp", folder)
    p, argv = _node(settings, base, f"--data={data}", f"--recipe=recipes/{recipe}", f"--runs=runs/{runs}", "--run-id=r1",
                    "--", "--run_name", override, hf=f"hf/{hf}")
    # as run.sh is given them: a name after recipes/, runs/ or hf/ never leads with ~
    if any(_refused_by_sh(v) for v in (data, f"recipes/{recipe}", f"runs/{runs}", f"hf/{hf}")):
        event("refused")
        assert p.returncode == 1 and not argv, p.stderr
        assert any(f in p.stderr for f in ("--data", "--recipe", "--runs", "HF_HOME")), p.stderr
        return
    assert argv, p.stderr  # (the stand-in trains nothing: run.sh then says no manifest was written)
    inside = f"/workspace/inputs/data/{data}"
    assert argv[argv.index(f"{base}/{data}:{inside}:ro") - 1] == "-v"
    assert f"{folder}:/workspace/recipes/{recipe}:ro" in argv
    assert f"{base}/runs/{runs}:/workspace/runs" in argv and f"{base}/hf/{hf}:/workspace/.cache/huggingface" in argv
    assert argv[argv.index("--recipe") + 1] == f"/workspace/recipes/{recipe}"
    assert argv[-4:] == ["--run_name", override, "--data", inside]
    (record,) = [a for a in argv if a.startswith("DOCKYARD_HOST_PATHS=")]
    mounts = dict(reversed(value.split(":")[:2]) for flag, value in itertools.pairwise(argv) if flag == "-v")
    assert json.loads(record.split("=", 1)[1]) == mounts  # each mount's host path, for the lines the trainer says
    assert mounts[inside] == f"{base}/{data}" and mounts[f"/workspace/recipes/{recipe}"] == str(folder)


def test_a_leading_tilde_is_the_home_folder_as_invoke_run_reads_it(settings, tmp_path):
    """`--runs=~/runs` made a folder named ~ in the current one (where `rm -rf ~` waits), and `--data=~/d.jsonl`
    was "no such file" though it was in the home folder."""
    home, base = tmp_path / "home", tmp_path / "node"
    (home / "recipes").mkdir(parents=True)
    base.mkdir()
    (home / "d.jsonl").write_text("{}\n")
    shutil.copytree(RECIPES / "ddp", home / "recipes" / "my recipe")
    (base / "run.sh").write_text(runscript.render(settings, "dockyard:0.1.0-cpu", "cpu"))
    recorder(base / "bin", "docker", then=DOCKER)
    env = {**environment(base / "bin", base / "argv", base / "pwned", LANG="C"), "HOME": str(home)}
    p = subprocess.run(["sh", "run.sh", "--data=~/d.jsonl", "--runs=~/runs", "--recipe=~/recipes/my recipe"],
                       cwd=base, env=env, capture_output=True, text=True, timeout=60)
    argv = next(r["argv"] for r in records(base / "argv") if r["argv"][:1] == ["run"] and "--name" in r["argv"])
    assert f"{home}/d.jsonl:/workspace/inputs/data/d.jsonl:ro" in argv, p.stderr
    assert f"{home}/runs:/workspace/runs" in argv and not (base / "~").exists()
    # a recipe folder's name as invoke run puts it in a run id (run.sh blamed a --run-id it was never given)
    run_dir = json.loads(next(a for a in argv if a.startswith("DOCKYARD_HOST_PATHS=")).split("=", 1)[1])
    assert "my recipe" in str(run_dir)
    assert re.search(r"--run-dir /workspace/runs/my-recipe-\d{8}-\d{6}\b", " ".join(argv)), argv
    p = subprocess.run(["sh", "run.sh", "--data=~nobody-here/d.jsonl"], cwd=base, env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 1 and ("--data=~nobody-here/d.jsonl: run.sh reads ~ as your home folder only: give the "
                                  "full path") in p.stderr


def test_a_file_named_like_an_option_is_mounted_not_the_folder_it_is_in(settings, tmp_path):
    (tmp_path / "-v.jsonl").write_text("{}\n")
    p, argv = _node(settings, tmp_path, "--data=-v.jsonl", "--run-id=r1")
    assert f"{tmp_path}/-v.jsonl:/workspace/inputs/data/-v.jsonl:ro" in argv
    assert argv[-2:] == ["--data", "/workspace/inputs/data/-v.jsonl"]


def test_a_path_with_a_newline_is_refused_before_docker_runs(settings, tmp_path):
    (tmp_path / "a\nb").write_text("{}\n")
    p, argv = _node(settings, tmp_path, "--data=a\nb", "--run-id=r1")
    assert p.returncode == 1 and "--data: the path holds a control character" in p.stderr and not argv


@pytest.mark.parametrize("image", ["-v", "x\ny", "a b", ""])
def test_an_image_that_is_not_a_reference_is_refused(settings, tmp_path, image):
    with pytest.raises(DockyardError, match="is not a docker reference"):
        runscript.render(settings, image, "cpu")
    p, argv = _node(settings, tmp_path, f"--image={image}")
    assert p.returncode == 1 and "is not an image reference" in p.stderr and not argv


@pytest.mark.parametrize("typed, said", [
    ("--data=/" + "é" * 300, "--data=/" + "é" * 116 + "...: no such file"),  # a path: its first 117 characters
    ("--nproc=" + "é" * 300, "--nproc=" + "é" * 57 + "...: give a whole number"),  # a value: its first 57
    ("--nproc=" + "a" * 40 + "é" * 300, "--nproc=" + "a" * 40 + "é" * 17 + "...: give"),
])
def test_a_long_value_is_cut_between_two_characters_not_inside_one(settings, tmp_path, typed, said):
    """run.sh's short() counted and cut bytes under dash (the sh it runs under): a value of é (two bytes each) was said
    by 28 and a half of them, the half a byte no UTF-8 reader takes. It counts and cuts characters now."""
    p, argv = _node(settings, tmp_path, typed)  # its stderr read as UTF-8: half a character fails here
    assert p.returncode == 1 and not argv and said in p.stderr, p.stderr[:600]
