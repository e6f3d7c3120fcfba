"""When lab/time_to_loss.py takes a finished run instead of running train.py again (no torch): a
run's identity (run_identity and dataset_content: everything that made it, all of which must be the
same for a finished run to be reused), the mark (ttl_run.json) written in its out_dir once train.py
has ended as a run the benchmark counts, finished or diverged, read back by finished(), and what a
train.py exit means (outcome). Files are read only where they are regular files (files.open_file):
a FIFO, a socket or a device in a file's place is never waited on, nor read without end.
"""

import functools
import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
from importlib.metadata import distributions
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for its modules

from lab.plot import read_log
from lab.ttl_curves import last_run
from nanogpt_perf.data.identity import check_token_ids, dataset_identity
from nanogpt_perf.errors import UserError
from nanogpt_perf.files import ReadFailed, open_file, read_file, write_json

MARK = "ttl_run.json"  # in a run's out_dir once train.py has ended as a run that counts
COUNTED = ("finished", "diverged")  # the outcomes that are runs of the benchmark
# no run executes their Python files (the benchmark's part in a run is its command), or they are
# config files, in a run's identity by their contents where its command names them
NOT_CODE = ("tests/", "lab/", "scripts/", "docs/", "config/")
PACKAGES = ("torch", "triton", "numpy")  # what a run's steps run on, besides Python and the code


def file_digest(path: Path) -> str | None:
    """The SHA-256 of a regular file's bytes; None where it cannot be read or is not one."""
    try:
        with open_file(path) as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except (OSError, ReadFailed):
        return None


def code_digest(root: Path) -> str:
    """One SHA-256 over the path and contents of every *.py file under root, NOT_CODE left out: not
    in hidden and out* folders (.venv, .git, out-ttl), into a link only to a Python package's folder
    (not to a dataset's or a home), each folder once (a link to a package above is no loop)."""
    paths, seen = {}, set()
    for where, folders, files in os.walk(root, followlinks=True):
        if (real := os.path.realpath(where)) in seen:
            folders[:] = []
            continue
        seen.add(real)
        here = Path(where)
        folders[:] = sorted(
            f
            for f in folders
            if not f.startswith((".", "out"))
            and (not (here / f).is_symlink() or (here / f / "__init__.py").is_file())
        )
        paths |= {(here / name).relative_to(root).as_posix(): here / name for name in files}
    digest = hashlib.sha256()
    for path in sorted(p for p in paths if p.endswith(".py") and not p.startswith(NOT_CODE)):
        sha = file_digest(paths[path]) or "-"
        digest.update(path.encode(errors="surrogateescape") + b"\0" + sha.encode())
    return digest.hexdigest()


@functools.cache
def machine() -> dict[str, Any]:
    """What times a run: the CPU's model, the cores this process may use, nvidia-smi's GPUs."""
    try:
        cpuinfo = read_file(Path("/proc/cpuinfo")).decode(errors="replace").splitlines()
        cpu = next(line.split(":", 1)[1] for line in cpuinfo if line.startswith("model name"))
    except (OSError, ReadFailed, StopIteration):
        cpu = platform.processor() or platform.machine()
    try:
        query = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
        smi = subprocess.run(query, capture_output=True, text=True, timeout=20)
        gpus = smi.stdout.strip().splitlines() if smi.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired):
        gpus = []
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu.strip(), "cores": cores, "gpus": gpus}


def run_identity(command: list[str], threads: str | None, root: Path) -> dict[str, Any]:
    """What makes a run of train.py with command (its config files and flags) in root, but its data
    (dataset_content). threads: OMP_NUM_THREADS, which changes its seconds, as the machine does."""
    files = [a for a in command if not a.startswith("--")]
    return {
        "command": command,
        "omp_num_threads": threads,
        "config_files": {f: file_digest(root / f) for f in files},
        "code": code_digest(root),
        "python": platform.python_version(),
        # the first installed distribution's version, as importlib.metadata.version; None: none
        **{name: next((d.version for d in distributions(name=name)), None) for name in PACKAGES},
        "machine": machine(),
    }


def dataset_content(out_dir: Path, root: Path) -> dict[str, str | None] | None:
    """The SHA-256 of meta.pkl and of each token file, by name, of the dataset that out_dir's
    manifest names (data_dir/dataset, from root), as it is now (data/identity.py's, kept in its
    token_ids.json); None where out_dir has no manifest naming a dataset that can be read."""
    try:
        settings = json.loads(read_file(out_dir / "manifest.json"))["settings"]
        folder = root / settings["data_dir"] / settings["dataset"]
        files = dataset_identity(folder, check_token_ids(folder, 2**16))["files"]
    except (OSError, UserError, ValueError, KeyError, TypeError):
        return None
    return {name: file.get("sha256") for name, file in files.items()}


def last_eval(out_dir: Path) -> int | None:
    """The iteration of the last eval of the last run in out_dir's log (None: no eval, no log)."""
    try:
        evals = [r["iter"] for r in last_run(read_log(out_dir / "log.jsonl")) if "val_loss" in r]
    except (OSError, UserError, KeyError, TypeError):
        return None
    return evals[-1] if evals else None


def finished(out_dir: Path, identity: dict[str, Any], max_iters: int) -> dict[str, Any] | None:
    """What the mark of a run of exactly this identity in out_dir recorded (when it started, its
    wall seconds, its outcome) where it counts: its log ends with the eval at max_iters, or it
    diverged (its log ending where train.py stopped it); else None."""
    try:
        mark = json.loads(read_file(out_dir / MARK))
        ran, same = mark["ran"], mark["identity"] == identity
    except (OSError, ReadFailed, ValueError, KeyError, TypeError):
        return None
    if not same or not isinstance(ran, dict) or ran.get("outcome") not in COUNTED:
        return None
    end = last_eval(out_dir)
    return ran if end == max_iters or (ran["outcome"] == "diverged" and end is not None) else None


def mark_finished(out_dir: Path, identity: dict[str, Any], ran: dict[str, Any]) -> None:
    write_json(out_dir / MARK, {"identity": identity, "ran": ran})


def outcome(returncode: int, out_dir: Path, max_iters: int) -> tuple[str, str]:
    """What a train.py exit means, and the line that says why: 'finished' (exit 0, its log at
    max_iters), 'diverged' (its error: non-finite steps), 'killed' (by a signal), 'stopped' (before
    max_iters: asked to stop, it saved and exited), or 'failed'."""
    try:  # its last error or 'stopped by' line, else its last line
        lines = read_file(out_dir / "train.out").decode(errors="replace").splitlines()
    except (OSError, ReadFailed):
        lines = []
    lines = [x.strip() for x in lines if x.strip()]
    told = [x for x in lines if x.startswith(("error:", "stopped by"))]
    said = (told or lines or ["(no output)"])[-1]
    if returncode < 0 or returncode > 128:  # a signal's, or a shell's way of saying one
        number = -returncode if returncode < 0 else returncode - 128
        name = next((s.name for s in signal.Signals if s == number), f"signal {number}")
        return "killed", f"killed by {name}"
    if returncode == 0:
        return ("finished" if last_eval(out_dir) == max_iters else "stopped"), said
    if said.startswith("error:") and "non-finite" in said:
        return "diverged", said
    return "failed", said


if __name__ == "__main__":
    raise SystemExit("error: ttl_runs.py is a module of lab/time_to_loss.py: run that one (--help)")
