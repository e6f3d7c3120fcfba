"""The configurations bench.py times: one Case per row (a name and the settings it runs with), the
ladder from fp32 eager to every switch on, and sweeps of one setting."""

if __name__ == "__main__":  # run as a script, it would fail at its imports
    raise SystemExit("error: bench_cases.py is a module of bench.py: run bench.py (--help)")

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from nanogpt_perf.config import Config
from nanogpt_perf.errors import UserError
from nanogpt_perf.train.build import model_config, round_up

# bench.py's settings of what to run and where to write it: not settings of the configuration a row
# measured
NOT_MEASURED = (
    "ladder",
    "skip_rungs",
    "sweep",
    "find_max_batch",
    "out_json",
    "profile",
    "memory_snapshot",
)
NOT_MEASURED += ("compare", "baseline", "tolerance_pct", "data_dir", "fit_memory_gb")


@dataclass(frozen=True)
class Case:
    """One configuration to time: a name, and the settings train.py's builder takes (the model, the
    work of an iteration, the optimizer and every performance switch), vocab_size that of the tokens
    before padding."""

    name: str
    settings: Config

    def but(self, name: str | None = None, **changes: Any) -> "Case":
        """This configuration with some settings changed (and another name), checked."""
        return Case(self.name if name is None else name, self.settings.replace(**changes))

    @property
    def tokens_per_iter(self) -> int:
        s = self.settings
        return s.gradient_accumulation_steps * s.batch_size * s.block_size

    def measured(self) -> dict[str, Any]:
        """What a row of the results was measured with: every setting that can change its figures,
        the model's vocab_size padded as it ran, and the tokens of an iteration."""
        s = self.settings
        padded = model_config(s, s.vocab_size).vocab_size
        return {k: v for k, v in s.as_dict().items() if k not in NOT_MEASURED} | {
            "vocab_size": padded,
            "tokens_per_iter": self.tokens_per_iter,
        }


# the ladder: each rung adds one switch to all the rungs before it


@dataclass(frozen=True)
class Rung:
    key: str  # its name in bench.py's skip_rungs
    name: str
    apply: Callable[[Case], Case]
    # why it cannot run here
    unavailable: Callable[[Case, torch.device], str | None] = lambda case, device: None


def no_tf32(case: Case, device: torch.device) -> str | None:
    if device.type != "cuda":
        return "TF32 is CUDA only"
    if torch.cuda.get_device_capability(device)[0] < 8:
        return "TF32 needs an Ampere or newer GPU (compute capability 8.0)"
    return None


def no_bf16(case: Case, device: torch.device) -> str | None:
    return (
        "this GPU has no bf16"
        if device.type == "cuda" and not torch.cuda.is_bf16_supported()
        else None
    )


def no_compile(case: Case, device: torch.device) -> str | None:
    return (
        None
        if torch._dynamo.is_dynamo_supported()
        else "torch.compile is not supported on this platform"
    )


def no_fused_adamw(case: Case, device: torch.device) -> str | None:
    try:
        torch.optim.AdamW([torch.zeros(1, device=device, requires_grad=True)], fused=True)
    except RuntimeError:
        return f"no fused AdamW kernel on {device.type}"
    return None


def ladder_rungs(vocab_size: int, pad_vocab: int) -> list[Rung]:
    """From fp32 eager to every switch on, in the order of the story told for GPT-2 (124M) on an
    A100."""
    padded = round_up(vocab_size, pad_vocab)
    multiple = lambda c, d: (
        f"vocab_size {vocab_size} is a multiple of {pad_vocab} already"
        if padded == vocab_size
        else None
    )  # noqa: E731
    return [
        Rung("tf32", "+TF32", lambda c: c.but(tf32=True), no_tf32),
        Rung("bf16", "+bf16 autocast", lambda c: c.but(dtype="bfloat16"), no_bf16),
        Rung("compile", "+torch.compile", lambda c: c.but(compile=True), no_compile),
        Rung("flash", "+flash attention", lambda c: c.but(attention="sdpa")),
        Rung(
            "pad_vocab",
            f"+vocab padding ({vocab_size} -> {padded})",
            lambda c: c.but(pad_vocab=pad_vocab),
            multiple,
        ),
        Rung("fused", "+fused AdamW", lambda c: c.but(fused_adamw=True), no_fused_adamw),
    ]


def ladder_cases(
    case: Case, device: torch.device, skip: Iterable[str] = ()
) -> list[tuple[Case, str | None]]:
    """Each rung's Case with the reason it is skipped (None to run it). The first rung is case with
    every switch off: fp32, eager, manual attention, the vocabulary unpadded, unfused AdamW; case's
    pad_vocab is the padding rung's. A skipped rung adds nothing to the rungs after it."""
    rungs, skip = ladder_rungs(case.settings.vocab_size, case.settings.pad_vocab), set(skip)
    unknown = set(skip) - {r.key for r in rungs}
    if unknown:
        raise UserError(
            f"no rung {', '.join(sorted(unknown))} to skip; the rungs are "
            f"{', '.join(r.key for r in rungs)}"
        )
    off = dict(
        dtype="float32",
        tf32=False,
        compile=False,
        compile_mode="default",
        fused_adamw=False,
        pad_vocab=1,
    )
    case = case.but("fp32 eager", attention="manual", **off)
    cases: list[tuple[Case, str | None]] = [(case, None)]
    for rung in rungs:
        why_not = "left out by skip_rungs" if rung.key in skip else rung.unavailable(case, device)
        if why_not is None:
            case = rung.apply(case)
        cases.append((case.but(rung.name), why_not))
    return cases


def largest_fitting(fits: Callable[[int], bool], limit: int) -> int:
    """The largest n <= limit for which fits(n), fits being true up to some n and false beyond:
    doubling from 1 until it fails, then bisecting (most_tries(limit) calls at most). 0 when not
    even 1 fits."""
    if limit < 1 or not fits(1):
        return 0
    good = 1
    while good * 2 <= limit and fits(good * 2):
        good *= 2
    bad = min(good * 2, limit + 1)  # the smallest n known not to fit, or past the limit
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good


def most_tries(limit: int) -> int:
    """The most calls largest_fitting makes of fits below limit: 1, then at most log2(limit)
    doublings and as many bisections (between 2^j and 2^(j+1), or limit + 1: j steps at most)."""
    return 1 + 2 * (limit.bit_length() - 1) if limit >= 1 else 0
