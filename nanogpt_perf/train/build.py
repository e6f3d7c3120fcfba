"""The one builder of what trains: the model (given, or from the settings), compiled and wrapped for
the ranks, its optimizer, the GradScaler and the TrainStep. train.py, bench.py's measurement and the
micro-batch search all build through build_training, so that what bench.py times is what train.py
runs, and a new setting reaches all three."""

import importlib.util
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
import torch.distributed as dist

from model import GPT, GPTConfig
from nanogpt_perf.config import Config, setting
from nanogpt_perf.data.loader import TokenBatches
from nanogpt_perf.errors import UserError
from nanogpt_perf.guard.weights import model_size_problem
from nanogpt_perf.in_backward import OptimizerInBackward
from nanogpt_perf.kernels import triton_problem
from nanogpt_perf.lowmem import cast_weights, lowmem_rules
from nanogpt_perf.optim import build_optimizer, muon_rules, optimizer_rules
from nanogpt_perf.runtime import Runtime, resolve_device
from nanogpt_perf.train.parallel import PARALLELISMS, unwrap, wrap_model
from nanogpt_perf.train.step import TrainStep

# nanoGPT's train.py trains without biases; GPTConfig's default (True) is GPT-2's, which its
# checkpoints need
TRAINING_DEFAULTS = {"bias": False}


@dataclass
class BuildConfig:
    """How the model is made from the settings and the data, and wrapped for torchrun's ranks"""

    pad_vocab: int = setting(64, "vocab_size rounded up to a multiple of this (50257 -> 50304); 1 "
                             "= off", min=1, note=" (1 = off)")  # fmt: skip
    parallelism: str = setting("ddp", "under torchrun: a whole model per rank, or FSDP2 (all of it "
                               "sharded)", choices=PARALLELISMS)  # fmt: skip


def round_up(n: int, multiple: int) -> int:
    """n rounded up to a multiple, e.g. a vocab of 50257 padded to 50304 (a multiple of 64) for
    faster matmuls."""
    return -(-n // multiple) * multiple


def model_config(cfg: Config, vocab_size: int) -> GPTConfig:
    """The GPTConfig of the settings for a vocabulary of vocab_size tokens (the data's, padded to a
    multiple of pad_vocab); a UserError for a model too large to build here."""
    padded = round_up(vocab_size, cfg.pad_vocab)
    if problem := model_size_problem(cfg.n_layer, cfg.n_embd, padded, cfg.block_size):
        raise UserError(problem)
    return replace(cfg.model, vocab_size=padded)


def kernels_run_here(cfg: Config) -> None:
    """The rule between loss_impl and the device: 'triton' needs triton and a device its kernel runs
    on, 'liger' needs liger-kernel."""
    if cfg.loss_impl == "triton" and (problem := triton_problem(resolve_device(cfg.device))):
        raise ValueError(
            f"loss_impl='triton' cannot run here: {problem}; 'plain' or 'fused' run everywhere"
        )
    if cfg.loss_impl == "liger" and importlib.util.find_spec("liger_kernel") is None:
        raise ValueError(
            "loss_impl must be plain or fused here: liger needs liger-kernel (pip install -e "
            "'.[liger]'; CUDA only)"
        )


# the rules between settings of every script that builds a training (train.py adds the schedule's)
BUILD_RULES = (muon_rules, kernels_run_here, lowmem_rules, optimizer_rules)


class Training(NamedTuple):
    # as it runs: compiled when asked, under DDP or FSDP2 when torch.distributed is up
    model: torch.nn.Module
    raw_model: GPT  # the plain model under those wrappers (its state dict has plain names)
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    step: TrainStep


def build_training(
    cfg: Config,
    runtime: Runtime,
    batches: TokenBatches,
    model: GPT | None = None,
    vocab_size: int | None = None,
) -> Training:
    """What the settings train, on runtime's device: model (else a new GPT of cfg for vocab_size
    tokens), its weights in weights_dtype (the memory savers, nanogpt_perf/lowmem.py), moved to the
    device and compiled in compile_mode when cfg asks (the one place a model is compiled), wrapped
    in DDP or sharded by FSDP2 (parallelism) under torch.distributed; its optimizer (with the
    savers' state formats), a GradScaler (float16 only), and the TrainStep over batches with this
    rank's share of gradient_accumulation_steps (over all ranks) a step, stepping inside backward
    when in_backward asks. The caller seeds torch's generator first: a new model draws its weights
    here."""
    model = model if model is not None else GPT(model_config(cfg, vocab_size))
    spec = cfg.lowmem
    # the savers' rules again, on the step's shape as it runs (batch 'auto')
    if spec.in_backward or spec.offload:
        try:
            lowmem_rules(cfg)
        except ValueError as e:
            raise UserError(str(e)) from None
    cast_weights(model, spec)  # bfloat16 weights: before DDP or compile see the parameters
    wrapped = wrap_model(model, cfg.parallelism, runtime, cfg.compile, cfg.compile_mode)
    optimizer = build_optimizer(unwrap(wrapped), cfg.optim, spec)
    scaler = runtime.grad_scaler()
    accumulation = cfg.gradient_accumulation_steps // (
        dist.get_world_size() if dist.is_initialized() else 1
    )
    in_backward = OptimizerInBackward(unwrap(wrapped), optimizer) if spec.in_backward else None
    step = TrainStep(
        wrapped, optimizer, scaler, runtime, batches, accumulation, cfg.grad_clip, in_backward
    )
    return Training(wrapped, unwrap(wrapped), optimizer, scaler, step)
