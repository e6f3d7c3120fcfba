"""Bigger models in less memory (issue 33): the savers of training state, each off by default.

Every run holds 16 bytes of training state per parameter with AdamW (float32 weights 4, gradients 4, moments 8) and
12.6 with Muon at 350M. The savers, chosen by a LowMem:
- weights_dtype='bfloat16': the weights (so the gradients) in bfloat16, 2 + 2 bytes, updated with stochastic
  rounding (torchao's, in its AdamWs and in MuonAdamW): no float32 master copy;
- state_bits=8 or 4: AdamW's moments in torchao's AdamW8bit / AdamW4bit (block-wise dynamic maps, 2 or 1 byte);
- momentum_dtype='bfloat16' or '8bit': Muon's momentum (MuonAdamW's);
- in_backward=True: each parameter's step taken inside backward, as soon as its gradient is whole, and the gradient
  freed there (nanogpt_perf/in_backward.py): no full gradient buffer;
- offload=True: on CUDA, AdamW's state and step on the host (torchao's CPUOffloadOptimizer).

How to wire them (train.py, bench.py): lowmem_problem() among the rules, one error line; cast_weights(model, spec)
before the model is wrapped (DDP) or compiled and before its checkpoint's weights are loaded into it;
build_lowmem_optimizer() where build_optimizer() is called; OptimizerInBackward(model, optimizer) given to TrainStep
when spec.in_backward. nanogpt_perf/lowmem_state.py's check_lowmem_state() checks a checkpoint's optimizer state."""

from dataclasses import dataclass
from importlib.util import find_spec
from typing import Any

import torch
from torch import nn

from nanogpt_perf.lowmem_state import register_state_codec
from nanogpt_perf.optim import MOMENTUM_DTYPES, build_optimizer

WEIGHTS_DTYPES = ("float32", "bfloat16")
STATE_BITS = (32, 8, 4)
TORCHAO = "torchao"  # the extra that brings it: pip install -e ".[lowmem]"


@dataclass(frozen=True)
class LowMem:
    """Which savers a run uses; LowMem() is today's training, bit for bit. state_bits=32 keeps AdamW's moments in
    the weights' dtype (float32, or bfloat16 under bfloat16 weights: torchao's _AdamW)."""

    weights_dtype: str = "float32"  # or "bfloat16", stochastically rounded
    state_bits: int = 32  # AdamW's moments: 32, 8 or 4 bits
    momentum_dtype: str = "float32"  # Muon's momentum: "float32", "bfloat16" or "8bit"
    in_backward: bool = False  # the optimizer step inside backward, no full gradient buffer
    offload: bool = False  # AdamW's state and step on the host (CUDA only)

    @property
    def torchao_adamw(self) -> bool:
        """Whether AdamW's share is torchao's: for bfloat16 weights (stochastic rounding) or a low-bit state."""
        return self.weights_dtype == "bfloat16" or self.state_bits != 32

    @property
    def needs_torchao(self) -> bool:
        return self.torchao_adamw or self.momentum_dtype == "8bit"


def lowmem_problem(
    spec: LowMem,
    *,
    optimizer: str,
    device_type: str,
    grad_clip: float,
    gradient_accumulation_steps: int,
    parallelism: str | None,
    dtype: str,
) -> str | None:
    """The first conflict between the savers and a run's other settings, as one error line, or None.
    parallelism: None for one process, else 'ddp' or 'fsdp'; dtype: the autocast dtype's name ('float16' means the
    GradScaler)."""
    if problem := choice_problem(spec, optimizer):
        return problem
    if spec.needs_torchao and find_spec(TORCHAO) is None:
        return f"{describe(spec)} needs torchao: pip install -e '.[lowmem]'"
    if spec != LowMem() and parallelism == "fsdp":
        return f"{describe(spec)} is for whole tensors, not FSDP's shards: use parallelism='ddp' or one process"
    accumulation = gradient_accumulation_steps
    if spec.in_backward and (problem := in_backward_problem(grad_clip, accumulation, parallelism, dtype)):
        return problem
    return offload_problem(spec, optimizer, device_type, grad_clip) if spec.offload else None


def choice_problem(spec: LowMem, optimizer: str) -> str | None:
    if spec.weights_dtype not in WEIGHTS_DTYPES:
        return f"weights_dtype must be one of {', '.join(WEIGHTS_DTYPES)}, not {spec.weights_dtype!r}"
    if spec.state_bits not in STATE_BITS:
        return f"state_bits must be one of {', '.join(map(str, STATE_BITS))}, not {spec.state_bits!r}"
    if spec.momentum_dtype not in MOMENTUM_DTYPES:
        return f"momentum_dtype must be one of {', '.join(MOMENTUM_DTYPES)}, not {spec.momentum_dtype!r}"
    if spec.momentum_dtype != "float32" and optimizer != "muon":
        return f"momentum_dtype={spec.momentum_dtype!r} is Muon's momentum: optimizer='adamw' keeps none (state_bits)"
    return None


def in_backward_problem(grad_clip: float, accumulation: int, parallelism: str | None, dtype: str) -> str | None:
    """What the step inside backward cannot do, as one line: each parameter steps as soon as its gradient is
    whole, before the gradients of the others exist, and its gradient is freed there."""
    if grad_clip > 0.0:
        return (
            f"in_backward=True steps each parameter before the gradient norm over all of them exists: "
            f"grad_clip={grad_clip} cannot clip it (set grad_clip=0.0, or in_backward=False)"
        )
    if accumulation > 1:
        return (
            f"in_backward=True steps on each backward pass: gradient_accumulation_steps={accumulation} would need "
            f"the full gradient kept across micro-batches (set it to 1 with a larger batch_size, or in_backward=False)"
        )
    if parallelism is not None:
        return (
            f"in_backward=True steps on this rank's gradient before {parallelism.upper()} has reduced it over the "
            f"ranks: run one process, or in_backward=False"
        )
    if dtype == "float16":
        return (
            "in_backward=True steps before the GradScaler has seen every gradient for an overflow: "
            "use dtype='bfloat16' or 'float32', or in_backward=False"
        )
    return None


def offload_problem(spec: LowMem, optimizer: str, device_type: str, grad_clip: float) -> str | None:
    if spec.in_backward:
        return "offload=True steps on the host after backward, from its own copies of the gradients: not in_backward"
    if device_type != "cuda":
        return f"offload=True moves the optimizer's state from a CUDA device to the host: this run is on {device_type}"
    if optimizer != "adamw":
        return "offload=True runs AdamW on the host (torchao's CPUOffloadOptimizer): optimizer='muon' cannot be"
    if spec.state_bits != 32:
        return f"offload=True keeps AdamW's state on the host in the weights' dtype, not state_bits={spec.state_bits}"
    if grad_clip > 0.0:
        return (
            f"offload=True copies each gradient to the host as backward makes it, before grad_clip={grad_clip} "
            f"could clip it: set grad_clip=0.0, or offload=False"
        )
    return None


def describe(spec: LowMem) -> str:
    """The savers on, as their settings: "weights_dtype='bfloat16', state_bits=8"."""
    default = LowMem()
    on = [f"{k}={getattr(spec, k)!r}" for k in spec.__dataclass_fields__ if getattr(spec, k) != getattr(default, k)]
    return ", ".join(on) or "no saver"


def cast_weights(model: nn.Module, spec: LowMem) -> nn.Module:
    """model with its weights in spec.weights_dtype (in place; nothing changes for float32)."""
    return model.to(dtype=torch.bfloat16) if spec.weights_dtype == "bfloat16" else model


def build_lowmem_optimizer(
    model: nn.Module,
    optimizer: str,
    spec: LowMem,
    *,
    learning_rate: float,
    weight_decay: float,
    betas: tuple[float, float],
    fused: bool = True,
    **muon: Any,
) -> torch.optim.Optimizer:
    """optim.build_optimizer's optimizer with spec's savers: with LowMem(), exactly it (the same call). muon: its
    Muon keywords (muon_lr, muon_momentum, muon_weight_decay, muon_ns_steps, ns_dtype). With a saver on, the
    optimizer's state_dict() is plain tensors and its load_state_dict() checks and rebuilds it (lowmem_state.py).
    The weights must already be in spec.weights_dtype (cast_weights): a ValueError otherwise."""
    common = dict(learning_rate=learning_rate, weight_decay=weight_decay, betas=betas, fused=fused)
    if spec == LowMem():
        return build_optimizer(model, optimizer, **common, **muon)
    if problem := choice_problem(spec, optimizer):
        raise ValueError(problem)
    dtype = getattr(torch, spec.weights_dtype)
    if stray := [n for n, p in model.named_parameters() if p.requires_grad and p.dtype != dtype]:
        raise ValueError(f"weights_dtype={spec.weights_dtype!r}, but {stray[0]} is not: cast_weights(model, spec)")
    if spec.offload:
        return offloaded_adamw(model, spec, learning_rate, weight_decay, betas)
    if optimizer == "muon":
        inner = None
        if spec.torchao_adamw:  # the AdamW groups' moments as state_bits asks, their weights' update rounded as due
            inner = lambda groups: torchao_adamw(spec, groups, betas=betas)  # noqa: E731
        built = build_optimizer(model, "muon", **common, **muon, momentum_dtype=spec.momentum_dtype, inner_adamw=inner)
    elif spec.torchao_adamw:
        built = torchao_adamw(spec, adamw_groups(model, weight_decay), lr=learning_rate, betas=betas)
    else:  # float32 weights and state: only in_backward is on, which changes nothing here
        return build_optimizer(model, optimizer, **common, **muon)
    register_state_codec(built)
    return built


def adamw_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """configure_optimizers' two groups: weight decay on matrices and embeddings, none on vectors."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def torchao_adamw(spec: LowMem, groups: list[dict[str, Any]], **kwargs: Any) -> torch.optim.Optimizer:
    """torchao's AdamW for spec: AdamW8bit or AdamW4bit by state_bits, else _AdamW (moments in the weights' dtype);
    bfloat16 weights stochastically rounded in each."""
    from torchao.optim import AdamW4bit, AdamW8bit, _AdamW

    kind = {8: AdamW8bit, 4: AdamW4bit, 32: _AdamW}[spec.state_bits]
    return kind(groups, bf16_stochastic_round=spec.weights_dtype == "bfloat16", **kwargs)


def offloaded_adamw(
    model: nn.Module, spec: LowMem, learning_rate: float, weight_decay: float, betas: tuple[float, float]
) -> torch.optim.Optimizer:
    """torchao's CPUOffloadOptimizer over configure_optimizers' groups: each weight keeps a host copy, its gradient
    goes to the host as backward makes it, torch's fused CPU AdamW steps there (torchao's _AdamW with stochastic
    rounding for bfloat16 weights) and the weight comes back. CUDA only (lowmem_problem says so in one line)."""
    from torchao.optim import CPUOffloadOptimizer, _AdamW

    kind = _AdamW if spec.weights_dtype == "bfloat16" else torch.optim.AdamW
    extra = {"bf16_stochastic_round": True} if kind is _AdamW else {}
    groups = adamw_groups(model, weight_decay)
    return CPUOffloadOptimizer(groups, kind, offload_gradients=False, lr=learning_rate, betas=betas, **extra)
