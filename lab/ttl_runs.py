"""How lab/time_to_loss.py runs train.py, and when it takes a finished run instead (no torch):

- a run's identity: everything that made it, all of which must be the same for a finished run to be
  reused: its train.py command, its threads, the contents of the config files the command names, the
  code (code_digest: every Python file of the checkout that a run can execute, config/'s left to the
  command, as it is on disk, uncommitted changes included), the versions of Python and of the
  packages its steps run on, the machine that timed it, and its dataset's contents (dataset_content:
  prepared again from other text, it is other data);
- files read only where they are regular files (files.open_file): a FIFO, a socket or a device in a
  file's place is never waited on, nor read without end;
- the mark (ttl_run.json) written in a run's out_dir once train.py has ended as a run the benchmark
  counts: finished (its log ends with the eval at max_iters) or diverged (stopped on non-finite
  steps), read back by finished();
- what a train.py exit means (outcome): finished, diverged, or not a run at all (failed, killed by a
  signal, stopped before max_iters);
- Runs: the train.py processes going now, stopped together (SIGTERM, then SIGKILL) when the
  benchmark is stopped or one of them fails.
"""

import functools
import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, wait
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for its modules

from nanogpt_perf.data.identity import check_token_ids, dataset_identity
from nanogpt_perf.errors import UserError
from nanogpt_perf.files import ReadFailed, open_file, read_file, write_json

# in a run's out_dir, written once train.py has ended as a run that counts: what made it
MARK = "ttl_run.json"
# folders whose Python files are not a run's code: no run executes them (a benchmark's part in a run
# is its command, compared whole), or they are config files, in a run's identity by their contents
# where its command names them
NOT_CODE = ("tests/", "lab/", "scripts/", "docs/", "config/")
COUNTED = ("finished", "diverged")  # the outcomes that are runs of the benchmark
# after SIGTERM, the seconds a run has to finish its step, save and exit before it is killed
GRACE_S = 30
PACKAGES = ("torch", "triton", "numpy")  # what a run's steps run on, besides Python and the code


def code_files(root: Path) -> list[str]:
    """The Python files of the checkout at root that a run can execute, as paths from root: those
    git tracks or would track (untracked, not ignored), with those in a folder git lists as one
    entry (a submodule, a link to a package); outside git every one outside hidden and out* folders.
    NOT_CODE left out."""
    try:
        listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], capture_output=True)  # fmt: skip
    except OSError:  # no git here
        listed = None
    if listed is not None and listed.returncode == 0:
        entries = [p for p in listed.stdout.decode(errors="surrogateescape").split("\0") if p]
    else:
        entries = ["."]
    found = [python_files(root, e) if code_folder(root / e) else [e] for e in entries]
    paths = {p for each in found for p in each if p.endswith(".py")}
    return sorted(p for p in paths if not p.startswith(NOT_CODE))


def code_folder(path: Path) -> bool:
    """Whether path is a folder that may hold a run's code: a folder, or a link to a Python package
    (not a link to a dataset's folder or a home)."""
    return path.is_dir() and (not path.is_symlink() or (path / "__init__.py").is_file())


def python_files(root: Path, folder: str) -> list[str]:
    """The *.py files under root/folder, as paths from root, into code_folders (each once: a link to
    a package above is no loop), not into hidden and out* folders (.venv, .git, out-ttl)."""
    paths, seen = [], set()
    for where, folders, files in os.walk(root / folder, followlinks=True):
        real = os.path.realpath(where)
        if real in seen:  # reached again through a link
            folders[:] = []
            continue
        seen.add(real)
        here = Path(where).relative_to(root)
        folders[:] = [f for f in folders if not f.startswith((".", "out"))]
        folders[:] = [f for f in folders if code_folder(Path(where, f))]
        paths += [(here / f).as_posix() for f in files if f.endswith(".py")]
    return paths


def file_digest(path: Path) -> str | None:
    """The SHA-256 of a regular file's bytes; None where it cannot be read or is not one."""
    try:
        with open_file(path) as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except (OSError, ReadFailed):
        return None


def code_digest(root: Path) -> str:
    """One SHA-256 over the path and contents of every code file (code_files): the commit's code and
    any uncommitted change to it, so that a run made from uncommitted code is not reused once that
    code changes."""
    digest = hashlib.sha256()
    for path in code_files(root):
        digest.update(
            path.encode(errors="surrogateescape")
            + b"\0"
            + (file_digest(root / path) or "-").encode()
        )
    return digest.hexdigest()


def package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


@functools.cache
def machine() -> dict[str, Any]:
    """What times a run: the CPU's model, the cores this process may use, nvidia-smi's GPUs."""
    try:
        cpuinfo = read_file(Path("/proc/cpuinfo")).decode(errors="replace").splitlines()
        cpu = next(line.split(":", 1)[1] for line in cpuinfo if line.startswith("model name"))
    except (OSError, ReadFailed, StopIteration):
        cpu = platform.processor() or platform.machine()
    cpu = cpu.strip()
    try:
        query = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
        smi = subprocess.run(query, capture_output=True, text=True, timeout=20)
        gpus = smi.stdout.strip().splitlines() if smi.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired):
        gpus = []
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu, "cores": cores, "gpus": gpus}


def run_identity(command: list[str], threads: str | None, root: Path) -> dict[str, Any]:
    """What makes a run of train.py with command (its config files and flags) in root: a finished
    run is reused only when all of it is the same, and its dataset's contents (dataset_content).
    threads: OMP_NUM_THREADS, which changes its seconds, as the machine does."""
    files = [a for a in command if not a.startswith("--")]
    return {
        "command": command,
        "omp_num_threads": threads,
        "config_files": {f: file_digest(root / f) for f in files},
        "code": code_digest(root),
        "python": platform.python_version(),
        **{name: package_version(name) for name in PACKAGES},
        "machine": machine(),
    }


def dataset_content(out_dir: Path, root: Path) -> dict[str, str | None] | None:
    """The contents of the dataset that the run in out_dir trained on (its manifest's
    data_dir/dataset, from root, where train.py runs) as they are now: the SHA-256 of its meta.pkl
    and token files by name (data/identity.py's, the token files' kept in token_ids.json); None
    where out_dir has no manifest naming a dataset that can be read. Its contents, not its name nor
    its files' times: the same command names the same folder, which may have been prepared again
    from other text."""
    try:
        settings = json.loads(read_file(out_dir / "manifest.json"))["settings"]
        folder = root / settings["data_dir"] / settings["dataset"]
        files = dataset_identity(folder, check_token_ids(folder, 2**16))["files"]
    except (OSError, UserError, ValueError, KeyError, TypeError):
        return None
    return {name: file.get("sha256") for name, file in files.items()}


def read_records(out_dir: Path) -> list[dict[str, Any]] | None:
    """The records of out_dir/log.jsonl; None where it is missing or not a log."""
    try:
        lines = read_file(out_dir / "log.jsonl").decode().splitlines()
        records = [json.loads(line) for line in lines if line.strip()]
    except (OSError, ReadFailed, ValueError):
        return None
    return records if all(isinstance(r, dict) and "iter" in r for r in records) else None


def last_eval(out_dir: Path) -> int | None:
    """The iteration of the last eval of the last run in out_dir's log (None: no eval, no log)."""
    records = read_records(out_dir) or []
    start = max(
        (i for i in range(1, len(records)) if records[i]["iter"] < records[i - 1]["iter"]),
        default=0,
    )
    evals = [r["iter"] for r in records[start:] if "val_loss" in r]
    return evals[-1] if evals else None


def finished(out_dir: Path, identity: dict[str, Any], max_iters: int) -> dict[str, Any] | None:
    """When out_dir holds a run of exactly this identity that counts, what its mark recorded of it
    (when it started, its wall seconds, its outcome); else None. It counts when its mark says so and
    its log ends with the eval at max_iters, or when it diverged (stopped on non-finite steps, its
    log ending where it stopped)."""
    try:
        mark = json.loads(read_file(out_dir / MARK))
    except (OSError, ReadFailed, ValueError):
        return None
    if (
        not isinstance(mark, dict)
        or mark.get("identity") != identity
        or not isinstance(mark.get("ran"), dict)
    ):
        return None
    ran, end = mark["ran"], last_eval(out_dir)
    counted = end == max_iters or (ran.get("outcome") == "diverged" and end is not None)
    return ran if ran.get("outcome") in COUNTED and counted else None


def mark_finished(out_dir: Path, identity: dict[str, Any], ran: dict[str, Any]) -> None:
    write_json(out_dir / MARK, {"identity": identity, "ran": ran})


def last_said(output: Path) -> str:
    """What a run said last: its last error or 'stopped by' line, else its last line."""
    try:
        text = read_file(output).decode(errors="replace")
        lines = [line.strip() for line in text.splitlines() if line.strip()]
    except (OSError, ReadFailed):
        lines = []
    told = [line for line in lines if line.startswith(("error:", "stopped by"))]
    return (told or lines or ["(no output)"])[-1]


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def outcome(returncode: int, out_dir: Path, max_iters: int) -> tuple[str, str]:
    """What a train.py exit means, and the line that says why: 'finished' (exit 0, its log at
    max_iters), 'diverged' (its error: non-finite steps), 'killed' (by a signal), 'stopped' (before
    max_iters: asked to stop, it saved and exited), or 'failed'."""
    said = last_said(out_dir / "train.out")
    # a signal's, or a shell's way of saying one (130: a second Ctrl-C)
    if returncode < 0 or returncode > 128:
        return (
            "killed",
            f"killed by {signal_name(-returncode if returncode < 0 else returncode - 128)}",
        )
    if returncode == 0:
        return ("finished", said) if last_eval(out_dir) == max_iters else ("stopped", said)
    if said.startswith("error:") and "non-finite" in said:
        return "diverged", said
    return "failed", said


class Runs:
    """The train.py processes going now. Once the benchmark stops (a signal in asked, which
    catch_signals fills, or a run that failed) no more start; stop() asks each going to stop
    (SIGTERM: train.py finishes its step, saves and exits), kill() ends them at once (SIGKILL)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.going: dict[subprocess.Popen, str] = {}  # process -> which run
        self.asked: list[str] = []  # the signals the benchmark received, by name
        self.failed = False  # a run failed
        self.stopped: list[str] = []  # the runs that ended unfinished as the benchmark stopped

    @property
    def stopping(self) -> bool:
        return bool(self.asked) or self.failed

    def run(
        self, which: str, command: list[str], output: Path, env: dict[str, str], cwd: Path
    ) -> int | None:
        """command's exit status, its stdout and stderr in output (made afresh: a link or a FIFO
        there is removed, not written through or waited on); None when the benchmark stopped before
        it started."""
        with self.lock:
            if self.stopping:
                return None
            output.unlink(missing_ok=True)
            with open(output, "x") as out:
                process = subprocess.Popen(
                    command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env
                )
            self.going[process] = which
        try:
            return process.wait()
        finally:
            with self.lock:
                del self.going[process]

    def stop(self) -> list[str]:
        """SIGTERM to every run going; which they are."""
        with self.lock:
            for process in self.going:
                process.send_signal(signal.SIGTERM)
            return list(self.going.values())

    def kill(self) -> None:
        with self.lock:
            for process in self.going:
                process.kill()

    def supervise(self, futures: list[Future], grace_s: float = GRACE_S) -> None:
        """Wait for futures, the runs. At a signal, or once a run has failed, stop the runs going;
        kill those still going grace_s later, or at once at a second signal."""
        deadline = None
        while wait(futures, timeout=0.2).not_done:
            self.failed = self.failed or any(
                f.done() and f.exception() is not None for f in futures
            )
            if deadline is None and self.stopping:
                going, deadline = self.stop(), time.monotonic() + grace_s
                if self.asked and going:
                    print(
                        f"{self.asked[0]}: stopping {', '.join(going)} (SIGTERM to train.py; "
                        "killed in "
                        f"{grace_s:.0f} s, or at once at a second signal)",
                        file=sys.stderr,
                        flush=True,
                    )
            if deadline is not None and (len(self.asked) > 1 or time.monotonic() > deadline):
                self.kill()


def catch_signals(asked: list[str]) -> dict[int, Any]:
    """Make SIGTERM and SIGINT (unless ignored, as in a shell's background job) append their name to
    asked; returns the handlers they had."""
    before = {}
    for number in (signal.SIGTERM, signal.SIGINT):
        if signal.getsignal(number) is not signal.SIG_IGN:
            before[number] = signal.signal(
                number, lambda n, frame: asked.append(signal.Signals(n).name)
            )
    return before


if __name__ == "__main__":
    raise SystemExit("error: ttl_runs.py is a module of lab/time_to_loss.py: run that one (--help)")
