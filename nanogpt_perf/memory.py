"""Memory figures: the peak a run reached, on a GPU (CUDA's allocator) or a CPU (the process's resident set)."""

import resource
from pathlib import Path

import torch


def peak_memory_bytes(device: torch.device) -> int | None:
    """Peak memory of this run: allocated on the GPU, or the process's peak resident set on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    if device.type == "mps":
        return torch.mps.driver_allocated_memory()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def peak_reserved_bytes(device: torch.device) -> int | None:
    """Peak memory held by CUDA's caching allocator (allocated plus cached); None where there is no such pool."""
    return torch.cuda.max_memory_reserved(device) if device.type == "cuda" else None


def reset_peak_memory(device: torch.device) -> bool:
    """Start a new peak for peak_memory_bytes; False where the peak cannot be reset (it stays the process's)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return True
    if device.type == "cpu":
        try:
            Path("/proc/self/clear_refs").write_text("5")  # Linux: resets the peak resident set to the current one
            return True
        except OSError:
            return False
    return False
