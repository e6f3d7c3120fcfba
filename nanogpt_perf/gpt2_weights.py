"""GPT-2 weights in and out: GPT.from_pretrained with one clear line for what goes wrong (for train.py and
sample.py), and our model's weights in transformers' GPT2LMHeadModel layout (for export.py)."""

import importlib.util
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from model import GPT, HF_TRANSPOSED

HF_HUB_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")


def load_gpt2(name_or_path: str, **overrides: Any) -> GPT:
    """GPT.from_pretrained, with one line (ValueError) for what can go wrong: a name that is neither a folder nor
    a GPT-2 on the hub, a folder that is not a transformers GPT-2, no transformers, no network for the hub.
    overrides: GPTConfig fields that leave the weights as they are (dropout, attention, the loss, the savers)."""
    folder = Path(name_or_path)
    if not folder.is_dir() and name_or_path not in HF_HUB_NAMES:
        raise ValueError(f"{name_or_path!r} is neither a folder nor one of {', '.join(HF_HUB_NAMES)}")
    if folder.is_dir():
        problem = hf_folder_problem(folder)
        if problem:
            raise ValueError(f"{folder} is not a GPT-2 folder in transformers' format: {problem}")
    if importlib.util.find_spec("transformers") is None:
        raise ValueError(f"loading {name_or_path} needs transformers: pip install -e '.[hf]'")
    try:
        return GPT.from_pretrained(name_or_path, overrides)
    except Exception as e:  # no network, hub down, unreadable weights: one line, not transformers' traceback
        how = "" if folder.is_dir() else " from the Hugging Face hub"
        raise ValueError(f"cannot load {name_or_path}{how}: {type(e).__name__}: {first_line(e)}") from e


def hf_folder_problem(folder: Path) -> str | None:
    """What a folder lacks to be a GPT-2 in transformers' format, or None."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        return f"no readable config.json ({type(e).__name__})"
    if not isinstance(config, dict) or config.get("model_type") != "gpt2":
        return "config.json does not describe a GPT-2 (model_type gpt2)"
    if not any((folder / name).is_file() for name in ("model.safetensors", "pytorch_model.bin")):
        return "neither model.safetensors nor pytorch_model.bin"
    return None


def first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [""])[0]


def to_hf_state_dict(model: GPT, vocab_size: int) -> dict[str, torch.Tensor]:
    """model's weights in transformers' GPT2LMHeadModel layout, without the vocab padding."""
    out = {
        n: (p.t() if n.endswith(HF_TRANSPOSED) else p).detach().cpu().contiguous()
        for n, p in model.state_dict().items()
    }
    if not model.config.bias:  # transformers' GPT-2 always has biases: zeros compute the same function
        for name, module in model.named_modules():
            if isinstance(module, (nn.Linear, nn.LayerNorm)) and name != "lm_head":
                out[f"{name}.bias"] = torch.zeros(module.weight.shape[0])
    out["transformer.wte.weight"] = out["transformer.wte.weight"][:vocab_size].clone()
    out["lm_head.weight"] = out["transformer.wte.weight"]
    return out
