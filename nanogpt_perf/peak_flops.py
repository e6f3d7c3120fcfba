"""The dense peak FLOP/s of known GPUs at each matmul precision: the denominator of MFU."""

import torch

from model import GPT

# Dense (no structured sparsity) tensor-core peaks in TFLOP/s, with fp32 accumulation for bf16 and
# fp16 (what PyTorch's matmuls use), from the vendor's data sheets and whitepapers named beside each
# entry. "fp32" is the non-tensor rate. Matched against the device's name in order, so that more
# specific names come first: "h100 nvl" before "h100", "gh200" before "h200", "a100" before "a10",
# "l40s" before "l40" before "l4".
PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    # NVIDIA H100 Tensor Core GPU data sheet (sparse figures halved)
    ("h100 nvl", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    ("h100 pcie", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2}),
    ("h100", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),  # SXM
    # NVIDIA GH200 Grace Hopper Superchip data sheet: the H100/H200 SXM GPU
    ("gh200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    # NVIDIA H200 Tensor Core GPU data sheet (sparse figures halved)
    ("h200 nvl", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    ("h200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),  # SXM
    # NVIDIA A100 Tensor Core GPU data sheet
    ("a100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    # NVIDIA A10 data sheet
    ("a10", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    # NVIDIA L40S and L40 data sheets
    ("l40s", {"bf16": 362.05, "fp16": 362.05, "tf32": 183.0, "fp32": 91.6}),
    ("l40", {"bf16": 181.05, "fp16": 181.05, "tf32": 90.5, "fp32": 90.5}),
    # NVIDIA L4 data sheet
    ("l4", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    # NVIDIA Ada GPU architecture whitepaper, RTX 6000 Ada and GeForce RTX 4090 tables ("with FP32
    # Accumulate")
    ("rtx 6000 ada", {"bf16": 364.2, "fp16": 364.2, "tf32": 182.1, "fp32": 91.1}),
    ("rtx 4090", {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6}),
    # NVIDIA Ampere GA102 GPU architecture whitepaper, RTX A6000 and GeForce RTX 3090 tables ("with
    # FP32 Accumulate"; GeForce cards accumulate in fp32 at half their fp16-accumulate rate of 142)
    ("rtx a6000", {"bf16": 154.8, "fp16": 154.8, "tf32": 77.4, "fp32": 38.7}),
    ("rtx 3090", {"bf16": 71.0, "fp16": 71.0, "tf32": 35.6, "fp32": 35.6}),
    # NVIDIA V100 and T4 data sheets: no bf16 or tf32 units
    ("v100", {"fp16": 125.0, "fp32": 15.7}),
    ("t4", {"fp16": 65.0, "fp32": 8.1}),
]


def mfu(
    model: GPT,
    fwdbwd_per_iter: int,
    dt: float,
    device: torch.device,
    precision: str,
    peak_flops: float | None = None,
) -> float | None:
    """The model FLOPs utilisation of an iteration of dt seconds against the peak of this device at
    this precision (peak_flops, FLOP/s, overrides the table); None when the peak is unknown, rather
    than guessing one."""
    peak = peak_flops or device_peak_flops(device, precision)
    return model.estimate_mfu(fwdbwd_per_iter, dt, peak) if peak else None


def device_peak_flops(device: torch.device | str, precision: str) -> float | None:
    """Peak FLOP/s of a CUDA device at 'bf16', 'fp16', 'tf32' or 'fp32'; None when not in the
    table."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return peak_flops_for_name(torch.cuda.get_device_name(device), precision)


def peak_flops_for_name(name: str, precision: str) -> float | None:
    """The first entry whose key is in the device's name (case-insensitive), at this precision; else
    None."""
    name = name.lower()
    for key, peaks in PEAK_TFLOPS:
        if key in name:
            tflops = peaks.get(precision)
            return tflops * 1e12 if tflops else None
    return None
