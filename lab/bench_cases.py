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
NOT_MEASURED = tuple(
    "ladder skip_rungs sweep find_max_batch out_json profile memory_snapshot compare baseline "
    "tolerance_pct data_dir fit_memory_gb".split()
)


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


def unavailable(device: torch.device, vocab_size: int, pad_vocab: int) -> dict[str, str]:
    """Why each ladder rung that cannot run on device cannot, by its key."""
    why, cuda = {}, device.type == "cuda"
    if not cuda:
        why["tf32"] = "TF32 is CUDA only"
    elif torch.cuda.get_device_capability(device)[0] < 8:
        why["tf32"] = "TF32 needs an Ampere or newer GPU (compute capability 8.0)"
    if cuda and not torch.cuda.is_bf16_supported():
        why["bf16"] = "this GPU has no bf16"
    if not torch._dynamo.is_dynamo_supported():
        why["compile"] = "torch.compile is not supported on this platform"
    if round_up(vocab_size, pad_vocab) == vocab_size:
        why["pad_vocab"] = f"vocab_size {vocab_size} is a multiple of {pad_vocab} already"
    try:
        torch.optim.AdamW([torch.zeros(1, device=device, requires_grad=True)], fused=True)
    except RuntimeError:
        why["fused"] = f"no fused AdamW kernel on {device.type}"
    return why


def ladder_cases(
    case: Case, device: torch.device, skip: Iterable[str] = ()
) -> list[tuple[Case, str | None]]:
    """Each rung's Case with the reason it is skipped (None to run it), from fp32 eager to every
    switch on, each rung adding one switch to all the rungs before it, in the order of the story
    told for GPT-2 (124M) on an A100. The first rung is case with every switch off: fp32, eager,
    manual attention, the vocabulary unpadded, unfused AdamW; case's pad_vocab is the padding
    rung's. A skipped rung adds nothing to the rungs after it."""
    vocab, pad = case.settings.vocab_size, case.settings.pad_vocab
    rungs = [  # its key in skip_rungs, its name, what it changes
        ("tf32", "+TF32", dict(tf32=True)),
        ("bf16", "+bf16 autocast", dict(dtype="bfloat16")),
        ("compile", "+torch.compile", dict(compile=True)),
        ("flash", "+flash attention", dict(attention="sdpa")),
        ("pad_vocab", f"+vocab padding ({vocab} -> {round_up(vocab, pad)})", dict(pad_vocab=pad)),
        ("fused", "+fused AdamW", dict(fused_adamw=True)),
    ]
    if unknown := set(skip) - {key for key, _, _ in rungs}:
        raise UserError(
            f"no rung {', '.join(sorted(unknown))} to skip; the rungs are "
            f"{', '.join(key for key, _, _ in rungs)}"
        )
    off = dict(dtype="float32", tf32=False, compile=False, compile_mode="default")
    case = case.but("fp32 eager", attention="manual", fused_adamw=False, pad_vocab=1, **off)
    cases: list[tuple[Case, str | None]] = [(case, None)]
    why = unavailable(device, vocab, pad) | dict.fromkeys(skip, "left out by skip_rungs")
    for key, name, changes in rungs:
        case = case if key in why else case.but(**changes)
        cases.append((case.but(name), why.get(key)))
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
