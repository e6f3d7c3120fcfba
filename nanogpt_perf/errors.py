"""User-facing errors. What a user must fix (a setting, an input file, a full disk) is a UserError,
raised by library code like any exception, so that a notebook can catch it; a script's top installs
report_errors() (configure() does it), which prints an uncaught one as one line, 'error: ...', with
exit status 1 and no traceback. Ctrl-C is one line too (a KeyboardInterrupt's message, if any, says
what to do next), with the status of a process ended by SIGINT (130). Everything else keeps Python's
traceback: it is a bug."""

import logging
import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any


class UserError(Exception):
    """A mistake the user must fix; its message is the whole error line, without the 'error: '
    prefix."""


def report_errors() -> None:
    """Make this process print an uncaught UserError or KeyboardInterrupt as one line (the one
    handler)."""
    sys.excepthook = one_line


def one_line(
    kind: type[BaseException], error: BaseException, traceback: TracebackType | None
) -> None:
    """sys.excepthook: Python then exits with status 1, or by SIGINT after a KeyboardInterrupt
    (atexit runs)."""
    # one line, whatever a path or a name in it holds ('\n' as its escape)
    if issubclass(kind, UserError):
        text = str(error)
        print(
            f"error: {text if text.isprintable() else repr(text)[1:-1]}",
            file=sys.stderr,
            flush=True,
        )
    elif issubclass(kind, ValueError) and torch_refused_its_logs(traceback):
        logs = shown(os.environ.get("TORCH_LOGS", ""))
        print(
            f"error: TORCH_LOGS={logs} is not what torch takes: comma-separated names of its logs, "
            "modules or "
            "artifacts, each with an optional + or - (TORCH_LOGS=help lists them)",
            file=sys.stderr,
            flush=True,
        )
    elif issubclass(kind, KeyboardInterrupt):
        print(
            f"\ninterrupted (Ctrl-C){f': {error}' if str(error) else ''}",
            file=sys.stderr,
            flush=True,
        )
    else:
        sys.__excepthook__(kind, error, traceback)


def torch_refused_its_logs(traceback: TracebackType | None) -> bool:
    """Whether the error comes from torch reading TORCH_LOGS, which it does as it is imported."""
    while traceback is not None:
        code = traceback.tb_frame.f_code
        if code.co_name == "_init_logs" and Path(code.co_filename).parent.name == "_logging":
            return True
        traceback = traceback.tb_next
    return False


def shown(value: Any) -> str:
    """repr(value) for an error line: a huge int by its size, a long text by its start and its end
    (a path's file name shows), an object by its type."""
    if type(value) is int and value.bit_length() > 128:
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1:,} digits"
    if type(value) in (bool, int, float):
        return repr(value)
    if type(value) is str:
        if len(value) <= 80:
            return repr(value)
        return f"{value[:40]!r} ... {value[-36:]!r} ({len(value):,} characters)"
    kind = type(value)
    # a class type() made in a config file may have none
    module = getattr(kind, "__module__", "builtins")
    return f"a {kind.__qualname__ if module == 'builtins' else f'{module}.{kind.__qualname__}'}"


def first_line(error: BaseException) -> str:
    """An error's message in one line: its first, and the next where the first only announces it
    ('...:')."""
    try:
        text = str(error)
    except Exception:  # an exception whose message itself fails (a config file's own class may)
        text = "(its message cannot be shown)"
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()] or [""]
    return " ".join(lines[:2]) if lines[0].endswith(":") else lines[0]


@contextmanager
def quiet_loggers(*names: str) -> Iterator[None]:
    """Those loggers' warnings dropped meanwhile: noise a run's output and its one-line errors
    should not carry."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
