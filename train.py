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
import pickle
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from common import (
    TokenBatches,
    die,
    load_checkpoint,
    peak_memory_bytes,
    prepare_if_missing,
    print0,
    resolve_runtime,
    round_up,
    run_manifest,
    save_checkpoint,
    step_profiler,
    unwrap,
)
from configurator import configure
from model import GPT, GPTConfig

# -----------------------------------------------------------------------------
# settings: defaults train GPT-2 (124M); config files and --key=value flags override them
# I/O
out_dir = "out"
eval_interval = 2000
log_interval = 1
eval_iters = 200
eval_only = False  # evaluate once and exit
always_save_checkpoint = True  # save at every eval, not only when val loss improves
init_from = "scratch"  # 'scratch', 'resume' (out_dir/ckpt.pt), gpt2[-medium|-large|-xl] or a transformers folder
# wandb logging
wandb_log = False
wandb_project = "owt"
wandb_run_name = "gpt2"
# data
dataset = "shakespeare_char"
data_dir = "data"  # datasets live in data_dir/dataset/{train,val}.bin
gradient_accumulation_steps = 5 * 8  # micro-batches per optimizer step, counted across all ranks
batch_size = 12  # micro-batch size per rank
block_size = 1024
# model
n_layer = 12
n_head = 12
n_embd = 768
dropout = 0.0  # 0 for pretraining, try 0.1+ for fine-tuning
bias = False  # biases in Linears and LayerNorms
attention = "sdpa"  # 'sdpa' (flash attention where available) or 'manual' (the reference)
pad_vocab = 64  # vocab_size rounded up to a multiple of this (50257 -> 50304) for faster matmuls; 1 = off
# memory savers: both trade compute for memory
loss_chunk = 0  # rows per chunk of a chunked lm_head + cross-entropy that never holds the full logits; 0 = off
activation_checkpointing = False  # recompute each block's activations in backward instead of keeping them
# AdamW
learning_rate = 6e-4
max_iters = 600000  # optimizer steps
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0  # clip the gradient norm to this; 0.0 = off
# learning rate schedule: linear warmup, then cosine decay to min_lr
decay_lr = True
warmup_iters = 2000
lr_decay_iters = 600000  # ~= max_iters per Chinchilla
min_lr = 6e-5  # ~= learning_rate / 10 per Chinchilla
# system
backend = "auto"  # DDP backend: 'auto' (nccl on CUDA, gloo on CPU), 'nccl' or 'gloo'
device = "auto"  # 'auto' (cuda, then mps, then cpu), 'cpu', 'cuda', 'cuda:1', 'mps'
dtype = "auto"  # 'auto' (bf16 if supported, else fp16 with GradScaler; fp32 on CPU), 'float32', 'bfloat16', 'float16'
tf32 = True  # TF32 matmuls for the float32 work (CUDA only)
compile = True  # torch.compile the model
seed = 1337
peak_flops = 0.0  # the device's peak FLOP/s for MFU; 0 = look it up in model.PEAK_TFLOPS
profile = False  # torch.profiler over steps 3-5 (rank 0): a Chrome trace in out_dir/trace.json, the top 20 ops printed
settings = configure(globals())
# -----------------------------------------------------------------------------

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
    if gradient_accumulation_steps % world_size:
        die(f"gradient_accumulation_steps={gradient_accumulation_steps} is not divisible by {world_size} ranks")
    gradient_accumulation_steps //= world_size
master = rank == 0

# device and precision: chosen after the overrides; TF32 is set here (CUDA only)
runtime = resolve_runtime(device, dtype, tf32)
print0(runtime.describe())
torch.manual_seed(seed + rank)
tokens_per_iter = gradient_accumulation_steps * world_size * batch_size * block_size
print0(
    f"tokens per iteration: {tokens_per_iter:,} ({gradient_accumulation_steps} micro-batches x {world_size} ranks"
    f" x {batch_size} x {block_size})"
)

# data: prepared on first use; random windows of block_size + 1 tokens, staged in pinned memory on CUDA
data_path = Path(data_dir) / dataset
if master:
    prepare_if_missing(data_path)
if ddp:
    dist.barrier()
batches = TokenBatches(data_path, batch_size, block_size, runtime.device, seed + rank)

meta_path = data_path / "meta.pkl"
meta_vocab_size = None
if meta_path.is_file():
    with open(meta_path, "rb") as f:
        meta_vocab_size = pickle.load(f)["vocab_size"]
    print0(f"vocab_size {meta_vocab_size} from {meta_path}")

# model: from scratch, or the architecture, weights and progress of out_dir/ckpt.pt
model_args = dict(
    n_layer=n_layer,
    n_head=n_head,
    n_embd=n_embd,
    block_size=block_size,
    bias=bias,
    dropout=dropout,
    attention=attention,
    loss_chunk=loss_chunk,
    activation_checkpointing=activation_checkpointing,
)
iter_num, best_val_loss, checkpoint = 0, float("inf"), None
if init_from == "scratch":
    vocab_size = meta_vocab_size or 50257
    if pad_vocab < 1:
        die(f"pad_vocab must be >= 1 (1 = no padding), not {pad_vocab}")
    model_args["vocab_size"] = round_up(vocab_size, pad_vocab)
elif init_from == "resume":
    checkpoint = load_checkpoint(Path(out_dir) / "ckpt.pt", runtime.device)
    for k in ("n_layer", "n_head", "n_embd", "bias", "vocab_size", "block_size"):
        model_args[k] = checkpoint["model_args"][k]  # the architecture is the checkpoint's
    iter_num, best_val_loss = checkpoint["iter_num"], checkpoint["best_val_loss"]
try:
    if init_from in ("scratch", "resume"):
        model = GPT(GPTConfig(**model_args))
    else:  # GPT-2 weights: a hub name or a folder in transformers' format
        keep = ("dropout", "attention", "loss_chunk", "activation_checkpointing")  # the rest is the weights'
        model = GPT.from_pretrained(init_from, **{k: model_args[k] for k in keep})
        model_args = {k: getattr(model.config, k) for k in model_args} | {"vocab_size": model.config.vocab_size}
except ValueError as e:
    die(str(e))
if checkpoint is not None:
    model.load_state_dict(checkpoint["model"])
if block_size > model.config.block_size:
    source = "checkpoint" if init_from == "resume" else init_from
    die(f"block_size={block_size} is larger than the {source}'s {model.config.block_size}")
if block_size < model.config.block_size:
    model.crop_block_size(block_size)
    model_args["block_size"] = block_size
model.to(runtime.device)
print0(f"model: {model.get_num_params() / 1e6:.2f}M parameters, {model_args}")

# optimizer, and a GradScaler that is active for float16 only
optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), runtime.device_type)
scaler = runtime.grad_scaler()
if checkpoint is not None:
    optimizer.load_state_dict(checkpoint["optimizer"])
    if checkpoint.get("scaler"):
        scaler.load_state_dict(checkpoint["scaler"])
checkpoint = None  # free its memory

# compile, then wrap for DDP (gradients all-reduced in buckets during backward)
if compile:
    print0("compiling the model (the first step takes longer)")
    model = torch.compile(model)
if ddp:
    model = DDP(model, device_ids=[local_rank] if runtime.device_type == "cuda" else None)
raw_model = unwrap(model)


@torch.no_grad()
def estimate_loss() -> dict[str, float]:
    """Mean loss over eval_iters batches of each split, averaged over all ranks."""
    model.eval()
    out = {}
    for split in ("train", "val"):
        losses = torch.zeros(eval_iters, device=runtime.device)
        for k in range(eval_iters):
            X, Y = batches.get(split)
            with runtime.autocast_ctx():
                _, loss = model(X, Y)
            losses[k] = loss
        total = losses.mean()
        if ddp:
            dist.all_reduce(total)  # a sum: gloo has no average
        out[split] = total.item() / world_size
    model.train()
    return out


def get_lr(it: int) -> float:
    """Linear warmup (non-zero from the first step), cosine decay to min_lr, then min_lr."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


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


# the loop: exactly max_iters optimizer steps, with evals at every eval_interval and at the end
X, Y = batches.get("train")  # the first batch; each later one is fetched while the device computes
model.train()
profiler = step_profiler(runtime.device, Path(out_dir) / "trace.json") if profile and master else None
if profiler:
    profiler.start()
timed_steps, t0, first_step = 0, time.perf_counter(), True
while True:
    lr = get_lr(iter_num) if decay_lr else learning_rate
    for group in optimizer.param_groups:
        group["lr"] = lr

    if iter_num % eval_interval == 0 or iter_num == max_iters or eval_only:
        losses = estimate_loss()
        if master:
            print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
            log({"iter": iter_num, "train_loss": losses["train"], "val_loss": losses["val"], "lr": lr})
            improved = losses["val"] < best_val_loss
            best_val_loss = min(best_val_loss, losses["val"])  # never replaced by a worse value
            if iter_num > 0 and (improved or always_save_checkpoint):
                checkpoint = {
                    "model": raw_model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scaler": scaler.state_dict(),
                    "model_args": model_args,
                    "iter_num": iter_num,
                    "best_val_loss": best_val_loss,
                    "config": settings,
                }
                save_checkpoint(checkpoint, Path(out_dir) / "ckpt.pt")
                print(f"saved checkpoint to {out_dir}/ckpt.pt")
        timed_steps, t0 = 0, time.perf_counter()  # step time excludes eval and checkpointing
    if iter_num >= max_iters or eval_only:
        break

    # one optimizer step over gradient_accumulation_steps micro-batches; DDP syncs gradients on the last only
    for micro_step in range(gradient_accumulation_steps):
        last = micro_step == gradient_accumulation_steps - 1
        with model.no_sync() if ddp and not last else nullcontext():
            with runtime.autocast_ctx():
                _, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps  # the mean over micro-batches, not the sum
            X, Y = batches.get("train")  # prefetch while the device runs the forward pass
            scaler.scale(loss).backward()
    if grad_clip > 0.0:
        scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
    timed_steps += 1
    if profiler:
        profiler.step()

    if iter_num % log_interval == 0 or first_step:  # the first step is timed alone: it includes compilation
        runtime.synchronize()  # the device runs ahead of Python: wait for it before reading the clock
        dt = (time.perf_counter() - t0) / timed_steps
        if master:
            lossf = loss.item() * gradient_accumulation_steps
            mfu = raw_model.estimate_mfu(
                batch_size * gradient_accumulation_steps, dt, runtime.precision, peak_flops or None
            )
            mem = peak_memory_bytes(runtime.device)
            record = {
                "iter": iter_num,
                "loss": lossf,
                "lr": lr,
                "ms_per_iter": dt * 1000,
                "tokens_per_s": tokens_per_iter / dt,
                "mfu": mfu,
                "peak_mem_bytes": mem,
            }
            if grad_clip > 0.0:
                record["grad_norm"] = grad_norm.item()
            first = " (first step: includes compilation and warm-up)" if first_step else ""
            print(
                f"iter {iter_num}: loss {lossf:.4f}, {dt * 1000:.2f} ms/iter, {tokens_per_iter / dt:,.0f} tok/s, "
                f"MFU {'n/a' if mfu is None else f'{mfu * 100:.2f}%'}, peak mem {(mem or 0) / 2**20:.0f} MiB"
                + (f", grad norm {record['grad_norm']:.3f}" if grad_clip > 0.0 else "")
                + first
            )
            log(record)
        timed_steps, t0, first_step = 0, time.perf_counter(), False

if profiler:
    profiler.stop()  # writes the trace when the run ended inside the profiled window
if master:
    log_file.close()
if ddp:
    dist.destroy_process_group()
