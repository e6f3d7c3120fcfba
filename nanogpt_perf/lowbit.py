"""The number formats of the memory savers (nanogpt_perf/lowmem.py): bfloat16 weights updated with
stochastic rounding, and Muon's momentum kept in float32, bfloat16 or 8 bits. The 8-bit format is
torchao's OptimState8bit (block-wise scales over a dynamic quantization map, as AdamW8bit keeps its
first moment), so that one checkpoint codec (nanogpt_perf/lowmem_state.py) serves Muon's momentum
and AdamW's moments alike. torchao is imported here only when a saver needs it (pip install -e
".[lowmem]")."""

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

MOMENTUM_DTYPES = ("float32", "bfloat16", "8bit")  # MuonAdamW's momentum_dtype
MOMENTUM_BYTES = {"float32": 4, "bfloat16": 2, "8bit": 1}  # a value's, torchao's scales left out
BLOCK_8BIT = 256  # torchao's AdamW8bit's block, and the 8-bit Muon momentum's
MIN_QUANTIZED = 4096  # torchao's (bitsandbytes') rule: smaller tensors keep a plain state


def stochastic_round_bf16(x: torch.Tensor) -> torch.Tensor:
    """x (float32) in bfloat16, rounded away from zero with the probability of the 16 bits dropped
    (over 2^16) and towards zero otherwise: unbiased, E[result] = x, where rounding to nearest loses
    any change under half a bfloat16 ulp. torchao's, drawing from torch's global generator (a resume
    restores it)."""
    from torchao.optim.quant_utils import _fp32_to_bf16_sr

    return _fp32_to_bf16_sr(x)


def quantizable(p: torch.Tensor, block_size: int) -> bool:
    """Whether a state of p's shape is kept in blocks of block_size (torchao's _new_buffer's
    rule)."""
    return p.numel() >= MIN_QUANTIZED and p.numel() % block_size == 0


def new_momentum(p: torch.Tensor, momentum_dtype: str) -> torch.Tensor:
    """A zero momentum for p: float32, bfloat16, or '8bit' (float32 where p is too small to
    quantize)."""
    if momentum_dtype == "bfloat16":
        return torch.zeros_like(p, dtype=torch.bfloat16)
    if momentum_dtype == "8bit" and quantizable(p, BLOCK_8BIT):
        from torchao.optim.subclass_8bit import OptimState8bit

        return OptimState8bit.zeros(p.shape, True, BLOCK_8BIT, p.device, dtype=torch.float32)
    return torch.zeros_like(p, dtype=torch.float32)


def dequantized(state: torch.Tensor) -> torch.Tensor:
    """A state tensor's values in float32: state itself when float32, a float32 copy otherwise."""
    # torchao's OptimStates
    return state.dequantize() if is_traceable_wrapper_subclass(state) else state.float()
