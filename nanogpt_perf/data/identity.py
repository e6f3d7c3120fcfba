"""A dataset read before a run starts, for the guard's checks (nanogpt_perf/guard/dataset.py), and
its identity: what says that the data a run resumes on is the data it started with.

Every token id inside the vocabulary: an id past it would index past the model's embedding (an
IndexError on a CPU, a device-side assert that ends the CUDA context on a GPU) only once training
had begun and written its first files. The same read hashes each token file whole (SHA-256), so that
a resume on a file changed by one token is refused. Cost: one read of every token file, at the
hash's speed (about 1.5 GB/s on one core with the CPU's SHA instructions; numpy's max in the same
pass costs little): FineWeb-Edu's 20 GB in about 15 s, once. What was read is kept in
DATASET/token_ids.json by each file's size, modification and change times and inode, so that later
runs read no tokens, only a stat per file; a file changed in any way (its ctime cannot be set back)
is read again. Only rank 0 checks, and writes it atomically; where the folder cannot be written,
every run reads. Delete it to have everything read again.

An identity also keeps each file's fingerprint, what checkpoints of earlier versions hold and are
compared by; its folder is its canonical path: the same data named another way (relative, with ~,
through a link) is the same data, and a folder moved or copied elsewhere whole keeps its identity's
files."""

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from nanogpt_perf.data.shards import TokenFile, split_files
from nanogpt_perf.errors import UserError
from nanogpt_perf.files import ReadFailed, WriteFailed, open_file, read_file, write_json
from nanogpt_perf.guard.dataset import check_same_data, check_token_range

SAMPLES, BLOCK = 8, 4096
META = "meta.pkl"
CACHE_NAME = "token_ids.json"
# datasets smaller than this are read every time: faster than a file to keep
CACHE_FROM_BYTES = 64 * 2**20
CHUNK_TOKENS = 2**22  # 8 MB of uint16 a read: in cache, and no memory held
STAT_FIELDS = {
    "bytes": "st_size",
    "mtime_ns": "st_mtime_ns",
    "ctime_ns": "st_ctime_ns",
    "inode": "st_ino",
}


def canonical_folder(path: Path | str) -> str:
    return os.path.realpath(os.path.expanduser(str(path)))


def fingerprint(path: Path, size: int) -> str:
    """A hash of SAMPLES blocks of BLOCK bytes spread from its start to its end (all of a small
    file)."""
    digest = hashlib.blake2b(digest_size=16)
    with open_file(path) as f:
        if size <= SAMPLES * BLOCK:
            digest.update(f.read())
        else:
            for k in range(SAMPLES):
                digest.update(os.pread(f.fileno(), BLOCK, (size - BLOCK) * k // (SAMPLES - 1)))
    return digest.hexdigest()


def dataset_identity(data_path: Path, digests: dict[str, str] | None = None) -> dict[str, Any]:
    """{'folder': the canonical path, 'files': {name: {'bytes', 'fingerprint', 'sha256'}}} over the
    token files of both splits (train.bin and val.bin, or shards) and meta.pkl, as plain data for a
    checkpoint; sha256 where digests (check_token_ids') has the file's (meta.pkl's is then read
    here)."""
    paths = [f.path for split in ("train", "val") for f in split_files(data_path, split)]
    if os.path.lexists(data_path / META):  # a folder or a FIFO there: one line, not 'no meta.pkl'
        paths.append(data_path / META)
        if digests is not None:
            digests = digests | {META: hashlib.sha256(read_file(data_path / META)).hexdigest()}
    files = {}
    for path in paths:
        size = path.stat().st_size
        files[path.name] = {"bytes": size, "fingerprint": fingerprint(path, size)}
        if digests and path.name in digests:
            files[path.name]["sha256"] = digests[path.name]
    return {"folder": canonical_folder(data_path), "files": files}


def scan_file(file: TokenFile) -> tuple[int, str]:
    """The largest token id in file (-1 when it has none) and the SHA-256 of all its bytes, in one
    read."""
    digest, largest, buffer = hashlib.sha256(), -1, bytearray(2 * CHUNK_TOKENS)
    try:
        with open_file(file.path) as f:
            digest.update(f.read(file.offset))  # a shard's header
            while n := f.readinto(buffer):
                chunk = memoryview(buffer)[:n]
                digest.update(chunk)
                if n >= 2:
                    largest = max(
                        largest, int(np.frombuffer(chunk[: n - n % 2], dtype=np.uint16).max())
                    )
    except OSError as e:
        raise UserError(f"{file.path} cannot be read: {e.strerror or e}") from None
    return largest, digest.hexdigest()


def read_cache(path: Path) -> dict[str, Any]:
    """Each file's record in path, by name, malformed ones left out (rebuilt, never trusted): a
    max_id that no uint16 token is (-1: none) too."""
    try:
        files = json.loads(read_file(path))["files"]  # a FIFO there: no cache, never a wait
    except (OSError, ReadFailed, ValueError, KeyError, TypeError):
        return {}
    types = {k: int for k in STAT_FIELDS} | {"max_id": int, "sha256": str}
    valid = lambda e: isinstance(e, dict) and all(type(e.get(k)) is t for k, t in types.items())
    if not isinstance(files, dict):
        return {}
    return {name: e for name, e in files.items() if valid(e) and -1 <= e["max_id"] < 2**16}


def check_token_ids(
    data_path: Path, vocab_size: int, cache_from_bytes: int = CACHE_FROM_BYTES
) -> dict[str, str]:
    """Each token file's SHA-256 by name; one error line (nothing written) when one holds an id >=
    vocab_size. What is read is kept in token_ids.json for a dataset of cache_from_bytes or more
    (see the module)."""
    cache_path = data_path / CACHE_NAME
    known, entries, scanned, t0 = read_cache(cache_path), {}, 0, time.perf_counter()
    for file in [*split_files(data_path, "train"), *split_files(data_path, "val")]:
        stat = file.path.stat()
        key = {k: getattr(stat, field) for k, field in STAT_FIELDS.items()}
        entry = known.get(file.path.name)
        if entry is None or {k: entry[k] for k in key} != key:
            largest, digest = scan_file(file)
            entry, scanned = key | {"max_id": largest, "sha256": digest}, scanned + key["bytes"]
        check_token_range(file.path, entry["max_id"], vocab_size, data_path / META)
        entries[file.path.name] = entry
    if scanned and sum(entry["bytes"] for entry in entries.values()) >= cache_from_bytes:
        print(
            f"token ids checked: {scanned / 1e6:,.0f} MB read in {time.perf_counter() - t0:.2f} s, "
            "every id below "
            f"{vocab_size}; kept in {cache_path} for the next runs",
            flush=True,
        )
        try:
            write_json(cache_path, {"files": entries})
        except WriteFailed as e:  # a read-only dataset: the next run reads again
            print(
                f"(could not write {cache_path}: {e.reason}; the next run reads again)", flush=True
            )
    return {name: entry["sha256"] for name, entry in entries.items()}


def checked_identity(
    data_path: Path, dataset: str, vocab_size: int, saved: dict | None, allow_changed: bool
) -> dict:
    """The identity of the dataset (named dataset) at data_path, every token id checked against
    vocab_size; held against a resumed checkpoint's (saved) by guard/dataset.check_same_data."""
    identity = dataset_identity(data_path, check_token_ids(data_path, vocab_size))
    if saved and (taken := check_same_data(saved, identity, dataset, allow_changed)):
        print(taken, flush=True)
    return identity
