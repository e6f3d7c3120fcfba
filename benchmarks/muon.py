"""
Muon on this machine: the Newton-Schulz iteration in float32 against bfloat16 (torch.optim.Muon's dtype) at the CPU
demo model's and GPT-2's weight shapes; the time of a training step with adamw and with muon on the CPU demo model
(config/train_shakespeare_char_cpu.py's shape); and, with probe_iters > 0, the loss each reaches in that many steps.

    python benchmarks/muon.py --threads=1                       # all three on the CPU (~15 minutes on 2 cores)
    python benchmarks/muon.py --parts=step --repeats=50
    python benchmarks/muon.py --parts=probe --probe_muon_lrs=0.02 --text=data/shakespeare_char/input.txt
    python benchmarks/muon.py --parts=newton_schulz,step --device=cuda --gpt2_repeats=20

What is compared runs interleaved, repeats times; the timings are medians. The probe's runs see the same batches
and are deterministic on one device.
"""

import inspect
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for its modules

from configurator import configure
from model import GPT, GPTConfig
from nanogpt_perf.errors import UserError, read_user_text
from nanogpt_perf.optim import NS_COEFFICIENTS, NS_EPS, NS_STEPS, build_optimizer, orthogonalize, set_lr
from nanogpt_perf.rules import a_path, above, at_least, list_of
from nanogpt_perf.runtime import device_problem, resolve_device


def positive_numbers(value: str) -> str | None:
    """A comma-separated list of numbers > 0 ('' for none)."""
    try:
        return None if all(float(v) > 0 for v in value.split(",") if v) else "a list of numbers > 0"
    except ValueError:
        return "a comma-separated list of numbers > 0"


# -----------------------------------------------------------------------------
parts = "newton_schulz,step,probe"
repeats = 7  # interleaved rounds for the Newton-Schulz and step timings
gpt2_repeats = 1  # GPT-2's shapes (0: left out) take a minute each in bfloat16 on a CPU without bf16 units
n_layer, n_head, n_embd, block_size, batch_size, vocab_size = 4, 4, 128, 64, 16, 65  # the CPU demo model
learning_rate = 2e-3  # the CPU demo's AdamW
beta2 = 0.99
weight_decay = 0.1
muon_lr = 0.02
probe_iters = 300
probe_adamw_lrs = "0.002"  # AdamW's lrs tried alone (learning_rate is AdamW's share under Muon)
probe_muon_lrs = "0.01,0.02,0.04"  # Muon's lrs tried with adjust_lr_fn 'original'
probe_rms_lrs = "0.002,0.004"  # and with 'match_rms_adamw'
text = ""  # a text file for the probe (characters are tokens); '' = the source of some of Python's own modules
device = "cpu"
threads = 0  # torch's CPU threads; 0 = torch's default (one per core). 1 is steadier on a busy machine
settings = configure(
    globals(),
    rules={
        "parts": list_of("newton_schulz", "step", "probe"),
        **dict.fromkeys(("repeats", "n_layer", "n_head", "n_embd"), at_least(1)),
        "gpt2_repeats": at_least(0),
        **dict.fromkeys(("block_size", "batch_size", "vocab_size"), at_least(2)),
        **dict.fromkeys(("learning_rate", "beta2", "muon_lr"), above(0)),
        "weight_decay": at_least(0),
        "probe_iters": at_least(0),
        **dict.fromkeys(("probe_adamw_lrs", "probe_muon_lrs", "probe_rms_lrs"), positive_numbers),
        "text": lambda v: a_path(v) if v else None,
        "device": device_problem,
        "threads": at_least(0),
    },
)
# -----------------------------------------------------------------------------
device = resolve_device(device)
if threads:
    torch.set_num_threads(threads)
DEMO_SHAPES = [(3 * n_embd, n_embd), (n_embd, n_embd), (4 * n_embd, n_embd), (n_embd, 4 * n_embd)]
GPT2_SHAPES = [(2304, 768), (768, 768), (3072, 768), (768, 3072)]


def sync() -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def seconds(fn: Callable[[], object]) -> float:
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def newton_schulz() -> None:
    threads = torch.get_num_threads()
    print(f"Newton-Schulz ({NS_STEPS} steps) of one gradient, ms (median, interleaved, {threads} threads):")
    dtypes = (torch.float32, torch.bfloat16)
    for d in dtypes:  # warm-up
        orthogonalize(torch.randn(64, 64, device=device), NS_COEFFICIENTS, NS_STEPS, NS_EPS, d)
    for shapes, rounds in ((DEMO_SHAPES, repeats), (GPT2_SHAPES, gpt2_repeats)):
        for rows, cols in shapes if rounds else ():
            G = torch.randn(rows, cols, device=device)
            runs = [lambda d=d, G=G: orthogonalize(G, NS_COEFFICIENTS, NS_STEPS, NS_EPS, d) for d in dtypes]
            times = [[seconds(run) for run in runs] for _ in range(rounds)]
            fp32, bf16 = (statistics.median(ts) * 1e3 for ts in zip(*times, strict=True))
            print(f"  {rows:>4} x {cols:<4} float32 {fp32:8.2f}  bfloat16 {bf16:8.2f}  bf16/fp32 {bf16 / fp32:.2f}")


def demo_model() -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size, vocab_size=vocab_size)
    return GPT(config).to(device)


def optimizer_for(model: GPT, kind: str) -> torch.optim.Optimizer:
    return build_optimizer(model, kind, learning_rate=learning_rate, weight_decay=weight_decay, betas=(0.9, beta2),
                           muon_lr=muon_lr)  # fmt: skip


def step_times() -> None:
    runs = {kind: (model := demo_model(), optimizer_for(model, kind)) for kind in ("adamw", "muon")}
    x = torch.randint(vocab_size, (batch_size, block_size + 1), device=device)
    figures: dict[str, dict[str, list[float]]] = {kind: {"step": [], "optimizer": []} for kind in runs}
    for r in range(repeats + 2):  # two rounds warm up
        for kind, (model, optimizer) in runs.items():
            t0 = time.perf_counter()
            _, loss = model(x[:, :-1], x[:, 1:])
            loss.backward()
            sync()
            t1 = time.perf_counter()
            optimizer.step()
            sync()
            t2 = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            if r >= 2:
                figures[kind]["step"].append(t2 - t0)
                figures[kind]["optimizer"].append(t2 - t1)
    print(f"training step of the demo model ({n_layer}x{n_embd}, batch {batch_size}x{block_size}), ms (median):")
    medians = {kind: {k: statistics.median(v) * 1e3 for k, v in f.items()} for kind, f in figures.items()}
    for kind, m in medians.items():
        print(f"  {kind:6} step {m['step']:8.2f}  of which optimizer.step() {m['optimizer']:7.2f}")
    print(f"  muon/adamw: step {medians['muon']['step'] / medians['adamw']['step']:.2f}x")


def probe_text() -> str:
    """--text, or the source of some of Python's modules; a UserError where --text cannot be read as UTF-8 or is too
    short for a window in each split (the held-out tenth too)."""
    if not text:
        import collections
        import json
        import os

        return "".join(inspect.getsource(module) for module in (os, json, collections, inspect, statistics))
    chars = read_user_text(Path(text), "the probe's text")
    least = 10 * (block_size + 2)  # its held-out tenth must hold a window of block_size + 1 and a start
    if len(chars) < least:
        raise UserError(f"the probe's text {text} has {len(chars):,} characters: it needs {least:,} at least")
    return chars


PROBE_TEXT = probe_text() if "probe" in parts and probe_iters else ""  # read first: a bad --text stops all at once


def probe() -> None:
    """Each optimizer trains the demo model's shape for probe_iters steps (warmup, cosine decay to a tenth) on the
    same batches; the loss over the same held-out batches at the end."""
    chars = PROBE_TEXT
    vocab = sorted(set(chars))
    index = {c: i for i, c in enumerate(vocab)}
    ids = torch.tensor([index[c] for c in chars])
    split = int(0.9 * len(ids))
    gen = torch.Generator().manual_seed(1)
    windows = lambda data, n: torch.stack(
        [data[i : i + block_size + 1] for i in torch.randint(len(data) - block_size - 1, (n,), generator=gen)]
    )
    train = [windows(ids[:split], batch_size).to(device) for _ in range(probe_iters)]
    val = windows(ids[split:], 20 * batch_size).to(device)
    print(
        f"probe: {len(ids):,} characters ({len(vocab)} distinct), {probe_iters} steps, val loss over {len(val)} windows"
    )
    runs = [("adamw", float(lr), None) for lr in probe_adamw_lrs.split(",") if lr]
    runs += [("muon", float(lr), "original") for lr in probe_muon_lrs.split(",") if lr]
    runs += [("muon", float(lr), "match_rms_adamw") for lr in probe_rms_lrs.split(",") if lr]
    for kind, lr, adjust in runs:
        t0 = time.perf_counter()
        loss = train_probe(kind, lr, adjust, len(vocab), train, val)
        print(f"  {kind:6} lr {lr:<6g} {adjust or '':16} val loss {loss:.4f}  ({time.perf_counter() - t0:.0f} s)")


def train_probe(kind: str, lr: float, adjust: str | None, vocab: int, train: list, val: torch.Tensor) -> float:
    torch.manual_seed(0)
    config = GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size, vocab_size=vocab)
    model = GPT(config).to(device)
    peak = lr if kind == "adamw" else learning_rate  # AdamW's lr, alone or as Muon's partner
    optimizer = build_optimizer(model, kind, learning_rate=peak, weight_decay=weight_decay, betas=(0.9, beta2),
                                muon_lr=lr)  # fmt: skip
    for group in optimizer.param_groups:
        if group.get("muon"):
            group["adjust_lr_fn"] = adjust
    warmup = max(1, probe_iters // 10)
    for it, batch in enumerate(train):
        ratio = (it + 1) / warmup if it < warmup else 0.1 + 0.45 * (1 + math.cos(math.pi * it / probe_iters))
        set_lr(optimizer, peak * ratio, peak)
        _, loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():
        return sum(model(v[:, :-1], v[:, 1:])[1].item() for v in val.split(batch_size)) / len(val.split(batch_size))


for part in parts.split(","):
    {"newton_schulz": newton_schulz, "step": step_times, "probe": probe if probe_iters else lambda: None}[
        part.strip()
    ]()
