"""Run three optimizer steps of nanogpt_perf.train.step.TrainStep on a tiny GPT over fixed
micro-batches and save the losses, gradient norms and weights: alone, one process takes every
micro-batch of a step; under torchrun, the model is sharded with FSDP2
(nanogpt_perf.train.parallel.wrap_model) and rank r takes its share. Under torchrun the ranks also
stop after two steps, save the full state with full_state in train.py's checkpoint layout, load it
into a fresh FSDP model with load_full_state and take the third step. tests/test_fsdp.py checks that
everything agrees.

    python tests/fsdp_parity.py OUT_DIR K   # 1 process, 2K micro-batches a step
    torchrun --standalone --nproc_per_node=2 tests/fsdp_parity.py OUT_DIR K [ac] [compile] [bf16]

ac: activation checkpointing; compile: each block compiled; bf16: autocast and FSDP's mixed
precision in bfloat16.
"""

import copy
import sys
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
from torch._dynamo.utils import counters

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import ddp_parity  # noqa: E402

from model import GPT, GPTConfig  # noqa: E402
from nanogpt_perf.guard.checkpoint import load_checkpoint  # noqa: E402
from nanogpt_perf.runtime import Runtime, resolve_runtime  # noqa: E402
from nanogpt_perf.train.checkpoint import save_iteration  # noqa: E402
from nanogpt_perf.train.parallel import (  # noqa: E402
    full_state,
    load_full_state,
    start_ranks,
    wrap_model,
)
from nanogpt_perf.train.step import TrainStep  # noqa: E402

STEPS, B, T, V = 3, 2, 16, 64


def FixedBatches(rank: int, world: int, k: int, first: int = 0) -> ddp_parity.FixedBatches:
    return ddp_parity.FixedBatches(rank, world, k, first, STEPS)


def build(seed: int, options: set[str]) -> tuple[torch.nn.Module, torch.optim.Optimizer, Runtime]:
    """A tiny GPT (no biases: the key bias has a zero gradient, which Adam would turn from rounding
    noise into full-size updates of either sign), wrapped as train.py would, and its AdamW."""
    torch.manual_seed(seed)
    ac = "ac" in options
    model = GPT(
        GPTConfig(T, V, n_layer=2, n_head=2, n_embd=32, bias=False, activation_checkpointing=ac)
    )
    runtime = resolve_runtime("cpu", "bfloat16" if "bf16" in options else "float32")
    model = wrap_model(model, "fsdp", runtime, "compile" in options, "default")
    return model, model.configure_optimizers(0.1, 1e-2, (0.9, 0.95)), runtime


def train(
    model, optimizer, runtime, batches: FixedBatches, accum: int, steps: int
) -> tuple[list, list]:
    step = TrainStep(model, optimizer, runtime.grad_scaler(), runtime, batches, accum, 0.5)
    losses, norms = [], []
    for _ in range(steps):
        result = step()
        loss = result.loss.clone()
        if dist.is_initialized():
            dist.all_reduce(loss)
        losses.append(loss.item() / (dist.get_world_size() if dist.is_initialized() else 1))
        norms.append(result.grad_norm.item())
    return losses, norms


def resume(out: Path, k: int, rank: int, world: int, options: set[str]) -> tuple[list, dict]:
    """Two steps, a checkpoint as train.py saves it, a fresh model (other initial weights) that
    loads it on every rank, and the third step: its loss and the final weights."""
    model, optimizer, runtime = build(0, options)
    train(model, optimizer, runtime, FixedBatches(rank, world, k), 2 * k // world, 2)
    model_state, optimizer_state = full_state(model, optimizer)  # every rank: it gathers
    if rank == 0:
        ckpt = {
            "model": model_state,
            "optimizer": optimizer_state,
            "model_args": asdict(model.config),
            "iter_num": 2,
        }
        save_iteration(ckpt, out / "ckpt", 2, False, 1)
    dist.barrier()
    checkpoint = load_checkpoint(out / "ckpt" / "ckpt.pt")
    model, optimizer, runtime = build(1, options)
    load_full_state(model, optimizer, checkpoint["model"], checkpoint["optimizer"])
    losses, _ = train(
        model, optimizer, runtime, FixedBatches(rank, world, k, first=2), 2 * k // world, 1
    )
    return losses, full_state(model, optimizer)[0]


def run(out: Path, k: int, rank: int, world: int, options: set[str]) -> dict:
    """Three steps, the full state after two, and under torchrun the resumed third step: what
    test_fsdp.py compares. The sharded models go with this function's frame, before close()."""
    model, optimizer, runtime = build(0, options)
    compute_dtype = []  # the weights' dtype as the first block's attention sees them in forward
    model.transformer.h[0].attn.c_attn.register_forward_pre_hook(
        lambda m, _: compute_dtype.append(m.weight.dtype)
    )
    losses, norms = train(
        model, optimizer, runtime, FixedBatches(rank, world, k), 2 * k // world, 2
    )
    # the optimizer state holds the live step counts
    at_two = copy.deepcopy(full_state(model, optimizer))
    more_losses, more_norms = train(
        model, optimizer, runtime, FixedBatches(rank, world, k, 2), 2 * k // world, 1
    )
    result = {
        "losses": losses + more_losses,
        "grad_norms": norms + more_norms,
        "model": full_state(model, optimizer)[0],
        "at_two": {"model": at_two[0], "optimizer": at_two[1]},
        "compute_dtype": str(compute_dtype[0]),
        "shard_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
        "graphs": counters["stats"]["unique_graphs"],
        "graph_breaks": sum(counters["graph_break"].values()),
    }
    if world > 1:
        result["resumed_loss"], result["resumed_model"] = resume(out, k, rank, world, options)
    return result


def main(out: Path, k: int, options: set[str]) -> None:
    ranks = start_ranks("cpu", "gloo")  # under torchrun: the process group
    out.mkdir(parents=True, exist_ok=True)
    result = run(out, k, ranks.rank, ranks.world_size, options)
    if ranks.master:
        torch.save(result, out / "result.pt")
    if ranks.distributed:
        ddp_parity.close_checked()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), set(sys.argv[3:]))
