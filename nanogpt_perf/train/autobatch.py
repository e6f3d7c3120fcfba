"""The shape of an optimizer step: the micro-batch per rank and the accumulation, as set, or with
tokens_per_iter the accumulation that makes exactly that many tokens, and with batch_size='auto' the
largest micro-batch that fits.

'auto' chooses among the micro-batches it can use, the divisors of a rank's sequences per step (so
that the tokens of a step stay exact). On CUDA one training step at a small divisor, with every
setting as given (compiled when compile is on), measures the memory the weights and the optimizer
hold and the peak of a step; the peak grows with the micro-batch linearly past what is held, so the
largest divisor whose extrapolated peak fits the device's free memory is chosen, then checked by one
step at that size (a smaller one is checked when it does not fit). No profiler runs. A CPU (or MPS)
gives no out-of-memory signal to find (the host swaps): there the micro-batch is the largest divisor
not above HOST_BATCH."""

import gc
from collections.abc import Callable

import torch
import torch.distributed as dist

from nanogpt_perf.config import Config
from nanogpt_perf.data.loader import SyntheticBatches
from nanogpt_perf.errors import UserError
from nanogpt_perf.memory import held_memory_bytes, peak_memory_bytes, reset_peak_memory
from nanogpt_perf.runtime import Runtime
from nanogpt_perf.train.build import build_training

HOST_BATCH = 8
PROBE_BATCH = 4  # the probe's micro-batch: the largest divisor not above it
MEMORY_BUDGET = 0.9  # of the device's free memory: room for the allocator's fragmentation
# how an allocation that failed reads: PyTorch's own, and cuBLAS's and cuDNN's for their workspaces
NO_FIT = ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED")

# micro-batch -> (peak bytes, bytes held after the step), None: no fit
Probe = Callable[[int], tuple[int, int] | None]


def out_of_memory(error: BaseException) -> bool:
    return isinstance(error, torch.OutOfMemoryError) or any(text in str(error) for text in NO_FIT)


def divisors(n: int) -> list[int]:
    """The divisors of n, largest first."""
    return [d for d in range(n, 0, -1) if n % d == 0]


def choose_micro_batch(rows: int, budget: int, probe: Probe, log: Callable[[str], None]) -> int:
    """The largest divisor of rows whose step fits budget bytes, 0 if not even 1 fits: probe(b) runs
    one step at micro-batch b. One probe at a small divisor gives what the weights and the optimizer
    hold and the memory of each sequence; the largest divisor predicted to fit is probed to check
    it, then the next smaller ones if it fails."""
    sizes = divisors(rows)
    small = next(b for b in sizes if b <= PROBE_BATCH)
    measured = probe(small)
    # not even the probe fits: the smaller divisors, one by one
    while measured is None and small > 1:
        small = next(b for b in sizes if b < small)
        measured = probe(small)
    if measured is None:
        return 0
    peak, held = measured
    per_row = max(peak - held, 0) / small
    predicted = [b for b in sizes if held + per_row * b <= budget and b > small]
    log(
        f"batch_size auto: a step at {small} peaks at {peak / 2**30:.2f} GiB ({held / 2**30:.2f} "
        "held by the weights "
        f"and the optimizer): {predicted[0] if predicted else small} of the divisors of {rows} is "
        "predicted to fit "
        f"{budget / 2**30:.1f} GiB"
    )
    for b in predicted:
        if probe(b) is not None:
            return b
        log(f"batch_size auto: {b} does not fit after all")
    return small


def probe_steps(cfg: Config, vocab_size: int, runtime: Runtime) -> Probe:
    """probe(b): one training step with the settings s at micro-batch b on this device, built by
    build_training as train.py builds it (synthetic tokens): its peak memory and what stays held
    after it, or None when it does not fit. A failure other than memory is an error."""

    def probe(batch_size: int) -> tuple[int, int] | None:
        ranks = dist.get_world_size() if dist.is_initialized() else 1
        # a micro-batch on each rank
        given = cfg.replace(batch_size=batch_size, gradient_accumulation_steps=ranks)
        measured = None
        try:
            reset_peak_memory(runtime.device)
            batches = SyntheticBatches(
                batch_size, cfg.block_size, vocab_size, runtime.device, cfg.seed
            )
            training = build_training(given, runtime, batches, vocab_size=vocab_size)
            training.step()
            runtime.synchronize()
            measured = peak_memory_bytes(runtime.device), held_memory_bytes(runtime.device)
        except RuntimeError as e:  # so is running out of memory, and torch.compile may wrap it
            if not out_of_memory(e):
                raise UserError(
                    f"batch_size={batch_size} failed for another reason than memory: {e}"
                ) from e
        training = batches = None  # noqa: F841 (freed before the next probe)
        if cfg.compile:
            # each probe's model compiles afresh: no recompile limit reached, no graph kept
            torch._dynamo.reset()
        gc.collect()
        if runtime.device_type == "cuda":
            torch.cuda.empty_cache()
        return measured

    return probe


def micro_batch(
    rows: int, cfg: Config, vocab_size: int, runtime: Runtime, log: Callable[[str], None]
) -> int:
    """The micro-batch batch_size='auto' means for rows sequences per rank and step on this
    runtime's device; under torch.distributed the smallest that any rank found. log(line) says how
    it was chosen."""
    if runtime.device_type != "cuda":
        chosen = max(b for b in divisors(rows) if b <= HOST_BATCH)
        how = f"no memory limit to find on {runtime.device_type}: at most {HOST_BATCH}"
    else:
        budget = int(torch.cuda.mem_get_info(runtime.device)[0] * MEMORY_BUDGET)
        chosen = choose_micro_batch(rows, budget, probe_steps(cfg, vocab_size, runtime), log)
        how = "the largest that fits"
    if dist.is_initialized():
        agreed = torch.tensor(chosen, device=runtime.device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
        chosen = int(agreed.item())
    log(f"batch_size auto -> {chosen} ({how} and divides {rows} sequences a step)")
    return chosen


def step_shape(cfg: Config, world_size: int, choose: Callable[[int], int]) -> tuple[int, int]:
    """(micro-batch per rank, micro-batches per optimizer step over all ranks) for the settings cfg:
    as set, or with tokens_per_iter set, the accumulation that makes exactly that many tokens, at
    batch_size or, for 'auto', at choose(sequences per rank and step). A UserError says what does
    not add up."""
    batch, accumulation, block = cfg.batch_size, cfg.gradient_accumulation_steps, cfg.block_size
    tokens = cfg.tokens_per_iter
    if not tokens:
        if batch == "auto":
            raise UserError(
                "batch_size='auto' needs tokens_per_iter, the tokens of one optimizer step (e.g. "
                "491520)"
            )
        if accumulation % world_size:
            raise UserError(
                f"gradient_accumulation_steps={accumulation} is not divisible by {world_size} ranks"
            )
        return batch, accumulation
    if "gradient_accumulation_steps" in cfg.given:
        raise UserError(
            f"tokens_per_iter={tokens} sets gradient_accumulation_steps: give one of the two "
            "(tokens_per_iter=0 to "
            "set the accumulation yourself)"
        )
    if tokens % (block * world_size):
        raise UserError(
            f"tokens_per_iter={tokens} is not a whole number of {block}-token sequences on each of "
            f"{world_size} ranks"
        )
    rows = tokens // (block * world_size)
    batch = choose(rows) if batch == "auto" else batch
    if batch == 0:
        raise UserError(
            f"batch_size='auto': not even 1 sequence of {block} tokens fits with these settings"
        )
    if rows % batch:
        raise UserError(
            f"tokens_per_iter={tokens} is not a whole number of micro-batches of "
            f"batch_size={batch} x {block} tokens"
            f" on each of {world_size} ranks ({rows} sequences per rank)"
        )
    return batch, rows // batch * world_size
