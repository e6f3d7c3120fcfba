"""Low-bit weights for generation: every Linear of a trained model quantized once, at load, to int8
(one scale per output row) or int4 (a scale and a zero per group of 32 inputs). Decoding a token
reads every weight once, so its time is the weights' bytes: a quarter and an eighth of float32's. On
a CPU with AVX-512 VNNI the products run on ours (nanogpt_perf/kernels/vnni.py: the activations
quantized to int8 per group of 32 on the way in); elsewhere int8 on FBGEMM's kernel (the activations
quantized per row; weight-only torch._weight_int8pack_mm where FBGEMM is absent) and int4 on
torch._weight_int4pack_mm_for_cpu (weight-only). Elsewhere, and as the reference the tests hold
those kernels to, the weight is dequantized inside the product (what torch.compile fuses on a GPU).
And PackedLinear: bfloat16 (or float32) weights packed once for oneDNN. The kernels that take their
packed weights as an object of their own reach torch.compile through two ops of ours
(nanogpt_perf::fbgemm_int8, ::onednn_linear)."""

import itertools
import sys
import warnings
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nanogpt_perf.config import setting
from nanogpt_perf.kernels import vnni

QUANTIZE = ("none", "int8", "int4")
# the dtype a CPU's kernels compute in best (dtype='auto' on a CPU: sample.py, lab/generate.py):
# int8 float32, which FBGEMM takes and with which ours keeps float32's greedy tokens (bfloat16: +6%
# tokens/s, 94% of them on the CPU demo's model: docs/sample.md); int4 bfloat16, PyTorch's kernel's
# float32 path being ~30x slower, and ours 4% faster in it (int4's own error dominating)
CPU_DTYPE = {"none": "float32", "int8": "float32", "int4": "bfloat16"}
INT4_GROUP = vnni.GROUP  # inputs per int4 scale and zero (PyTorch's kernel takes 32 to 256)
# the CPU kernels' packings take output rows in multiples of 16: a head of 65 gets 15 zero rows
ROWS = vnni.ROWS


def quantize_int8(w: Tensor) -> tuple[Tensor, Tensor]:
    """w (N, K) as int8 rows q and their scales s (N,), symmetric: w ~ q * s[:, None], |q| <=
    127."""
    scale = w.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def quantize_int4(w: Tensor, group: int = INT4_GROUP) -> tuple[Tensor, Tensor, Tensor]:
    """w (N, K) as 4-bit codes q (N, K) in 0..15 with a scale and a zero (N, K / group) per group of
    inputs, asymmetric over each group's range: w ~ (q - 8) * scale + zero, the CPU kernel's
    form."""
    N, K = w.shape
    groups = w.view(N, K // group, group)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    scale = ((high - low) / 15).clamp(min=torch.finfo(torch.float32).tiny)
    q = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15)
    return q.view(N, K).to(torch.int32), scale, low + 8 * scale


def has_vnni() -> bool:
    """Whether this CPU multiplies int8 with VNNI, AVX-512's or AVX's (no int16 saturation:
    FBGEMM's activations may use 8 bits)."""
    return bool({"avx512_vnni", "avx_vnni"} & vnni.cpu_flags())


def fbgemm_usable() -> bool:
    """FBGEMM's dynamic int8 Linear is here: an x86 CPU's build of a PyTorch that still has it (it
    takes its weights as a qint8 tensor, a dtype PyTorch 2.13 deprecates:
    pytorch/pytorch#184982)."""
    ops = torch.ops.quantized
    engines = torch.backends.quantized.supported_engines
    return "fbgemm" in engines and hasattr(ops, "linear_dynamic") and hasattr(ops, "linear_prepack")


# the packed weights of the CPU kernels that take them as an object of their own (FBGEMM's,
# oneDNN's), by the slot their Linear holds: torch.compile traces the slot, an int, into the custom
# ops below, and not the object
PACKED: dict[int, object] = {}
SLOTS = itertools.count()


def hold(module: nn.Module, packed: object) -> int:
    """A slot holding packed for as long as module lives."""
    slot = next(SLOTS)
    PACKED[slot] = packed
    weakref.finalize(module, PACKED.pop, slot, None)
    return slot


def packed(slot: int) -> object:
    """The packed weights in slot, found through sys.modules: the ops outlive this module imported
    again."""
    return sys.modules[__name__].PACKED[slot]


# the ops that carry them, defined with torch.library's lower-level API (a call costs ~3 us,
# custom_op's ~10), once a process
if not hasattr(torch.ops.nanogpt_perf, "fbgemm_int8"):
    OPS = torch.library.Library("nanogpt_perf", "FRAGMENT")
    OPS.define("fbgemm_int8(Tensor x01, int slot, int n_out, bool reduce_range) -> Tensor")
    OPS.define("onednn_linear(Tensor x, int slot, int n_out, Tensor? bias) -> Tensor")
    OPS.impl(
        "fbgemm_int8",
        lambda x, slot, n, rr: torch.ops.quantized.linear_dynamic(x, packed(slot), rr),
        "CPU",
    )
    OPS.impl("onednn_linear", lambda x, slot, n, bias: torch.ops.mkldnn._linear_pointwise(
        x, packed(slot), bias, "none", [], ""), "CPU")  # fmt: skip
    torch.library.register_fake(
        "nanogpt_perf::fbgemm_int8", lambda x, slot, n, rr: x.new_empty(x.size(0), n)
    )
    torch.library.register_fake(
        "nanogpt_perf::onednn_linear", lambda x, slot, n, b: x.new_empty(*x.shape[:-1], n)
    )


def fbgemm_int8(x01: Tensor, slot: int, n_out: int, reduce_range: bool) -> Tensor:
    """FBGEMM's dynamic int8 product of the rows x01 (M, K) and the weights in slot: (M, n_out) in
    float32; through the op only under torch.compile (eagerly, its dispatch costs more than the
    call)."""
    if torch.compiler.is_compiling():
        return torch.ops.nanogpt_perf.fbgemm_int8(x01, slot, n_out, reduce_range)
    return torch.ops.quantized.linear_dynamic(x01, PACKED[slot], reduce_range)


class PackedLinear(nn.Module):
    """nn.Linear for inference on a CPU, its weight packed once into oneDNN's blocked layout (the
    ops torch.compile's CPU freezing uses) in dtype, taking and giving ordinary tensors."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype):
        super().__init__()
        weight = linear.weight.detach().to(dtype)
        self.slot, self.n_out = (
            hold(self, torch.ops.mkldnn._reorder_linear_weight(weight, 1)),
            weight.size(0),
        )
        self.register_buffer(
            "bias", None if linear.bias is None else linear.bias.detach().to(dtype)
        )

    @property
    def weight(self) -> Tensor:
        return PACKED[self.slot]

    def forward(self, x: Tensor) -> Tensor:
        if torch.compiler.is_compiling():
            return torch.ops.nanogpt_perf.onednn_linear(x, self.slot, self.n_out, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, PACKED[self.slot], self.bias, "none", [], "")


def padded(w: Tensor) -> Tensor:
    """w (N, ...) with zero rows up to a multiple of ROWS."""
    return torch.cat((w, w.new_zeros(-len(w) % ROWS, *w.shape[1:])))


def int8_kernel(device: torch.device, in_features: int) -> str | None:
    """Int8Linear's kernel on device: ours where a CPU has AVX-512 VNNI, it builds
    (nanogpt_perf/kernels/vnni.py) and the inputs come in whole groups, else FBGEMM's where usable,
    else the weight-only one on a CPU, else none (the dequantizing product)."""
    if device.type != "cpu":
        return None
    if vnni.problem() is None and in_features % vnni.GROUP == 0:
        return "vnni"
    return "fbgemm" if fbgemm_usable() else "int8pack"


class Int8Linear(nn.Module):
    """nn.Linear with int8 weights and a float scale per output row. kernel 'vnni': vnni.py's, the
    activations quantized to int8 per group of 32 (the weight's rows padded to a multiple of ROWS,
    in its layout); 'fbgemm' (an x86 CPU without it): FBGEMM's int8 product, about twice as fast as
    the weight-only kernel here (docs/sample.md), each row of activations quantized to 8 bits over
    its own range, mapped onto [0, 1] first; either way a row's quantization never depends on the
    rows beside it (a speculative step's rows are the decode step's, bit for bit). 'int8pack':
    torch._weight_int8pack_mm (other CPUs, weight-only); None: the weight dequantized inside the
    product (a GPU, where torch.compile fuses it; and the reference the tests hold the kernels
    to)."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype, kernel: str | None = "auto"):
        super().__init__()
        q, scale = quantize_int8(linear.weight.detach().float())
        auto = kernel == "auto"
        self.kernel = int8_kernel(linear.weight.device, linear.in_features) if auto else kernel
        self.out_features = len(q)
        bias = linear.bias
        bias = q.new_zeros(len(q), dtype=torch.float32) if bias is None else bias.detach().float()
        if self.kernel == "vnni":
            loaded()
            codes, bits = vnni.pack_int8(padded(q), padded(scale))
            self.register_buffer("weight", codes)
            self.register_buffer("scale", bits)
            self.register_buffer("bias", bias.to(dtype))
            return
        self.register_buffer("weight", q)
        self.register_buffer("scale", scale.to(torch.float32 if self.kernel == "fbgemm" else dtype))
        self.register_buffer("bias", bias.to(self.scale.dtype))
        if self.kernel == "fbgemm":
            zero = torch.zeros(q.size(0), dtype=torch.long)
            with warnings.catch_warnings():  # the qint8 dtype's deprecation (fbgemm_usable)
                warnings.simplefilter("ignore", UserWarning)
                rows = torch._make_per_channel_quantized_tensor(q, scale.double(), zero, 0)
            self.slot = hold(self, torch.ops.quantized.linear_prepack(rows, None))
            self.register_buffer("row_sums", (q.float() * scale[:, None]).sum(dim=1))
            self.reduce_range = not has_vnni()  # 7-bit activations, else int16 sums could saturate

    def forward(self, x: Tensor) -> Tensor:
        if self.kernel == "vnni":
            rows = x.reshape(-1, x.size(-1))
            y = torch.ops.nanogpt_perf.int8_vnni_mm(
                rows, self.weight, self.scale, self.out_features
            )
            return y.view(*x.shape[:-1], -1) + self.bias
        if self.kernel == "fbgemm":
            rows = x.reshape(-1, x.size(-1)).float()
            low, high = torch.aminmax(rows, dim=-1, keepdim=True)
            span = (high - low).clamp_(min=torch.finfo(torch.float32).tiny)
            y = fbgemm_int8((rows - low) / span, self.slot, self.weight.size(0), self.reduce_range)
            # x = low + span * x01
            y = torch.addcmul(self.bias, low, self.row_sums).addcmul_(y, span)
            return y.view(*x.shape[:-1], -1).to(x.dtype)
        if self.kernel == "int8pack":
            y = torch._weight_int8pack_mm(x.reshape(-1, x.size(-1)), self.weight, self.scale)
            return y.view(*x.shape[:-1], -1) + self.bias
        # one kernel once compiled
        return F.linear(x, self.weight.to(x.dtype)) * self.scale + self.bias


def int4_kernel(device: torch.device) -> str | None:
    """Int4Linear's kernel on device: ours with int8 activations where a CPU has AVX-512 VNNI and
    it builds (nanogpt_perf/kernels/vnni.py), else PyTorch's weight-only one on a CPU, else none
    (the dequantizing product)."""
    if device.type != "cpu":
        return None
    return "vnni" if vnni.problem() is None else "int4pack"


def loaded() -> None:
    """The VNNI kernels loaded, which a Linear asked for them explicitly needs."""
    if why := vnni.problem():
        raise ValueError(f"the VNNI kernels cannot run: {why}")


KERNEL_NAMES = {"vnni": "ours (int8 activations on AVX-512 VNNI)", "fbgemm": "FBGEMM's",
                "int8pack": "PyTorch's weight-only", "int4pack": "PyTorch's weight-only",
                None: "the weight dequantized inside the product"}  # fmt: skip


def kernel_note(model: nn.Module, quantize: str) -> str:
    """The line that says which kernels model's quantize products take, and on a CPU why not
    ours."""
    used = {m.kernel for m in model.modules() if isinstance(m, (Int8Linear, Int4Linear))}
    note = f"{quantize} products: " + ", ".join(sorted(KERNEL_NAMES[k] for k in used))
    why = vnni.problem() if None not in used and "vnni" not in used else None
    return note + (f"; not ours: {why}" if why else "")


class Int4Linear(nn.Module):
    """nn.Linear with 4-bit weights, a scale and a zero per group of INT4_GROUP inputs, computing in
    dtype. kernel 'vnni': vnni.py's, each row of activations quantized to int8 per group on the
    way in, the scales and zeros held in bfloat16 whatever dtype (about 1.5x as fast as 'int4pack'
    here: docs/sample.md); 'int4pack': torch._weight_int4pack_mm_for_cpu (weight-only); both take
    the rows padded to a multiple of ROWS. None: the codes two to a byte, dequantized inside the
    product (a GPU; and the reference the tests hold the kernels to)."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype, kernel: str | None = "auto"):
        super().__init__()
        w = linear.weight.detach().float()
        self.out_features = w.size(0)
        self.kernel = int4_kernel(w.device) if kernel == "auto" else kernel
        if self.kernel is not None:
            w = padded(w)
        q, scale, zero = quantize_int4(w)
        if self.kernel == "vnni":
            loaded()
            codes, scale_zero = vnni.pack_int4(q, scale, zero)
        else:
            if self.kernel == "int4pack":
                codes = torch._convert_weight_to_int4pack_for_cpu(q, 1)
            else:
                codes = (q[:, 0::2] | q[:, 1::2] << 4).to(torch.uint8)
            # (K / group, N, 2): the CPU kernel's order, a scale then a zero for every group and row
            scale_zero = torch.stack((scale, zero), -1).transpose(0, 1).contiguous().to(dtype)
        self.register_buffer("codes", codes)
        self.register_buffer("scale_zero", scale_zero)
        self.register_buffer(
            "bias", None if linear.bias is None else linear.bias.detach().to(dtype)
        )

    def dequantized(self, dtype: torch.dtype) -> Tensor:
        """The weight (N, K) that kernel None's codes stand for: (q - 8) * scale + zero."""
        q = torch.stack((self.codes & 15, self.codes >> 4), dim=-1).flatten(1).to(dtype)
        scale, zero = self.scale_zero.to(dtype).transpose(0, 1).unbind(-1)  # (N, K / group) each
        groups = q.view(q.size(0), scale.size(1), -1)
        return ((groups - 8) * scale[..., None] + zero[..., None]).flatten(1)

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, x.size(-1))
        if self.kernel == "vnni":
            y = torch.ops.nanogpt_perf.int4_vnni_mm(
                rows, self.codes, self.scale_zero, self.out_features
            )
        elif self.kernel == "int4pack":
            y = torch._weight_int4pack_mm_for_cpu(rows, self.codes, INT4_GROUP, self.scale_zero)
            y = y[:, : self.out_features]
        else:
            y = F.linear(rows, self.dequantized(x.dtype))
        y = y.view(*x.shape[:-1], -1)
        return y if self.bias is None else y + self.bias


@dataclass
class QuantizeConfig:
    """Low-bit weights for generation"""

    quantize: str = setting(
        "none",
        "the Linears' weights at load: int8 (a scale per row), int4 (a scale and a zero per 32 "
        "inputs); for a CPU (on a GPU, bfloat16 decodes faster: docs/sample.md)",
        choices=QUANTIZE,
    )


def int4_problem(model: nn.Module) -> str | None:
    """Why model's Linears cannot be int4 (an input width not a multiple of the group), or None."""
    widths = sorted({m.in_features for m in model.modules() if type(m) is nn.Linear})
    if odd := [k for k in widths if k % INT4_GROUP]:
        return (
            f"int4 needs every Linear's input width to be a multiple of {INT4_GROUP}, not {odd[0]}"
        )
    return None


def replace_linears(model: nn.Module, make) -> nn.Module:
    """model with every nn.Linear replaced in place by make(linear); a tied lm_head gets a weight of
    its own, the embedding keeping the float one (a lookup reads one row a token). For inference
    only."""
    for module in list(model.modules()):
        for name, child in module.named_children():
            if type(child) is nn.Linear:
                setattr(module, name, make(child))
    return model


def quantize_linears(model: nn.Module, quantize: str, dtype: torch.dtype) -> nn.Module:
    """replace_linears with the quantize ('int8' or 'int4') form of each, computing in dtype."""
    return replace_linears(
        model, lambda linear: (Int8Linear if quantize == "int8" else Int4Linear)(linear, dtype)
    )
