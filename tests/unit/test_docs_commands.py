"""Every `invoke ...` command the docs show names tasks and flags that exist: README.md and docs/*.md are read, each
command line in them (code spans and code blocks) is split into its tasks and their flags, and each flag is looked
for in that task's `invoke --help TASK`, as a user reading the docs would try it. How drift between docs and program
was found (issue 25)."""

from __future__ import annotations

import re
import shlex

import pytest

from dockyard import ROOT
from tests.support.cli import invoke_here

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CORE = {"--help", "-h", "--list", "-l", "-f", "--config", "--search-root", "-r", "--version", "-V", "--complete"}


def _task_names() -> set[str]:
    out = invoke_here("--list").stdout
    return {line.split()[0] for line in out.splitlines()[1:] if line.startswith("  ") and not line.startswith("   ")}


def _help_flags(task: str) -> set[str]:
    r = invoke_here("--help", task)
    assert r.returncode == 0, r.stderr
    return set(re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", r.stdout.split("Options:", 1)[-1]))


def _commands(text: str) -> list[str]:
    """The text after each `invoke` in code spans and code blocks, up to what ends a command in a shell."""
    spans = re.findall(r"```.*?```", text, re.S)
    rest = re.sub(r"```.*?```", "", text, flags=re.S)
    spans += re.findall(r"`([^`\n]+)`", rest)
    spans += [line for line in text.splitlines() if line.startswith("    ")]  # indented code in lists
    found = []
    for span in spans:
        for m in re.finditer(r"(?<![\w./-])invoke((?:[ \t]+(?:\\\||[^\s;&|()`])+)*)", span):
            found.append(m.group(1))
    return found


def _tokens(command: str) -> list[str]:
    command = command.replace("\\|", "|")  # a markdown table's escaped pipe, inside a flag's value
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    return [w.strip("[]") for w in words]


def test_the_docs_name_only_tasks_and_flags_that_exist():
    tasks = _task_names()
    assert {"run", "build", "plan", "save"} <= tasks
    flags = {t: _help_flags(t) for t in tasks}
    wrong, seen = [], 0
    for doc in DOCS:
        for command in _commands(doc.read_text()):
            task = None
            for word in _tokens(command):
                if word == "--" or word.startswith(("...", "…")):
                    break  # trainer overrides, or an elided rest
                if word in tasks:
                    task = word
                    continue
                if not word.startswith("-"):
                    if task is not None:
                        continue  # a value or a placeholder (TASK, FILE)
                    if re.fullmatch(r"[a-z][a-z0-9-]*", word):
                        wrong.append(f"{doc.name}: `invoke {command.strip()}`: no task {word!r}")
                    break
                flag = word.split("=", 1)[0]
                if task is None:
                    if flag not in CORE:
                        wrong.append(f"{doc.name}: `invoke {command.strip()}`: {flag} before any task")
                    continue
                seen += 1
                if flag not in flags[task] and flag not in ("-h", "--help"):
                    wrong.append(f"{doc.name}: `invoke {command.strip()}`: `invoke --help {task}` has no {flag}")
    assert seen > 50, "the docs show many flags: the extraction found too few"
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("text,expected", [
    ("run `invoke build run --recipe=zero2 -- --max_steps 5` now", [" build run --recipe=zero2 -- --max_steps 5"]),
    ("| `invoke save [--compress=zstd\\|gzip]` | x |", [" save [--compress=zstd\\|gzip]"]),
    ("```sh\ninvoke setup && invoke test\n```", [" setup", " test"]),
])
def test_the_extraction_finds_the_commands(text, expected):
    assert _commands(text) == expected
