"""A resumed run: its settings, the checkpoint's merged with this command's (merged_settings), and
what exact resumption needs beyond weights, optimizer and the loader's place: each rank's random
number generators (Python, numpy, torch CPU and the rank's CUDA device), as plain data a checkpoint
holds."""

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from model import ARCHITECTURE, fields_of_kind
from nanogpt_perf.config import Config, check_value, convert
from nanogpt_perf.data.identity import dataset_identity
from nanogpt_perf.errors import UserError
from nanogpt_perf.guard.checkpoint import check_ranks
from nanogpt_perf.guard.dataset import AS_IT_IS, identity_change
from nanogpt_perf.runtime import dtype_problem, resolve_device

# settings a resumed run cannot change: the architecture (the vocabulary through pad_vocab and the
# data, which give vocab_size), the initialisation (it took place before: a change would be
# recorded, not done) and the optimizer whose state it holds; its data is checked by identity (its
# files), or for a checkpoint that has none (nanoGPT's, older ones) by the names of its folder
FIXED_ON_RESUME = (
    *(k for k in ARCHITECTURE if k != "vocab_size"),
    *fields_of_kind("init"),
    "pad_vocab",
    "optimizer",
)
DATA_NAMES = ("dataset", "data_dir")
# settings that say how this command runs, not what the run is: always taken from the command
PER_COMMAND = (
    "init_from",
    "resume_fallback",
    "out_dir",
    "device",
    "backend",
    "overwrite",
    "allow_changed_data",
)
PER_COMMAND += ("run_data_preparer",)
UNREPORTED = ("init_from", "overwrite")  # what a resumed run's command says of these is no news


def merged_settings(
    cfg: Config, checkpoint: dict[str, Any] | None, cross: tuple, world_size: int, master: bool
) -> Config:
    """The settings a run takes: on resume the checkpoint's, overridden by this command's (and said
    so, rank 0), then checked by the rules between settings (cross)."""
    merged = cfg.as_dict()
    if checkpoint is not None:
        check_ranks(checkpoint, world_size)
        merged, overrides = resume_settings(checkpoint, cfg)
        if master and overrides:
            print("resumed settings overridden: " + "; ".join(overrides), flush=True)
    # a resumed run's dtype that this device has not (nanoGPT saves float16 from a CPU run) is auto
    # here
    device, dtype = merged["device"], merged["dtype"]
    if (
        checkpoint is not None
        and "dtype" not in cfg.given
        and dtype_problem(resolve_device(device), dtype)
    ):
        if master:
            print(
                f"resumed settings: dtype={dtype!r} not applied (not on {device}): auto", flush=True
            )
        merged["dtype"] = "auto"
    cfg = cfg.replace(cross, **merged)
    if checkpoint is not None and not cfg.eval_only and cfg.max_iters <= checkpoint["iter_num"]:
        raise UserError(
            f"the checkpoint in {Path(cfg.out_dir)} is at iter {checkpoint['iter_num']} and "
            f"max_iters={cfg.max_iters}: "
            f"nothing to train (max_iters counts from the run's start): set max_iters above "
            f"{checkpoint['iter_num']}, or eval_only=True to evaluate it"
        )
    return cfg


def resume_settings(checkpoint: dict[str, Any], cfg: Config) -> tuple[dict[str, Any], list[str]]:
    """The checkpoint's settings (ours, or nanoGPT's: the same names) overridden by this command's,
    and a line for each override and each saved setting that does not apply here; a UserError for an
    override that cannot apply to the checkpoint, or a saved value not valid here."""
    saved, identity, given, merged = (
        checkpoint["config"],
        checkpoint.get("data_identity"),
        cfg.given,
        cfg.as_dict(),
    )
    for key, value in saved.items():  # merged[key] is still this command's value when it is read
        if key in merged and key not in given and key not in PER_COMMAND:
            merged[key] = saved_value(key, value, merged[key], cfg.metadata(key))
    changed = [
        k for k in sorted(given) if k in saved and k not in PER_COMMAND and merged[k] != saved[k]
    ]
    was = lambda k: saved[k] if k in saved else cfg.defaults[k]  # one it predates: its default
    fixed = [k for k in sorted(given) if k in FIXED_ON_RESUME and merged[k] != was(k)]
    # another folder: only for the same files (or when asked)
    moved = [k for k in changed if k in DATA_NAMES]
    what = lambda keys: ", ".join(f"{k}={merged[k]!r} (checkpoint: {was(k)!r})" for k in keys)
    here = Path(merged["data_dir"]) / merged["dataset"]
    if moved and not merged["allow_changed_data"]:
        refused = f"cannot resume with {what(moved)}"
        if identity is None:
            raise UserError(
                f"{refused}: the checkpoint records no data to compare it with{AS_IT_IS}"
            )
        if not here.is_dir():
            raise UserError(f"{refused}: no dataset there yet{AS_IT_IS}")
        if change := identity_change(identity, dataset_identity(here)):
            raise UserError(f"{refused}: not the checkpoint's data ({change}){AS_IT_IS}")
    if fixed:
        raise UserError(
            f"cannot resume with {what(fixed)}: the checkpoint's architecture, vocabulary, data "
            "and optimizer are fixed"
        )
    lines = [f"{k}: {saved[k]!r} -> {merged[k]!r}" for k in changed]
    lines += [
        f"{k}={saved[k]!r} not applied (not a setting here)" for k in saved if k not in merged
    ]
    per_command = [
        k
        for k in PER_COMMAND
        if k not in UNREPORTED and k not in given and k in saved and k in merged
    ]
    lines += [
        f"{k}={saved[k]!r} not applied (this command's {merged[k]!r})"
        for k in per_command
        if saved[k] != merged[k]
    ]
    # resumed from elsewhere: where it read
    if identity and not set(DATA_NAMES) & given and not here.exists():
        where = Path(identity["folder"])
        merged |= {"data_dir": str(where.parent), "dataset": where.name}
        lines.append(f"the data read from where the run found it, {where}")
    return merged, lines


def saved_value(key: str, value: Any, default: Any, meta: dict[str, Any]) -> Any:
    """A checkpoint's setting as this train.py takes it (its type, within its rule), or a UserError
    naming it."""
    try:
        # a UserError, never a ValueError
        value = convert(key, value, default, meta.get("words", ()))
        check_value(value, meta)
    except UserError as e:
        raise UserError(f"the checkpoint's settings are not this train.py's: {e}") from None
    except ValueError as valid:
        raise UserError(
            f"the checkpoint's {key}={value!r} is not valid here ({valid}): give {key} to replace "
            "it"
        ) from None
    return value


def rng_state(device: torch.device) -> dict[str, Any]:
    """This process's generators, as plain data (loadable with weights_only)."""
    kind, key, pos, has_gauss, gauss = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (kind, key.tolist(), pos, has_gauss, gauss),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    random.setstate(state["python"])
    kind, key, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.array(key, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and state["cuda"] is not None:
        torch.cuda.set_rng_state(state["cuda"], device)
