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
from dataclasses import dataclass, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for its modules

from configurator import configure
from model import GPT, GPTConfig
from nanogpt_perf.config import Config, setting
from nanogpt_perf.errors import UserError
from nanogpt_perf.files import read_user_text
from nanogpt_perf.guard.paths import a_path, comma_separated
from nanogpt_perf.optim import NS_COEFFICIENTS, NS_EPS, NS_STEPS, OptimConfig, build_optimizer, orthogonalize, set_lr
from nanogpt_perf.runtime import DeviceConfig, resolve_device


def positive_numbers(value: str) -> None:
    """A comma-separated list of numbers > 0 ('' for none)."""
    try:
        numbers = [float(v) for v in value.split(",") if v]
    except ValueError:
        raise ValueError("a comma-separated list of numbers > 0") from None
    if not all(n > 0 for n in numbers):
        raise ValueError("a list of numbers > 0")


# -----------------------------------------------------------------------------
@dataclass
class MuonBenchConfig:
    """Settings of benchmarks/muon.py: the parts run, their repeats, the demo model's batches and the probe"""

    parts: str = setting("newton_schulz,step,probe", "the parts to run",
                         check=comma_separated("newton_schulz", "step", "probe"))  # fmt: skip
    repeats: int = setting(7, "interleaved rounds for the Newton-Schulz and step timings; at most 1,000", min=1,
                           max=1_000)  # fmt: skip
    gpt2_repeats: int = setting(1, "GPT-2's shapes (0: left out) take a minute each in bfloat16 on a CPU without bf16 "
                                "units; at most 100", min=0, max=100)  # fmt: skip
    batch_size: int = setting(16, "the demo model's batch", min=2)
    vocab_size: int = setting(65, "the demo model's vocabulary for the step timings (the probe's is its text's)",
                              min=2)  # fmt: skip
    probe_iters: int = setting(300, "steps of each probe run; 0 = no probe; at most 100,000 (a run shows nothing "
                               "until it ends)", min=0, max=100_000)  # fmt: skip
    probe_adamw_lrs: str = setting("0.002", "AdamW's lrs tried alone (learning_rate is AdamW's share under Muon)",
                                   check=positive_numbers)  # fmt: skip
    probe_muon_lrs: str = setting("0.01,0.02,0.04", "Muon's lrs tried with adjust_lr_fn 'original'",
                                  check=positive_numbers)  # fmt: skip
    probe_rms_lrs: str = setting("0.002,0.004", "and with 'match_rms_adamw'", check=positive_numbers)
    text: str = setting("", "a text file for the probe (characters are tokens); '' = the source of some of Python's "
                        "own modules", check=lambda v: a_path(v) if v else None)  # fmt: skip
    threads: int = setting(0, "torch's CPU threads; 0 = torch's default (one per core). 1 is steadier on a busy "
                           "machine", min=0)  # fmt: skip


def adamw_lr_above_zero(cfg: Config) -> None:
    """Both optimizers run: Muon's schedule scales muon_lr by the ratio to learning_rate."""
    if cfg.learning_rate <= 0:
        raise ValueError(f"learning_rate must be > 0, not {cfg.learning_rate}")


# the model is model.py's GPTConfig at the CPU demo's shape (config/train_shakespeare_char_cpu.py); the optimizers'
# settings are nanogpt_perf/optim.py's at the CPU demo's AdamW (both optimizers run: optimizer itself is not used)
cfg = configure(
    muon=MuonBenchConfig, model=GPTConfig, optim=OptimConfig, hardware=DeviceConfig, cross=(adamw_lr_above_zero,),
    defaults={"n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 64, "learning_rate": 2e-3, "beta2": 0.99,
              "device": "cpu"},
)  # fmt: skip
# -----------------------------------------------------------------------------
device = resolve_device(cfg.device)
if cfg.threads:
    torch.set_num_threads(cfg.threads)
C = cfg.n_embd
DEMO_SHAPES = [(3 * C, C), (C, C), (4 * C, C), (C, 4 * C)]
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
    for shapes, rounds in ((DEMO_SHAPES, cfg.repeats), (GPT2_SHAPES, cfg.gpt2_repeats)):
        for rows, cols in shapes if rounds else ():
            G = torch.randn(rows, cols, device=device)
            runs = [lambda d=d, G=G: orthogonalize(G, NS_COEFFICIENTS, NS_STEPS, NS_EPS, d) for d in dtypes]
            times = [[seconds(run) for run in runs] for _ in range(rounds)]
            fp32, bf16 = (statistics.median(ts) * 1e3 for ts in zip(*times, strict=True))
            print(f"  {rows:>4} x {cols:<4} float32 {fp32:8.2f}  bfloat16 {bf16:8.2f}  bf16/fp32 {bf16 / fp32:.2f}")


def demo_model() -> GPT:
    torch.manual_seed(0)
    return GPT(replace(cfg.model, vocab_size=cfg.vocab_size)).to(device)


def optimizer_for(model: GPT, kind: str) -> torch.optim.Optimizer:
    return build_optimizer(model, replace(cfg.optim, optimizer=kind))


def step_times() -> None:
    runs = {kind: (model := demo_model(), optimizer_for(model, kind)) for kind in ("adamw", "muon")}
    x = torch.randint(cfg.vocab_size, (cfg.batch_size, cfg.block_size + 1), device=device)
    figures: dict[str, dict[str, list[float]]] = {kind: {"step": [], "optimizer": []} for kind in runs}
    for r in range(cfg.repeats + 2):  # two rounds warm up
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
    shape = f"{cfg.n_layer}x{cfg.n_embd}, batch {cfg.batch_size}x{cfg.block_size}"
    print(f"training step of the demo model ({shape}), ms (median):")
    medians = {kind: {k: statistics.median(v) * 1e3 for k, v in f.items()} for kind, f in figures.items()}
    for kind, m in medians.items():
        print(f"  {kind:6} step {m['step']:8.2f}  of which optimizer.step() {m['optimizer']:7.2f}")
    print(f"  muon/adamw: step {medians['muon']['step'] / medians['adamw']['step']:.2f}x")


def probe_text() -> str:
    """--text, or the source of some of Python's modules; a UserError where --text cannot be read as UTF-8 or is too
    short for a window in each split (the held-out tenth too)."""
    if not cfg.text:
        import collections
        import json
        import os

        return "".join(inspect.getsource(module) for module in (os, json, collections, inspect, statistics))
    chars = read_user_text(Path(cfg.text), "the probe's text")
    least = 10 * (cfg.block_size + 2)  # its held-out tenth must hold a window of block_size + 1 and a start
    if len(chars) < least:
        raise UserError(f"the probe's text {cfg.text} has {len(chars):,} characters: it needs {least:,} at least")
    return chars


# read first: a bad --text stops all at once
PROBE_TEXT = probe_text() if "probe" in cfg.parts.split(",") and cfg.probe_iters else ""


def probe() -> None:
    """Each optimizer trains the demo model's shape for probe_iters steps (warmup, cosine decay to a tenth) on the
    same batches; the loss over the same held-out batches at the end."""
    chars = PROBE_TEXT
    vocab = sorted(set(chars))
    index = {c: i for i, c in enumerate(vocab)}
    ids = torch.tensor([index[c] for c in chars])
    split = int(0.9 * len(ids))
    gen, T = torch.Generator().manual_seed(1), cfg.block_size
    windows = lambda data, n: torch.stack(
        [data[i : i + T + 1] for i in torch.randint(len(data) - T - 1, (n,), generator=gen)]
    )
    train = [windows(ids[:split], cfg.batch_size).to(device) for _ in range(cfg.probe_iters)]
    val = windows(ids[split:], 20 * cfg.batch_size).to(device)
    print(
        f"probe: {len(ids):,} characters ({len(vocab)} distinct), {cfg.probe_iters} steps, val loss over {len(val)} "
        "windows"
    )
    runs = [("adamw", float(lr), None) for lr in cfg.probe_adamw_lrs.split(",") if lr]
    runs += [("muon", float(lr), "original") for lr in cfg.probe_muon_lrs.split(",") if lr]
    runs += [("muon", float(lr), "match_rms_adamw") for lr in cfg.probe_rms_lrs.split(",") if lr]
    for kind, lr, adjust in runs:
        t0 = time.perf_counter()
        loss = train_probe(kind, lr, adjust, len(vocab), train, val)
        print(f"  {kind:6} lr {lr:<6g} {adjust or '':16} val loss {loss:.4f}  ({time.perf_counter() - t0:.0f} s)")


def train_probe(kind: str, lr: float, adjust: str | None, vocab: int, train: list, val: torch.Tensor) -> float:
    torch.manual_seed(0)
    model = GPT(replace(cfg.model, vocab_size=vocab)).to(device)
    peak = lr if kind == "adamw" else cfg.learning_rate  # AdamW's lr, alone or as Muon's partner
    optimizer = build_optimizer(model, replace(cfg.optim, optimizer=kind, learning_rate=peak, muon_lr=lr))
    for group in optimizer.param_groups:
        if group.get("muon"):
            group["adjust_lr_fn"] = adjust
    warmup = max(1, cfg.probe_iters // 10)
    for it, batch in enumerate(train):
        ratio = (it + 1) / warmup if it < warmup else 0.1 + 0.45 * (1 + math.cos(math.pi * it / cfg.probe_iters))
        set_lr(optimizer, peak * ratio, peak)
        _, loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():
        model.eval()  # no dropout in the val loss
        batches = val.split(cfg.batch_size)
        return sum(model(v[:, :-1], v[:, 1:])[1].item() for v in batches) / len(batches)


for part in cfg.parts.split(","):
    {"newton_schulz": newton_schulz, "step": step_times, "probe": probe if cfg.probe_iters else lambda: None}[
        part.strip()
    ]()
