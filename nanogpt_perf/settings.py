"""The settings train.py and bench.py share: the model's shape, the optimizer and every performance switch, each
declared once, on one line: its name, its rule (the annotation: what values are valid, nanogpt_perf/rules.py), its
default, and its meaning (the comment, which --help prints). The scripts hand this module to configure(), which lets
config files and --key=value flags override these like their own settings; model_config maps them to a GPTConfig."""

import importlib.util
from typing import Any

from model import ATTENTION, LOSS_IMPLS, GPTConfig
from nanogpt_perf.data.order import DATA_ORDERS
from nanogpt_perf.errors import UserError
from nanogpt_perf.kernels import triton_problem
from nanogpt_perf.memory import model_size_problem
from nanogpt_perf.optim import OPTIMIZERS
from nanogpt_perf.rules import at_least, interval, one_of
from nanogpt_perf.runtime import PTDTYPES, device_problem, resolve_device

GPT2_VOCAB_SIZE = 50257  # the vocabulary of GPT-2's BPE, for a dataset with no meta.pkl and for synthetic tokens
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def liger_installed(loss_impl: str) -> str | None:
    if loss_impl == "liger" and importlib.util.find_spec("liger_kernel") is None:
        return "plain or fused here: liger needs liger-kernel (pip install -e '.[liger]'; CUDA only)"
    return None


def a_loss_impl(value: str) -> str | None:
    return one_of(*LOSS_IMPLS)(value) or liger_installed(value)


# the model (the GPTConfig fields of the same names)
n_layer: at_least(1) = 12
n_head: at_least(1) = 12
n_embd: at_least(1) = 768
block_size: at_least(1) = 1024  # tokens of context
bias = False  # biases in Linears and LayerNorms (GPT-2 has them; without is a little better and faster)
dropout: interval(0, 1, high_open=True) = 0.0  # 0 for pretraining, try 0.1+ for fine-tuning
# the modern recipe's architecture (config/speedrun.py turns it on), each off by default: GPT-2's own
rotary = False  # rotary position embeddings on q and k instead of learned positions
rmsnorm = False  # RMSNorm (no weight) instead of LayerNorm
qk_norm = False  # q and k RMS-normalised per head before attention
relu2 = False  # the MLP's activation ReLU(x)^2 instead of GELU
untied_head = False  # lm_head gets its own weight instead of sharing wte's
logit_softcap: at_least(0, " (0 = off)") = 0.0  # logits = c * tanh(logits / c); 0 = off
zero_init_proj = False  # the projections that write into the residual stream start at zero
value_embeds = False  # token embeddings mixed into the values of the first and the last layers
unet_skips = False  # each block of the second half also takes the output of one of the first half
# the optimizer: AdamW over every parameter, or Muon over the blocks' matrices and AdamW over the rest
optimizer: one_of(*OPTIMIZERS) = "adamw"  # 'adamw', or 'muon' (nanogpt_perf/optim.py)
learning_rate: at_least(0) = 6e-4  # AdamW's peak learning rate
weight_decay: at_least(0) = 1e-1  # AdamW's, on matrices and embeddings only
beta1: interval(0, 1, high_open=True) = 0.9
beta2: interval(0, 1, high_open=True) = 0.95
muon_lr: at_least(0) = 0.02  # Muon's peak learning rate (the schedule scales it as it scales learning_rate)
muon_momentum: interval(0, 1, high_open=True) = 0.95  # Muon's Nesterov momentum
muon_weight_decay: at_least(0) = 0.0  # Muon's decoupled weight decay
muon_ns_steps: at_least(1) = 5  # Newton-Schulz iterations a Muon update orthogonalises with (its cost on a CPU)
grad_clip: at_least(0, " (0 = off)") = 1.0  # clip the gradient norm to this; 0.0 = off
# performance switches
device: device_problem = "auto"  # 'auto' (cuda, then mps, then cpu), 'cpu', 'cuda', 'cuda:1', 'mps'
dtype: one_of("auto", *PTDTYPES) = "auto"  # 'auto': bf16 if supported, else fp16 + GradScaler; fp32 on CPU
tf32 = True  # TF32 matmuls for the float32 work (CUDA only)
compile = True  # torch.compile the model
compile_mode: one_of(*COMPILE_MODES) = "default"  # torch.compile's mode
attention: one_of(*ATTENTION) = "sdpa"  # 'sdpa' (PyTorch picks), 'manual' (the reference), or SDPA held to one kernel
fused_adamw = True  # AdamW's fused kernel, where the device has one
pad_vocab: at_least(1, " (1 = off)") = 64  # vocab_size rounded up to a multiple of this (50257 -> 50304); 1 = off
loss_chunk: at_least(0, " (0 = unchunked)") = 0  # rows per chunk of a chunked lm_head + cross-entropy; 0 = off
loss_impl: a_loss_impl = "plain"  # 'plain' (logits, then the loss), 'fused' or 'triton' (ours), 'liger'
activation_checkpointing = False  # recompute each block's activations in backward instead of keeping them
# the data loader (a dataset's batches; bench.py's synthetic tokens have none)
data_order: one_of(*DATA_ORDERS) = "random"  # 'random' windows (nanoGPT's, with replacement) or 'epochs'
prefetch: at_least(1, " (batches built ahead)") = 2  # batches the loader's background thread builds ahead
peak_flops: at_least(0, " (0 = look it up)") = 0.0  # the device's peak FLOP/s for MFU; 0 = look it up
seed: at_least(0) = 1337


def gpt_config_problem(s: dict[str, Any]) -> str | None:
    """What GPTConfig refuses in the model settings (n_embd not divisible by n_head, say), or None."""
    try:
        GPTConfig(**model_fields(s))
    except ValueError as e:
        return str(e)
    return None


def loss_impl_runs_here(s: dict[str, Any]) -> str | None:
    """loss_impl='triton' needs triton and a device its kernel runs on."""
    problem = triton_problem(resolve_device(s["device"])) if s["loss_impl"] == "triton" else None
    return problem and f"loss_impl='triton' cannot run here: {problem}; 'plain' or 'fused' run everywhere"


SHARED_CROSS = (gpt_config_problem, loss_impl_runs_here)  # the rules between the shared settings


def model_fields(s: dict[str, Any]) -> dict[str, Any]:
    """The settings that are GPTConfig fields, as they are (vocab_size comes from the data)."""
    return {k: s[k] for k in GPTConfig.__dataclass_fields__ if k in s and k != "vocab_size"}


def round_up(n: int, multiple: int) -> int:
    """n rounded up to a multiple, e.g. a vocab of 50257 padded to 50304 (a multiple of 64) for faster matmuls."""
    return -(-n // multiple) * multiple


def model_config(s: dict[str, Any], vocab_size: int) -> GPTConfig:
    """The GPTConfig that the settings s describe, for a vocabulary of vocab_size tokens (the dataset's, padded to
    a multiple of pad_vocab); a UserError for one too large to build here."""
    padded = round_up(vocab_size, s["pad_vocab"])
    if problem := model_size_problem(s["n_layer"], s["n_embd"], padded, s["block_size"]):
        raise UserError(problem)
    return GPTConfig(vocab_size=padded, **model_fields(s))
