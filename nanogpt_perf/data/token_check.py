"""Every token id of a dataset inside its vocabulary, checked before a run starts: an id past the vocabulary would
index past the model's embedding (an IndexError on a CPU, a device-side assert that ends the CUDA context on a GPU)
only once training had begun and written its first files.

Cost: the largest id of each token file is found once, by numpy's max over its uint16 map in chunks of 8 MB (about
25 GB/s from the page cache on one core, the disk's speed otherwise: FineWeb-Edu's 10B tokens, 20 GB, in seconds to
a minute), then kept in DATASET/token_ids.json keyed by each file's size and modification time, so that later runs
read no tokens, only a stat per file; a changed or new file is scanned again. A dataset under 64 MiB is scanned every
time (milliseconds) and gets no such file. The file is written atomically, by the one caller that checks (rank 0);
where the folder cannot be written, every run scans. Delete it to have everything scanned again."""

import json
import time
from pathlib import Path
from typing import Any

from nanogpt_perf.data.shards import TokenFile, split_files
from nanogpt_perf.errors import UserError
from nanogpt_perf.files import write_json

CACHE_NAME = "token_ids.json"
CACHE_FROM_BYTES = 64 * 2**20  # datasets smaller than this are scanned every time: faster than a file to keep
CHUNK_TOKENS = 2**22  # 8 MB of uint16 per numpy max: in cache, and no memory held


def largest_id(file: TokenFile) -> int:
    """The largest token id in file (-1 when it has none)."""
    if file.n_tokens == 0:
        return -1
    try:
        tokens = file.tokens()
        return max(int(tokens[i : i + CHUNK_TOKENS].max()) for i in range(0, file.n_tokens, CHUNK_TOKENS))
    except OSError as e:
        raise UserError(f"{file.path} cannot be read: {e.strerror or e}") from None


def file_key(path: Path) -> dict[str, int]:
    """What says a file is unchanged since it was scanned: its size and modification time."""
    stat = path.stat()
    return {"bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def read_cache(path: Path) -> dict[str, Any]:
    """The largest ids recorded in path, by file name; {} when there is none or it is not one of ours (it is
    rebuilt, never trusted when malformed)."""
    try:
        files = json.loads(path.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    valid = lambda e: isinstance(e, dict) and all(type(e.get(k)) is int for k in ("bytes", "mtime_ns", "max_id"))  # noqa: E731
    return {name: entry for name, entry in files.items() if valid(entry)} if isinstance(files, dict) else {}


def dataset_files(data_path: Path) -> list[TokenFile]:
    """The token files of both splits, their headers checked (a split that is missing is the loader's to say)."""
    return [*split_files(data_path, "train"), *split_files(data_path, "val")]


def check_token_ids(data_path: Path, vocab_size: int, cache_from_bytes: int = CACHE_FROM_BYTES) -> None:
    """One error line (and nothing written) when a token file of data_path holds an id >= vocab_size: the file, its
    largest id and the vocabulary. The largest ids are read from data_path/token_ids.json where a file is unchanged
    since it was scanned; what is scanned is recorded there, for a dataset of cache_from_bytes or more."""
    files, cache_path = dataset_files(data_path), data_path / CACHE_NAME
    known, entries, scanned, t0 = read_cache(cache_path), {}, 0, time.perf_counter()
    for file in files:
        key, entry = file_key(file.path), known.get(file.path.name)
        if entry is not None and {k: entry[k] for k in key} == key:
            largest = entry["max_id"]
        else:
            largest, scanned = largest_id(file), scanned + key["bytes"]
        if largest >= vocab_size:
            meta = data_path / "meta.pkl"
            whose = f"{meta}'s vocab_size" if meta.is_file() else "GPT-2's: the dataset has no meta.pkl"
            raise UserError(
                f"{file.path} holds token id {largest}, outside the vocabulary of {vocab_size} tokens ({whose}): "
                "the tokens and the vocabulary do not belong together; prepare the dataset again"
            )
        entries[file.path.name] = key | {"max_id": largest}
    total = sum(entry["bytes"] for entry in entries.values())
    if scanned and total >= cache_from_bytes:
        print(
            f"token ids checked: {scanned / 1e6:,.0f} MB scanned in {time.perf_counter() - t0:.2f} s, every id below "
            f"{vocab_size}; kept in {cache_path} for the next runs",
            flush=True,
        )
        try:
            write_json(cache_path, {"files": entries})
        except OSError as e:  # a read-only dataset: the next run scans again
            print(f"(could not write {cache_path}: {e.strerror or e}; the next run scans again)", flush=True)
