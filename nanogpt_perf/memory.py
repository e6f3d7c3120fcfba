"""Memory figures: the peak a run reached, on a GPU (CUDA's allocator) or a CPU (the process's resident set); whether
a model's weights can fit this machine at all."""

import resource
from pathlib import Path

import torch

from nanogpt_perf.runtime import host_memory_bytes


def peak_memory_bytes(device: torch.device) -> int | None:
    """Peak memory of this run: allocated on the GPU, or the process's peak resident set on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    if device.type == "mps":
        return torch.mps.driver_allocated_memory()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def held_memory_bytes(device: torch.device) -> int | None:
    """Memory in use now: allocated on the GPU, or the process's resident set on a CPU."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    if device.type == "cpu" and Path("/proc/self/statm").is_file():
        return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()
    return None


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


def model_size_problem(n_layer: int, n_embd: int, vocab_size: int, block_size: int) -> str | None:
    """Why a GPT of this shape cannot be built here (its float32 weights alone outweigh this machine's memory),
    or None: an absurd size is one error line, not an allocation failure or hours of building layers."""
    params = n_layer * 12 * n_embd**2 + (vocab_size + block_size) * n_embd  # the blocks, the embeddings
    memory = host_memory_bytes()
    if memory is None or 4 * params <= memory:
        return None
    return (
        f"a GPT of n_layer={n_layer}, n_embd={n_embd}, vocab_size={vocab_size}, block_size={block_size} has "
        f"about {params:.3g} parameters, {4 * params / 1e9:,.0f} GB in float32: more than this machine's "
        f"{memory / 1e9:,.0f} GB of memory"
    )
