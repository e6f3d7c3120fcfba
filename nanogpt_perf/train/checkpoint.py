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

from model import ARCHITECTURE
from nanogpt_perf.errors import die
from nanogpt_perf.files import write_atomically
from nanogpt_perf.train.parallel import load_full_state


def save_checkpoint(checkpoint: dict[str, Any], path: Path) -> None:
    """Write atomically: a crash mid-write leaves the previous checkpoint intact, never a torn file."""
    write_atomically(path, lambda f: torch.save(checkpoint, f))


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


def training_state(**state: Any) -> dict[str, Any]:
    """What a training checkpoint holds, as plain data (loadable with weights_only): model (the plain state dict),
    optimizer, scaler, model_args (the GPTConfig), iter_num, best_val_loss, config (every setting), tokenizer (so
    that sample.py and export.py need no data folder) and ranks (each rank's generators and loader position). A
    checkpoint of nanoGPT's has the first six of these but the scaler."""
    if set(state) != set(CHECKPOINT_KEYS):
        raise TypeError(f"a training checkpoint holds exactly {', '.join(CHECKPOINT_KEYS)}")
    return {k: state[k] for k in CHECKPOINT_KEYS} | {"model_args": {k: state["model_args"][k] for k in MODEL_ARGS}}


CHECKPOINT_KEYS = ("model", "optimizer", "scaler", "model_args", "iter_num", "best_val_loss", "config")
CHECKPOINT_KEYS += ("tokenizer", "ranks")
# model_args as nanoGPT's GPTConfig takes them, so that its sample.py loads our checkpoints: the architecture and
# dropout (the kernels and memory savers are settings, in config)
MODEL_ARGS = (*ARCHITECTURE, "dropout")


def restore_training(
    checkpoint: dict[str, Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler,
    batches,
    rank: int,
    world_size: int,
) -> tuple[int, float, dict[str, Any] | None]:
    """Put back what training_state saved beyond the weights (loaded into the model before it was wrapped): the
    optimizer (sharded again under FSDP), the GradScaler, this rank's loader position; returns the iteration, the
    best val loss and this rank's random generators (to restore last, once everything that draws at start has)."""
    load_full_state(model, optimizer, None, checkpoint["optimizer"])
    if checkpoint.get("scaler"):
        scaler.load_state_dict(checkpoint["scaler"])
    ranks = checkpoint.get("ranks") or [None]
    if len(ranks) != world_size:
        die(f"the checkpoint was saved by {len(ranks)} ranks: resume it with {len(ranks)} (nproc_per_node)")
    mine = ranks[rank]
    if mine:
        batches.load_state_dict(mine["data"])  # before the step fetches its first batch
    best = float(checkpoint["best_val_loss"])  # nanoGPT saves a 0-d tensor
    return checkpoint["iter_num"], best, mine["rng"] if mine else None
