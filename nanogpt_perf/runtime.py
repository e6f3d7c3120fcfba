"""The device and the precision a run uses, chosen once after the settings are applied, and how to
wait for the device (it runs ahead of Python) before reading a clock."""

import platform
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from nanogpt_perf.config import setting
from nanogpt_perf.errors import UserError
from nanogpt_perf.files import host_memory_bytes

PTDTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass
class Runtime:
    device: torch.device
    dtype: str  # 'float32', 'bfloat16' or 'float16': the autocast dtype, or float32 for none
    tf32: bool  # TF32 matmuls for float32 work (CUDA only)
    reason: str  # why this device and dtype were chosen, for the start-up line

    @property
    def device_type(self) -> str:
        return self.device.type

    @property
    def autocast(self) -> bool:
        return self.dtype != "float32"

    @property
    def precision(self) -> str:
        """The precision of the matmuls, as named in peak_flops.PEAK_TFLOPS."""
        return {"bfloat16": "bf16", "float16": "fp16"}.get(
            self.dtype, "tf32" if self.tf32 else "fp32"
        )

    def autocast_ctx(self) -> AbstractContextManager:
        if not self.autocast:
            return nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=PTDTYPES[self.dtype])

    def grad_scaler(self) -> torch.amp.GradScaler:
        """Enabled for float16 only: bf16 and fp32 have the exponent range to do without loss
        scaling."""
        return torch.amp.GradScaler(self.device_type, enabled=self.dtype == "float16")

    def synchronize(self) -> None:
        """Wait for the device to finish what was queued: a no-op on a CPU, which runs each op to
        its end."""
        if self.device_type == "cuda":
            torch.cuda.synchronize(self.device)
        elif self.device_type == "mps":
            torch.mps.synchronize()

    def describe(self) -> str:
        scaler = "on" if self.dtype == "float16" else "off"
        return (
            f"device {self.device} ({device_name(self.device)}), dtype {self.dtype}, autocast "
            f"{'on' if self.autocast else 'off'}, TF32 {'on' if self.tf32 else 'off'}, GradScaler "
            f"{scaler}: "
            f"{self.reason}"
        )


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model name where the OS tells it."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu" and Path("/proc/cpuinfo").is_file():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or device.type


def device_memory_bytes(device: torch.device) -> int | None:
    """The memory of a device: a GPU's own, else this machine's (a CPU's, and Apple's shared
    memory)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return host_memory_bytes()


def check_device(device: str) -> None:
    """A ValueError saying what would be valid here (and why device is not) when device cannot be
    had."""
    n_cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    cuda = ["cuda", *(f"cuda:{i}" for i in range(n_cuda))] if n_cuda else []
    here = ["auto", "cpu", *cuda, *(["mps"] if torch.backends.mps.is_available() else [])]
    if device in here:
        return
    why = {
        "cuda": f" (this machine has {n_cuda} CUDA devices)"
        if n_cuda
        else " (CUDA is not available here)",
        "mps": " (MPS is not available here)",
    }.get(device.partition(":")[0], "")
    raise ValueError(f"one of {', '.join(here)}{why}")


# the runtime's settings, in parts that a script takes as far as it uses them (sample.py: no
# compile_mode, no peak_flops; lab/loader.py: the device alone); RuntimeConfig is all of
# them, as train.py and bench.py take them
@dataclass
class DeviceConfig:
    """The device"""

    device: str = setting("auto", "'auto' (cuda, then mps, then cpu), 'cpu', 'cuda', 'cuda:1', "
                          "'mps'", check=check_device)  # fmt: skip


@dataclass
class PrecisionConfig:
    """The precision"""

    dtype: str = setting("auto", "'auto': bf16 if supported, else fp16 + GradScaler; fp32 on CPU",
                         choices=("auto", *PTDTYPES))  # fmt: skip
    tf32: bool = setting(True, "TF32 matmuls for the float32 work (CUDA only)")


@dataclass
class SeedConfig:
    """The random seed"""

    seed: int = setting(1337, "the random seed (each rank adds its rank)", min=0)


@dataclass
class CompileConfig:
    """The compiler"""

    compile: bool = setting(True, "torch.compile the model")


@dataclass
class RuntimeConfig(CompileConfig, SeedConfig, PrecisionConfig, DeviceConfig):
    """The device, the precision, the compiler and the random seed"""

    compile_mode: str = setting("default", "torch.compile's mode", choices=COMPILE_MODES)
    peak_flops: float = setting(0.0, "the device's peak FLOP/s for MFU; 0 = look it up", min=0,
                                note=" (0 = look it up)")  # fmt: skip


def resolve_device(device: str) -> torch.device:
    """'auto' is cuda, then mps, then cpu; a device that cannot be had here is one error line."""
    try:
        check_device(device)
    except ValueError as e:
        raise UserError(f"device must be {e}, not {device!r}") from None
    if device == "auto":
        device = (
            "cuda"
            if torch.cuda.is_available()
            else "mps"
            if torch.backends.mps.is_available()
            else "cpu"
        )
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def resolve_dtype(dev: torch.device, dtype: str, cpu_auto: str = "float32") -> tuple[str, str]:
    """(dtype, why): 'auto' is bf16 where supported, else fp16 (with a GradScaler), else fp32; on
    CPU autocast is used only when bfloat16 is asked for explicitly, since CPU bf16 is often slower
    than fp32 (cpu_auto: what 'auto' is on a CPU instead, the dtype a quantized model's kernels
    compute in)."""
    bf16_ok = dev.type in ("cpu", "mps") or (dev.type == "cuda" and torch.cuda.is_bf16_supported())
    if dtype == "auto":
        if dev.type == "cpu" and cpu_auto != "float32":
            return (
                cpu_auto,
                f"dtype auto -> {cpu_auto} (on CPU, what the quantized weights' kernels compute "
                "in)",
            )
        if dev.type == "cpu":
            return (
                "float32",
                "dtype auto -> float32 (on CPU autocast only when dtype=bfloat16 is asked for)",
            )
        chosen = "bfloat16" if bf16_ok else "float16"
        return (
            chosen,
            f"dtype auto -> {chosen} ({'bf16 supported' if bf16_ok else 'no bf16 on this GPU'})",
        )
    if problem := dtype_problem(dev, dtype):
        raise UserError(problem)
    return dtype, f"dtype {dtype} as asked"


def dtype_problem(dev: torch.device, dtype: str) -> str | None:
    """Why dtype (auto or one of PTDTYPES, by its rule) cannot run on dev, or None."""
    if dtype == "bfloat16" and dev.type == "cuda" and not torch.cuda.is_bf16_supported():
        return f"dtype bfloat16 is not supported on {dev}; use float16 or auto"
    if dtype == "float16" and dev.type == "cpu":
        return "dtype float16 is not supported on CPU; use bfloat16 or float32"
    return None


def resolve_runtime(
    device: str = "auto", dtype: str = "auto", tf32: bool = True, cpu_auto: str = "float32"
) -> Runtime:
    """Choose the device, then the precision it supports best, after all overrides are applied
    (cpu_auto: see resolve_dtype); sets TF32."""
    dev = resolve_device(device)
    dtype, why = resolve_dtype(dev, dtype, cpu_auto)
    reasons = ([f"device auto -> {dev}"] if device == "auto" else []) + [why]
    use_tf32 = tf32 and dev.type == "cuda"
    if dev.type == "cuda":
        torch.set_float32_matmul_precision("high" if use_tf32 else "highest")
        torch.backends.cudnn.allow_tf32 = use_tf32
    return Runtime(dev, dtype, use_tf32, "; ".join(reasons))
