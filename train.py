"""
Train a GPT, on one device or many, from scratch or resumed. Read it top to bottom: every performance switch is
applied where its comment says.

    python train.py config/train_shakespeare_char_cpu.py              # a baby GPT on CPU in about a minute
    python train.py config/train_shakespeare_char.py --compile=false  # nanoGPT's configs and flags run unchanged
    torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2.py
"""

import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.distributed as dist

from configurator import configure_command
from model import GPT
from nanogpt_perf.bench.autobatch import HOST_BATCH, micro_batch, step_shape
from nanogpt_perf.data.dataset import dataset_vocab_size, prepare_if_missing
from nanogpt_perf.data.loader import TokenBatches
from nanogpt_perf.data.tokenizer import tokenizer_spec
from nanogpt_perf.errors import die
from nanogpt_perf.gpt2_weights import HF_HUB_NAMES, load_gpt2
from nanogpt_perf.manifest import run_manifest
from nanogpt_perf.memory import peak_memory_bytes
from nanogpt_perf.profiling import step_profiler
from nanogpt_perf.rules import a_path, at_least, init_from_one_of, not_above, one_of, or_word, settings_problem
from nanogpt_perf.runtime import resolve_runtime

# the model's shape, AdamW and every performance switch: shared with bench.py (one name, default and meaning each;
# `python train.py --help` lists them), overridden by config files and flags like the settings below
from nanogpt_perf.settings import *  # noqa: F403
from nanogpt_perf.timing import DeviceClock
from nanogpt_perf.train.checkpoint import resume_checkpoint, save_iteration, unwrap
from nanogpt_perf.train.parallel import PARALLELISMS, close, full_state, load_full_state, wrap_model
from nanogpt_perf.train.preemption import StopRequest
from nanogpt_perf.train.resume import resume_settings, rng_state, set_rng_state
from nanogpt_perf.train.step import TrainStep

# -----------------------------------------------------------------------------
# settings of train.py alone: defaults train GPT-2 (124M); config files and --key=value flags override them
# I/O
out_dir = "out"
eval_interval = 2000
log_interval = 1
eval_iters = 200  # batches per split at each eval: the same fixed windows every time
eval_only = False  # evaluate once and exit
always_save_checkpoint = True  # save at every eval, not only when val loss improves
save_interval = 0  # also save every this many iterations, evals or not; 0 = at evals only
keep_last = 3  # checkpoints kept (out_dir/ckpt-NNNNNNN.pt), besides the best (ckpt-best.pt)
init_from = "scratch"  # 'scratch', 'resume' (out_dir/ckpt.pt), gpt2[-medium|-large|-xl] or a transformers folder
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
    "eval_iters": at_least(1),
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

# resume: the checkpoint's settings are the base, overridden by the config files and flags given now (each change
# printed); its architecture, vocabulary and data cannot change
checkpoint = None
if init_from == "resume":
    checkpoint = resume_checkpoint(Path(out_dir), resume_fallback)
    try:
        settings, overrides = resume_settings(checkpoint["config"], settings, given)
    except ValueError as e:
        die(str(e))
    if problem := settings_problem(settings, RULES, CROSS):  # and those between settings, on the new base
        die(problem)
    globals().update(settings)
    if overrides and os.environ.get("RANK", "0") == "0":
        print("resumed settings overridden: " + "; ".join(overrides))

# DDP: torchrun sets RANK; each process drives one device and sees 1/world of the micro-batches
ddp = "RANK" in os.environ
rank, local_rank, world_size = 0, 0, 1
if ddp:
    rank, local_rank, world_size = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    if device in ("auto", "cuda") and torch.cuda.is_available():
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
    if backend == "auto":
        backend = "nccl" if device.startswith("cuda") else "gloo"
    dist.init_process_group(backend=backend)
master = rank == 0


def print0(*args: object) -> None:
    if master:
        print(*args, flush=True)


# device and precision: chosen after the overrides; TF32 is set here (CUDA only)
runtime = resolve_runtime(device, dtype, tf32)
print0(runtime.describe())
torch.manual_seed(seed + rank)

# data: prepared on first use (a small dataset); its vocabulary
data_path = Path(data_dir) / dataset
if master:
    prepare_if_missing(data_path)
if ddp:
    dist.barrier()
vocab_size = dataset_vocab_size(data_path) or GPT2_VOCAB_SIZE
print0(f"vocab_size {vocab_size} from {data_path}")


def choose_micro_batch(rows: int) -> int:
    """batch_size='auto' for rows sequences per rank and step: a step tried per candidate on this device (see
    nanogpt_perf/bench/autobatch.py); under DDP the smallest that any rank found."""
    chosen = torch.tensor(micro_batch(rows, settings, vocab_size, runtime, print0), device=runtime.device)
    if ddp:
        dist.all_reduce(chosen, op=dist.ReduceOp.MIN)
    cuda = runtime.device_type == "cuda"
    how = "the largest that fits" if cuda else f"no memory limit to find on {runtime.device_type}: at most {HOST_BATCH}"
    print0(f"batch_size auto -> {chosen.item()} ({how} and divides {rows} sequences a step)")
    return int(chosen.item())


# the micro-batch and the accumulation (global, then per rank): as set, or with tokens_per_iter the accumulation
# that makes exactly that many tokens a step, at batch_size or at the largest that fits ('auto', found once)
try:
    batch_size, gradient_accumulation_steps = step_shape(settings, given, world_size, choose_micro_batch)
except ValueError as e:
    die(str(e))
settings |= {"batch_size": batch_size, "gradient_accumulation_steps": gradient_accumulation_steps}  # as it runs
if gradient_accumulation_steps % world_size:
    die(f"gradient_accumulation_steps={gradient_accumulation_steps} is not divisible by {world_size} ranks")
gradient_accumulation_steps //= world_size
tokens_per_iter = gradient_accumulation_steps * world_size * batch_size * block_size
print0(
    f"tokens per iteration: {tokens_per_iter:,} ({gradient_accumulation_steps} micro-batches x {world_size} ranks"
    f" x {batch_size} x {block_size})"
)

# the batches: in data_order, each rank its own share, built ahead by a background thread into pinned buffers
# (CUDA) and copied without blocking; evaluation reads fixed windows of its own, so the training stream does not
# depend on eval_interval or eval_iters
batches = TokenBatches(data_path, batch_size, block_size, runtime.device, seed, rank, world_size, data_order, prefetch)

# model: from scratch (the vocabulary padded to a multiple of pad_vocab), the architecture, weights and progress
# of out_dir/ckpt.pt, or GPT-2's weights; the memory savers and the attention kernel are GPTConfig fields
iter_num, best_val_loss = 0, float("inf")
try:
    config = model_config(settings, vocab_size)
    if init_from == "scratch":
        model = GPT(config)
    elif init_from == "resume":
        architecture = ("n_layer", "n_head", "n_embd", "bias", "vocab_size", "block_size")
        model = GPT(replace(config, **{k: checkpoint["model_args"][k] for k in architecture}))
        model.load_state_dict(checkpoint["model"])
        iter_num, best_val_loss = checkpoint["iter_num"], checkpoint["best_val_loss"]
    else:  # GPT-2 weights: a hub name or a folder in transformers' format; the rest of config leaves them as they are
        keep = ("dropout", "attention", "loss_chunk", "activation_checkpointing")
        model = load_gpt2(init_from, **{k: getattr(config, k) for k in keep})
except ValueError as e:
    die(str(e))
if block_size > model.config.block_size:
    source = "checkpoint" if init_from == "resume" else init_from
    die(f"block_size={block_size} is larger than the {source}'s {model.config.block_size}")
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

# AdamW (fused where the device has the kernel, with fused_adamw) over the wrapped model's parameters (FSDP's are
# shards), and a GradScaler active for float16 only
optimizer = unwrap(model).configure_optimizers(weight_decay, learning_rate, (beta1, beta2), fused=fused_adamw)
scaler = runtime.grad_scaler()
rank_state = None  # this rank's generators and loader, as the checkpoint left them
if checkpoint is not None:
    load_full_state(model, optimizer, None, checkpoint["optimizer"])  # the weights are in already
    if checkpoint.get("scaler"):
        scaler.load_state_dict(checkpoint["scaler"])
    ranks = checkpoint.get("ranks") or [None]
    if len(ranks) != world_size:
        die(f"the checkpoint was saved by {len(ranks)} ranks: resume it with {len(ranks)} (nproc_per_node)")
    rank_state = ranks[rank]
    if rank_state:
        batches.load_state_dict(rank_state["data"])  # before the step fetches its first batch
checkpoint = None  # free its memory
raw_model = unwrap(model)

# the training step that bench.py times too: accumulation, autocast, GradScaler, clipping, DDP's no_sync, and the
# next batch fetched while the device computes
step = TrainStep(model, optimizer, scaler, runtime, batches, gradient_accumulation_steps, grad_clip)


def mean_over_ranks(value: torch.Tensor) -> float:
    if ddp:
        value = value.clone()
        dist.all_reduce(value)  # a sum: gloo has no average
    return value.item() / world_size


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


def hms(seconds: float) -> str:
    minutes, s = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{s:02d}" if minutes >= 60 else f"{minutes}:{s:02d}"


# logging: stdout, out_dir/log.jsonl and optionally wandb, all from rank 0, which also writes what made this run
log_file = None
if master:
    os.makedirs(out_dir, exist_ok=True)
    manifest = run_manifest(settings, runtime) | {"world_size": world_size, "model_args": model_args}
    (Path(out_dir) / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    log_file = open(Path(out_dir) / "log.jsonl", "a")
if wandb_log and master:
    try:
        import wandb
    except ImportError:
        die("wandb_log=True needs wandb: pip install wandb (WANDB_MODE=offline works with no network)")
    wandb.init(project=wandb_project, name=wandb_run_name, config=settings)


def log(record: dict) -> None:
    log_file.write(json.dumps(record) + "\n")
    log_file.flush()
    if wandb_log:
        wandb.log(record, step=record["iter"])


def save(best: bool) -> None:
    """Every rank calls it: rank 0 writes the checkpoint, with each rank's generators and loader position. Never
    during a run of non-finite steps: the last good checkpoint stays the newest."""
    if bad_steps:
        print0(f"iter {iter_num}: not saved, the last step was not finite")
        return
    model_state, optimizer_state = full_state(model, optimizer)  # under FSDP, gathered from every rank
    mine = {"rng": rng_state(runtime.device), "data": step.data_state}  # where the pending batch came from
    ranks = [mine] * world_size
    if ddp:
        dist.all_gather_object(ranks, mine)
    if not master:
        return
    checkpoint = {
        "model": model_state,
        "optimizer": optimizer_state,
        "scaler": scaler.state_dict(),
        "model_args": model_args,
        "iter_num": iter_num,
        "best_val_loss": best_val_loss,
        "config": settings,
        "tokenizer": tokenizer_spec(data_path),  # so that sample.py and export.py need no data folder
        "ranks": ranks,
    }
    path = save_iteration(checkpoint, Path(out_dir), iter_num, best, keep_last)
    print(f"saved checkpoint {path}" + (" (the best so far)" if best else ""))


# the loop: exactly max_iters optimizer steps, with evals at every eval_interval and at the end. Each logging
# window is timed between device synchronisations (evals and checkpoints left out); within it, the clock on the
# device's timeline times the step itself, so that the rest (logging, the schedule, Python) is a figure of its own
model.train()
profiler = step_profiler(runtime.device, Path(out_dir) / "trace.json") if profile and master else None
if profiler:
    profiler.start()
clock = DeviceClock(runtime)
stop = StopRequest()  # SIGTERM or Ctrl-C: finish the step, save, exit
if rank_state:
    set_rng_state(rank_state["rng"], runtime.device)  # last, after everything that draws random numbers at start
start_iter, run_start, steady_since, bad_steps = iter_num, time.perf_counter(), None, 0
window_steps, window_start, step_spans, timings = 0, time.perf_counter(), [], []
while True:
    lr = get_lr(iter_num) if decay_lr else learning_rate
    for group in optimizer.param_groups:
        group["lr"] = lr

    if iter_num % eval_interval == 0 or iter_num == max_iters or eval_only:
        losses = estimate_loss()
        if master:
            print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
            elapsed = time.perf_counter() - run_start
            log(
                {
                    "iter": iter_num,
                    "train_loss": losses["train"],
                    "val_loss": losses["val"],
                    "lr": lr,
                    "elapsed_s": elapsed,
                }
            )
        improved = losses["val"] < best_val_loss  # the same on every rank: the losses are means over all
        best_val_loss = min(best_val_loss, losses["val"])  # never replaced by a worse value
        due = save_interval and iter_num % save_interval == 0
        if iter_num > start_iter and (improved or always_save_checkpoint or due) and math.isfinite(losses["val"]):
            save(best=improved)
        window_steps, window_start, step_spans = 0, time.perf_counter(), []
        batches.take_wait_seconds()  # waits during evaluation are not the training step's
    if iter_num >= max_iters or eval_only:
        break

    t0 = clock.now()
    result = step()
    step_spans.append((t0, clock.now()))
    iter_num += 1
    window_steps += 1
    if profiler:
        profiler.step()

    first_step = iter_num == start_iter + 1  # timed alone: it includes compilation and warm-up
    if iter_num % log_interval == 0 or first_step:
        runtime.synchronize()  # the device runs ahead of Python: wait for it before reading the clock
        now = time.perf_counter()
        dt = (now - window_start) / window_steps
        step_ms = sum(clock.ms(a, b) for a, b in step_spans) / window_steps
        wait_ms = batches.take_wait_seconds() * 1000 / window_steps  # the step's wait for the loader
        loss = mean_over_ranks(result.loss)  # the mean over every micro-batch of the step, on every rank
        if not first_step:
            timings.append((dt * 1000, step_ms, wait_ms))
        steady_since = steady_since or (now, iter_num)  # the ETA leaves out the first step
        rate = (now - steady_since[0]) / (iter_num - steady_since[1]) if iter_num > steady_since[1] else dt
        if master:
            mfu = raw_model.estimate_mfu(batch_size * gradient_accumulation_steps, dt, runtime.precision, peak_flops)
            mem = peak_memory_bytes(runtime.device)
            record = {
                "iter": iter_num,
                "step_loss": loss,
                "lr": lr,
                "ms_per_iter": dt * 1000,
                "step_ms": step_ms,
                "data_wait_ms": wait_ms,
                "tokens_per_s": tokens_per_iter / dt,
                "mfu": mfu,
                "peak_mem_bytes": mem,
                "grad_norm": result.grad_norm.item(),
                "elapsed_s": now - run_start,
                "eta_s": rate * (max_iters - iter_num),
            }
            first = " (first step: includes compilation and warm-up)" if first_step else ""
            print(
                f"iter {iter_num}: step loss {loss:.4f}, {dt * 1000:.2f} ms/iter, {tokens_per_iter / dt:,.0f} tok/s, "
                f"MFU {'n/a' if mfu is None else f'{mfu * 100:.2f}%'}, peak mem {(mem or 0) / 2**20:.0f} MiB"
                + f", grad norm {record['grad_norm']:.3f}"
                + f", data wait {wait_ms:.2f} ms, elapsed {hms(record['elapsed_s'])}, ETA {hms(record['eta_s'])}{first}"
            )
            log(record)
        window_steps, window_start, step_spans = 0, now, []  # this logging counts in the next window

    # the NaN/inf guard: the step skipped its update; too many in a row and the run stops, its checkpoints intact
    bad_steps = bad_steps + 1 if result.skipped else 0
    if result.skipped:
        print0(f"iter {iter_num}: non-finite loss or gradient norm, update skipped ({bad_steps} in a row)")
        if master:
            log({"iter": iter_num, "skipped": True, "loss": result.loss.item(), "grad_norm": result.grad_norm.item()})
        if bad_steps >= max_bad_steps:
            die(
                f"{bad_steps} steps in a row with a non-finite loss or gradient norm (max_bad_steps={max_bad_steps})"
                f": stopped at iter {iter_num}; the last checkpoint in {out_dir} is from before them"
            )
    evaluates_next = iter_num % eval_interval == 0 or iter_num == max_iters  # and saves there when due
    if save_interval and iter_num % save_interval == 0 and not evaluates_next:
        save(best=False)
    if stop.requested(ddp, runtime.device):  # every rank the same answer, so that they save together
        save(best=False)
        command = "python " + " ".join(
            [a for a in sys.argv if not a.startswith("--init_from=")] + ["--init_from=resume"]
        )
        print0(f"stopped by {stop.signal or 'another rank'} after iter {iter_num}, saved: resume with\n  {command}")
        break

if profiler:
    profiler.stop()  # writes the trace when the run ended inside the profiled window
if timings:
    ms, in_step, wait = (statistics.median(t[i] for t in timings) for i in range(3))
    around = statistics.median(t - s for t, s, _ in timings)
    print0(
        f"timing: median {ms:.2f} ms/iter over {len(timings)} logging windows (the first step left out, "
        f"{tokens_per_iter / ms * 1000:,.0f} tok/s): the training step {in_step:.2f} ms (of which waiting for data "
        f"{wait:.3f} ms, {wait / in_step:.1%}), the loop around it {around:.2f} ms (logging, the schedule, Python)"
    )
if master:
    log_file.close()
if ddp:
    close()  # every rank together, after collecting FSDP's garbage (see nanogpt_perf/train/parallel.py)
