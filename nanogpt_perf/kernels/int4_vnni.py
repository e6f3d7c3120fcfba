"""int4 weights times int8 activations on AVX-512 VNNI (int4_vnni.cpp): built once per source and
PyTorch version with the C++ compiler torch.compile uses on a CPU, kept in a cache folder and loaded
as the op nanogpt_perf::int4_vnni_mm; pack, its weights' layout; reference, the same arithmetic in
torch ops, which the tests hold the kernel to."""

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
from torch import Tensor

SOURCE = Path(__file__).with_name("int4_vnni.cpp")
GROUP, ROWS = 32, 16  # inputs per scale and zero; output rows per block
ISA = ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni")
FLAGS = ["-O3", "-std=c++17", "-shared", "-fPIC", "-fopenmp", "-mfma", "-mavx512f", "-mavx512bw",
         "-mavx512dq", "-mavx512vl", "-mavx512vnni"]  # fmt: skip


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split()}


def cache_folder() -> Path:
    """Where the built library is kept: $XDG_CACHE_HOME/nanogpt_perf (~/.cache), else a temporary
    folder's."""
    home = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    for folder in (Path(home) / "nanogpt_perf", Path(tempfile.gettempdir()) / "nanogpt_perf"):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if os.access(folder, os.W_OK):
                return folder
        except OSError:
            continue
    raise OSError("no writable cache folder for the int4 kernel")


def build(compiler: str) -> Path:
    """The library, compiled unless this source's is in the cache already; written under a name of
    its own first, so that processes building it at once never load half a file."""
    from torch.utils import cpp_extension

    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    key = hashlib.sha256(
        SOURCE.read_bytes() + f"{torch.__version__} {compiler} {abi} {FLAGS}".encode()
    ).hexdigest()[:16]
    library = cache_folder() / f"int4_vnni-{key}.so"
    if not library.exists():
        part = library.with_suffix(f".{os.getpid()}.part")
        includes = [f"-isystem{p}" for p in cpp_extension.include_paths()]
        links = [f"-L{p}" for p in cpp_extension.library_paths()] + ["-lc10", "-ltorch_cpu"]
        command = [compiler, *FLAGS, abi, *includes, str(SOURCE), "-o", str(part), *links]
        subprocess.run(command, check=True, capture_output=True, text=True)
        os.replace(part, library)
    return library


@functools.cache
def problem() -> str | None:
    """Why the kernel cannot run here, or None once it is loaded: it needs an x86 CPU with AVX-512
    VNNI and a C++ compiler ($CXX, else c++)."""
    if missing := [flag for flag in ISA if flag not in cpu_flags()]:
        return f"this CPU has no {missing[0]}"
    compiler = shutil.which(os.environ.get("CXX", "c++"))
    if compiler is None:
        return f"no C++ compiler ({os.environ.get('CXX', 'c++')}) to build it"
    if not hasattr(torch.ops.nanogpt_perf, "int4_vnni_mm"):
        try:
            torch.ops.load_library(build(compiler))
        except subprocess.CalledProcessError as e:
            said = (e.stderr or "").strip().splitlines()[-1:] or [f"exit status {e.returncode}"]
            return f"building it with {compiler} failed: {said[0]}"
        except OSError as e:
            return f"building or loading it failed: {e}"
        torch.library.register_fake(
            "nanogpt_perf::int4_vnni_mm", lambda x, codes, sz, n: x.new_empty(x.size(0), n)
        )
    return None


def pack(q: Tensor, scale: Tensor, zero: Tensor) -> tuple[Tensor, Tensor]:
    """The kernel's layout of q (N, K) in 0..15, N a multiple of ROWS, and its scale and zero (N, K
    / GROUP): codes (N / 16, K / 8, 64) uint8, byte 4 r + j of chunk c holding row r's inputs 8 c +
    j (low nibble) and 8 c + 4 + j (high); scale_zero (N / 16, K / GROUP, 2, 16), bfloat16's bits
    as int16 (which a model's .to(dtype) leaves as they are)."""
    N, K = q.shape
    q = q.to(torch.uint8).view(N // ROWS, ROWS, K // 8, 2, 4)
    codes = (q[:, :, :, 0] | q[:, :, :, 1] << 4).transpose(1, 2).reshape(N // ROWS, K // 8, 64)
    sz = torch.stack((scale, zero)).view(2, N // ROWS, ROWS, K // GROUP).permute(1, 3, 0, 2)
    return codes, sz.to(torch.bfloat16).contiguous().view(torch.int16)


def reference(x: Tensor, q: Tensor, scale: Tensor, zero: Tensor) -> Tensor:
    """The kernel's arithmetic in float64 torch ops: x (M, K) quantized to int8 per group of 32 as
    the kernel does it, times q (N, K) per group, scaled; scale and zero as the kernel holds them
    (bfloat16). The product (M, N) in float32."""
    M, K = x.shape
    groups = x.float().view(M, K // GROUP, GROUP)
    amax = groups.abs().amax(-1, keepdim=True)
    # 127 / amax, divided as the kernel divides (a number over a tensor takes its reciprocal first)
    inverse = torch.where(amax > 0, amax.new_tensor(127.0) / amax, 0)
    a = torch.round(groups * inverse).clamp(-128, 127).double()
    dot = torch.einsum("mgk,ngk->mng", a, q.double().view(len(q), K // GROUP, GROUP))
    scale, zero = (t.to(torch.bfloat16).double() for t in (scale, zero))
    d = (amax / 127).double().squeeze(-1)[:, None]  # (M, 1, G)
    centred = (dot - 8 * a.sum(-1)[:, None]) * d * scale
    return (centred + zero * groups.double().sum(-1)[:, None]).sum(-1).float()
