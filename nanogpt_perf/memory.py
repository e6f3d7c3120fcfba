"""Memory figures: the peak a run reached, on a GPU (CUDA's allocator) or a CPU (the process's
resident set); whether a model's weights can fit this machine at all."""

import resource
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass


def peak_memory_bytes(device: torch.device) -> int | None:
    """Peak memory of this run: allocated on the GPU, or the process's peak resident set on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    if device.type == "mps":
        return torch.mps.driver_allocated_memory()
    # Linux: VmHWM, the peak clear_refs resets (ru_maxrss can keep an older one)
    status = Path("/proc/self/status")
    lines = status.read_text().splitlines() if status.is_file() else []
    hwm = [int(line.split()[1]) for line in lines if line.startswith("VmHWM:")]
    # both in KiB
    return (hwm[0] if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def held_memory_bytes(device: torch.device) -> int | None:
    """Memory in use now: allocated on the GPU, or the process's resident set on a CPU."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    if device.type == "cpu" and Path("/proc/self/statm").is_file():
        return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()
    return None


def peak_reserved_bytes(device: torch.device) -> int | None:
    """Peak memory held by CUDA's caching allocator (allocated plus cached); None where there is no
    such pool."""
    return torch.cuda.max_memory_reserved(device) if device.type == "cuda" else None


def reset_peak_memory(device: torch.device) -> bool:
    """Start a new peak for peak_memory_bytes; False where the peak cannot be reset (it stays the
    process's)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return True
    if device.type == "cpu":
        try:
            # Linux: resets the peak resident set to the current one
            Path("/proc/self/clear_refs").write_text("5")
            return True
        except OSError:
            return False
    return False


def training_state_bytes(model: torch.nn.Module, optimizer: Any) -> dict[str, int]:
    """The training state's bytes by part, exact from the tensors' storages, each storage counted
    once (in the first part that holds it; a tied weight once): 'weights' (the trainable
    parameters), 'grads' (their .grad), 'optimizer' (every tensor in the optimizer's state, nested
    dicts included: torchao's low-bit states by their inner codes, scales and maps;
    CPUOffloadOptimizer's host copies of the weights and gradients too), and 'params', how many
    trainable parameters there are. A view is charged its whole storage: what it holds alive."""
    params = list({id(p): p for p in model.parameters() if p.requires_grad}.values())
    seen: set[tuple[str, int]] = set()
    return {
        "weights": storage_bytes(params, seen),
        "grads": storage_bytes([p.grad for p in params if p.grad is not None], seen),
        "optimizer": storage_bytes(list(optimizer_tensors(optimizer)), seen),
        "params": sum(p.numel() for p in params),
    }


def storage_bytes(tensors: list[torch.Tensor], seen: set[tuple[str, int]]) -> int:
    """The bytes of the storages under tensors not yet in seen (which they join): a Tensor subclass
    (torchao's OptimState, a DTensor) by the inner tensors it flattens to."""
    total = 0
    for t in tensors:
        if is_traceable_wrapper_subclass(t):
            names, _ = t.__tensor_flatten__()
            total += storage_bytes([getattr(t, name) for name in names], seen)
            continue
        storage = t.untyped_storage()
        key = (str(t.device), storage.data_ptr())
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


def optimizer_tensors(optimizer: Any) -> Iterator[torch.Tensor]:
    """Every tensor an optimizer keeps: its state's (through nested dicts and lists), and for
    torchao's CPUOffloadOptimizer its per-parameter optimizers', the device optimizer's and the host
    weights and gradients."""
    inner = getattr(optimizer, "optim_dict", None)  # CPUOffloadOptimizer
    if inner is not None:
        for p_host in optimizer.param_d2h_map.values():
            yield p_host
            yield p_host.grad
        for opt in [*inner.values(), *([optimizer.d_opt] if optimizer.d_opt is not None else [])]:
            yield from optimizer_tensors(opt)
        return
    yield from nested_tensors(list(optimizer.state.values()))


def nested_tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from nested_tensors(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from nested_tensors(v)


def process_peak_bytes(step: Callable[[], Any], device: torch.device) -> int | None:
    """The process peak of one call of step (a whole training step): everything the process held at
    the step's peak. On CUDA the caching allocator's peak of allocated bytes (live tensors, all of
    them: state included); on a CPU the process's peak resident set (Linux: clear_refs resets it
    first). Less what the process held before the model was built, it is the peak rise. Where a
    CPU's peak cannot be reset, the process's peak so far (an upper bound; bench.py's fit_memory_gb
    measures each size in a fresh process). None on other devices."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if not reset_peak_memory(device) and device.type != "cpu":
        return None
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return peak_memory_bytes(device)


def memory_by_part(
    step: Callable[[Callable[[str], None]], Any],
    model: torch.nn.Module,
    optimizer: Any,
    device: torch.device,
    baseline: int | None,
) -> dict[str, float] | None:
    """Bytes per trainable parameter of one training step, measured: the state by part as its
    storages hold it when backward ends (the gradients at their fullest; none left by a step inside
    backward), and 'peak', the peak rise: the step's process peak less baseline (what the process
    held before the model was built: CUDA's allocated bytes, a CPU process's resident set), whose
    rest is 'activations' (activations and workspace: autograd's saved tensors, the optimizer's
    temporaries, the allocator's slack). step(mark) runs a TrainStep with its phase callback. None
    where the peak cannot be measured. Also params, and process_peak_bytes: the process peak itself
    (what a budget must hold)."""
    parts: dict[str, int] = {}

    def mark(phase: str) -> None:
        if phase == "backward":
            parts.update(training_state_bytes(model, optimizer))

    peak = process_peak_bytes(lambda: step(mark), device)
    if peak is None or baseline is None or not parts:
        return None
    n = parts.pop("params")
    per = {k: v / n for k, v in parts.items()}
    rise = (peak - baseline) / n
    state = sum(per.values())
    figures = {"state": state, "activations": rise - state, "peak": rise, "params": n}
    return per | figures | {"process_peak_bytes": peak}
