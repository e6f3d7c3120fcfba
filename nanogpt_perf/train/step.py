"""The training step: one optimizer step over gradient_accumulation_steps micro-batches. train.py
runs it and bench.py times it, so that what bench.py reports is what train.py does."""

from collections.abc import Callable
from contextlib import nullcontext
from typing import NamedTuple

import torch
from torch.nn.parallel import DistributedDataParallel

from nanogpt_perf.data.loader import TokenBatches
from nanogpt_perf.in_backward import OptimizerInBackward
from nanogpt_perf.runtime import Runtime
from nanogpt_perf.train.parallel import is_fsdp


class StepResult(NamedTuple):
    # the mean loss over the step's micro-batches (on the device: reading it synchronises)
    loss: torch.Tensor
    grad_norm: torch.Tensor  # the gradient norm before clipping
    skipped: bool  # the update was skipped: the loss or the gradient norm was not finite


class TrainStep:
    """step(mark=None) runs one optimizer step: for each micro-batch a forward pass under autocast,
    the next batch fetched while the device computes, and a backward pass of the loss scaled by the
    GradScaler (DDP all-reduces the gradients on the last micro-batch only, FSDP reduce-scatters
    them there); then unscale, clip, the optimizer step (skipped when the loss or the gradient norm
    is not finite) and zero_grad. mark(phase), when given, is called as each phase ends ('forward',
    'data', 'h2d', 'backward', 'optimizer'): with none, the step costs nothing more.

    in_backward (nanogpt_perf/in_backward.py), when given, steps each parameter inside backward
    instead: one micro-batch, no clipping, no DDP/FSDP or float16 (lowmem.in_backward_rules refuses
    them); the loss is checked before backward (a non-finite one skips the whole update) and each
    gradient in its hook."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler,
        runtime: Runtime,
        batches: TokenBatches,
        gradient_accumulation_steps: int,
        grad_clip: float,
        in_backward: OptimizerInBackward | None = None,
    ):
        self.model, self.optimizer, self.scaler, self.runtime = model, optimizer, scaler, runtime
        self.batches, self.accum, self.grad_clip = batches, gradient_accumulation_steps, grad_clip
        self.in_backward = in_backward
        assert in_backward is None or (
            gradient_accumulation_steps == 1 and grad_clip == 0.0 and not scaler.is_enabled()
        ), (
            "in_backward takes one micro-batch, no grad_clip and no GradScaler (the guard: "
            "lowmem_rules)"
        )
        self.ddp = isinstance(model, DistributedDataParallel)
        self.fsdp = is_fsdp(model)
        # the first batch is fetched by the first step (once a resume placed the loader)
        self.x = self.y = None

    def __call__(self, mark: Callable[[str], None] | None = None) -> StepResult:
        if self.x is None:
            self.fetch(None)  # each later batch is fetched during the step before it
        if self.in_backward is not None:
            return self.step_in_backward(mark)
        loss_sum = None
        for micro_step in range(self.accum):
            last = micro_step == self.accum - 1
            # FSDP's no_sync: gradients accumulate unsharded, reduce-scattered on the last
            # micro-batch
            if self.fsdp:
                self.model.set_requires_gradient_sync(last)
            with self.model.no_sync() if self.ddp and not last else nullcontext():
                with self.runtime.autocast_ctx():
                    _, loss = self.model(self.x, self.y)
                if mark:
                    mark("forward")
                self.fetch(mark)
                # the mean over micro-batches, not the sum
                self.scaler.scale(loss / self.accum).backward()
                if mark:
                    mark("backward")
            loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
        loss = loss_sum / self.accum
        # a no-op without float16; with it, records overflows for step()
        self.scaler.unscale_(self.optimizer)
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        grad_norm = torch.nn.utils.get_total_norm(grads)
        # a DTensor: this rank's shards, combined over all
        if self.fsdp and hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        if self.grad_clip > 0.0:
            torch.nn.utils.clip_grads_with_norm_(self.model.parameters(), self.grad_clip, grad_norm)
        # the NaN/inf guard: a non-finite loss or gradient norm skips the update (one read of a
        # flag: a sync). Under float16 an overflowing gradient is the GradScaler's to skip, and to
        # answer with a lower scale.
        finite = (
            torch.isfinite(loss)
            if self.scaler.is_enabled()
            else torch.isfinite(loss) & torch.isfinite(grad_norm)
        )
        skipped = not bool(finite)
        if not skipped:
            self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if mark:
            mark("optimizer")
        return StepResult(loss, grad_norm, skipped)

    def step_in_backward(self, mark: Callable[[str], None] | None) -> StepResult:
        """One micro-batch whose backward steps every parameter (the 'optimizer' phase is inside
        'backward')."""
        with self.runtime.autocast_ctx():
            _, loss = self.model(self.x, self.y)
        if mark:
            mark("forward")
        self.fetch(mark)
        # the guard's loss half, before any parameter steps (the step's one sync)
        if bool(torch.isfinite(loss)):
            grad_norm, skipped = self.in_backward.backward(loss)
        else:
            grad_norm, skipped = torch.full((), float("nan"), device=loss.device), True
        if mark:
            mark("backward")
            mark("optimizer")
        return StepResult(loss.detach(), grad_norm, skipped)

    def fetch(self, mark: Callable[[str], None] | None) -> None:
        """The next micro-batch: taken from the loader (the 'data' phase is the wait for it), then
        copied to the device (asynchronously from pinned memory on a GPU). data_state is where the
        loader stood before it: the state a checkpoint needs, since this batch is fetched but not
        yet trained on."""
        # where the batch about to be fetched comes from
        self.data_state = self.batches.state_dict()
        tokens = self.batches.host_batch()
        if mark:
            mark("data")
        self.x, self.y = self.batches.to_device(tokens)
        if mark:
            mark("h2d")
