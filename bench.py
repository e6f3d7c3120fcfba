"""
The performance lab: time training iterations (forward, backward, AdamW step) of a configurable GPT, and explain
where the time goes.

    python bench.py                                    # GPT-2 (124M) shape, synthetic data, every switch on
    python bench.py --n_layer=4 --n_head=4 --n_embd=128 --block_size=64 --batch_size=12 --compile=false
    python bench.py --ladder=True --out_json=out-bench/ladder.json      # fp32 eager -> every switch, rung by rung
    python bench.py --sweep=batch_size --values=1,2,4,8 --out_json=out-bench/batch.json
    python bench.py --find_max_batch=True              # the largest micro-batch that fits (CUDA)
    python bench.py --profile=True --out_json=out-bench/run.json       # a Chrome trace and the top 20 ops
    python bench.py --compare=new.json --baseline=old.json --tolerance_pct=5   # exit 1 on a regression

Each timed iteration is bracketed by device synchronisations; burn_in iterations (the first includes compilation,
allocator and kernel warm-up) are timed apart and left out of the median. The measuring lives in benchmark.py.
"""

import os
import sys
from dataclasses import replace
from pathlib import Path

from benchmark import (
    SyntheticBatches,
    add_speedups,
    beside,
    case_from_settings,
    compare_results,
    comparison_table,
    ladder_cases,
    largest_fitting,
    load_results,
    report,
    run_case,
    sweep_values,
    write_outputs,
)
from common import TokenBatches, die, prepare_if_missing, resolve_runtime, run_manifest
from configurator import configure

# -----------------------------------------------------------------------------
# model
n_layer = 12
n_head = 12
n_embd = 768
block_size = 1024
vocab_size = 50257  # GPT-2's; the model's is rounded up to a multiple of pad_vocab
pad_vocab = 64  # 50257 -> 50304 for faster matmuls; 1 = off
bias = False
dropout = 0.0
attention = "sdpa"  # 'manual', 'sdpa' (PyTorch picks the kernel), or SDPA held to 'flash', 'efficient', 'cudnn', 'math'
loss_chunk = 0  # rows per chunk of a chunked lm_head + cross-entropy that never holds the full logits; 0 = off
activation_checkpointing = False  # recompute each block's activations in backward
# work
batch_size = 12
gradient_accumulation_steps = 1  # micro-batches per timed optimizer step
dataset = ""  # '' for synthetic tokens, or a dataset under data_dir (prepared on first use)
data_dir = "data"
burn_in = 5  # iterations timed apart and left out of the median (>= 1: the first includes compilation)
steps = 20  # timed iterations
# system
device = "auto"
dtype = "auto"
tf32 = True
compile = True
compile_mode = "default"  # 'default', 'reduce-overhead', 'max-autotune' or 'max-autotune-no-cudagraphs'
seed = 1337
peak_flops = 0.0  # FLOP/s; 0 = look up the device in model.PEAK_TFLOPS
# what to run (one at most; none times the configuration above)
ladder = False  # fp32 eager, +TF32, +bf16, +compile, +flash attention, +vocab padding, +fused AdamW
skip_rungs = ""  # comma-separated rungs to leave out: tf32, bf16, compile, flash, pad_vocab, fused
sweep = ""  # a setting to vary: batch_size, block_size, gradient_accumulation_steps, compile_mode or attention
values = ""  # the sweep's comma-separated values, e.g. 1,2,4,8
find_max_batch = False  # the largest batch_size that fits in GPU memory (doubling, then bisecting)
# outputs
out_json = ""  # results as JSON, with a CSV and a PNG chart beside it; '' = print only
profile = False  # torch.profiler over 5 more steps: a Chrome trace beside out_json, the top 20 ops printed
memory_snapshot = False  # CUDA: a memory snapshot of the timed steps beside out_json (pytorch.org/memory_viz)
# regression check, instead of measuring: exit 1 when a figure of compare is worse than baseline's
compare = ""  # a bench output (JSON)
baseline = ""  # the bench output to compare it with
tolerance_pct = 5.0  # how much worse a figure may be, in percent
settings = configure(globals())
# -----------------------------------------------------------------------------

if compare or baseline:
    if not (compare and baseline):
        die("a regression check needs both --compare=NEW.json and --baseline=OLD.json")
    try:
        rows = compare_results(load_results(Path(compare)), load_results(Path(baseline)), tolerance_pct)
    except ValueError as e:
        die(str(e))
    print(comparison_table(rows))
    worse = [r for r in rows if r["verdict"] in ("worse", "missing")]
    if worse:
        sys.exit(f"regression: {len(worse)} of {len(rows)} figures worse than the baseline by over {tolerance_pct}%")
    print(f"no regression: every figure within {tolerance_pct}% of the baseline or better")
    sys.exit(0)

if "RANK" in os.environ:
    die("bench.py times one process on one device: run it without torchrun (all-reduce time is not measured)")
if steps < 1 or burn_in < 1:
    die(f"steps and burn_in must be >= 1 (got steps={steps}, burn_in={burn_in}); the first iteration compiles")
modes = [name for name, on in (("ladder", ladder), ("sweep", sweep), ("find_max_batch", find_max_batch)) if on]
if len(modes) > 1:
    die(f"choose one of ladder, sweep and find_max_batch, not {' and '.join(modes)}")
if values and not sweep:
    die("values are for a sweep: add --sweep=SETTING")
if skip_rungs and not ladder:
    die("skip_rungs is for the ladder: add --ladder=True")
if (profile or memory_snapshot) and modes:
    die(f"profile and memory_snapshot look at one configuration: drop --{modes[0]}")
if sweep == "compile_mode" and not compile:
    die("a compile_mode sweep needs compile=True")

runtime = resolve_runtime(device, dtype, tf32)
print(runtime.describe())
manifest = run_manifest(settings, runtime)  # the code as it was when the measuring began
try:
    case = case_from_settings(settings, "as set")
    if ladder:
        skip = [k.strip() for k in skip_rungs.split(",") if k.strip()]
        unpadded = case_from_settings(settings | {"pad_vocab": 1}, "")
        cases = ladder_cases(unpadded, runtime.device, pad_vocab, skip)
    elif sweep:
        cases = [(case_from_settings(settings | {sweep: v}, f"{sweep}={v}"), None) for v in sweep_values(sweep, values)]
    else:
        cases = [(case, None)]
except ValueError as e:
    die(str(e))

if dataset:
    data_path = Path(data_dir) / dataset
    prepare_if_missing(data_path)
    batches = lambda B, T, dev: TokenBatches(data_path, B, T, dev, seed)
else:
    batches = lambda B, T, dev: SyntheticBatches(B, T, vocab_size, dev, seed)
if memory_snapshot and runtime.device_type != "cuda":
    print(f"memory_snapshot: CUDA only, none written on {runtime.device_type}")
measure_args = dict(
    device=str(runtime.device),
    batches=batches,
    steps=steps,
    burn_in=burn_in,
    peak_flops=peak_flops or None,
    seed=seed,
    trace_path=beside(out_json, ".trace.json", "bench-trace.json") if profile else None,
    snapshot_path=beside(out_json, ".snapshot.pickle", "bench-snapshot.pickle") if memory_snapshot else None,
)
print(
    f"model: {case.model.n_layer} layers, {case.model.n_head} heads, n_embd {case.model.n_embd}; "
    f"{gradient_accumulation_steps} x {batch_size} x {block_size} tokens per iteration"
)

if find_max_batch:
    if runtime.device_type != "cuda":
        print(f"find_max_batch: not meaningful on {runtime.device_type}: host memory swaps rather than running out")
        sys.exit(0)
    results = []

    def fits(b: int) -> bool:
        r = run_case(replace(case, name=f"batch_size={b}", batch_size=b), **(measure_args | {"steps": 1, "burn_in": 1}))
        results.append(r)
        print(f"batch_size={b}: {r['status']} {r['reason']}", flush=True)
        if r["status"] == "failed" and r["reason"] != "out of memory":
            die(f"batch_size={b} failed for another reason than memory: {r['reason']}")
        return r["status"] == "ok"

    largest = largest_fitting(fits, limit=16384)
    print(f"largest batch_size that fits: {largest} (x {block_size} tokens, compile={compile})")
else:
    results = []
    for i, (c, skip_reason) in enumerate(cases):
        r = run_case(c, skip_reason, **measure_args)
        results.append(r)
        if r["status"] == "ok":
            done = f"{r['ms_median']:,.2f} ms/iter (first iteration {r['first_iter_ms']:,.0f} ms)"
        else:
            done = f"{r['status']}: {r['reason']}"
        print(f"[{i + 1}/{len(cases)}] {c.name}: {done}", flush=True)

add_speedups(results)
print()
print(report(results, runtime.device_type))
if out_json:
    kind = "ladder" if ladder else f"sweep of {sweep}" if sweep else "find_max_batch" if find_max_batch else "single"
    doc = {"kind": kind, "manifest": manifest, "results": results}
    for line in write_outputs(Path(out_json), doc):
        print(line)
