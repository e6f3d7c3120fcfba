"""The memory savers' optimizer state in checkpoints, as plain data.

torchao keeps a low-bit state as Tensor subclasses (OptimState8bit, OptimState4bit), and registers
them as safe globals for torch.load(weights_only=True) when imported. Our checkpoints never hold
them: state_dict() writes each as a dict of plain tensors, {"lowbit": 8 or 4, "signed", "codes"
(uint8), "scale" (float32)}, and load_state_dict() rebuilds it from torchao's own zeros for the
parameter (its quantization map, never one read from a file) after nanogpt_perf/guard/lowmem.py has
checked every entry against the state this optimizer keeps. So what a checkpoint may hold stays
tensors and plain data, whether torchao was imported or not; a subclass found in a file is refused
as foreign; and a state of another precision or shape, or a corrupt scale, is one error line before
anything is loaded.

The same goes for a state whose dtype is not its parameter's (Muon's bfloat16 momentum over float32
weights): torch.optim.Optimizer.load_state_dict would cast it to the parameter's dtype (and the
codes of a low-bit state to floats); these entries are put back as saved instead."""

from collections.abc import Iterator
from itertools import chain
from typing import Any

import torch

from nanogpt_perf.guard.lowmem import LOWBIT, check_lowmem_state

CODEC = "lowbit_state_codec"  # marks an optimizer whose state a resume checks first
# (nanogpt_perf/guard/lowmem.py, through check_saved_state): the hooks below trust what they load


def register_state_codec(optimizer: torch.optim.Optimizer) -> None:
    """Make optimizer.state_dict() plain data and load_state_dict() rebuild it (checked first): its
    hooks, so that the optimizer stays the one the caller holds (MuonAdamW, or torchao's
    AdamW8bit/AdamW4bit/_AdamW)."""
    pending: dict[torch.Tensor, dict[str, Any]] = {}
    setattr(optimizer, CODEC, True)

    def load_pre_hook(
        optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]
    ) -> dict[str, Any]:
        pending.clear()
        state = {}
        for saved_id, p in saved_params(optimizer, state_dict):
            entries = state_dict["state"].get(saved_id)
            if entries is None:
                continue
            kept = {
                k: v
                for k, v in entries.items()
                if k != "step" and (isinstance(v, dict) or v.dtype != p.dtype)
            }
            pending[p] = kept
            state[saved_id] = {k: v for k, v in entries.items() if k not in kept}
        return {**state_dict, "state": state}

    def load_post_hook(optimizer: torch.optim.Optimizer) -> None:
        for p, entries in pending.items():
            fresh = expected_state(optimizer, p, p.device)
            for key, value in entries.items():
                optimizer.state[p][key] = decoded(value, fresh[key])
        pending.clear()
        # a checkpoint's float lr: torchao steps only with a tensor
        for group in torchao_groups(optimizer):
            if not isinstance(group["lr"], torch.Tensor):
                group["lr"] = torch.tensor(group["lr"], dtype=torch.float32)

    optimizer.register_state_dict_post_hook(plain_state_dict)
    optimizer.register_load_state_dict_pre_hook(load_pre_hook)
    optimizer.register_load_state_dict_post_hook(load_post_hook)


def has_state_codec(optimizer: torch.optim.Optimizer) -> bool:
    """Whether optimizer's state_dict() is encoded by register_state_codec (a saver's low-bit
    state)."""
    return vars(optimizer).get(CODEC, False)


def plain_state_dict(
    optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]
) -> dict[str, Any]:
    """state_dict with each low-bit state encoded as plain tensors (new dicts: the live state is
    untouched)."""
    state = {
        k: {key: encoded(v) for key, v in entries.items()}
        for k, entries in state_dict["state"].items()
    }
    return {**state_dict, "state": state}


def encoded(value: Any) -> Any:
    from torchao.optim.subclass_4bit import OptimState4bit
    from torchao.optim.subclass_8bit import OptimState8bit

    if isinstance(value, OptimState8bit | OptimState4bit):
        bits = 8 if isinstance(value, OptimState8bit) else 4
        return {LOWBIT: bits, "signed": value.signed, "codes": value.codes, "scale": value.scale}
    return value


def decoded(value: Any, fresh: torch.Tensor) -> torch.Tensor:
    """A checked saved entry as the state it was: fresh (torchao's zeros, or a plain tensor) filled
    with it."""
    if isinstance(value, dict):
        fresh.codes.copy_(value["codes"])
        fresh.scale.copy_(value["scale"])
        return fresh
    return value.to(device=fresh.device)


def saved_params(
    optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]
) -> Iterator[tuple[Any, torch.Tensor]]:
    """(saved id, parameter) pairs, as torch.optim.Optimizer.load_state_dict pairs them: group by
    group, in order."""
    saved = chain.from_iterable(g["params"] for g in state_dict["param_groups"])
    return zip(
        saved, chain.from_iterable(g["params"] for g in optimizer.param_groups), strict=False
    )


def check_saved_state(optimizer: torch.optim.Optimizer, state_dict: Any) -> None:
    """The guard's check (nanogpt_perf/guard/lowmem.py) of a saved state against what optimizer
    keeps."""
    groups = [g["params"] for g in optimizer.param_groups]
    check_lowmem_state(state_dict, groups, lambda p: expected_state(optimizer, p, "meta"))


def expected_state(
    optimizer: torch.optim.Optimizer, p: torch.Tensor, device: torch.device | str
) -> dict:
    """The state (but its step) optimizer keeps for p, as zeros on device (meta: shapes and formats
    only): what its own state_like(p, device) says (an optimizer of ours declares its state, as
    MuonAdamW does), else torchao's AdamW moments (quantized or plain, by its own rule) or torch's
    AdamW's."""
    if hasattr(optimizer, "state_like"):
        return optimizer.state_like(p, device)
    like = torch.empty_like(p, device=device)
    if is_torchao(optimizer):
        state = {
            "exp_avg": optimizer._new_buffer(like, True),
            "exp_avg_sq": optimizer._new_buffer(like, False),
        }
    else:
        state = {"exp_avg": torch.zeros_like(like), "exp_avg_sq": torch.zeros_like(like)}
    amsgrad = any(g.get("amsgrad") for g in optimizer.param_groups)
    return state | ({"max_exp_avg_sq": state["exp_avg_sq"]} if amsgrad else {})


def is_torchao(optimizer: Any) -> bool:
    """Whether optimizer is one of torchao's AdamWs (without importing torchao where nothing
    did)."""
    return any(c.__module__.startswith("torchao.optim") for c in type(optimizer).__mro__)


def torchao_groups(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """The groups that torchao steps: all of a torchao AdamW's; a MuonAdamW's AdamW groups when its
    inner AdamW is torchao's."""
    if is_torchao(optimizer):
        return optimizer.param_groups
    if is_torchao(getattr(optimizer, "adamw", None)):
        return [g for g in optimizer.param_groups if not g["muon"]]
    return []
