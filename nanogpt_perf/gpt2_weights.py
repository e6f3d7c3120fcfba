"""GPT-2 weights in: GPT.from_pretrained, quiet, of a name or a folder that the guard has checked
(nanogpt_perf/guard/weights.py), with one clear line for what still goes wrong. The conversion both
ways (from_hf_state_dict, to_hf_state_dict, for export.py) is model.py's."""

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from model import GPT, GPTConfig, fields_of_kind
from nanogpt_perf.errors import UserError, first_line
from nanogpt_perf.guard.weights import check_hf_folder

HF_HUB_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
# GPTConfig fields that leave the weights as they are
FREE_OF_WEIGHTS = fields_of_kind("kernel", "training")


def load_gpt2(name_or_path: str, settings: GPTConfig | None = None) -> GPT:
    """GPT.from_pretrained, one UserError line for what fails (no such folder or hub name, a folder
    this model cannot be, no transformers or network); with settings, its fields the weights leave
    free."""
    overrides = {k: getattr(settings, k) for k in FREE_OF_WEIGHTS} if settings else {}
    folder = Path(name_or_path)
    if not folder.is_dir() and name_or_path not in HF_HUB_NAMES:
        raise UserError(
            f"{name_or_path!r} is neither a folder nor one of {', '.join(HF_HUB_NAMES)}"
        )
    if importlib.util.find_spec("transformers") is None:
        raise UserError(f"loading {name_or_path} needs transformers: pip install -e '.[hf]'")
    if folder.is_dir():
        check_hf_folder(
            folder,
            lambda why: UserError(f"{folder} is not a GPT-2 folder in transformers' format: {why}"),
        )
    try:
        return from_pretrained(name_or_path, **overrides)
    # no network, hub down, unreadable weights: one line, not transformers' traceback
    except Exception as e:
        how = "" if folder.is_dir() else " from the Hugging Face hub"
        raise UserError(
            f"cannot load {name_or_path}{how}: {type(e).__name__}: {first_line(e)}"
        ) from e


def from_pretrained(name_or_path: str, **overrides: Any) -> GPT:
    """GPT.from_pretrained without transformers' warnings and progress bar. overrides: GPTConfig
    fields that leave the weights as they are (dropout, attention, the loss, the savers)."""
    with quiet_transformers():
        return GPT.from_pretrained(name_or_path, overrides)


def gpt2_config(shape: GPTConfig, vocab_size: int, **extra: Any) -> Any:
    """transformers' GPT2Config of our model's shape (GPT-2's computation: its gelu, no n_inner, the
    vocabulary given), with extra fields (dropout, special tokens) as given."""
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=vocab_size,
        n_positions=shape.block_size,
        n_embd=shape.n_embd,
        n_layer=shape.n_layer,
        n_head=shape.n_head,
        activation_function="gelu_new",
        **extra,
    )


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' warnings and its weight-loading progress bar off (a folder is checked before it
    loads; the hub's download bar is huggingface_hub's, and stays)."""
    from transformers.utils import logging

    verbosity, bar = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bar:
            logging.enable_progress_bar()
