"""Below model.py, which imports them only when GPTConfig.loss_impl asks for one: the losses that
never make all of lm_head's logits (losses.py) and the Triton kernel of one of them (classifier.py,
imported only for loss_impl='triton'; pip install -e ".[triton]"); and vnni.py, int8 and int4
weights times int8 activations on a CPU, which nanogpt_perf/quantize.py imports. They import torch
(and triton), nothing of the project but one another."""

import importlib.util
import os

import torch


def triton_problem(device: torch.device | str) -> str | None:
    """Why the kernels cannot run on device, or None: they need triton, and a CUDA device or, on a
    CPU, triton's interpreter (TRITON_INTERPRET=1: slow, for tests)."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install -e '.[triton]')"
    device = torch.device(device)
    interpreted = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on")
    if device.type == "cuda" or (device.type == "cpu" and interpreted):
        return None
    return (
        f"its Triton kernel runs on CUDA devices, not {device.type} (on a CPU only under "
        "TRITON_INTERPRET=1)"
    )
