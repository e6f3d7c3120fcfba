"""The loader: batches of (inputs, targets) for training and evaluation, from a prepared dataset's
token files, or synthetic tokens for bench.py. Targets are the inputs shifted by one token.

Training batches are built ahead by a background thread, as uint16 windows of block_size + 1 tokens,
into a few reused host buffers (pinned on CUDA): one host-to-device copy per batch, non-blocking,
and the conversion to int64 on the device. The time the training step waits for a batch is counted
(wait_seconds)."""

import queue
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nanogpt_perf.config import setting
from nanogpt_perf.data.order import DATA_ORDERS, RandomWindows, Window, window_order
from nanogpt_perf.data.shards import TokenFile, split_files
from nanogpt_perf.errors import UserError
from nanogpt_perf.files import host_memory_bytes

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass
class LoaderConfig:
    """The loader of a dataset's batches (bench.py's synthetic tokens have none)"""

    data_order: str = setting("random", "'random' windows (nanoGPT's, with replacement) or "
                              "'epochs'", choices=DATA_ORDERS)  # fmt: skip
    prefetch: int = setting(2, "batches the loader's background thread builds ahead", min=1,
                            note=" (batches built ahead)")  # fmt: skip


def token_files(data_path: Path, split: str, block_size: int) -> list[TokenFile]:
    """A split's token files, checked: present, readable, and holding at least one window; each kept
    open (see TokenBatches.changed_files)."""
    files = split_files(data_path, split, keep_open=True)
    n = sum(f.n_tokens for f in files)
    if files and n > block_size:
        return files
    for file in files:
        file.close()
    if not files:
        raise UserError(
            f"{data_path} has no {split} tokens: neither {split}.bin nor shards named "
            f"*_{split}_*.bin"
        )
    raise UserError(
        f"{data_path}: the {split} split has {n} tokens, too few for block_size={block_size}"
    )


def fill(buffer: np.ndarray, files: list[TokenFile], windows: list[Window]) -> None:
    """Copy each window of block_size + 1 tokens into a row of buffer (B, block_size + 1),
    uint16."""
    span = buffer.shape[1]
    maps: dict[int, np.ndarray] = {}  # each file mapped once per batch, then let go
    for row, (file, first) in enumerate(windows):
        if file not in maps:
            maps[file] = files[file].tokens()
        buffer[row] = maps[file][first : first + span]


class TokenBatches:
    """Training batches in data_order ('random' or 'epochs', see windows.py), this rank's share;
    evaluation batches from fixed windows of their own, the same at every call, so the training
    stream does not depend on how often or how long evaluation runs. state_dict() is where the next
    training batch will come from.

    The token files are opened once and read through those open files for the loader's life: a
    dataset prepared again while a run reads it (its files atomically replaced) leaves the run on
    the data it started with, and changed_files() says which were replaced."""

    def __init__(
        self,
        data_path: Path,
        batch_size: int,
        block_size: int,
        device: torch.device,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        data_order: str = "random",
        prefetch: int = 2,
    ):
        self.data_path, self.batch_size, self.block_size, self.device = (
            data_path,
            batch_size,
            block_size,
            device,
        )
        self.seed, self.rank, self.thread = seed, rank, None
        # see start(): uint16 batches in host memory
        buffers = (prefetch + 2) * batch_size * (block_size + 1) * 2
        if buffers > (host_memory_bytes() or buffers):
            raise UserError(
                f"batch_size={batch_size}, block_size={block_size}, prefetch={prefetch}: the "
                f"loader's {prefetch + 2} "
                f"batches in host memory take {buffers / 1e9:,.0f} GB, more than this machine's "
                f"{host_memory_bytes() / 1e9:,.0f} GB"
            )
        self.files: dict[str, list[TokenFile]] = {}
        for split in ("train", "val"):
            try:
                self.files[split] = token_files(data_path, split, block_size)
            except UserError:
                self.close()
                raise
        sizes = [f.n_tokens for f in self.files["train"]]
        self.windows = window_order(data_order, sizes, block_size, seed, rank, world_size)
        self.order, self.start_state = data_order, self.windows.state_dict()
        self.state = self.start_state  # after the batches handed out so far
        self.prefetch, self.thread, self.wait_seconds, self.reported = prefetch, None, 0.0, False

    # the background thread: free buffers in, filled buffers (with the order's state after them) out
    def start(self) -> None:
        pinned = self.device.type == "cuda"
        self.free, self.ready, self.stopping = queue.Queue(), queue.Queue(), threading.Event()
        # prefetch ready, one being filled, one being copied to the device
        for _ in range(self.prefetch + 2):
            buffer = torch.empty(
                self.batch_size, self.block_size + 1, dtype=torch.uint16, pin_memory=pinned
            )
            self.free.put((buffer, None))
        self.buffers = {buffer.data_ptr() for buffer, _ in list(self.free.queue)}
        self.thread = threading.Thread(target=self.produce, name="batches", daemon=True)
        self.thread.start()

    def produce(self) -> None:
        try:
            while True:
                buffer, copied = self.free.get()
                if self.stopping.is_set():
                    return
                if copied is not None:
                    copied.synchronize()  # its last batch has reached the device
                fill(buffer.numpy(), self.files["train"], self.windows.take(self.batch_size))
                self.ready.put((buffer, self.windows.state_dict()))
        except Exception as e:  # handed to the training step, which raises it
            self.ready.put((e, None))

    def stop(self) -> None:
        """Stop the thread; batches it built ahead are dropped (state_dict() still says where to
        continue)."""
        if self.thread is not None:
            self.stopping.set()
            self.free.put((None, None))
            self.thread.join()
            self.thread = None

    def host_batch(self) -> torch.Tensor:
        """The next training batch, (batch_size, block_size + 1) uint16 in host memory: waits if
        none is ready."""
        if self.thread is None:
            self.windows.load_state_dict(self.state)
            self.start()
        t0 = time.perf_counter()
        buffer, state = self.ready.get()
        self.wait_seconds += time.perf_counter() - t0
        if isinstance(buffer, Exception):
            raise buffer
        self.state = state
        return buffer

    def take_wait_seconds(self) -> float:
        """Seconds the training step waited for batches since the last call."""
        waited, self.wait_seconds = self.wait_seconds, 0.0
        return waited

    def to_device(self, buffer: torch.Tensor) -> Batch:
        """One copy to the device (non-blocking from pinned memory), int64 there; the buffer goes
        back to the thread once the copy is done."""
        on_device = buffer.to(self.device, non_blocking=True)
        copied = None
        if self.device.type == "cuda":
            copied = torch.cuda.Event()
            copied.record()
        # uint16 -> int64 through int16, whose casts every backend has (uint16's are recent and
        # partial) on the CPU a new tensor: the buffer is free at once
        tokens = on_device.view(torch.int16).long() & 0xFFFF
        if self.thread is not None and buffer.data_ptr() in self.buffers:
            self.free.put((buffer, copied))
        return tokens[:, :-1], tokens[:, 1:]

    def next_batch(self) -> Batch:
        return self.to_device(self.host_batch())

    def state_dict(self) -> dict[str, Any]:
        return dict(self.state)

    def load_state_dict(self, state: dict[str, Any]) -> str | None:
        """Continue from a saved state_dict(); one of another data_order (a resume that changes it)
        or one that no longer fits the files (a dataset changed since) starts this order at its
        beginning instead: the line that says so is returned (and printed by rank 0)."""
        self.stop()
        saved = state.get("order", "random")
        problem = (
            self.windows.state_problem(state)
            if saved == self.order
            else f"data_order was {saved!r}"
        )
        if problem is None:
            self.state = dict(state)
            return None
        self.state = self.start_state
        line = f"the loader starts data_order={self.order!r} at its beginning: {problem}"
        if self.rank == 0:
            print(line, flush=True)
        return line

    def changed_files(self) -> list[str]:
        """The names of the token files read that have been replaced, removed or changed on disk
        since they were opened (a stat per file): the run reads the files it opened all the same."""
        return [
            f.path.name for split in ("train", "val") for f in self.files[split] if f.replaced()
        ]

    def changed_line(self) -> str | None:
        """Once, when token files are first seen replaced (call it at each eval): the line that says
        so."""
        if self.reported or not (changed := self.changed_files()):
            return None
        self.reported = True
        names = ", ".join(changed[:3]) + (
            f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        )
        return (
            f"dataset {self.data_path.name} was prepared again while this run reads it ({names}): "
            "the run goes on "
            "with the data it started with"
        )

    def close(self) -> None:
        """Stop the thread and close the token files."""
        self.stop()
        for split in self.files.values():
            for file in split:
                file.close()

    def eval_batches(self, split: str, n: int) -> Iterator[Batch]:
        """n batches of split: the same windows at every call (this rank's own set). Rank 0 says,
        once, when the dataset has been prepared again under the run (which reads the files it
        opened)."""
        if self.rank == 0 and (line := self.changed_line()):
            print(line, flush=True)
        files = self.files[split]
        seed = zlib.crc32(f"eval/{split}/{self.seed}".encode())
        windows = RandomWindows([f.n_tokens for f in files], self.block_size, seed, self.rank)
        for _ in range(n):
            buffer = np.empty((self.batch_size, self.block_size + 1), dtype=np.uint16)
            fill(buffer, files, windows.take(self.batch_size))
            yield self.to_device(torch.from_numpy(buffer))


class SyntheticBatches(TokenBatches):
    """Random tokens made once, staged and copied to the device for every batch as TokenBatches does
    with real data: for timing a model without a dataset."""

    def __init__(
        self, batch_size: int, block_size: int, vocab_size: int, device: torch.device, seed: int
    ):
        self.device, self.thread, self.wait_seconds = device, None, 0.0
        g = torch.Generator().manual_seed(seed)
        tokens = torch.randint(vocab_size, (batch_size, block_size + 1), generator=g).to(
            torch.uint16
        )
        self.tokens = tokens.pin_memory() if device.type == "cuda" else tokens

    def host_batch(self) -> torch.Tensor:
        return self.tokens

    def eval_batches(self, split: str, n: int) -> Iterator[Batch]:
        return (self.to_device(self.tokens) for _ in range(n))

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def changed_files(self) -> list[str]:
        return []

    def changed_line(self) -> None:
        return None

    def close(self) -> None:
        pass
