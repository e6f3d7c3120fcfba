"""Checkpoints: written atomically, read back with one clear line for anything that is not ours or is broken."""

import os
import pickle
from pathlib import Path
from typing import Any

import torch

from nanogpt_perf.errors import die


def save_checkpoint(checkpoint: dict[str, Any], path: Path) -> None:
    """Write atomically: a crash mid-write leaves the previous checkpoint intact, never a torn file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(checkpoint, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: Path, map_location: torch.device | str = "cpu") -> dict[str, Any]:
    """A checkpoint of ours, loaded as plain data (weights_only); one error line for anything else."""
    if not path.is_file():
        die(f"no checkpoint at {path} (train one first, or check out_dir)")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except (RuntimeError, pickle.UnpicklingError, EOFError, ValueError) as e:
        die(f"checkpoint {path} is corrupt or unreadable: {str(e).splitlines()[0]}")
    missing = {"model", "model_args"} - set(checkpoint) if isinstance(checkpoint, dict) else {"model", "model_args"}
    if missing:
        die(f"checkpoint {path} is not a nanogpt-perf checkpoint (missing {', '.join(sorted(missing))})")
    return checkpoint


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The plain model under DDP and torch.compile wrappers, whose state dict has no _orig_mod./module. prefixes."""
    model = getattr(model, "module", model)  # DistributedDataParallel
    return getattr(model, "_orig_mod", model)  # torch.compile
