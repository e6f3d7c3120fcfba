"""batch_size='auto': the micro-batch chosen for the device, the tokens of an optimizer step kept as set.

On CUDA the training step is run once per candidate, as set (compiled when compile is on, the memory savers on),
on a fresh model: the largest power of two that fits, probed from the top down, then the largest micro-batch not
above it that divides the step's sequences per rank, so that gradient accumulation keeps tokens_per_iter exact. A
CPU (or MPS) gives no out-of-memory signal to find (the host swaps), so there the micro-batch is the largest
divisor not above HOST_BATCH."""

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from nanogpt_perf.bench.cases import case_from_settings
from nanogpt_perf.data.loader import SyntheticBatches
from nanogpt_perf.errors import UserError
from nanogpt_perf.runtime import Runtime

HOST_BATCH = 8


def largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, min(n, at_most) + 1) if n % d == 0)


def auto_micro_batch(rows: int, fits: Callable[[int], bool]) -> int:
    """The micro-batch for rows sequences per rank and optimizer step: the largest power of two that fits (tried
    from the largest not above rows, down), then the largest divisor of rows not above it; 0 if not even 1 fits."""
    power = 1 << (rows.bit_length() - 1)
    while power >= 1 and not fits(power):
        power //= 2
    return largest_divisor(rows, power) if power else 0


def step_fits(settings: dict[str, Any], vocab_size: int, runtime: Runtime, log: Callable[[str], None]) -> Callable:
    """fits(batch_size): whether one training step with these settings runs at that micro-batch on this device
    (one accumulation step: more accumulate into the same gradients). A failure other than memory is an error."""

    from nanogpt_perf.bench.measure import run_case  # bench.py's lab (and torch._dynamo): imported only to probe

    def fits(batch_size: int) -> bool:
        given = settings | {"batch_size": batch_size, "gradient_accumulation_steps": 1, "dtype": runtime.dtype}
        case = replace(case_from_settings(given, f"batch_size={batch_size}", vocab_size), tf32=runtime.tf32)
        row = run_case(
            case,
            device=str(runtime.device),
            batches=lambda B, T, dev: SyntheticBatches(B, T, vocab_size, dev, settings["seed"]),
            steps=1,
            burn_in=1,
        )
        log(f"batch_size auto: {batch_size} {'fits' if row['status'] == 'ok' else row['reason']}")
        if row["status"] == "failed" and row["reason"] != "out of memory":
            raise RuntimeError(f"batch_size={batch_size} failed for another reason than memory: {row['reason']}")
        return row["status"] == "ok"

    return fits


def micro_batch(rows: int, settings: dict[str, Any], vocab_size: int, runtime: Runtime, log: Callable) -> int:
    """The micro-batch batch_size='auto' means for rows sequences per rank and step on this runtime's device;
    under torch.distributed the smallest that any rank found. log(line) says how it was chosen."""
    if runtime.device_type != "cuda":
        chosen = largest_divisor(rows, HOST_BATCH)
        how = f"no memory limit to find on {runtime.device_type}: at most {HOST_BATCH}"
    else:
        chosen, how = auto_micro_batch(rows, step_fits(settings, vocab_size, runtime, log)), "the largest that fits"
    if dist.is_initialized():
        agreed = torch.tensor(chosen, device=runtime.device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
        chosen = int(agreed.item())
    log(f"batch_size auto -> {chosen} ({how} and divides {rows} sequences a step)")
    return chosen


def step_shape(s: dict[str, Any], given: set[str], world_size: int, choose: Callable[[int], int]) -> tuple[int, int]:
    """(micro-batch per rank, micro-batches per optimizer step over all ranks) for the settings s: as set, or with
    tokens_per_iter set, the accumulation that makes exactly that many tokens, at batch_size or, for 'auto', at
    choose(sequences per rank and step). ValueError says what does not add up."""
    batch, accumulation, block, tokens = (
        s[k] for k in ("batch_size", "gradient_accumulation_steps", "block_size", "tokens_per_iter")
    )
    if not tokens:
        if batch == "auto":
            raise UserError("batch_size='auto' needs tokens_per_iter, the tokens of one optimizer step (e.g. 491520)")
        return batch, accumulation
    if "gradient_accumulation_steps" in given:
        raise UserError(
            f"tokens_per_iter={tokens} sets gradient_accumulation_steps: give one of the two (tokens_per_iter=0 to "
            "set the accumulation yourself)"
        )
    if tokens % (block * world_size):
        raise UserError(
            f"tokens_per_iter={tokens} is not a whole number of {block}-token sequences on each of {world_size} ranks"
        )
    rows = tokens // (block * world_size)
    batch = choose(rows) if batch == "auto" else batch
    if batch == 0:
        raise UserError(f"batch_size='auto': not even 1 sequence of {block} tokens fits with these settings")
    if rows % batch:
        raise UserError(
            f"tokens_per_iter={tokens} is not a whole number of micro-batches of batch_size={batch} x {block} tokens"
            f" on each of {world_size} ranks ({rows} sequences per rank)"
        )
    return batch, rows // batch * world_size
