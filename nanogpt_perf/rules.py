"""The valid range or set of every setting, by name, that configurator.configure checks once the config files and
flags are applied, before a script does any work: the first setting outside its range is one error line naming it
and what would be valid, e.g. "batch_size must be >= 1, not 0".

A rule applies to every script with a setting of that name (a name means the same in every script); a script may
replace one for itself (configure's rules argument). A rule between settings applies where a script has them all.
Rules that need torch's names import them when they first run: the data preparation scripts, whose spawned workers
import the configurator, never import torch.
"""

import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nanogpt_perf.data.order import DATA_ORDERS

Rule = Callable[[Any], str | None]  # None for a valid value, else what would be valid, e.g. '>= 1'


def at_least(low: float, note: str = "") -> Rule:
    return lambda v: None if v >= low else f">= {low}{note}"


def above(low: float, note: str = "") -> Rule:
    return lambda v: None if v > low else f"> {low}{note}"


def interval(low: float, high: float, low_open: bool = False, high_open: bool = False) -> Rule:
    """[low, high], an end open where asked: interval(0, 1, high_open=True) is [0, 1)."""
    text = f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    inside = lambda v: (v > low if low_open else v >= low) and (v < high if high_open else v <= high)
    return lambda v: None if inside(v) else text


def or_word(word: str, rule: Rule) -> Rule:
    """rule, or the word itself (e.g. 'auto')."""
    return lambda v: None if v == word else (rule(v) and f"{word!r} or {rule(v)}")


def one_of(*choices: str) -> Rule:
    return lambda v: None if v in choices else f"one of {', '.join(choices)}"


def one_of_names(module: str, attribute: str, *extra: str) -> Rule:
    """one_of extra and the names in module.attribute (a tuple, or a dict's keys)."""
    return lambda v: one_of(*extra, *getattr(importlib.import_module(module), attribute))(v)


def list_of(*choices: str) -> Rule:
    """Comma-separated names, each one of choices."""
    valid = lambda v: all(name.strip() in choices for name in v.split(","))
    return lambda v: None if valid(v) else f"a comma-separated list of {', '.join(choices)}"


def a_path(value: str) -> str | None:
    return None if value else "a path"


def a_device(value: str) -> str | None:
    from nanogpt_perf.runtime import device_problem

    return device_problem(value)


def liger_installed(loss_impl: str) -> str | None:
    if loss_impl == "liger" and importlib.util.find_spec("liger_kernel") is None:
        return "plain or fused here: liger needs liger-kernel (pip install liger-kernel; CUDA only)"
    return None


def init_from_one_of(*modes: str) -> Rule:
    """modes (e.g. 'scratch', 'resume'), a GPT-2 on the hub, or an existing folder in transformers' format."""

    def rule(value: str) -> str | None:
        from nanogpt_perf.gpt2_weights import HF_HUB_NAMES

        if value in (*modes, *HF_HUB_NAMES) or Path(value).is_dir():
            return None
        return f"{', '.join((*modes, *HF_HUB_NAMES))} or a transformers folder"

    return rule


RULES: dict[str, Rule] = {
    # the model
    "n_layer": at_least(1),
    "n_head": at_least(1),
    "n_embd": at_least(1),
    "block_size": at_least(1),
    "vocab_size": at_least(1),
    "dropout": interval(0, 1, high_open=True),
    "attention": one_of_names("model", "ATTENTION"),
    "pad_vocab": at_least(1, " (1 = off)"),
    "loss_chunk": at_least(0, " (0 = unchunked)"),
    "loss_impl": lambda v: one_of_names("model", "LOSS_IMPLS")(v) or liger_installed(v),
    # AdamW and its schedule
    "learning_rate": at_least(0),
    "min_lr": at_least(0),
    "weight_decay": at_least(0),
    "beta1": interval(0, 1, high_open=True),
    "beta2": interval(0, 1, high_open=True),
    "grad_clip": at_least(0, " (0 = off)"),
    "warmup_iters": at_least(0),
    "lr_decay_iters": at_least(0),
    # the work: training, evaluation, checkpoints, benchmarks
    "batch_size": at_least(1),
    "gradient_accumulation_steps": at_least(1),
    "tokens_per_iter": at_least(0, " (0 = batch_size x gradient_accumulation_steps x block_size)"),
    "max_iters": at_least(0),
    "eval_interval": at_least(1),
    "eval_iters": at_least(1),
    "log_interval": at_least(1),
    "save_interval": at_least(0, " (0 = at evals only)"),
    "keep_last": at_least(1),
    "max_bad_steps": at_least(1),
    "steps": at_least(1),
    "burn_in": at_least(1, " (the first iteration compiles)"),
    "tolerance_pct": at_least(0),
    "peak_flops": at_least(0, " (0 = look it up)"),
    "seed": at_least(0),
    # data
    "data_order": one_of(*DATA_ORDERS),
    "parallelism": one_of_names("nanogpt_perf.train.parallel", "PARALLELISMS"),
    "orders": list_of(*DATA_ORDERS),
    "prefetch": at_least(1, " (batches built ahead)"),
    "shard_size": at_least(1),
    "processes": at_least(1),
    "shards": at_least(2, " (the first is val)"),
    "shard_tokens": at_least(1),
    "batches": above(100, " (memory is read after 100)"),
    "repeats": at_least(1),
    # generation
    "num_samples": at_least(1),
    "max_new_tokens": at_least(1),
    "prompt_tokens": at_least(1),
    "temperature": at_least(0, " (0 = greedy)"),
    "top_k": at_least(0, " (0 = all)"),
    "top_p": interval(0, 1, low_open=True),
    # the runtime
    "device": a_device,
    "dtype": one_of_names("nanogpt_perf.runtime", "PTDTYPES", "auto"),
    "compile_mode": one_of_names("nanogpt_perf.settings", "COMPILE_MODES"),
    "backend": one_of("auto", "nccl", "gloo"),
    # where things are
    "init_from": init_from_one_of("scratch", "resume"),
    "out_dir": a_path,
    "data_dir": a_path,
    "export_dir": a_path,
}


def heads_divide_width(n_embd: int, n_head: int) -> str | None:
    return f"n_embd={n_embd} is not divisible by n_head={n_head}" if n_embd % n_head else None


def warmup_before_decay(decay_lr: bool, warmup_iters: int, lr_decay_iters: int) -> str | None:
    if decay_lr and warmup_iters > lr_decay_iters:
        return f"warmup_iters must be <= lr_decay_iters ({lr_decay_iters}) when decay_lr=True, not {warmup_iters}"
    return None


def min_lr_below_peak(decay_lr: bool, min_lr: float, learning_rate: float) -> str | None:
    if decay_lr and min_lr > learning_rate:
        return f"min_lr must be <= learning_rate ({learning_rate}) when decay_lr=True, not {min_lr}"
    return None


def shard_holds_a_window(shard_tokens: int, block_size: int) -> str | None:
    if shard_tokens <= block_size:  # a window is block_size + 1 tokens: the inputs and the targets shifted by one
        return f"shard_tokens must be > block_size ({block_size}), not {shard_tokens}"
    return None


# the settings a rule between settings takes, in its arguments' order
CROSS_RULES: dict[tuple[str, ...], Callable[..., str | None]] = {
    ("n_embd", "n_head"): heads_divide_width,
    ("decay_lr", "warmup_iters", "lr_decay_iters"): warmup_before_decay,
    ("decay_lr", "min_lr", "learning_rate"): min_lr_below_peak,
    ("shard_tokens", "block_size"): shard_holds_a_window,
}


def settings_problem(settings: dict[str, Any], rules: dict[str, Rule] = RULES, cross: bool = True) -> str | None:
    """The first setting (in the script's order) outside its valid range or set, as an error message, then the
    first rule between settings broken (cross=False leaves those out); None when every setting is valid."""
    for name, value in settings.items():
        valid = rules[name](value) if name in rules else None
        if valid is not None:
            return f"{name} must be {valid}, not {value!r}"
    for names, rule in CROSS_RULES.items() if cross else ():
        problem = rule(*(settings[n] for n in names)) if all(n in settings for n in names) else None
        if problem:
            return problem
    return None
