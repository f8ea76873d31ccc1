"""The one error type users see: a short message that says what was wrong and how to fix it."""


class DockyardError(Exception):
    """A failure caused by input or environment; tasks print the message and exit non-zero."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code
