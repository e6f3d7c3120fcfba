"""The one builder of what trains: the model (given, or from the settings), compiled and wrapped for the ranks, its
optimizer, the GradScaler and the TrainStep. train.py, bench.py's measurement and the micro-batch search all build
through build_training, so that what bench.py times is what train.py runs, and a new setting reaches all three."""

from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from model import GPT
from nanogpt_perf.data.loader import TokenBatches
from nanogpt_perf.optim import build_optimizer
from nanogpt_perf.runtime import Runtime
from nanogpt_perf.settings import model_config
from nanogpt_perf.train.parallel import unwrap, wrap_model
from nanogpt_perf.train.step import TrainStep


class Training(NamedTuple):
    model: torch.nn.Module  # as it runs: compiled when asked, under DDP or FSDP2 when torch.distributed is up
    raw_model: GPT  # the plain model under those wrappers (its state dict has plain names)
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    step: TrainStep


def optimizer_for(model: GPT, s: dict[str, Any]) -> torch.optim.Optimizer:
    """The optimizer the settings s name, over model's parameters (FSDP's shards, once it is sharded)."""
    hyper = dict(learning_rate=s["learning_rate"], weight_decay=s["weight_decay"], betas=(s["beta1"], s["beta2"]))
    muon = {k: s[k] for k in ("muon_lr", "muon_momentum", "muon_weight_decay", "muon_ns_steps")}
    return build_optimizer(model, s["optimizer"], fused=s["fused_adamw"], **hyper, **muon)


def build_training(
    s: dict[str, Any],
    runtime: Runtime,
    batches: TokenBatches,
    model: GPT | None = None,
    vocab_size: int | None = None,
) -> Training:
    """What the settings s train, on runtime's device: model (else a new GPT of s for vocab_size tokens), moved to
    the device and compiled in compile_mode when s asks (the one place a model is compiled), wrapped in DDP or
    sharded by FSDP2 (parallelism) under torch.distributed; its optimizer, a GradScaler (float16 only), and the
    TrainStep over batches with this rank's share of gradient_accumulation_steps (over all ranks) a step. The caller
    seeds torch's generator first: a new model draws its weights here."""
    model = model if model is not None else GPT(model_config(s, vocab_size))
    wrapped = wrap_model(model, s.get("parallelism", "ddp"), runtime, s["compile"], s["compile_mode"])
    optimizer = optimizer_for(unwrap(wrapped), s)
    scaler = runtime.grad_scaler()
    accumulation = s["gradient_accumulation_steps"] // (dist.get_world_size() if dist.is_initialized() else 1)
    step = TrainStep(wrapped, optimizer, scaler, runtime, batches, accumulation, s["grad_clip"])
    return Training(wrapped, unwrap(wrapped), optimizer, scaler, step)
