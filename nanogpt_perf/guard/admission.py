"""The guard's entry for train.py: what a run checks before its first write, in three calls (train.py's order):

- resolve_settings, before torch.distributed starts (a refused command ends before torchrun's ranks meet, and the
  process group starts with this command's device and backend): torchrun's variables, the out_dir (one run each),
  a resumed checkpoint (its settings merged with this command's, and its limits), every rule between settings;
- preflight, once the ranks and the device are up (rank 0 prepares the data while the others wait at a barrier;
  batch_size='auto' is sized on the device): the dataset (prepared on first use, every token id inside the
  vocabulary, the same files as a resumed checkpoint's), the shape of a step, the model and its fit to the data
  and to the settings given, HellaSwag's needs, wandb; it returns the Plan the run follows;
- claim_out_dir, after the build (which can still refuse): the lock, and under it the out_dir checked again.

A refused run writes nothing."""

import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import torch.distributed as dist

from model import ARCHITECTURE, GPT, RECIPE_ARCHITECTURE, GPTConfig, fields_of_kind
from nanogpt_perf.config import Config, check_value, convert
from nanogpt_perf.data.dataset import dataset_vocab_size, prepare_if_missing
from nanogpt_perf.data.tokenizer import GPT2_VOCAB_SIZE, Tokenizer, tokenizer_spec
from nanogpt_perf.errors import UserError
from nanogpt_perf.guard.checkpoint import check_ranks, resume_checkpoint
from nanogpt_perf.guard.dataset import check_token_ids, dataset_identity, identity_change
from nanogpt_perf.guard.out_dir import admit_out_dir, check_no_earlier_run, check_unchanged, run_paths
from nanogpt_perf.guard.vocabulary import check_same_vocabulary, folder_tokenizer_spec
from nanogpt_perf.guard.weights import load_gpt2
from nanogpt_perf.hellaswag import download_val, read_examples
from nanogpt_perf.lock import OutDirLock
from nanogpt_perf.runtime import Runtime, dtype_problem, resolve_device
from nanogpt_perf.train.autobatch import micro_batch, step_shape
from nanogpt_perf.train.build import model_config
from nanogpt_perf.train.parallel import Ranks, close, torchrun_rank

# settings a resumed run cannot change: the architecture (the vocabulary through pad_vocab and the data, which give
# vocab_size), the initialisation (it took place before: a change would be recorded, not done) and the optimizer
# whose state it holds; its data is checked by identity (its files), or for a checkpoint that has none (nanoGPT's,
# older ones) by the names of its folder
FIXED_ON_RESUME = (*(k for k in ARCHITECTURE if k != "vocab_size"), *fields_of_kind("init"), "pad_vocab", "optimizer")
DATA_NAMES = ("dataset", "data_dir")
# settings that say how this command runs, not what the run is: always taken from the command
PER_COMMAND = ("init_from", "resume_fallback", "out_dir", "device", "backend", "overwrite", "allow_changed_data")
PER_COMMAND += ("run_data_preparer",)
UNREPORTED = ("init_from", "overwrite")  # what a resumed run's command says of these is no news
AS_IT_IS = "; resume on it as it is with --allow_changed_data=True"  # how a changed-data refusal ends
# the GPTConfig fields that leave GPT-2's weights as they are: a run from GPT-2 takes them from its settings
FREE_OF_WEIGHTS = fields_of_kind("kernel", "training")


class Settings(NamedTuple):
    cfg: Config  # every setting, merged with a resumed checkpoint's
    checkpoint: dict[str, Any] | None  # the checkpoint it resumes from
    seen: tuple | None  # what out_dir held of a run when admitted (rank 0): claim_out_dir checks it again


def resolve_settings(cfg: Config, cross: tuple) -> Settings:
    """The settings (a resumed checkpoint's merged in, then checked by cross) and the checkpoint."""
    master = torchrun_rank(os.environ) == 0
    out_dir, resuming = Path(cfg.out_dir), cfg.init_from == "resume"
    seen = admit_out_dir(out_dir, not resuming, cfg.overwrite, cfg.eval_only) if master else None
    checkpoint = resume_checkpoint(out_dir, cfg.resume_fallback) if resuming else None
    merged = cfg.as_dict()
    if checkpoint is not None:
        check_ranks(checkpoint, int(os.environ.get("WORLD_SIZE", 1)))
        merged, overrides = resume_settings(checkpoint, cfg)
        if master and overrides:
            print("resumed settings overridden: " + "; ".join(overrides), flush=True)
    # a resumed run's dtype that this device has not (nanoGPT saves float16 from a CPU run) is auto here
    device, dtype = merged["device"], merged["dtype"]
    if checkpoint is not None and "dtype" not in cfg.given and dtype_problem(resolve_device(device), dtype):
        if master:
            print(f"resumed settings: dtype={dtype!r} not applied (not on {device}): auto", flush=True)
        merged["dtype"] = "auto"
    cfg = cfg.replace(cross, **merged)
    if checkpoint is not None and not cfg.eval_only and cfg.max_iters <= checkpoint["iter_num"]:
        raise UserError(
            f"the checkpoint in {out_dir} is at iter {checkpoint['iter_num']} and max_iters={cfg.max_iters}: "
            f"nothing to train (max_iters counts from the run's start): set max_iters above "
            f"{checkpoint['iter_num']}, or eval_only=True to evaluate it"
        )
    return Settings(cfg, checkpoint, seen)


def resume_settings(checkpoint: dict[str, Any], cfg: Config) -> tuple[dict[str, Any], list[str]]:
    """The checkpoint's settings (ours, or nanoGPT's: the same names) overridden by this command's, and a line
    for each override and each saved setting that does not apply here; a UserError for an override that cannot
    apply to the checkpoint, or a saved value not valid here."""
    saved, identity, given, merged = checkpoint["config"], checkpoint.get("data_identity"), cfg.given, cfg.as_dict()
    for key, value in saved.items():  # merged[key] is still this command's value when it is read
        if key in merged and key not in given and key not in PER_COMMAND:
            merged[key] = saved_value(key, value, merged[key], cfg.metadata(key))
    changed = [k for k in sorted(given) if k in saved and k not in PER_COMMAND and merged[k] != saved[k]]
    was = lambda k: saved[k] if k in saved else cfg.defaults[k]  # noqa: E731 (a setting it predates: its default)
    fixed = [k for k in sorted(given) if k in FIXED_ON_RESUME and merged[k] != was(k)]
    moved = [k for k in changed if k in DATA_NAMES]  # another folder: only for the same files (or when asked)
    what = lambda keys: ", ".join(f"{k}={merged[k]!r} (checkpoint: {was(k)!r})" for k in keys)  # noqa: E731
    here = Path(merged["data_dir"]) / merged["dataset"]
    if moved and not merged["allow_changed_data"]:
        refused = f"cannot resume with {what(moved)}"
        if identity is None:
            raise UserError(f"{refused}: the checkpoint records no data to compare it with{AS_IT_IS}")
        if not here.is_dir():
            raise UserError(f"{refused}: no dataset there yet{AS_IT_IS}")
        if change := identity_change(identity, dataset_identity(here)):
            raise UserError(f"{refused}: not the checkpoint's data ({change}){AS_IT_IS}")
    if fixed:
        raise UserError(
            f"cannot resume with {what(fixed)}: the checkpoint's architecture, vocabulary, data and optimizer are fixed"
        )
    lines = [f"{k}: {saved[k]!r} -> {merged[k]!r}" for k in changed]
    lines += [f"{k}={saved[k]!r} not applied (not a setting here)" for k in saved if k not in merged]
    per_command = [k for k in PER_COMMAND if k not in UNREPORTED and k not in given and k in saved and k in merged]
    lines += [
        f"{k}={saved[k]!r} not applied (this command's {merged[k]!r})" for k in per_command if saved[k] != merged[k]
    ]
    if identity and not set(DATA_NAMES) & given and not here.exists():  # resumed from elsewhere: where it read
        where = Path(identity["folder"])
        merged |= {"data_dir": str(where.parent), "dataset": where.name}
        lines.append(f"the data read from where the run found it, {where}")
    return merged, lines


def saved_value(key: str, value: Any, default: Any, meta: dict[str, Any]) -> Any:
    """A checkpoint's setting as this train.py takes it (its type, within its rule), or a UserError naming it."""
    try:
        value = convert(key, value, default, meta.get("words", ()))  # a UserError, never a ValueError
        check_value(value, meta)
    except UserError as e:
        raise UserError(f"the checkpoint's settings are not this train.py's: {e}") from None
    except ValueError as valid:
        raise UserError(
            f"the checkpoint's {key}={value!r} is not valid here ({valid}): give {key} to replace it"
        ) from None
    return value


class Data(NamedTuple):
    path: Path  # data_dir/dataset
    vocab_size: int  # the dataset's, before padding
    batch_size: int  # the micro-batch of each rank
    accumulation: int  # micro-batches a step, over all ranks
    identity: dict[str, Any] | None  # its files as rank 0 found them (guard/dataset.py), for its checkpoints


class Plan(NamedTuple):
    cfg: Config  # as it runs: batch_size and gradient_accumulation_steps as preflight resolved them
    checkpoint: dict[str, Any] | None
    data: Data
    model: GPT  # on the CPU, before it is built for training
    hellaswag: tuple[list, Callable] | None  # HellaSwag's examples and encoder, when asked for
    wandb: ModuleType | None
    seen: tuple | None


def preflight(settings: Settings, ranks: Ranks, runtime: Runtime) -> Plan:
    """The Plan a run follows: everything it needs checked before it builds (see the module's docstring)."""
    cfg, checkpoint = settings.cfg, settings.checkpoint
    data = admit_data(cfg, ranks, runtime, checkpoint)
    cfg = cfg.replace(batch_size=data.batch_size, gradient_accumulation_steps=data.accumulation)
    model = initial_model(cfg, data.vocab_size, checkpoint)
    hellaswag = hellaswag_task(cfg, data.path, ranks)
    return Plan(cfg, checkpoint, data, model, hellaswag, import_wandb(cfg, ranks.master), settings.seen)


def admit_data(cfg: Config, ranks: Ranks, runtime: Runtime, checkpoint: dict[str, Any] | None) -> Data:
    """The dataset, prepared and checked as the module's docstring says (rank 0 reads; its error ends
    every rank), and the shape of a step (train/autobatch.py's step_shape)."""
    path = Path(cfg.data_dir) / cfg.dataset
    if ranks.master:
        prepare_if_missing(path, cfg.run_data_preparer)
    if ranks.distributed:
        dist.barrier()
    vocab_size, identity = dataset_vocab_size(path) or GPT2_VOCAB_SIZE, None
    saved = checkpoint.get("data_identity") if checkpoint else None
    say = lambda line: print(line, flush=True) if ranks.master else None  # noqa: E731
    if ranks.master:
        identity = dataset_identity(path, check_token_ids(path, vocab_size))
        if saved and (change := identity_change(saved, identity)):
            changed = f"dataset {cfg.dataset} changed since the checkpoint was saved"
            if not cfg.allow_changed_data:
                raise UserError(f"{changed}: {change}{AS_IT_IS}")
            say(f"{changed} ({change}): resuming on it as it is, as allow_changed_data=True asks")
    choose = lambda rows: micro_batch(rows, cfg, vocab_size, runtime, say)  # noqa: E731
    batch_size, accumulation = step_shape(cfg, ranks.world_size, choose)
    if accumulation % ranks.world_size:
        raise UserError(f"gradient_accumulation_steps={accumulation} is not divisible by {ranks.world_size} ranks")
    say(f"vocab_size {vocab_size} from {path}")
    say(
        f"tokens per iteration: {accumulation * batch_size * cfg.block_size:,} ({accumulation // ranks.world_size} "
        f"micro-batches x {ranks.world_size} ranks x {batch_size} x {cfg.block_size})"
    )
    return Data(path, vocab_size, batch_size, accumulation, identity)


def initial_model(cfg: Config, vocab_size: int, checkpoint: dict[str, Any] | None) -> GPT:
    """The model a run starts from: new, its checkpoint's, or GPT-2's weights (a hub name or a transformers
    folder), cropped to block_size; refused where the data or a setting given does not fit the weights."""
    config = model_config(cfg, vocab_size)
    if cfg.init_from == "scratch":
        return GPT(config)
    if checkpoint is not None:
        model, source = GPT.from_checkpoint(checkpoint, config), "checkpoint"
    else:
        if recipe := [k for k in RECIPE_ARCHITECTURE if getattr(cfg, k) != GPTConfig.__dataclass_fields__[k].default]:
            raise UserError(
                f"init_from={cfg.init_from}: GPT-2's weights fix its architecture; drop {', '.join(recipe)}"
            )
        model_spec = folder_tokenizer_spec(Path(cfg.init_from))  # an export's characters, or GPT-2's BPE
        check_same_vocabulary(model_spec, tokenizer_spec(Path(cfg.data_dir) / cfg.dataset), cfg.dataset)
        model, source = load_gpt2(cfg.init_from, **{k: getattr(config, k) for k in FREE_OF_WEIGHTS}), cfg.init_from
        check_fits_weights(cfg, model.config, source)
    if cfg.block_size > model.config.block_size:
        raise UserError(f"block_size={cfg.block_size} is larger than the {source}'s {model.config.block_size}")
    if vocab_size > model.config.vocab_size:
        raise UserError(
            f"dataset {cfg.dataset} has {vocab_size} tokens, more than the {source}'s vocabulary of "
            f"{model.config.vocab_size}"
        )
    if cfg.block_size < model.config.block_size:
        model.crop_block_size(cfg.block_size)
    return model


def check_fits_weights(cfg: Config, weights: GPTConfig, source: str) -> None:
    """A UserError for a setting given that the weights lack (architecture; block_size crops) or loading
    skips (an initialisation): the run would train one model and record another."""
    shape = [k for k in ARCHITECTURE if k in cfg.given and k != "block_size" and getattr(cfg, k) != getattr(weights, k)]
    init = [k for k in fields_of_kind("init") if k in cfg.given and getattr(cfg, k) != getattr(weights, k)]
    if shape or init:
        given = ", ".join(f"{k}={getattr(cfg, k)!r}" for k in shape + init)
        theirs = ", ".join([f"{k}={getattr(weights, k)!r}" for k in shape] + [f"{k} not applied" for k in init])
        raise UserError(f"init_from={source}: the weights fix {theirs}, not {given}: drop them, or train from scratch")


def claim_out_dir(plan: Plan, ranks: Ranks) -> OutDirLock | None:
    """Rank 0 takes out_dir's lock, checks under it that out_dir is still as admission saw it (another run may
    have used it and ended meanwhile) and, for a scratch run with overwrite=True, deletes the earlier run's files,
    saying so. Under DDP every rank learns whether it did and, when not, they all stop with rank 0's line: a rank
    left waiting at its next collective would hang until torchrun's timeout."""
    cfg, lock, problem = plan.cfg, None, None
    out_dir, replace_earlier = Path(cfg.out_dir), cfg.overwrite and cfg.init_from != "resume"
    if ranks.master:
        lock = OutDirLock(out_dir)
        try:
            lock.claim()
            if cfg.init_from != "resume" and not cfg.overwrite:
                check_no_earlier_run(out_dir, cfg.eval_only)
            if not replace_earlier:
                check_unchanged(out_dir, plan.seen)
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


def hellaswag_task(cfg: Config, data_path: Path, ranks: Ranks) -> tuple[list, Callable] | None:
    """HellaSwag's examples and encoder, when hellaswag_interval asks (GPT-2's tokens, no FSDP)."""
    if not cfg.hellaswag_interval:
        return None
    tokenizer = Tokenizer.for_dataset(data_path)
    if tokenizer.itos is not None or cfg.parallelism == "fsdp" and ranks.distributed:
        raise UserError(
            f"hellaswag_interval needs GPT-2's tokens and no FSDP, not {tokenizer.name} with {cfg.parallelism}"
        )
    file = cfg.hellaswag_file
    path = Path(file) if file else Path(cfg.data_dir) / "hellaswag" / "hellaswag_val.jsonl"
    if ranks.master and not file:
        download_val(path)
    if ranks.distributed:
        dist.barrier()
    return read_examples(path, cfg.hellaswag_examples), tokenizer.encode


def import_wandb(cfg: Config, master: bool) -> ModuleType | None:
    """wandb, where wandb_log asks for it (rank 0): imported before the run writes anything (the last check)."""
    if not (cfg.wandb_log and master):
        return None
    try:
        import wandb
    except ImportError:
        raise UserError(
            "wandb_log=True needs wandb: pip install wandb (WANDB_MODE=offline works with no network)"
        ) from None
    return wandb
