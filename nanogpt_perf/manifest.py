"""Run provenance: what produced a result (the code's version, the software, the hardware, the
settings)."""

import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from nanogpt_perf.runtime import Runtime, device_name

REPO_ROOT = Path(__file__).resolve().parents[1]


def git_state(path: Path) -> tuple[str, bool | None]:
    """The commit checked out at path and whether the checkout has changes: ('unknown', None)
    outside git."""
    try:
        head = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True
        )
        status = subprocess.run(
            ["git", "-C", str(path), "status", "--porcelain"], capture_output=True, text=True
        )
    except OSError:  # no git on this machine
        return "unknown", None
    if head.returncode != 0 or status.returncode != 0:
        return "unknown", None
    return head.stdout.strip(), bool(status.stdout.strip())


def gpu_driver_version() -> str | None:
    """The NVIDIA driver's version from nvidia-smi; None where there is none."""
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = smi.stdout.split()
    return lines[0] if smi.returncode == 0 and lines else None


def run_manifest(settings: dict[str, Any], runtime: Runtime) -> dict[str, Any]:
    """What produced a result: the code's version, the software, the hardware and the resolved
    settings."""
    commit, dirty = git_state(REPO_ROOT)
    cuda = runtime.device_type == "cuda"
    return {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git_commit": commit,
        "git_dirty": dirty,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "driver": gpu_driver_version(),
        "device": str(runtime.device),
        "device_name": device_name(runtime.device),
        "device_count": torch.cuda.device_count() if cuda else 1,
        "cpu_threads": torch.get_num_threads(),
        "dtype": runtime.dtype,
        "tf32": runtime.tf32,
        "settings": settings,
    }
