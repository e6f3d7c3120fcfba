"""
Train a GPT, on one device or many, from scratch or resumed. Read it top to bottom: every performance switch is
applied where its comment says.

    python train.py config/train_shakespeare_char_cpu.py              # a baby GPT on CPU in about a minute
    python train.py config/train_shakespeare_char.py --compile=false  # nanoGPT's configs and flags run unchanged
    torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2.py
"""

import math
import os
import sys
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

from configurator import configure_command
from model import GPT
from nanogpt_perf.bench.autobatch import micro_batch, step_shape
from nanogpt_perf.data.dataset import dataset_vocab_size, prepare_if_missing
from nanogpt_perf.data.loader import TokenBatches
from nanogpt_perf.data.token_check import check_token_ids
from nanogpt_perf.data.tokenizer import Tokenizer, tokenizer_spec
from nanogpt_perf.errors import UserError
from nanogpt_perf.files import write_json
from nanogpt_perf.gpt2_weights import HF_HUB_NAMES, load_gpt2
from nanogpt_perf.hellaswag import download_val, read_examples, score
from nanogpt_perf.manifest import run_manifest
from nanogpt_perf.memory import peak_memory_bytes
from nanogpt_perf.peak_flops import mfu
from nanogpt_perf.profiling import step_profiler
from nanogpt_perf.rules import a_path, at_least, init_from_one_of, not_above, one_of, or_word, settings_problem
from nanogpt_perf.runtime import dtype_problem, resolve_device, resolve_runtime

# the model's shape, AdamW and every performance switch: shared with bench.py (one name, default, meaning and rule
# each; `python train.py --help` lists them), overridden by config files and flags like the settings below
from nanogpt_perf.settings import *  # noqa: F403
from nanogpt_perf.train.checkpoint import restore_training, resume_checkpoint, save_iteration, training_state
from nanogpt_perf.train.ownership import claim_out_dir, last_checkpoint, out_dir_problem
from nanogpt_perf.train.parallel import (
    PARALLELISMS,
    close,
    full_state,
    mean_over_ranks,
    start_ranks,
    torchrun_rank,
    unwrap,
    wrap_model,
)
from nanogpt_perf.train.preemption import StopRequest, resume_command, stopped_line
from nanogpt_perf.train.progress import Progress, RunLog, import_wandb
from nanogpt_perf.train.resume import nothing_to_train, resume_settings, rng_state, set_rng_state
from nanogpt_perf.train.step import TrainStep

# -----------------------------------------------------------------------------
# settings of train.py alone: defaults train GPT-2 (124M); config files and --key=value flags override them
# I/O
out_dir = "out"
eval_interval = 2000
log_interval = 1
eval_iters = 200  # batches per split at each eval: the same fixed windows every time
eval_only = False  # evaluate once and exit
hellaswag_interval = 0  # HellaSwag's accuracy too, every this many iterations and at the end (GPT-2 tokens); 0 = off
hellaswag_file = ""  # a local hellaswag_val.jsonl; '' = download the official one to data/hellaswag/ (once)
hellaswag_examples = 0  # score the first this many examples each time; 0 = all 10,042
always_save_checkpoint = True  # save at every eval, not only when val loss improves
save_interval = 0  # also save every this many iterations, evals or not; 0 = at evals only
keep_last = 3  # checkpoints kept (out_dir/ckpt-NNNNNNN.pt), besides the best (ckpt-best.pt)
init_from = "scratch"  # 'scratch', 'resume' (out_dir/ckpt.pt), gpt2[-medium|-large|-xl] or a transformers folder
overwrite = False  # a new run (not init_from='resume') may replace an earlier run's checkpoints and log in out_dir
resume_fallback = False  # resume from the newest whole checkpoint when ckpt.pt is truncated or corrupt
# wandb logging
wandb_log = False
wandb_project = "owt"
wandb_run_name = "gpt2"
# data
dataset = "openwebtext"  # as nanoGPT; prepare it first (data/openwebtext/prepare.py), or name another
data_dir = "data"  # datasets live in data_dir/dataset: train.bin and val.bin, or llm.c shards (*_train_*.bin)
gradient_accumulation_steps = 5 * 8  # micro-batches per optimizer step, counted across all ranks
batch_size = 12  # micro-batch size per rank, or 'auto': the largest that fits the device (with tokens_per_iter)
tokens_per_iter = 0  # tokens per optimizer step; when set, gradient_accumulation_steps follows from it; 0 = unset
max_iters = 600000  # optimizer steps
# learning rate schedule: linear warmup, then cosine decay to min_lr
decay_lr = True
warmup_iters = 2000
lr_decay_iters = 600000  # ~= max_iters per Chinchilla
min_lr = 6e-5  # ~= learning_rate / 10 per Chinchilla
# system
parallelism = "ddp"  # under torchrun: 'ddp' (a whole model per rank) or 'fsdp' (FSDP2: everything sharded)
backend = "auto"  # DDP backend: 'auto' (nccl on CUDA, gloo on CPU), 'nccl' or 'gloo'
profile = False  # torch.profiler over steps 3-5 (rank 0): a Chrome trace in out_dir/trace.json, the top 20 ops printed
max_bad_steps = 10  # stop after this many steps in a row with a non-finite loss or gradient norm (each skipped)
# the valid values of train.py's own settings, beside the shared ones' (nanogpt_perf/settings.py)
RULES = SHARED_RULES | {
    "out_dir": a_path,
    "eval_interval": at_least(1),
    "log_interval": at_least(1),
    "eval_iters": at_least(1, most=2**31 - 1),  # a tensor of that length
    "hellaswag_interval": at_least(0, " (0 = off)"),
    "hellaswag_examples": at_least(0, " (0 = all)"),
    "save_interval": at_least(0, " (0 = at evals only)"),
    "keep_last": at_least(1),
    "init_from": init_from_one_of("scratch", "resume", *HF_HUB_NAMES),
    "data_dir": a_path,
    "gradient_accumulation_steps": at_least(1),
    "batch_size": or_word("auto", at_least(1)),
    "tokens_per_iter": at_least(0, " (0 = batch_size x gradient_accumulation_steps x block_size)"),
    "max_iters": at_least(0),
    "warmup_iters": at_least(0),
    "lr_decay_iters": at_least(0),
    "min_lr": at_least(0),
    "parallelism": one_of(*PARALLELISMS),
    "backend": one_of("auto", "nccl", "gloo"),
    "max_bad_steps": at_least(1),
}
CROSS = (
    *SHARED_CROSS,
    not_above("warmup_iters", "lr_decay_iters", "decay_lr"),
    not_above("min_lr", "learning_rate", "decay_lr"),
)
settings, given = configure_command(globals(), rules=RULES, cross=CROSS, words={"batch_size": ("auto",)})
# -----------------------------------------------------------------------------

master = torchrun_rank(os.environ) == 0  # rank 0 (or the only process) prints and writes; torchrun's variables checked


def print0(*args: object) -> None:
    if master:
        print(*args, flush=True)


# an out_dir holds one run: refused while another run holds it, and a new run refused where an earlier one left
# checkpoints, unless overwrite=True (these checks only read; the lock is taken once every check has passed)
if master and (problem := out_dir_problem(Path(out_dir), init_from != "resume", overwrite, eval_only)):
    raise UserError(problem)

# resume: the checkpoint's settings are the base, overridden by the config files and flags given now (each change
# printed); its architecture, vocabulary and data cannot change, and it must have iterations left to train
checkpoint = resume_checkpoint(Path(out_dir), resume_fallback) if init_from == "resume" else None
if checkpoint is not None:
    settings, overrides = resume_settings(checkpoint["config"], settings, given, {"batch_size": ("auto",)}, RULES)
    if problem := settings_problem(settings, RULES, CROSS):  # and those between settings, on the new base
        raise UserError(problem)
    globals().update(settings)
    if not eval_only and (problem := nothing_to_train(Path(out_dir), checkpoint["iter_num"], max_iters)):
        raise UserError(problem)
    if overrides:
        print0("resumed settings overridden: " + "; ".join(overrides))

# DDP: torchrun sets RANK; each process drives one device (its own GPU) and sees 1/world of the micro-batches
ranks = start_ranks(device, backend)
device, ddp = ranks.device, ranks.distributed

# device and precision: chosen after the overrides (a resumed run's dtype that this device has not, as nanoGPT saves
# float16 from a CPU run, is auto here); TF32 is set here (CUDA only)
if checkpoint is not None and "dtype" not in given and dtype_problem(resolve_device(device), dtype):
    print0(f"resumed settings: dtype={dtype!r} not applied (not on {device}): auto")
    dtype = settings["dtype"] = "auto"
runtime = resolve_runtime(device, dtype, tf32)
print0(runtime.describe())
torch.manual_seed(seed + ranks.rank)

# data: prepared on first use (a small dataset); its vocabulary
data_path = Path(data_dir) / dataset
if master:
    prepare_if_missing(data_path)
if ddp:
    dist.barrier()
vocab_size = dataset_vocab_size(data_path) or GPT2_VOCAB_SIZE
if master:  # every token id inside the vocabulary (rank 0 reads; its error line ends every rank)
    check_token_ids(data_path, vocab_size)
print0(f"vocab_size {vocab_size} from {data_path}")

# the micro-batch and the accumulation (global, then per rank): as set, or with tokens_per_iter the accumulation
# that makes exactly that many tokens a step, at batch_size or at the largest that fits ('auto': a step tried per
# candidate, once, by nanogpt_perf/bench/autobatch.py)
choose = lambda rows: micro_batch(rows, settings, vocab_size, runtime, print0)  # noqa: E731
batch_size, gradient_accumulation_steps = step_shape(settings, given, ranks.world_size, choose)
settings |= {"batch_size": batch_size, "gradient_accumulation_steps": gradient_accumulation_steps}  # as it runs
if gradient_accumulation_steps % ranks.world_size:
    raise UserError(
        f"gradient_accumulation_steps={gradient_accumulation_steps} is not divisible by {ranks.world_size} ranks"
    )
gradient_accumulation_steps //= ranks.world_size
tokens_per_iter = gradient_accumulation_steps * ranks.world_size * batch_size * block_size
print0(
    f"tokens per iteration: {tokens_per_iter:,} ({gradient_accumulation_steps} micro-batches x "
    f"{ranks.world_size} ranks x {batch_size} x {block_size})"
)

# the batches: in data_order, each rank its own share, built ahead by a background thread into pinned buffers
# (CUDA) and copied without blocking; evaluation reads fixed windows of its own, so the training stream does not
# depend on eval_interval or eval_iters
batches = TokenBatches(
    data_path, batch_size, block_size, runtime.device, seed, ranks.rank, ranks.world_size, data_order, prefetch
)

# model: from scratch (the vocabulary padded to a multiple of pad_vocab), the weights and architecture of
# out_dir/ckpt.pt, or GPT-2's weights; the memory savers and the attention kernel are GPTConfig fields
config = model_config(settings, vocab_size)
if init_from == "scratch":
    model = GPT(config)
elif init_from == "resume":
    model = GPT.from_checkpoint(checkpoint, config)
else:  # GPT-2 weights: a hub name or a folder in transformers' format; the rest of config leaves them as they are
    keep = ("dropout", "attention", "loss_chunk", "loss_impl", "activation_checkpointing")
    model = load_gpt2(init_from, **{k: getattr(config, k) for k in keep})
source = "checkpoint" if init_from == "resume" else init_from
if block_size > model.config.block_size:
    raise UserError(f"block_size={block_size} is larger than the {source}'s {model.config.block_size}")
if vocab_size > model.config.vocab_size:
    raise UserError(
        f"dataset {dataset} has {vocab_size} tokens, more than the {source}'s vocabulary of {model.config.vocab_size}"
    )
if block_size < model.config.block_size:
    model.crop_block_size(block_size)
model_args = asdict(model.config)
print0(f"model: {model.get_num_params() / 1e6:.2f}M parameters, {model_args}")

# onto the device; compiled (in compile_mode) when asked; under torchrun, DDP (a whole model per rank, gradients
# all-reduced in buckets during backward) or, with parallelism='fsdp', FSDP2 (each block's parameters, gradients and
# optimizer state sharded over the ranks, in the dtype's mixed precision)
if compile:
    print0(f"compiling the model, mode {compile_mode} (the first step takes longer)")
model = wrap_model(model, parallelism if ddp else "ddp", runtime, compile, compile_mode)
raw_model = unwrap(model)

# AdamW (fused where the device has the kernel, with fused_adamw) over the wrapped model's parameters (FSDP's are
# shards), a GradScaler active for float16 only; on resume, their states and this rank's place in the data
optimizer = raw_model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), fused=fused_adamw)
scaler = runtime.grad_scaler()
iter_num, best_val_loss, rng = 0, float("inf"), None
if checkpoint is not None:
    iter_num, best_val_loss, rng = restore_training(
        checkpoint, model, optimizer, scaler, batches, ranks.rank, ranks.world_size
    )
checkpoint = None  # free its memory

# the training step that bench.py times too: accumulation, autocast, GradScaler, clipping, DDP's no_sync, and the
# next batch fetched while the device computes
step = TrainStep(model, optimizer, scaler, runtime, batches, gradient_accumulation_steps, grad_clip)


@torch.no_grad()
def estimate_loss() -> dict[str, float]:
    """Mean loss over eval_iters batches of each split (the same windows at every eval), over all ranks."""
    model.eval()
    out = {}
    for split in ("train", "val"):
        losses = torch.zeros(eval_iters, device=runtime.device)
        for k, (X, Y) in enumerate(batches.eval_batches(split, eval_iters)):
            with runtime.autocast_ctx():
                _, loss = model(X, Y)
            losses[k] = loss
        out[split] = mean_over_ranks(losses.mean())
    model.train()
    return out


def get_lr(it: int) -> float:
    """Linear warmup (non-zero from the first step), cosine decay to min_lr, then min_lr."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it >= lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def save(best: bool) -> str | None:
    """Every rank calls it (FSDP gathers its shards): rank 0 writes the checkpoint, with each rank's generators and
    the loader position of the batch it has fetched but not trained on; its name (rank 0)."""
    model_state, optimizer_state = full_state(model, optimizer)
    mine = {"rng": rng_state(runtime.device), "data": step.data_state}
    every_rank = [mine] * ranks.world_size
    if ddp:
        dist.all_gather_object(every_rank, mine)
    if master:
        state = training_state(
            model=model_state, optimizer=optimizer_state, scaler=scaler.state_dict(), model_args=model_args,
            iter_num=iter_num, best_val_loss=best_val_loss, config=settings, tokenizer=tokenizer_spec(data_path),
            ranks=every_rank,
        )  # fmt: skip
        path = save_iteration(state, Path(out_dir), iter_num, best, keep_last)
        print(f"saved checkpoint {path}" + (" (the best so far)" if best else ""))
        return path.name
    return None


# HellaSwag's examples, when asked for: downloaded once (rank 0), scored in GPT-2's tokens by every rank's share
hellaswag = None
if hellaswag_interval:
    tokenizer = Tokenizer.for_dataset(data_path)
    if tokenizer.itos is not None or parallelism == "fsdp" and ddp:
        raise UserError(f"hellaswag_interval needs GPT-2's tokens and no FSDP, not {tokenizer.name} with {parallelism}")
    path = Path(hellaswag_file) if hellaswag_file else Path(data_dir) / "hellaswag" / "hellaswag_val.jsonl"
    if master and not hellaswag_file:
        download_val(path)
    if ddp:
        dist.barrier()
    hellaswag = read_examples(path, hellaswag_examples)

wandb = import_wandb(wandb_log, master)  # the last check

# every check has passed: out_dir is this run's from here (rank 0 holds out_dir/train.lock until it exits; with
# overwrite=True a new run deletes the earlier run's checkpoints and log first), and SIGTERM or Ctrl-C stops the run
# cleanly (finish the step, save, exit)
lock = claim_out_dir(Path(out_dir), master, ddp, overwrite and init_from != "resume")
stop = StopRequest(lock.release if lock else None)

# what made this run (rank 0), and where its records go: stdout, out_dir/log.jsonl and optionally wandb
if master:
    write_json(
        Path(out_dir) / "manifest.json",
        run_manifest(settings, runtime) | {"world_size": ranks.world_size, "model_args": model_args},
    )
log = RunLog(Path(out_dir), master, wandb, dict(project=wandb_project, name=wandb_run_name, config=settings))

# the loop: exactly max_iters optimizer steps, an eval at every eval_interval and at the end, checkpoints when the
# val loss improves (or always_save_checkpoint), every save_interval and when stopped; each logging window timed
# between device synchronisations, evals and checkpoints left out (nanogpt_perf/train/progress.py)
model.train()
profiler = step_profiler(runtime.device, Path(out_dir) / "trace.json") if profile and master else None
if profiler:
    profiler.start()
if rng is not None:
    set_rng_state(rng, runtime.device)  # last, after everything that draws random numbers at start
start_iter, bad_steps, progress = iter_num, 0, Progress(runtime, iter_num, max_iters, tokens_per_iter)
while True:
    lr = get_lr(iter_num) if decay_lr else learning_rate
    for group in optimizer.param_groups:
        group["lr"] = lr

    stopping = stop.requested(ddp, runtime.device)  # every rank the same answer, so that they save together
    evaluating = not stopping and (iter_num % eval_interval == 0 or iter_num == max_iters or eval_only)
    improved = False
    if evaluating:
        losses = estimate_loss()
        log.eval(iter_num, losses, lr, progress.elapsed())
        improved = losses["val"] < best_val_loss  # the same on every rank: the losses are means over all
        best_val_loss = min(best_val_loss, losses["val"])  # never replaced by a worse value
    due = stopping or (save_interval and iter_num % save_interval == 0)
    saving = iter_num > start_iter and ((evaluating and (improved or always_save_checkpoint)) or due)
    saved = None
    if saving and bad_steps:  # the last good checkpoint stays the newest
        print0(f"iter {iter_num}: not saved, the last step was not finite")
    elif saving and evaluating and not math.isfinite(losses["val"]):
        print0(f"iter {iter_num}: not saved, the val loss is not finite")
    elif saving:
        saved = save(best=improved)
    scoring = hellaswag and not stopping and (iter_num % hellaswag_interval == 0 or iter_num == max_iters)
    if scoring:
        log.hellaswag(iter_num, score(raw_model, hellaswag, tokenizer.encode, runtime.device, runtime.autocast_ctx))
    if evaluating or saving or scoring:
        progress.restart()  # evals and checkpoints are not the training step's
        batches.take_wait_seconds()
    if stopping:
        resumable = (Path(out_dir) / "ckpt.pt").is_file()
        print0(stopped_line(stop.signal, iter_num, saved, resumable, resume_command(sys.argv, os.environ)))
        break
    if iter_num >= max_iters or eval_only:
        break

    with progress.step():
        result = step()
    iter_num += 1
    if profiler:
        profiler.step()

    first = iter_num == start_iter + 1  # logged alone: it includes compilation and warm-up
    if iter_num % log_interval == 0 or first:
        figures = progress.window(iter_num, batches.take_wait_seconds())
        loss = mean_over_ranks(result.loss)  # the mean over every micro-batch of the step, on every rank
        seconds, sequences = figures["ms_per_iter"] / 1000, batch_size * gradient_accumulation_steps
        figures |= {"step_loss": loss, "lr": lr, "grad_norm": result.grad_norm.item()}
        figures["mfu"] = mfu(raw_model, sequences, seconds, runtime.device, runtime.precision, peak_flops)
        figures["peak_mem_bytes"] = peak_memory_bytes(runtime.device)
        log.step(iter_num, figures, first)

    # the NaN/inf guard: the step skipped its update; too many in a row and the run stops, its checkpoints intact
    bad_steps = bad_steps + 1 if result.skipped else 0
    if result.skipped:
        log.skipped(iter_num, result.loss.item(), result.grad_norm.item(), bad_steps)
        if bad_steps >= max_bad_steps:
            raise UserError(
                f"{bad_steps} steps in a row with a non-finite loss or gradient norm (max_bad_steps={max_bad_steps})"
                f": stopped at iter {iter_num}; {last_checkpoint(Path(out_dir))}"
            )

if profiler:
    profiler.stop()  # writes the trace when the run ended inside the profiled window
if summary := progress.summary():
    print0(summary)
log.close()
if lock:
    lock.release()
if ddp:
    close()  # every rank together, after collecting FSDP's garbage (see nanogpt_perf/train/parallel.py)
if bad_steps and not stopping:  # a run that ends on non-finite steps has failed, whatever it saved before them
    raise UserError(
        f"the run ended at iter {iter_num} on {bad_steps} non-finite steps, unsaved; {last_checkpoint(Path(out_dir))}"
    )
