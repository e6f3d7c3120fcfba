"""User-facing errors: a mistake in the settings or the inputs gets one line and a non-zero exit, no traceback."""

from typing import NoReturn


def die(message: str) -> NoReturn:
    """One line on stderr, 'error: ...', and exit status 1: for the user's mistakes, which deserve no traceback."""
    raise SystemExit(f"error: {message}")
