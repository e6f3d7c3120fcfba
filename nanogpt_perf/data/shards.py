"""Token files on disk. Two layouts are read:

- shards in llm.c's format (also modded-nanogpt's): a header of 256 int32 (magic 20240520, version
  1, the token count, the rest zero), then the tokens as uint16; named NAME_val_NNNNNN.bin and
  NAME_train_NNNNNN.bin;
- nanoGPT's single files train.bin and val.bin: uint16 tokens, no header.
"""

import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from nanogpt_perf.errors import UserError
from nanogpt_perf.files import ReadFailed, open_file, write_atomically

MAGIC, VERSION = 20240520, 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4


class ShardError(UserError):
    """A token file that cannot be read as what its name says: the message names the file."""


@dataclass(frozen=True)
class TokenFile:
    path: Path
    offset: int  # bytes before the first token
    n_tokens: int
    # the file kept open (keep_open)
    handle: BinaryIO | None = field(default=None, compare=False, repr=False)
    # its signature when it was opened
    opened: tuple[int, ...] = field(default=(), compare=False, repr=False)

    def tokens(self) -> np.ndarray:
        """The tokens, mapped read-only: from the open file where it is kept open (the file read
        from the start, whatever has its name now), else by name. Map afresh when needed rather than
        keeping one map for a whole run: a long-lived map's touched pages count in the process's
        memory (numpy issue #8024)."""
        if self.handle is None:
            return np.memmap(
                self.path, dtype=np.uint16, mode="r", offset=self.offset, shape=(self.n_tokens,)
            )
        if self.n_tokens == 0:
            return np.empty(0, dtype=np.uint16)
        start = self.offset - self.offset % mmap.ALLOCATIONGRANULARITY
        mapped = mmap.mmap(
            self.handle.fileno(),
            self.offset - start + 2 * self.n_tokens,
            access=mmap.ACCESS_READ,
            offset=start,
        )
        return np.frombuffer(
            mapped, dtype=np.uint16, count=self.n_tokens, offset=self.offset - start
        )

    def replaced(self) -> bool:
        """Whether the file at path is no longer the one opened (replaced, removed, or changed in
        place)."""
        try:
            return signature(os.stat(self.path)) != self.opened
        except OSError:
            return True

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()


def signature(stat: os.stat_result) -> tuple[int, ...]:
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


def open_tokens(path: Path) -> tuple[BinaryIO, os.stat_result]:
    """path opened for reading, and its stat; ShardError (one line) where it cannot be, or is no
    file: a folder, a FIFO (never waited on), a link to nothing."""
    try:
        handle = open_file(path)
    except ReadFailed as e:
        raise ShardError(str(e)) from None
    return handle, os.fstat(handle.fileno())


def shard_name(prefix: str, split: str, index: int) -> str:
    return f"{prefix}_{split}_{index:06d}.bin"


def write_shard(path: Path, tokens: np.ndarray) -> None:
    """Write tokens (< 2**16) as one shard in llm.c's format, atomically: a temporary file beside
    it, then renamed."""
    if tokens.size and int(tokens.max()) >= 2**16:
        raise ShardError(f"{path}: token id {int(tokens.max())} does not fit in uint16")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = MAGIC, VERSION, tokens.size
    write_atomically(
        path, lambda f: f.write(header.tobytes() + tokens.astype("<u2", copy=False).tobytes())
    )


def read_shard_header(path: Path, keep_open: bool = False) -> TokenFile:
    """The shard at path, checked: a header with the magic and version, and a token count that the
    file size agrees with; kept open where asked (see split_files)."""
    handle, stat = open_tokens(path)
    try:
        shard = shard_in(path, handle, stat.st_size)
    except BaseException:
        handle.close()
        raise
    if not keep_open:
        handle.close()
        return shard
    return TokenFile(path, HEADER_BYTES, shard.n_tokens, handle, signature(stat))


def shard_in(path: Path, handle: BinaryIO, size: int) -> TokenFile:
    """The shard of the open file handle (size bytes), its header checked."""
    if size < HEADER_BYTES:
        raise ShardError(
            f"{path}: truncated: {size} bytes, shorter than the {HEADER_BYTES}-byte header"
        )
    try:
        header = np.frombuffer(os.pread(handle.fileno(), HEADER_BYTES, 0), dtype="<i4")
    except OSError as e:
        raise ShardError(f"{path}: cannot be read: {e.strerror or e}") from None
    if header[0] != MAGIC:
        raise ShardError(
            f"{path}: not a token shard: magic {header[0]}, expected {MAGIC} (llm.c's format)"
        )
    if header[1] != VERSION:
        raise ShardError(
            f"{path}: shard version {header[1]}, only version {VERSION} (uint16 tokens) is read"
        )
    n_tokens = int(header[2])
    if size != HEADER_BYTES + 2 * n_tokens:
        have = (size - HEADER_BYTES) // 2
        raise ShardError(
            f"{path}: its header says {n_tokens:,} tokens but the file holds {have:,}: truncated?"
        )
    return TokenFile(path, HEADER_BYTES, n_tokens)


def split_files(data_path: Path, split: str, keep_open: bool = False) -> list[TokenFile]:
    """The token files of a split ('train' or 'val'): data_path/SPLIT.bin when it exists, else the
    shards *_SPLIT_*.bin (or *_SPLIT.bin) in name order; [] when there are none. keep_open: each
    file opened here and kept open, read through that (a loader's files: a dataset prepared again
    under a run, its files replaced, leaves the run reading the files it started with)."""
    single = data_path / f"{split}.bin"
    if os.path.lexists(single):  # a FIFO or a folder there: named, not taken for no train.bin
        handle, stat = open_tokens(single)
        if not keep_open:
            handle.close()
        if stat.st_size % 2:
            handle.close()
            raise ShardError(f"{single}: {stat.st_size} bytes, an odd number: not uint16 tokens")
        return [
            TokenFile(single, 0, stat.st_size // 2, handle if keep_open else None, signature(stat))
        ]
    shards = sorted({*data_path.glob(f"*_{split}_*.bin"), *data_path.glob(f"*_{split}.bin")})
    files: list[TokenFile] = []
    try:
        for path in shards:
            files.append(read_shard_header(path, keep_open))
    except BaseException:
        for file in files:
            file.close()
        raise
    return files


def has_tokens(data_path: Path) -> bool:
    """Whether data_path holds a training split in either layout (a train.bin that is no file too:
    reading it says what it is)."""
    return os.path.lexists(data_path / "train.bin") or any(data_path.glob("*_train*.bin"))
