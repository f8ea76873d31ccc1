"""The one error type users see: a short message that says what was wrong and how to fix it.

Standard library only: the trainer imports this inside the image as cheaply as the host does.
"""

from __future__ import annotations

import json
from pathlib import Path


class DockyardError(Exception):
    """A failure caused by input or environment; tasks print the message and exit non-zero."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


def problems(error: Exception, where: str = "") -> str:
    """A pydantic ValidationError as one line: `field.sub: message; ...` (`where` names a field-less error).
    Anything else (a TypeError from bad keyword arguments) is its own message."""
    errors = getattr(error, "errors", None)
    if not callable(errors):
        return str(error)
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or where}: {e['msg']}" for e in errors())


def yaml_problem(error: Exception) -> str:
    """A YAML error as one line: what is wrong and where (`expected ',' or ']', but got '<stream end>' at line 1,
    column 13`) instead of the several lines PyYAML writes. Anything else is its own message."""
    mark = getattr(error, "problem_mark", None)
    said = getattr(error, "problem", None) or str(error)
    return said + (f" at line {mark.line + 1}, column {mark.column + 1}" if mark else "")


def json_object(path: Path, what: str) -> dict:
    """A JSON file that must hold one object (`what` names its contents in the refusal), read as untrusted input."""
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DockyardError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise DockyardError(f"{path}: expected a JSON object of {what}")
    return data
