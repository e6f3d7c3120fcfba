"""The settings train.py and bench.py share: the model's shape, AdamW and every performance switch, each with one
name, one default and one meaning (the comment beside it is what --help prints), and the one mapping from settings
to a GPTConfig. Both scripts import these names, so that config files and --key=value flags override them there."""

from typing import Any

from model import GPTConfig

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
# and the mapping to a GPTConfig with its default vocabulary
__all__ = [
    *(k for k, v in dict(globals()).items() if not k.startswith("_") and type(v) in (bool, int, float, str)),
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


def round_up(n: int, multiple: int) -> int:
    """n rounded up to a multiple, e.g. a vocab of 50257 padded to 50304 (a multiple of 64) for faster matmuls."""
    return -(-n // multiple) * multiple


def model_config(s: dict[str, Any], vocab_size: int) -> GPTConfig:
    """The GPTConfig that the settings s describe (checked by configure: nanogpt_perf/rules.py), for a
    vocabulary of vocab_size tokens (the dataset's, padded to a multiple of pad_vocab)."""
    return GPTConfig(vocab_size=round_up(vocab_size, s["pad_vocab"]), **{k: s[k] for k in MODEL_SETTINGS})
