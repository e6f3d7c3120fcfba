"""The refusals of a checkpoint's memory-saver state (nanogpt_perf/lowmem_state.py's format): a
low-bit state that is corrupt (scales not finite, codes of another shape), foreign (a Tensor
subclass, which our checkpoints never hold), or of another precision than this run keeps is one
error line, before anything is loaded."""

from collections.abc import Callable
from itertools import chain
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from nanogpt_perf.errors import UserError

LOWBIT = "lowbit"  # the key of an encoded low-bit state: its bits
ENCODED_KEYS = {LOWBIT, "signed", "codes", "scale"}


def check_lowmem_state(
    state_dict: Any,
    param_groups: list[list[torch.Tensor]],
    expected_state: Callable[[torch.Tensor], dict[str, Any]],
) -> None:
    """A UserError unless state_dict is the state an optimizer of these parameter groups keeps: each
    parameter's entries against expected_state(p) (names, precision, shapes, dtypes; on the meta
    device), low-bit scales finite and >= 0, no Tensor subclass (a foreign file's). Saved parameters
    pair with these group by group, in order, as torch.optim.Optimizer.load_state_dict pairs
    them."""
    fail = lambda why: UserError(f"the checkpoint's optimizer state {why}")
    group = lambda g: isinstance(g, dict) and type(g.get("params")) is list
    state_dict = state_dict if isinstance(state_dict, dict) else {}
    groups = state_dict.get("param_groups")
    if not (
        isinstance(state_dict.get("state"), dict)
        and isinstance(groups, list)
        and all(map(group, groups))
    ):
        raise fail("is not an optimizer's state dict (state and param_groups)")
    saved = [len(g["params"]) for g in groups]
    mine = [len(params) for params in param_groups]
    if saved != mine:
        raise fail(f"has groups of {saved} parameters, this optimizer's are of {mine}")
    saved_ids = chain.from_iterable(g["params"] for g in groups)
    for index, (saved_id, p) in enumerate(
        zip(saved_ids, chain.from_iterable(param_groups), strict=False)
    ):
        if (entries := state_dict["state"].get(saved_id)) is not None:
            try:
                check_entries(entries, expected_state(p))
            except ValueError as e:
                raise fail(f"for parameter {index} {tuple(p.shape)} {e}") from None


def check_entries(entries: Any, expected: dict[str, torch.Tensor]) -> None:
    if not isinstance(entries, dict):
        raise ValueError("is not a dict of tensors")
    for key, value in entries.items():
        if key == "step":
            continue
        if key not in expected:
            raise ValueError(
                f"holds {key!r}, which this optimizer does not keep (it keeps "
                f"{', '.join(expected)})"
            )
        want = expected[key]
        if (
            is_traceable_wrapper_subclass(value)
            or isinstance(value, torch.Tensor)
            and type(value) is not torch.Tensor
        ):
            raise ValueError(
                f"holds {key} as a {type(value).__name__}, not plain tensors: a foreign file's"
            )
        if (have := precision(value)) != precision(want):
            raise ValueError(
                f"keeps {key} in {have}, this run in {precision(want)} (resume with the same "
                "optimizer precision)"
            )
        try:
            if isinstance(value, dict):
                check_encoded(value, want)
            elif value.shape != want.shape:
                raise ValueError(f"of shape {tuple(value.shape)}, not {tuple(want.shape)}")
        except ValueError as e:
            raise ValueError(f"has {key} {e}") from None


def precision(value: Any) -> str:
    """'8-bit', '4-bit' or a dtype's name, for a state entry (encoded or a tensor) or an expected
    state."""
    if isinstance(value, dict):
        return f"{value.get(LOWBIT)}-bit"
    if is_traceable_wrapper_subclass(value):
        return f"{8 if type(value).__name__ == 'OptimState8bit' else 4}-bit"
    return (
        str(value.dtype).removeprefix("torch.")
        if isinstance(value, torch.Tensor)
        else type(value).__name__
    )


def check_encoded(value: dict[str, Any], want: torch.Tensor) -> None:
    if set(value) != ENCODED_KEYS:
        raise ValueError(f"with the entries {sorted(value)}, not {sorted(ENCODED_KEYS)}")
    codes, scale = value["codes"], value["scale"]
    if value["signed"] is not want.signed:
        raise ValueError(f"signed={value['signed']!r}, not {want.signed}")
    for name, tensor, like in (("codes", codes, want.codes), ("scales", scale, want.scale)):
        if (
            type(tensor) is not torch.Tensor
            or tensor.dtype != like.dtype
            or tensor.shape != like.shape
        ):
            raise ValueError(f"{name} that are not {like.dtype} of shape {tuple(like.shape)}")
    if not bool(torch.isfinite(scale).all()) or bool((scale < 0).any()):
        raise ValueError("scales that are not finite and >= 0 (corrupt)")
