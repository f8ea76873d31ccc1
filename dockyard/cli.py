"""How a task reads its flags: every value a user types is checked in one place before the task runs.

Invoke casts a flag with the type of its default (`int('two')` is a ValueError inside Invoke, before any task
code). Here numbers reach the task as typed and pydantic turns them into the type the task annotates
(dockyard/flags.py: finite, in range), so a bad value is a short error and a non-zero exit. Flags have no
one-letter forms: `-h` is help on every task. Only Invoke is imported here: `invoke --list` stays fast.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import os
import re
import signal
import sys
import threading
import typing
from typing import Any

import invoke
from invoke import Argument, Exit, ParseError, Task

from dockyard import ENV_PREFIX
from dockyard.common.errors import cut, raised_outside_a_class_being_built, shown

_held: dict[str, str] = {}


def hold_setting_overrides() -> None:
    """Keep INVOKE_DOCKYARD_* out of the environment while Invoke loads its config; a task gets them back (`checked`).

    Invoke casts an override to the type of the value the config files hold (`int('2.5')` for a size written `20`)
    and fails with a traceback before any task code. dockyard.settings reads them itself, as typed, with the same
    model as invoke.yaml. Called when tasks.py is imported, which Invoke does before it reads the environment."""
    _held.clear()
    for key in [k for k in os.environ if k.startswith(ENV_PREFIX)]:
        _held[key] = os.environ.pop(key)


def release_setting_overrides() -> None:
    """Put the held INVOKE_DOCKYARD_* back: for a task (its settings, what it starts), or a process that imported
    tasks.py without being Invoke (the tests)."""
    os.environ.update(_held)


_TAKES_OVERRIDES: set[str] = set()


def explain_parse_errors(takes_overrides: set[str] = frozenset()) -> None:
    """Reword what Invoke's parser refuses (a flag with no value, a switch given one, a flag or task it does not know,
    `--help` for a task that is not there) as dockyard's one `error:` line, instead of Invoke's own words ("Flag
    <Argument: runtime> needed value and was not given one!"), which Program.run prints as they are and exits 1.
    Called when tasks.py is imported, which Invoke does before it parses the tasks' flags; the exit stays 1.
    `takes_overrides`: the tasks that pass what follows `--` to the trainer; the others refuse it."""
    _TAKES_OVERRIDES.update(takes_overrides)
    for name in ("parse_tasks", "parse_cleanup"):
        parse = getattr(invoke.Program, name)
        if not getattr(parse, "explained", False):
            setattr(invoke.Program, name, _explaining(parse, name))
    for name in ("print_help", "print_task_help", "list_tasks", "print_version"):
        say = getattr(invoke.Program, name)
        if not getattr(say, "explained", False):
            setattr(invoke.Program, name, _quiet_when_the_reader_leaves(say))
    help_for = invoke.parser.ParserContext.help_for
    if not getattr(help_for, "explained", False):
        invoke.parser.ParserContext.help_for = _with_value_forms(help_for)


def stop_quietly_for_a_reader_that_left() -> None:
    """The reader of stdout left (`invoke plan --json | head`, `invoke --help run | head -1`): stop with 1 and no
    traceback, as rich does for its tables; stdout to /dev/null, or the flush at exit raises again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    raise Exit(code=1)


def _quiet_when_the_reader_leaves(say):
    @functools.wraps(say)
    def wrapper(*args, **kwargs):
        try:
            return say(*args, **kwargs)
        except BrokenPipeError:
            stop_quietly_for_a_reader_that_left()

    wrapper.explained = True
    return wrapper


def _with_value_forms(help_for):
    """`--batch=auto|INT` and `--gpu-mem=GIB` in a task's help, where Invoke, which names only the kinds INT and
    STRING, showed `--batch=INT` (it takes auto too) and `--gpu-mem=STRING` (it takes a number only)."""
    @functools.wraps(help_for)
    def wrapper(self, flag):
        names, text = help_for(self, flag)
        form = getattr(self.flags[flag], "form", "")
        return (re.sub(r"=(INT|STRING)\b", f"={form}", names) if form else names), text

    wrapper.explained = True
    return wrapper


def explain_config_errors() -> None:
    """A config file Invoke cannot take (invoke.yaml with a YAML syntax error, a folder named invoke.yaml, a file given
    with -f that is not `key: value` lines or gives a setting another shape) is one `error:` line naming the file and
    the problem, exit 1, instead of a traceback on every command, `invoke --list` included. Called when tasks.py is
    imported, which Invoke does before it reads the project's file and -f's; /etc/invoke.yaml and ~/.invoke.yaml it
    reads earlier, before any code of the project runs."""
    for name in ("_load_yaml", "_load_yml", "_load_json", "_load_py", "_load_file"):
        load = getattr(invoke.Config, name)
        if not getattr(load, "explained", False):
            setattr(invoke.Config, name, _known_type(load) if name == "_load_file" else _reading(load))


def _reading(load):
    @functools.wraps(load)
    def wrapper(self, path):
        try:
            data = load(self, path)
        except FileNotFoundError:
            raise  # Invoke tries invoke.yaml, .yml, .json in turn and skips those that are not there
        except Exception as e:  # noqa: BLE001 (PyYAML's constructors raise ValueError, IndexError... as well)
            raise Exit(f"error: {shown(unreadable_config(path, e))}", code=1) from None
        if data is not None and not isinstance(data, dict):
            raise Exit(f"error: {shown(str(path))}: expected `key: value` lines at the top level (dockyard: ...)", code=1)
        if at_fault := earlier_file_at_fault(self, path, data or {}):
            raise Exit(f"error: {shown(at_fault)}", code=1)
        if odd := odd_entry(data or {}, self._config):
            raise Exit(f"error: {shown(f'{path}: {odd}')}", code=1)
        return data

    wrapper.explained = True
    return wrapper


def _known_type(load_file):
    @functools.wraps(load_file)
    def wrapper(self, prefix, *args, **kwargs):
        given = getattr(self, "_runtime_path", None) if prefix == "runtime" else None  # -f FILE
        if given and not os.path.exists(os.path.expanduser(given)):  # Invoke skipped it without a word
            flagged = any(a in ("-f", "--config") or a.startswith(("-f", "--config=")) for a in sys.argv[1:])
            named = f"-f {given}" if flagged else f"INVOKE_RUNTIME_CONFIG={given}"  # Invoke reads either
            raise Exit(f"error: {shown(named)}: no such file (a config file to read)", code=1)
        try:
            return load_file(self, prefix, *args, **kwargs)
        except invoke.exceptions.UnknownFileType as e:  # -f FILE without .yaml, .yml, .json or .py
            raise Exit(f"error: {shown(str(e))}", code=1) from None

    wrapper.explained = True
    return wrapper


def earlier_file_at_fault(config, path, data: dict) -> str | None:
    """The refusal when a file Invoke read before this one (~/.invoke.yaml, /etc/invoke.yaml) gave one of its top-level
    settings another shape (`dockyard: 5`): that file is the one to fix, not this one, which odd_entry would name."""
    for layer in ("user", "system"):
        earlier, where = getattr(config, f"_{layer}", None) or {}, getattr(config, f"_{layer}_path", None)
        if not where or str(where) == str(path):
            continue
        for key, value in earlier.items():
            if key in data and isinstance(value, dict) != isinstance(data[key], dict):
                shape = "`key: value` lines" if isinstance(data[key], dict) else "one value"
                return (f"{where}: {key} must hold {shape}, as in {path}, not "
                        f"{'`key: value` lines' if isinstance(value, dict) else repr(value)[:40]}")
    return None


def odd_entry(data: dict, have: dict, where: str = "") -> str | None:
    """The first entry, at any depth, Invoke would fail on later with a traceback: a key that is not text (YAML reads
    `1:` and `true:` as a number and a bool; Invoke joins keys into environment variable names when a task runs), or
    a setting given another shape than the config read before (`have`: Invoke's defaults, then the files in order)."""
    for key, value in data.items():
        at = f"{where}.{key}" if where else str(key)
        if not isinstance(key, str):
            return f"the key {at} is not text: quote it"
        before = have.get(key)
        if key in have and isinstance(value, dict) != isinstance(before, dict):
            shape = "`key: value` lines" if isinstance(before, dict) else "one value"
            return (f"{at} must hold {shape}, as in the config read before this file (Invoke's own, invoke.yaml), "
                    f"not {'`key: value` lines' if isinstance(value, dict) else repr(value)[:40]}")
        if isinstance(value, dict) and (odd := odd_entry(value, before if isinstance(before, dict) else {}, at)):
            return odd
    return None


def unreadable_config(path, e: Exception) -> str:
    """Why Invoke could not read config file `path`, in one line."""
    from dockyard.common.errors import yaml_problem

    if isinstance(e, OSError):
        return f"cannot read the config file {path} ({e.strerror or e})"
    if isinstance(e, UnicodeDecodeError):
        return f"the config file {path} is not UTF-8 text ({e.reason} at byte {e.start})"
    if str(path).endswith(".py"):  # Invoke runs it and takes its names
        return f"the config file {path} is not one Invoke can take: {type(e).__name__}: {str(e).splitlines()[0]}"
    return f"the config file {path} is not valid {'JSON' if str(path).endswith('.json') else 'YAML'}: {yaml_problem(e)}"


def _explaining(parse, name: str):
    @functools.wraps(parse)
    def wrapper(self) -> None:
        try:
            parse(self)
        except ParseError as e:
            raise ParseError(f"error: {shown(reworded(e, self.core.unparsed, self.collection.task_names))}",
                             e.context) from None
        if name == "parse_tasks" and (refused := invokes_own_flags(self) or empty_value(self) or dry_for_some(self)
                                              or a_recipe_of_the_line(self) or overrides_of_the_line(self)):
            raise ParseError(f"error: {shown(refused)}")

    wrapper.explained = True
    return wrapper


def empty_value(program: invoke.Program) -> str | None:
    """A flag given an empty value (`--data=`, `--data ""`): a variable left unset in a script (`--data=$DATA`) ran
    on the flag's default, the sample data, without a word. The refusal, or None."""
    task, tokens = "", program.core.unparsed
    for i, token in enumerate(tokens):
        if token == "--":
            break
        if token in program.collection.task_names:
            task = token
            continue
        flag, eq, value = token.partition("=")
        empty = (eq and not value) or (not eq and i + 1 < len(tokens) and tokens[i + 1] == "")
        ctx = next((c for c in program.tasks if task in (c.name, *c.aliases)), None)
        arg = ctx.flags.get(flag) if ctx is not None and flag.startswith("-") else None
        if empty and arg is not None and arg.kind is not bool:
            return (f"{flag}= is given no value (a variable left unset?): give it one, or leave {flag} out for its "
                    f"default (`invoke --help {task}` says each)")
    return None


def a_recipe_of_the_line(program: invoke.Program) -> str | None:
    """`invoke build run --recipe=zer2` built the image (minutes; a CUDA image's, a quarter of an hour) before the run
    refused the recipe: a task checks its flags as it starts. Where several tasks share a line, a --recipe the
    recipes hold none of is refused before the first runs: the refusal, or None."""
    from dockyard.common.errors import DockyardError
    from dockyard.common.recipes import load_recipe

    if len(program.tasks) < 2 or asks_help(program):
        return None
    for c in program.tasks:
        if "recipe" in c.args and c.args["recipe"].value:
            try:
                load_recipe(os.path.expanduser(c.args["recipe"].value))
            except DockyardError as e:
                return f"invoke {c.name}: {e} (nothing ran: the line's tasks start only once every one's recipe is found)"
    return None


def overrides_of_the_line(program: invoke.Program) -> str | None:
    """`invoke build run --recipe=zero2 -- --max_stepz 5` built the image (minutes) before the run refused the
    override. Where several tasks share a line, the trainer overrides after `--` are checked first against the recipe
    of each task that takes them (run, slurm, k8s), as the run checks them (preflight.check_overrides, with nothing of
    the host known: it refuses no more than the run would); a --resume, whose run keeps settings of its own, is left
    to its task. The refusal, or None."""
    from dockyard.common.errors import DockyardError
    from dockyard.common.recipes import load_recipe
    from dockyard.launch import preflight
    from dockyard.launch.run import DEFAULT_RECIPE

    argv = program.argv[1:]  # as the shell gave them (tasks.py's _remainder): Invoke's remainder is one string
    if len(program.tasks) < 2 or "--" not in argv or asks_help(program):
        return None
    overrides = argv[argv.index("--") + 1:]
    for c in program.tasks:
        if c.name in ("run", "slurm", "k8s") and not ("resume" in c.args and c.args["resume"].value):
            try:
                preflight.check_overrides(load_recipe(os.path.expanduser(c.args["recipe"].value or DEFAULT_RECIPE)),
                                          overrides)
            except DockyardError as e:
                return f"invoke {c.name}: {e} (nothing ran: the line's tasks start only once its overrides are taken)"
    return None


def asks_help(program: invoke.Program) -> bool:
    """--help (or -h) before any `--`: Invoke answers it with a task's help and runs nothing, so nothing of the line
    is checked (`invoke build run --recipe=zer2 --help` was the recipe's refusal, not run's help)."""
    tokens = program.core.unparsed
    return any(t in ("--help", "-h") for t in tokens[:tokens.index("--") if "--" in tokens else len(tokens)])


# tasks that only look and say (no --dry, nothing to run for real): `invoke doctor run --dry` checks the host, then
# prints the run's command, as each did on its own line
CHANGE_NOTHING = ("recipes", "runs", "plan", "doctor")


def dry_for_some(program: invoke.Program) -> str | None:
    """Invoke gives a flag to the task it follows: `invoke build run --recipe=zero2 --dry` built the image for real
    (minutes, and the tag moved) and only the run was dry. A --dry given to one task of several is refused unless
    every task of the line has it: the refusal, or None."""
    tasks = [(c.name, c.args["dry"].value if "dry" in c.args else None) for c in program.tasks
             if c.name not in CHANGE_NOTHING]
    if len(tasks) < 2 or not any(dry for _, dry in tasks) or asks_help(program):
        return None
    wet = [name for name, dry in tasks if dry is False]
    lacking = [name for name, dry in tasks if dry is None]
    if not wet and not lacking:
        return None
    why = []
    if wet:
        why.append(f"{', '.join(wet)} {'was' if len(wet) == 1 else 'were'} not")
    if lacking:
        why.append(f"{', '.join(lacking)} {'has' if len(lacking) == 1 else 'have'} no --dry")
    each = " ".join(f"{name} --dry" for name, dry in tasks if dry is not None)
    return (f"--dry was given to {', '.join(name for name, dry in tasks if dry)}, but {' and '.join(why)}, and would "
            f"run for real: Invoke gives a flag to the task it follows, so give --dry after each task's name "
            f"(`invoke {each}`)" + (f", and run {', '.join(lacking)} on its own" if lacking else ""))


def invokes_own_flags(program: invoke.Program) -> str | None:
    """Invoke takes its own flags after a task's name too: `invoke save --dry` parsed as Invoke's --dry, which only
    echoes shell commands, and the save ran for real. Invoke's --dry is refused wherever it is given; its other
    flags after a task name are a flag that task does not have (`--help` stays help on the task). The refusal, or
    None."""
    if program.core[0].args["complete"].value:  # the shell's completion asks: `invoke --complete -- invoke ru`
        return None
    if program.core.remainder and not _TAKES_OVERRIDES & {t.name for t in program.tasks}:
        named = " ".join(t.name for t in program.tasks) or "invoke"
        return (f"{named} takes nothing after -- ({cut(program.core.remainder, 60)}): only "
                f"{', '.join(sorted(_TAKES_OVERRIDES))} pass what follows it to the trainer; give flags before --, "
                "as `invoke --help TASK` lists them")
    if program.core[0].args["dry"].value:
        have = sorted(t.name for t in program.collection.tasks.values() if "dry" in {a.name for a in t.get_arguments()})
        tasks = [t.name for t in program.tasks]
        example = tasks[0] if tasks and tasks[0] in have else "run"
        if task := _task_before(program, {"--dry", "-R"}):  # given where a task's own --dry goes: that task has none
            return (f"invoke {task} has no --dry; the tasks with one: {', '.join(have)} "
                    f"(given after the task's name, as in `invoke {example} --dry`)")
        return (f"Invoke's own --dry would not stop the task: only {', '.join(have)} have a --dry of their own, "
                f"given after the task's name, as in `invoke {example} --dry`")
    for arg in program.core_via_tasks.args.values():
        if arg.got_value and arg.name != "help":
            flags = {("-" if len(n) == 1 else "--") + n for n in arg.names}
            if task := _task_before(program, flags):
                flag = next(t.partition("=")[0] for t in program.core.unparsed if t.partition("=")[0] in flags)
                return f"invoke {task} has no flag {flag} (`invoke --help {task}` says what each flag takes)"
            return f"{max(flags, key=len)} is Invoke's own flag: give it before the task's name"
    return None


def _task_before(program: invoke.Program, flags: set[str]) -> str | None:
    """The task whose name came before the first of `flags` on the line that is not that task's own flag (as typed,
    `--flag=value` too); None when none did (the flag was given before every task's name)."""
    task, own = None, set()
    for token in program.core.unparsed:
        if token.partition("=")[0] in flags - own:
            return task
        if token in program.collection.task_names:
            task = token
            own = {("-" if len(n) == 1 else "--") + n.replace("_", "-")
                   for a in program.collection[token].get_arguments() for n in a.names}
    return None


_NO_VALUE = re.compile(r"Flag <\w+: ([\w-]+)[^>]*> needed value")
_UNKNOWN = re.compile(r"No idea what (['\"])(.*)\1 is!", re.S)


def reworded(e: ParseError, argv: list[str], tasks: typing.Iterable[str] = ()) -> str:
    """What an Invoke ParseError means, in the words of dockyard's errors: what was wrong and where help is. `argv`:
    what the parser was given (Invoke reads `--dry=yes` as the switch, then a task named `yes`); `tasks`: the task
    names, for a misspelt one."""
    said, task = str(e), getattr(e.context, "name", None)
    where = f"`invoke --help {task}` says what each flag takes" if task else "`invoke --list` lists the tasks"
    if m := _NO_VALUE.match(said):
        flag = "--" + m[1].replace("_", "-")
        return (f"{flag} needs a value, as in {flag}=VALUE; a value that starts with '-' is read as another flag "
                f"({where})")
    if m := _UNKNOWN.match(said):
        token = m[2]  # as Invoke's repr() wrote it: escapes already escaped, in its quotes
        # a name of thousands of characters (a pasted file, a variable holding one) is said by its start, as `short`
        # says a value: enough to recognise it, not a screen of it
        said_token = cut(token, 60)
        named = f"{m[1]}{token}{m[1]}" if said_token == token else f"{m[1]}{said_token}"
        switches = {f for f, arg in getattr(e.context, "flags", {}).items() if arg.kind is bool}
        switch = next((flag for flag, eq, value in (a.partition("=") for a in argv)
                       if flag in switches and eq and value == token), None)
        if switch:
            return f"{switch} is a switch and takes no value: give {switch} alone ({where})"
        if token.startswith("-"):
            near = _closest(token, getattr(e.context, "flags", {}))
            hint = _override_hint(task, token) or _covers_all(task, token)
            return (f"{f'invoke {task}' if task else 'invoke'} has no flag {said_token} ("
                    f"{hint or (f'did you mean {near}? ' if near else '') + where})")
        if twice := _given_twice(argv, token):  # Invoke reads a flag's second value as a task
            return f"{twice} is given twice: give it once, as in {twice}={said_token}"
        if recipe := _a_recipe(token, argv):
            return f"no task named {named}: {recipe}"
        if token.lower() == "help" and argv and argv[0] == token:  # git's and docker's way: `invoke help run`
            after = next((a for a in argv[1:] if a in tasks), "TASK")
            return f"no task named {named}: help on a task is `invoke --help {after}` (or `invoke {after} -h`)"
        # a word after a task is more often that task's argument than a second task: only the first is matched
        near = "" if set(argv[:argv.index(token)] if token in argv else argv) & set(tasks) else _closest(token, tasks)
        return f"no task named {named} ({f'did you mean {near}? ' if near else ''}`invoke --list` lists the tasks)"
    return f"{said} ({where})"


def _closest(typed: str, names: typing.Iterable[str]) -> str:
    """The name `typed` is most likely a slip of (`--varaint` of --variant, `doctr` of doctor, `rnu` of run), or "":
    the leading dashes every flag shares would make any two flags look alike."""
    import difflib

    plain = {name.lstrip("-").lower(): name for name in names}  # --VARIANT is --variant's slip too
    word = typed.partition("=")[0].lstrip("-").lower()
    # two letters swapped: in a short name (run, dry, cpu) difflib's likeness falls below any safe cutoff
    swapped = [n for n in plain if len(n) == len(word) and
               any(word[:i] + word[i + 1] + word[i] + word[i + 2:] == n for i in range(len(word) - 1))]
    near = swapped or difflib.get_close_matches(word, list(plain), n=1, cutoff=0.8)
    return plain[near[0]] if near else ""


def _a_recipe(token: str, argv: list[str]) -> str:
    """Where a word Invoke took for a task names a recipe (`invoke run zero2`), how to give it."""
    from dockyard import ROOT

    if not re.fullmatch(r"[\w-]+", token):
        return ""
    before = argv[:argv.index(token)] if token in argv else argv
    task = next((a for a in reversed(before) if a in _TAKES_OVERRIDES), None)
    # os.path: a word past a file name's 255 bytes (a pasted hash) is none, not is_file()'s ENAMETOOLONG traceback
    recipe = token if os.path.isfile(ROOT / "recipes" / token / "recipe.yaml") else ""
    given = any(a == "--recipe" or a.startswith("--recipe=") for a in before)  # then a stray word is no recipe meant
    if not recipe and task and not given:  # a recipe misspelt, after a task that takes one (`invoke run lroa`)
        from dockyard.common.recipes import closest_recipe, folder_names

        recipe = closest_recipe(token, folder_names()).split(" ")[0]
    return f"a recipe is given as a flag, as in `invoke {task or 'run'} --recipe={recipe}`" if recipe else ""


# A flag a task lacks because it covers every value of it at once: `invoke plan --recipe=lora` (the newcomer's way to
# ask whether lora fits) was only "has no flag --recipe".
_COVERS_ALL = {
    ("plan", "--recipe"): "plan sizes every recipe at once, a row each, and recommends one: leave --recipe out",
    ("doctor", "--variant"): "doctor holds every variant against this host's driver, a `variant` row each: leave "
                             "--variant out",
}


def _covers_all(task: str | None, token: str) -> str:
    return _COVERS_ALL.get((task, token.partition("=")[0]), "")


def _override_hint(task: str | None, token: str) -> str:
    """Where a flag a task lacks is a trainer setting (`invoke run --max_steps 5`): it belongs after a bare `--`.
    Read only on this error, so that `invoke --list` does not import the settings model."""
    if task not in _TAKES_OVERRIDES or not token.startswith("--"):
        return ""
    from dockyard.common.run_settings import RunSettings
    from dockyard.common.training_args import training_arguments

    key = token[2:].partition("=")[0].replace("-", "_")
    if key not in set(RunSettings.model_fields) | set(training_arguments()):
        return ""
    return f"a trainer setting goes after a bare --, as in `invoke {task} --recipe=R -- --{key} VALUE`"


def _given_twice(argv: list[str], token: str) -> str | None:
    """The flag given more than once whose later value is `token` (`--recipe=lora --recipe=ddp`, or with spaces)."""
    flags = [a.partition("=")[0] for a in argv if a.startswith("--")]
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        given = value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
        if flag.startswith("--") and given == token and flags.count(flag) > 1:
            return flag
    return None


# the form a flag's help shows for the annotations (dockyard/flags.py) whose values Invoke's INT or STRING misnames
FORMS = {"Batch": "auto|INT", "Tokens": "auto|INT", "GiB": "GIB"}


class TypedFlag(Argument):
    """A number flag kept as the text the user typed; the task's annotation parses it (see `checked`). `form`: what
    its help shows for the value, where not Invoke's INT or STRING."""

    form = ""

    def set_value(self, value: Any, cast: bool = True) -> None:
        super().set_value(value, cast=False)


class DockyardTask(Task):
    """A task whose flags have no one-letter forms and whose numbers are parsed by pydantic, not by Invoke."""

    def __init__(self, body, *args, **kwargs):
        kwargs["auto_shortflags"] = False
        super().__init__(body, *args, **kwargs)

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Argument]:
        out = []
        annotated = getattr(self.body, "__annotations__", {})  # their names: tasks.py's annotations are text
        for arg in super().get_arguments(ignore_unknown_help):
            if arg.kind in (int, float):
                # int keeps Invoke's `--flag=INT` in the help; a float is shown as `--flag=STRING` (Invoke names
                # no other kind, and shows a flag of any other kind as a switch, which takes no value), unless
                # its FORMS says better
                arg = TypedFlag(names=arg.names, kind=int if arg.kind is int else str, default=arg.default,
                                help=arg.help, positional=arg.positional, optional=arg.optional,
                                attr_name=arg.attr_name)
                arg.form = FORMS.get(str(annotated.get(arg.name, "")), "")
            out.append(arg)
        return out


def task(*args: Any, **kwargs: Any):
    """`@task` as Invoke's, for a task whose flags are checked (`checked`) and whose DockyardError is a short
    message on stderr and a non-zero exit."""
    def wrap(fn):
        return invoke.task(checked(fn), *args, klass=DockyardTask, **kwargs)

    if len(args) == 1 and callable(args[0]) and not kwargs:
        fn, args = args[0], ()
        return wrap(fn)
    return wrap


# The host side's dependencies (pyproject.toml) by the module each is imported as
HOST_PACKAGES = {"pydantic": "pydantic", "rich": "rich", "yaml": "pyyaml", "pynvml": "nvidia-ml-py",
                 "psutil": "psutil", "matplotlib": "matplotlib", "uv": "uv"}


def _importable(module: str) -> bool:
    if module in sys.modules:
        return sys.modules[module] is not None
    return importlib.util.find_spec(module) is not None


# What `invoke test` runs besides the host side (pyproject.toml's dev and train extras), by module
TEST_PACKAGES = {"ruff": "ruff", "pytest": "pytest", "xdist": "pytest-xdist", "pytest_timeout": "pytest-timeout",
                 "hypothesis": "hypothesis", "torch": "torch", "deepspeed": "deepspeed"}


def check_test_tools() -> None:
    """`invoke test` from the README's host install (`pip install -e .`) ended "No module named ruff", exit 1, with no
    word of what to install: the tools and the training stack are said before anything runs."""
    from dockyard.common.errors import DockyardError

    if missing := [package for module, package in TEST_PACKAGES.items() if not _importable(module)]:
        raise DockyardError(f"invoke test runs ruff and pytest in this invoke's Python ({shown(sys.executable)}), which "
                            f"lacks {', '.join(missing)}: install the test tools and the training stack the tests "
                            "train with, `pip install -e '.[train,dev]'` (README, Development)")


def checked(fn):
    """Validate the flags against the task's annotations (dockyard/flags.py), then run it; a DockyardError
    becomes `error: ...` on stderr and its exit code, a Ctrl-C (or the SIGTERM engine.sigterm_as_interrupt raises
    as one) that no clean-up of the task caught `error: interrupted (SIGINT)` and 130 (143)."""

    @functools.wraps(fn)
    def wrapper(c, *args, **kwargs):
        from dockyard.common.errors import DockyardError

        release_setting_overrides()  # for the settings, and for what the task starts (`invoke test`'s pytest)
        if missing := [package for module, package in HOST_PACKAGES.items() if not _importable(module)]:
            # an invoke of another Python (a system or pipx one): a traceback, or one after a whole run (matplotlib)
            print(f"error: this invoke runs on {shown(sys.executable)}, which lacks what dockyard's tasks need "
                  f"({', '.join(missing)}): run the invoke of the venv dockyard is installed in (.venv/bin/invoke, or "
                  "`. .venv/bin/activate` first; installed with `.venv/bin/pip install -e .`)", file=sys.stderr)
            raise Exit(code=1)
        interrupted_commands()  # (one a task before it on the line took, and ended as interrupted)
        try:
            with ctrl_c_outside_classes_being_built():
                task_settings(c)  # every task refuses a bad setting, whether it reads it or not
                kwargs = parse_flags(fn, kwargs)
                done = fn(c, *args, **kwargs)
        except DockyardError as e:
            if (status := interrupted_commands()) and e.exit_code not in INTERRUPT_STATUSES:
                # a command's interrupt, taken for a check's failure (doctor's "1 check(s) failed"): the status of the
                # interrupt, and what the task said (a load's roll-back of its tags)
                interrupted(status, str(e))
            print(f"error: {shown(str(e))}", file=sys.stderr)
            forget_caught_interrupt()
            raise Exit(code=e.exit_code) from None
        except KeyboardInterrupt as e:  # a task of no clean-up of its own (doctor, plan, inventory): Invoke's own
            # handling ended it with status 1 and no word, a Ctrl-C a script could not tell from a failure
            from dockyard.engine import interrupt_status

            interrupted(interrupt_status(e))
        except BrokenPipeError:
            stop_quietly_for_a_reader_that_left()
        except OSError as e:  # what no check foresaw (a path the filesystem refuses): its cause in one line
            where = f"{cut(str(e.filename))}: " if e.filename else ""  # "File name too long": 5,000 characters
            print(f"error: {shown(where + (e.strerror or str(e)))}", file=sys.stderr)
            raise Exit(code=1) from None
        if status := interrupted_commands():  # a command's interrupt a task took for a failure and went on from
            interrupted(status)
        return done

    return wrapper


INTERRUPT_STATUSES = (128 + signal.SIGINT, 128 + signal.SIGTERM)


def interrupted(status: int, said: str = "") -> typing.NoReturn:
    """End the task as a signal interrupted it: one line (with what the task `said` of it), and the signal's status
    (130 for Ctrl-C, 143 for SIGTERM)."""
    print(f"error: interrupted ({signal.Signals(status - 128).name})" + (f": {shown(said)}" if said else ""),
          file=sys.stderr)
    forget_caught_interrupt()
    raise Exit(code=status) from None


def interrupted_commands() -> int | None:
    """The status of a command a signal interrupted while the task ran (engine.interrupted_commands), or None; the
    engine is read only where a task imported it (it ran no command otherwise)."""
    engine = sys.modules.get("dockyard.engine")
    return engine.interrupted_commands() if engine is not None else None


@contextlib.contextmanager
def ctrl_c_outside_classes_being_built():
    """Ctrl-C while the block runs is never raised inside a class being built (raised_outside_a_class_being_built, as
    in the trainer): Python 3.11 raised it there wrapped in "RuntimeError: Error calling __set_name__ ..." (a lazy
    import building a dataclass: rich's tables and bars, a task's first), a traceback where the task ends as a Ctrl-C
    does, or, under a library's or our own `except Exception` around the import, taken for a failure and lost. Only
    where Ctrl-C raises KeyboardInterrupt (Python's own handler: one a background job ignores stays ignored), on the
    main thread; the handler before is put back after. engine.sigterm_as_interrupt does the same for SIGTERM."""
    before = signal.getsignal(signal.SIGINT)
    if before is not signal.default_int_handler or threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = raised_outside_a_class_being_built(signal.default_int_handler)
    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        try:
            handler.flush()  # a Ctrl-C held back in the block's last moment: raised here, not lost
        finally:
            signal.signal(signal.SIGINT, before)


def task_settings(c):
    """The settings a task runs with (dockyard.settings.Settings). Invoke reads the project's invoke.yaml after
    ~/.invoke.yaml and /etc/invoke.yaml, and invoke.yaml names every setting, so a setting in either was never taken
    (`runs_dir: /scratch/runs` in ~/.invoke.yaml: the runs still went to runs/, without a word). The project's file
    gives the defaults; /etc/invoke.yaml, then ~/.invoke.yaml, then a file given with -f override them."""
    from dockyard.settings import load

    config = c.config
    merged = config.get("dockyard", {})
    if not callable(getattr(merged, "keys", None)):
        return load(merged)  # says what is wrong with it
    settings, files = dict(merged), {}
    for layer in ("project", "system", "user", "runtime"):  # Invoke's -f: its "runtime" file
        given = (getattr(config, f"_{layer}", None) or {}).get("dockyard")
        if isinstance(given, dict):
            settings.update(given)
            if layer != "project":  # a refusal names the file a bad value came from
                files.update(dict.fromkeys(given, str(getattr(config, f"_{layer}_path", None) or f"the {layer} config")))
    return load(settings, files=files)


def forget_caught_interrupt() -> None:
    """CPython marks the interpreter to end by SIGINT once a KeyboardInterrupt leaves code that exec() ran from a
    string (dataclasses and namedtuple build their methods so: a Ctrl-C or SIGTERM during a lazy import lands
    there), even when it is caught further up; under `python -m invoke` the exit then ignores the status chosen
    here (a killed save ended by SIGINT, not with 130 or 143). Any string run through exec() clears that mark."""
    exec("pass")


def parse_flags(fn, values: dict[str, Any]) -> dict[str, Any]:
    """The flags of task `fn` as their annotated types (dockyard/flags.py), or a DockyardError naming each bad one."""
    from pydantic import ConfigDict, ValidationError, create_model

    from dockyard import flags
    from dockyard.common.errors import DockyardError, problem_list

    hints = typing.get_type_hints(fn, globalns={**vars(flags), **fn.__globals__}, include_extras=True)
    typed = [p for p in inspect.signature(fn).parameters.values() if p.name in values and p.name in hints]
    if not typed:  # switches and text only: Invoke's parsing is all they need
        return values
    model = create_model(f"{fn.__name__}_flags", __config__=ConfigDict(extra="forbid"),
                         **{p.name: (hints[p.name], p.default) for p in typed})
    try:
        return values | dict(model(**{p.name: values[p.name] for p in typed}))
    except ValidationError as e:
        # the model: a flag's range is said from its bounds (a number past 4,300 digits had pydantic's words only)
        bad = "; ".join(f"--{name.replace('_', '-')}{_as_typed(given)}: {words}"
                        for name, given, words in problem_list(e, model=model))
        raise DockyardError(f"{bad} (`invoke --help {fn.__name__}` says what each flag takes)") from None


def _as_typed(given: str) -> str:
    """A refused flag's value as problem_list shows it: `='text'` as typed, or ` (a number of 5,000 digits)` where it
    is said by its length (no text typed after `=`)."""
    return "" if not given else f"={given}" if given[0] in "'\"" else f" ({given})"
