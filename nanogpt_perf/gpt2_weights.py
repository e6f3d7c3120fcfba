"""GPT-2 weights in: GPT.from_pretrained, quiet, of a name or folder that the guard has checked
(nanogpt_perf/guard/weights.py: load_gpt2 with one clear line for what goes wrong). The conversion both ways
(from_hf_state_dict, to_hf_state_dict, for export.py) is model.py's, which imports nothing of the project."""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from model import GPT

HF_HUB_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")


def from_pretrained(name_or_path: str, **overrides: Any) -> GPT:
    """GPT.from_pretrained without transformers' warnings and progress bar. overrides: GPTConfig fields that leave
    the weights as they are (dropout, attention, the loss, the savers)."""
    with quiet_transformers():
        return GPT.from_pretrained(name_or_path, overrides)


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' warnings and its weight-loading progress bar off (a folder is checked before it loads; the
    hub's download bar is huggingface_hub's, and stays)."""
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
