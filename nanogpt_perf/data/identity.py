"""A dataset's identity: what says that the data a run resumes on is the data it started with. Each token file and
meta.pkl by name, size and a fingerprint: a hash of SAMPLES blocks of BLOCK bytes read at fixed places across the
file (its start and its end among them), so that FineWeb-Edu's 20 GB cost a few hundred small reads, milliseconds
from the page cache. A fingerprint sees a file rewritten or re-tokenised (every block changes), not a single token
changed between two blocks: it is a check against another dataset, not a checksum.

The folder is named by its canonical path, so that the same data named another way (relative or absolute, with ~,
through a link) is the same data, and a folder moved or copied elsewhere whole keeps its identity's files."""

import hashlib
import os
from pathlib import Path
from typing import Any

from nanogpt_perf.data.shards import split_files

SAMPLES, BLOCK = 8, 4096
META = "meta.pkl"


def canonical_folder(path: Path | str) -> str:
    """The one absolute name of a folder: ~ expanded, links resolved, '..' and '.' gone."""
    return os.path.realpath(os.path.expanduser(str(path)))


def same_folder(a: Path | str, b: Path | str) -> bool:
    """Whether a and b name the same folder (one of them relative, with ~, through a link, or both the same file
    system object by two paths, as a bind mount)."""
    if canonical_folder(a) == canonical_folder(b):
        return True
    try:
        return os.path.samefile(os.path.expanduser(str(a)), os.path.expanduser(str(b)))
    except OSError:  # one of them is not there
        return False


def fingerprint(path: Path, size: int) -> str:
    """A hash of SAMPLES blocks of BLOCK bytes at fixed places from the file's start to its end (all of a small
    file)."""
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        if size <= SAMPLES * BLOCK:
            digest.update(f.read())
        else:
            for k in range(SAMPLES):
                digest.update(os.pread(f.fileno(), BLOCK, (size - BLOCK) * k // (SAMPLES - 1)))
    return digest.hexdigest()


def dataset_identity(data_path: Path) -> dict[str, Any]:
    """{'folder': the canonical path, 'files': {name: {'bytes': size, 'fingerprint': hash}}} over the token files
    of both splits (train.bin and val.bin, or shards) and meta.pkl, as plain data for a checkpoint."""
    paths = [f.path for split in ("train", "val") for f in split_files(data_path, split)]
    if (data_path / META).is_file():
        paths.append(data_path / META)
    files = {}
    for path in paths:
        size = path.stat().st_size
        files[path.name] = {"bytes": size, "fingerprint": fingerprint(path, size)}
    return {"folder": canonical_folder(data_path), "files": files}


def identity_change(saved: dict[str, Any], now: dict[str, Any]) -> str | None:
    """What changed in a dataset's files from identity saved to identity now, in words naming the files (the
    first few), or None when they are the same. The folder's name is not compared: see same_folder."""
    before, after = saved.get("files"), now["files"]
    if not isinstance(before, dict) or not all(
        isinstance(v, dict) and type(v.get("bytes")) is int for v in before.values()
    ):
        return "the saved record of its files is not one (not written by this suite?)"
    changes = []
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name), after.get(name)
        if old == new:
            continue
        if old is None:
            changes.append(f"{name} is new")
        elif new is None:
            changes.append(f"{name} is gone")
        elif old.get("bytes") != new["bytes"]:
            changes.append(f"{name} has {new['bytes']:,} bytes, not {old['bytes']:,}")
        else:
            changes.append(f"{name} has other contents (the same {new['bytes']:,} bytes)")
    if not changes:
        return None
    more = f" and {len(changes) - 3} more" if len(changes) > 3 else ""
    return "; ".join(changes[:3]) + more
