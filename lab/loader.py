"""Time the loader alone: batches per second that train.py's training step can take from it, in each
window order, and the process's memory over a long run. An H100 training GPT-2 (124M) takes about 30
batches of 16 x 1024 a second; the loader should never be what it waits for.

    python lab/loader.py        # 20 synthetic shards of 10M tokens in a temporary folder
    python lab/loader.py --data=data/fineweb --batches=10000 --device=cuda

Each order runs `repeats` times, interleaved; the figure is the median.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for its modules
from nanogpt_perf.errors import report_errors

report_errors()  # from the first moment: Ctrl-C while torch loads is one line too

import os
import shutil
import signal
import statistics
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import torch

from configurator import configure
from nanogpt_perf.config import Config, setting
from nanogpt_perf.data.loader import TokenBatches
from nanogpt_perf.data.order import DATA_ORDERS
from nanogpt_perf.data.shards import shard_name, write_shard
from nanogpt_perf.errors import UserError
from nanogpt_perf.guard.paths import comma_separated, optional_path
from nanogpt_perf.runtime import DeviceConfig, resolve_device


# -----------------------------------------------------------------------------
@dataclass
class LoaderBenchConfig:
    """Settings of lab/loader.py: the data, the batches and the runs"""

    data: str = setting("", "a dataset folder (train.bin or llm.c shards); '' = synthetic shards "
                        "written to a temp folder", check=optional_path)  # fmt: skip
    shards: int = setting(
        20, "synthetic shards (the first is val)", min=2, note=" (the first is val)"
    )
    shard_tokens: int = setting(10_000_000, "tokens per synthetic shard", min=1)
    batch_size: int = setting(16, "sequences a batch", min=1)
    block_size: int = setting(1024, "tokens a sequence", min=1)
    batches: int = setting(10_000, "per run; memory is read after 100 and after all of them; at "
                           "most 10,000,000 (a run shows nothing until it ends)", above=100,
                           max=10_000_000,
                           note=" (memory is read after 100)")  # fmt: skip
    orders: str = setting(
        "random,epochs", "the loader's data_orders compared", check=comma_separated(*DATA_ORDERS)
    )
    repeats: int = setting(3, "runs of each order, interleaved; at most 1,000", min=1, max=1_000)


def a_window_fits(cfg: Config) -> None:
    """A window is block_size + 1 tokens."""
    if cfg.shard_tokens <= cfg.block_size:
        raise ValueError(
            f"shard_tokens must be > block_size ({cfg.block_size}), not {cfg.shard_tokens}"
        )


cfg = configure(
    loader=LoaderBenchConfig,
    hardware=DeviceConfig,
    defaults={"device": "cpu"},
    cross=(a_window_fits,),
)
# -----------------------------------------------------------------------------
if cfg.data and not os.path.isdir(cfg.data):
    raise UserError(
        f"data must be '' or a dataset folder (train.bin and val.bin, or shards), not {cfg.data!r}"
    )
# SIGTERM ends the script as Ctrl-C does, through the removal of its temporary folder (exit status
# 143)
signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
tmp_dir, size = tempfile.gettempdir(), cfg.shards * cfg.shard_tokens * 2
free = shutil.disk_usage(tmp_dir).free
if not cfg.data and size > free:
    raise UserError(
        f"{cfg.shards} synthetic shards of {cfg.shard_tokens:,} tokens take {size / 1e9:,.1f} GB, "
        f"more than the {free / 1e9:,.1f} GB free in {tmp_dir}: fewer shards or shard_tokens, or "
        "--data"
    )


def resident_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20


def synthetic_shards(folder: Path) -> Path:
    rng = np.random.default_rng(0)
    for i in range(cfg.shards):
        tokens = rng.integers(0, 50257, cfg.shard_tokens, dtype=np.uint16)
        write_shard(folder / shard_name("synthetic", "val" if i == 0 else "train", i), tokens)
    return folder


def run(path: Path, order: str) -> tuple[float, float, float]:
    """(batches per second after the first 100, RSS after 100 batches and after all, in MB)."""
    loader = TokenBatches(
        path, cfg.batch_size, cfg.block_size, resolve_device(cfg.device), 0, data_order=order
    )
    for _ in range(100):
        loader.next_batch()
    rss_100, t0 = resident_mb(), time.perf_counter()
    for _ in range(cfg.batches - 100):
        x, _ = loader.next_batch()
    if x.is_cuda:
        torch.cuda.synchronize()
    rate = (cfg.batches - 100) / (time.perf_counter() - t0)
    loader.close()
    return rate, rss_100, resident_mb()


with tempfile.TemporaryDirectory() as tmp:
    path = Path(cfg.data) if cfg.data else synthetic_shards(Path(tmp))
    figures: dict[str, list[tuple[float, float, float]]] = {
        o.strip(): [] for o in cfg.orders.split(",")
    }
    for r in range(cfg.repeats):
        for order, runs in figures.items():
            runs.append(run(path, order))
            rate, rss_100, rss_end = runs[-1]
            print(
                f"run {r + 1} {order}: {rate:,.0f} batches/s; "
                f"RSS {rss_100:.0f} MB after 100, {rss_end:.0f} MB after {cfg.batches:,}"
            )
for order, runs in figures.items():
    rate = statistics.median(r for r, _, _ in runs)
    growth = max(end - start for _, start, end in runs)
    print(
        f"{order}: median {rate:,.0f} batches/s of {cfg.batch_size} x {cfg.block_size} over "
        f"{len(runs)} runs; RSS grew by at most {growth:.1f} MB from batch 100 to {cfg.batches:,}"
    )
