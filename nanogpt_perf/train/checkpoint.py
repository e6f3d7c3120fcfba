"""Checkpoints: written atomically (a temporary file, fsynced, renamed), kept as the last few plus the best, checked
on load (every record's CRC), with one clear line for anything that is not ours or is broken.

In out_dir: ckpt-NNNNNNN.pt per saved iteration (the last keep_last of them), ckpt.pt the newest and ckpt-best.pt
the best by val loss (links to one of those, or copies where the file system has no links)."""

import os
import pickle
import re
import shutil
import zipfile
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


def link_or_copy(source: Path, target: Path) -> None:
    """target becomes source's content, atomically."""
    tmp = target.with_name(target.name + ".tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)


ITERATION_FILE = re.compile(r"ckpt-(\d{7})\.pt")


def saved_iterations(out_dir: Path) -> list[Path]:
    """The ckpt-NNNNNNN.pt files in out_dir, newest first."""
    found = [p for p in out_dir.glob("ckpt-*.pt") if ITERATION_FILE.fullmatch(p.name)] if out_dir.is_dir() else []
    return sorted(found, reverse=True)


def save_iteration(checkpoint: dict[str, Any], out_dir: Path, iter_num: int, best: bool, keep_last: int) -> Path:
    """Save as out_dir/ckpt-{iter_num}.pt, point ckpt.pt (and ckpt-best.pt when best) at it, and delete the
    iterations beyond the newest keep_last (ckpt-best.pt keeps its own link to the best)."""
    path = out_dir / f"ckpt-{iter_num:07d}.pt"
    save_checkpoint(checkpoint, path)
    link_or_copy(path, out_dir / "ckpt.pt")
    if best:
        link_or_copy(path, out_dir / "ckpt-best.pt")
    for old in saved_iterations(out_dir)[keep_last:]:
        old.unlink()
    return path


def checkpoint_problem(path: Path) -> str | None:
    """Why path is not a whole checkpoint (missing, truncated, a record whose CRC fails), or None."""
    if not path.is_file():
        return "missing"
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()  # torch.load alone would load a flipped byte in a tensor without a word
    except (zipfile.BadZipFile, OSError) as e:
        return f"truncated or not a checkpoint ({e})"
    return f"corrupt: record {bad} fails its CRC" if bad else None


def newest_good(out_dir: Path) -> Path | None:
    return next((p for p in saved_iterations(out_dir) if checkpoint_problem(p) is None), None)


def resume_checkpoint(out_dir: Path, fallback: bool) -> dict[str, Any]:
    """out_dir/ckpt.pt when whole; else, when fallback, the newest whole ckpt-NNNNNNN.pt; else one line naming it.
    Each file's CRCs are checked once, here, before it is loaded."""
    path = out_dir / "ckpt.pt"
    problem = checkpoint_problem(path)
    if problem is None:
        return read_checkpoint(path)
    good = newest_good(out_dir)
    if problem == "missing" and good is None:
        die(f"no checkpoint at {path} to resume from (train one first, or check out_dir)")
    if good is None:
        die(f"checkpoint {path} is {problem}, and no older checkpoint in {out_dir} is whole")
    if not fallback:
        die(f"checkpoint {path} is {problem}; the newest whole one is {good}: resume_fallback=True resumes from it")
    print(f"checkpoint {path} is {problem}: resuming from {good}, the newest whole one")
    return read_checkpoint(good)


def load_checkpoint(path: Path, map_location: torch.device | str = "cpu") -> dict[str, Any]:
    """A checkpoint of ours, its CRCs checked, loaded as plain data (weights_only); one error line for anything
    else."""
    if not path.is_file():
        die(f"no checkpoint at {path} (train one first, or check out_dir)")
    if problem := checkpoint_problem(path):
        die(f"checkpoint {path} is corrupt or unreadable: {problem}")
    return read_checkpoint(path, map_location)


def read_checkpoint(path: Path, map_location: torch.device | str = "cpu") -> dict[str, Any]:
    """torch.load of a file whose CRCs were checked, as plain data; one error line if it is not one of ours."""
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
