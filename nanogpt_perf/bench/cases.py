"""The configurations bench.py times: one Case per row, the ladder from fp32 eager to every switch on, and
sweeps of one setting."""

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import torch

from model import ATTENTION, LOSS_IMPLS, GPTConfig
from nanogpt_perf.errors import UserError
from nanogpt_perf.settings import COMPILE_MODES, model_config, round_up


@dataclass(frozen=True)
class Case:
    """One configuration to time: the model, the work per iteration, AdamW and every performance switch."""

    name: str
    model: GPTConfig
    batch_size: int
    gradient_accumulation_steps: int = 1
    dtype: str = "float32"  # as nanogpt_perf.runtime.resolve_runtime takes it, 'auto' included
    tf32: bool = False
    compile: bool = False
    compile_mode: str = "default"
    fused: bool = True  # fused AdamW, where the device has the kernel
    grad_clip: float = 1.0
    weight_decay: float = 0.1
    learning_rate: float = 6e-4
    betas: tuple[float, float] = (0.9, 0.95)

    @property
    def tokens_per_iter(self) -> int:
        return self.gradient_accumulation_steps * self.batch_size * self.model.block_size


def case_from_settings(s: dict[str, Any], name: str, vocab_size: int) -> Case:
    """The Case that bench.py's settings describe (checked by configure)."""
    same_names = ("batch_size", "gradient_accumulation_steps", "dtype", "tf32", "compile", "compile_mode", "grad_clip")
    return Case(
        name,
        model_config(s, vocab_size),
        fused=s["fused_adamw"],
        weight_decay=s["weight_decay"],
        learning_rate=s["learning_rate"],
        betas=(s["beta1"], s["beta2"]),
        **{k: s[k] for k in same_names},
    )


def case_settings(case: Case) -> dict[str, Any]:
    """What a row of the results was measured with: every setting that can change its figures."""
    m = case.model
    return {
        "batch_size": case.batch_size,
        "block_size": m.block_size,
        "gradient_accumulation_steps": case.gradient_accumulation_steps,
        "tokens_per_iter": case.tokens_per_iter,
        "n_layer": m.n_layer,
        "n_head": m.n_head,
        "n_embd": m.n_embd,
        "vocab_size": m.vocab_size,
        "bias": m.bias,
        "dropout": m.dropout,
        "dtype": case.dtype,
        "tf32": case.tf32,
        "compile": case.compile,
        "compile_mode": case.compile_mode if case.compile else None,
        "attention": m.attention,
        "fused": case.fused,
        "grad_clip": case.grad_clip,
        "loss_chunk": m.loss_chunk,
        "loss_impl": m.loss_impl,
        "activation_checkpointing": m.activation_checkpointing,
    }


# the ladder: each rung adds one switch to all the rungs before it


@dataclass(frozen=True)
class Rung:
    key: str  # its name in bench.py's skip_rungs
    name: str
    apply: Callable[[Case], Case]
    unavailable: Callable[[Case, torch.device], str | None] = lambda case, device: None  # why it cannot run here


def no_tf32(case: Case, device: torch.device) -> str | None:
    if device.type != "cuda":
        return "TF32 is CUDA only"
    if torch.cuda.get_device_capability(device)[0] < 8:
        return "TF32 needs an Ampere or newer GPU (compute capability 8.0)"
    return None


def no_bf16(case: Case, device: torch.device) -> str | None:
    return "this GPU has no bf16" if device.type == "cuda" and not torch.cuda.is_bf16_supported() else None


def no_compile(case: Case, device: torch.device) -> str | None:
    return None if torch._dynamo.is_dynamo_supported() else "torch.compile is not supported on this platform"


def no_fused_adamw(case: Case, device: torch.device) -> str | None:
    try:
        torch.optim.AdamW([torch.zeros(1, device=device, requires_grad=True)], fused=True)
    except RuntimeError:
        return f"no fused AdamW kernel on {device.type}"
    return None


def ladder_rungs(vocab_size: int, pad_vocab: int) -> list[Rung]:
    """From fp32 eager to every switch on, in the order of the story told for GPT-2 (124M) on an A100."""
    padded = round_up(vocab_size, pad_vocab)
    return [
        Rung("tf32", "+TF32", lambda c: replace(c, tf32=True), no_tf32),
        Rung("bf16", "+bf16 autocast", lambda c: replace(c, dtype="bfloat16"), no_bf16),
        Rung("compile", "+torch.compile", lambda c: replace(c, compile=True), no_compile),
        Rung("flash", "+flash attention", lambda c: replace(c, model=replace(c.model, attention="sdpa"))),
        Rung(
            "pad_vocab",
            f"+vocab padding ({vocab_size} -> {padded})",
            lambda c: replace(c, model=replace(c.model, vocab_size=padded)),
            lambda c, d: (
                f"vocab_size {vocab_size} is a multiple of {pad_vocab} already" if padded == vocab_size else None
            ),
        ),
        Rung("fused", "+fused AdamW", lambda c: replace(c, fused=True), no_fused_adamw),
    ]


def ladder_cases(
    case: Case, device: torch.device, pad_vocab: int, skip: Iterable[str] = ()
) -> list[tuple[Case, str | None]]:
    """Each rung's Case with the reason it is skipped (None to run it). The first rung is case with every switch
    off: fp32, eager, manual attention, case's vocab_size as it is, unfused AdamW. A skipped rung adds nothing to
    the rungs after it."""
    rungs, skip = ladder_rungs(case.model.vocab_size, pad_vocab), set(skip)
    unknown = set(skip) - {r.key for r in rungs}
    if unknown:
        raise UserError(
            f"no rung {', '.join(sorted(unknown))} to skip; the rungs are {', '.join(r.key for r in rungs)}"
        )
    case = replace(
        case,
        name="fp32 eager",
        dtype="float32",
        tf32=False,
        compile=False,
        compile_mode="default",
        fused=False,
        model=replace(case.model, attention="manual"),
    )
    cases: list[tuple[Case, str | None]] = [(case, None)]
    for rung in rungs:
        why_not = "left out by skip_rungs" if rung.key in skip else rung.unavailable(case, device)
        if why_not is None:
            case = rung.apply(case)
        cases.append((replace(case, name=rung.name), why_not))
    return cases


# sweeps

SWEEPS: dict[str, type | tuple[str, ...]] = {
    "batch_size": int,
    "block_size": int,
    "gradient_accumulation_steps": int,
    "compile_mode": COMPILE_MODES,
    "attention": ATTENTION,
    "loss_impl": LOSS_IMPLS,
    "loss_chunk": int,
}


def sweep_values(key: str, values: str) -> list[int | str]:
    """The comma-separated values of a sweep over the setting key, checked; ValueError says what is wrong."""
    if key not in SWEEPS:
        raise UserError(f"cannot sweep {key!r}; sweep one of {', '.join(SWEEPS)}")
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not items:
        raise UserError(f"sweep={key} needs values, e.g. --values={'1,2,4,8' if SWEEPS[key] is int else 'sdpa,manual'}")
    if SWEEPS[key] is int:
        if not all(v.isdigit() and int(v) >= 1 for v in items):
            raise UserError(f"{key} values must be whole numbers >= 1, not {values!r}")
        return [int(v) for v in items]
    bad = [v for v in items if v not in SWEEPS[key]]
    if bad:
        raise UserError(f"{key} values must be among {', '.join(SWEEPS[key])}, not {', '.join(bad)}")
    return items


def largest_fitting(fits: Callable[[int], bool], limit: int) -> int:
    """The largest n <= limit for which fits(n), fits being true up to some n and false beyond: doubling from 1
    until it fails, then bisecting. 0 when not even 1 fits."""
    if not fits(1):
        return 0
    good = 1
    while good * 2 <= limit and fits(good * 2):
        good *= 2
    bad = min(good * 2, limit + 1)  # the smallest n known not to fit, or past the limit
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good
