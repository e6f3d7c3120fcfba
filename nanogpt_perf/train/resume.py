"""What exact resumption needs beyond weights and optimizer: the settings a run was started with, and each rank's
random number generators (Python, numpy, torch CPU and the rank's CUDA device)."""

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from configurator import convert
from model import ARCHITECTURE
from nanogpt_perf.errors import UserError

# settings a resumed run cannot change: the architecture (the vocabulary through pad_vocab and the data, which give
# vocab_size), and the data it was trained on
FIXED_ON_RESUME = (*(k for k in ARCHITECTURE if k != "vocab_size"), "pad_vocab", "dataset", "data_dir")
# settings that say how this command runs, not what the run is: always taken from the command
PER_COMMAND = ("init_from", "resume_fallback", "out_dir", "device", "backend", "overwrite")
UNREPORTED = ("init_from", "overwrite")  # what a resumed run's command says of these is no news


def resume_settings(
    saved: dict[str, Any], settings: dict[str, Any], given: set[str], words: dict[str, tuple[str, ...]], rules: dict
) -> tuple[dict, list[str]]:
    """The checkpoint's settings (ours, or nanoGPT's, which has the same names), overridden by those given on this
    command (config files and flags): the merged settings, and a line for each override that differs from the
    checkpoint and for each saved setting that does not apply here. ValueError for an override that cannot apply
    to the checkpoint, or a saved value that is not a valid value here (words: the words a setting takes beside
    its type; rules: each setting's rule)."""
    merged = dict(settings)
    for key, value in saved.items():
        if key in merged and key not in given and key not in PER_COMMAND:
            merged[key] = saved_value(key, value, settings[key], words.get(key, ()), rules.get(key))
    changed = [k for k in sorted(given) if k in saved and k not in PER_COMMAND and merged[k] != saved[k]]
    fixed = [k for k in changed if k in FIXED_ON_RESUME]
    if fixed:
        what = ", ".join(f"{k}={merged[k]!r} (checkpoint: {saved[k]!r})" for k in fixed)
        raise UserError(f"cannot resume with {what}: the checkpoint's architecture, vocabulary and data are fixed")
    lines = [f"{k}: {saved[k]!r} -> {merged[k]!r}" for k in changed]
    lines += [f"{k}={saved[k]!r} not applied (not a setting here)" for k in saved if k not in merged]
    per_command = [k for k in PER_COMMAND if k not in UNREPORTED and k not in given and k in saved and k in merged]
    lines += [
        f"{k}={saved[k]!r} not applied (this command's {merged[k]!r})" for k in per_command if saved[k] != merged[k]
    ]
    return merged, lines


def saved_value(key: str, value: Any, default: Any, words: tuple[str, ...], rule) -> Any:
    """A checkpoint's setting as this train.py takes it (its type, within its rule), or ValueError naming it."""
    try:
        value = convert(key, value, default, words)
    except UserError as e:
        raise UserError(f"the checkpoint's settings are not this train.py's: {e}") from None
    if rule and (valid := rule(value)):
        raise UserError(f"the checkpoint's {key}={value!r} is not valid here ({valid}): give {key} to replace it")
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


def nothing_to_train(out_dir: Path, iter_num: int, max_iters: int) -> str | None:
    """Why resuming out_dir's checkpoint, at iter_num, with max_iters would train nothing, or None."""
    if max_iters > iter_num:
        return None
    return (
        f"the checkpoint in {out_dir} is at iter {iter_num} and max_iters={max_iters}: nothing to train (max_iters "
        f"counts from the run's start): set max_iters above {iter_num}, or eval_only=True to evaluate it"
    )
