"""Run two optimizer steps of nanogpt_perf.train.step.TrainStep on a tiny GPT over fixed
micro-batches and save the losses, gradient norms and weights: under torchrun, rank r takes its
share of each step's micro-batches; alone, one process takes them all. tests/test_step.py checks
that the two agree.

    python tests/ddp_parity.py OUT.pt K     # 1 process, 2K micro-batches a step
    torchrun --standalone --nproc_per_node=2 tests/ddp_parity.py OUT.pt K   # 2 ranks, K each
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from model import GPT, GPTConfig  # noqa: E402
from nanogpt_perf.runtime import resolve_runtime  # noqa: E402
from nanogpt_perf.train.parallel import close, start_ranks  # noqa: E402
from nanogpt_perf.train.step import TrainStep  # noqa: E402

STEPS, B, T, V = 2, 2, 16, 64


class FixedBatches:
    """This rank's share of the micro-batches of steps first, first + 1, ... of `steps`, in order,
    as a batch stream (with one spare at the end for the step's prefetch)."""

    def __init__(self, rank: int, world: int, k: int, first: int = 0, steps: int = STEPS):
        g = torch.Generator().manual_seed(1)
        every = [torch.randint(V, (B, T + 1), generator=g) for _ in range(steps * k * 2 + 1)]
        mine = [
            every[s * 2 * k + rank * k + i]
            for s in range(first, steps)
            for i in range(k * 2 // world)
        ]
        self.stream = iter(mine + [every[-1]])

    def host_batch(self) -> torch.Tensor:
        return next(self.stream)

    def to_device(self, window: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return window[:, :-1], window[:, 1:]

    def state_dict(self) -> dict:
        return {}


def train(rank: int, world: int, k: int) -> tuple[list[float], list[float], dict]:
    """STEPS steps (rank's share of each under DDP): the step losses (means over every rank),
    gradient norms and the final weights. The DDP model and its step go with this function's frame,
    before close()."""
    # the same initial weights on every rank; no biases: the key bias has a zero gradient,
    torch.manual_seed(0)
    # which Adam would turn from rounding noise into full-size updates of either sign
    model = GPT(
        GPTConfig(
            block_size=T, vocab_size=V, n_layer=2, n_head=2, n_embd=32, dropout=0.0, bias=False
        )
    )
    optimizer = model.configure_optimizers(0.1, 1e-2, (0.9, 0.95))
    runtime = resolve_runtime("cpu", "float32")
    wrapped = DDP(model) if world > 1 else model
    step = TrainStep(
        wrapped,
        optimizer,
        runtime.grad_scaler(),
        runtime,
        FixedBatches(rank, world, k),
        2 * k // world,
        0.5,
    )
    losses, norms = [], []
    for _ in range(STEPS):
        result = step()
        loss = result.loss.clone()
        if world > 1:
            dist.all_reduce(loss)
        losses.append(loss.item() / world)
        norms.append(result.grad_norm.item())
    return losses, norms, model.state_dict()


def gloo_threads() -> int | None:
    """The threads of gloo (a process group's workers and its I/O loop) alive in this process, by
    the names PyTorch gives them; None where there is no /proc to count them in."""
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        return None
    return sum(
        (t / "comm").read_text().startswith(("pt_gloo", "gloo_tcp")) for t in tasks.iterdir()
    )


def close_checked() -> None:
    """close(), then no gloo thread may be left: one that outlives it may abort the process as the
    interpreter ends (see close() in nanogpt_perf/train/parallel.py)."""
    during = gloo_threads()
    close()
    after = gloo_threads()
    if during is not None and (not during or after):
        sys.exit(
            f"gloo threads: {during} before close(), {after} after it (expected some, then none)"
        )


def main(out: Path, k: int) -> None:
    ranks = start_ranks("cpu", "gloo")  # under torchrun: the process group
    losses, norms, weights = train(ranks.rank, ranks.world_size, k)
    if ranks.master:
        torch.save({"losses": losses, "grad_norms": norms, "model": weights}, out)
    if ranks.distributed:
        close_checked()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
