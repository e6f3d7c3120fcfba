"""The optimizers a run can train with: nanoGPT's AdamW over every parameter ('adamw'), or Muon over
the transformer blocks' matrices and AdamW over the rest ('muon'): the embeddings, an untied lm_head
and every vector, as nanochat and modded-nanogpt train. One table, OPTIMIZERS, holds them: how each
is built, which of the memory savers' state formats it keeps (nanogpt_perf/lowmem.py) and their
bytes; the one builder reads it, and a run that asks an optimizer for a format it lacks is refused
in one line naming both. An optimizer is added with a row.

'muon' is one torch.optim.Optimizer (MuonAdamW), so that step(), zero_grad(), param_groups,
state_dict() and a GradScaler work on it as on AdamW. Each of its groups keeps its base learning
rate under BASE_LR; set_lr scales every group by the schedule's ratio."""

import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

from model import adamw, decay_groups
from nanogpt_perf.config import Config, setting
from nanogpt_perf.lowbit import MOMENTUM_BYTES, MOMENTUM_DTYPES, new_momentum
from nanogpt_perf.lowmem import LowMemConfig, import_torchao, offloaded_adamw, torchao_adamw
from nanogpt_perf.lowmem_state import expected_state, register_state_codec

OPTIMIZERS: dict[str, "OptimizerKind"] = {}  # the table: its rows below the builders
# each MuonAdamW group's own learning rate before the schedule: learning_rate or muon_lr
BASE_LR = "base_lr"
# Keller Jordan's quintic Newton-Schulz coefficients and steps, as torch.optim.Muon has them
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
NS_EPS = 1e-7
# torch.optim.Muon's adjust_lr_fn: "original" (Keller Jordan's sqrt(max(1, rows/cols)), which
# nanochat and modded-nanogpt use with lrs of 0.02-0.05) rather than "match_rms_adamw" (Moonshot's
# 0.2 * sqrt(max(rows, cols)), meant to let Muon reuse AdamW's lr): on the CPU demo model (a
# probe of 300 steps, retired: git show e8c174b:benchmarks/muon.py) "original" at 0.02 reached a
# val loss of 2.25, "match_rms_adamw" at AdamW's own lr (2e-3) only 2.51, and needed 4x it to match
ADJUST_LR = "original"


@dataclass
class OptimConfig:
    """The optimizer: AdamW over every parameter, or Muon over the blocks' matrices and AdamW over
    the rest"""

    optimizer: str = setting("adamw", "'adamw', or 'muon' (OPTIMIZERS, nanogpt_perf/optim.py)",
                             choices=OPTIMIZERS)  # fmt: skip
    learning_rate: float = setting(6e-4, "AdamW's peak learning rate", min=0)
    weight_decay: float = setting(1e-1, "AdamW's, on matrices and embeddings only", min=0)
    beta1: float = setting(0.9, "AdamW's first moment's decay", interval="[0, 1)")
    beta2: float = setting(0.95, "AdamW's second moment's decay", interval="[0, 1)")
    adam_eps: float = setting(1e-8, "AdamW's epsilon, added to the root of its second moment "
                              "(torch's default)", min=0)  # fmt: skip
    grad_clip: float = setting(
        1.0, "clip the gradient norm to this; 0.0 = off", min=0, note=" (0 = off)"
    )
    fused_adamw: bool = setting(True, "AdamW's fused kernel, where the device has one")
    muon_lr: float = setting(0.02, "Muon's peak learning rate (the schedule scales it as it scales "
                             "learning_rate)", min=0)  # fmt: skip
    muon_momentum: float = setting(0.95, "Muon's Nesterov momentum", interval="[0, 1)")
    muon_weight_decay: float = setting(0.0, "Muon's decoupled weight decay", min=0)
    muon_ns_steps: int = setting(NS_STEPS, "Newton-Schulz iterations a Muon update orthogonalises "
                                 "with", min=1, max=100)  # fmt: skip


def build_optimizer(
    model: nn.Module,
    cfg: OptimConfig,
    spec: LowMemConfig | None = None,
    ns_dtype: torch.dtype | None = None,
) -> torch.optim.Optimizer:
    """The one builder: cfg.optimizer's row of OPTIMIZERS builds it over model, its state in spec's
    formats (the weights already in spec.weights_dtype: lowmem.cast_weights). With no saver on,
    exactly today's optimizer; with one, its state_dict() is plain tensors and load_state_dict()
    checks and rebuilds it (lowmem_state.py). ns_dtype: Muon's Newton-Schulz dtype, None for
    bfloat16 on CUDA and float32 elsewhere."""
    spec = (spec or LowMemConfig()).applied(cfg.optimizer)
    if problem := format_problem(cfg.optimizer, spec):
        raise ValueError(problem)
    if spec.needs_torchao:
        import_torchao()
    # a state not torch's
    saver = spec.torchao_adamw or spec.muon_momentum_dtype != "float32" or spec.offload
    dtype = getattr(torch, spec.weights_dtype)
    if saver and (
        stray := [n for n, p in model.named_parameters() if p.requires_grad and p.dtype != dtype]
    ):
        raise ValueError(
            f"weights_dtype={spec.weights_dtype!r}, but {stray[0]} is not: cast_weights(model, "
            "spec)"
        )
    built = OPTIMIZERS[cfg.optimizer].build(model, cfg, spec, ns_dtype)
    if saver and not spec.offload:
        register_state_codec(built)
    return built


def format_problem(optimizer: str, spec: LowMemConfig) -> str | None:
    """The line that refuses spec to optimizer, the first saver's value its row does not keep; None
    if it keeps them all."""
    formats = OPTIMIZERS[optimizer].formats
    for f in fields(Formats):
        value, kept = getattr(spec, f.name), getattr(formats, f.name)
        if value not in kept:
            its = ", ".join(map(repr, kept))
            return (
                f"{optimizer=!r} does not keep {f.name}={value!r} (its {f.name}: {its}; OPTIMIZERS)"
            )
    return None


def optimizer_rules(cfg: Config) -> None:
    """The rule between the optimizer and the memory savers: it keeps every format asked of it."""
    optimizer = cfg.optim.optimizer
    if problem := format_problem(optimizer, cfg.lowmem.applied(optimizer)):
        raise ValueError(problem)


def adamw_optimizer(
    model: nn.Module, cfg: OptimConfig, spec: LowMemConfig, ns_dtype: Any
) -> torch.optim.Optimizer:
    """Exactly model.configure_optimizers' AdamW, its epsilon adam_eps; over the same groups,
    torchao's AdamW for bfloat16 weights or a low-bit state, or on the host (offload)."""
    betas = (cfg.beta1, cfg.beta2)
    if spec.offload or spec.torchao_adamw:
        groups = decay_groups(model.parameters(), cfg.weight_decay)
        make = offloaded_adamw if spec.offload else torchao_adamw
        return make(spec, groups, lr=cfg.learning_rate, betas=betas, eps=cfg.adam_eps)
    optimizer = model.configure_optimizers(
        cfg.weight_decay, cfg.learning_rate, betas, fused=cfg.fused_adamw
    )
    for group in [*optimizer.param_groups, optimizer.defaults]:  # nanoGPT's call takes no epsilon
        group["eps"] = cfg.adam_eps
    return optimizer


def muon_optimizer(
    model: nn.Module, cfg: OptimConfig, spec: LowMemConfig, ns_dtype: torch.dtype | None
) -> torch.optim.Optimizer:
    """A MuonAdamW whose Muon group (lr muon_lr, decoupled decay muon_weight_decay, momentum in
    spec.muon_momentum_dtype) holds the 2-D weights of transformer.h, and whose two AdamW groups
    (learning_rate, betas, adam_eps; torchao's AdamW for the savers' formats) hold the rest, split
    as configure_optimizers splits them (model.decay_groups)."""
    if is_sharded(model):
        raise ValueError(MUON_ON_SHARDS)
    betas = (cfg.beta1, cfg.beta2)
    muon, rest = split_parameters(model)
    groups = [
        {
            "params": list(muon.values()),
            "muon": True,
            "lr": cfg.muon_lr,
            "weight_decay": cfg.muon_weight_decay,
        }
        | {"ns_steps": cfg.muon_ns_steps},
        *(
            group | {"muon": False, "lr": cfg.learning_rate, "eps": cfg.adam_eps}
            for group in decay_groups(rest, cfg.weight_decay)
        ),
    ]
    inner = None
    # the AdamW groups' moments as state_bits asks, their weights' update rounded as due
    if spec.torchao_adamw:
        inner = lambda groups: torchao_adamw(spec, groups, betas=betas)
    return MuonAdamW(
        groups,
        momentum=cfg.muon_momentum,
        betas=betas,
        fused=cfg.fused_adamw,
        ns_dtype=ns_dtype,
        momentum_dtype=spec.muon_momentum_dtype,
        inner_adamw=inner,
    )


@dataclass(frozen=True)
class Formats:
    """The memory savers' values an optimizer keeps its state in (each a LowMemConfig setting's)."""

    weights_dtype: tuple[str, ...] = ("float32",)
    state_bits: tuple[int, ...] = (32,)
    muon_momentum_dtype: tuple[str, ...] = ("float32",)
    in_backward: tuple[bool, ...] = (False,)
    offload: tuple[bool, ...] = (False,)


@dataclass(frozen=True)
class OptimizerKind:
    """A row of OPTIMIZERS: build(model, cfg, spec, ns_dtype), the formats it keeps, and
    state_bytes(spec, matrix): the bytes of optimizer state it keeps for a value of a parameter, one
    of the blocks' matrices or not (the memory report and the largest-model search read them)."""

    build: Callable[[nn.Module, OptimConfig, LowMemConfig, Any], torch.optim.Optimizer]
    formats: Formats
    state_bytes: Callable[[LowMemConfig, bool], float]


OPTIMIZERS |= {
    "adamw": OptimizerKind(
        adamw_optimizer,
        Formats(("float32", "bfloat16"), (32, 8, 4), ("float32",), (False, True), (False, True)),
        lambda spec, matrix: spec.moment_bytes,
    ),
    "muon": OptimizerKind(
        muon_optimizer,
        Formats(("float32", "bfloat16"), (32, 8, 4), MOMENTUM_DTYPES, (False, True), (False,)),
        lambda spec, matrix: (
            MOMENTUM_BYTES[spec.muon_momentum_dtype] if matrix else spec.moment_bytes
        ),
    ),
}


def state_arithmetic(model: nn.Module, cfg: OptimConfig, spec: LowMemConfig) -> dict[str, int]:
    """The training state's bytes by part as the formats say (arithmetic, beside
    memory.training_state_bytes's measurement): weights and gradients (LowMemConfig's bytes), the
    optimizer's state (its row's); torchao's scales and the small tensors it keeps plain are left
    out."""
    spec = spec.applied(cfg.optimizer)
    matrices = {id(p) for p in split_parameters(model)[0].values()}
    params = list({id(p): p for p in model.parameters() if p.requires_grad}.values())
    n = sum(p.numel() for p in params)
    per_value = OPTIMIZERS[cfg.optimizer].state_bytes
    optimizer = sum(p.numel() * per_value(spec, id(p) in matrices) for p in params)
    return {
        "weights": spec.weight_bytes * n,
        "grads": spec.grad_bytes * n,
        "optimizer": int(optimizer),
        "params": n,
    }


MUON_ON_SHARDS = "optimizer='muon' cannot run Newton-Schulz on FSDP's shards: use parallelism='ddp'"


def muon_rules(cfg: Config) -> None:
    """The rules between the optimizer and the rest of a run: Muon needs each matrix whole (not
    FSDP's shards), and a learning_rate to scale muon_lr by (the schedule's ratio to it)."""
    if cfg.optimizer != "muon":
        return
    if cfg.parallelism == "fsdp":
        raise ValueError(MUON_ON_SHARDS)
    if cfg.learning_rate == 0:
        raise ValueError(
            "optimizer='muon' scales muon_lr by the schedule's ratio to learning_rate: "
            "learning_rate must be > 0 "
            "(to freeze a group, use optimizer='adamw')"
        )


def split_parameters(model: nn.Module) -> tuple[dict[str, nn.Parameter], list[nn.Parameter]]:
    """The trainable parameters in two parts: Muon's by name (the 2-D weights of the blocks,
    transformer.h.*) and AdamW's (the other matrices: wte, wpe, an untied lm_head; and every
    vector). A tied lm_head is wte itself."""
    muon, rest = {}, []
    for name, p in model.named_parameters():
        if (
            p.requires_grad
            and name.removeprefix("_orig_mod.").startswith("transformer.h.")
            and p.dim() == 2
        ):
            muon[name] = p
        elif p.requires_grad:
            rest.append(p)
    return muon, rest


def is_sharded(model: nn.Module) -> bool:
    """Whether any parameter is a DTensor (FSDP2's shards). Without torch.distributed.tensor
    imported, none can be: so a run of one process never pays for importing it."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    return dtensor is not None and any(isinstance(p, dtensor.DTensor) for p in model.parameters())


def adamw_is_fused(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the AdamW that optimizer is, or holds (MuonAdamW's), runs the fused kernel."""
    adamw = getattr(optimizer, "adamw", optimizer)
    return adamw is not None and bool(adamw.defaults.get("fused"))


@dataclass
class ScheduleConfig:
    """The learning rate over the run: linear warmup, then cosine decay to min_lr, or
    warmup-stable-decay"""

    decay_lr: bool = setting(True, "the schedule; False: learning_rate throughout")
    lr_schedule: str = setting("cosine", "'wsd': the peak until the cooldown, then linear to "
                               "min_lr", choices=("cosine", "wsd"))  # fmt: skip
    cooldown_frac: float = setting(
        0.2, "wsd: the last fraction of lr_decay_iters that decays", interval="(0, 1]"
    )
    warmup_iters: int = setting(2000, "iterations of linear warmup", min=0)
    lr_decay_iters: int = setting(600000, "~= max_iters per Chinchilla", min=0)
    min_lr: float = setting(6e-5, "~= learning_rate / 10 per Chinchilla", min=0)


def schedule_rules(cfg: Config) -> None:
    """The schedule's settings agree: the warmup ends before the decay, which ends at min_lr <=
    learning_rate."""
    schedule = cfg.schedule
    pairs = [("warmup_iters", schedule.warmup_iters, "lr_decay_iters", schedule.lr_decay_iters)]
    pairs += [("min_lr", schedule.min_lr, "learning_rate", cfg.optim.learning_rate)]
    for name, value, limit, bound in pairs:
        if schedule.decay_lr and value > bound:
            raise ValueError(f"{name} must be <= {limit} ({bound}) when decay_lr=True, not {value}")


def get_lr(it: int, schedule: ScheduleConfig, peak: float) -> float:
    """The learning rate of iteration it for a peak of learning_rate: linear warmup (non-zero from
    the first step), cosine decay to min_lr (wsd: the peak, then a linear cooldown over the last
    cooldown_frac of lr_decay_iters), then min_lr; the peak throughout without decay_lr."""
    warmup, decay, low = schedule.warmup_iters, schedule.lr_decay_iters, schedule.min_lr
    if not schedule.decay_lr:
        return peak
    if it < warmup:
        return peak * (it + 1) / (warmup + 1)
    if it >= decay:
        return low
    if schedule.lr_schedule == "wsd":
        # 1 as the cooldown starts, 0 at its end
        left = (decay - it) / (schedule.cooldown_frac * decay)
        return low + min(left, 1.0) * (peak - low)
    ratio = (it - warmup) / (decay - warmup)
    return low + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (peak - low)


def set_lr(optimizer: torch.optim.Optimizer, lr: float, learning_rate: float) -> None:
    """Each group's lr for this step, lr being the schedule's value for a peak of learning_rate: a
    MuonAdamW group takes its BASE_LR scaled by lr / learning_rate; a group without one
    (configure_optimizers') takes lr as is. A group whose lr is a tensor (torchao's optimizers
    refuse a float) has it filled in place, with the same value."""
    ratio = lr / learning_rate if learning_rate else 0.0
    for group in optimizer.param_groups:
        value = group[BASE_LR] * ratio if BASE_LR in group else lr
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(value)
        else:
            group["lr"] = value


@contextmanager
def hyperparameters_kept(optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """Loading a state dict puts the saved groups' hyperparameters back (betas, weight decay, fused,
    momentum, ns_steps, ...): this run's, which its settings built the groups with, are restored
    after it, so that a resumed run trains with the settings it prints; the state (moments, momentum
    buffers, steps) is the checkpoint's."""
    kept = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    yield
    for group, values in zip(optimizer.param_groups, kept, strict=True):
        group.update(values)


class MuonAdamW(torch.optim.Optimizer):
    """One optimizer over two kinds of group, told apart by group['muon']: Muon's (nesterov
    momentum, the update orthogonalized by Newton-Schulz, decoupled weight decay) and AdamW's, which
    an inner torch.optim.AdamW runs over the same group dicts and the same state. The Muon update is
    torch.optim.Muon's, but for the dtype of its Newton-Schulz iteration (PyTorch's is always
    bfloat16, several times slower than float32 on a CPU without bf16 units): equal to it bit for
    bit with ns_dtype=torch.bfloat16.

    momentum_dtype keeps Muon's momentum in 'float32' (torch.optim.Muon's), 'bfloat16' (rounded to
    nearest) or '8bit' (torchao's block-wise dynamic-map OptimState8bit, as AdamW8bit keeps its
    first moment; float32 for a matrix under 4096 values or not a multiple of 256 of them, as
    torchao does); each step computes in float32. A bfloat16 weight takes Muon's update with
    stochastic rounding (torchao's), never to nearest: an update under half a bfloat16 ulp would
    otherwise be lost. inner_adamw(groups) builds the inner AdamW (torchao's low-bit ones:
    nanogpt_perf/lowmem.py); None for torch.optim.AdamW."""

    def __init__(
        self,
        param_groups: list[dict[str, Any]],
        *,
        momentum: float = 0.95,
        betas: tuple[float, float] = (0.9, 0.999),
        fused: bool = False,
        ns_dtype: torch.dtype | None = None,
        momentum_dtype: str = "float32",
        inner_adamw: Callable[[list[dict[str, Any]]], torch.optim.Optimizer] | None = None,
    ) -> None:
        if momentum_dtype not in MOMENTUM_DTYPES:
            raise ValueError(
                f"momentum_dtype must be one of {', '.join(MOMENTUM_DTYPES)}, not "
                f"{momentum_dtype!r}"
            )
        self.ns_dtype, self.momentum_dtype = ns_dtype, momentum_dtype
        muon_defaults = dict(
            momentum=momentum,
            nesterov=True,
            ns_coefficients=NS_COEFFICIENTS,
            ns_steps=NS_STEPS,
            eps=NS_EPS,
            adjust_lr_fn=ADJUST_LR,
        )
        for group in param_groups:
            group.setdefault(BASE_LR, group["lr"])
            if group["muon"]:
                if any(p.dim() != 2 for p in group["params"]):
                    raise ValueError("Muon takes 2-D parameters only")
                for key, value in muon_defaults.items():
                    group.setdefault(key, value)
        adamw_groups = [g for g in param_groups if not g["muon"]]
        make_adamw = inner_adamw or (lambda groups: adamw(groups, betas, fused))
        self.adamw = make_adamw(adamw_groups) if adamw_groups else None
        super().__init__(param_groups, {})
        self._share_with_adamw()

    def _share_with_adamw(self) -> None:
        """The inner AdamW's groups are this optimizer's AdamW groups (the same dicts) and its state
        this state."""
        if self.adamw is not None:
            groups = [g for g in self.param_groups if not g["muon"]]
            self.adamw.__setstate__({"state": self.state, "param_groups": groups})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["muon"]:
                self._muon_step(group)
        if self.adamw is not None:
            self.adamw.step()
        return loss

    def _muon_step(self, group: dict[str, Any]) -> None:
        """torch.optim.Muon's update, its elementwise parts as one foreach op over the group's
        matrices each (the same kernels tensor by tensor, a Python call fewer per matrix)."""
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return
        if self.momentum_dtype != "float32" or any(p.dtype == torch.bfloat16 for p in params):
            for p in params:
                self._muon_step_lowmem(group, p)
            return
        lr, momentum, grads = group["lr"], group["momentum"], [p.grad for p in params]
        for p in params:
            if "momentum_buffer" not in self.state[p]:
                self.state[p]["momentum_buffer"] = torch.zeros_like(
                    p.grad, memory_format=torch.preserve_format
                )
        bufs = [self.state[p]["momentum_buffer"] for p in params]
        torch._foreach_lerp_(bufs, grads, 1 - momentum)
        updates = torch._foreach_lerp(grads, bufs, momentum) if group["nesterov"] else bufs
        if group["weight_decay"]:  # a multiplication by 1.0 would change no bit
            torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
        for p, update in zip(params, updates, strict=True):
            dtype = self.ns_dtype or (torch.bfloat16 if p.device.type == "cuda" else torch.float32)
            update = orthogonalize(
                update, group["ns_coefficients"], group["ns_steps"], group["eps"], dtype
            )
            p.add_(update, alpha=-lr * lr_scale(group["adjust_lr_fn"], p.shape))

    def _muon_step_lowmem(self, group: dict[str, Any], p: torch.Tensor) -> None:
        """_muon_step's update for one matrix whose momentum or weight is not float32: the momentum
        read into float32, updated and stored back in its own format; the weight updated in float32
        and, when bfloat16, stochastically rounded back."""
        from nanogpt_perf.lowbit import dequantized, stochastic_round_bf16

        state, lr, momentum = self.state[p], group["lr"], group["momentum"]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = new_momentum(p, self.momentum_dtype)
        buf, grad = state["momentum_buffer"], p.grad.float()
        m = dequantized(buf).lerp_(grad, 1 - momentum)
        buf.copy_(m)  # a no-op for a float32 buffer, which m is
        update = grad.lerp(m, momentum) if group["nesterov"] else m
        dtype = self.ns_dtype or (torch.bfloat16 if p.device.type == "cuda" else torch.float32)
        update = orthogonalize(
            update, group["ns_coefficients"], group["ns_steps"], group["eps"], dtype
        )
        weight = p.float()  # p itself when float32
        if group["weight_decay"]:
            weight.mul_(1 - lr * group["weight_decay"])
        weight.add_(update, alpha=-lr * lr_scale(group["adjust_lr_fn"], p.shape))
        if p.dtype == torch.bfloat16:
            p.copy_(stochastic_round_bf16(weight))
        elif weight is not p:
            p.copy_(weight)

    def __getstate__(
        self,
    ) -> dict[str, Any]:  # copy.deepcopy and pickle keep the inner AdamW and the dtypes
        return {**super().__getstate__(), "adamw": self.adamw, "ns_dtype": self.ns_dtype} | {
            "momentum_dtype": self.momentum_dtype
        }

    def state_like(self, p: torch.Tensor, device: torch.device | str) -> dict[str, torch.Tensor]:
        """The state (but its step) kept for p, as zeros on device, for the checkpoint's checks
        (lowmem_state.expected_state): Muon's momentum, or the inner AdamW's moments."""
        group = next(g for g in self.param_groups if any(q is p for q in g["params"]))
        if group["muon"]:
            like = torch.empty_like(p, device=device)
            return {"momentum_buffer": new_momentum(like, self.momentum_dtype)}
        return expected_state(self.adamw, p, device)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch.optim.Optimizer's, for a MuonAdamW's state with the same kinds of group only; each
        group keeps this optimizer's hyperparameters (hyperparameters_kept: the settings win over
        the checkpoint's)."""
        kinds = [g["muon"] for g in self.param_groups]
        saved = [g.get("muon") for g in state_dict.get("param_groups", [])]
        if saved != kinds:
            raise ValueError(
                f"the optimizer state is not Muon's (its groups are muon={saved}, not {kinds})"
            )
        with hyperparameters_kept(self):
            super().load_state_dict(state_dict)
        self._share_with_adamw()


def orthogonalize(
    G: torch.Tensor,
    coefficients: tuple[float, float, float],
    steps: int,
    eps: float,
    dtype: torch.dtype,
) -> torch.Tensor:
    """torch.optim.Muon's quintic Newton-Schulz iteration, in dtype: G (2-D) with its singular
    values pushed towards 1 (into about [0.7, 1.2]), computed on the wide orientation so that the
    Gram matrix is the small one. In float32 or float64, on a matrix wide enough that it costs fewer
    FLOPs, the same iteration in Gram form."""
    tall = G.size(0) > G.size(1)
    X = G.to(dtype).T if tall else G.to(dtype)
    X = X / X.norm().clamp(min=eps)  # spectral norm <= Frobenius norm <= 1
    gram = dtype in (torch.float32, torch.float64) and gram_is_cheaper(*X.shape, steps)
    X = (gram_newton_schulz if gram else newton_schulz)(X, coefficients, steps)
    return X.T if tall else X


def newton_schulz(
    X: torch.Tensor, coefficients: tuple[float, float, float], steps: int
) -> torch.Tensor:
    """steps of X <- aX + (bA + cA^2)X, A = X X^T, for a wide X: torch.optim.Muon's, op for op."""
    a, b, c = coefficients
    for _ in range(steps):
        A = X @ X.T
        X = torch.addmm(X, torch.addmm(A, A, A, beta=b, alpha=c), X, beta=a)
    return X


def gram_newton_schulz(
    X: torch.Tensor, coefficients: tuple[float, float, float], steps: int
) -> torch.Tensor:
    """The Newton-Schulz steps X <- P(A) X, P(A) = aI + bA + cA^2, A = X X^T, for a wide X (m, n),
    on m x m matrices alone: every X_k is Q_k X_0 with Q_k a polynomial in A_0, so A_{k+1} = P_k A_k
    P_k and Q_{k+1} = P_k Q_k, and X itself is multiplied once at each end. Equal in exact
    arithmetic; in float32 to about 1e-6 (bfloat16 drifts: Dao AI Lab's Gram Newton-Schulz restarts
    it, this one keeps to float32 and float64)."""
    a, b, c = coefficients
    A = X @ X.T
    Q = None
    for k in range(steps):
        P = torch.addmm(A, A, A, beta=b, alpha=c)
        P.diagonal().add_(a)
        Q = P if Q is None else P @ Q
        if k < steps - 1:
            A = P @ A @ P
    return Q @ X


def gram_is_cheaper(m: int, n: int, steps: int) -> bool:
    """Whether gram_newton_schulz's FLOPs (2 m^2 n at each end, 8 m^3 a step but 6 fewer in the
    last) are fewer than newton_schulz's (4 m^2 n + 2 m^3 a step), for a wide (m, n): from n of
    about 2m on (on the CPU demo's 128 x 384 and 128 x 512, 30-40% less time)."""
    return 4 * m * m * n + (8 * steps - 6) * m**3 < steps * (4 * m * m * n + 2 * m**3)


def lr_scale(adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """torch.optim.Muon's lr adjustment for a (rows, cols) weight: Keller Jordan's sqrt(max(1,
    rows/cols)) or Moonshot's 0.2 * sqrt(max(rows, cols)), which matches AdamW's update RMS."""
    rows, cols = shape[:2]
    if adjust_lr_fn in (None, "original"):
        return math.sqrt(max(1, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    raise ValueError(f"adjust_lr_fn must be 'original' or 'match_rms_adamw', not {adjust_lr_fn!r}")
