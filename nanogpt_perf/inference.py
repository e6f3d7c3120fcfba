"""Speed-ups for generation around GPT.generate_tokens: oneDNN Linear layers on a CPU, a compiled decode step."""

import time
from typing import Any

import torch

from nanogpt_perf.runtime import Runtime


def onednn_for_cpu_inference(model: torch.nn.Module, runtime: Runtime) -> torch.nn.Module:
    """For float32 inference on a CPU, model with its Linear layers converted in place to keep their weights in
    oneDNN's layout (torch.utils.mkldnn); elsewhere model as it is. One-token decoding is bound by reading every
    weight once per token, and oneDNN's matrix-vector product reads them about 1.6x faster than MKL's does for
    nn.Linear's layout (measured on AMD EPYC, see README). The tied lm_head gets a weight of its own, so the
    converted model is for inference only."""
    if runtime.device_type != "cpu" or runtime.autocast or not torch.backends.mkldnn.is_available():
        return model
    from torch.utils import mkldnn

    return mkldnn.to_mkldnn(model)


def compile_decode_step(model: torch.nn.Module, batch_size: int, runtime: Runtime) -> tuple[Any, float]:
    """torch.compile the model's one-token decode step and build it now, on a throwaway cache of the shape that
    generation will use, so that compilation is timed apart; returns the compiled step and the seconds it took."""
    decode_step = torch.compile(model.decode_step, dynamic=False)
    start = time.perf_counter()
    with torch.no_grad(), runtime.autocast_ctx():
        token = torch.zeros(batch_size, 1, dtype=torch.long, device=runtime.device)
        decode_step(token, torch.tensor(0, device=runtime.device), *model.new_cache(batch_size))
    runtime.synchronize()
    return decode_step, time.perf_counter() - start
