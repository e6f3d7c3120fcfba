"""Time one Case honestly: burn-in iterations apart, every timed iteration of
nanogpt_perf.train.step.TrainStep (the step train.py runs) between device synchronisations, its
phases, compile time and recompilations, memory, and the SDPA kernel that actually ran."""

if __name__ == "__main__":  # run as a script, it would fail at its imports
    raise SystemExit("error: bench_measure.py is a module of bench.py: run bench.py (--help)")

import gc
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from lab.bench_cases import Case
from nanogpt_perf.data.loader import TokenBatches
from nanogpt_perf.errors import first_line
from nanogpt_perf.files import write_through_path
from nanogpt_perf.memory import (
    held_memory_bytes,
    memory_by_part,
    peak_memory_bytes,
    peak_reserved_bytes,
    reset_peak_memory,
)
from nanogpt_perf.optim import adamw_is_fused, state_arithmetic
from nanogpt_perf.peak_flops import mfu
from nanogpt_perf.profiling import step_profiler
from nanogpt_perf.runtime import Runtime, resolve_runtime
from nanogpt_perf.timing import PHASES, PhaseClock
from nanogpt_perf.train.autobatch import out_of_memory
from nanogpt_perf.train.build import build_training
from nanogpt_perf.train.step import TrainStep

# (batch_size, block_size, device) -> batches
BatchSource = Callable[[int, int, torch.device], TokenBatches]


# the aten op that scaled_dot_product_attention dispatched to, as a profiler trace names it
SDPA_OPS = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "aten::_scaled_dot_product_efficient_attention": "memory-efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_attention_math_for_mps": "math (MPS)",
    "aten::_scaled_dot_product_fused_attention_overrideable": "fused (device backend)",
}


def sdpa_kernel_that_ran(step: Callable, device: torch.device) -> str:
    """Run one step under torch.profiler and name the SDPA kernels whose ops its trace shows."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
    ran = sorted({SDPA_OPS[e.name] for e in prof.events() if e.name in SDPA_OPS})
    return ", ".join(ran) or "none in the trace"


def dynamo_counts() -> dict[str, int]:
    from torch._dynamo.utils import counters  # 1 s to import: only when measuring

    return {
        "frames": counters["frames"]["total"],
        "graphs": counters["stats"]["unique_graphs"],
        "graph_breaks": sum(counters["graph_break"].values()),
    }


FIGURES = tuple(
    "precision ms_median ms_p90 ms_min ms_max tokens_per_s mfu peak_mem_bytes peak_reserved_bytes "
    "first_iter_ms compile_s graphs recompiles graph_breaks phases_ms sdpa_kernel fused_adamw "
    "speedup_prev speedup_first memory memory_arithmetic".split()
)


def result(case: Case, status: str, reason: str = "", **figures: Any) -> dict[str, Any]:
    """One row of a bench output: 'ok' with every figure, or 'skipped'/'failed' with the reason and
    None figures."""
    return {"name": case.name, "status": status, "reason": reason, "settings": case.measured()} | {
        k: figures.get(k) for k in FIGURES
    }


def time_steps(
    step: TrainStep, runtime: Runtime, burn_in: int, steps: int, compiled: bool
) -> dict[str, Any]:
    """Time burn_in + steps steps, each between device synchronisations: the milliseconds of the
    first and of the last `steps` (median, p90, min, max, and each phase's median); with compiled,
    the compile time and dynamo's counts from before the first step, after it and after the last."""
    clock, times, phases, counts = PhaseClock(runtime), [], [], [dynamo_counts()]
    for i in range(burn_in + steps):
        runtime.synchronize()
        t0 = time.perf_counter()
        clock.start()
        step(clock.mark)
        runtime.synchronize()
        times.append((time.perf_counter() - t0) * 1000)
        phases.append(clock.durations())
        if i == 0:
            counts.append(dynamo_counts())
    before, first, end = counts + [dynamo_counts()]
    timed, median = times[burn_in:], statistics.median(times[burn_in:])
    p90 = statistics.quantiles(timed, n=10, method="inclusive")[-1] if len(timed) > 1 else timed[0]
    figures = dict(ms_median=median, ms_p90=p90, ms_min=min(timed), ms_max=max(timed))
    figures["first_iter_ms"] = times[0]
    figures["phases_ms"] = {p: statistics.median(ph[p] for ph in phases[burn_in:]) for p in PHASES}
    if not compiled:
        return figures
    return figures | dict(
        compile_s=(times[0] - median) / 1000,
        graphs=first["graphs"] - before["graphs"],
        recompiles=end["frames"] - first["frames"],
        graph_breaks=end["graph_breaks"] - before["graph_breaks"],
    )


@contextmanager
def cuda_memory_history(path: Path | None, runtime: Runtime) -> Iterator[None]:
    """Record CUDA's allocator history meanwhile and dump it to path (for pytorch.org/memory_viz);
    off CUDA, or without a path, nothing."""
    if path is None or runtime.device_type != "cuda":
        yield
        return
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    yield
    write_through_path(path, lambda tmp: torch.cuda.memory._dump_snapshot(str(tmp)))
    torch.cuda.memory._record_memory_history(enabled=None)


def measure(
    case: Case,
    device: str,
    batches: BatchSource,
    steps: int,
    burn_in: int,
    peak_flops: float | None = None,
    seed: int = 1337,
    trace_path: Path | None = None,
    snapshot_path: Path | None = None,
) -> dict[str, Any]:
    """Time burn_in + steps training iterations of case; the median and p90 are over the last
    `steps` only. The first iteration (compilation, allocator and kernel warm-up) is reported apart.
    trace_path: profile five more steps; snapshot_path: a CUDA memory snapshot of the timed ones."""
    s = case.settings
    runtime = resolve_runtime(device, s.dtype, s.tf32)
    reset_peak_memory(runtime.device)
    torch.manual_seed(seed)  # the weights of every case alike
    data = batches(s.batch_size, s.block_size, runtime.device)
    # before the model: what the step's peak is measured over
    baseline = held_memory_bytes(runtime.device)
    _, model, optimizer, _, step = build_training(s, runtime, data, vocab_size=s.vocab_size)
    with cuda_memory_history(snapshot_path, runtime):
        timed = time_steps(step, runtime, burn_in, steps, s.compile)
    peak_mem, peak_reserved = peak_memory_bytes(runtime.device), peak_reserved_bytes(runtime.device)
    # one more step, its bytes by part
    memory = memory_by_part(step, model, optimizer, runtime.device, baseline)
    arithmetic = state_arithmetic(model, s.optim, s.lowmem)
    n = arithmetic.pop("params")
    manual = s.attention == "manual"
    kernel = "manual (matmul + softmax)" if manual else sdpa_kernel_that_ran(step, runtime.device)
    if trace_path:
        with step_profiler(runtime.device, trace_path) as prof:
            for _ in range(5):  # wait 1, warm up 1, record 3
                step()
                prof.step()
    step.batches.close()  # the loader's thread and its token files
    median = timed["ms_median"]
    # forward and backward passes an iteration
    sequences = s.batch_size * s.gradient_accumulation_steps
    return result(
        case,
        "ok",
        precision=runtime.precision,
        tokens_per_s=case.tokens_per_iter / median * 1000,
        mfu=mfu(model, sequences, median / 1000, runtime.device, runtime.precision, peak_flops),
        peak_mem_bytes=peak_mem,
        peak_reserved_bytes=peak_reserved,
        sdpa_kernel=kernel,
        fused_adamw=adamw_is_fused(optimizer),
        memory=memory,
        memory_arithmetic={k: v / n for k, v in arithmetic.items()}
        | {"state": sum(arithmetic.values()) / n},
        **timed,
    )


def run_case(case: Case, skip_reason: str | None = None, **measure_args: Any) -> dict[str, Any]:
    """measure(case), or a row saying why it was skipped or failed (out of memory, a kernel or
    compiler error)."""
    if skip_reason:
        return result(case, "skipped", skip_reason)
    try:
        row = measure(case, **measure_args)
    except RuntimeError as e:  # so are running out of memory and torch.compile's and SDPA's errors
        reason = "out of memory" if out_of_memory(e) else f"{type(e).__name__}: {first_line(e)}"
        row = result(case, "failed", reason)
    # after the except block, which drops the traceback and the tensors its frames hold: free what
    # the case left (its compiled graphs, cycles, and CUDA's cached blocks)
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return row


def add_speedups(results: list[dict[str, Any]]) -> None:
    """speedup_prev and speedup_first: tokens/s over the previous and the first measured row's (the
    ms/iter ratio when every row does the same work)."""
    measured = [r for r in results if r["status"] == "ok"]
    for prev, r in zip([None, *measured], measured, strict=False):  # prev is None for the first
        r["speedup_prev"] = r["tokens_per_s"] / prev["tokens_per_s"] if prev else None
        r["speedup_first"] = r["tokens_per_s"] / measured[0]["tokens_per_s"]
