"""GPT-2 weights in and out: OpenAI's GPT-2 from the Hugging Face hub or a local transformers folder, and our
model's weights in transformers' GPT2LMHeadModel layout (for export.py)."""

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from model import GPT, GPTConfig

# transformers stores these as Conv1D weights, (in, out): the transpose of nn.Linear's
HF_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
HF_HUB_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")


def load_gpt2(name_or_path: str, **overrides: Any) -> GPT:
    """GPT-2 from the Hugging Face hub (gpt2, gpt2-medium, gpt2-large, gpt2-xl) or from a local folder in
    transformers' format (config.json with model.safetensors or pytorch_model.bin). overrides: GPTConfig fields
    that leave the weights as they are (dropout, attention, loss_chunk, activation_checkpointing)."""
    folder = Path(name_or_path)
    if not folder.is_dir():
        folder = download_hf_model(name_or_path)
    if not (folder / "config.json").is_file():
        raise ValueError(f"{folder} has no config.json: not a model folder in transformers' format")
    hf = json.loads((folder / "config.json").read_text())
    if hf.get("model_type") != "gpt2" or hf.get("activation_function") not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ValueError(f"{folder} is not a GPT-2 model with GPT-2's tanh GELU")
    shape = dict(n_layer=hf["n_layer"], n_head=hf["n_head"], n_embd=hf["n_embd"], bias=True)
    model = GPT(GPTConfig(block_size=hf["n_positions"], vocab_size=hf["vocab_size"], **shape, **overrides))
    model.load_state_dict(from_hf_state_dict(read_hf_weights(folder)))
    return model


def download_hf_model(name: str) -> Path:
    if name not in HF_HUB_NAMES:
        raise ValueError(f"{name!r} is neither a folder nor one of {', '.join(HF_HUB_NAMES)}")
    try:
        from huggingface_hub import snapshot_download
    except ImportError as e:
        raise ValueError(f"loading {name} from the hub needs transformers: pip install transformers") from e
    try:
        return Path(snapshot_download(name, allow_patterns=["config.json", "*.safetensors"]))
    except Exception as e:  # no network, hub down, ...: say so in one line
        raise ValueError(
            f"cannot download {name} from the Hugging Face hub ({type(e).__name__}); "
            "pass a local folder in transformers' format instead"
        ) from e


def read_hf_weights(folder: Path) -> dict[str, torch.Tensor]:
    if (folder / "model.safetensors").is_file():
        from safetensors.torch import load_file

        return load_file(folder / "model.safetensors")
    if (folder / "pytorch_model.bin").is_file():
        return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise ValueError(f"{folder} has neither model.safetensors nor pytorch_model.bin")


def from_hf_state_dict(hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' GPT-2 weights under this model's names (the same names, Conv1D weights transposed)."""
    state = {}
    for name, p in hf_state.items():
        if name.endswith((".attn.bias", ".attn.masked_bias")):
            continue  # transformers' causal-mask buffers, not weights
        if not name.startswith(("transformer.", "lm_head.")):
            name = "transformer." + name  # saved from GPT2Model rather than GPT2LMHeadModel
        state[name] = p.t() if name.endswith(HF_TRANSPOSED) else p
    state.setdefault("lm_head.weight", state["transformer.wte.weight"])  # tied
    return state


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
