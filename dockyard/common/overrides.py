"""The trainer overrides after `--` (`--key value`, `--key=value`, `--flag`), each value read as a YAML scalar as the
settings files' are, and the numbers YAML 1.1 leaves as text (`1e-3`) read as the numbers they are, in the
overrides and the files alike. Which keys a run takes, and what each holds, is dockyard.common.run_settings'.
"""

from __future__ import annotations

import datetime as dt
import re
import shlex
from typing import Any

import yaml

from dockyard.common.errors import DockyardError
from dockyard.common.recipes import YAML_ERRORS, Yaml11Number, Yaml11Numbers


def parse_overrides(argv: list[str]) -> dict[str, Any]:
    """`--key value` / `--key=value` / `--flag` (true) → {key: value}, values read as YAML scalars."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok.lstrip("-") in HELP_WORDS:  # not "write it --help": no trainer setting is named that
            raise DockyardError(f"override {tok!r}: {HELP_ASKED}")
        if not tok.startswith("--") or tok == "--":
            raise DockyardError(f"override {tok!r} is not of the form --key value{_as_flag(tok)}")
        key, eq, value = tok[2:].partition("=")
        if not eq:
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                value, i = argv[i + 1], i + 1
            else:
                value = "true"
        key, flag = key.replace("-", "_"), tok.partition("=")[0]
        try:
            read = _scalar(value, flag)
        except Yaml11Number as e:  # `--max_steps 1:00` was 60 steps, `--seed 010` seed 8
            if key not in TEXT_KEYS:
                raise DockyardError(f"{flag} {e.problem}") from None
            read = value
        # a name or a path is the text typed: `--run_name yes` was recorded as true, `--data 2024` refused as a number,
        # `--run_name ::` refused as a mapping's key without a value and `--run_name '{a}'` recorded as {a: null}
        out[key] = value if key in TEXT_KEYS and not isinstance(read, (str, type(None))) else read
        i += 1
    return out


OVERRIDES_WHERE = "the overrides after --"  # where a setting came from, as an error names it
# help asked after `--` (`invoke run -- --help`, the trainer's options wanted): where it is, and what `--` takes
HELP_WORDS = ("help", "h")
HELP_ASKED = ("help is not a trainer setting: `invoke --help run` (or slurm, k8s) says the task's flags; after -- go "
              "the trainer's settings, the keys of recipes/defaults.yaml and any transformers.TrainingArguments field "
              "(e.g. -- --max_steps 50)")


# a name or a path: the text typed, never read as a number, a switch or a date
TEXT_KEYS = {"run_name", "model", "data", "eval_data", "hub_model_id", "hub_revision"}


def _as_flag(tok: str) -> str:
    """How an override typed as a name (`max_steps=10`, `-max_steps`, `max_steps 10`) is written: `--max_steps 10`."""
    named = re.fullmatch(r"-?([A-Za-z_][\w-]*)(?:=(.*))?", tok, re.S)
    if not named:  # a stray value, `--` again: no flag to name
        return ""
    value = f" {shlex.quote(named[2])}" if named[2] is not None else ""
    return f": write it --{named[1]}{value}"


def _scalar(text: str, flag: str = "") -> Any:
    try:
        value = yaml.load(text, Loader=_NoAliases)  # noqa: S506 - a SafeLoader
    except Aliased as e:
        raise DockyardError(f"{flag} {text[:40]!r}...: a YAML alias (*{e}) repeats a value by reference; write the "
                            "value out (an override holds no aliases)") from None
    except Yaml11Number:
        raise
    except YAML_ERRORS:  # `0x_`, `2001-02-30`, ...: not a YAML value, so the text itself
        return text
    if isinstance(value, str):
        try:  # YAML 1.1 reads 1e-4 as a string
            return float(text)
        except ValueError:
            return text
    if isinstance(value, (dt.date, dt.datetime)):  # `--run_name 2024-01-01` is a name, not a date (no setting
        return text                               # takes one, and JSON, the manifest's, has none)
    return yaml12_within(value) if isinstance(value, (dict, list)) else value


class _NoAliases(Yaml11Numbers):
    """YAML without aliases: nine levels of `&a [*b, *b, ...]`, 300 bytes of one override, stand for 10**9 values,
    which the run's record (overrides.json, the manifest) wrote out until the host's memory was gone."""

    def compose_node(self, parent, index):  # noqa: ANN001, ANN201 - PyYAML's own signature
        if self.check_event(yaml.AliasEvent):
            raise Aliased(self.peek_event().anchor)
        return super().compose_node(parent, index)


class Aliased(Exception):  # noqa: N818 - an alias met, not an error of YAML's
    pass


# a number in exponent form without a dot (`1e-3`), which YAML 1.1 (PyYAML) reads as text; the command line's
# overrides take it as a number (_scalar), and so do the YAML files
YAML11_TEXT_NUMBER = re.compile(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)[eE][-+]?[0-9]+")


def yaml12_numbers(layer: dict[str, Any]) -> dict[str, Any]:
    """A YAML file's settings with `1e-3` read as the number it is (`learning_rate: 1e-3` in a recipe was refused as
    "takes a finite number"), within a setting's mapping or list too."""
    return {k: v if k in TEXT_KEYS else yaml12_within(v) for k, v in layer.items()}


def yaml12_within(value: Any) -> Any:
    """`value` with every `1e-5` in it, however deep in mappings and lists, the number it is: `--lr_scheduler_kwargs
    '{min_lr: 1e-5}'` handed the schedule the text '1e-5' (a TypeError from the Trainer, blaming the setting), where
    `{min_lr: 1.0e-5}` was taken."""
    if isinstance(value, str):
        return float(value) if YAML11_TEXT_NUMBER.fullmatch(value) else value
    if isinstance(value, dict):
        return {k: yaml12_within(v) for k, v in value.items()}
    if isinstance(value, list):
        return [yaml12_within(v) for v in value]
    return value
