"""Every GPU figure of the project, a part per call of under 9 minutes, and a dry run of every step
on the CPU with a tiny model (CI runs it). What each part runs: docs/gpu.md.

    python lab/gpu_suite.py --out=DIR --part=tests|bench|losses|lowmem|generate [--nanogpt=PATH]
    python lab/gpu_suite.py --out=DIR --dry_run=True [--nanogpt=PATH]

Each step is one of the project's own commands (pytest, bench.py, lab/generate.py) or nanoGPT's
bench.py, its output logged in DIR/work/PART/ and its figures read from the JSON it writes
(nanoGPT's from its printed line). A part's steps are killed once it has run budget_s; a step that
fails or is not reached is a row saying why, and the suite then exits 1. DIR gets results.json
(every row so far: a part run again replaces its own) and PART-logs.tar.gz; the table of every row
comes last.
"""

import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository root, for its modules
from configurator import configure  # noqa: E402
from nanogpt_perf.config import Config, setting  # noqa: E402
from nanogpt_perf.errors import UserError  # noqa: E402
from nanogpt_perf.files import write_json, write_through_path  # noqa: E402
from nanogpt_perf.guard.paths import optional_path, output_folder, path_rule  # noqa: E402

PARTS = ("tests", "bench", "losses", "lowmem", "generate")
RESERVE_S = 10  # of a part's budget, kept for writing its outputs
FIGURES = ("ms_per_iter", "tokens_per_s", "mfu", "peak_mem_bytes")
NANOGPT_FILES = ("bench.py", "model.py", "configurator.py")


@path_rule
def suite_folder(value: str) -> None:
    """A folder outside this repository, or one git ignores (out-gpu), never git's own."""
    output_folder(value)
    out = Path(value).resolve()
    if not out.is_relative_to(ROOT):
        return
    if ".git" in out.relative_to(ROOT).parts:
        raise ValueError("a folder outside git's own folder")
    try:  # whether git ignores what the suite writes there; fine outside a checkout or without git
        check = ["git", "-C", str(ROOT), "check-ignore", "-q", str(out / "results.json")]
        ignored = subprocess.run(check, capture_output=True).returncode
    except OSError:
        return
    if ignored == 1:
        raise ValueError("a folder outside this repository, or one git ignores (out-gpu)")


@path_rule
def nanogpt_checkout(value: str) -> None:
    optional_path(value)
    if value and (lacking := [f for f in NANOGPT_FILES if not (Path(value) / f).is_file()]):
        raise ValueError(f"a nanoGPT checkout ({value} has no {', '.join(lacking)})")


def a_part(value: str) -> None:
    if value not in ("", *PARTS):
        raise ValueError(f"one of {', '.join(PARTS)}")


def a_budget(value: float) -> None:
    if value != 0 and value < 30:
        why = f"a part keeps {RESERVE_S} s for its outputs"
        raise ValueError(f"0 (the part's default) or at least 30 seconds ({why})")


def part_or_dry_run(cfg: Config) -> None:
    if not cfg.part and not cfg.dry_run:
        raise ValueError(f"part={'|'.join(PARTS)} is required (or dry_run=True)")


# -----------------------------------------------------------------------------
@dataclass
class SuiteConfig:
    """Settings of lab/gpu_suite.py: what it measures and where it writes"""

    out: str = setting("", "the output folder: results.json, PART-logs.tar.gz", check=suite_folder)
    part: str = setting("", "what to measure: " + ", ".join(PARTS), check=a_part)
    nanogpt: str = setting("", "a nanoGPT checkout: its bench.py and generate beside ours",
                           check=nanogpt_checkout)  # fmt: skip
    dry_run: bool = setting(False, "every part on the CPU with a tiny model")
    budget_s: float = setting(0.0, "seconds a part may take (0: 525)", check=a_budget)


# -----------------------------------------------------------------------------

PY = sys.executable
TINY = ("--n_layer=2", "--n_head=2", "--n_embd=64")
TINY_GENERATE = ("--device=cpu", *TINY, "--block_size=64", "--vocab_size=512", "--prompt_tokens=8")
PROFILE = {  # what the steps run, (on a GPU, in the dry run): GPT-2 (124M), or tiny on the CPU
    "common": ((), ("--device=cpu", "--compile=False", "--dtype=float32", *TINY)),
    "block": (1024, 32),
    "batch": (12, 4),  # the ladder, the memory savers
    "big_batch": (32, 4),  # nanoGPT's bench.py, the losses and their savers
    "bench": ((), ("--burn_in=1", "--steps=3", "--vocab_size=500")),  # synthetic tokens
    "ladder": ((), ("--skip_rungs=compile",)),  # compiling takes minutes on a CPU
    "sweep": ("8,16,24,32", "1,2,4"),  # its last is big_batch
    "loss_chunk": (2048, 64),
    "losses": ("plain,fused,liger", "plain,fused"),  # liger's kernels are Triton's
    "fit_memory_gb": (24.0, 0.4),
    "generate": (
        ("--compile=True", "--weights=float32,bfloat16,int8", "--rivals=True", "--repeats=3"),
        (*TINY_GENERATE, "--max_new_tokens=24", "--repeats=1", "--weights=float32,int8"),
    ),
    "nanogpt_tokens": (100, 12),  # nanoGPT's generate recomputes the context: once, fewer tokens
    "tests": (("-m", "gpu or triton"), ("-m", "gpu", "tests/test_gpu.py")),
}
LOW = ["--weights_dtype=bfloat16", "--state_bits=8"]  # bf16 weights, 8-bit AdamW
IN_BACKWARD = ["--in_backward=True", "--grad_clip=0.0"]
LOWMEM = {  # the memory savers (docs/lowmem.md), each beside float32 AdamW
    "adamw": [],
    "bf16 + 8-bit AdamW": LOW,
    "bf16 + 8-bit AdamW in backward": [*LOW, *IN_BACKWARD],
    "muon": ["--optimizer=muon"],
    "muon bf16 + 8-bit": ["--optimizer=muon", *LOW, "--muon_momentum_dtype=8bit"],
    "offload": ["--offload=True", "--grad_clip=0.0"],  # CUDA only: not in the dry run
}
# the dry run only: nanoGPT's bench.py calls torch.cuda.synchronize and builds GPT-2 (124M) whatever
# its flags; the call is stubbed and the model shrunk, so that its step and its line run
NANOGPT_CPU_SHIM = """
import runpy, sys, torch
sys.argv = ["bench.py", *sys.argv[1:]]
torch.cuda.synchronize = lambda *args, **kwargs: None
import model
config = model.GPTConfig
model.GPTConfig = lambda **kw: config(**(kw | dict(n_layer=2, n_head=2, n_embd=64)))
runpy.run_path("bench.py", run_name="__main__")
"""


def steps(part: str, p: dict, nanogpt: Path | None) -> list[tuple[str, list[str]]]:
    """The part's steps: a name and the command it runs (each from the repository's root)."""
    bench = [PY, "bench.py", f"--block_size={p['block']}", *p["common"], *p["bench"]]
    batch, big = f"--batch_size={p['batch']}", f"--batch_size={p['big_batch']}"
    if part == "tests":
        return [("gpu tests", [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", *p["tests"]])]
    if part == "bench":  # nanoGPT's bench.py at the sweep's largest batch (the anchors' micro-step)
        ours = [
            ("ladder", [*bench, batch, "--ladder=True", *p["ladder"]]),
            ("batch sweep", [*bench, f"--sweep=batch_size={p['sweep']}"]),
        ]
        flags = [big, f"--block_size={p['block']}", "--real_data=False"]
        theirs = [PY, "-c", NANOGPT_CPU_SHIM, *flags, *p["common"][:3]] if p["dry"] else []
        theirs = theirs or [PY, "bench.py", *flags]
        return ours + ([("nanoGPT bench.py", theirs)] if nanogpt else [])
    if part == "losses":
        return [
            ("loss_impl", [*bench, big, f"--sweep=loss_impl={p['losses']}"]),
            (f"loss_chunk={p['loss_chunk']}", [*bench, big, f"--loss_chunk={p['loss_chunk']}"]),
            ("checkpointing", [*bench, big, "--activation_checkpointing=True"]),
        ]
    if part == "lowmem":
        savers = [(n, [*bench, batch, *f]) for n, f in LOWMEM.items()]
        savers = [(n, cmd) for n, cmd in savers if not (p["dry"] and "--offload=True" in cmd)]
        fit = [*bench, batch, *LOW, *IN_BACKWARD, f"--fit_memory_gb={p['fit_memory_gb']}"]
        return [*savers, ("fit bf16 + 8-bit in backward", fit)]
    generate = [PY, "lab/generate.py", "--uncached=False", *p["generate"]]
    ours = [(f"generate B={b}", [*generate, f"--batch_size={b}"]) for b in (1, 16)]
    n, eager = p["nanogpt_tokens"], ["--compile=False", "--rivals=False", "--weights=float32"]
    theirs = [*generate, *eager, f"--max_new_tokens={n}", f"--nanogpt_dir={nanogpt}"]
    theirs = [(f"generate B={b}, nanoGPT", [*theirs, f"--batch_size={b}"]) for b in (1, 16)]
    return ours + (theirs if nanogpt else [])


def row(part: str, step: str, name: str, status="ok", reason="", **figures) -> dict:
    return {"part": part, "step": step, "name": name, "status": status, "reason": reason} | {
        k: figures.get(k) for k in (*FIGURES, "note")
    }


def rows_of(part: str, step: str, out: Path | None, stdout: str) -> list[dict]:
    """A finished step's rows, each named by the step: from the JSON it wrote (out), or from
    nanoGPT's and pytest's last lines."""
    if out is None and step == "gpu tests":
        return [row(part, step, step, note=stdout.strip().splitlines()[-1])]
    if out is None:  # nanoGPT's bench.py: the mean of its 20 timed steps
        ms, mfu = re.search(r"time per iteration: ([\d.]+)ms, MFU: ([-\d.]+)%", stdout).groups()
        return [row(part, step, step, ms_per_iter=float(ms), mfu=float(mfu) / 100)]
    doc, named = json.loads(out.read_text()), lambda r: f"{step}: {r['name']}"
    if "tokens_per_s_runs" in doc["results"][0]:  # lab/generate.py's, a row per engine or rival
        return [row(part, step, named(r), tokens_per_s=r["tokens_per_s"]) for r in doc["results"]]
    return [  # bench.py's, a row per configuration ('as set': the one there is)
        row(part, step, step if r["name"] == "as set" else named(r), r["status"], r["reason"],
            ms_per_iter=r.get("ms_median"), **{k: r.get(k) for k in FIGURES[1:]})
        for r in doc["results"]
    ]  # fmt: skip


def run_part(part: str, p: dict, out: Path, nanogpt: Path | None, budget_s: float) -> list[dict]:
    """Every step of the part, each killed (with its children) once the part's budget is spent."""
    work, rows, deadline = out / "work" / part, [], time.monotonic() + budget_s - RESERVE_S
    work.mkdir(parents=True, exist_ok=True)
    # tiny shapes gain nothing from threads; on a busy 2-core machine OpenMP's spinning slows them
    env = ({"OMP_NUM_THREADS": "1"} if p["dry"] else {}) | dict(os.environ)
    env |= {"PYTHONUNBUFFERED": "1"} | ({"TORCHDYNAMO_DISABLE": "1"} if p["dry"] else {})
    for i, (step, cmd) in enumerate(steps(part, p, nanogpt)):
        t0, log = time.monotonic(), work / f"{i}.log"
        json_out = work / f"{i}.json" if cmd[1] in ("bench.py", "lab/generate.py") else None
        cmd = [*cmd, f"--out_json={json_out}"] if json_out else cmd
        if (timeout := deadline - t0) < 5:
            rows.append(row(part, step, step, "not run", f"the part's {budget_s:.0f} s are spent"))
            continue
        with open(log, "w") as f:
            f.write(f"$ {' '.join(cmd)}\n")
            f.flush()
            cwd = nanogpt if step == "nanoGPT bench.py" else ROOT
            proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # fmt: skip
            try:
                code, why = proc.wait(timeout=timeout), ""
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # its process group: compile workers too
                code, why = proc.wait(), f"killed after {timeout:.0f} s, the part's budget spent"
        text = log.read_text(errors="replace")
        if code != 0:  # its last line says why, or the signal that ended it
            why = why or ([ln for ln in text.splitlines() if ln.strip()] or [f"exit {code}"])[-1]
        try:
            rows += rows_of(part, step, json_out, text) if not why else []
        except Exception as e:  # its output not as expected: the rest go on
            why = f"{type(e).__name__}: {e}"
        if why:
            rows.append(row(part, step, step, "failed", f"{why} (log: {log.relative_to(out)})"))
        print(f"[{part}] {step}: {time.monotonic() - t0:.0f} s", flush=True)
    return rows


def load_rows(path: Path) -> list[dict]:
    """The rows an earlier call left in path (results.json), or none; a UserError for a file that
    is not the suite's."""
    if not path.exists():
        return []
    try:
        rows = json.loads(path.read_text())["rows"]
        if all(r["part"] in PARTS for r in rows):
            return rows
    except (OSError, ValueError, KeyError, TypeError):
        pass
    raise UserError(f"{path} is not the suite's results.json: move it away or choose another "
                    "--out")  # fmt: skip


def machine() -> dict:
    import torch

    from nanogpt_perf.manifest import git_state

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    commit, dirty = git_state(ROOT)
    return {"device": gpu or "cpu", "torch": torch.__version__, "commit": commit, "dirty": dirty}


def table(rows: list[dict]) -> str:
    from lab.bench_report import fmt, markdown_table  # imports torch

    cells = [
        [r["part"], r["name"], r["status"], fmt(r["ms_per_iter"], ",.1f"),
         fmt(r["tokens_per_s"], ",.0f"), fmt(r["mfu"], ".1f", 100, "%"),
         fmt(r["peak_mem_bytes"], ",.0f", 2**-20, " MiB"), r["reason"] or r["note"] or ""]
        for r in rows
    ]  # fmt: skip
    headers = ["part", "row", "status", "ms/iter", "tokens/s", "MFU", "peak mem", "note"]
    return markdown_table(headers, cells, left=(0, 1, 2, 7))


def write_logs(out: Path, part: str) -> None:
    """PART-logs.tar.gz: the part's logs and JSON, without tokens, checkpoints or snapshots."""
    skip = lambda info: None if info.name.endswith((".bin", ".pt", ".pickle")) else info

    def archive(tmp: Path) -> None:
        with tarfile.open(tmp, "w:gz") as tar:
            tar.add(out / "work" / part, arcname=part, filter=skip)

    write_through_path(out / f"{part}-logs.tar.gz", archive)


def main() -> None:
    try:
        cfg = configure(suite=SuiteConfig, cross=(part_or_dry_run,))
    except UserError as e:  # exit status 2: the suite's own flags; 1 is a failed step
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    p = {k: v[cfg.dry_run] for k, v in PROFILE.items()} | {"dry": cfg.dry_run}
    parts, out = [cfg.part] if cfg.part else list(PARTS), Path(cfg.out).resolve()
    nanogpt = Path(cfg.nanogpt).resolve() if cfg.nanogpt else None
    rows, where = load_rows(out / "results.json"), machine()
    what = "dry run: the CPU, a tiny model" if cfg.dry_run else "GPT-2 (124M)"
    print(f"gpu_suite: {', '.join(parts)} into {out} ({what})", flush=True)
    for part in parts:
        new = run_part(part, p, out, nanogpt, cfg.budget_s or 525)
        rows = [r for r in rows if r["part"] != part] + new
        rows.sort(key=lambda r: PARTS.index(r["part"]))
        write_json(out / "results.json", {"machine": where, "rows": rows})
        write_logs(out, part)
    print(table(rows), flush=True)
    sys.exit(1 if any(r["status"] in ("failed", "not run") for r in rows) else 0)


if __name__ == "__main__":
    main()
