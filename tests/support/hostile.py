"""Hostile strings for the generated scripts and manifests, and a recording stand-in for the programs they start.

A stand-in is a small sh script put on PATH under the program's name: it appends its argv (and the environment
variables named in RECORD_ENV) to $ARGV_LOG, so a test compares what the program was given with what was meant,
word for word. The attacks write $MARK: a test asserts it never appears.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

from hypothesis import strategies as st

PIECES = ["'", '"', '$(touch "$MARK")', '`touch "$MARK"`', "$(touch $MARK)", ';touch "$MARK";', "\\", "$HOME",
          "${X:-y}", "$((1+1))", " ", "  ", "\t", "\n", "-v", "--", "-", "*", "?", "[a]", "#", "%j", "%", "~", ",",
          ":", "=", "!", "&", "|", "<", ">", "é", "日本", "\u200b", "\x7f", "\x85", "\u2028", "'\"'\"'", "$'\\n'", '\\"',
          "{a,b}", "\0"]


def unsafe(value: str) -> bool:
    """What no generated script carries: control characters (NUL, newline, tab...) and non-UTF-8 names."""
    return any(unicodedata.category(c) in ("Cc", "Cs", "Zl", "Zp") for c in value)


def _texts(pieces: list[str], chars: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.lists(st.one_of(st.sampled_from(pieces), st.text(chars, min_size=1, max_size=3)),
                    min_size=1, max_size=6).map("".join)


def _names(texts: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """What can be a file name: no '/', no NUL, not . or .., short enough for the file system."""
    return texts.filter(lambda s: "/" not in s and "\0" not in s and s not in (".", "..") and len(s.encode()) < 120)


# Pieces, and now and then any text at all (every code point but lone surrogates, NUL and newlines included).
hostile_text = _texts(PIECES, st.characters(blacklist_categories=("Cs",)))
# an override's value: anything but a leading "--", which the override grammar reads as the next key (refused
# before anything is written, as `invoke run --dry` refuses it)
hostile_value = hostile_text.filter(lambda s: not s.startswith("--"))
# The same without control characters: what a path in a generated script can hold.
line_text = _texts([p for p in PIECES if not unsafe(p)], st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")))
hostile_name, line_name = _names(hostile_text), _names(line_text)
# Mostly names a script can carry, sometimes one it must refuse.
path_name = st.one_of(line_name, line_name, line_name, hostile_name)

# The stand-in: its name, its argument count, its arguments, then the variables named in $RECORD_ENV, each ended
# by a NUL (the one byte no argument can hold); sh, so that a script starting dozens of them stays quick.
RECORDER = """#!/bin/sh
{ printf '%s\\0' "${0##*/}" "$#" "$@"
  for k in $(echo "${RECORD_ENV-}" | tr , ' '); do eval "printf '%s\\0' \\"\\${$k-}\\""; done; } >>"$ARGV_LOG"
"""


def recorder(bin_dir: Path, *names: str, then: str = "") -> None:
    """Stand-ins named `names` in bin_dir that record their argv; `then` (sh) runs after recording."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = bin_dir / name
        path.write_text(RECORDER + then)
        path.chmod(0o755)


def records(log: Path, env: tuple[str, ...] = ()) -> list[dict]:
    """[{"tool", "argv", "env"}] in the order the stand-ins ran; `env`: the names given in RECORD_ENV."""
    words = log.read_bytes().decode().split("\0")[:-1] if log.exists() else []
    out = []
    while words:
        tool, n = words[0], int(words[1])
        out.append({"tool": tool, "argv": words[2:2 + n], "env": dict(zip(env, words[2 + n:2 + n + len(env)], strict=True))})
        words = words[2 + n + len(env):]
    return out


def environment(bin_dir: Path, log: Path, mark: Path, **extra: str) -> dict[str, str]:
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "ARGV_LOG": str(log), "MARK": str(mark), "HOME": str(bin_dir.parent),
            "LANG": "C.UTF-8", **extra}
