"""
Every GPU figure of the project in three invocations of under 9 minutes each, and a dry run of every
step on the CPU with a tiny model (CI runs it). What each part runs, reads and writes: docs/gpu.md.

    python lab/gpu_suite.py --out=DIR --part=train|bench|generate|lowmem|all [--nanogpt=PATH]
    python lab/gpu_suite.py --out=DIR --dry_run=True [--nanogpt=PATH]
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
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for its modules
from configurator import configure  # noqa: E402
from lab import gpu_suite_io as gio  # noqa: E402
from lab.gpu_suite_io import PARTS, ROOT, row  # noqa: E402
from nanogpt_perf.config import Config, setting  # noqa: E402
from nanogpt_perf.errors import UserError  # noqa: E402

RESERVE_S = 10  # of a part's budget, kept for writing its outputs
MIN_BUDGET_S = 30  # the least budget_s that leaves a step time to run


def a_part(value: str) -> None:
    if value not in ("", *PARTS, "all"):
        raise ValueError(f"one of {', '.join(PARTS)}, all")


def a_budget(value: float) -> None:
    if value != 0 and value < MIN_BUDGET_S:
        why = f"a part keeps {RESERVE_S} s for its outputs"
        raise ValueError(f"0 (the part's default) or at least {MIN_BUDGET_S} seconds ({why})")


def part_or_dry_run(cfg: Config) -> None:
    if not cfg.part and not cfg.dry_run:
        raise ValueError(f"part={'|'.join([*PARTS, 'all'])} is required (or dry_run=True)")


# -----------------------------------------------------------------------------
@dataclass
class SuiteConfig:
    """Settings of lab/gpu_suite.py: what it measures and where it writes"""

    out: str = setting("", "the output folder: results.*, PART-logs.tar.gz", check=gio.suite_folder)
    part: str = setting("", "what to measure: train, bench, generate, lowmem or all", check=a_part)
    nanogpt: str = setting(
        "",
        "a nanoGPT checkout: also time its train.py, bench.py, generate",
        check=gio.nanogpt_checkout,
    )
    dry_run: bool = setting(False, "every part on the CPU with a tiny model")
    budget_s: float = setting(0.0, "seconds a part may take (0: 525, dry run 600)", check=a_budget)


try:
    cfg = configure(suite=SuiteConfig, cross=(part_or_dry_run,))
except UserError as e:  # exit status 2: the suite's own flags; 1 is a failed step
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
# -----------------------------------------------------------------------------

DATASET = "kjv_shakespeare"  # under DIR/work/data: llm.c shards of the offline corpus
SHARD_SIZE = 2**18  # tokens: the corpus's 2.4M make 1 validation shard and 9 training shards
PY, GENERATE = sys.executable, "lab/generate.py"
TINY = ("--n_layer=2", "--n_head=2", "--n_embd=64")
TINY_GENERATE = ("--device=cpu", *TINY, "--block_size=64", "--vocab_size=512", "--prompt_tokens=8")
PROFILE = {  # what the steps run: (on a GPU: GPT-2 124M, in the dry run: tiny shapes on the CPU)
    "device": ((), ("--device=cpu", "--compile=False", "--dtype=float32")),  # nanoGPT's too
    "model": ((), TINY),  # the model's shape, block_size aside
    "block_size": (1024, 32),
    "train": ((), ("--tokens_per_iter=512",)),  # 16 sequences: 'auto' takes 2 x 8 on a CPU
    "train_iters": (25, 6),  # steps of train.py and nanoGPT's, the first train_warmup untimed
    "train_warmup": (5, 2),
    "nanogpt_split": ((12, 40), (8, 2)),  # nanoGPT's micro-batch, accumulation, should ours fail
    "bench_batch": (12, 4),  # bench.py's micro-batch for its row and the ladder; nanoGPT's bench's
    "bench": ((), ("--burn_in=1", "--steps=3")),  # more bench.py flags
    "synthetic": ((), ("--vocab_size=500",)),  # the runs on synthetic tokens: ladder, sweep, savers
    "ladder": ((), ("--skip_rungs=compile",)),  # compiling takes minutes on a CPU
    "sweep_values": ("8,16,24,32", "1,2,4"),
    "saver_batch": (32, 4),
    "loss_chunk": (2048, 64),
    "generate": (("--repeats=3",), (*TINY_GENERATE, "--max_new_tokens=24")),  # lab/generate.py's
    "generate_compile": (True, False),
    "nanogpt_tokens": (100, 12),  # nanoGPT's generate's, timed once: it recomputes the context
    "budget_s": (525, 600),  # one part's wall time: sub-runs are killed past it
    "fit_memory_gb": (24.0, 0.4),  # lowmem: the largest GPT whose step fits, with the savers
}
GENERATION = (  # label, lab/generate.py flags
    ("eager", ["--cuda_graph=False"]),
    ("graph", ["--cuda_graph=True"]),  # a no-op off CUDA
    ("graph+compile", ["--cuda_graph=True", "--compile=True"]),
    # int8 weights (their dequantizing product fused by the compiler), beside transformers' generate
    # on the same weights (its dynamic and static caches: ../shared/gpu-anchors.md)
    ("graph+compile int8", ["--cuda_graph=True", "--compile=True", "--weights=int8"]),
    ("transformers", ["--rivals=True", "--weights=bfloat16", "--repeats=1"]),
)
LOW = ["--weights_dtype=bfloat16", "--state_bits=8"]  # bf16 weights, 8-bit AdamW
IN_BACKWARD = ["--in_backward=True", "--grad_clip=0.0"]
LOWMEM = (  # label, bench.py flags: the memory savers (docs/lowmem.md), each beside float32 AdamW
    ("adamw", []),
    ("bf16 + 8-bit AdamW", LOW),
    ("bf16 + 8-bit AdamW in backward", [*LOW, *IN_BACKWARD]),
    ("muon", ["--optimizer=muon"]),
    ("muon bf16 + 8-bit", ["--optimizer=muon", *LOW, "--muon_momentum_dtype=8bit"]),
    ("offload", ["--offload=True", "--grad_clip=0.0"]),  # CUDA only: skipped by the dry run
)

# the dry run only: nanoGPT's bench.py calls torch.cuda.synchronize and pin_memory, and builds GPT-2
# (124M) whatever its flags; the two CUDA calls are stubbed and the model shrunk, so that the step
# and the reading of its line run
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
Rows = list[dict]


class Suite:
    """One part's steps: each sub-run logged in work/PART/logs and killed when the part's budget is
    spent (its own outputs in work/PART/runs), each step's rows (or one failed row) collected."""

    def __init__(self, out: Path, p: SimpleNamespace, nanogpt: Path | None, part: str):
        self.out, self.profile, self.nanogpt, self.part = out, p, nanogpt, part
        self.data, self.folder = out / "work" / "data", out / "work" / part
        self.logs, self.dir = self.folder / "logs", self.folder / "runs"
        for folder in (self.logs, self.dir):
            folder.mkdir(parents=True, exist_ok=True)
        # tiny shapes gain nothing from threads; on a busy 2-core machine OpenMP's spinning slows
        # them 100x
        threads = {"OMP_NUM_THREADS": "1"} if p.dry_run else {}
        self.env = threads | dict(os.environ) | {"PYTHONUNBUFFERED": "1"}
        self.rows: Rows = []
        self.manifest: dict = {}  # of the part's first sub-run that wrote one: what it ran on
        self.deadline = time.monotonic() + p.budget_s

    def run(self, name: str, cmd: list[str], cwd: Path = ROOT) -> tuple[str, Path]:
        """cmd, its stdout in logs/NAME.log (after the command) and its stderr in logs/NAME.err,
        killed with its children when the part's budget runs out: why it failed ('' if not), and
        its stdout."""
        stdout, stderr = self.logs / f"{name}.log", self.logs / f"{name}.err"
        if (timeout := self.deadline - time.monotonic() - RESERVE_S) < 5:
            return f"not run: the part's {self.profile.budget_s:.0f} s are spent", stdout
        with open(stdout, "w") as out, open(stderr, "w") as err:
            out.write(f"$ cd {shlex.quote(str(cwd))} && {shlex.join(cmd)}\n")
            out.flush()
            logs = {"stdout": out, "stderr": err}
            proc = subprocess.Popen(cmd, cwd=cwd, env=self.env, start_new_session=True, **logs)
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # its process group: compile workers too
                proc.wait()
                return f"killed after {timeout:.0f} s, the rest of the part's budget", stdout
        failed = gio.last_line(stderr) or gio.last_line(stdout) or f"exit status {code}"
        return "" if code == 0 else failed, stdout

    def rows_of(self, name: str, cmd: list, group: str, title: str, read: Callable, cwd=ROOT):
        """cmd run as NAME: a failed row titled title, or the rows read(stdout) makes; their log."""
        reason, stdout = self.run(name, cmd, cwd)
        log = str(stdout.relative_to(self.out))
        if reason:
            return [row(self.part, group, title, "failed", reason, log=log)]
        return [r | {"log": log} for r in read(stdout)]

    def json_rows(self, name: str, cmd: list, group: str, title: str, read: Callable) -> Rows:
        """rows_of for a script that writes runs/NAME.json (--out_json): the rows read(its JSON)
        makes; the part's manifest is the first such file's."""
        path = self.dir / f"{name}.json"

        def rows(_: Path) -> Rows:
            doc = json.loads(path.read_text())
            self.manifest = self.manifest or doc.get("manifest") or {}
            return read(doc)

        return self.rows_of(name, [*cmd, f"--out_json={path}"], group, title, rows)

    def step(self, title: str, make_rows: Callable[..., Rows], *args) -> None:
        """One step; an exception reading its outputs makes it a failed row; the part goes on."""
        t0 = time.monotonic()
        print(f"[{self.part}] {title} ...", flush=True)
        try:
            rows = make_rows(self, *args)
        except Exception as e:  # a sub-run's output not as expected: recorded, other figures kept
            rows = [row(self.part, "error", title, "failed", f"{type(e).__name__}: {e}")]
        self.rows += rows
        for r in rows:
            print(f"[{self.part}]   {gio.progress(r)}", flush=True)
        print(f"[{self.part}] {title}: {time.monotonic() - t0:.1f} s", flush=True)


def bench(s: Suite, name: str, group: str, prefix: str, flags: list[str]) -> Rows:
    """bench.py with flags, its rows named prefix + bench.py's name (prefix alone for one run)."""
    several = any(f.startswith(("--sweep=", "--ladder=")) for f in flags)
    title = prefix + "every configuration" if several else prefix.strip()
    read = lambda doc: gio.bench_rows(doc, s.part, group, prefix, group == "lowmem")
    return s.json_rows(name, [PY, "bench.py", *flags], group, title, read)


def part_train(s: Suite) -> None:
    p = s.profile
    split = {"batch": p.nanogpt_split[0], "accumulation": p.nanogpt_split[1], "block": p.block_size}
    s.step("data", prepare_data)
    s.step("train.py", our_train, split)
    flags = [f"--dataset={DATASET}", f"--data_dir={s.data}", f"--batch_size={p.bench_batch}"]
    flags += [f"--block_size={p.block_size}", *p.device, *p.model, *p.bench]
    s.step("bench.py", bench, "bench_py", "bench", "bench.py ", flags)
    if s.nanogpt:
        s.step("nanoGPT train.py", nanogpt_train, split)
        s.step("nanoGPT bench.py", nanogpt_bench)


def prepare_data(s: Suite) -> Rows:
    """Shards of the offline corpus by data/openwebtext/prepare.py, once a DIR."""
    dataset, title = s.data / DATASET, "prepare: KJV + Shakespeare, GPT-2 tokens"

    def read(_: object = None) -> Rows:
        record = json.loads((dataset / "prepare.json").read_text())
        note = f"{record['tokens']:,} tokens from {record['documents']:,} documents"
        note += f" in {record['shards']} shards, prepared in {record['elapsed_s']:.1f} s"
        return [row(s.part, "data", title, note=note)]

    if (dataset / "prepare.json").is_file():
        return read()
    inputs = ",".join(str(p) for p in gio.write_corpus(s.data / "corpus"))
    cmd = [PY, "data/openwebtext/prepare.py", f"--input={inputs}", f"--out_dir={dataset}"]
    cmd += [f"--shard_size={SHARD_SIZE}", "--processes=1"]
    return s.rows_of("prepare", cmd, "data", title, read)


def our_train(s: Suite, split: dict[str, int]) -> Rows:
    """train.py config/train_gpt2.py on the shards, evaluation all but off: the median of its steps
    after warm-up; split becomes the micro-batch and accumulation it chose."""
    p, out_dir, title = s.profile, s.dir / "train_py", "train.py config/train_gpt2.py"
    shutil.rmtree(out_dir, ignore_errors=True)  # its log.jsonl is appended to
    cmd = [PY, "train.py", "config/train_gpt2.py", f"--dataset={DATASET}", f"--data_dir={s.data}"]
    cmd += [f"--out_dir={out_dir}", f"--max_iters={p.train_iters}", "--eval_interval=100000"]
    cmd += ["--eval_iters=1", "--log_interval=1", "--always_save_checkpoint=False", *p.device]
    cmd += [*p.model, f"--block_size={p.block_size}", *p.train]

    def read(_: Path) -> Rows:
        b, g, t = gio.train_step_shape(out_dir / "manifest.json")
        split.update(batch=b, accumulation=g, block=t)
        s.manifest = s.manifest or json.loads((out_dir / "manifest.json").read_text())
        f = gio.train_log_figures(out_dir / "log.jsonl", p.train_warmup)
        note = f"median of {f['steps']} steps after {p.train_warmup}; micro-batch {b} x {g}"
        note += f" = {b * g * t:,} tokens a step; first step {f['first_step_s']:.1f} s"
        return [row(s.part, "training", title, note=note, **{k: f[k] for k in gio.FIGURES})]

    try:
        return s.rows_of("train_py", cmd, "training", title, read)
    finally:  # the last eval's checkpoint: GPT-2's with AdamW's state is 1.5 GB
        for checkpoint in out_dir.glob("ckpt*"):
            checkpoint.unlink()


def nanogpt_train(s: Suite, split: dict[str, int]) -> Rows:
    """nanoGPT's train.py config/train_gpt2.py at train.py's micro-batch, accumulation and block,
    on our tokens."""
    p, (b, g, t), script = s.profile, split.values(), str(s.nanogpt / "train.py")
    cmd = [PY, script, str(s.nanogpt / "config/train_gpt2.py"), f"--dataset={DATASET}"]
    cmd += [f"--batch_size={b}", f"--gradient_accumulation_steps={g}", f"--block_size={t}"]
    cmd += [f"--max_iters={p.train_iters}", "--eval_interval=100000", "--eval_iters=1"]
    cmd += ["--log_interval=1", "--wandb_log=False", "--always_save_checkpoint=False"]
    cmd += [f"--out_dir={s.dir / 'nanogpt/out'}", *(p.device or ["--compile=True"]), *p.model]
    note = f"median of the steps after {p.train_warmup}; micro-batch {b} x {g}"
    read = lambda stdout: gio.nanogpt_ms(stdout, p.train_warmup)
    title = "nanoGPT train.py config/train_gpt2.py"
    return nanogpt_row(s, "training", title, cmd, b * g * t, read, note)


def nanogpt_bench(s: Suite) -> Rows:
    """nanoGPT's bench.py (on our tokens) at bench.py's micro-batch and block size."""
    p, script = s.profile, str(s.nanogpt / "bench.py")
    flags = [f"--batch_size={p.bench_batch}", f"--block_size={p.block_size}", *p.device]
    cmd = [PY, "-c", NANOGPT_CPU_SHIM, script, *flags] if p.dry_run else [PY, script, *flags]
    note = f"B={p.bench_batch} x {p.block_size}, the mean of 20 steps after 10"
    note += ", CPU shim" if p.dry_run else ""
    tokens = p.bench_batch * p.block_size
    return nanogpt_row(s, "bench", "nanoGPT bench.py", cmd, tokens, gio.nanogpt_ms, note)


def nanogpt_row(s: Suite, group: str, title: str, cmd: list, tokens: int, read, note: str) -> Rows:
    """A nanoGPT script run in its work folder (configurator.py and data/ there): its ms/iter read
    from stdout, as a row with the ratio of our row of the group to it."""
    gio.nanogpt_data(s.data / DATASET, s.dir / "nanogpt", s.nanogpt)

    def rows(stdout: Path) -> Rows:
        ms = read(stdout)
        figures = {"ms_per_iter": ms, "tokens_per_s": tokens * 1000 / ms}
        versus = gio.versus(s.rows, group, figures)
        return [row(s.part, group, title, note=note, **figures, **versus)]

    return s.rows_of(f"nanogpt_{group}", cmd, group, title, rows, s.dir / "nanogpt")


def part_bench(s: Suite) -> None:
    p, savers = s.profile, "memory savers"
    common = [f"--block_size={p.block_size}", *p.device, *p.model, *p.bench, *p.synthetic]
    ladder = ["--ladder=True", f"--batch_size={p.bench_batch}", *common, *p.ladder]
    s.step("ladder", bench, "ladder", "ladder", "ladder: ", ladder)
    sweep = [f"--sweep=batch_size={p.sweep_values}", *common]
    s.step("batch_size sweep", bench, "batch_sweep", "batch sweep", "sweep: ", sweep)
    # two memory savers at the sweep's last batch, against that row (everything else the same)
    saver, chunk = [f"--batch_size={p.saver_batch}", *common], f"loss_chunk={p.loss_chunk}"
    s.step("loss_chunk", bench, "savers_chunk", savers, f"savers: {chunk} ", [*saver, f"--{chunk}"])
    checkpointing = [*saver, "--activation_checkpointing=True"]
    prefix = "savers: activation checkpointing "
    s.step("checkpointing", bench, "savers_ac", savers, prefix, checkpointing)
    gio.saver_notes(s.rows, f"sweep: batch_size={p.saver_batch}")


def part_generate(s: Suite) -> None:
    p, savers, batches = s.profile, "memory savers", (1, 16)
    flags = [f"--batch_size={p.saver_batch}", f"--block_size={p.block_size}", *p.device, *p.model]
    liger = liger_unavailable(s)
    flags += [*p.bench, *p.synthetic, "--sweep=loss_impl=plain,fused" + ("" if liger else ",liger")]
    s.step("loss_impl", bench, "savers_loss_impl", savers, "savers: ", flags)
    if liger:
        s.rows.append(row(s.part, savers, "savers: loss_impl=liger", "skipped", liger))
    gio.saver_notes(s.rows, "savers: loss_impl=plain")
    for batch in batches:
        for label, flags in GENERATION:
            s.step(f"generate B={batch} {label}", generation, batch, label, flags)
    for batch in batches if s.nanogpt else ():
        s.step(f"generate B={batch} vs nanoGPT", versus_nanogpt, batch)


def liger_unavailable(s: Suite) -> str | None:
    """Why liger-kernel's loss cannot be timed here, or None."""
    if s.profile.dry_run:
        return "liger-kernel's Triton kernels need CUDA"
    reason, _ = s.run("liger_check", [PY, "-c", "import liger_kernel"])
    return f"import liger_kernel failed: {reason} (pip install liger-kernel)" if reason else None


def generation(s: Suite, batch: int, label: str, flags: list[str]) -> Rows:
    """lab/generate.py at this batch, the KV cache only."""
    p, title = s.profile, f"generate B={batch} {label}"
    if "--compile=True" in flags and not p.generate_compile:
        why = "compiling the decode step takes minutes on a CPU"
        return [row(s.part, "generation", title, "skipped", why)]
    cmd = [PY, GENERATE, f"--batch_size={batch}", "--uncached=False", *flags, *p.generate]
    read = lambda doc: gio.generation_rows(doc, s.part, title)
    name = f"generate_b{batch}_{label.replace('+', '_')}"
    return s.json_rows(name, cmd, "generation", title, read)


def versus_nanogpt(s: Suite, batch: int) -> Rows:
    """nanoGPT's generate (a forward pass over the whole context per token) and our eager engine on
    the same weights in one lab/generate.py run: once, on fewer tokens than the other rows."""
    p, n = s.profile, s.profile.nanogpt_tokens
    cmd = [PY, GENERATE, f"--batch_size={batch}", "--uncached=False", "--cuda_graph=False"]
    cmd += [*p.generate, "--repeats=1", f"--max_new_tokens={n}", f"--nanogpt_dir={s.nanogpt}"]
    title, theirs = (f"generate B={batch} {who}, {n} tokens" for who in ("eager", "nanoGPT"))
    read = lambda doc: gio.generation_rows(doc, s.part, title, theirs)
    return s.json_rows(f"generate_b{batch}_nanogpt", cmd, "generation", title, read)


def part_lowmem(s: Suite) -> None:
    """Each saver's bytes per parameter by part and peak (in each row's note), then the largest GPT
    of GPT-2's aspect whose step fits fit_memory_gb with bf16 weights, 8-bit AdamW, the step in
    backward."""
    p = s.profile
    if p.dry_run:  # torchao compiles its step per parameter shape: minutes on a CPU; eagerly, same
        s.env = s.env | {"TORCHDYNAMO_DISABLE": "1"}
    common = [f"--batch_size={p.bench_batch}", f"--block_size={p.block_size}", *p.device, *p.model]
    common += [*p.bench, *p.synthetic]
    for i, (label, flags) in enumerate(LOWMEM):
        if "--offload=True" in flags and p.dry_run:
            s.rows.append(row(s.part, "lowmem", f"lowmem: {label}", "skipped", "CUDA only"))
        else:
            args = (f"lowmem_{i}", "lowmem", f"lowmem: {label} ", [*common, *flags])
            s.step(f"lowmem {label}", bench, *args)
    fit = [*common, *LOW, *IN_BACKWARD, f"--fit_memory_gb={p.fit_memory_gb}"]
    fits = f"lowmem: fits {p.fit_memory_gb:g} GB "
    s.step("lowmem fit", bench, "lowmem_fit", "lowmem", fits, fit)


PART = {"train": part_train, "bench": part_bench, "generate": part_generate, "lowmem": part_lowmem}


def main() -> None:
    p = SimpleNamespace(dry_run=cfg.dry_run, **{k: v[cfg.dry_run] for k, v in PROFILE.items()})
    p.budget_s = cfg.budget_s or p.budget_s
    parts, out = list(PARTS) if cfg.part in ("", "all") else [cfg.part], Path(cfg.out).resolve()
    nanogpt = Path(cfg.nanogpt).resolve() if cfg.nanogpt else None
    if "train" in parts and not (out / "work/data" / DATASET / "prepare.json").is_file():
        if problem := gio.preparation_problem():
            raise UserError(problem)
    doc = gio.load_doc(out / "results.json")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--out={out} cannot be made: {e.strerror}") from None
    what = "dry run: the CPU, a tiny model" if p.dry_run else "GPT-2 (124M)"
    print(f"gpu_suite: {', '.join(parts)} into {out} ({what})", flush=True)
    failed = []
    for part in parts:
        started, suite = time.monotonic(), Suite(out, p, nanogpt, part)
        PART[part](suite)
        record = gio.part_record(suite.manifest, started, p.dry_run, nanogpt)
        for line in gio.write_part(out, doc, part, suite.rows, record, suite.folder):
            print(line, flush=True)
        failed += [r["name"] for r in suite.rows if r["status"] == "failed"]
        print(f"[{part}] done in {time.monotonic() - started:.1f} s", flush=True)
    if failed:
        print(f"failed: {', '.join(failed)} (logs: {out}/work/*/logs, *-logs.tar.gz)", flush=True)
    print(gio.summary_table(doc), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
