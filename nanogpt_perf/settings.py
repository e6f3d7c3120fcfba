"""The settings train.py and bench.py share: the model's shape, AdamW and every performance switch, each with one
name, one default, one meaning (the comment beside it is what --help prints) and one rule for its valid values, and
the one mapping from settings to a GPTConfig. Both scripts import these names, so that config files and --key=value
flags override them there, and pass SHARED_RULES to configure() beside the rules of their own settings."""

import importlib.util
from typing import Any

from model import ATTENTION, LOSS_IMPLS, GPTConfig
from nanogpt_perf.data.order import DATA_ORDERS
from nanogpt_perf.errors import UserError
from nanogpt_perf.memory import model_size_problem
from nanogpt_perf.rules import CrossRule, Rule, at_least, interval, one_of
from nanogpt_perf.runtime import PTDTYPES, device_problem

GPT2_VOCAB_SIZE = 50257  # the vocabulary of GPT-2's BPE, for a dataset with no meta.pkl and for synthetic tokens

# the model
n_layer = 12
n_head = 12
n_embd = 768
block_size = 1024  # tokens of context
bias = False  # biases in Linears and LayerNorms (GPT-2 has them; without is a little better and faster)
dropout = 0.0  # 0 for pretraining, try 0.1+ for fine-tuning
# AdamW
learning_rate = 6e-4  # the peak learning rate
weight_decay = 1e-1  # on matrices and embeddings only
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0  # clip the gradient norm to this; 0.0 = off
# performance switches
device = "auto"  # 'auto' (cuda, then mps, then cpu), 'cpu', 'cuda', 'cuda:1', 'mps'
dtype = "auto"  # 'auto' (bf16 if supported, else fp16 + GradScaler; fp32 on CPU), 'float32', 'bfloat16', 'float16'
tf32 = True  # TF32 matmuls for the float32 work (CUDA only)
compile = True  # torch.compile the model
compile_mode = "default"  # 'default', 'reduce-overhead', 'max-autotune' or 'max-autotune-no-cudagraphs'
attention = "sdpa"  # 'sdpa' (PyTorch picks), 'manual' (the reference), or SDPA held to flash/efficient/cudnn/math
fused_adamw = True  # AdamW's fused kernel, where the device has one
pad_vocab = 64  # vocab_size rounded up to a multiple of this (50257 -> 50304) for faster matmuls; 1 = off
loss_chunk = 0  # rows per chunk of a chunked lm_head + cross-entropy that never holds the full logits; 0 = off
loss_impl = "plain"  # 'plain' (logits, then the loss), 'fused' (lm_head + loss fused, ours) or 'liger' (liger-kernel)
activation_checkpointing = False  # recompute each block's activations in backward instead of keeping them
# the data loader (a dataset's batches; bench.py's synthetic tokens have none)
data_order = "random"  # 'random' windows (nanoGPT's, with replacement) or 'epochs' (each window once an epoch)
prefetch = 2  # batches the loader's background thread builds ahead
peak_flops = 0.0  # the device's peak FLOP/s for MFU; 0 = look it up in nanogpt_perf/peak_flops.py
seed = 1337

# what `from nanogpt_perf.settings import *` gives a script: the settings above, which its configure() overrides,
# their rules, and the mapping to a GPTConfig with its default vocabulary
__all__ = [
    *(k for k, v in dict(globals()).items() if not k.startswith("_") and type(v) in (bool, int, float, str)),
    "SHARED_RULES",
    "SHARED_CROSS",
    "model_config",
]

# the settings that are GPTConfig fields as they are (vocab_size comes from the data)
MODEL_SETTINGS = (
    "block_size",
    "n_layer",
    "n_head",
    "n_embd",
    "dropout",
    "bias",
    "attention",
    "loss_chunk",
    "loss_impl",
    "activation_checkpointing",
)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def liger_installed(loss_impl: str) -> str | None:
    if loss_impl == "liger" and importlib.util.find_spec("liger_kernel") is None:
        return "plain or fused here: liger needs liger-kernel (pip install -e '.[liger]'; CUDA only)"
    return None


def heads_divide_width(s: dict[str, Any]) -> str | None:
    return f"n_embd={s['n_embd']} is not divisible by n_head={s['n_head']}" if s["n_embd"] % s["n_head"] else None


# the valid values of each shared setting (the switches and bias take any boolean)
SHARED_RULES: dict[str, Rule] = {
    "n_layer": at_least(1),
    "n_head": at_least(1),
    "n_embd": at_least(1),
    "block_size": at_least(1),
    "dropout": interval(0, 1, high_open=True),
    "learning_rate": at_least(0),
    "weight_decay": at_least(0),
    "beta1": interval(0, 1, high_open=True),
    "beta2": interval(0, 1, high_open=True),
    "grad_clip": at_least(0, " (0 = off)"),
    "device": device_problem,
    "dtype": one_of("auto", *PTDTYPES),
    "compile_mode": one_of(*COMPILE_MODES),
    "attention": one_of(*ATTENTION),
    "pad_vocab": at_least(1, " (1 = off)"),
    "loss_chunk": at_least(0, " (0 = unchunked)"),
    "loss_impl": lambda v: one_of(*LOSS_IMPLS)(v) or liger_installed(v),
    "data_order": one_of(*DATA_ORDERS),
    "prefetch": at_least(1, " (batches built ahead)"),
    "peak_flops": at_least(0, " (0 = look it up)"),
    "seed": at_least(0),
}
SHARED_CROSS: tuple[CrossRule, ...] = (heads_divide_width,)


def round_up(n: int, multiple: int) -> int:
    """n rounded up to a multiple, e.g. a vocab of 50257 padded to 50304 (a multiple of 64) for faster matmuls."""
    return -(-n // multiple) * multiple


def model_config(s: dict[str, Any], vocab_size: int) -> GPTConfig:
    """The GPTConfig that the settings s describe (checked by configure against SHARED_RULES), for a
    vocabulary of vocab_size tokens (the dataset's, padded to a multiple of pad_vocab); ValueError for one too
    large to build here."""
    padded = round_up(vocab_size, s["pad_vocab"])
    if problem := model_size_problem(s["n_layer"], s["n_embd"], padded, s["block_size"]):
        raise UserError(problem)
    return GPTConfig(vocab_size=padded, **{k: s[k] for k in MODEL_SETTINGS})
