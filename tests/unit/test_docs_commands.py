"""Every `invoke ...` command the docs show is one Invoke would take: README.md and docs/*.md are read, each
command line in them (code spans and code blocks, `\\`-continued lines joined) is split into its tasks and their
flags, and each flag is looked for among that task's own flags (tasks.py, as Invoke builds them), as a user reading
the docs would try it: a flag the task does not have (Invoke's own flags after a task included), a switch given a
value, or trainer overrides after `--` for a task that does not pass them on are each a docs error. How drift
between docs and program was found (issue 25)."""

from __future__ import annotations

import re
import shlex

import pytest
from invoke import Collection

import tasks as tasks_module
from dockyard import ROOT
from dockyard.cli import _TAKES_OVERRIDES

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CORE = {"--help", "-h", "--list", "-l", "-f", "--config", "--search-root", "-r", "--version", "-V", "--complete"}
COLLECTION = Collection.from_module(tasks_module)


def _flags(task: str) -> dict[str, bool]:
    """A task's flags as typed (`--gpu-mem`, `-k`), each with whether it is a switch (takes no value)."""
    out = {}
    for arg in COLLECTION.tasks[task].get_arguments():
        for name in arg.names:
            out[("-" if len(name) == 1 else "--") + name.replace("_", "-")] = arg.kind is bool
    return out


def _commands(text: str) -> list[str]:
    """The text after each `invoke` in code spans and code blocks, up to what ends a command in a shell."""
    spans = re.findall(r"```.*?```", text, re.S)
    rest = re.sub(r"```.*?```", "", text, flags=re.S)
    spans += re.findall(r"`([^`\n]+)`", rest)
    spans += [line for line in text.splitlines() if line.startswith("    ")]  # indented code in lists
    spans = [re.sub(r"\\\n\s*", " ", span) for span in spans]  # a command continued on the next line
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
    assert {"run", "build", "plan", "save"} <= set(COLLECTION.tasks)
    wrong, seen = docs_errors(DOCS)
    assert seen > 50, "the docs show many flags: the extraction found too few"
    assert not wrong, "\n".join(wrong)


def test_the_readme_tasks_table_names_every_flag_of_each_task_it_shows():
    """The newcomer audit: the table left out flags `invoke --help TASK` has (build --devel, export --dry, shell --dry,
    setup --dry and --mirror, lock and wheelhouse --dry, slurm and k8s --variant and --out)."""
    table = (ROOT / "README.md").read_text().split("\n## Tasks\n", 1)[1].split("\n## ", 1)[0]
    rows = {m[1]: line for line in table.splitlines() if (m := re.match(r"\| `invoke ([a-z0-9-]+)[^`]*` \|", line))}
    assert {"setup", "build", "run", "shell", "slurm", "k8s", "export"} <= set(rows)
    left_out = [f"invoke {task} {flag}" for task, row in rows.items() for flag in _flags(task)
                if flag.startswith("--") and flag != "--help" and not re.search(re.escape(flag) + r"(?![\w-])", row)]
    assert not left_out, left_out


def test_invoke_list_shows_each_task_in_a_whole_sentence():
    """`invoke --list` shows the first line of each task's docstring: wheelhouse's read "Download every wheel (and
    DeepSpeed's source) of a variant's lock into images/wheelhouse/<variant>/, unless", its sentence cut there."""
    from invoke.util import helpline

    cut = [name for name, task in COLLECTION.tasks.items() if not helpline(task.body).rstrip().endswith(".")]
    assert not cut, cut


def docs_errors(docs) -> tuple[list[str], int]:
    """What Invoke would refuse in the commands these pages show, and how many flags were checked."""
    tasks = set(COLLECTION.tasks)
    flags = {t: _flags(t) for t in tasks}
    wrong, seen = [], 0
    for doc in docs:
        for command in _commands(doc.read_text()):
            task, named = None, []
            for word in _tokens(command):
                if word == "--":
                    if named and not _TAKES_OVERRIDES & set(named):
                        wrong.append(f"{doc.name}: `invoke {command.strip()}`: {' '.join(named)} pass nothing "
                                     "after -- to the trainer")  # as dockyard.cli.invokes_own_flags refuses
                    break  # trainer overrides
                if word.startswith(("...", "…")):
                    break  # an elided rest
                if word in tasks:
                    task = word
                    named.append(word)
                    continue
                if not word.startswith("-"):
                    if task is not None:
                        continue  # a value or a placeholder (TASK, FILE)
                    if re.fullmatch(r"[a-z][a-z0-9-]*", word):
                        wrong.append(f"{doc.name}: `invoke {command.strip()}`: no task {word!r}")
                    break
                flag, eq, _ = word.partition("=")
                if task is None:
                    if flag not in CORE:
                        wrong.append(f"{doc.name}: `invoke {command.strip()}`: {flag} before any task")
                    continue
                seen += 1
                if flag in ("-h", "--help"):
                    continue
                if flag not in flags[task]:
                    wrong.append(f"{doc.name}: `invoke {command.strip()}`: invoke {task} has no {flag}")
                elif eq and flags[task][flag]:
                    wrong.append(f"{doc.name}: `invoke {command.strip()}`: {flag} is a switch, given a value")
    return wrong, seen


def test_the_check_finds_what_invoke_refuses(tmp_path):
    """The check above, against a page of commands Invoke refuses (each was missed by the check it replaced)."""
    page = tmp_path / "bad.md"
    page.write_text("`invoke doctor --dry` `invoke commit -a` `invoke plan --model=8B -- --seq_len 4096` "
                    "`invoke run --dry=yes`\n```sh\ninvoke run --recipe=ddp \\\n    --nosuch=1\n```\n")
    said = "\n".join(docs_errors([page])[0])
    for expected in ("invoke doctor has no --dry", "invoke commit has no -a", "plan pass nothing after --",
                     "--dry is a switch, given a value", "invoke run has no --nosuch"):
        assert expected in said, said


@pytest.mark.parametrize("text,expected", [
    ("run `invoke build run --recipe=zero2 -- --max_steps 5` now", [" build run --recipe=zero2 -- --max_steps 5"]),
    ("| `invoke save [--compress=zstd\\|gzip]` | x |", [" save [--compress=zstd\\|gzip]"]),
    ("```sh\ninvoke setup && invoke test\n```", [" setup", " test"]),
])
def test_the_extraction_finds_the_commands(text, expected):
    assert _commands(text) == expected
