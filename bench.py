"""The performance lab: time training iterations (forward, backward, AdamW step) of a configurable
GPT, and explain where the time goes.

    python bench.py                             # GPT-2 (124M), synthetic data, every switch on
    python bench.py --n_layer=4 --n_head=4 --n_embd=128 --block_size=64 --batch_size=12 \
        --compile=false
    python bench.py --ladder=True --out_json=out-bench/ladder.json   # fp32 eager -> every switch
    python bench.py --sweep=batch_size=1,2,4,8 --out_json=out-bench/batch.json
    python bench.py --find_max_batch=True       # the largest micro-batch that fits (CUDA)
    python bench.py --profile=True --out_json=out-bench/run.json     # a Chrome trace, the top ops
    python bench.py --compare=new.json --baseline=old.json --tolerance_pct=5
        # exit 1: a regression; 2: none compared

Each timed iteration is bracketed by device synchronisations; burn_in iterations (the first includes
compilation, allocator and kernel warm-up) are timed apart and left out of the median. What is timed
is the training step that train.py runs (nanogpt_perf/train/step.py), built from the same settings;
the measuring lives in lab/bench_measure.py.
"""

from nanogpt_perf.errors import report_errors

# from the first moment: a mistake of the user's, or Ctrl-C while torch loads, is one line
report_errors()

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from configurator import configure, sweep_values
from lab.bench_cases import NOT_MEASURED, Case, ladder_cases, largest_fitting
from lab.bench_fit import check_budget, family, in_a_fresh_process, largest_model, parameters
from lab.bench_measure import add_speedups, run_case
from lab.bench_regression import regression_check
from lab.bench_report import report, write_outputs
from model import GPTConfig
from nanogpt_perf.config import setting
from nanogpt_perf.data.dataset import dataset_vocab_size, prepare_if_missing
from nanogpt_perf.data.loader import LoaderConfig, SyntheticBatches, TokenBatches
from nanogpt_perf.data.tokenizer import GPT2_VOCAB_SIZE
from nanogpt_perf.errors import UserError
from nanogpt_perf.guard.paths import a_path, optional_path, output_file
from nanogpt_perf.lowmem import LowMemConfig
from nanogpt_perf.manifest import run_manifest
from nanogpt_perf.optim import OptimConfig, ScheduleConfig
from nanogpt_perf.runtime import RuntimeConfig, device_memory_bytes, resolve_runtime
from nanogpt_perf.train.build import BUILD_RULES, TRAINING_DEFAULTS, BuildConfig


# -----------------------------------------------------------------------------
@dataclass
class BenchConfig:
    """Settings of bench.py: what is timed, what to run and where to write it"""

    # work
    batch_size: int = setting(12, "micro-batch size", min=1)
    gradient_accumulation_steps: int = setting(1, "micro-batches per timed optimizer step; at most "
                                               "10,000 (a step shows nothing until it ends)",
                                               min=1, max=10_000)  # fmt: skip
    dataset: str = setting("", "'' for synthetic tokens, or a dataset under data_dir (prepared on "
                           "first use), read as train.py does")  # fmt: skip
    data_dir: str = setting("data", "where datasets live", check=a_path)
    run_data_preparer: bool = setting(False, "run data_dir/dataset/prepare.py even where it is not "
                                      "one of this repository's")  # fmt: skip
    vocab_size: int = setting(GPT2_VOCAB_SIZE, "of the synthetic tokens (uint16); a dataset brings "
                              "its own", interval="[1, 65536]")  # fmt: skip
    burn_in: int = setting(5, "iterations timed apart, left out of the median; at most 1,000 (a "
                           "row shows nothing until it ends)",
                           min=1, max=1_000, note=" (the first iteration compiles)")  # fmt: skip
    steps: int = setting(20, "timed iterations; at most 100,000 (a row shows nothing until it "
                         "ends)", min=1, max=100_000)  # fmt: skip
    # what to run (one at most; none times the configuration above)
    ladder: bool = setting(
        False, "fp32 eager, +TF32, +bf16, +compile, +flash attention, +vocab padding, +fused AdamW"
    )
    skip_rungs: str = setting(
        "", "comma-separated rungs to leave out: tf32, bf16, compile, flash, pad_vocab, fused"
    )
    sweep: str = setting(
        "", "'KEY=V1,V2,...': the configuration at each value of any setting, e.g. batch_size=1,2,4"
    )
    find_max_batch: bool = setting(
        False, "the largest batch_size that fits in GPU memory (doubling, then bisecting)"
    )
    fit_memory_gb: float = setting(0.0, "the largest n_layer x n_embd of this aspect whose step "
                                   "fits this many GB (device memory on a GPU, RAM on a CPU)",
                                   min=0, note=" (0 = off)")  # fmt: skip
    # outputs
    out_json: str = setting("", "results as JSON, with a CSV and a PNG chart beside it; '' = print "
                            "only", check=output_file(".json"))  # fmt: skip
    profile: bool = setting(
        False, "torch.profiler over 5 more steps: a Chrome trace beside out_json, the top 20 ops"
    )
    memory_snapshot: bool = setting(
        False, "CUDA: a memory snapshot of the timed steps beside out_json"
    )
    # regression check, instead of measuring: exit 1 when a figure of compare is worse than
    # baseline's, 2 when nothing could be compared (a file missing or not a bench output, another
    # machine)
    compare: str = setting(
        "", "a bench output (JSON) to check against baseline", check=optional_path
    )
    baseline: str = setting("", "the bench output to compare it with", check=optional_path)
    tolerance_pct: float = setting(
        5.0, "how much worse a figure may be, in percent (inf: never fail)", min=0, inf=True
    )


# the model, the optimizer and every performance switch are train.py's, declared by the code that
# uses them; the schedule's settings are taken too, so that train.py's config files run here (a step
# is timed at learning_rate)
cfg = configure(
    bench=BenchConfig, model=GPTConfig, optim=OptimConfig, schedule=ScheduleConfig,
    runtime=RuntimeConfig, loader=LoaderConfig, build=BuildConfig, lowmem=LowMemConfig,
    defaults=TRAINING_DEFAULTS,
    cross=BUILD_RULES,
)  # fmt: skip
# -----------------------------------------------------------------------------

if cfg.compare or cfg.baseline:  # exit 0: no regression, 1: a regression, 2: none compared
    sys.exit(regression_check(cfg.compare, cfg.baseline, cfg.tolerance_pct))

if "RANK" in os.environ:
    raise UserError(
        "bench.py times one process on one device: run it without torchrun (all-reduce time is not "
        "measured)"
    )
modes = [m for m in ("ladder", "sweep", "find_max_batch", "fit_memory_gb") if getattr(cfg, m)]
if len(modes) > 1:
    raise UserError(
        f"choose one of ladder, sweep, find_max_batch and fit_memory_gb, not {' and '.join(modes)}"
    )
if cfg.skip_rungs and not cfg.ladder:
    raise UserError("skip_rungs is for the ladder: add --ladder=True")
if (cfg.profile or cfg.memory_snapshot) and modes:
    raise UserError(f"profile and memory_snapshot look at one configuration: drop --{modes[0]}")
sweep_key, sweep_at = (
    sweep_values(cfg, cfg.sweep, (*NOT_MEASURED, "burn_in", "steps")) if cfg.sweep else ("", [])
)
if sweep_key == "compile_mode" and not cfg.compile:
    raise UserError("a compile_mode sweep needs compile=True")

runtime = resolve_runtime(cfg.device, cfg.dtype, cfg.tf32)
if cfg.fit_memory_gb:  # before anything is prepared or built
    check_budget(cfg.fit_memory_gb, device_memory_bytes(runtime.device), runtime.device_type)
print(runtime.describe())
manifest = run_manifest(cfg.as_dict(), runtime)  # the code as it was when the measuring began

# the batch source: the dataset's windows as train.py reads them (and its vocabulary), or synthetic
# tokens
seed, vocab_size = cfg.seed, cfg.vocab_size
if cfg.dataset:
    data_path = Path(cfg.data_dir) / cfg.dataset
    prepare_if_missing(data_path, cfg.run_data_preparer)
    vocab_size = dataset_vocab_size(data_path) or GPT2_VOCAB_SIZE
    batches = lambda B, T, dev: TokenBatches(
        data_path, B, T, dev, seed, data_order=cfg.data_order, prefetch=cfg.prefetch
    )
else:
    batches = lambda B, T, dev: SyntheticBatches(B, T, vocab_size, dev, seed)
case = Case("as set", cfg.replace(vocab_size=vocab_size))
if cfg.ladder:
    cases = ladder_cases(
        case, runtime.device, [k.strip() for k in cfg.skip_rungs.split(",") if k.strip()]
    )
elif cfg.sweep:
    cases = [(case.but(f"{sweep_key}={v}", **{sweep_key: v}), None) for v in sweep_at]
else:
    cases = [(case, None)]

if cfg.memory_snapshot and runtime.device_type != "cuda":
    print(f"memory_snapshot: CUDA only, none written on {runtime.device_type}")
# a profile's trace and a memory snapshot: beside out_json, or in the working directory without one
beside = lambda suffix: (
    Path(cfg.out_json).with_suffix(suffix) if cfg.out_json else Path(f"bench-{suffix[1:]}")
)
measure_args = dict(
    device=str(runtime.device),
    batches=batches,
    steps=cfg.steps,
    burn_in=cfg.burn_in,
    peak_flops=cfg.peak_flops or None,
    seed=seed,
    trace_path=beside(".trace.json") if cfg.profile else None,
    snapshot_path=beside(".snapshot.pickle") if cfg.memory_snapshot else None,
)
print(
    f"model: {cfg.n_layer} layers, {cfg.n_head} heads, n_embd {cfg.n_embd}, vocab "
    f"{case.measured()['vocab_size']}; "
    f"{cfg.gradient_accumulation_steps} x {cfg.batch_size} x {cfg.block_size} tokens per iteration"
)

# one step of a size tried, after one apart: find_max_batch's and fit_memory_gb's measurement
one_step = lambda c: run_case(c, **(measure_args | {"steps": 1, "burn_in": 1}))
if cfg.find_max_batch:
    if runtime.device_type != "cuda":
        print(
            f"find_max_batch: not meaningful on {runtime.device_type}: host memory swaps rather "
            "than running out"
        )
        sys.exit(0)
    results = []

    def fits(b: int) -> bool:
        r = one_step(case.but(f"batch_size={b}", batch_size=b))
        results.append(r)
        print(f"batch_size={b}: {r['status']} {r['reason']}", flush=True)
        if r["status"] == "failed" and r["reason"] != "out of memory":
            raise UserError(f"batch_size={b} failed for another reason than memory: {r['reason']}")
        return r["status"] == "ok"

    largest = largest_fitting(fits, limit=16384)
    print(
        f"largest batch_size that fits: {largest} (x {cfg.block_size} tokens, "
        f"compile={cfg.compile})"
    )
elif cfg.fit_memory_gb:  # one step of each size tried (lab/bench_fit.py)
    one_step = in_a_fresh_process(sys.argv) if runtime.device_type == "cpu" else one_step
    say = lambda line: print(line, flush=True)
    largest, results = largest_model(case, cfg.fit_memory_gb * 1e9, one_step, say)
    fits = "none"
    if largest:
        member = family(case, largest)
        millions = parameters(member) / 1e6
        fits = f"n_layer={largest}, n_embd={member.settings.n_embd}, {millions:,.1f}M parameters"
    print(f"largest that fits {cfg.fit_memory_gb:g} GB: {fits}")
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
if cfg.out_json:
    kind = f"sweep of {sweep_key}" if cfg.sweep else modes[0] if modes else "single"
    doc = {"kind": kind, "manifest": manifest, "results": results}
    for line in write_outputs(Path(cfg.out_json), doc):
        print(line)
