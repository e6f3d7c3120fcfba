"""The optimizer step inside backward: each parameter stepped as soon as backward has accumulated
its whole gradient (torch's Tensor.register_post_accumulate_grad_hook), its gradient freed there, so
that no full gradient buffer ever exists: a step holds at most the gradients backward is still
making.

What the step after backward does over all gradients at once has to be designed anew
(lowmem.in_backward_rules refuses, in one line, what cannot be): clipping by the global norm
(refused: the norm exists only once every parameter has stepped), accumulation over micro-batches
(refused: it needs the full gradient kept), DDP/FSDP (refused: their reduction ends after the
hooks), the fp16 GradScaler (refused: its overflow check is over all gradients). The NaN/inf guard
is split: the loss is checked before backward (a non-finite loss skips the whole update, as after
backward), and each gradient in its hook (a non-finite gradient leaves its parameter and state as
they were, one device sync per parameter; the step reports skipped when any was), since a whole
update cannot be undone without the memory this saves. The gradient norm is still reported: the norm
of the per-parameter norms, as torch.nn.utils.get_total_norm computes it."""

from typing import Any

import torch
from torch import nn


class OptimizerInBackward:
    """Hooks on model's parameters that step optimizer inside backward (armed by backward(), inert
    otherwise: a backward pass outside it accumulates gradients as usual). optimizer is any
    torch.optim.Optimizer whose step() updates only the parameters that have a gradient (torch's
    AdamW, torchao's, MuonAdamW): it is stepped on a view of the one group that holds the parameter,
    so that the same group dicts, state and learning rates are used, and its state_dict() is the
    optimizer's own."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer
        self.group_index = {p: i for i, g in enumerate(optimizer.param_groups) for p in g["params"]}
        missing = [
            n for n, p in model.named_parameters() if p.requires_grad and p not in self.group_index
        ]
        if missing:
            raise ValueError(
                f"the optimizer does not hold {missing[0]}: in_backward would never step it"
            )
        self.handles = [p.register_post_accumulate_grad_hook(self.hook) for p in self.group_index]
        self.armed = False
        self.norms: list[torch.Tensor] = []
        self.stepped: set[torch.Tensor] = set()
        self.skipped = 0

    def backward(self, loss: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """loss.backward() with every parameter stepped inside it; returns the gradient norm and
        whether some parameter's step was skipped (its gradient not finite)."""
        self.norms, self.stepped, self.skipped, self.armed = [], set(), 0, True
        try:
            loss.backward()
        finally:
            self.armed = False
        norms = self.norms or [torch.zeros((), device=loss.device)]
        return torch.linalg.vector_norm(torch.stack(norms)), self.skipped > 0

    def hook(self, p: torch.Tensor) -> None:
        if not self.armed:
            return
        # a reentrant checkpoint's second accumulation: the first step took half a gradient
        if p in self.stepped:
            raise RuntimeError(
                "a parameter's gradient was accumulated twice in one backward: in_backward cannot"
            )
        self.stepped.add(p)
        norm = torch.linalg.vector_norm(p.grad)
        self.norms.append(norm)
        if bool(torch.isfinite(norm)):  # the guard, per parameter: one read (a sync on a GPU)
            step_parameter(self.optimizer, self.group_index[p], p)
        else:
            self.skipped += 1
        p.grad = None

    def remove(self) -> None:
        """Take the hooks off: the optimizer steps after backward again."""
        for handle in self.handles:
            handle.remove()


def step_parameter(optimizer: torch.optim.Optimizer, index: int, p: torch.Tensor) -> None:
    """optimizer.step() for p alone: its groups (and MuonAdamW's inner AdamW's) replaced, for the
    call, by a view of group index holding p only (the group's own dict read at the call: set_lr's
    and a load_state_dict's)."""
    group = optimizer.param_groups[index]
    view: dict[str, Any] = {**group, "params": [p]}
    inner = getattr(optimizer, "adamw", None)  # MuonAdamW's AdamW, which steps its groups itself
    saved = optimizer.param_groups, inner.param_groups if inner is not None else None
    optimizer.param_groups = [view]
    if inner is not None:
        inner.param_groups = [] if group.get("muon") else [view]
    try:
        optimizer.step()
    finally:
        optimizer.param_groups = saved[0]
        if inner is not None:
            inner.param_groups = saved[1]
