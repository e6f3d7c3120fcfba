"""
Time training iterations (forward, backward, optimizer step) of a configurable GPT.

    python bench.py                                   # GPT-2 (124M) shape, synthetic data, every switch on
    python bench.py --n_layer=4 --n_head=4 --n_embd=128 --block_size=64 --batch_size=12 --compile=false
    python bench.py --dataset=shakespeare_char --block_size=256 --n_layer=6 --n_head=6 --n_embd=384

Each timed iteration is bracketed by device synchronisations; burn_in iterations (compilation, allocator and
kernel warm-up) are timed apart and left out of the median.
"""

import statistics
import time
from pathlib import Path

import torch

from common import TokenBatches, die, peak_memory_bytes, prepare_if_missing, resolve_runtime
from configurator import configure
from model import GPT, GPTConfig

# -----------------------------------------------------------------------------
# model
n_layer = 12
n_head = 12
n_embd = 768
block_size = 1024
vocab_size = 50304
bias = False
dropout = 0.0
attention = "sdpa"  # 'sdpa' or 'manual'
# work
batch_size = 12
dataset = ""  # '' for synthetic tokens, or a dataset under data_dir (prepared on first use)
data_dir = "data"
burn_in = 5  # untimed-for-the-median iterations first
steps = 20  # timed iterations
# system
device = "auto"
dtype = "auto"
tf32 = True
compile = True
seed = 1337
peak_flops = 0.0  # FLOP/s; 0 = look up the device in model.PEAK_TFLOPS
settings = configure(globals())
# -----------------------------------------------------------------------------

if steps < 1 or burn_in < 0:
    die(f"steps must be >= 1 and burn_in >= 0 (got steps={steps}, burn_in={burn_in})")
runtime = resolve_runtime(device, dtype, tf32)
print(runtime.describe())
torch.manual_seed(seed)
if runtime.device_type == "cuda":
    torch.cuda.reset_peak_memory_stats(runtime.device)

if dataset:
    data_path = Path(data_dir) / dataset
    prepare_if_missing(data_path)
    batches = TokenBatches(data_path, batch_size, block_size, runtime.device, seed)
    get_batch = lambda: batches.get("train")  # noqa: E731
else:
    x = torch.randint(vocab_size, (batch_size, block_size), device=runtime.device)
    y = torch.randint(vocab_size, (batch_size, block_size), device=runtime.device)
    get_batch = lambda: (x, y)  # noqa: E731

try:
    config = GPTConfig(
        block_size=block_size,
        vocab_size=vocab_size,
        n_layer=n_layer,
        n_head=n_head,
        n_embd=n_embd,
        dropout=dropout,
        bias=bias,
        attention=attention,
    )
except ValueError as e:
    die(str(e))
model = GPT(config).to(runtime.device)
optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), runtime.device_type)
scaler = runtime.grad_scaler()
print(f"model: {model.get_num_params() / 1e6:.2f}M parameters; batch {batch_size} x {block_size} tokens")
train_model = torch.compile(model) if compile else model


def train_step() -> None:
    X, Y = get_batch()
    with runtime.autocast_ctx():
        _, loss = train_model(X, Y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)


times = []
for i in range(burn_in + steps):
    runtime.synchronize()
    t0 = time.perf_counter()
    train_step()
    runtime.synchronize()
    times.append(time.perf_counter() - t0)
    if i == 0:
        print(f"first iteration (compilation and warm-up): {times[0] * 1000:.1f} ms")

timed = times[burn_in:]
dt = statistics.median(timed)
tokens_per_s = batch_size * block_size / dt
mfu = model.estimate_mfu(batch_size, dt, runtime.precision, peak_flops or None, seq_len=block_size)
mem = peak_memory_bytes(runtime.device)
print(
    f"{len(timed)} iterations: median {dt * 1000:.2f} ms/iter (min {min(timed) * 1000:.2f}, "
    f"max {max(timed) * 1000:.2f}), {tokens_per_s:,.0f} tokens/s, "
    f"MFU {'n/a (unknown peak)' if mfu is None else f'{mfu * 100:.2f}%'}, peak memory {(mem or 0) / 2**20:.0f} MiB"
)
