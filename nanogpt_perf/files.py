"""Files written for a user, atomically: into a temporary file beside the target, flushed to disk, then renamed over
it. A crash, a kill or a full disk at any moment leaves the previous file whole (or none), never half of a new one,
and no temporary file behind."""

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def write_atomically(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """write(f) into a temporary file beside path, then fsync and rename it to path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes(path: Path, data: bytes) -> None:
    write_atomically(path, lambda f: f.write(data))


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: Path, data: Any, indent: int = 2) -> None:
    write_text(path, json.dumps(data, indent=indent) + "\n")
