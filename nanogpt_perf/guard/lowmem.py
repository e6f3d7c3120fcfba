"""The refusals of a checkpoint's memory-saver state (nanogpt_perf/lowmem_state.py's format): a low-bit state that
is corrupt (scales not finite, codes of another shape), foreign (a Tensor subclass, which our checkpoints never
hold), or of another precision than this run keeps is one error line, before anything is loaded."""

from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from nanogpt_perf.errors import UserError
from nanogpt_perf.lowmem_state import ENCODED_KEYS, LOWBIT, expected_state, saved_params


def check_lowmem_state(optimizer: torch.optim.Optimizer, state_dict: Any) -> None:
    """One UserError line when state_dict cannot be loaded into optimizer as the state it keeps."""
    if problem := lowmem_state_problem(optimizer, state_dict):
        raise UserError(f"the checkpoint's optimizer state {problem}")


def lowmem_state_problem(optimizer: torch.optim.Optimizer, state_dict: Any) -> str | None:
    """Why state_dict (as state_dict() wrote it) is not a state this optimizer keeps, or None: each parameter's
    entries against expected_state (names, precision, shapes, dtypes), each low-bit entry's codes and scales
    (finite, >= 0), and no Tensor subclass anywhere (a foreign file's). Checked on the meta device: no memory."""
    if not (isinstance(state_dict, dict) and isinstance(state_dict.get("state"), dict)):
        return "is not an optimizer's state dict (state and param_groups)"
    groups = state_dict.get("param_groups")
    if not isinstance(groups, list) or not all(isinstance(g, dict) and type(g.get("params")) is list for g in groups):
        return "is not an optimizer's state dict (state and param_groups)"
    saved = [len(g["params"]) for g in groups]
    mine = [len(g["params"]) for g in optimizer.param_groups]
    if saved != mine:
        return f"has groups of {saved} parameters, this optimizer's are of {mine}"
    for index, (saved_id, p) in enumerate(saved_params(optimizer, state_dict)):
        entries = state_dict["state"].get(saved_id)
        if entries is not None and (problem := entries_problem(entries, expected_state(optimizer, p, "meta"))):
            return f"for parameter {index} {tuple(p.shape)} {problem}"
    return None


def entries_problem(entries: Any, expected: dict[str, torch.Tensor]) -> str | None:
    if not isinstance(entries, dict):
        return "is not a dict of tensors"
    for key, value in entries.items():
        if key == "step":
            continue
        if key not in expected:
            return f"holds {key!r}, which this optimizer does not keep (it keeps {', '.join(expected)})"
        want = expected[key]
        if is_traceable_wrapper_subclass(value) or isinstance(value, torch.Tensor) and type(value) is not torch.Tensor:
            return f"holds {key} as a {type(value).__name__}, not plain tensors: a foreign file's"
        if (have := precision(value)) != precision(want):
            return f"keeps {key} in {have}, this run in {precision(want)} (resume with the same optimizer precision)"
        if problem := encoded_problem(value, want) if isinstance(value, dict) else plain_problem(value, want):
            return f"has {key} {problem}"
    return None


def precision(value: Any) -> str:
    """'8-bit', '4-bit' or a dtype's name, for a state entry (encoded or a tensor) or an expected state."""
    if isinstance(value, dict):
        return f"{value.get(LOWBIT)}-bit"
    if is_traceable_wrapper_subclass(value):
        return f"{8 if type(value).__name__ == 'OptimState8bit' else 4}-bit"
    return str(value.dtype).removeprefix("torch.") if isinstance(value, torch.Tensor) else type(value).__name__


def encoded_problem(value: dict[str, Any], want: torch.Tensor) -> str | None:
    if set(value) != ENCODED_KEYS:
        return f"with the entries {sorted(value)}, not {sorted(ENCODED_KEYS)}"
    codes, scale = value["codes"], value["scale"]
    if value["signed"] is not want.signed:
        return f"signed={value['signed']!r}, not {want.signed}"
    for name, tensor, like in (("codes", codes, want.codes), ("scales", scale, want.scale)):
        if type(tensor) is not torch.Tensor or tensor.dtype != like.dtype or tensor.shape != like.shape:
            return f"{name} that are not {like.dtype} of shape {tuple(like.shape)}"
    if not bool(torch.isfinite(scale).all()) or bool((scale < 0).any()):
        return "scales that are not finite and >= 0 (corrupt)"
    return None


def plain_problem(value: torch.Tensor, want: torch.Tensor) -> str | None:
    return None if value.shape == want.shape else f"of shape {tuple(value.shape)}, not {tuple(want.shape)}"
