"""How a task reads its flags: every value a user types is checked in one place before the task runs.

Invoke casts a flag with the type of its default (`int('two')` is a ValueError inside Invoke, before any task
code). Here numbers reach the task as typed and pydantic turns them into the type the task annotates
(dockyard/flags.py: finite, in range), so a bad value is a short error and a non-zero exit. Flags have no
one-letter forms: `-h` is help on every task. Only Invoke is imported here: `invoke --list` stays fast.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import sys
import typing
from typing import Any

import invoke
from invoke import Argument, Exit, ParseError, Task

from dockyard import ENV_PREFIX

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


def explain_parse_errors() -> None:
    """Reword what Invoke's parser refuses (a flag with no value, a switch given one, a flag or task it does not know,
    `--help` for a task that is not there) as dockyard's one `error:` line, instead of Invoke's own words ("Flag
    <Argument: runtime> needed value and was not given one!"), which Program.run prints as they are and exits 1.
    Called when tasks.py is imported, which Invoke does before it parses the tasks' flags; the exit stays 1."""
    for name in ("parse_tasks", "parse_cleanup"):
        parse = getattr(invoke.Program, name)
        if not getattr(parse, "explained", False):
            setattr(invoke.Program, name, _explaining(parse, name))


def _explaining(parse, name: str):
    @functools.wraps(parse)
    def wrapper(self) -> None:
        try:
            parse(self)
        except ParseError as e:
            raise ParseError(f"error: {shown(reworded(e, self.core.unparsed))}", e.context) from None
        if name == "parse_tasks" and (refused := invokes_own_flags(self)):
            raise ParseError(f"error: {shown(refused)}")

    wrapper.explained = True
    return wrapper


def invokes_own_flags(program: invoke.Program) -> str | None:
    """Invoke takes its own flags after a task's name too: `invoke save --dry` parsed as Invoke's --dry, which only
    echoes shell commands, and the save ran for real. Invoke's --dry is refused wherever it is given; its other
    flags after a task name are a flag that task does not have (`--help` stays help on the task). The refusal, or
    None."""
    if program.core[0].args["dry"].value:
        have = sorted(t.name for t in program.collection.tasks.values() if "dry" in {a.name for a in t.get_arguments()})
        tasks = [t.name for t in program.tasks]
        example = tasks[0] if tasks and tasks[0] in have else "run"
        return (f"Invoke's own --dry would not stop the task: only {', '.join(have)} have a --dry of their own, "
                f"given after the task's name, as in `invoke {example} --dry`")
    for arg in program.core_via_tasks.args.values():
        if arg.got_value and arg.name != "help":
            flags = {("-" if len(n) == 1 else "--") + n for n in arg.names}
            task = None
            for token in program.core.unparsed:
                if token.partition("=")[0] in flags:
                    return (f"invoke {task} has no flag {token.partition('=')[0]} (`invoke --help {task}` says what "
                            f"each flag takes)")
                task = token if token in program.collection.task_names else task
            return f"{max(flags, key=len)} is Invoke's own flag: give it before the task's name"
    return None


_NO_VALUE = re.compile(r"Flag <\w+: ([\w-]+)[^>]*> needed value")
_UNKNOWN = re.compile(r"No idea what (['\"])(.*)\1 is!", re.S)


def reworded(e: ParseError, argv: list[str]) -> str:
    """What an Invoke ParseError means, in the words of dockyard's errors: what was wrong and where help is. `argv`:
    what the parser was given (Invoke reads `--dry=yes` as the switch, then a task named `yes`)."""
    said, task = str(e), getattr(e.context, "name", None)
    where = f"`invoke --help {task}` says what each flag takes" if task else "`invoke --list` lists the tasks"
    if m := _NO_VALUE.match(said):
        flag = "--" + m[1].replace("_", "-")
        return (f"{flag} needs a value, as in {flag}=VALUE; a value that starts with '-' is read as another flag "
                f"({where})")
    if m := _UNKNOWN.match(said):
        token = m[2]
        switches = {f for f, arg in getattr(e.context, "flags", {}).items() if arg.kind is bool}
        switch = next((flag for flag, eq, value in (a.partition("=") for a in argv)
                       if flag in switches and eq and value == token), None)
        if switch:
            return f"{switch} is a switch and takes no value: give {switch} alone ({where})"
        if token.startswith("-"):
            return f"{f'invoke {task}' if task else 'invoke'} has no flag {token} ({where})"
        return f"no task named {token!r} (`invoke --list` lists the tasks)"
    return f"{said} ({where})"


class TypedFlag(Argument):
    """A number flag kept as the text the user typed; the task's annotation parses it (see `checked`)."""

    def set_value(self, value: Any, cast: bool = True) -> None:
        super().set_value(value, cast=False)


class DockyardTask(Task):
    """A task whose flags have no one-letter forms and whose numbers are parsed by pydantic, not by Invoke."""

    def __init__(self, body, *args, **kwargs):
        kwargs["auto_shortflags"] = False
        super().__init__(body, *args, **kwargs)

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Argument]:
        out = []
        for arg in super().get_arguments(ignore_unknown_help):
            if arg.kind in (int, float):
                # int keeps Invoke's `--flag=INT` in the help; a float is shown as `--flag=STRING` (Invoke names
                # no other kind, and shows a flag of any other kind as a switch, which takes no value)
                arg = TypedFlag(names=arg.names, kind=int if arg.kind is int else str, default=arg.default,
                                help=arg.help, positional=arg.positional, optional=arg.optional,
                                attr_name=arg.attr_name)
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


def checked(fn):
    """Validate the flags against the task's annotations (dockyard/flags.py), then run it; a DockyardError
    becomes `error: ...` on stderr and its exit code."""

    @functools.wraps(fn)
    def wrapper(c, *args, **kwargs):
        from dockyard.common.errors import DockyardError
        from dockyard.settings import load

        release_setting_overrides()  # for the settings, and for what the task starts (`invoke test`'s pytest)
        try:
            load(c.config.get("dockyard", {}))  # every task refuses a bad setting, whether it reads it or not
            kwargs = parse_flags(fn, kwargs)
            return fn(c, *args, **kwargs)
        except DockyardError as e:
            print(f"error: {shown(str(e))}", file=sys.stderr)
            forget_caught_interrupt()
            raise Exit(code=e.exit_code) from None

    return wrapper


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
    from dockyard.common.errors import DockyardError

    hints = typing.get_type_hints(fn, globalns={**vars(flags), **fn.__globals__}, include_extras=True)
    typed = [p for p in inspect.signature(fn).parameters.values() if p.name in values and p.name in hints]
    if not typed:  # switches and text only: Invoke's parsing is all they need
        return values
    model = create_model(f"{fn.__name__}_flags", __config__=ConfigDict(extra="forbid"),
                         **{p.name: (hints[p.name], p.default) for p in typed})
    try:
        return values | dict(model(**{p.name: values[p.name] for p in typed}))
    except ValidationError as e:
        bad = "; ".join(f"--{'.'.join(map(str, err['loc'])).replace('_', '-')}={err['input']!r}: "
                        f"{err['msg'].removeprefix('Value error, ')}" for err in e.errors())
        raise DockyardError(f"{bad} (`invoke --help {fn.__name__}` says what each flag takes)") from None


def shown(message: str) -> str:
    """A message as the terminal should show it: a control character the user typed (a carriage return, an escape
    sequence) is written escaped, so it can neither hide the message nor drive the terminal."""
    return "".join(ch if ch.isprintable() or ch in "\n\t" else ascii(ch)[1:-1] for ch in message)
