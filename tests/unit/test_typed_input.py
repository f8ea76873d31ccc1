"""Every value a user types, through the real `invoke` CLI (in this process: Invoke's Program, tasks.py, invoke.yaml):
each number flag of every task, each setting as INVOKE_DOCKYARD_<KEY> or in a config file, unknown keys. Whatever is
typed, the outcome is the task going on or one short `error:` line naming what was wrong, and a non-zero exit;
never a traceback (an exception escaping Program.run fails the test)."""

from __future__ import annotations

import contextlib
import math
import os
import re
import shlex
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from invoke import Collection

import tasks
from dockyard import cli
from dockyard.cli import TypedFlag
from dockyard.settings import Settings
from tests.support.cli import invoke, invoke_here, short_error

# What stops each task right after its flags are read, without an engine, a GPU or a network: a dry run, a file in
# a temporary folder, or a refusal of another flag. A task that gains a number flag must get a line here.
STOP_EARLY = {
    "run": ["--dry", "--variant=cpu"],
    "slurm": ["--out={tmp}/job.sbatch"],
    "k8s": ["--out={tmp}/k8s"],
    "plan": ["--model=8B", "--gpus=1", "--gpu-mem=80", "--cpu-mem=64"],
    "save": ["--compress=none-such"],
    "ship": [],
    "doctor": ["--record=/nonexistent/folder/host.json"],
}

COLLECTION = Collection.from_module(tasks)
NUMBER_FLAGS = sorted((name, arg.names[0], arg.kind is int)
                      for name, t in COLLECTION.tasks.items() for arg in t.get_arguments() if isinstance(arg, TypedFlag))

# text with no NUL (no argv or environment can hold one) and no lone surrogates
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)
NUMBERISH = st.one_of(
    st.integers(-10**30, 10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["nan", "inf", "-inf", "NaN", "1e400", "two", "", " ", "0x10", "1_0", "2.5", "-0", "+3", "٣"]),
    TEXT,
)
TAKES_AUTO = {"batch", "seq-len"}  # flags.Batch, flags.Tokens: auto, or a whole number
FEW = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
FEWER = settings(FEW, max_examples=15)  # a setting: 19 keys, each through two ways in


def _plain_number(text: str, whole: bool) -> float | None:
    """The number a user meant, for the flags that say GiB, counts, ports: decimal digits (with a point for GiB)."""
    digits = "[0-9]+"  # ASCII: a count typed as `٣` or `1_0` is refused, not guessed at
    pattern = rf"[+-]?{digits}" if whole else rf"[+-]?({digits}\.?[0-9]*|\.{digits})([eE][+-]?{digits})?"
    if not re.fullmatch(pattern, text.strip()):
        return None
    value = float(text.strip())
    return value if math.isfinite(value) else None


def test_every_number_flag_is_covered():
    assert NUMBER_FLAGS, "tasks.py has number flags"
    assert {t for t, _, _ in NUMBER_FLAGS} <= set(STOP_EARLY), "a task with a number flag needs a STOP_EARLY line"


@pytest.mark.parametrize("task,flag,whole", NUMBER_FLAGS)
@FEW
@given(value=NUMBERISH)
@example(value=" auto")  # a word, yet what --batch takes (plan's micro-batch): hypothesis drew it once, and CI failed
def test_a_number_flag_is_its_number_or_a_short_error_naming_it(task, flag, whole, value, tmp_path):
    args = [a.format(tmp=tmp_path) for a in STOP_EARLY[task] if not a.startswith(f"--{flag}=")]  # once each
    r = invoke_here(task, *args, f"--{flag}={value}", env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    assert "Traceback" not in r.stderr
    number = 0.0 if flag in TAKES_AUTO and value.strip() == "auto" else _plain_number(value, whole)
    if number is None or number < 0:
        short_error(r, f"--{flag}=")  # not a number of this kind (a word, nan, inf, 2.5 for a count), or negative
    elif number > 10**9:
        short_error(r, f"--{flag}=")  # no count, port, size or time of that order makes sense
    elif r.returncode:
        short_error(r, "")  # refused by this flag's range or by the task itself: still one line


@pytest.mark.parametrize("task,flag,whole", NUMBER_FLAGS)
@pytest.mark.parametrize("sign", ["", "-"])
def test_a_number_flag_given_thousands_of_digits_is_one_short_line_naming_its_range(task, flag, whole, sign, tmp_path):
    """`invoke run --nproc=<5,000 digits>` said pydantic's "Unable to parse input string as an integer, exceeded
    maximum size" after 57 of the digits, and no range: the flags' bounds were not read (a bound set after Whole is in
    pydantic's schema as `le`, not `maximum`). Now: `--nproc (a number of 5,000 digits): takes a whole number from 0
    to 4096`, as an out-of-range count is said."""
    args = [a.format(tmp=tmp_path) for a in STOP_EARLY[task] if not a.startswith(f"--{flag}=")]
    r = invoke_here(task, *args, f"--{flag}={sign}{'9' * 5000}", env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    short_error(r, f"--{flag} (a number of 5,000 digits): takes a ")
    said = r.stderr.strip()
    assert "99999" not in said and "Unable to parse" not in said and len(said) < 200, said
    assert re.search(r": takes (a whole number|a number) from \d+ to \d+", said), said  # --node-rank: 0 to 4095


@pytest.mark.parametrize("task,flag,whole", NUMBER_FLAGS)
def test_a_number_flag_shows_that_it_takes_a_value(task, flag, whole):
    """Not shown as a switch, and as what it takes: a size in GiB was shown `--gpu-mem=STRING` (it takes a number
    only: `80GB` is refused), plan's micro-batch `--batch=INT` (it takes auto too)."""
    r = invoke_here("--help", task)
    line = next(x for x in r.stdout.splitlines() if re.match(rf"\s+--{flag}[= ]", x))
    form = r"auto\|INT" if flag in TAKES_AUTO else "INT" if whole else "GIB"
    assert re.search(rf"--{flag}={form} ", line), line


@pytest.mark.parametrize("task", sorted(COLLECTION.tasks))
def test_dash_h_is_help_on_every_task_and_no_flag_has_a_one_letter_form(task):
    r = invoke_here(task, "-h")
    assert r.returncode == 0 and f"Usage: inv[oke] [--core-opts] {task}" in r.stdout, r.stderr
    options = r.stdout.split("Options:", 1)[-1]
    assert not re.search(r"^\s+-[a-zA-Z]( [A-Z]+)?, --", options, re.M), options  # `-x, --long`: none


@contextlib.contextmanager
def settings_the_task_runs_with():
    """The Settings every task is given (dockyard.cli.task_settings, which `checked` calls before any task runs and
    tasks.py's own `_settings` calls again), recorded as Invoke's Program runs the task in this process."""
    taken, real = [], cli.task_settings

    def recording(c):
        taken.append(real(c))
        return taken[-1]

    cli.task_settings = recording
    try:
        yield taken
    finally:
        cli.task_settings = real


def taken_as_given(key: str, loaded, value) -> None:
    """A setting that was not refused is the value the user gave, in its field's type: text as typed, a path as the
    path it names, a number as that number, a command as the words a shell would split it into (a `~` word expanded,
    as a shell would), the docker client as its path with `~` expanded."""
    if key in ("ssh", "compose"):
        words = [os.path.expanduser(w) if w.startswith("~") else w for w in shlex.split(value)]
        assert shlex.split(loaded) == words, (loaded, value)
    elif key == "docker":
        assert loaded == os.path.expanduser(value), (loaded, value)
    elif Settings.model_fields[key].annotation is Path:
        assert loaded == Path(value), (loaded, value)
    elif Settings.model_fields[key].annotation is float:
        assert loaded == float(value), (loaded, value)
    else:
        assert loaded == value and type(loaded) is str, (loaded, value)


@pytest.mark.parametrize("key", sorted(Settings.model_fields))
@FEWER
@given(value=TEXT)
@example(value="2.5")  # taken by every setting but the docker client (a number, a name, a path, a command)
@example(value="~/bin/tool --flag 'a b'")  # a command of words, a path as written
def test_a_setting_from_the_environment_is_taken_or_a_short_error_naming_it(key, value):
    with settings_the_task_runs_with() as taken:
        r = invoke_here("recipes", env={f"INVOKE_DOCKYARD_{key.upper()}": value})
    if r.returncode:
        short_error(r, f"INVOKE_DOCKYARD_{key.upper()}")
    else:
        assert taken, r.stderr
        taken_as_given(key, getattr(taken[-1], key), value)


@pytest.mark.parametrize("key", sorted(Settings.model_fields))
@FEWER
@given(value=st.one_of(TEXT, st.integers(), st.floats(), st.booleans(), st.none(), st.lists(st.integers(), max_size=2)))
@example(value="2.5")
@example(value=3)
@example(value="~/bin/tool --flag 'a b'")
def test_a_setting_in_a_config_file_is_taken_or_a_short_error_naming_it(key, value, tmp_path):
    # the environment wins over any file: the suite's own INVOKE_DOCKYARD_* (its compose, docker, caches) would hide
    # the file's value, which then went unchecked (the autouse process_state_as_it_was puts it back)
    os.environ.pop(f"INVOKE_DOCKYARD_{key.upper()}", None)
    config = tmp_path / "mine.yaml"
    config.write_text(yaml.safe_dump({"dockyard": {key: value}}))
    with settings_the_task_runs_with() as taken:
        r = invoke_here("-f", str(config), "recipes")
    if r.returncode:
        short_error(r, f"dockyard.{key}")
    else:
        assert taken, r.stderr
        taken_as_given(key, getattr(taken[-1], key), value)


@FEW
@given(name=st.from_regex(r"[A-Z][A-Z0-9_]{0,20}", fullmatch=True).filter(lambda n: n.lower() not in Settings.model_fields))
def test_an_unknown_setting_is_refused_listing_the_known_ones(name):
    r = invoke_here("recipes", env={f"INVOKE_DOCKYARD_{name}": "x"})
    short_error(r, f"INVOKE_DOCKYARD_{name}")
    assert "known: allowed_signers, base_image_cpu" in r.stderr


@pytest.mark.parametrize("value,says", [
    ("2.5", None), ("nan", "takes a number from 0 to"), ("-1", "takes a number from 0 to"),
    ("lots", "takes a number from 0 to")])
def test_the_layer_cache_size_from_the_environment(value, says):
    """The case of issue 25: Invoke's own cast of INVOKE_DOCKYARD_LAYER_CACHE_GB used to be a traceback."""
    r = invoke_here("recipes", env={"INVOKE_DOCKYARD_LAYER_CACHE_GB": value})
    if says is None:
        assert r.returncode == 0, r.stderr
    else:
        short_error(r, "INVOKE_DOCKYARD_LAYER_CACHE_GB", says)
        assert says in r.stderr


# The text flags of the tasks that can stop before acting (a dry run, or files written into a temporary folder):
# each flag given any text. The others act on images, engines and nodes: tests/unit/test_hostile_input.py.
DRY = {"run": ["--dry"], "plan": [], "slurm": ["--out={tmp}/job.sbatch"], "k8s": ["--out={tmp}/k8s"],
       "build": ["--dry"], "lock": ["--dry"], "wheelhouse": ["--dry"], "shell": ["--dry"], "export": ["--dry"]}
TEXT_FLAGS = sorted((name, arg.names[0]) for name, t in COLLECTION.tasks.items() if name in DRY
                    for arg in t.get_arguments() if arg.kind is str and not isinstance(arg, TypedFlag)
                    and arg.names[0] not in ("out", "record"))


def test_the_text_flags_tried_include_every_dry_task():
    assert {t for t, _ in TEXT_FLAGS} == set(DRY)


@pytest.mark.parametrize("task,flag", TEXT_FLAGS)
@FEWER
@given(value=TEXT)
@example(value="error: x")  # quoted in the error line, which is still one (CI drew "error" once)
def test_a_text_flag_of_a_dry_task_is_taken_or_ashort_error(task, flag, value, tmp_path):
    args = [a.format(tmp=tmp_path) for a in DRY[task]]
    r = invoke_here(task, *args, f"--{flag}={value}", env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    if r.returncode:
        short_error(r, "")
    else:  # taken: nothing went wrong on the way (a traceback printed by a thread or a logging handler exits 0)
        assert "Traceback" not in r.stderr + r.stdout and "--- Logging error ---" not in r.stderr, r.stderr[-3000:]


@pytest.mark.parametrize("args,says", [
    (["slurm", "--out={tmp}/job.sbatch", "--runtime=--archive"], "--runtime needs a value, as in --runtime=VALUE"),
    (["slurm", "--runtime"], "--runtime needs a value"),
    (["plan", "--nosuch=3"], "invoke plan has no flag --nosuch (`invoke --help plan`"),
    # the newcomer's way to ask whether one recipe fits, or one variant runs: plan and doctor cover them all at once
    (["plan", "--recipe=lora", "--model=7b"], "invoke plan has no flag --recipe (plan sizes every recipe at once, a row "
                                              "each, and recommends one: leave --recipe out)"),
    (["doctor", "--variant=cu128"], "invoke doctor has no flag --variant (doctor holds every variant against this "
                                    "host's driver, a `variant` row each: leave --variant out)"),
    # a trainer setting typed as the task's own flag (the `--` forgotten) is told where it goes; a typo of a flag is not
    (["run", "--recipe=lora", "--max_steps", "5"],
     "invoke run has no flag --max_steps (a trainer setting goes after a bare --, as in `invoke run --recipe=R -- "
     "--max_steps VALUE`)"),
    (["slurm", "--learning-rate=1e-4"], "goes after a bare --, as in `invoke slurm --recipe=R -- --learning_rate VALUE`"),
    # a newcomer's slips: a flag, a task or a recipe misspelt was refused without the name meant
    (["run", "--recipes=lora"], "invoke run has no flag --recipes (did you mean --recipe? `invoke --help run`"),
    (["run", "--varaint=cpu"], "invoke run has no flag --varaint (did you mean --variant? `invoke --help run`"),
    (["doctr"], "no task named 'doctr' (did you mean doctor? `invoke --list`"),
    # two letters swapped in a short name: difflib's likeness (0.67 for rnu and run) is below its cutoff
    (["rnu", "--dry"], "no task named 'rnu' (did you mean run? `invoke --list`"),
    (["run", "--dyr"], "invoke run has no flag --dyr (did you mean --dry? `invoke --help run`"),
    (["shell", "--cup"], "invoke shell has no flag --cup (did you mean --cpu? `invoke --help shell`"),
    # git's and docker's way of asking for help was a task not there, and no word of how to ask
    (["help", "run"], "no task named 'help': help on a task is `invoke --help run` (or `invoke run -h`)"),
    (["help"], "no task named 'help': help on a task is `invoke --help TASK` (or `invoke TASK -h`)"),
    (["run", "lroa"], "no task named 'lroa': a recipe is given as a flag, as in `invoke run --recipe=lora`"),
    # ... not one the user gave already, whose stray word is something else; and a flag in capitals is a slip too
    (["run", "--recipe=lora", "lroa"], "no task named 'lroa' (`invoke --list` lists the tasks)"),
    (["run", "--VARIANT=cpu"], "invoke run has no flag --VARIANT (did you mean --variant? `invoke --help run`"),
    (["plan", "--max_steps=3"], "invoke plan has no flag --max_steps (`invoke --help plan`"),
    (["run", "--dry=yes"], "--dry is a switch and takes no value"),
    (["run", "--dry="], "--dry is a switch and takes no value"),
    (["slurm", "--out={tmp}/job.sbatch", "--runtime=pyxis", "pyxis"], "no task named 'pyxis'"),
    (["nosuchtask"], "no task named 'nosuchtask' (`invoke --list`"),
    # a word past a file name's 255 bytes (a pasted hash), looked up as a recipe folder: ENAMETOOLONG's traceback
    (["run", "a" * 300], "no task named 'aaaaa"),
    (["a" * 300], "no task named 'aaaaa"),
    # an escape in the word, written escaped once (it was repr()'d twice over: 'ev\\x1bil')
    (["ev\x1bil"], "no task named 'ev\\x1bil' (`invoke --list`"),
    # the newcomer audit: a recipe given as a word was "no task named 'zero2' (`invoke --list` lists the tasks)"
    (["run", "zero2"], "no task named 'zero2': a recipe is given as a flag, as in `invoke run --recipe=zero2`"),
    (["slurm", "--nodes=2", "lora"], "no task named 'lora': a recipe is given as a flag, as in `invoke slurm "
                                     "--recipe=lora`"),
    (["run", "--dry", "--recipe=lora", "--recipe=ddp"], "--recipe is given twice: give it once, as in --recipe=ddp"),
    (["plan", "--model", "1B", "--gpus", "1", "--gpus", "2"], "--gpus is given twice"),
    (["--help", "nosuchtask"], "no task named 'nosuchtask'"),
])
def test_what_invokes_parser_refuses_is_one_error_line(args, says, tmp_path):
    """A flag with no value (a value starting with '-' is read as another flag), a switch given a value, an unknown
    flag or task, help on a task that is not there: Invoke's parser refuses them before any task runs, in its own
    words ('Flag <Argument: runtime> needed value and was not given one!'); the user gets dockyard's one `error:`
    line instead, exit 1."""
    r = invoke_here(*[a.format(tmp=tmp_path) for a in args])
    short_error(r, says)
    assert r.returncode == 1 and "<Argument" not in r.stderr


LONG = "zero2-" + "x" * 4994  # a name of 5,000 characters: a pasted file, a variable holding one


@pytest.mark.parametrize("args,says", [
    ([LONG], "no task named 'zero2-xxx"),
    (["run", LONG], "no task named 'zero2-xxx"),
    (["--help", LONG], "no task named 'zero2-xxx"),
    (["run", f"--{LONG}"], "invoke run has no flag --zero2-xxx"),
    (["run", "--recipe=lora", f"--{LONG}=1"], "invoke run has no flag --zero2-xxx"),
    (["run", "--dry", f"--recipe={LONG}", f"--recipe={LONG}"], "--recipe is given twice: give it once, as in --recipe=zero2-x"),
    (["plan", "--model=1B", "--", LONG], "plan takes nothing after -- (zero2-xxx"),
])
def test_a_task_or_flag_name_of_thousands_of_characters_is_said_by_its_start(args, says):
    """`invoke <5,000 characters>` and `invoke run --<5,000 characters>` echoed the name whole, a screen of it, where
    every value a message quotes is cut (errors.short, errors.cut). Now its first 60 characters and an ellipsis:
    enough to recognise what was typed; the rest of the line (what to do) is still said."""
    r = invoke_here(*args)
    short_error(r, says)
    said = r.stderr.strip()
    assert "x" * 100 not in said and len(said) < 300 and "..." in said, said


@pytest.mark.parametrize("args,says", [
    (["slurm", "--out={tmp}/out", "--dry"], "invoke slurm has no --dry; the tasks with one: build, export"),
    (["save", "--dry"], "invoke save has no --dry; the tasks with one: build, export"),
    (["run", "--dry", "save", "-R"], "invoke save has no --dry; the tasks with one: build, export"),
    (["k8s", "--out={tmp}/out", "--dry"], "as in `invoke run --dry`"),
    (["-R", "slurm", "--out={tmp}/out"], "Invoke's own --dry would not stop the task"),
    (["--dry", "run", "--variant=cpu"], "as in `invoke run --dry`"),
    (["slurm", "--out={tmp}/out", "--echo"], "invoke slurm has no flag --echo (`invoke --help slurm`"),
    (["run", "--dry", "k8s", "--out={tmp}/out", "-w"], "invoke k8s has no flag -w"),
    (["plan", "--model=1B", "--gpus=1", "--gpu-mem=80", "--", "--seq-len", "99999"],
     "plan takes nothing after -- (--seq-len 99999): only k8s, run, slurm pass what follows it to the trainer"),
])
def test_invokes_own_flags_after_a_task_are_refused_and_the_task_does_nothing(args, says, tmp_path):
    """Invoke reads its own flags after a task's name too: `invoke slurm --dry` was Invoke's --dry (it only echoes
    shell commands) and the task ran for real, writing its files (`invoke save --dry` wrote the archive). And a task
    that does not pass the overrides after `--` to the trainer ignored them without a word. A --dry after the name of a
    task that has none is said to be that: `invoke save --dry` was told to give --dry after the task's name, as it was."""
    r = invoke_here(*[a.format(tmp=tmp_path) for a in args])
    short_error(r, says)
    assert r.returncode == 1 and not (tmp_path / "out").exists()
    assert invoke_here("slurm", "--help").returncode == 0  # --help after a task stays help on it


def recording_engine(tmp_path: Path) -> dict[str, str]:
    """The settings of a line's test: a stand-in docker that records any call in tmp_path/docker-used and answers
    nothing, a private image name, runs and dist folders in tmp_path."""
    docker = tmp_path / "docker"
    docker.write_text(f'#!/bin/sh\necho "$*" >>"{tmp_path}/docker-used"\nexit 1\n')
    docker.chmod(0o755)
    return {"INVOKE_DOCKYARD_DOCKER": str(docker), "INVOKE_DOCKYARD_IMAGE_NAME": "dockyard-test-private",
            "INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs"), "INVOKE_DOCKYARD_DIST_DIR": str(tmp_path / "dist")}


@pytest.mark.parametrize("args,says", [
    (["shell", "--variant=cpu", "run", "--variant=cpu", "--dry"],
     "--dry was given to run, but shell was not, and would run for real: Invoke gives a flag to the task it follows, "
     "so give --dry after each task's name (`invoke shell --dry run --dry`)"),
    (["save", "--variant=cpu", "run", "--recipe=zero2", "--dry"],
     "--dry was given to run, but save has no --dry, and would run for real: Invoke gives a flag to the task it "
     "follows, so give --dry after each task's name (`invoke run --dry`), and run save on its own"),
])
def test_a_dry_given_to_one_task_of_several_is_refused_before_any_runs(args, says, tmp_path):
    """The newcomer's walk: `invoke build run --recipe=zer2 --dry` (the README's `build run` line, --dry added to
    see it) built the image for real and moved its tag, then refused the recipe: Invoke gives --dry to the task it
    follows. A line where --dry reaches some tasks and not others is refused before any task asks the engine (a
    stand-in here, which records any call, and a private image name)."""
    env = recording_engine(tmp_path)
    r = invoke_here(*args, env=env)
    short_error(r, says)
    assert r.returncode == 1 and not (tmp_path / "docker-used").exists() and not (tmp_path / "dist").exists()
    assert "--dry was given" not in invoke_here("shell", "--dry", "run", "--dry", env=env).stderr  # each its own


@pytest.mark.parametrize("first,says", [(["recipes"], "zero2"), (["runs"], ""), (["doctor"], "check")])
def test_a_task_that_only_looks_beside_a_dry_run_is_not_refused(first, says, tmp_path):
    """`invoke doctor run --dry` (check the host, then see the run's command), `invoke recipes run --dry`: each task
    worked on its own line and together before 0cb8394, whose check of a --dry given to some tasks refused them as
    'doctor has no --dry, and would run for real'; these tasks change nothing, so there is nothing to run dry. The
    line runs both (a stand-in docker that answers nothing: the run's command is still printed; doctor's failed
    engine check ends the line there, as on its own)."""
    docker = tmp_path / "docker"
    docker.write_text("#!/bin/sh\nexit 1\n")
    docker.chmod(0o755)
    env = {"INVOKE_DOCKYARD_DOCKER": str(docker), "INVOKE_DOCKYARD_IMAGE_NAME": "dockyard-test-private",
           "INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")}
    r = invoke_here(*first, "run", "--dry", "--recipe=ddp", env=env)
    assert "--dry was given" not in r.stderr and says in r.stdout, r.stderr  # the first task ran
    if first != ["doctor"]:
        assert r.returncode == 0 and "dockyard.train --recipe ddp" in r.stderr, r.stderr  # its command, printed
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.parametrize("args", [["save", "--variant=cpu", "run", "--recipe=zer2"],
                                  ["shell", "--variant=cpu", "k8s", "--recipe={tmp}/mien", "--out={tmp}/out"]])
def test_a_recipe_of_a_later_task_that_is_not_there_is_refused_before_the_first_task_runs(args, tmp_path):
    """The newcomer's walk: `invoke build run --recipe=zer2` (the README's quick start, with a slip) built the image
    (a quarter of an hour for a CUDA one) and only then heard "unknown recipe 'zer2'": each task checks its flags as
    it starts. A line of several tasks has its --recipe values found first, and is refused, naming the task and the
    recipe meant, before any task asks the engine (a stand-in here, which records any call)."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "recipe.yaml").write_text("# invoke run --recipe=mine\nwhen: Mine.\nstrategy: zero2\n")
    env = recording_engine(tmp_path)
    r = invoke_here(*[a.format(tmp=tmp_path) for a in args], env=env)
    task, meant = ("run", "did you mean zero2?") if "run" in args else ("k8s", f"(did you mean {tmp_path}/mine?)")
    short_error(r, f"invoke {task}: unknown recipe ")
    assert meant in r.stderr and "(nothing ran: the line's tasks start only once every one's recipe is found)" \
        in r.stderr, r.stderr
    assert r.returncode == 1 and not (tmp_path / "docker-used").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, says", [
    (["build", "run", "--recipe=zero2", "--", "--max_stepz", "5"], "invoke run: unknown trainer override(s): "
                                                                    "--max_stepz (did you mean --max_steps?)"),
    (["save", "--variant=cpu", "run", "--", "--learning_rate", "-1"], "invoke run: learning_rate -1: "),
    (["build", "slurm", "--", "--lora_r", "8"], "invoke slurm: lora_r in the overrides after --: recipe zero2 trains the whole")])
def test_a_trainer_override_a_later_task_refuses_is_refused_before_the_first_task_runs(args, says, tmp_path):
    """`invoke build run -- --max_stepz 5` built the image (minutes; a quarter of an hour for a CUDA one) and only
    then heard "unknown trainer override --max_stepz". A line of several tasks has its overrides checked first, as
    the run checks them against its recipe, before any task asks the engine (a stand-in here, which records any
    call); overrides the recipe takes go on to the tasks."""
    env = recording_engine(tmp_path)
    r = invoke_here(*args, env=env)
    short_error(r, says)
    assert "(nothing ran: the line's tasks start only once its overrides are taken)" in r.stderr, r.stderr
    assert r.returncode == 1 and not (tmp_path / "docker-used").exists()
    r = invoke_here("build", "run", "--recipe=lora", "--", "--lora_r", "8", env=env)  # taken: build asks the engine
    assert "override" not in r.stderr and (tmp_path / "docker-used").exists(), r.stderr


@pytest.mark.parametrize("args", [["build", "run", "--recipe=zer2", "--help"], ["build", "run", "--dry", "-h"]])
def test_help_asked_on_a_line_of_several_tasks_is_answered_not_the_lines_checks(args, tmp_path):
    """`invoke build run --recipe=zer2 --help` (a newcomer asking how to name the recipe) was refused for the recipe
    ('unknown recipe zer2 ... nothing ran'), and `invoke build run --dry -h` for --dry given to run alone: the line's
    checks answered where Invoke answers --help with run's help and runs nothing."""
    r = invoke_here(*args, env=recording_engine(tmp_path))
    assert r.returncode == 0 and "Usage:" in r.stdout and "--recipe" in r.stdout, r.stderr
    assert "error" not in r.stderr and not (tmp_path / "docker-used").exists(), r.stderr


def test_shell_completion_still_answers():
    """The shell's completion runs `invoke --complete -- invoke ru`: what follows -- there is the line typed, not
    trainer overrides (refusing it left Tab completing nothing, with an error in the terminal)."""
    tasks_ = invoke_here("--complete", "--", "invoke", "ru")
    flags = invoke_here("--complete", "--", "invoke", "run", "--re")
    assert tasks_.returncode == 0 and "run" in tasks_.stdout.split(), tasks_.stderr
    assert flags.returncode == 0 and "--recipe" in flags.stdout.split(), flags.stderr


def test_the_invoke_executable_rewords_a_parser_refusal_too():
    """As above, through the `invoke` a user types (a new process: tasks.py is imported before the flags are read)."""
    r = invoke("slurm", "--runtime")
    short_error(r, "--runtime needs a value")
    assert r.returncode == 1


@pytest.mark.parametrize("args", [["plan", "--model=8B", "--gpus=1", "--gpu-mem=80", "--json"], ["recipes"],
                                  ["--help", "run"], ["--list"]])
def test_a_reader_that_leaves_early_is_no_traceback(args):
    """`invoke plan --json | head -5` printed a BrokenPipeError traceback when head had read its lines and gone;
    so did `invoke --help run | head -1` and `invoke --list | head`, Invoke's own printing (a bare `invoke --help`
    Invoke prints before it reads tasks.py: no code of the project runs there)."""
    import os
    import subprocess
    import sys

    from dockyard import ROOT

    read, write = os.pipe()
    os.close(read)  # the reader is gone before the task prints
    try:
        r = subprocess.run([sys.executable, "-m", "invoke", *args], stdout=write, stderr=subprocess.PIPE, text=True,
                           cwd=ROOT, timeout=120)
    finally:
        os.close(write)
    assert "Traceback" not in r.stderr and "BrokenPipeError" not in r.stderr, r.stderr
    assert r.returncode == 1  # not success: nothing was read of it (rich stops its tables so too)


def _place_flags() -> list[tuple[str, str]]:
    import typing

    from dockyard import flags

    out = []
    for name, t in COLLECTION.tasks.items():
        hints = typing.get_type_hints(t.body.__wrapped__, globalns={**vars(flags), **vars(tasks)}, include_extras=True)
        out += [(name, flag.replace("_", "-")) for flag, hint in hints.items() if hint == flags.Place]
    return sorted(out)


PLACE_FLAGS = _place_flags()


def test_the_paths_users_give_are_place_flags():
    assert {("save", "out"), ("export", "out"), ("k8s", "out"), ("slurm", "out"), ("inventory", "out"),
            ("doctor", "record"), ("run", "data"), ("load", "file")} <= set(PLACE_FLAGS)


@pytest.mark.parametrize("task,flag", PLACE_FLAGS)
@pytest.mark.parametrize("value,says", [("~no-such-user-here/x", "no user 'no-such-user-here'"),
                                        ("/tmp/" + "x" * 300 + "/y", "longer than the 255 bytes")])
def test_a_path_no_file_could_have_is_one_error_and_nothing_is_made(task, flag, value, says, tmp_path, monkeypatch):
    """`--out=~nouser/x` was a folder named `~nouser` in the current one (an export wrote a whole model there); a
    part longer than a file name was a traceback (File name too long)."""
    monkeypatch.chdir(tmp_path)
    r = invoke_here(task, f"--{flag}={value}", env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    short_error(r, f"--{flag}")
    assert says in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_path_from_home_is_taken_from_home(tmp_path, monkeypatch):
    """The shell leaves `--out=~/x` as it is: the task expands it, for the user that runs it."""
    monkeypatch.setenv("HOME", str(tmp_path))
    r = invoke_here("slurm", "--recipe=ddp", "--nodes=2", "--out=~/job.sbatch",
                    env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    assert r.returncode == 0, r.stderr
    assert "#SBATCH" in (tmp_path / "job.sbatch").read_text()


@pytest.mark.parametrize("key", ["data", "model", "eval_data"])
@pytest.mark.parametrize("native", [[], ["--native"]])
def test_a_path_override_no_file_could_have_is_one_short_line_naming_it(key, native, tmp_path):
    """`invoke run --dry -- --data=<5,000 characters>` (a path after the dashes, which no Place flag reads) fell to
    the catch-all: the 5,000 characters, then 'File name too long', naming no setting. Now the override, its path
    cut to 120 characters, and what a path holds."""
    r = invoke_here("run", "--dry", "--variant=cpu", *native, "--", f"--{key}=/tmp/{'7' * 5000}",
                    env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    short_error(r, f"-- --{key} /tmp/777")
    assert "no path this host can have (File name too long: a name holds at most 255 bytes" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()[-1]) < 300, r.stderr


@pytest.mark.parametrize("typed", ["help", "-h", "--help", "--h", "-help"])
def test_help_asked_after_the_dashes_is_answered_with_where_help_is(typed, tmp_path):
    """`invoke run -- help` (or -h, or --help: the trainer's options asked for) said "override 'help' is not of the
    form --key value: write it --help", and `-- --help` then "unknown trainer override(s): --help", a way round to
    nowhere. Each now says where help is: the task's, and what after `--` takes."""
    r = invoke_here("run", "--dry", "--variant=cpu", "--", typed, env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    short_error(r, "`invoke --help run`")
    assert "write it" not in r.stderr and "recipes/defaults.yaml" in r.stderr, r.stderr


@pytest.mark.parametrize("args", [["run", "--dry", "--variant={long}"], ["shell", "--dry", "--variant={long}"],
                                  ["lock", "--variant={long}"], ["save", "--image={long}", "--out={tmp}/dist"],
                                  ["run", "--dry", "--variant=cpu", "--", "--{long}", "1"]])
def test_a_name_of_thousands_of_characters_is_said_cut(args, tmp_path):
    """A variant, an image or a trainer setting's name given 5,000 characters (a variable holding a file, a paste)
    was said whole: 'unknown variant '<5,000 characters>'; valid: ...', 'image '<5,000>' is not a docker reference',
    'unknown trainer override(s): --<5,000>'. Each is one line that still names the flag and what it takes."""
    long = "a" * 5000
    r = invoke_here(*[a.format(long=long, tmp=tmp_path) for a in args],
                    env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    short_error(r, "unknown variant", "is not a docker reference", "unknown trainer override")
    assert len(r.stderr) < 600, len(r.stderr)
