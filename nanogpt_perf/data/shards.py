"""Token files on disk. Two layouts are read:

- shards in llm.c's format (also modded-nanogpt's): a header of 256 int32 (magic 20240520, version 1, the token
  count, the rest zero), then the tokens as uint16; named NAME_val_NNNNNN.bin and NAME_train_NNNNNN.bin;
- nanoGPT's single files train.bin and val.bin: uint16 tokens, no header.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nanogpt_perf.errors import UserError
from nanogpt_perf.files import write_atomically

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

    def tokens(self) -> np.memmap:
        """The tokens, mapped read-only. Map afresh when needed rather than keeping one map for a whole run: a
        long-lived map's touched pages count in the process's memory (numpy issue #8024)."""
        return np.memmap(self.path, dtype=np.uint16, mode="r", offset=self.offset, shape=(self.n_tokens,))


def shard_name(prefix: str, split: str, index: int) -> str:
    return f"{prefix}_{split}_{index:06d}.bin"


def write_shard(path: Path, tokens: np.ndarray) -> None:
    """Write tokens (< 2**16) as one shard in llm.c's format, atomically: a temporary file beside it, then renamed."""
    if tokens.size and int(tokens.max()) >= 2**16:
        raise ShardError(f"{path}: token id {int(tokens.max())} does not fit in uint16")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = MAGIC, VERSION, tokens.size
    write_atomically(path, lambda f: f.write(header.tobytes() + tokens.astype("<u2", copy=False).tobytes()))


def read_shard_header(path: Path) -> TokenFile:
    """The shard at path, checked: a header with the magic and version, and a token count that the file size
    agrees with."""
    if not path.is_file():
        raise ShardError(f"{path}: not a file")
    size = path.stat().st_size
    if size < HEADER_BYTES:
        raise ShardError(f"{path}: truncated: {size} bytes, shorter than the {HEADER_BYTES}-byte header")
    try:
        header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    except OSError as e:
        raise ShardError(f"{path}: cannot be read: {e.strerror or e}") from None
    if header[0] != MAGIC:
        raise ShardError(f"{path}: not a token shard: magic {header[0]}, expected {MAGIC} (llm.c's format)")
    if header[1] != VERSION:
        raise ShardError(f"{path}: shard version {header[1]}, only version {VERSION} (uint16 tokens) is read")
    n_tokens = int(header[2])
    if size != HEADER_BYTES + 2 * n_tokens:
        have = (size - HEADER_BYTES) // 2
        raise ShardError(f"{path}: its header says {n_tokens:,} tokens but the file holds {have:,}: truncated?")
    return TokenFile(path, HEADER_BYTES, n_tokens)


def split_files(data_path: Path, split: str) -> list[TokenFile]:
    """The token files of a split ('train' or 'val'): data_path/SPLIT.bin when it exists, else the shards
    *_SPLIT_*.bin (or *_SPLIT.bin) in name order; [] when there are none."""
    single = data_path / f"{split}.bin"
    if single.is_file():
        size = single.stat().st_size
        if size % 2:
            raise ShardError(f"{single}: {size} bytes, an odd number: not uint16 tokens")
        return [TokenFile(single, 0, size // 2)]
    shards = sorted({*data_path.glob(f"*_{split}_*.bin"), *data_path.glob(f"*_{split}.bin")})
    return [read_shard_header(p) for p in shards]


def has_tokens(data_path: Path) -> bool:
    """Whether data_path holds a training split in either layout."""
    return (data_path / "train.bin").is_file() or any(data_path.glob("*_train*.bin"))
