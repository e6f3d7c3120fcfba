"""Low-bit weights times int8 activations on AVX-512 VNNI (vnni.cpp): built once per source and
PyTorch version with the C++ compiler torch.compile takes by default on a CPU ($CXX, else g++), kept
in a cache folder and loaded as the ops nanogpt_perf::int4_vnni_mm and ::int8_vnni_mm; pack_int4 and
pack_int8, their weights' layouts; reference_int4 and reference_int8, the same arithmetic in torch
ops, which the tests hold the kernels to."""

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
from torch import Tensor

SOURCE = Path(__file__).with_name("vnni.cpp")
GROUP, ROWS = 32, 16  # inputs per activation scale (and int4's weight scales); rows per block
ISA = ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni")
FLAGS = ["-O3", "-std=c++17", "-shared", "-fPIC", "-fopenmp", "-mfma", "-mavx512f", "-mavx512bw",
         "-mavx512dq", "-mavx512vl", "-mavx512vnni"]  # fmt: skip


@functools.cache
def cpu_flags() -> set[str]:
    """This CPU's flags in /proc/cpuinfo (Linux), none where it cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split()}


def cache_folder() -> Path:
    """Where the built library is kept: $XDG_CACHE_HOME/nanogpt_perf (~/.cache), else a temporary
    folder of this user's own, which no one else may write (a library found there is loaded)."""
    home = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    own = Path(tempfile.gettempdir()) / f"nanogpt_perf-{os.getuid()}"
    for folder in (Path(home) / "nanogpt_perf", own):
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            mine = folder.stat().st_uid == os.getuid() and not folder.stat().st_mode & 0o022
            if mine and os.access(folder, os.W_OK):
                return folder
        except OSError:
            continue
    raise OSError("no cache folder of this user's own to write the VNNI kernels to")


def build(compiler: str) -> Path:
    """The library, compiled unless this source's is in the cache already; written under a name of
    its own first, so that processes building it at once never load half a file."""
    from torch.utils import cpp_extension

    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    key = hashlib.sha256(
        SOURCE.read_bytes() + f"{torch.__version__} {compiler} {abi} {FLAGS}".encode()
    ).hexdigest()[:16]
    library = cache_folder() / f"vnni-{key}.so"
    if not library.exists():
        handle, part = tempfile.mkstemp(suffix=".part", dir=library.parent)
        os.close(handle)
        includes = [f"-isystem{p}" for p in cpp_extension.include_paths()]
        links = [f"-L{p}" for p in cpp_extension.library_paths()] + ["-lc10", "-ltorch_cpu"]
        command = [compiler, *FLAGS, abi, *includes, str(SOURCE), "-o", part, *links]
        try:
            subprocess.run(command, check=True, capture_output=True, text=True, timeout=600)
            os.replace(part, library)
        finally:
            Path(part).unlink(missing_ok=True)
    return library


@functools.cache
def problem() -> str | None:
    """Why the kernels cannot run here, or None once they are loaded: they need an x86 CPU with
    AVX-512 VNNI and a C++ compiler ($CXX, else g++)."""
    if not cpu_flags():
        return "this CPU's flags cannot be read (/proc/cpuinfo)"
    if missing := [flag for flag in ISA if flag not in cpu_flags()]:
        return f"this CPU has no {missing[0]}"
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None:
        return f"no C++ compiler ({os.environ.get('CXX', 'g++')}) to build it"
    if not hasattr(torch.ops.nanogpt_perf, "int4_vnni_mm"):
        try:
            torch.ops.load_library(build(compiler))
        except subprocess.CalledProcessError as e:
            lines = (e.stderr or "").splitlines()
            said = [line for line in lines if "error" in line][:1] or [f"status {e.returncode}"]
            return f"building it with {compiler} failed: {said[0].strip()}"
        except Exception as e:  # any other: the kernels' absence is the answer, not a traceback
            return f"building or loading it failed: {type(e).__name__}: {e}"
        for op in ("int4_vnni_mm", "int8_vnni_mm"):
            torch.library.register_fake(
                f"nanogpt_perf::{op}", lambda x, codes, scales, n: x.new_empty(x.size(0), n)
            )
    return None


def chunks(codes: Tensor) -> Tensor:
    """Rows of bytes (N, B) as (N / 16, B / 4, 64): chunk c of a block holds its 16 rows' bytes 4 c
    ... 4 c + 3, row after row."""
    N = len(codes)
    return codes.view(N // ROWS, ROWS, -1, 4).transpose(1, 2).reshape(N // ROWS, -1, 4 * ROWS)


def pack_int4(q: Tensor, scale: Tensor, zero: Tensor) -> tuple[Tensor, Tensor]:
    """int4_vnni_mm's layout of q (N, K) in 0..15, N a multiple of ROWS, and its scale and zero (N,
    K / GROUP): codes (N / 16, K / 8, 64) uint8, byte 4 r + j of chunk c holding row r's inputs 8 c
    + j (low nibble) and 8 c + 4 + j (high); scale_zero (N / 16, K / GROUP, 2, 16), bfloat16's bits
    as int16 (which a model's .to(dtype) leaves as they are)."""
    N, K = q.shape
    q = q.to(torch.uint8).view(N, K // 8, 2, 4)
    codes = chunks((q[:, :, 0] | q[:, :, 1] << 4).view(N, -1))
    sz = torch.stack((scale, zero)).view(2, N // ROWS, ROWS, K // GROUP).permute(1, 3, 0, 2)
    return codes, sz.to(torch.bfloat16).contiguous().view(torch.int16)


def pack_int8(q: Tensor, scale: Tensor) -> tuple[Tensor, Tensor]:
    """int8_vnni_mm's layout of q (N, K) in -127..127, N a multiple of ROWS, and its scale (N):
    codes (N / 16, K / 4, 64) uint8, q + 128, byte 4 r + j of chunk c holding row r's input 4 c +
    j; scale float32's bits as int32."""
    codes = chunks((q.to(torch.int16) + 128).to(torch.uint8))
    return codes, scale.float().contiguous().view(torch.int32)


def quantized_rows(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """x (M, K) as the kernels quantize it, in float64: a (M, K / GROUP, GROUP) int8 values, d
    (M, K / GROUP) such that x ~ d a, and x's own groups."""
    M, K = x.shape
    groups = x.float().view(M, K // GROUP, GROUP)
    amax = groups.abs().amax(-1, keepdim=True)
    # 127 / amax, divided as the kernel divides (a number over a tensor takes its reciprocal first);
    # none where there is no step to divide by
    inverse = amax.new_tensor(127.0) / amax
    a = torch.round(groups * torch.where(inverse.isfinite(), inverse, 0)).clamp(-128, 127).double()
    return a, (amax / 127).double().squeeze(-1), groups.double()


def group_dots(a: Tensor, q: Tensor) -> Tensor:
    """The exact integer sums (M, N, K / GROUP) of a (M, K / GROUP, GROUP) times the codes q (N, K)
    over each group."""
    return torch.einsum("mgk,ngk->mng", a, q.double().view(len(q), *a.shape[1:]))


def reference_int4(x: Tensor, q: Tensor, scale: Tensor, zero: Tensor) -> Tensor:
    """int4_vnni_mm's arithmetic in float64 torch ops: x (M, K) quantized as the kernel does it,
    times q (N, K) per group, scaled; scale and zero as the kernel holds them (bfloat16). The
    product (M, N) in float32."""
    a, d, groups = quantized_rows(x)
    dot = group_dots(a, q)
    scale, zero = (t.to(torch.bfloat16).double() for t in (scale, zero))
    centred = (dot - 8 * a.sum(-1)[:, None]) * d[:, None] * scale
    return (centred + zero * groups.sum(-1)[:, None]).sum(-1).float()


def reference_int8(x: Tensor, q: Tensor, scale: Tensor) -> Tensor:
    """int8_vnni_mm's arithmetic in float64 torch ops: x (M, K) quantized as the kernel does it,
    times q (N, K) per group, each group's sum by its d, the row by its scale. (M, N) in float32."""
    a, d, _ = quantized_rows(x)
    dot = group_dots(a, q)
    return ((dot * d[:, None]).sum(-1) * scale.double()).float()
