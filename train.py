"""Train a GPT, on one device or many, from scratch or resumed. Read it top to bottom: every
performance switch is applied where its comment says.

    python train.py config/train_shakespeare_char_cpu.py   # a baby GPT on CPU in about a minute
    python train.py config/train_shakespeare_char.py --compile=false  # nanoGPT's configs, flags
    torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2.py
"""

from nanogpt_perf.errors import report_errors

# from the first moment: a mistake of the user's, or Ctrl-C while torch loads, is one line
report_errors()

import math
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from configurator import configure
from model import GPT, GPTConfig
from nanogpt_perf.config import setting
from nanogpt_perf.data.dataset import dataset_vocab_size, prepare_if_missing
from nanogpt_perf.data.identity import checked_identity
from nanogpt_perf.data.loader import LoaderConfig, TokenBatches
from nanogpt_perf.data.tokenizer import GPT2_VOCAB_SIZE, Tokenizer, tokenizer_spec
from nanogpt_perf.errors import UserError
from nanogpt_perf.files import write_json
from nanogpt_perf.gpt2_weights import HF_HUB_NAMES, load_gpt2
from nanogpt_perf.guard.checkpoint import resume_checkpoint
from nanogpt_perf.guard.out_dir import admit_out_dir
from nanogpt_perf.guard.paths import a_path, init_from_one_of, optional_path
from nanogpt_perf.guard.vocabulary import check_hellaswag_tokens as check_hellaswag
from nanogpt_perf.guard.vocabulary import check_same_vocabulary, folder_tokenizer_spec
from nanogpt_perf.guard.weights import check_fits_model, check_pretrained_settings
from nanogpt_perf.hellaswag import examples_for_run, score
from nanogpt_perf.lowmem import LowMemConfig
from nanogpt_perf.manifest import run_manifest
from nanogpt_perf.memory import peak_memory_bytes
from nanogpt_perf.optim import OptimConfig, ScheduleConfig, get_lr, schedule_rules, set_lr
from nanogpt_perf.peak_flops import mfu
from nanogpt_perf.profiling import step_profiler
from nanogpt_perf.runtime import RuntimeConfig, resolve_runtime
from nanogpt_perf.train import build, parallel
from nanogpt_perf.train.autobatch import micro_batch, step_shape
from nanogpt_perf.train.checkpoint import (
    claim_out_dir,
    restore_training,
    save_iteration,
    training_state,
)
from nanogpt_perf.train.preemption import StopRequest, resume_command, stopped_line
from nanogpt_perf.train.progress import Progress, RunLog, import_wandb, nonfinite_end
from nanogpt_perf.train.resume import merged_settings, rng_state, set_rng_state


# -----------------------------------------------------------------------------
@dataclass
class TrainConfig:
    """Settings of train.py: defaults train GPT-2 (124M); config files and --key=value flags
    override them"""

    # I/O
    out_dir: str = setting("out", "checkpoints, log.jsonl and manifest.json", check=a_path)
    eval_interval: int = setting(2000, "iterations between evals", min=1)
    log_interval: int = setting(1, "iterations between log lines", min=1)
    eval_iters: int = setting(200, "batches per split at each eval: the same fixed windows every "
                              "time; at most 1,000,000 (an eval shows nothing until it ends)",
                              min=1, max=1_000_000)  # fmt: skip
    eval_only: bool = setting(False, "evaluate once and exit")
    hellaswag_interval: int = setting(0, "HellaSwag's accuracy too, every this many iterations and "
                                      "at the end", min=0, note=" (0 = off)")  # fmt: skip
    hellaswag_file: str = setting("", "a local hellaswag_val.jsonl; '' = download the official one "
                                  "to data/hellaswag/", check=optional_path)  # fmt: skip
    hellaswag_examples: int = setting(0, "score the first this many examples each time; 0 = all "
                                      "10,042", min=0, note=" (0 = all)")  # fmt: skip
    always_save_checkpoint: bool = setting(
        True, "save at every eval, not only when val loss improves"
    )
    save_interval: int = setting(0, "also save every this many iterations, evals or not", min=0,
                                 note=" (0 = at evals only)")  # fmt: skip
    keep_last: int = setting(3, "checkpoints kept (out_dir/ckpt-NNNNNNN.pt), besides the best "
                             "(ckpt-best.pt)", min=1)  # fmt: skip
    init_from: str = setting("scratch", "'resume': from out_dir/ckpt.pt", check=init_from_one_of(
                             "scratch", "resume", *HF_HUB_NAMES))  # fmt: skip
    overwrite: bool = setting(False, "a new run (not init_from='resume') may replace an earlier "
                              "run's checkpoints and log in out_dir")  # fmt: skip
    resume_fallback: bool = setting(False, "resume from the newest whole checkpoint when ckpt.pt "
                                    "is truncated or corrupt")  # fmt: skip
    allow_changed_data: bool = setting(False, "resume on a dataset whose files changed since the "
                                       "checkpoint was saved")  # fmt: skip
    # wandb logging
    wandb_log: bool = setting(False, "log to wandb too (WANDB_MODE=offline works with no network)")
    wandb_project: str = setting("owt", "wandb's project")
    wandb_run_name: str = setting("gpt2", "wandb's name of the run")
    # data
    dataset: str = setting("openwebtext", "as nanoGPT; prepare it first "
                           "(data/openwebtext/prepare.py), or name another")  # fmt: skip
    data_dir: str = setting("data", "datasets live in data_dir/dataset: train.bin and val.bin, or "
                            "llm.c shards", check=a_path)  # fmt: skip
    run_data_preparer: bool = setting(False, "run data_dir/dataset/prepare.py even where it is not "
                                      "one of this repository's")  # fmt: skip
    gradient_accumulation_steps: int = setting(5 * 8, "micro-batches per optimizer step, counted "
                                               "across all ranks; at most 10,000 (a step shows "
                                               "nothing until it ends)",
                                               min=1, max=10_000)  # fmt: skip
    batch_size: int | str = setting(12, "micro-batch size per rank, or 'auto': the largest that "
                                    "fits", min=1, words=("auto",))  # fmt: skip
    tokens_per_iter: int = setting(0, "tokens per optimizer step, setting "
                                   "gradient_accumulation_steps; at most 2**30 (over 300 times "
                                   "GPT-3's 3.2M)",
                                   min=0, max=2**30, note=" (0 = unset)")  # fmt: skip
    max_iters: int = setting(600000, "optimizer steps", min=0)
    # system
    backend: str = setting(
        "auto", "DDP's: 'auto' is nccl on CUDA, gloo on CPU", choices=("auto", "nccl", "gloo")
    )
    profile: bool = setting(
        False, "torch.profiler over steps 3-5 (rank 0): a Chrome trace in out_dir/trace.json"
    )
    max_bad_steps: int = setting(10, "stop after this many steps in a row with a non-finite loss "
                                 "or gradient norm", min=1)  # fmt: skip


# the model's shape, the optimizer and every performance switch are declared by the code that uses
# them; configure() flattens them into nanoGPT's flat names (python train.py --help lists them)
cfg = configure(
    train=TrainConfig, model=GPTConfig, optim=OptimConfig, schedule=ScheduleConfig,
    runtime=RuntimeConfig, loader=LoaderConfig, build=build.BuildConfig, lowmem=LowMemConfig,
    defaults=build.TRAINING_DEFAULTS,
)  # fmt: skip
# -----------------------------------------------------------------------------

# before anything is written and before the ranks meet: out_dir is this run's to use (one run each),
# and on resume the checkpoint is read whole and its settings are overridden by the ones given now
master, out_dir = parallel.torchrun_rank(os.environ) == 0, Path(cfg.out_dir)
resuming, world_size = cfg.init_from == "resume", int(os.environ.get("WORLD_SIZE", 1))
seen = admit_out_dir(out_dir, not resuming, cfg.overwrite, cfg.eval_only) if master else None
checkpoint = resume_checkpoint(out_dir, cfg.resume_fallback) if resuming else None
cfg = merged_settings(cfg, checkpoint, (schedule_rules, *build.BUILD_RULES), world_size, master)

# DDP: torchrun sets RANK; each process drives one device (its own GPU) and sees 1/world of the
# micro-batches; rank 0 (or the only process) prints
ranks = parallel.start_ranks(cfg.device, cfg.backend)
ddp = ranks.distributed
print0 = lambda *args: print(*args, flush=True) if master else None

# device and precision, chosen once every override is in; TF32 is set here (CUDA only)
runtime = resolve_runtime(cfg.device, cfg.dtype, cfg.tf32)
print0(runtime.describe())
torch.manual_seed(cfg.seed + ranks.rank)

# the data: prepared on first use (rank 0; a small dataset), every token id checked against its
# vocabulary and its files against a resumed checkpoint's
data_path = Path(cfg.data_dir) / cfg.dataset
if master:
    prepare_if_missing(data_path, cfg.run_data_preparer)
if ddp:
    dist.barrier()
vocab_size = dataset_vocab_size(data_path) or GPT2_VOCAB_SIZE
saved, data_identity = checkpoint.get("data_identity") if checkpoint else None, None
if master:
    data_identity = checked_identity(
        data_path, cfg.dataset, vocab_size, saved, cfg.allow_changed_data
    )

# the step's shape: the micro-batch and the accumulation as set, or with tokens_per_iter the
# accumulation that makes exactly that many tokens, at batch_size or the largest that fits ('auto')
choose = lambda rows: micro_batch(rows, cfg, vocab_size, runtime, print0)
batch_size, accumulation = step_shape(cfg, ranks.world_size, choose)
cfg = cfg.replace(batch_size=batch_size, gradient_accumulation_steps=accumulation)
sequences = batch_size * accumulation // ranks.world_size  # this rank's, a step
print0(f"vocab_size {vocab_size} from {data_path}")
tokens_per_step = accumulation * batch_size * cfg.block_size
shape = f"{sequences // batch_size} micro-batches x {ranks.world_size} ranks x {batch_size}"
print0(f"tokens per iteration: {tokens_per_step:,} ({shape} x {cfg.block_size})")

# the model: new (the vocabulary padded to a multiple of pad_vocab), the checkpoint's, or GPT-2's
# weights (a hub name or a transformers folder); cropped to block_size, checked against the data and
# the settings given
config = build.model_config(cfg, vocab_size)
if cfg.init_from == "scratch":
    model = GPT(config)
elif resuming:
    model = GPT.from_checkpoint(checkpoint, config)
else:
    check_pretrained_settings(cfg.model, cfg.init_from)
    model_spec = folder_tokenizer_spec(Path(cfg.init_from))
    check_same_vocabulary(model_spec, tokenizer_spec(data_path), cfg.dataset)
    model = load_gpt2(cfg.init_from, config)
if cfg.init_from != "scratch":
    source = "checkpoint" if resuming else cfg.init_from
    check_fits_model(cfg.model, cfg.given, model.config, source, cfg.dataset, vocab_size)
    if cfg.block_size < model.config.block_size:
        model.crop_block_size(cfg.block_size)
model_args = asdict(model.config)
print0(f"model: {model.get_num_params() / 1e6:.2f}M parameters, {model_args}")

# HellaSwag's examples (downloaded once) and encoder, each rank scoring its share; wandb
hellaswag = None
if cfg.hellaswag_interval:
    tokenizer = Tokenizer.for_dataset(data_path)
    check_hellaswag(tokenizer.name, tokenizer.itos is not None, cfg.parallelism, ddp)
    hellaswag_file, count = cfg.hellaswag_file, cfg.hellaswag_examples
    examples = examples_for_run(hellaswag_file, cfg.data_dir, count, master, ddp)
    hellaswag = examples, tokenizer.encode
wandb = import_wandb(cfg.wandb_log, master)

# the batches: in data_order, each rank its own share, built ahead by a background thread into
# pinned buffers (CUDA); evaluation reads fixed windows of its own
batches = TokenBatches(
    data_path, cfg.batch_size, cfg.block_size, runtime.device, cfg.seed, ranks.rank,
    ranks.world_size, cfg.data_order, cfg.prefetch,
)  # fmt: skip

# what trains it, built as bench.py builds it (nanogpt_perf/train/build.py): the weights in
# weights_dtype, on the device, compiled when asked, in DDP or FSDP2 (parallelism); the optimizer,
# its state in state_bits / muon_momentum_dtype (or on the host: offload); a GradScaler (float16);
# the step bench.py times (docs/lowmem.md: the memory savers)
if cfg.compile:
    print0(f"compiling the model, mode {cfg.compile_mode} (the first step takes longer)")
model, raw_model, optimizer, scaler, step = build.build_training(cfg, runtime, batches, model)

# on resume: the optimizer's and the scaler's states and this rank's place in the data
iter_num, best_val_loss, rng = 0, float("inf"), None
if checkpoint is not None:
    restored = restore_training(checkpoint, model, optimizer, scaler, batches, ranks)
    iter_num, best_val_loss, rng = restored
checkpoint = None  # its memory freed


@torch.no_grad()
def estimate_loss() -> dict[str, float] | None:
    """Mean loss over eval_iters batches of each split (the same windows at every eval), over all
    ranks; None when a stop is asked for part way (every rank asks before each batch: they stop
    together)."""
    model.eval()
    out = {}
    for split in ("train", "val"):
        losses = torch.zeros(cfg.eval_iters, device=runtime.device)
        for k, (X, Y) in enumerate(batches.eval_batches(split, cfg.eval_iters)):
            if stop_asked():  # once asked, asked at every later batch too
                break
            with runtime.autocast_ctx():
                _, loss = model(X, Y)
            losses[k] = loss
        else:  # every batch
            out[split] = parallel.mean_over_ranks(losses.mean())
    model.train()
    return out if len(out) == 2 else None


def save(best: bool) -> str | None:
    """Every rank calls it (FSDP gathers its shards): rank 0 writes the checkpoint, with each rank's
    generators and the loader position of the batch it has fetched but not trained on; its name
    (rank 0)."""
    model_state, optimizer_state = parallel.full_state(model, optimizer)
    mine = {"rng": rng_state(runtime.device), "data": step.data_state}
    every_rank = [mine] * ranks.world_size
    if ddp:
        dist.all_gather_object(every_rank, mine)
    if master:
        state = training_state(
            model=model_state, optimizer=optimizer_state, scaler=scaler.state_dict(),
            model_args=model_args, iter_num=iter_num, best_val_loss=best_val_loss,
            config=cfg.as_dict(), tokenizer=tokenizer_spec(data_path), ranks=every_rank,
            data_identity=data_identity,
        )  # fmt: skip
        path = save_iteration(state, out_dir, iter_num, best, cfg.keep_last)
        print(f"saved checkpoint {path}" + (" (the best so far)" if best else ""))
        return path.name
    return None


# every check has passed: out_dir is this run's (rank 0 holds out_dir/train.lock, and under it finds
# out_dir as the guard saw it; overwrite=True deletes an earlier run's checkpoints and log first),
# and SIGTERM or Ctrl-C stops the run cleanly (finish the step, save, exit)
lock = claim_out_dir(out_dir, resuming, cfg.overwrite, cfg.eval_only, seen, ranks)
stop = StopRequest(lock.release if lock else None)
stop_asked = lambda: stop.requested(ddp, runtime.device)  # every rank the same answer

# what made this run (rank 0), and where its records go: stdout, out_dir/log.jsonl, wandb
if master:
    made = {"world_size": ranks.world_size, "model_args": model_args}
    write_json(out_dir / "manifest.json", run_manifest(cfg.as_dict(), runtime) | made)
wandb_init = dict(project=cfg.wandb_project, name=cfg.wandb_run_name, config=cfg.as_dict())
log = RunLog(out_dir, master, wandb, wandb_init)

# the loop: exactly max_iters optimizer steps, an eval at every eval_interval and at the end,
# checkpoints when the val loss improves (or always_save_checkpoint), every save_interval and when
# stopped; each logging window timed between device synchronisations, evals and checkpoints left out
# (nanogpt_perf/train/progress.py)
model.train()
profiling = cfg.profile and master
profiler = step_profiler(runtime.device, out_dir / "trace.json") if profiling else None
if profiler:
    profiler.start()
if rng is not None:
    set_rng_state(rng, runtime.device)  # last, after everything that draws random numbers at start
start_iter, bad_steps = iter_num, 0
progress = Progress(runtime, iter_num, cfg.max_iters, tokens_per_step)
while True:
    lr = get_lr(iter_num, cfg.schedule, cfg.learning_rate)  # warmup, then cosine or wsd to min_lr
    set_lr(optimizer, lr, cfg.learning_rate)  # every group by the schedule's ratio (Muon's too)

    # then the evaluation and HellaSwag ask before each batch: a stop saves within seconds
    stopping, last = stop_asked(), iter_num == cfg.max_iters
    evaluating = not stopping and (iter_num % cfg.eval_interval == 0 or last or cfg.eval_only)
    losses = estimate_loss() if evaluating else None  # None: stopped part way
    improved = losses is not None and losses["val"] < best_val_loss  # the same on every rank
    if losses is not None:
        log.eval(iter_num, losses, lr, progress.elapsed())
        best_val_loss = min(best_val_loss, losses["val"])  # never replaced by a worse value
    scoring = hellaswag and not stopping and (iter_num % cfg.hellaswag_interval == 0 or last)
    scored = None
    if scoring:
        scored = score(raw_model, *hellaswag, runtime.device, runtime.autocast_ctx, stop_asked)
    if scored is not None:
        log.hellaswag(iter_num, scored)
    stopping = stopping or (evaluating and losses is None) or (scoring and scored is None)
    due = stopping or (cfg.save_interval and iter_num % cfg.save_interval == 0)
    kept = evaluating and (improved or cfg.always_save_checkpoint)
    saving = iter_num > start_iter and (kept or due)
    saved = None
    if saving and bad_steps:  # the last good checkpoint stays the newest
        print0(f"iter {iter_num}: not saved, the last step was not finite")
    elif saving and losses is not None and not math.isfinite(losses["val"]):
        print0(f"iter {iter_num}: not saved, the val loss is not finite")
    elif saving:
        saved = save(best=improved)
    if evaluating or saving or scoring:
        progress.restart()  # evals and checkpoints are not the training step's
        batches.take_wait_seconds()
    if stopping:
        again = resume_command(sys.argv, os.environ)
        print0(stopped_line(stop.signal, iter_num, saved, (out_dir / "ckpt.pt").is_file(), again))
        break
    if iter_num >= cfg.max_iters or cfg.eval_only:
        break

    with progress.step():
        result = step()
    iter_num += 1
    if profiler:
        profiler.step()

    first = iter_num == start_iter + 1  # logged alone: it includes compilation and warm-up
    if iter_num % cfg.log_interval == 0 or first:
        figures = progress.window(iter_num, batches.take_wait_seconds())
        loss = parallel.mean_over_ranks(result.loss)  # over every micro-batch, on every rank
        seconds = figures["ms_per_iter"] / 1000
        figures |= {"step_loss": loss, "lr": lr, "grad_norm": result.grad_norm.item()}
        precision, peak = runtime.precision, cfg.peak_flops
        figures["mfu"] = mfu(raw_model, sequences, seconds, runtime.device, precision, peak)
        figures["peak_mem_bytes"] = peak_memory_bytes(runtime.device)
        log.step(iter_num, figures, first)

    # the NaN/inf guard: the step skipped its update; too many in a row and the run stops
    bad_steps = bad_steps + 1 if result.skipped else 0
    if result.skipped:
        log.skipped(iter_num, result.loss.item(), result.grad_norm.item(), bad_steps)
        if bad_steps >= cfg.max_bad_steps:
            break  # the error is raised below, once every rank has left torch.distributed

if profiler:
    profiler.stop()  # writes the trace when the run ended inside the profiled window
if summary := progress.summary():
    print0(summary)
log.close()
if lock:
    lock.release()
if ddp:  # every rank together, the group ended before the interpreter ends
    del model, raw_model, optimizer, step  # they hold the process group: close() needs them gone
    parallel.close()
if bad_steps and not stopping:  # a run that ends on non-finite steps has failed, saved or not
    limit = cfg.max_bad_steps if bad_steps >= cfg.max_bad_steps else None  # None: at max_iters
    raise UserError(nonfinite_end(bad_steps, iter_num, out_dir, limit))
