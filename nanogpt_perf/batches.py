"""Batches of (inputs, targets) for training and evaluation: windows of block_size + 1 tokens from a prepared
dataset, or synthetic tokens for bench.py. Targets are the inputs shifted by one token."""

import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from nanogpt_perf.errors import die

Batch = tuple[torch.Tensor, torch.Tensor]


class TokenBatches:
    """Random windows from data_path/{train,val}.bin (uint16). Training batches come from a stream that the seed
    and the rank fix, each rank its own; evaluation draws the same fixed windows every time, from generators of
    its own, so the training stream does not depend on how often or how long evaluation runs."""

    def __init__(self, data_path: Path, batch_size: int, block_size: int, device: torch.device, seed: int, rank=0):
        self.data_path, self.batch_size, self.block_size, self.device = data_path, batch_size, block_size, device
        self.seed, self.rank = seed, rank
        self.rng = torch.Generator().manual_seed(seed + rank)
        for split in ("train", "val"):
            n_tokens = (data_path / f"{split}.bin").stat().st_size // 2
            if n_tokens <= block_size:
                die(f"{data_path / split}.bin has {n_tokens} tokens, too few for block_size={block_size}")

    def windows(self, split: str, rng: torch.Generator) -> Batch:
        """batch_size windows at random starts, in host memory (pinned when bound for a GPU, for async copies)."""
        # a fresh memmap per batch: a long-lived one keeps growing the process's memory (numpy issue #8024)
        data = np.memmap(self.data_path / f"{split}.bin", dtype=np.uint16, mode="r")
        T = self.block_size
        starts = torch.randint(len(data) - T, (self.batch_size,), generator=rng).tolist()
        x = torch.from_numpy(np.stack([data[i : i + T] for i in starts]).astype(np.int64))
        y = torch.from_numpy(np.stack([data[i + 1 : i + 1 + T] for i in starts]).astype(np.int64))
        if self.device.type == "cuda":
            x, y = x.pin_memory(), y.pin_memory()
        return x, y

    def host_batch(self) -> Batch:
        """The next training batch of this rank's stream, in host memory."""
        return self.windows("train", self.rng)

    def to_device(self, x: torch.Tensor, y: torch.Tensor) -> Batch:
        non_blocking = self.device.type == "cuda"
        return x.to(self.device, non_blocking=non_blocking), y.to(self.device, non_blocking=non_blocking)

    def next_batch(self) -> Batch:
        return self.to_device(*self.host_batch())

    def eval_batches(self, split: str, n: int) -> Iterator[Batch]:
        """n batches of split: the same windows at every call (this rank's own set)."""
        rng = torch.Generator().manual_seed(zlib.crc32(f"eval/{split}/{self.seed}/{self.rank}".encode()))
        for _ in range(n):
            yield self.to_device(*self.windows(split, rng))


class SyntheticBatches(TokenBatches):
    """Random tokens made once, staged and copied to the device for every batch as TokenBatches does with real
    data: for timing a model without a dataset."""

    def __init__(self, batch_size: int, block_size: int, vocab_size: int, device: torch.device, seed: int):
        self.device = device
        g = torch.Generator().manual_seed(seed)
        x, y = (torch.randint(vocab_size, (batch_size, block_size), generator=g) for _ in range(2))
        self.x, self.y = (x.pin_memory(), y.pin_memory()) if device.type == "cuda" else (x, y)

    def windows(self, split: str, rng: torch.Generator) -> Batch:
        return self.x, self.y

    def host_batch(self) -> Batch:
        return self.x, self.y

    def eval_batches(self, split: str, n: int) -> Iterator[Batch]:
        return (self.to_device(self.x, self.y) for _ in range(n))
