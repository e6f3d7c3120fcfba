"""scripts/gpu_suite.py's runner: what a part runs (a Profile: GPT-2 on a GPU, or tiny shapes on the CPU) and the
Suite that runs its steps, each sub-run logged and killed when the part's budget is spent."""

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_suite_args import RESERVE_S
from gpu_suite_io import ROOT, bench_rows, last_line, progress, row

PY = sys.executable


@dataclass(frozen=True)
class Profile:
    """What the steps run: GPT-2 (124M) on a GPU (the defaults), or tiny shapes on the CPU for the dry run."""

    dry_run: bool = False
    device: tuple[str, ...] = ()  # device, compile and dtype flags for our scripts and nanoGPT's
    model: tuple[str, ...] = ()  # the model's shape, block_size aside
    block_size: int = 1024
    train: tuple[str, ...] = ()  # more train.py flags
    train_iters: int = 25  # steps of train.py (and nanoGPT's), the first train_warmup left out of the median
    train_warmup: int = 5
    nanogpt_split: tuple[int, int] = (12, 40)  # nanoGPT's micro-batch and accumulation, should train.py fail
    bench_batch: int = 12  # bench.py's micro-batch for its default run and the ladder, nanoGPT's bench.py's too
    bench: tuple[str, ...] = ()  # more bench.py flags: burn-in and steps
    synthetic: tuple[str, ...] = ()  # flags of the runs on synthetic tokens (ladder, sweep, savers)
    ladder: tuple[str, ...] = ()
    sweep_values: str = "8,16,24,32"
    saver_batch: int = 32
    loss_chunk: int = 2048
    generate: tuple[str, ...] = ("--repeats=3",)  # benchmarks/generate.py flags
    generate_compile: bool = True
    nanogpt_tokens: int = 100  # new tokens of nanoGPT's generate, timed once: it recomputes the context per token
    budget_s: float = 525  # one part's wall time: sub-runs are killed past it
    fit_memory_gb: float = 24.0  # lowmem: the largest GPT whose step fits a 24 GB card with the savers


@dataclass
class Outcome:
    ok: bool
    reason: str  # the last line of stderr when it failed
    stdout: Path
    log: str  # stdout's path under DIR, for the row


class Suite:
    """Runs one part's steps: each sub-run logged under work/PART/logs and killed when the part's budget is spent,
    each step's rows (or one failed row) collected."""

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
        """cmd, its stdout in logs/NAME.log (after the command) and its stderr in logs/NAME.err; killed with its
        children when the part's budget runs out."""
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
        """bench.py with flags, its JSON read into rows named prefix + bench.py's name (prefix alone for a single
        configuration)."""
        out_json = self.dir / f"{name}.json"
        outcome = self.run(name, [PY, "bench.py", *flags, f"--out_json={out_json}"])
        if not outcome.ok:
            several = any(f.startswith(("--sweep=", "--ladder=")) for f in flags)
            return self.failed(group, prefix + "every configuration" if several else prefix.strip(), outcome)
        rows, manifest = bench_rows(out_json, self.part, group, prefix)
        self.manifest = self.manifest or manifest
        return [r | {"log": outcome.log} for r in rows]
