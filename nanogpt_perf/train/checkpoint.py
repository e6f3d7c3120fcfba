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

from model import ARCHITECTURE, GPT, RECIPE_ARCHITECTURE, GPTConfig
from nanogpt_perf.errors import die
from nanogpt_perf.files import write_atomically, write_through_path
from nanogpt_perf.train.parallel import load_full_state


def save_checkpoint(checkpoint: dict[str, Any], path: Path) -> None:
    """Write atomically: a crash mid-write leaves the previous checkpoint intact, never a torn file."""
    write_atomically(path, lambda f: torch.save(checkpoint, f))


def link_or_copy(source: Path, target: Path) -> None:
    """target becomes source's content, atomically: a hard link (no second copy on disk), or a copy where the file
    system has none, made under files.py's temporary name."""

    def make(tmp: Path) -> None:
        tmp.unlink()  # the temporary name files.py reserved: the link takes its place
        try:
            os.link(source, tmp)
        except OSError:
            shutil.copyfile(source, tmp)

    write_through_path(target, make)


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
        return resumable(read_checkpoint(path), path)
    good = newest_good(out_dir)
    if problem == "missing" and good is None:
        die(f"no checkpoint at {path} to resume from (train one first, or check out_dir)")
    if good is None:
        die(f"checkpoint {path} is {problem}, and no older checkpoint in {out_dir} is whole")
    if not fallback:
        die(f"checkpoint {path} is {problem}; the newest whole one is {good}: resume_fallback=True resumes from it")
    print(f"checkpoint {path} is {problem}: resuming from {good}, the newest whole one")
    return resumable(read_checkpoint(good), good)


def resumable(checkpoint: dict[str, Any], path: Path) -> dict[str, Any]:
    if problem := training_problem(checkpoint):
        die(f"checkpoint {path} cannot be resumed: {problem}")
    return checkpoint


def load_checkpoint(path: Path, map_location: torch.device | str = "cpu") -> dict[str, Any]:
    """A checkpoint of ours, its CRCs checked, loaded as plain data (weights_only); one error line for anything
    else."""
    if not path.is_file():
        die(f"no checkpoint at {path} (train one first, or check out_dir)")
    if problem := checkpoint_problem(path):
        die(f"checkpoint {path} is corrupt or unreadable: {problem}")
    return read_checkpoint(path, map_location)


def read_checkpoint(path: Path, map_location: torch.device | str = "cpu") -> dict[str, Any]:
    """torch.load of a file whose CRCs were checked, as plain data; one error line if it is not a checkpoint of
    ours or nanoGPT's, or if its weights do not fit its model_args."""
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:  # weights_only refuses what could run code when loaded
        found = re.search(r"GLOBAL (\S+) was not an allowed global", str(e))
        what = f"a Python object ({found[1]})" if found else "Python objects"
        die(f"checkpoint {path} holds {what} beyond tensors and plain data: not loaded (it could run code)")
    except (RuntimeError, EOFError, ValueError) as e:  # torch's own words, less its request for feedback
        reason = str(e).splitlines()[0].split("  (Could this error message be improved?")[0]
        die(f"checkpoint {path} is corrupt or not a torch checkpoint: {reason}")
    missing = {"model", "model_args"} - set(checkpoint) if isinstance(checkpoint, dict) else {"model", "model_args"}
    if missing:
        die(f"checkpoint {path} is not a nanogpt-perf checkpoint (missing {', '.join(sorted(missing))})")
    if problem := model_problem(checkpoint["model_args"], checkpoint["model"]):
        die(f"checkpoint {path} is not one this code can load: {problem}")
    checkpoint["model_args"] = ARCHITECTURE_DEFAULTS | checkpoint["model_args"]
    return checkpoint


# what a checkpoint's model_args lack is GPTConfig's default, as nanoGPT's GPTConfig(**model_args) takes it (its
# checkpoints from before bias was a setting have none, and biases)
ARCHITECTURE_DEFAULTS = {k: GPTConfig.__dataclass_fields__[k].default for k in ARCHITECTURE}


def model_problem(model_args: Any, weights: Any) -> str | None:
    """Why model_args (nanoGPT's GPTConfig fields, GPTConfig's defaults for those missing) and the weights are not
    a model this code can build and load, or None."""
    if not isinstance(model_args, dict):
        return f"its model_args are a {type(model_args).__name__}, not a dict"
    missing = [k for k in ARCHITECTURE if k not in model_args and k not in RECIPE_ARCHITECTURE]
    problem = model_args_problem(ARCHITECTURE_DEFAULTS | model_args)
    problem = problem or weights_problem(ARCHITECTURE_DEFAULTS | model_args, weights)
    if problem and missing:
        return f"{problem} (its model_args lack {', '.join(missing)}: GPTConfig's defaults were taken)"
    return problem


def model_args_problem(model_args: dict[str, Any]) -> str | None:
    for key in ARCHITECTURE:
        value, kind = model_args[key], type(ARCHITECTURE_DEFAULTS[key])
        if kind is float and (type(value) not in (int, float) or not 0 <= value < float("inf")):
            return f"its model_args' {key} must be a finite number >= 0, not {value!r}"
        if kind is not float and (type(value) is not kind or (kind is int and value < 1)):
            return f"its model_args' {key} must be {'a bool' if kind is bool else 'an int >= 1'}, not {value!r}"
    dropout = model_args.get("dropout", 0.0)
    if type(dropout) not in (int, float) or not 0 <= dropout < 1:
        return f"its model_args' dropout must be a number in [0, 1), not {dropout!r}"
    return None


def weights_problem(model_args: dict[str, Any], weights: Any) -> str | None:
    """Whether the weights are the model that model_args describe: the same names (a torch.compile prefix aside),
    as many layers and the same shapes, checked against the model built on the meta device (no memory)."""
    if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
        return "its model is not a state dict (names to tensors)"
    weights = {str(k).removeprefix("_orig_mod."): v for k, v in weights.items()}
    layers = {int(m[1]) for k in weights if (m := re.match(r"transformer\.h\.(\d+)\.", k))}
    if layers != set(range(model_args["n_layer"])):
        return f"its model_args say n_layer={model_args['n_layer']}, its weights hold {len(layers)} layers"
    try:  # every layer: which weights a layer has can depend on its place (value embeddings, U-net skips)
        fields = {k: v for k, v in model_args.items() if k in GPTConfig.__dataclass_fields__}
        with torch.device("meta"):
            expected = {k: v.shape for k, v in GPT(GPTConfig(**fields)).state_dict().items()}
    except (ValueError, TypeError) as e:
        return f"its model_args are inconsistent: {e}"
    if unknown := sorted(set(weights) - set(expected)):
        return f"its weights hold {unknown[0]}, which the model of its model_args has not"
    if missing := sorted(set(expected) - set(weights)):
        return f"its weights lack {missing[0]}"
    for name, shape in ((k, v.shape) for k, v in weights.items()):
        if (want := expected[name]) != shape:
            return f"its weight {name} is {tuple(shape)}, its model_args make it {tuple(want)}"
    return None


def training_problem(checkpoint: dict[str, Any]) -> str | None:
    """What a checkpoint lacks to be resumed (ours or nanoGPT's: the iteration, the best val loss, the optimizer
    and the settings), or None."""
    iter_num, best = checkpoint.get("iter_num"), checkpoint.get("best_val_loss")
    if type(iter_num) is not int or iter_num < 0:
        return f"its iter_num must be an int >= 0, not {iter_num!r}"
    if not (type(best) in (int, float) or isinstance(best, torch.Tensor) and best.numel() == 1):
        return f"its best_val_loss must be a number, not {best!r}"
    optimizer = checkpoint.get("optimizer")
    if not (
        isinstance(optimizer, dict)
        and isinstance(optimizer.get("state"), dict)
        and isinstance(optimizer.get("param_groups"), list)
    ):
        return "its optimizer is not an optimizer's state dict (state and param_groups)"
    if not isinstance(checkpoint.get("config"), dict):
        return "its config (the settings it was trained with) is not a dict"
    ranks = checkpoint.get("ranks") or []
    if not isinstance(ranks, list) or not all(
        r is None or isinstance(r, dict) and {"rng", "data"} <= set(r) for r in ranks
    ):
        return "its ranks (each rank's generators and place in the data) are not a list of dicts"
    return None


def training_state(**state: Any) -> dict[str, Any]:
    """What a training checkpoint holds, as plain data (loadable with weights_only): model (the plain state dict),
    optimizer, scaler, model_args (the GPTConfig), iter_num, best_val_loss, config (every setting), tokenizer (so
    that sample.py and export.py need no data folder) and ranks (each rank's generators and loader position). A
    checkpoint of nanoGPT's has the first six of these but the scaler."""
    if set(state) != set(CHECKPOINT_KEYS):
        raise TypeError(f"a training checkpoint holds exactly {', '.join(CHECKPOINT_KEYS)}")
    model_args = {k: state["model_args"][k] for k in MODEL_ARGS}
    model_args = {k: v for k, v in model_args.items() if k not in RECIPE_ARCHITECTURE or v != ARCHITECTURE_DEFAULTS[k]}
    return {k: state[k] for k in CHECKPOINT_KEYS} | {"model_args": model_args}


CHECKPOINT_KEYS = ("model", "optimizer", "scaler", "model_args", "iter_num", "best_val_loss", "config")
CHECKPOINT_KEYS += ("tokenizer", "ranks")
# model_args as nanoGPT's GPTConfig takes them, so that its sample.py loads our checkpoints: the architecture and
# dropout (the kernels and memory savers are settings, in config); the recipe's fields only where they are on (a
# GPT-2 is what nanoGPT can load, and what it cannot, it refuses: its GPTConfig takes no such field)
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
    try:
        load_full_state(model, optimizer, None, checkpoint["optimizer"])
        if checkpoint.get("scaler"):
            scaler.load_state_dict(checkpoint["scaler"])
    except (ValueError, KeyError, TypeError, IndexError) as e:  # a foreign checkpoint's optimizer or scaler
        die(f"the checkpoint's optimizer state does not fit its model: {str(e).splitlines()[0] or repr(e)}")
    ranks = checkpoint.get("ranks") or [None]
    if len(ranks) != world_size:
        die(f"the checkpoint was saved by {len(ranks)} ranks: resume it with {len(ranks)} (nproc_per_node)")
    mine = ranks[rank]
    if mine:
        batches.load_state_dict(mine["data"])  # before the step fetches its first batch
    best = float(checkpoint["best_val_loss"])  # nanoGPT saves a 0-d tensor
    return checkpoint["iter_num"], best, mine["rng"] if mine else None
