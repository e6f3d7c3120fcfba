"""
The head and its loss alone, forward and backward: each way's time and peak memory at one shape, interleaved.

    python benchmarks/losses.py                         # CPU: 2048 rows of 128, GPT-2's vocabulary and a char one
    python benchmarks/losses.py --device=cuda --rows=32768 --n_embd=768 --vocabs=50304 --dtype=bfloat16

The ways: plain (logits, then F.cross_entropy: train.py's default), chunked (loss_chunk rows at a time with
checkpointing), old_fused (the autograd.Function of the branch point, read from git), fused (the operator
nanogpt::fused_linear_cross_entropy, its softmax in torch) and triton (the same with the Triton classifier, where it
can run). Each way runs `repeats` times, interleaved with the others; the time is the median. The memory is the
largest peak above what was held before the step: CUDA's allocator, or on a CPU the resident set (after malloc_trim,
so that the heap glibc keeps from one way does not hide the next one's).
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository root, for its modules
from nanogpt_perf.errors import report_errors

report_errors()  # from the first moment: Ctrl-C while torch loads is one line too

import ctypes
import importlib.util
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import model
from configurator import configure
from nanogpt_perf.config import setting
from nanogpt_perf.errors import UserError
from nanogpt_perf.guard.paths import comma_separated
from nanogpt_perf.kernels import triton_problem
from nanogpt_perf.kernels.losses import fused_cross_entropy
from nanogpt_perf.memory import peak_memory_bytes, reset_peak_memory
from nanogpt_perf.runtime import DeviceConfig, PrecisionConfig, SeedConfig, resolve_runtime

WAYS = ("plain", "chunked", "old_fused", "fused", "triton")
BRANCH_POINT = "ff38d87"  # the commit whose fused loss the operator replaced


def sizes(value: str) -> None:
    if not all(s.strip().isdigit() and int(s) > 0 for s in value.split(",")):
        raise ValueError("sizes > 0")


# -----------------------------------------------------------------------------
@dataclass
class LossesConfig:
    """Settings of benchmarks/losses.py: the shape, the ways compared and the runs"""

    rows: int = setting(2048, "B*T", min=1)
    n_embd: int = setting(128, "the width of the head's input", min=1)
    vocabs: str = setting("50304,128", "comma-separated vocabulary sizes: GPT-2's padded to 64, and Shakespeare's 65 "
                          "characters padded to 64", check=sizes)  # fmt: skip
    ways: str = setting("plain,chunked,old_fused,fused", "the ways compared (and triton where it can run)",
                        check=comma_separated(*WAYS))  # fmt: skip
    chunked_rows: int = setting(256, "loss_chunk of the chunked way", min=1)
    fused_rows: int = setting(0, "loss_chunk of the fused ways (0: as their memory budget picks)", min=0,
                              note=" (0 = by memory budget)")  # fmt: skip
    repeats: int = setting(7, "runs of each way, interleaved; at most 1,000", min=1, max=1_000)
    threads: int = setting(0, "torch's CPU threads (0: its default); 1 gives steadier figures on a machine shared "
                           "with other work", min=0, note=" (0 = torch's default)")  # fmt: skip


# dtype: float32, or bfloat16 or float16 (autocast over fp32 weights, as train.py runs); TF32 off unless asked
cfg = configure(
    losses=LossesConfig, hardware=DeviceConfig, precision=PrecisionConfig, rng=SeedConfig,
    defaults={"device": "cpu", "dtype": "float32", "tf32": False, "seed": 0},
)  # fmt: skip
# -----------------------------------------------------------------------------


def branch_point_fused() -> Callable | None:
    """fused_cross_entropy of model.py at BRANCH_POINT (a frozen copy, loaded as its own module), or None outside a
    git checkout that has that commit."""
    try:
        show = subprocess.run(["git", "show", f"{BRANCH_POINT}:model.py"], cwd=ROOT, capture_output=True, text=True)
    except OSError:  # no git on this machine
        return None
    if show.returncode != 0:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model_at_branch_point.py"
        path.write_text(show.stdout)
        spec = importlib.util.spec_from_file_location("model_at_branch_point", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module.fused_cross_entropy


def loss_ways(names: list[str]) -> dict[str, Callable]:
    old = branch_point_fused() if "old_fused" in names else None
    table = {
        "plain": lambda x, w, t: F.cross_entropy(F.linear(x, w).float(), t, ignore_index=-1),
        "chunked": lambda x, w, t: model.chunked_cross_entropy(x, w, t, cfg.chunked_rows),
        "old_fused": lambda x, w, t: old(x, w, t),
        "fused": lambda x, w, t: fused_cross_entropy(x, w, t, cfg.fused_rows),
        "triton": lambda x, w, t: fused_cross_entropy(x, w, t, cfg.fused_rows, use_triton=True),
    }
    skipped = {"old_fused": old is None and f"no git history with {BRANCH_POINT}", "triton": triton_problem(dev)}
    for name in names:
        if skipped.get(name):
            print(f"{name}: skipped ({skipped[name]})")
    return {name: table[name] for name in names if not skipped.get(name)}


def step(loss_of: Callable, x: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> tuple[float, int | None]:
    """One forward and backward: (ms, peak bytes above the memory held before it)."""
    x.grad = w.grad = None
    if dev.type == "cpu":
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    reset_peak_memory(dev)
    before = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else resident_bytes()
    t0 = time.perf_counter()
    with runtime.autocast_ctx():
        loss = loss_of(x, w, t)
    loss.backward()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3
    peak = peak_memory_bytes(dev)
    return ms, None if peak is None else peak - before


def resident_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096


def measure(vocab: int, table: dict[str, Callable]) -> dict[str, tuple[list[float], list[int | None]]]:
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.rows, cfg.n_embd, generator=g).to(dev).requires_grad_()
    w = (0.02 * torch.randn(vocab, cfg.n_embd, generator=g)).to(dev).requires_grad_()
    t = torch.randint(vocab, (cfg.rows,), generator=g).to(dev)
    runs: dict[str, tuple[list[float], list[int | None]]] = {name: ([], []) for name in table}
    for loss_of in table.values():  # a warm-up each: allocator pools, lazy imports, Triton's compile
        step(loss_of, x, w, t)
    for _ in range(cfg.repeats):
        for name, loss_of in table.items():
            ms, peak = step(loss_of, x, w, t)
            runs[name][0].append(ms)
            runs[name][1].append(peak)
    return runs


runtime = resolve_runtime(cfg.device, cfg.dtype, cfg.tf32)
dev = runtime.device
if cfg.threads:
    torch.set_num_threads(cfg.threads)
if dev.type == "cpu" and not Path("/proc/self/statm").exists():
    raise UserError("the CPU's memory figures read /proc/self/statm: Linux only")
table = loss_ways([w.strip() for w in cfg.ways.split(",")])
print(
    f"{cfg.rows} rows of {cfg.n_embd}, {runtime.dtype}, {dev} ({torch.get_num_threads()} threads), forward + backward, "
    f"median of {cfg.repeats} interleaved runs"
)
for vocab in (int(v) for v in cfg.vocabs.split(",")):
    runs = measure(vocab, table)
    plain_ms = statistics.median(runs["plain"][0]) if "plain" in runs else None
    print(f"\nvocab {vocab}: fp32 logits {cfg.rows * vocab * 4 / 2**20:,.0f} MiB")
    print(f"{'way':<10} {'ms':>9} {'vs plain':>9} {'peak MiB':>9}")
    for name, (times, peaks) in runs.items():
        ms = statistics.median(times)
        ratio = f"{ms / plain_ms:.2f}x" if plain_ms else "-"
        peak = "-" if None in peaks else f"{max(peaks) / 2**20:,.1f}"
        print(f"{name:<10} {ms:>9.1f} {ratio:>9} {peak:>9}")
