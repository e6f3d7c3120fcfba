"""Checkpoints: written atomically (a temporary file, fsynced, renamed), kept as the last few plus
the best, and restored once the guard has read them (nanogpt_perf/guard/checkpoint.py: every
record's CRC, a model this code can build). Every checkpoint is a file of out_dir's own: a link
found in the place of one is replaced, never written through (it would write outside out_dir).

In out_dir: ckpt-NNNNNNN.pt per saved iteration (the last keep_last of them), ckpt.pt the newest and
ckpt-best.pt the best by val loss (links to one of those, or copies where the file system has no
links)."""

import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from model import ARCHITECTURE, RECIPE_ARCHITECTURE
from nanogpt_perf.errors import UserError, first_line
from nanogpt_perf.files import write_atomically, write_through_path
from nanogpt_perf.guard.checkpoint import ARCHITECTURE_DEFAULTS, saved_iterations
from nanogpt_perf.guard.lock import OutDirLock
from nanogpt_perf.guard.out_dir import check_no_earlier_run, check_unchanged, run_paths
from nanogpt_perf.lowmem_state import check_saved_state, has_state_codec
from nanogpt_perf.train.parallel import Ranks, close, load_full_state


def save_checkpoint(checkpoint: dict[str, Any], path: Path) -> None:
    """Write atomically: a crash mid-write leaves the previous checkpoint intact, never a torn
    file."""
    write_atomically(path, lambda f: torch.save(checkpoint, f), follow_links=False)


def link_or_copy(source: Path, target: Path) -> None:
    """target becomes source's content, atomically: a hard link (no second copy on disk), or a copy
    where the file system has none, made under files.py's temporary name."""

    def make(tmp: Path) -> None:
        tmp.unlink()  # the temporary name files.py reserved: the link takes its place
        try:
            os.link(source, tmp)
        except OSError:
            shutil.copyfile(source, tmp)

    write_through_path(target, make, follow_links=False)


def save_iteration(
    checkpoint: dict[str, Any], out_dir: Path, iter_num: int, best: bool, keep_last: int
) -> Path:
    """Save as out_dir/ckpt-{iter_num}.pt, point ckpt.pt (and ckpt-best.pt when best) at it, and
    delete the iterations beyond the newest keep_last (ckpt-best.pt keeps its own link to the
    best)."""
    path = out_dir / f"ckpt-{iter_num:07d}.pt"
    save_checkpoint(checkpoint, path)
    link_or_copy(path, out_dir / "ckpt.pt")
    if best:
        link_or_copy(path, out_dir / "ckpt-best.pt")
    for old in saved_iterations(out_dir)[keep_last:]:
        old.unlink()
    return path


def training_state(**state: Any) -> dict[str, Any]:
    """What a training checkpoint holds, as plain data (loadable with weights_only): model (the
    plain state dict), optimizer, scaler, model_args (the GPTConfig), iter_num, best_val_loss,
    config (every setting), tokenizer (so that sample.py and export.py need no data folder), ranks
    (each rank's generators and loader position) and data_identity (the dataset's files as the run
    found them: nanogpt_perf/data/identity.py). A checkpoint of nanoGPT's has the first six of these
    but the scaler."""
    if set(state) != set(CHECKPOINT_KEYS):
        raise TypeError(f"a training checkpoint holds exactly {', '.join(CHECKPOINT_KEYS)}")
    model_args = {k: state["model_args"][k] for k in MODEL_ARGS}
    model_args = {
        k: v
        for k, v in model_args.items()
        if k not in RECIPE_ARCHITECTURE or v != ARCHITECTURE_DEFAULTS[k]
    }
    return {k: state[k] for k in CHECKPOINT_KEYS} | {"model_args": model_args}


CHECKPOINT_KEYS = (
    "model",
    "optimizer",
    "scaler",
    "model_args",
    "iter_num",
    "best_val_loss",
    "config",
)
CHECKPOINT_KEYS += ("tokenizer", "ranks", "data_identity")
# model_args as nanoGPT's GPTConfig takes them, so that its sample.py loads our checkpoints: the
# architecture and dropout (the kernels and memory savers are settings, in config); the recipe's
# fields only where they are on (a GPT-2 is what nanoGPT can load, and what it cannot, it refuses:
# its GPTConfig takes no such field)
MODEL_ARGS = (*ARCHITECTURE, "dropout")


def restore_training(
    checkpoint: dict[str, Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler,
    batches,
    ranks: Ranks,
) -> tuple[int, float, dict[str, Any] | None]:
    """Put back what training_state saved beyond the weights (loaded into the model before it was
    wrapped): the optimizer (sharded again under FSDP), the GradScaler, this rank's loader position;
    returns the iteration, the best val loss and this rank's random generators (to restore last,
    once everything that draws at start has)."""
    saved = checkpoint.get("ranks") or [None]
    assert len(saved) == ranks.world_size, (
        "the guard counts the ranks first (guard/checkpoint.py's check_ranks)"
    )
    if has_state_codec(optimizer):  # a low-bit state: checked whole before any of it is loaded
        check_saved_state(optimizer, checkpoint["optimizer"])
    try:
        load_full_state(model, optimizer, None, checkpoint["optimizer"])
        if checkpoint.get("scaler"):
            scaler.load_state_dict(checkpoint["scaler"])
    # a foreign checkpoint's optimizer or scaler
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise UserError(
            f"the checkpoint's optimizer state does not fit its model: {first_line(e) or repr(e)}"
        ) from None
    mine = saved[ranks.rank]
    if mine:
        batches.load_state_dict(mine["data"])  # before the step fetches its first batch
    best = float(checkpoint["best_val_loss"])  # nanoGPT saves a 0-d tensor
    return checkpoint["iter_num"], best, mine["rng"] if mine else None


def claim_out_dir(
    out_dir: Path,
    resuming: bool,
    overwrite: bool,
    eval_only: bool,
    seen: tuple | None,
    ranks: Ranks,
) -> OutDirLock | None:
    """Rank 0 takes out_dir's lock, checks under it that out_dir is still as it was seen before the
    run started (another run may have used it and ended meanwhile) and, for a new run with
    overwrite=True, deletes the earlier run's files, saying so. Under DDP every rank learns whether
    it did and, when not, they all stop with rank 0's line: a rank left waiting at its next
    collective would hang until torchrun's timeout."""
    lock, problem, replace_earlier = None, None, overwrite and not resuming
    if ranks.master:
        lock = OutDirLock(out_dir)
        try:
            lock.claim()
            if not resuming and not overwrite:
                check_no_earlier_run(out_dir, eval_only)
            if not replace_earlier:
                check_unchanged(out_dir, seen)
        except UserError as e:
            lock.release()
            problem = str(e)
        if problem is None and replace_earlier and (earlier := run_paths(out_dir)):
            for path in earlier:
                path.unlink()
            names = ", ".join(p.name for p in earlier)
            print(f"overwrite=True: deleted the earlier run's {names} from {out_dir}", flush=True)
    if ranks.distributed:
        said = [problem]
        dist.broadcast_object_list(said, src=0)
        problem = said[0]
        if problem:
            close()  # together: gloo aborts a process that exits with its process group still up
    if problem:
        raise UserError(problem)  # every rank, with rank 0's line
    return lock
