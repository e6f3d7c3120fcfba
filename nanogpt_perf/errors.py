"""User-facing errors: a mistake in the settings or the inputs gets one line and a non-zero exit, no traceback."""

from pathlib import Path
from typing import NoReturn


def die(message: str) -> NoReturn:
    """One line on stderr, 'error: ...', and exit status 1: for the user's mistakes, which deserve no traceback."""
    raise SystemExit(f"error: {message}")


def read_user_text(path: Path, what: str) -> str:
    """The UTF-8 text of a file the user named (what it is: 'the prompt file'), or one line saying why not."""
    if not path.is_file():
        die(f"{what} {path} is not found")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        die(f"{what} {path} cannot be read as UTF-8 text: {e}")
