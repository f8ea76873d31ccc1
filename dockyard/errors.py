"""The one error type users see: a short message that says what was wrong and how to fix it.

Standard library only: the trainer imports this inside the image as cheaply as the host does.
"""

from __future__ import annotations


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
