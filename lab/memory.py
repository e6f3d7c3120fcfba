"""The memory savers (nanogpt_perf/lowmem.py) measured on the project's GPT: bytes per parameter of
training state by part (weights, gradients at their fullest, optimizer state; exact, from the
tensors' storages) and a whole step's peak rise, each configuration in a fresh process; and, with
time=True, each saver's CPU time per step at a small size.

    python lab/memory.py                    # 124M (12 x 768) and 350M (24 x 1024), every one
    python lab/memory.py --sizes=124M --configs=adamw,adamw-bf16-8bit
    python lab/memory.py --time=True --rounds=7   # ms per step at 4 x 256, interleaved
    python lab/memory.py --state_only=True        # the state's bytes alone, no forward

The peak rise is the process's peak resident set over step 2 (reset by clear_refs) less what it
held before the model was built (the interpreter, torch and torchao loaded): a fresh process per
configuration, on the CPU, glibc told to map every block of 128 KiB or more on its own
(MALLOC_MMAP_THRESHOLD_), so that a freed tensor leaves the resident set rather than staying in the
heap. It counts everything the step made the process hold (allocator slack included): never less
than the tensors. 'act+ws' (activations and workspace) is the peak rise less the accounted training
state."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository root, for its modules
from nanogpt_perf.errors import report_errors

report_errors()  # from the first moment: a mistake, or Ctrl-C while torch loads, is one line

import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from configurator import configure
from nanogpt_perf.config import setting
from nanogpt_perf.guard.paths import comma_separated
from nanogpt_perf.lowmem import LowMemConfig as LowMem
from nanogpt_perf.memory import training_state_bytes
from nanogpt_perf.optim import OptimConfig

SIZES = {"124M": (12, 768), "350M": (24, 1024), "small": (4, 256)}
# a configuration is named by its optimizer and its savers: name part -> LowMemConfig's setting
SAVERS = {
    "bf16": ("weights_dtype", "bfloat16"),
    "8bit": ("state_bits", 8),
    "4bit": ("state_bits", 4),
    "bf16mom": ("muon_momentum_dtype", "bfloat16"),
    "8bitmom": ("muon_momentum_dtype", "8bit"),
    "inbwd": ("in_backward", True),
}
NAMES = (
    "adamw,adamw-bf16,adamw-8bit,adamw-bf16-8bit,adamw-bf16-4bit,adamw-inbwd,adamw-bf16-8bit-inbwd,"
    "adamw-bf16-4bit-inbwd,muon,muon-bf16mom,muon-8bitmom,muon-bf16-bf16mom,muon-bf16-8bitmom-8bit,"
    "muon-bf16-8bitmom-8bit-inbwd"
)
# name: (optimizer, savers)
CONFIGS = {
    n: (n.split("-")[0], LowMem(**dict(SAVERS[s] for s in n.split("-")[1:])))
    for n in NAMES.split(",")
}
HYPER = dict(learning_rate=6e-4, weight_decay=0.1, beta1=0.9, beta2=0.95)


@dataclass
class MemoryBenchConfig:
    """Settings of lab/memory.py: the sizes and configurations, a step's shape, the timing"""

    sizes: str = setting("124M,350M", "comma-separated sizes: 124M (12 x 768), 350M (24 x 1024), "
                         "small (4 x 256)", check=comma_separated(*SIZES))  # fmt: skip
    configs: str = setting(",".join(CONFIGS), "comma-separated configurations: an optimizer and "
                           "its savers", check=comma_separated(*CONFIGS))  # fmt: skip
    batch: int = setting(1, "sequences a step", min=1, max=64)
    block: int = setting(256, "tokens a sequence (GPT-2's context at most)", min=1, max=1024)
    time: bool = setting(False, "CPU time per step at the small size, instead of the bytes")
    rounds: int = setting(5, "timed rounds of time=True, after a warm-up round", min=1, max=1_000)
    state_only: bool = setting(False, "the state's bytes alone: one step on zero gradients, no "
                               "forward or backward")  # fmt: skip


def build(size: str, config: str, block: int, **optim: Any):
    """Our GPT (model.py: no biases, the fused lm_head + cross-entropy, GPT-2's padded vocabulary)
    at size, with config's savers, and its optimizer (optim: OptimConfig's settings beside
    HYPER)."""
    from model import GPT, GPTConfig
    from nanogpt_perf.lowmem import cast_weights
    from nanogpt_perf.optim import build_optimizer

    (n_layer, n_embd), (optimizer, spec) = SIZES[size], CONFIGS[config]
    torch.manual_seed(0)
    shape = dict(n_layer=n_layer, n_head=n_embd // 64, n_embd=n_embd, block_size=block)
    model = cast_weights(GPT(GPTConfig(**shape, bias=False, loss_impl="fused")), spec)
    opt = OptimConfig(optimizer=optimizer, **HYPER, **optim)
    return model, build_optimizer(model, opt, spec), spec


def stepper(size: str, config: str, batch: int, block: int) -> Callable[[], dict[str, int]]:
    """A step (forward, backward, step; the step in backward where config asks) that returns the
    training state's bytes with the gradients at their fullest."""
    from nanogpt_perf.in_backward import OptimizerInBackward

    model, optim, spec = build(size, config, block)
    hooks = OptimizerInBackward(model, optim) if spec.in_backward else None
    vocab = model.config.vocab_size
    tokens = torch.randint(vocab, (batch, block + 1), generator=torch.Generator().manual_seed(1))
    x, y = tokens[:, :-1], tokens[:, 1:]

    def step() -> dict[str, int]:
        _, loss = model(x, y)
        if hooks is not None:
            hooks.backward(loss)
            return training_state_bytes(model, optim)
        loss.backward()
        state = training_state_bytes(model, optim)  # the gradients all there
        optim.step()
        optim.zero_grad(set_to_none=True)
        return state

    return step


def per_param(size: str, config: str, state: dict[str, int]) -> dict:
    """The state's bytes per parameter by part, and in all."""
    per = {k: state[k] / state["params"] for k in ("weights", "grads", "optimizer")}
    return dict(size=size, config=config, params=state["params"], **per, state=sum(per.values()))


def one(size: str, config: str, batch: int, block: int) -> dict:
    """Step 1 (the state made, torchao's steps compiled), then step 2 measured."""
    from nanogpt_perf.memory import held_memory_bytes, process_peak_bytes

    cpu = torch.device("cpu")
    import torchao.optim  # noqa: F401  (loaded before the baseline, as torch is)

    baseline = held_memory_bytes(cpu)
    step, states = stepper(size, config, batch, block), []
    t0 = time.perf_counter()
    step()
    t1 = time.perf_counter()
    peak = process_peak_bytes(lambda: states.append(step()), cpu)
    row = per_param(size, config, states[-1])
    rise = (peak - baseline) / row["params"]
    step1, step2 = t1 - t0, time.perf_counter() - t1
    return row | dict(peak=rise, rest=rise - row["state"], step1_s=step1, step2_s=step2)


def state_only(size: str, config: str) -> dict:
    """The training state's bytes without a forward or backward pass (for a CPU that computes the
    bfloat16 ones slowly): one step on zero gradients makes the optimizer's state (Muon's
    Newton-Schulz with 1 iteration: the bytes are the same), then the gradients are counted as
    they would be at their fullest (none in backward)."""
    model, optim, spec = build(size, config, block=256, muon_ns_steps=1)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optim.step()
    if spec.in_backward:
        optim.zero_grad(set_to_none=True)
    return per_param(size, config, training_state_bytes(model, optim))


# a measurement in a fresh process: FUNCTION(**ARGS) of this module, printed as JSON
CHILD = "import json, sys; sys.path.insert(0, sys.argv[1]); import lab.memory as m; " \
        "print(json.dumps(getattr(m, sys.argv[2])(**json.loads(sys.argv[3]))))"  # fmt: skip


def run_fresh(function: str, **kwargs) -> dict:
    env = os.environ | {"MALLOC_MMAP_THRESHOLD_": "131072"}
    args = [sys.executable, "-c", CHILD, str(ROOT), function, json.dumps(kwargs)]
    done = subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        return kwargs | {"error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(rows: list[dict]) -> None:
    print(
        f"{'size':>5} {'configuration':<30} {'weights':>7} {'grads':>6} {'optim':>6} {'STATE':>6} "
        f"{'peak rise':>9} {'act+ws':>6} {'step1 s':>8} {'step2 s':>8}"
    )
    for r in rows:
        line = f"{r['size']:>5} {r['config']:<30} "
        if "error" in r:
            line += f"error: {r['error']}"
        else:
            line += f"{r['weights']:7.2f} {r['grads']:6.2f} {r['optimizer']:6.2f} {r['state']:6.2f}"
        if "peak" in r:  # not --state_only
            line += f" {r['peak']:9.2f} {r['rest']:6.2f} {r['step1_s']:8.1f} {r['step2_s']:8.1f}"
        print(line)


def timed(configs: list[str], rounds: int, batch: int, block: int) -> None:
    """Each configuration's CPU time per step at SIZES['small'], the configurations interleaved
    round by round (the machine is noisy): medians over rounds after a warm-up round (torchao
    compiles there)."""
    steps = {c: stepper("small", c, batch, block) for c in configs}
    times: dict[str, list[float]] = {c: [] for c in configs}
    for r in range(rounds + 1):
        for c in configs:
            t = time.perf_counter()
            steps[c]()
            if r:
                times[c].append(time.perf_counter() - t)
    base = statistics.median(times[configs[0]])
    print(
        f"ms per step at {SIZES['small']} (n_layer, n_embd), {batch} x {block} tokens, median of "
        f"{rounds}:"
    )
    for c in configs:
        m = statistics.median(times[c])
        print(f"{c:<30} {1e3 * m:8.0f} ms  x{m / base:.2f} of {configs[0]}")


def main() -> None:
    cfg = configure(memory=MemoryBenchConfig)
    configs = [c.strip() for c in cfg.configs.split(",")]
    sizes = [s.strip() for s in cfg.sizes.split(",")]
    if cfg.time:
        timed(configs, cfg.rounds, cfg.batch, cfg.block)
        return
    function = "state_only" if cfg.state_only else "one"
    step = {} if cfg.state_only else dict(batch=cfg.batch, block=cfg.block)
    rows = []
    for size in sizes:
        for config in configs:
            rows.append(run_fresh(function, size=size, config=config, **step))
            print(json.dumps(rows[-1]), flush=True)
    table(rows)


if __name__ == "__main__":
    main()
