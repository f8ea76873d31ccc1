"""Values that go into the scripts and manifests dockyard writes (the sbatch script, run.sh, the pods' command).

Each value is quoted for whatever reads it (bash, sh, sbatch's `#SBATCH` lines, a mount spec); what no quoting
can carry is refused up front, naming the flag: a NUL ends a C string, a newline ends a comment or an `#SBATCH`
line, and a lone surrogate (a file name that is not UTF-8) cannot be written into a UTF-8 file at all.
"""

from __future__ import annotations

import re
import unicodedata

from dockyard.common.errors import DockyardError

# sbatch's own reader of `#SBATCH` lines ends an argument at a blank outside quotes, takes a backslash as "the next
# character as it is" (a blank excepted), and ends the line at an unescaped `#` (Slurm before 19.05: even inside
# quotes). A value with anything outside this set goes in double quotes with `"`, `'`, backslash and `#` escaped, which
# every version reads back as the value.
SBATCH_PLAIN = re.compile(r"[A-Za-z0-9/_.,+=@:%-]*")


def one_line(value: str, flag: str, why: str = "which a generated script cannot carry safely; rename it") -> str:
    """`value` if it holds no control character (NUL, newline, tab, ...) nor line separator and is valid UTF-8;
    else refused, saying `why` (what would carry it, and the fix)."""
    for c in value:
        category = unicodedata.category(c)
        if category == "Cs":
            raise DockyardError(f"{flag} {value!r}: not valid UTF-8; rename it")
        if category in ("Cc", "Zl", "Zp"):  # Zl, Zp: U+2028, U+2029, which YAML reads as line breaks
            raise DockyardError(f"{flag} {value!r}: holds the control character {c!r}, {why}")
    return value


def argv_words(values: list[str], flag: str) -> list[str]:
    """Arguments passed on as they are (quoted, newlines included): only a NUL or a lone surrogate is refused."""
    for v in values:
        if "\0" in v or any(unicodedata.category(c) == "Cs" for c in v):
            raise DockyardError(f"{flag}: {v!r} holds a NUL or is not valid UTF-8: no program can be given it")
    return values


def sbatch_word(value: str) -> str:
    """One argument of an `#SBATCH` line, as sbatch reads it back (the value must be one line)."""
    if SBATCH_PLAIN.fullmatch(value):
        return value
    return '"' + "".join("\\" + c if c in "\"'\\#" else c for c in value) + '"'


def mount_path(value: str, flag: str, separators: str = ",:") -> str:
    """A host path in a `src:dst[:flags]` mount: ':' separates the parts of one (docker's -v: separators=":") and,
    in Apptainer's --bind and pyxis's --container-mounts, ',' the mounts of the list."""
    one_line(value, flag)
    if any(c in value for c in separators):
        said = " or ".join(f"'{c}'" for c in separators)
        raise DockyardError(f"{flag} {value!r}: a path with {said} cannot be given to the container runtime's mount "
                            "list; rename it, or use a folder without them")
    return value
