"""The one error type users see: a short message that says what was wrong and how to fix it.

Standard library only: the trainer imports this inside the image as cheaply as the host does.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import signal
import stat
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import FrameType
from typing import Any, BinaryIO

from dockyard.common import envvars

MiB = 1 << 20


class DockyardError(Exception):
    """A failure caused by input or environment; tasks print the message and exit non-zero."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


class Stopped(BaseException):  # noqa: N818 - a stop, not an error of the run's own
    """The trainer's SIGTERM (dockyard.train.ending), raised wherever its main thread is: a BaseException, so that no
    library's `except Exception` takes it for a failure of its own and carries on (an import-time check of an optional
    package ate it, the run trained to the end, and every later SIGTERM was ignored, the stop being spent). The
    trainer records it as the run's DockyardError (ending.ours_within)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def causes(error: BaseException, limit: int = 16) -> list[BaseException]:
    """The error and those it was raised from or while handling, outermost first, at most `limit` (libraries wrap
    the error that matters in their own: datasets' DatasetGenerationError around a full disk's OSError)."""
    chain = [error]
    while len(chain) < limit and (nxt := chain[-1].__cause__ or chain[-1].__context__) is not None \
            and nxt not in chain:
        chain.append(nxt)
    return chain


def wrapped_signal(e: BaseException, kinds: tuple[type[BaseException], ...] = (KeyboardInterrupt,)) \
        -> BaseException | None:
    """The Ctrl-C (or SIGTERM, or another signal handler's exception of `kinds`) that Python 3.11 raised wrapped as
    `RuntimeError: Error calling __set_name__ ...`: a signal landing while a lazy import builds a class (rich's
    dataclasses, torch's) is raised so, and no `except KeyboardInterrupt` took it (a stopped save ended on that
    traceback with status 1 instead of its clean-up and 130 or 143: CI, about 1 run in 20 with the CPU busy)."""
    seen: BaseException | None = e
    for _ in range(8):  # a wrapper of a wrapper, never a loop
        if not isinstance(seen, RuntimeError):
            return None
        seen = seen.__cause__
        if isinstance(seen, kinds):
            return seen
    return None


def in_set_name(frame: FrameType | None) -> bool:
    """Whether a signal handler called at `frame` runs inside a `__set_name__` (a class being built: a dataclass's
    fields, as a lazy import builds transformers' TrainingArguments, rich's, triton's): what it raises there Python
    3.11 raises wrapped in a RuntimeError, which every library's `except Exception` takes for a failure of its own."""
    while frame is not None:
        if frame.f_code.co_name == "__set_name__":
            return True
        frame = frame.f_back
    return False


def raised_outside_a_class_being_built(handler: Callable[[int, Any], None]) -> Deferring:
    """Signal handler `handler`, whose exception never lands inside a class being built (in_set_name): there the
    signal is sent again a moment later (building a class takes microseconds), from a thread: os.kill of this process
    from here would run this handler again at once, still inside. Where it is put back, flush() first: a signal not yet
    sent again is handled then, not lost with the process nor taken by the handler put back."""
    return Deferring(handler)


class Deferring:
    """raised_outside_a_class_being_built's handler: `pending` the signal deferred and not yet sent again."""

    def __init__(self, handler: Callable[[int, Any], None]):
        # (re-entrant: a second signal's handler may run in the main thread while it holds the lock)
        self.handler, self.pending, self._lock = handler, 0, threading.RLock()

    def __call__(self, signum: int, frame: Any) -> None:
        if in_set_name(frame):
            with self._lock:
                self.pending = signum
            again = threading.Timer(0.01, self._again)
            again.daemon = True
            try:
                again.start()
                return
            except RuntimeError:  # no thread to be had (a pid limit): raised here, wrapped, rather than lost
                with self._lock:
                    self.pending = 0
        self.handler(signum, frame)

    def _again(self) -> None:
        with self._lock:  # sent while held: flush() then finds it pending, or sent
            if self.pending:
                os.kill(os.getpid(), self.pending)
                self.pending = 0

    def flush(self) -> None:
        """The signal deferred and not yet sent again, handled now (the block it was deferred in is ending: the task
        ended within the moment, and the daemon thread would have died with the process); one sent again and not yet
        handled is handled here too, before the handler is put back (pthread_sigmask runs the handlers due)."""
        with self._lock:
            signum, self.pending = self.pending, 0
        if signum:
            self.handler(signum, None)
        elif threading.current_thread() is threading.main_thread():
            signal.pthread_sigmask(signal.SIG_BLOCK, [])


@contextlib.contextmanager
def signals_unwrapped(kinds: tuple[type[BaseException], ...] = (KeyboardInterrupt,)) -> Iterator[None]:
    """The block's Ctrl-C (or other exception of `kinds`) that Python wrapped (wrapped_signal) is raised as itself,
    for the `except KeyboardInterrupt` around it."""
    try:
        yield
    except RuntimeError as e:
        if (inner := wrapped_signal(e, kinds)) is None:
            raise
        raise inner from None


def problems(error: Exception, where: str = "", known: list[str] | None = None, model: Any = None) -> str:
    """A pydantic ValidationError as one line in our words: `field.sub 'given': takes ...; ...` (`where` names a
    field-less error; `known`: the keys a key that is not one of them is held against; `model`: the pydantic model,
    whose bounds say what a number takes). Anything else (a TypeError from bad keyword arguments) is its own
    message."""
    if not callable(getattr(error, "errors", None)):
        return str(error)
    found = [f"{name or where}{' ' + given if given else ''}: {words}"
             for name, given, words in problem_list(error, known, model)]
    said = "; ".join(found[:PROBLEMS_SAID])
    # a file of 5,000 bad entries was a quarter-megabyte line
    return said + (f"; and {len(found) - PROBLEMS_SAID} more" if len(found) > PROBLEMS_SAID else "")


PROBLEMS_SAID = 5  # a validation error's problems said, at most


def problem_list(error: Any, known: list[str] | None = None, model: Any = None) -> list[tuple[str, str, str]]:
    """Each problem of a pydantic ValidationError as (the field, dotted; the value given, shown short, or "" where
    there is none to show; what the field takes, in our words), one per field: the branches of a union (a number or
    `auto`) are said together. pydantic's own wording ("Input should be a valid integer, unable to parse string as
    an integer", "Extra inputs are not permitted") is a library's, not a user's, and names no accepted value."""
    errs = error.errors()
    bases = [_field_of(e["loc"], errs) for e in errs]
    out: dict[str, tuple[str, list[str]]] = {}
    for err, loc in zip(errs, bases, strict=True):
        name = ".".join(map(str, loc))
        given, words = _in_our_words(err, known if len(loc) == 1 else None)
        _, said = out.setdefault(name, (given, []))
        if words not in said:
            said.append(words)
    return [(name, given, (f"takes {takes}" if (takes := accepted(model, name)) and _typed(said) else _either(said)))
            for name, (given, said) in out.items()]


def _typed(said: list[str]) -> bool:
    """Whether a field's problems are all of its type or bounds (not a validator's own words, which say more)."""
    return all(s.startswith("takes ") for s in said)


def accepted(model: Any, name: str) -> str:
    """What a number or true/false field of pydantic `model` takes, from its type and bounds (`a whole number from 1
    to 16777216`, `true, false or auto`): more than one error's words say; "" for another field, or no model."""
    fields = getattr(model, "model_fields", None) or {}
    if name not in fields:
        return ""
    schema = model.model_json_schema()["properties"][name]
    choices = schema.get("anyOf", [schema])
    consts = [str(c["const"]) for c in choices if "const" in c]
    number = next(({_BOUND_NAMES.get(k, k): v for k, v in c.items()} for c in choices
                   if c.get("type") in ("integer", "number")), None)
    if number is not None and ("minimum" in number or "exclusiveMinimum" in number):
        low = (f"from {_plain(number['minimum'])}" if "minimum" in number
               else f"above {_plain(number['exclusiveMinimum'])}")
        top = (f" to {_plain(number['maximum'])}" if "maximum" in number else
               f" up to (not including) {_plain(number['exclusiveMaximum'])}" if "exclusiveMaximum" in number else
               " or more")
        kind = "a whole number" if number["type"] == "integer" else "a number"
        return f"{kind} {low}{top}" + "".join(f", or {c}" for c in consts)
    if any(c.get("type") == "boolean" for c in choices):
        words = ["true", "false", *consts]
        return f"{', '.join(words[:-1])} or {words[-1]}"
    return ""


# a bound set after a validator (dockyard.flags' Whole, then Field(ge=0, le=4096)) is in pydantic's schema by its
# Field name, not JSON Schema's: a flag's range went unsaid
_BOUND_NAMES = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}


def _plain(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _either(said: list[str]) -> str:
    """One field's problems: the union's branches as one `takes A or B`, a validator's own words as they are."""
    takes = [s.removeprefix("takes ") for s in said if s.startswith("takes ")]
    rest = [s for s in said if not s.startswith("takes ")]
    if len(takes) > 1:
        takes = [", or ".join(takes)]
    return "; ".join(rest + [f"takes {t}" for t in takes])


# a union's branch, as pydantic names it in an error's location: int, constrained-int, literal['auto'], list[str]
_BRANCH = re.compile(r"(constrained-|function-\w+\[)?(int|float|bool|str|bytes|none|literal|list|dict|tuple|set|"
                     r"model|typed-dict|lax-or-strict|json-or-python|nullable|union|is-instance)\b.*", re.S)


def _field_of(loc: tuple, errs: list[dict]) -> tuple:
    """An error's location without the names of the union branches in it (pydantic says `global_batch.constrained-int`
    and `global_batch.literal['auto']` for one setting): a part is a branch where another error shares what comes
    before it."""
    out = []
    for i, part in enumerate(loc):
        if i and isinstance(part, str) and _BRANCH.fullmatch(part) and sum(
                1 for e in errs if tuple(e["loc"][:i]) == tuple(loc[:i])) > 1:
            continue
        out.append(part)
    return tuple(out)


# what a value of each of pydantic's error types takes, in our words
_TAKES = {
    "int": "takes a whole number", "float": "takes a number", "bool": "takes true or false",
    "finite_number": "takes a finite number (not nan or inf)", "string": "takes text",
    "dict": "takes `key: value` entries (a mapping)", "model": "takes `key: value` entries (a mapping)",
    "list": "takes a list, e.g. [a, b]", "tuple": "takes a list, e.g. [a, b]", "path": "takes a path (text)",
    "none_required": "takes no value", "bytes": "takes text",
}
_BOUNDS = {"greater_than_equal": ("ge", "takes {} or more"), "greater_than": ("gt", "takes more than {}"),
           "less_than_equal": ("le", "takes at most {}"), "less_than": ("lt", "takes less than {}"),
           "multiple_of": ("multiple_of", "takes a multiple of {}")}


def _in_our_words(err: Mapping, known: list[str] | None) -> tuple[str, str]:
    """(the value given, shown short; what the field takes) for one pydantic error."""
    kind, ctx, value = err["type"], err.get("ctx") or {}, err.get("input")
    given = "given no value" if value is None else shown(short(value))  # YAML's null, JSON's
    if kind == "missing":
        return "", "missing: add it"
    if kind == "extra_forbidden":
        return "", "is not a key here: remove it" + (f" (known: {', '.join(known)})" if known else "")
    if kind in ("value_error", "assertion_error") and "error" in ctx:  # a validator's own words, which may quote it
        words = str(ctx["error"]).removeprefix("Assertion failed, ")
        # quoted as a word of its own: one inside another was a coincidence (profile_steps 0 in "e.g. 20-22")
        quoted = re.search(rf"(?<![\w.+-]){re.escape(short(value))}(?![\w.+-])", words)
        # of a mapping, the words name the entry: 60 characters of the whole ("pins {'torch': ...: pin peft: ...")
        # said nothing more
        return ("" if value is None or quoted or isinstance(value, Mapping) else given), words
    if kind in _BOUNDS:
        key, words = _BOUNDS[kind]
        bound = ctx.get(key)
        if isinstance(bound, (int, float)):
            return given, words.format(f"{bound:,}" if float(bound).is_integer() and abs(bound) >= 10_000
                                       else f"{bound:g}")
    if kind in ("literal_error", "enum"):
        return given, f"takes {ctx.get('expected', '')}".strip()
    if kind in ("string_too_short", "string_too_long", "too_short", "too_long"):
        count = ctx.get("min_length" if kind.endswith("short") else "max_length")
        unit = ("character" if count == 1 else "characters") if kind.startswith("string") else \
            ("entry" if count == 1 else "entries")
        return given, f"takes {'at least' if kind.endswith('short') else 'at most'} {count} {unit}"
    if kind == "string_pattern_mismatch":
        return given, f"is not of the form {ctx.get('pattern', '')}"
    # int_parsing_size: a number past pydantic's 4,300 digits, "Unable to parse input string as an integer, exceeded
    # maximum size", which said no range
    stem = re.sub(r"_(type|parsing|parsing_size|from_float|fractional_part|too_big|unicode|attributes_type)$", "",
                  kind)
    if stem in _TAKES:
        return given, _TAKES[stem]
    msg = str(err.get("msg", kind))  # a kind not met here yet: pydantic's words, put as ours are
    return given, re.sub(r"^(Value error, |Input should be )", lambda m: "" if m[1].startswith("Value") else "takes ",
                         msg)


def short(value: Any) -> str:
    """A value as a message quotes it: its repr, cut to 60 characters (a file of 5,000 entries is not written out);
    a number too long for that by its length (`--nproc=<5,000 digits>` was 57 of them and an ellipsis)."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's 4300 digits, which cannot be written out
        text = (f"a number of about {int(abs(value).bit_length() * 0.30103) + 1} digits" if isinstance(value, int)
                else "a value")
    if len(text) > 60 and isinstance(value, (int, str)) and not isinstance(value, bool) \
            and re.fullmatch(r"\s*[+-]?[0-9]+\s*", str(value)):  # a str: past YAML's and int()'s 4,300 digits
        text = f"a number of {sum(c.isdigit() for c in text):,} digits"
    return text if len(text) <= 60 else text[:57] + "..."


def cut(text: str, limit: int = 120) -> str:
    """Text a user typed (a path) as a message says it, unquoted: at most `limit` characters (a path of 5,000
    characters, which no filesystem holds, was said whole)."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def first_line(error: BaseException, limit: int = 300) -> str:
    """An exception's message cut to its first line (at most `limit` characters), for one line of our own."""
    return (str(error).strip().splitlines() or [""])[0][:limit]


def cause_line(error: BaseException) -> str:
    """first_line of what raised `error` (its __cause__, where a library wrapped it), or its type's name where it
    says nothing."""
    cause = error.__cause__ or error
    return first_line(cause) or type(cause).__name__


def yaml_problem(error: Exception) -> str:
    """A YAML error as one line: what is wrong and where (`expected ',' or ']', but got '<stream end>' at line 1,
    column 13`) instead of the several lines PyYAML writes. Anything else is its own message."""
    mark = getattr(error, "problem_mark", None)
    said = getattr(error, "problem", None) or str(error)
    if isinstance(error, ValueError) and "integer string conversion" in said:  # int()'s: PyYAML reads digits with it
        said = TOO_MANY_DIGITS  # not Python's "use sys.set_int_max_str_digits() to increase the limit"
    return said + (f" at line {mark.line + 1}, column {mark.column + 1}" if mark else "")


def open_plain(path: Path, what: str) -> BinaryIO:
    """A file opened for reading as untrusted input, refused unless what was opened is a plain file: checked on
    the open file itself, so a file swapped for a pipe after an earlier check (a pipe waits for ever, /dev/zero
    never ends) is refused, naming `what` it should be. A folder is IsADirectoryError and a missing file
    FileNotFoundError, as from open(), for the caller to word."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # O_NONBLOCK: a pipe opens at once
    kind = os.fstat(fd).st_mode
    if stat.S_ISDIR(kind):  # before fdopen, which refuses a folder naming the descriptor: "Is a directory: 3"
        os.close(fd)
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if not stat.S_ISREG(kind):
        os.close(fd)
        raise DockyardError(f"{path}: not a plain file (a pipe, device or socket); give the {what} itself")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_bounded(path: Path, limit: int, what: str) -> bytes:
    """A small file read as untrusted input (open_plain): one that holds more than `limit` bytes is refused,
    naming `what` it should be."""
    with open_plain(path, what) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        size = f"{limit // MiB} MiB" if limit >= MiB else f"{limit // 1024} KiB"
        raise DockyardError(f"{path}: more than {size}, more than any {what} holds; give the {what} itself")
    return data


class SetTwice(Exception):
    """A key set twice in one JSON object (json keeps the last one's value without a word; pyarrow refuses the
    file): the key is args[0]. Not a ValueError, which loads reads as json's own."""


def one_of_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object_pairs_hook for loads: a JSON object, refused (SetTwice) where it sets a key twice."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise SetTwice(key)
        seen[key] = value
    return seen


def loads(text: str | bytes, **kw) -> Any:
    """json.loads of untrusted text, every failure a json.JSONDecodeError (a ValueError), which readers catch: JSON
    nested past the interpreter's recursion limit (a RecursionError) and an integer of more digits than Python
    converts (a plain ValueError, 4,300 digits: a traceback in plan, run --dry and the recipe loader) among them."""
    try:
        return json.loads(text, **kw)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise _Unreadable("nested too deeply to read", "", 0) from None
    except ValueError as e:
        if "integer string conversion" not in str(e):
            raise
        raise _Unreadable(TOO_MANY_DIGITS, "", 0) from None


TOO_MANY_DIGITS = "a number of more digits than can be read (4,300)"


class _Unreadable(json.JSONDecodeError):
    """What the parser gave up on, at no one place: said without json's "line 1 column 1 (char 0)"."""

    def __str__(self) -> str:
        return self.msg


def json_object(path: Path, what: str, limit: int = 64 * MiB, one_of_each_key: bool = False) -> dict:
    """A JSON file that must hold one object (`what` names its contents in the refusal), read as untrusted input.
    `one_of_each_key`: a key set twice in one object is refused (json keeps the last without a word): for files
    people write by hand."""
    try:
        data = loads(read_bounded(path, limit, f"JSON file of {what}"),
                          object_pairs_hook=one_of_each if one_of_each_key else None)
    except SetTwice as e:
        raise DockyardError(f"{path}: {str(e.args[0])!r} is set twice in one object (keep one: the second would "
                            "silently replace the first)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DockyardError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise DockyardError(f"{path}: expected a JSON object of {what}")
    return data


def on_one_line(text: str) -> str:
    """Text a user gave (a key of a file), as one line of a message says it: every character that is not printable,
    a newline and a tab too, written escaped (a YAML key "a\\nb" split the error's line in two)."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def shown(message: str) -> str:
    """A message as the terminal should show it: a control character the user typed (a carriage return, an escape
    sequence) is written escaped, so it can neither hide the message nor drive the terminal."""
    return "".join(ch if ch.isprintable() or ch in "\n\t" else ascii(ch)[1:-1] for ch in message)


def paths_as(mounts: Mapping[str, str]) -> Callable[[str], str]:
    """A function writing the paths inside a container that `mounts` names ({inside: host path}) as the host's in a
    line the container printed: the trainer's "see /workspace/runs/exp1/train.log" is the user's runs folder, not a
    path they have. The longest first; a path is replaced only whole (followed by /, a blank, punctuation or the end)."""
    mounts = {inside: host for inside, host in mounts.items()
              if isinstance(host, str) and inside.startswith("/") and inside != "/"}
    if not mounts:
        return lambda text: text
    pattern = re.compile(r"(?<![\w/.-])(?:" + "|".join(re.escape(p) for p in sorted(mounts, key=len, reverse=True))
                         + r""")(?=[/\s:;,.)'"\]]|$)""")
    return lambda text: pattern.sub(lambda m: mounts[m.group(0)], text)


def on_host(text: str) -> str:
    """A line the trainer prints, naming the host's paths for the container's that DOCKYARD_HOST_PATHS maps (run.sh
    names every mount there, its runs folder too: a run.sh user read "the model is in /workspace/runs/r1/model");
    unchanged outside a container."""
    return paths_as(envvars.host_paths() or {})(text)
