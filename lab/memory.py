"""The memory savers (nanogpt_perf/lowmem.py) measured on the project's GPT through bench.py, which
times the step train.py runs: bytes per parameter of training state by part (weights, gradients at
their fullest, optimizer state; exact, from the tensors' storages) and the step's peak rise, each
configuration a bench.py run in a fresh process; or, with time=True, each one's CPU time per step at
the small size, the configurations interleaved round by round.

    python lab/memory.py                    # 124M (12 x 768) and 350M (24 x 1024), every one
    python lab/memory.py --sizes=124M --configs=adamw,adamw-bf16-8bit --block=64
    python lab/memory.py --time=True --rounds=7   # ms per step at 4 x 256, interleaved

The GPT is model.py's without biases, with the fused lm_head + cross-entropy and GPT-2's padded
vocabulary, float32 and eager on the CPU, one step timed after one apart. The peak rise is the
process's peak resident set over a step less what it held before the model was built (bench.py's
memory table), glibc told to map every block of 128 KiB or more on its own (MALLOC_MMAP_THRESHOLD_),
so that a freed tensor leaves the resident set rather than staying in the heap; 'act+ws'
(activations and workspace) is the peak rise less the training state.
"""

import json
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository root, for its modules
from configurator import configure  # noqa: E402
from lab.bench_fit import bench_row  # noqa: E402
from nanogpt_perf.config import setting  # noqa: E402
from nanogpt_perf.guard.paths import comma_separated  # noqa: E402

SIZES = {"124M": (12, 768), "350M": (24, 1024), "small": (4, 256)}
# a configuration is named by its optimizer and its savers: name part -> bench.py's flags
SAVERS = {
    "bf16": ["--weights_dtype=bfloat16"],
    "8bit": ["--state_bits=8"],
    "4bit": ["--state_bits=4"],
    "bf16mom": ["--muon_momentum_dtype=bfloat16"],
    "8bitmom": ["--muon_momentum_dtype=8bit"],
    "inbwd": ["--in_backward=True", "--grad_clip=0.0"],  # the step inside backward cannot clip
}
CONFIGS = (
    "adamw,adamw-bf16,adamw-8bit,adamw-bf16-8bit,adamw-bf16-4bit,adamw-inbwd,adamw-bf16-8bit-inbwd,"
    "adamw-bf16-4bit-inbwd,muon,muon-bf16mom,muon-8bitmom,muon-bf16-bf16mom,muon-bf16-8bitmom-8bit,"
    "muon-bf16-8bitmom-8bit-inbwd"
).split(",")


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
    rounds: int = setting(5, "timed rounds of time=True", min=1, max=1_000)


def bench(size: str, config: str, batch: int, block: int) -> dict:
    """bench.py's row for config at size, one step timed after one apart, in a fresh process; or
    the error it ended with."""
    (n_layer, n_embd), (optimizer, *savers) = SIZES[size], config.split("-")
    shape = [f"--n_layer={n_layer}", f"--n_head={n_embd // 64}", f"--n_embd={n_embd}"]
    shape += [f"--block_size={block}", f"--batch_size={batch}", f"--optimizer={optimizer}"]
    step = ["--bias=False", "--loss_impl=fused", "--device=cpu", "--dtype=float32"]
    step += ["--compile=False", "--steps=1", "--burn_in=1"]
    cmd = [str(ROOT / "bench.py"), *shape, *step, *(f for s in savers for f in SAVERS[s])]
    row = bench_row(cmd, os.environ | {"MALLOC_MMAP_THRESHOLD_": "131072"})
    if isinstance(row, str):
        return {"size": size, "config": config, "error": row}
    if row["status"] != "ok" or not row["memory"]:
        return {"size": size, "config": config, "error": row["reason"] or "no memory figure"}
    return {"size": size, "config": config, "ms": row["ms_median"]} | row["memory"]


def table(rows: list[dict]) -> None:
    print(f"{'size':>5} {'configuration':<30} {'weights':>7} {'grads':>6} {'optim':>6} "
          f"{'STATE':>6} {'peak rise':>9} {'act+ws':>6} {'step ms':>8}")  # fmt: skip
    for r in rows:
        line = f"{r['size']:>5} {r['config']:<30} "
        if "error" in r:
            print(line + f"error: {r['error']}")
            continue
        parts = [f"{r[k]:{w}.2f}" for k, w in (("weights", 7), ("grads", 6), ("optimizer", 6))]
        parts += [f"{r['state']:6.2f}", f"{r['peak']:9.2f}", f"{r['activations']:6.2f}"]
        print(line + " ".join(parts) + f" {r['ms']:8.1f}")


def timed(configs: list[str], rounds: int, batch: int, block: int) -> None:
    """Each configuration's ms per step at SIZES['small'], the configurations interleaved round by
    round (the machine is noisy): the median over rounds, against the first configuration's."""
    times: dict[str, list[float]] = {c: [] for c in configs}
    for _ in range(rounds):
        for c in configs:
            row = bench("small", c, batch, block)
            times[c].append(row.get("ms", float("nan")))
    base = statistics.median(times[configs[0]])
    print(f"ms per step at {SIZES['small']} (n_layer, n_embd), {batch} x {block} tokens, median "
          f"of {rounds}:")  # fmt: skip
    for c in configs:
        m = statistics.median(times[c])
        print(f"{c:<30} {m:8.1f} ms  x{m / base:.2f} of {configs[0]}")


def main() -> None:
    cfg = configure(memory=MemoryBenchConfig)
    configs = [c.strip() for c in cfg.configs.split(",")]
    if cfg.time:
        timed(configs, cfg.rounds, cfg.batch, cfg.block)
        return
    rows = []
    for size in [s.strip() for s in cfg.sizes.split(",")]:
        for config in configs:
            rows.append(bench(size, config, cfg.batch, cfg.block))
            print(json.dumps(rows[-1]), flush=True)
    table(rows)


if __name__ == "__main__":
    main()
