"""Bigger models in less memory (issue 33): the savers of training state, each off by default.

Every run holds 16 bytes of training state per parameter with AdamW (float32 weights 4, gradients 4,
moments 8) and about 13 with Muon. The savers, the settings of a LowMemConfig:
- weights_dtype='bfloat16': the weights (so the gradients) in bfloat16, 2 + 2 bytes, updated with
  stochastic rounding (torchao's, in its AdamWs and in MuonAdamW): no float32 master copy;
- state_bits=8 or 4: AdamW's moments in torchao's AdamW8bit / AdamW4bit (block-wise dynamic maps, 2
  or 1 byte);
- muon_momentum_dtype='bfloat16' or '8bit': Muon's momentum (MuonAdamW's);
- in_backward=True: each parameter's step taken inside backward, as soon as its gradient is whole,
  and the gradient freed there (nanogpt_perf/in_backward.py): no full gradient buffer;
- offload=True: on CUDA, AdamW's state and step on the host (torchao's CPUOffloadOptimizer).

nanogpt_perf/train/build.py applies them: cast_weights before the model is wrapped or compiled, the
optimizer built by optim.build_optimizer, whose table (OPTIMIZERS) says which of these formats each
optimizer keeps and how, OptimizerInBackward given to the TrainStep; lowmem_rules is the rule
between them and the rest of a run. A checkpoint's low-bit state: nanogpt_perf/lowmem_state.py."""

import os
from dataclasses import dataclass, fields, replace
from importlib.util import find_spec
from typing import Any

import torch
from torch import nn

from nanogpt_perf.config import Config, setting
from nanogpt_perf.errors import quiet_loggers
from nanogpt_perf.lowbit import MOMENTUM_DTYPES
from nanogpt_perf.runtime import resolve_device, resolve_dtype

WEIGHTS_DTYPES = ("float32", "bfloat16")
STATE_BITS = (32, 8, 4)
TORCHAO = "torchao"  # the extra that brings it: pip install -e ".[lowmem]"


def one_of_state_bits(bits: int) -> None:
    if bits not in STATE_BITS:
        raise ValueError(f"one of {', '.join(map(str, STATE_BITS))}")


@dataclass
class LowMemConfig:
    """The memory savers (nanogpt_perf/lowmem.py, docs/lowmem.md): each off by default, today's
    training bit for bit"""

    weights_dtype: str = setting("float32", "'bfloat16': weights and gradients in bf16, updated "
                                 "with stochastic rounding, no float32 copy",
                                 choices=WEIGHTS_DTYPES)  # fmt: skip
    state_bits: int = setting(32, "AdamW's moments: 32 (the weights' dtype), 8 or 4 bits (torchao)",
                              check=one_of_state_bits)  # fmt: skip
    muon_momentum_dtype: str = setting("float32", "Muon's momentum buffer", choices=MOMENTUM_DTYPES)
    in_backward: bool = setting(
        False, "each parameter's optimizer step inside backward, its gradient freed there"
    )
    offload: bool = setting(
        False, "CUDA: AdamW's state and step on the host (torchao's CPUOffloadOptimizer)"
    )

    @property
    def torchao_adamw(self) -> bool:
        """Whether AdamW's share is torchao's: for bfloat16 weights (stochastic rounding) or a
        low-bit state."""
        return self.weights_dtype == "bfloat16" or self.state_bits != 32

    @property
    def needs_torchao(self) -> bool:
        return self.torchao_adamw or self.muon_momentum_dtype == "8bit" or self.offload

    @property
    def weight_bytes(self) -> int:
        return 2 if self.weights_dtype == "bfloat16" else 4

    @property
    def grad_bytes(self) -> int:
        """A parameter's gradient at its fullest: none held with in_backward (each freed as it is
        stepped)."""
        return 0 if self.in_backward else self.weight_bytes

    @property
    def moment_bytes(self) -> float:
        """AdamW's two moments of a parameter: in the weights' dtype each, or 1 or 0.5 byte each at
        8 or 4 bits."""
        return 2 * self.weight_bytes if self.state_bits == 32 else self.state_bits / 4

    def applied(self, optimizer: str) -> "LowMemConfig":
        """The savers as they apply to optimizer: AdamW keeps no Muon momentum."""
        return self if optimizer == "muon" else replace(self, muon_momentum_dtype="float32")

    def describe(self) -> str:
        """The savers on, as their settings: "weights_dtype='bfloat16', state_bits=8"."""
        default = LowMemConfig()
        on = [f.name for f in fields(self) if getattr(self, f.name) != getattr(default, f.name)]
        return ", ".join(f"{k}={getattr(self, k)!r}" for k in on) or "no saver"


def lowmem_rules(cfg: Config) -> None:
    """The rules between the savers and the rest of a run (a cross rule: the first conflict raises
    its one line). Under torchrun (WORLD_SIZE > 1) the run is DDP or FSDP by parallelism; else one
    process. muon_momentum_dtype is not applied under optimizer='adamw' (as muon_lr is not), so that
    config/low_memory.py serves either."""
    spec = cfg.lowmem
    if spec.needs_torchao and find_spec(TORCHAO) is None:
        raise ValueError(f"{spec.describe()} needs torchao: pip install -e '.[lowmem]'")
    ranks = int(os.environ.get("WORLD_SIZE", "1")) > 1
    parallelism = cfg.parallelism if ranks else None
    if spec != LowMemConfig() and parallelism == "fsdp":
        raise ValueError(
            f"{spec.describe()} is for whole tensors, not FSDP's shards: use parallelism='ddp'"
        )
    if spec.weights_dtype == "bfloat16" and parallelism == "ddp":
        raise ValueError(
            "weights_dtype='bfloat16' rounds each update with random draws of each rank's own "
            "generator: DDP's "
            "replicas would drift apart (run one process, or weights_dtype='float32' with "
            "state_bits=8)"
        )
    if spec.in_backward:
        dtype = (
            resolve_dtype(resolve_device(cfg.device), "auto")[0]
            if cfg.dtype == "auto"
            else cfg.dtype
        )
        in_backward_rules(cfg.grad_clip, cfg.gradient_accumulation_steps, parallelism, dtype)
    if spec.offload:
        offload_rules(spec, resolve_device(cfg.device).type, cfg.grad_clip)


def in_backward_rules(
    grad_clip: float, accumulation: int, parallelism: str | None, dtype: str
) -> None:
    """What the step inside backward cannot do: each parameter steps as soon as its gradient is
    whole, before the gradients of the others exist, and its gradient is freed there."""
    if grad_clip > 0.0:
        raise ValueError(
            "in_backward=True steps each parameter before the gradient norm over all of them "
            "exists: "
            f"grad_clip={grad_clip} cannot clip it (set grad_clip=0.0, or in_backward=False)"
        )
    if accumulation > 1:
        raise ValueError(
            "in_backward=True steps on each backward pass: "
            f"gradient_accumulation_steps={accumulation} would need "
            "the full gradient kept across micro-batches (set it to 1 with a larger batch_size, "
            "or in_backward=False)"
        )
    if parallelism is not None:
        raise ValueError(
            f"in_backward=True steps on this rank's gradient before {parallelism.upper()} has "
            "reduced it over the "
            f"ranks: run one process, or in_backward=False"
        )
    if dtype == "float16":
        raise ValueError(
            "in_backward=True steps before the GradScaler has seen every gradient for an overflow: "
            "use dtype='bfloat16' or 'float32', or in_backward=False"
        )


def offload_rules(spec: LowMemConfig, device_type: str, grad_clip: float) -> None:
    if spec.in_backward:
        raise ValueError(
            "offload=True steps on the host after backward, from its own copies of the gradients: "
            "not with in_backward=True"
        )
    if device_type != "cuda":
        raise ValueError(
            "offload=True moves the optimizer's state from a CUDA device to the host: this run is "
            "on "
            f"{device_type}"
        )
    if spec.state_bits != 32:
        raise ValueError(f"offload=True keeps AdamW's state on the host in the weights' dtype, not "
                         f"state_bits={spec.state_bits}")  # fmt: skip
    if grad_clip > 0.0:
        raise ValueError(
            "offload=True copies each gradient to the host as backward makes it, before "
            f"grad_clip={grad_clip} "
            f"could clip it: set grad_clip=0.0, or offload=False"
        )


def cast_weights(model: nn.Module, spec: LowMemConfig) -> nn.Module:
    """model with its weights in spec.weights_dtype (in place; nothing changes for float32)."""
    return model.to(dtype=torch.bfloat16) if spec.weights_dtype == "bfloat16" else model


def import_torchao() -> None:
    """torchao's optimizers, imported quietly (its import logs the CUDA kernels a CPU wheel lacks,
    and a deprecation)."""
    with quiet_loggers("torchao", "torch.utils._pytree"):
        import torchao.optim  # noqa: F401


def torchao_adamw(
    spec: LowMemConfig, groups: list[dict[str, Any]], **kwargs: Any
) -> torch.optim.Optimizer:
    """torchao's AdamW for spec: AdamW8bit or AdamW4bit by state_bits, else _AdamW (moments in the
    weights' dtype); bfloat16 weights stochastically rounded in each."""
    from torchao.optim import AdamW4bit, AdamW8bit, _AdamW

    kind = {8: AdamW8bit, 4: AdamW4bit, 32: _AdamW}[spec.state_bits]
    return kind(groups, bf16_stochastic_round=spec.weights_dtype == "bfloat16", **kwargs)


def offloaded_adamw(
    spec: LowMemConfig, groups: list[dict[str, Any]], **kwargs: Any
) -> torch.optim.Optimizer:
    """torchao's CPUOffloadOptimizer over groups: each weight keeps a host copy, its gradient goes
    to the host as backward makes it, torch's fused CPU AdamW steps there (torchao's _AdamW with
    stochastic rounding for bfloat16 weights) and the weight comes back. CUDA only (lowmem_rules
    says so in one line)."""
    from torchao.optim import CPUOffloadOptimizer, _AdamW

    kind = _AdamW if spec.weights_dtype == "bfloat16" else torch.optim.AdamW
    extra = {"bf16_stochastic_round": True} if kind is _AdamW else {}
    return CPUOffloadOptimizer(groups, kind, offload_gradients=False, **kwargs, **extra)
