"""
Every GPU figure of the project in three invocations of under 9 minutes each, on a bare machine with
PyTorch, a GPU and no network; and a dry run of every step on the CPU with a tiny model (under 2
minutes; CI runs it).

    python lab/gpu_suite.py --out=DIR --part=train [--nanogpt=PATH]     # data, train.py, bench.py
    python lab/gpu_suite.py --out=DIR --part=bench                      # ladder, batch sweep, savers
    python lab/gpu_suite.py --out=DIR --part=generate [--nanogpt=PATH]  # fused losses, generation
    python lab/gpu_suite.py --out=DIR --part=lowmem                     # the savers' bytes, a fit
    python lab/gpu_suite.py --out=DIR --dry_run=True [--nanogpt=PATH]   # all on the CPU, tiny shapes

docs/gpu.md says what each part runs and reads, and its budget. DIR gets results.json (every row so
far: a part run again replaces its own), results.csv, results.png and a PART-logs.tar.gz per part
(commands, stdout and stderr, the sub-runs' JSON); the data and the sub-runs' folders are in
DIR/work/data and DIR/work/PART/{logs,runs}, three levels down: only DIR's own files come back from a
device's output folder. A step that fails is a failed row with the last line of its stderr and the
suite goes on; it exits 1 if any step failed. A mistake in its settings is one line, 'error: ...', and
exit status 2, before anything is written.
"""

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for its modules
from configurator import configure  # noqa: E402
from lab.gpu_suite_io import (  # noqa: E402
    ROOT,
    bench_rows,
    generation_rows,
    last_line,
    load_doc,
    merge_part,
    nanogpt_bench_ms,
    nanogpt_data,
    nanogpt_problem,
    nanogpt_train_ms,
    out_problem,
    part_record,
    preparation_problem,
    progress,
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
from nanogpt_perf.config import setting  # noqa: E402
from nanogpt_perf.errors import UserError  # noqa: E402
from nanogpt_perf.guard.paths import optional_path, output_folder, path_rule  # noqa: E402

PARTS = ("train", "bench", "generate", "lowmem")
RESERVE_S = 10  # of a part's budget, kept for writing its outputs
MIN_BUDGET_S = 30  # the least budget_s that leaves a step time to run


@path_rule
def suite_folder(value: str) -> None:
    output_folder(value)
    if problem := out_problem(value):
        raise ValueError(problem)


@path_rule
def nanogpt_checkout(value: str) -> None:
    optional_path(value)
    if value and (problem := nanogpt_problem(value)):
        raise ValueError(problem)


def a_part(value: str) -> None:
    if value not in ("", *PARTS, "all"):
        raise ValueError(f"one of {', '.join(PARTS)}, all")


def a_budget(value: float) -> None:
    if value != 0 and value < MIN_BUDGET_S:
        raise ValueError(
            f"0 (the part's default) or at least {MIN_BUDGET_S} seconds (a part keeps {RESERVE_S} s for its outputs)"
        )


def part_or_dry_run(cfg: Any) -> None:
    if not cfg.part and not cfg.dry_run:
        raise ValueError(f"part={'|'.join([*PARTS, 'all'])} is required (or dry_run=True)")


# -----------------------------------------------------------------------------
@dataclass
class SuiteConfig:
    """Settings of lab/gpu_suite.py: what it measures and where it writes"""

    out: str = setting("", "the output folder (results.*, PART-logs.tar.gz)", check=suite_folder)
    part: str = setting("", "what to measure: train, bench, generate, lowmem or all", check=a_part)
    nanogpt: str = setting("", "a nanoGPT checkout: also time its train.py, bench.py, generate", check=nanogpt_checkout)
    dry_run: bool = setting(False, "every part on the CPU with a tiny model")
    budget_s: float = setting(0.0, "seconds a part may take (0: 525; the dry run's 600)", check=a_budget)


try:
    cfg = configure(suite=SuiteConfig, cross=(part_or_dry_run,))
except UserError as e:  # exit status 2: the suite's own flags; 1 is a failed step
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
# -----------------------------------------------------------------------------

DATASET = "kjv_shakespeare"  # under DIR/work/data: llm.c shards of the offline corpus
SHARD_SIZE = 2**18  # tokens: the corpus's 2.4M make 1 validation shard and 9 training shards
PY = sys.executable
GENERATE = "lab/generate.py"


@dataclass(frozen=True)
class Profile:
    """What the steps run: GPT-2 (124M) on a GPU (the defaults), or tiny shapes on the CPU."""

    dry_run: bool = False
    device: tuple[str, ...] = ()  # device, compile and dtype flags for our scripts and nanoGPT's
    model: tuple[str, ...] = ()  # the model's shape, block_size aside
    block_size: int = 1024
    train: tuple[str, ...] = ()  # more train.py flags
    train_iters: int = 25  # steps of train.py (and nanoGPT's), the first train_warmup not in the median
    train_warmup: int = 5
    nanogpt_split: tuple[int, int] = (12, 40)  # nanoGPT's micro-batch and accumulation, should ours fail
    bench_batch: int = 12  # bench.py's micro-batch for its default run and the ladder, nanoGPT's bench.py's
    bench: tuple[str, ...] = ()  # more bench.py flags: burn-in and steps
    synthetic: tuple[str, ...] = ()  # flags of the runs on synthetic tokens (ladder, sweep, savers)
    ladder: tuple[str, ...] = ()
    sweep_values: str = "8,16,24,32"
    saver_batch: int = 32
    loss_chunk: int = 2048
    generate: tuple[str, ...] = ("--repeats=3",)  # lab/generate.py's flags
    generate_compile: bool = True
    nanogpt_tokens: int = 100  # nanoGPT's generate's new tokens, timed once: it recomputes the context
    budget_s: float = 525  # one part's wall time: sub-runs are killed past it
    fit_memory_gb: float = 24.0  # lowmem: the largest GPT whose step fits a 24 GB card with the savers


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
GENERATION = (  # label, lab/generate.py flags
    ("eager", ["--cuda_graph=False"]),
    ("graph", ["--cuda_graph=True"]),  # a no-op off CUDA
    ("graph+compile", ["--cuda_graph=True", "--compile=True"]),
    # int8 weights (their dequantizing product fused by the compiler), beside transformers' generate on the
    # same weights (its dynamic and static caches: ../shared/gpu-anchors.md)
    ("graph+compile int8", ["--cuda_graph=True", "--compile=True", "--weights=int8"]),
    ("transformers", ["--rivals=True", "--weights=bfloat16", "--repeats=1"]),
)

# the dry run only: nanoGPT's bench.py calls torch.cuda.synchronize and pin_memory, and builds GPT-2 (124M)
# whatever its flags; the two CUDA calls are stubbed and the model shrunk, so that the step and the reading
# of its line run
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


@dataclass
class Outcome:
    ok: bool
    reason: str  # the last line of stderr when it failed
    stdout: Path
    log: str  # stdout's path under DIR, for the row


class Suite:
    """Runs one part's steps: each sub-run logged under work/PART/logs and killed when the part's
    budget is spent, each step's rows (or one failed row) collected."""

    def __init__(self, out: Path, profile: Profile, nanogpt: Path | None):
        self.out, self.profile, self.nanogpt = out, profile, nanogpt
        self.data = out / "work" / "data"
        # tiny shapes gain nothing from threads, and on a busy 2-core machine OpenMP's spinning slows them 100x
        threads = {"OMP_NUM_THREADS": "1"} if profile.dry_run else {}
        self.env = threads | dict(os.environ) | {"PYTHONUNBUFFERED": "1"}

    def begin(self, part: str) -> None:
        """work/PART/logs for the sub-runs' stdout and stderr, work/PART/runs for their own outputs."""
        self.part, self.folder = part, self.out / "work" / part
        self.logs, self.dir = self.folder / "logs", self.folder / "runs"
        for folder in (self.logs, self.dir):
            folder.mkdir(parents=True, exist_ok=True)
        self.rows: list[dict[str, Any]] = []
        self.manifest: dict[str, Any] = {}  # of the part's first sub-run that wrote one: what it ran on
        self.deadline = time.monotonic() + self.profile.budget_s

    def run(self, name: str, cmd: list[str], cwd: Path = ROOT) -> Outcome:
        """cmd, its stdout in logs/NAME.log (after the command) and its stderr in logs/NAME.err; killed
        with its children when the part's budget runs out."""
        stdout, stderr = self.logs / f"{name}.log", self.logs / f"{name}.err"
        log, timeout = str(stdout.relative_to(self.out)), self.deadline - time.monotonic() - RESERVE_S
        if timeout < 5:
            return Outcome(False, f"not run: the part's {self.profile.budget_s:.0f} s are spent", stdout, log)
        with open(stdout, "w") as out, open(stderr, "w") as err:
            out.write(f"$ cd {shlex.quote(str(cwd))} && {shlex.join(cmd)}\n")
            out.flush()
            proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=err, env=self.env, start_new_session=True)
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # its process group: compile workers too
                proc.wait()
                return Outcome(False, f"killed after {timeout:.0f} s, the rest of the part's budget", stdout, log)
        reason = "" if code == 0 else last_line(stderr) or last_line(stdout) or f"exit status {code}"
        return Outcome(code == 0, reason, stdout, log)

    def step(self, title: str, make_rows: Callable[[], list[dict[str, Any]]]) -> None:
        """One step; an exception while reading its outputs makes it a failed row, and the part goes on."""
        t0 = time.monotonic()
        print(f"[{self.part}] {title} ...", flush=True)
        try:
            rows = make_rows()
        except Exception as e:  # a sub-run's output not as expected: recorded, the other figures kept
            rows = [row(self.part, "error", title, "failed", f"{type(e).__name__}: {e}")]
        self.rows += rows
        for r in rows:
            print(f"[{self.part}]   {progress(r)}", flush=True)
        print(f"[{self.part}] {title}: {time.monotonic() - t0:.1f} s", flush=True)

    def failed(self, group: str, name: str, outcome: Outcome) -> list[dict[str, Any]]:
        return [row(self.part, group, name, "failed", outcome.reason, log=outcome.log)]

    def bench(self, name: str, group: str, prefix: str, flags: list[str]) -> list[dict[str, Any]]:
        """bench.py with flags, its JSON read into rows named prefix + bench.py's name (prefix alone for
        a single configuration)."""
        out_json = self.dir / f"{name}.json"
        outcome = self.run(name, [PY, "bench.py", *flags, f"--out_json={out_json}"])
        if not outcome.ok:
            several = any(f.startswith(("--sweep=", "--ladder=")) for f in flags)
            return self.failed(group, prefix + "every configuration" if several else prefix.strip(), outcome)
        rows, manifest = bench_rows(out_json, self.part, group, prefix)
        self.manifest = self.manifest or manifest
        return [r | {"log": outcome.log} for r in rows]


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
    """lab/generate.py at this batch, the KV cache only."""
    p, name = s.profile, f"generate B={batch} {label}"
    if "--compile=True" in flags and not p.generate_compile:
        return [row(s.part, "generation", name, "skipped", "compiling the decode step takes minutes on a CPU")]
    cmd = [PY, GENERATE, f"--batch_size={batch}", "--uncached=False", *flags, *p.generate]
    return generate_py(s, f"generate_b{batch}_{label.replace('+', '_')}", cmd, name)


def versus_nanogpt(s: Suite, batch: int) -> list[dict[str, Any]]:
    """nanoGPT's generate (a forward pass over the whole context per token) and our eager engine on the same weights
    in one lab/generate.py run: once, on fewer tokens than the other rows, as it is slow."""
    p, n = s.profile, s.profile.nanogpt_tokens
    cmd = [PY, GENERATE, f"--batch_size={batch}", "--uncached=False", "--cuda_graph=False"]
    cmd += [*p.generate, "--repeats=1", f"--max_new_tokens={n}", f"--nanogpt_dir={s.nanogpt}"]  # the last flag wins
    name, theirs = f"generate B={batch} eager, {n} tokens", f"generate B={batch} nanoGPT, {n} tokens"
    return generate_py(s, f"generate_b{batch}_nanogpt", cmd, name, theirs)


def generate_py(s: Suite, run: str, cmd: list[str], name: str, nanogpt_name: str = "") -> list[dict[str, Any]]:
    """Run a lab/generate.py command into work/PART/runs/RUN.json; its rows."""
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


PART = {"train": part_train, "bench": part_bench, "generate": part_generate, "lowmem": part_lowmem}


# ----------------------------------------------------------------------------- main


def main() -> None:
    profile = DRY if cfg.dry_run else GPU
    profile = replace(profile, budget_s=cfg.budget_s) if cfg.budget_s else profile
    parts, out = list(PARTS) if cfg.part in ("", "all") else [cfg.part], Path(cfg.out).resolve()
    nanogpt = Path(cfg.nanogpt).resolve() if cfg.nanogpt else None
    if "train" in parts and not (out / "work" / "data" / DATASET / "prepare.json").is_file():
        if problem := preparation_problem():
            raise UserError(problem)
    doc = load_doc(out / "results.json", list(PARTS))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--out={out} cannot be made: {e.strerror}") from None
    suite, failed = Suite(out, profile, nanogpt), []
    what = "dry run: the CPU, a tiny model" if profile.dry_run else "GPT-2 (124M)"
    print(f"gpu_suite: {', '.join(parts)} into {out} ({what})", flush=True)
    for part in parts:
        started = time.monotonic()
        suite.begin(part)
        PART[part](suite)
        record = part_record(suite.manifest, started, profile.dry_run, str(nanogpt or ""))
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
