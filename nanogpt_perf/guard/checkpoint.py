"""Forensics on checkpoint files, and the choice of the file a run resumes from: whether a file is
whole (every record's CRC), and whether it holds a model this code can build (ours or nanoGPT's) and
a training state that can be resumed. Everything else, a pickled class that loading would run
included, is one UserError naming the file; nothing of a foreign file is run or trusted before these
checks pass."""

import math
import pickle
import re
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from model import ARCHITECTURE, GPT, RECIPE_ARCHITECTURE, GPTConfig
from nanogpt_perf.errors import UserError, first_line, shown
from nanogpt_perf.files import MISSING, ReadFailed, file_kind, open_file


def saved_iterations(out_dir: Path) -> list[Path]:
    """The ckpt-NNNNNNN.pt files in out_dir, newest first (none where out_dir is no folder)."""
    return sorted(out_dir.glob("ckpt-" + "[0-9]" * 7 + ".pt"), reverse=True)


class NotWhole(UserError):
    """A checkpoint file that is missing, no file (a folder, a FIFO), truncated or corrupt: reason
    says which ('corrupt: ...'); missing: nothing at all is at path."""

    def __init__(self, path: Path, why: str, missing: bool = False):
        self.reason, self.missing = why.removeprefix("is "), missing
        super().__init__(f"checkpoint {path} {why}")


def check_whole(path: Path) -> None:
    """NotWhole unless path is a whole checkpoint (not missing, a file, whole, every CRC right)."""
    try:
        with open_file(path) as f, zipfile.ZipFile(f) as z:
            # torch.load alone would load a flipped byte in a tensor without a word
            bad = z.testzip()
    except ReadFailed as e:
        raise NotWhole(path, e.why, e.missing) from None
    except (zipfile.BadZipFile, OSError) as e:
        raise NotWhole(path, f"is truncated or not a checkpoint ({e})") from None
    if bad:
        raise NotWhole(path, f"is corrupt: record {bad} fails its CRC")


def is_whole(path: Path) -> bool:
    try:
        check_whole(path)
    except NotWhole:
        return False
    return True


def resume_checkpoint(out_dir: Path, fallback: bool) -> dict[str, Any]:
    """out_dir/ckpt.pt when whole; else, when fallback, the newest whole one of ckpt-best.pt and the
    ckpt-NNNNNNN.pt; else one line naming it. Each file's CRCs are checked once, here, before it is
    loaded."""
    path = out_dir / "ckpt.pt"
    try:
        check_whole(path)
        return resumable(read_checkpoint(path), path)
    except NotWhole as e:
        missing, bad = e.missing, str(e)  # "checkpoint {path} {why it is not whole}"
    good = newest_whole(out_dir)
    if missing and good is None:
        raise UserError(
            f"no checkpoint at {path} to resume from (train one first, or check out_dir)"
        )
    if good is None:
        raise UserError(f"{bad}, and no older checkpoint in {out_dir} is whole")
    if not fallback:
        raise UserError(
            f"{bad}; the newest whole one is {good}: resume_fallback=True resumes from it"
        )
    print(f"{bad}: resuming from {good}, the newest whole one", flush=True)
    return resumable(read_checkpoint(good), good)


def newest_whole(out_dir: Path) -> Path | None:
    """The newest whole checkpoint of the ckpt-NNNNNNN.pt and ckpt-best.pt (which outlives the
    iterations that keep_last deletes, and is a link to or a copy of the iteration it was saved at);
    None when none is whole."""
    newest = next((p for p in saved_iterations(out_dir) if is_whole(p)), None)
    best = out_dir / "ckpt-best.pt"
    if is_whole(best) and (newest is None or best.stat().st_mtime_ns > newest.stat().st_mtime_ns):
        return best
    return newest


def load_checkpoint(path: Path, map_location: torch.device | str = "cpu") -> dict[str, Any]:
    """Our checkpoint or nanoGPT's, its CRCs checked, as plain data; one error line for anything
    else."""
    if file_kind(path) == MISSING:
        raise UserError(f"no checkpoint at {path} (train one first, or check out_dir)")
    check_whole(path)
    return read_checkpoint(path, map_location)


def read_checkpoint(path: Path, map_location: torch.device | str = "cpu") -> dict[str, Any]:
    """torch.load of a file whose CRCs were checked, as plain data; one error line if it is not a
    checkpoint of ours or nanoGPT's, or if its weights do not fit its model_args."""
    try:
        with open_file(path, "checkpoint") as f:
            checkpoint = torch.load(f, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:  # weights_only refuses what could run code when loaded
        found = re.search(r"GLOBAL (\S+) was not an allowed global", str(e))
        what = f"a Python object ({found[1]})" if found else "Python objects"
        raise UserError(
            f"checkpoint {path} holds {what} beyond tensors and plain data: not loaded (it could "
            "run code)"
        ) from None
    # torch's own words, less its request for feedback
    except (RuntimeError, EOFError, ValueError) as e:
        reason = str(e).splitlines()[0].split("  (Could this error message be improved?")[0]
        raise UserError(
            f"checkpoint {path} is corrupt or not a torch checkpoint: {reason}"
        ) from None
    if missing := {"model", "model_args"} - set(checkpoint if isinstance(checkpoint, dict) else ()):
        raise UserError(
            f"checkpoint {path} is not a nanogpt-perf checkpoint (missing "
            f"{', '.join(sorted(missing))})"
        )
    checkpoint["model_args"] = check_model(checkpoint["model_args"], checkpoint["model"], path)
    return checkpoint


# what a checkpoint's model_args lack is GPTConfig's default, as nanoGPT's GPTConfig(**model_args)
# takes it (its checkpoints from before bias was a setting have none, and biases)
ARCHITECTURE_DEFAULTS = {k: GPTConfig.__dataclass_fields__[k].default for k in ARCHITECTURE}


def check_model(model_args: Any, weights: Any, path: Path) -> dict[str, Any]:
    """model_args with GPTConfig's defaults for those missing; a UserError unless they and the
    weights are a model this code can build and load."""
    unfit = f"checkpoint {path} is not one this code can load: "
    if not isinstance(model_args, dict):
        raise UserError(f"{unfit}its model_args are a {type(model_args).__name__}, not a dict")
    if unknown := sorted(str(k) for k in model_args if k not in GPTConfig.__dataclass_fields__):
        raise UserError(
            f"{unfit}its model_args name {', '.join(unknown)}: an option this code does not know "
            "(a newer version's?)"
        )
    missing = [k for k in ARCHITECTURE if k not in model_args and k not in RECIPE_ARCHITECTURE]
    took = (
        f" (its model_args lack {', '.join(missing)}: GPTConfig's defaults were taken)"
        if missing
        else ""
    )
    fail = lambda why: UserError(unfit + why + took)
    model_args = ARCHITECTURE_DEFAULTS | model_args
    for key in ARCHITECTURE:
        value, kind = model_args[key], type(ARCHITECTURE_DEFAULTS[key])
        if type(value) is int and value >= 2**63:  # past an int64: no size torch takes
            raise fail(f"its model_args' {key} must be a number within 64 bits, not {shown(value)}")
        if kind is float and (type(value) not in (int, float) or not 0 <= value < float("inf")):
            raise fail(f"its model_args' {key} must be a finite number >= 0, not {value!r}")
        if kind is not float and (type(value) is not kind or (kind is int and value < 1)):
            raise fail(
                f"its model_args' {key} must be {'a bool' if kind is bool else 'an int >= 1'}, not "
                f"{value!r}"
            )
    dropout = model_args.get("dropout", 0.0)
    if type(dropout) not in (int, float) or not 0 <= dropout < 1:
        raise fail(f"its model_args' dropout must be a number in [0, 1), not {dropout!r}")
    check_weights(model_args, weights, fail)
    return model_args


def check_weights(
    model_args: dict[str, Any], weights: Any, fail: Callable[[str], UserError]
) -> None:
    """fail(why) unless the weights are the model of model_args, built on the meta device (no
    memory)."""
    if not isinstance(weights, dict) or not all(
        isinstance(v, torch.Tensor) for v in weights.values()
    ):
        raise fail("its model is not a state dict (names to tensors)")
    weights = {str(k).removeprefix("_orig_mod."): v for k, v in weights.items()}
    layers = {int(m[1]) for k in weights if (m := re.match(r"transformer\.h\.(\d+)\.", k))}
    n_layer = model_args["n_layer"]
    if len(layers) != n_layer or layers != set(range(n_layer)):  # no range of a huge n_layer
        raise fail(f"its model_args say n_layer={n_layer}, its weights hold {len(layers)} layers")
    # every layer: which weights a layer has can depend on its place (value embeddings, U-net skips)
    try:
        with torch.device("meta"):  # model_args name GPTConfig's fields only (check_model)
            expected = {k: v.shape for k, v in GPT(GPTConfig(**model_args)).state_dict().items()}
    except (ValueError, TypeError, RuntimeError) as e:  # RuntimeError: sizes past an int64
        raise fail(f"its model_args are inconsistent: {first_line(e)}") from None
    if unknown := sorted(set(weights) - set(expected)):
        raise fail(f"its weights hold {unknown[0]}, which the model of its model_args has not")
    if missing := sorted(set(expected) - set(weights)):
        raise fail(f"its weights lack {missing[0]}")
    for name, shape in ((k, v.shape) for k, v in weights.items()):
        if (want := expected[name]) != shape:
            raise fail(f"its weight {name} is {tuple(shape)}, its model_args make it {tuple(want)}")


def not_a_loss(value: Any) -> bool:
    """Whether a number is no loss a run can compare with: NaN (none is lower), or past a float."""
    try:
        return math.isnan(float(value))
    except (OverflowError, RuntimeError):  # RuntimeError: a tensor with no value (a meta one)
        return True


def check_ranks(checkpoint: dict[str, Any], world_size: int) -> None:
    """A UserError unless the checkpoint was saved by world_size ranks (it holds each rank's place
    in the data and generators; nanoGPT's and one process's, one), checked before the ranks meet:
    under FSDP its loading is collective, and a rank that exits just after a collective may abort at
    the interpreter's end."""
    saved = len(checkpoint.get("ranks") or [None])
    if saved != world_size:
        raise UserError(
            f"the checkpoint was saved by {saved} ranks: resume it with {saved} (nproc_per_node)"
        )


def resumable(checkpoint: dict[str, Any], path: Path) -> dict[str, Any]:
    """The checkpoint, when it holds what a run resumes from (ours or nanoGPT's: the iteration, the
    best val loss, the optimizer and the settings); else a UserError naming what it lacks."""
    fail = lambda why: UserError(f"checkpoint {path} cannot be resumed: {why}")
    iter_num, best = checkpoint.get("iter_num"), checkpoint.get("best_val_loss")
    if type(iter_num) is not int or iter_num < 0:
        raise fail(f"its iter_num must be an int >= 0, not {shown(iter_num)}")
    if iter_num >= 2**63:  # an int64 in the schedule and the data's seeds
        raise fail(f"its iter_num must be an integer within 64 bits, not {shown(iter_num)}")
    number = type(best) in (int, float) or isinstance(best, torch.Tensor) and best.numel() == 1
    if not number or not_a_loss(best):
        best = best.item() if number and isinstance(best, torch.Tensor) else best
        raise fail(f"its best_val_loss must be a number, not {shown(best)}")
    optimizer = checkpoint.get("optimizer")
    optimizer = optimizer if isinstance(optimizer, dict) else {}
    if not (
        isinstance(optimizer.get("state"), dict) and isinstance(optimizer.get("param_groups"), list)
    ):
        raise fail("its optimizer is not an optimizer's state dict (state and param_groups)")
    if not isinstance(checkpoint.get("config"), dict):
        raise fail("its config (the settings it was trained with) is not a dict")
    ranks = checkpoint.get("ranks") or []
    rank = lambda r: r is None or isinstance(r, dict) and {"rng", "data"} <= set(r)
    if not (isinstance(ranks, list) and all(map(rank, ranks))):
        raise fail(
            "its ranks (each rank's generators and place in the data) are not a list of dicts"
        )
    identity = checkpoint.get("data_identity")
    if identity is not None and not (
        isinstance(identity, dict) and type(identity.get("folder")) is str
    ):
        raise fail(
            "its data_identity (the dataset's folder and files) is not this suite's record of them"
        )
    return checkpoint
