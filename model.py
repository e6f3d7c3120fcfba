"""GPT-2 in one file, torch only: the model with the modern recipe's options (all off: GPT-2), its
AdamW, MFU, nanoGPT's generate and GPT-2's weights in and out. Copied anywhere, it runs: the
project's fused losses (nanogpt_perf/kernels) are imported only when loss_impl asks for one."""

import math
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
import torch.nn as nn
from torch import Generator, Tensor
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

# SDPA held to one kernel (a kernel the device lacks is an error when it runs), by its name in the
# settings
SDPA_BACKENDS = dict(flash=SDPBackend.FLASH_ATTENTION, efficient=SDPBackend.EFFICIENT_ATTENTION,
                     cudnn=SDPBackend.CUDNN_ATTENTION, math=SDPBackend.MATH)  # fmt: skip
ATTENTION = ("manual", "sdpa", *SDPA_BACKENDS)
# besides plain, the fused losses: nanogpt_perf/kernels' (softmax in torch, or in Triton) and
# liger-kernel's
LOSS_IMPLS = ("plain", "fused", "triton", "liger")
A100_BF16_PEAK_FLOPS = 312e12  # nanoGPT's MFU yardstick
ROTARY_BASE = 10000.0
Rope = tuple[Tensor, Tensor]  # rotary's cos and sin


def option(default: Any, kind: str, help: str = "", **valid: Any) -> Any:
    """A GPTConfig field: its kind ('architecture': what the weights need; 'init', 'kernel',
    'training': free to change), its help and what is valid as metadata, the settings of train.py
    and bench.py (no help: the code's)."""
    return field(default=default, metadata=dict(kind=kind, help=help, **valid))


@dataclass
class GPTConfig:
    """The model: GPT-2's shape, the modern recipe's options and the kernels it runs with"""

    block_size: int = option(1024, "architecture", "tokens of context", min=1)
    # GPT-2's 50257 padded up to a multiple of 64: set by the data
    vocab_size: int = option(50304, "architecture")
    n_layer: int = option(12, "architecture", "transformer blocks", min=1)
    n_head: int = option(12, "architecture", "attention heads a block", min=1)
    n_embd: int = option(768, "architecture", "the residual stream's width", min=1)
    dropout: float = option(
        0.0, "training", "0 for pretraining, try 0.1+ for fine-tuning", interval="[0, 1)"
    )
    bias: bool = option(True, "architecture", "biases in Linears and LayerNorms, as GPT-2 has them")
    attention: str = option("sdpa", "kernel", "'sdpa' (PyTorch picks), 'manual' (the reference) or "
                            "SDPA held to one kernel", choices=ATTENTION)  # fmt: skip
    loss_chunk: int = option(0, "kernel", "rows per chunk of a chunked lm_head + cross-entropy; 0 "
                             "= off", min=0, note=" (0 = unchunked)")  # fmt: skip
    loss_impl: str = option("plain", "kernel", "'plain' (logits, then the loss), 'fused' or "
                            "'triton' (ours, never all the logits), 'liger'",
                            choices=LOSS_IMPLS)  # fmt: skip
    activation_checkpointing: bool = option(
        False, "kernel", "recompute each block's activations in backward"
    )
    # the modern recipe (modded-nanogpt's records), each off by default: with all of them off, the
    # model is GPT-2
    rotary: bool = option(
        False, "architecture", "rotary position embeddings on q and k instead of learned positions"
    )
    rmsnorm: bool = option(False, "architecture", "RMSNorm (no weight) instead of LayerNorm")
    qk_norm: bool = option(
        False, "architecture", "q and k RMS-normalised per head before attention"
    )
    relu2: bool = option(False, "architecture", "the MLP's activation ReLU(x)^2 instead of GELU")
    untied_head: bool = option(
        False, "architecture", "lm_head gets its own weight instead of sharing wte's"
    )
    logit_softcap: float = option(0.0, "architecture", "logits = c * tanh(logits / c); 0 = off",
                                  min=0, note=" (0 = off)")  # fmt: skip
    zero_init_proj: bool = option(
        False, "init", "the projections that write into the residual stream start at 0"
    )
    value_embeds: bool = option(
        False, "architecture", "token embeddings mixed into the first and last layers' values"
    )
    unet_skips: bool = option(
        False, "architecture", "each block of the second half takes one of the first's outputs"
    )

    def __post_init__(self) -> None:
        # the fields' own rules, for a config made in code or read from a checkpoint
        for f in fields(self):
            value, valid = getattr(self, f.name), f.metadata
            if value not in valid.get("choices", (value,)):
                raise ValueError(
                    f"{f.name} must be one of {', '.join(valid['choices'])}, not {value!r}"
                )
            if "min" in valid and not valid["min"] <= value < math.inf:
                bound = f"a finite number >= {valid['min']}{valid.get('note', '')}"
                raise ValueError(f"{f.name} must be {bound}, not {value}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        self.logit_softcap = float(self.logit_softcap)
        if self.logit_softcap and self.loss_impl == "liger":
            raise ValueError(
                "logit_softcap is not liger-kernel's: loss_impl 'plain', 'fused' or 'triton' caps "
                "logits"
            )
        if self.rotary and self.n_embd // self.n_head % 2:
            raise ValueError(
                "rotary needs an even head size, not n_embd / n_head = "
                f"{self.n_embd // self.n_head}"
            )


def fields_of_kind(*kinds: str) -> tuple[str, ...]:
    return tuple(f.name for f in fields(GPTConfig) if f.metadata["kind"] in kinds)


# what a checkpoint's weights cannot do without (a model trained with ReLU^2 or a softcap computes
# something else without it), and of those the recipe's: a checkpoint's model_args hold one only
# when it is on, as nanoGPT's GPTConfig takes the other seven fields (a checkpoint from before the
# recipe lacks them: off, their default)
ARCHITECTURE = fields_of_kind("architecture")
NANOGPT_FIELDS = ("block_size", "vocab_size", "n_layer", "n_head", "n_embd", "dropout", "bias")
RECIPE_ARCHITECTURE = tuple(k for k in ARCHITECTURE if k not in NANOGPT_FIELDS)


def wide(dtype: torch.dtype) -> torch.dtype:
    """float32, or float64 for float64 work: the dtype of the logits' softmax and of rotary's
    angles."""
    return torch.promote_types(dtype, torch.float32)


def softcapped(logits: Tensor, cap: float) -> Tensor:
    """cap * tanh(logits / cap), in float32 at least; the logits as they are when cap is 0 (off)."""
    return cap * torch.tanh(logits.to(wide(logits.dtype)) / cap) if cap else logits


def norm(config: GPTConfig) -> nn.Module:
    """GPT-2's LayerNorm, or an RMSNorm without a weight: a per-channel gain before a Linear is one
    that the Linear can learn itself (and one parameter tensor fewer for the optimizer and the
    kernels)."""
    if config.rmsnorm:
        return nn.RMSNorm(config.n_embd, elementwise_affine=False)
    return nn.LayerNorm(config.n_embd, bias=config.bias)


def rotary_angles(block_size: int, head_size: int, positions: Tensor, dtype: torch.dtype) -> Rope:
    """cos and sin, (T, head_size / 2), of the angles by which rotary turns q and k at positions
    (T,): pair i at position p by p * base^(-2i / head_size). Made for every position below
    block_size and looked up, so that a position gets the same bits whether it runs alone (a decode
    step) or among others; no buffer to crop or cast."""
    inv_freq = ROTARY_BASE ** -(
        torch.arange(0, head_size, 2, device=positions.device, dtype=dtype) / head_size
    )
    angles = torch.arange(block_size, device=positions.device, dtype=dtype).outer(inv_freq)
    return angles.cos()[positions], angles.sin()[positions]


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (..., hs) with each pair (x_i, x_{i + hs/2}) turned by its angle (the rotate-half form),
    cos and sin broadcast over x's leading dimensions as their shapes say, computed in their
    dtype."""
    x1, x2 = x.to(cos.dtype).chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).to(x.dtype)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, value_embed: bool = False):
        super().__init__()
        # q, k, v for all heads
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.attention = config.attention
        self.qk_norm = config.qk_norm
        if value_embed:  # the weights of v and of the token's value embedding in the values
            self.ve_mix = nn.Parameter(torch.tensor([0.5, 0.5]))

    def forward(
        self,
        x: Tensor,
        rope: Rope | None = None,
        ve: Tensor | None = None,
        cache: Callable | None = None,
    ) -> Tensor:
        """Causal self-attention over x (B, T, C); q and k turned by rope = (cos, sin), ve (B, T, C)
        mixed into the values. cache: this layer's KV cache (nanogpt_perf/generate.py), which takes
        k, v (B, nh, T, hs) and the SDPA kernels chosen here and gives back the keys, values,
        additive mask (None: causal) and kernels to attend with."""
        B, T, C = x.size()
        qkv = self.c_attn(x).view(B, T, 3, self.n_head, C // self.n_head)
        # q and k side by side in one tensor, so that qk_norm and rotary are one op for both (on a
        # CPU, where nothing fuses them, a tenth of the step); normalising before rotary is the same
        # as after: a rotation keeps the norm
        qk, v = qkv[:, :, :2], qkv[:, :, 2].transpose(1, 2)
        if self.qk_norm:
            qk = F.rms_norm(qk, (qk.size(-1),)).to(qk.dtype)
        if rope is not None:
            # (T, 1, 1, hs / 2): over q and k and every head
            cos, sin = (t[:, None, None] for t in rope)
            qk = rotate(qk, cos, sin)
        q, k = (t.transpose(1, 2) for t in qk.unbind(2))
        if ve is not None:
            v = self.ve_mix[0] * v + self.ve_mix[1] * ve.view(B, T, self.n_head, -1).transpose(
                1, 2
            ).to(v.dtype)
        # mask None: causal over the T positions of x
        mask, kernels = None, SDPA_BACKENDS.get(self.attention)
        if cache is not None:
            k, v, mask, kernels = cache(k, v, kernels)
        if self.attention == "manual":
            att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
            if mask is None:  # causal: -inf above the diagonal
                mask = torch.full(
                    (T, k.size(2)), float("-inf"), dtype=att.dtype, device=q.device
                ).triu(1)
            y = self.attn_dropout((att + mask).softmax(dim=-1)) @ v
        else:
            dropout_p = self.attn_dropout.p if self.training else 0.0
            with sdpa_kernel(kernels) if kernels else nullcontext():
                y = F.scaled_dot_product_attention(q, k, v, mask, dropout_p, is_causal=mask is None)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # the heads' outputs side by side
        return self.resid_dropout(self.c_proj(y))


class ReLUSquared(torch.autograd.Function):
    """relu(h)^2 and its gradient 2 relu(h) g in two passes over h, not autograd's four (a CPU fuses
    nothing: 2.5 ms to 1 at (1024, 512)), equal to F.relu(h).square() in value and gradient bit for
    bit (tests/test_recipe_model.py)."""

    @staticmethod
    def forward(ctx: Any, h: Tensor) -> Tensor:
        r = F.relu(h)
        ctx.save_for_backward(r)
        return r * r

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Tensor:
        (r,) = ctx.saved_tensors
        return (g * r).mul_(2.0)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.relu2 = config.relu2
        if not config.relu2:
            # GPT-2's GELU, so that its weights give its logits
            self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = self.c_fc(x)
        h = ReLUSquared.apply(h) if self.relu2 else self.gelu(h)
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    def __init__(self, config: GPTConfig, value_embed: bool = False):
        super().__init__()
        self.ln_1 = norm(config)
        self.attn = CausalSelfAttention(config, value_embed)
        self.ln_2 = norm(config)
        self.mlp = MLP(config)

    def forward(
        self,
        x: Tensor,
        rope: Rope | None = None,
        ve: Tensor | None = None,
        cache: Callable | None = None,
    ) -> Tensor:
        x = x + self.attn(self.ln_1(x), rope, ve, cache)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        # the value-embedding table each layer mixes into its values, or None: of n_ve tables
        # (min(3, n_layer // 2), at least one), table i serves layer i and layer n_layer - n_ve + i
        n_ve = max(1, min(3, config.n_layer // 2)) if config.value_embeds else 0
        self.ve_tables: list[int | None] = [None] * config.n_layer
        for i in range(n_ve):
            self.ve_tables[i] = self.ve_tables[config.n_layer - n_ve + i] = i
        modules = dict(wte=nn.Embedding(config.vocab_size, config.n_embd))
        if not config.rotary:
            modules["wpe"] = nn.Embedding(config.block_size, config.n_embd)
        modules["drop"] = nn.Dropout(config.dropout)
        modules["h"] = nn.ModuleList([Block(config, t is not None) for t in self.ve_tables])
        modules["ln_f"] = norm(config)
        if config.value_embeds:
            modules["ve"] = nn.ModuleList(
                [nn.Embedding(config.vocab_size, config.n_embd) for _ in range(n_ve)]
            )
        self.transformer = nn.ModuleDict(modules)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if not config.untied_head:
            self.transformer.wte.weight = self.lm_head.weight  # tied input and output embeddings
        # one weight per skip, from block i of the first half to block n_layer - 1 - i
        if config.unet_skips:
            self.skip_weights = nn.Parameter(torch.ones(config.n_layer // 2))
        self.apply(self._init_weights)
        # GPT-2 scales the init of the projections that write into the residual stream by 1/sqrt(2 *
        # n_layer)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight") and config.zero_init_proj:
                nn.init.zeros_(p)
            elif name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def get_num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; non_embedding leaves out the embeddings that are only looked up (wpe,
        the value embeddings, and wte when lm_head has its own weight): a tied wte is lm_head's
        matmul and counts."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            lookups = (m.weight for m in self.modules() if isinstance(m, nn.Embedding))
            n -= sum(w.numel() for w in lookups if w is not self.lm_head.weight)
        return n

    def forward(
        self, idx: Tensor, targets: Tensor | None = None
    ) -> tuple[Tensor | None, Tensor | None]:
        """With targets, the logits of every position (None from the chunked and fused losses, which
        never make them all) and the mean cross-entropy; without, the last position's logits only
        (all that generation needs)."""
        x = self.hidden_states(idx)
        if targets is None:
            return self.head(x[:, [-1], :]), None
        cfg, weight = self.config, self.lm_head.weight
        if cfg.loss_impl != "plain":  # the fused losses, imported only when asked for
            from nanogpt_perf.kernels.losses import lm_head_loss

            return None, lm_head_loss(
                cfg.loss_impl, x, weight, targets, cfg.loss_chunk, cfg.logit_softcap
            )
        if cfg.loss_chunk:
            return None, chunked_cross_entropy(
                x, weight, targets, cfg.loss_chunk, cfg.logit_softcap
            )
        logits = self.head(x)
        return logits, F.cross_entropy(
            logits.flatten(0, 1).to(wide(logits.dtype)), targets.flatten(), ignore_index=-1
        )

    def head(self, x: Tensor) -> Tensor:
        """lm_head's logits of the hidden states x, softcapped by logit_softcap."""
        return softcapped(self.lm_head(x), self.config.logit_softcap)

    def hidden_states(self, idx: Tensor) -> Tensor:
        """The trunk: (B, T, n_embd) after the last LayerNorm, which lm_head turns into logits."""
        T = idx.size(1)
        if T > self.config.block_size:
            raise ValueError(
                f"sequence of length {T} is longer than block_size={self.config.block_size}"
            )
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        return self.transformer.ln_f(self.blocks(idx, pos))

    def blocks(self, idx: Tensor, positions: Tensor, caches: list | None = None) -> Tensor:
        """The residual stream (B, T, n_embd) after the last block, for the tokens idx (B, T) at
        positions (T,); with caches (one per layer, as CausalSelfAttention takes it), through a KV
        cache."""
        cfg = self.config
        x = self.transformer.wte(idx)
        rope = None
        if cfg.rotary:
            rope = rotary_angles(cfg.block_size, cfg.n_embd // cfg.n_head, positions, wide(x.dtype))
        else:
            x = x + self.transformer.wpe(positions)
        x = self.transformer.drop(x)
        embeds = [table(idx) for table in self.transformer.ve] if cfg.value_embeds else []
        skips, n_skips = [], cfg.n_layer // 2 if cfg.unet_skips else 0
        for i, block in enumerate(self.transformer.h):
            # the second half takes the first half's outputs, last in first out
            if i >= cfg.n_layer - n_skips:
                x = x + self.skip_weights[i - (cfg.n_layer - n_skips)] * skips.pop()
            ve = None if self.ve_tables[i] is None else embeds[self.ve_tables[i]]
            if cfg.activation_checkpointing and self.training:
                x = checkpoint(block, x, rope, ve, use_reentrant=False)
            else:
                x = block(x, rope, ve, None if caches is None else caches[i])
            if i < n_skips:
                skips.append(x)
        return x

    def crop_block_size(self, block_size: int) -> None:
        """Shrink the context length, e.g. to fine-tune GPT-2 (1024) at 256."""
        if block_size > self.config.block_size:
            raise ValueError(
                f"block_size={block_size} is larger than the model's {self.config.block_size}"
            )
        # rotary's angles are made for block_size positions at each forward
        self.config.block_size = block_size
        if "wpe" in self.transformer:
            self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size])

    def configure_optimizers(
        self,
        weight_decay: float,
        learning_rate: float,
        betas: tuple[float, float],
        device_type: str | None = None,
        fused: bool = True,
    ) -> torch.optim.AdamW:
        """AdamW, weight decay on matrices and embeddings only, fused where asked and the device has
        the kernel (device_type: nanoGPT's argument, not needed: the parameters' devices decide)."""
        return adamw(decay_groups(self.parameters(), weight_decay), betas, fused, lr=learning_rate)

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """FLOPs of a forward and backward pass per token, as the PaLM paper counts them (appendix
        B): 6N for the weights plus 12*L*H*Q*T for attention, at the sequence length T actually
        run."""
        cfg = self.config
        L, H, Q, T = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, seq_len or cfg.block_size
        return 6 * self.get_num_params() + 12 * L * H * Q * T

    def estimate_mfu(
        self,
        fwdbwd_per_iter: int,
        dt: float,
        peak_flops: float = A100_BF16_PEAK_FLOPS,
        seq_len: int | None = None,
    ) -> float:
        """Model FLOPs utilisation: the FLOP/s of fwdbwd_per_iter sequences an iteration of dt
        seconds over peak_flops: an A100's bf16 peak unless given (nanoGPT's yardstick);
        nanogpt_perf.peak_flops.mfu passes the device's."""
        T = seq_len or self.config.block_size
        return self.flops_per_token(T) * T * fwdbwd_per_iter / dt / peak_flops

    @classmethod
    def from_checkpoint(cls, checkpoint: dict[str, Any], config: GPTConfig | None = None) -> "GPT":
        """The model in a checkpoint, ours or nanoGPT's (model_args; model, its names maybe under
        torch.compile's _orig_mod.): with config, that config but for the architecture, which is the
        checkpoint's (the rest is free)."""
        fields = GPTConfig.__dataclass_fields__
        saved = {k: v for k, v in checkpoint["model_args"].items() if k in fields}
        # a field newer than the checkpoint: its default
        saved = {k: fields[k].default for k in ARCHITECTURE} | saved
        config = (
            replace(config, **{k: saved[k] for k in ARCHITECTURE}) if config else GPTConfig(**saved)
        )
        model = cls(config)
        model.load_state_dict(
            {k.removeprefix("_orig_mod."): v for k, v in checkpoint["model"].items()}
        )
        return model

    @classmethod
    def from_pretrained(cls, model_type: str, override_args: dict[str, Any] | None = None) -> "GPT":
        """OpenAI's GPT-2: gpt2, gpt2-medium, gpt2-large or gpt2-xl from the Hugging Face hub, or a
        transformers folder (pip install -e ".[hf]"); override_args: fields the weights leave free
        (nanoGPT's dropout, the kernels)."""
        from transformers import GPT2LMHeadModel

        override_args = override_args or {}
        if fixed := set(override_args) & set(ARCHITECTURE):
            raise ValueError(
                f"{', '.join(sorted(fixed))} cannot be overridden: GPT-2's weights fix them"
            )
        hf = GPT2LMHeadModel.from_pretrained(model_type)
        c = hf.config
        if c.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"{model_type} uses {c.activation_function}, not GPT-2's tanh GELU")
        shape = dict(
            n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd, block_size=c.n_positions, bias=True
        )
        model = cls(GPTConfig(vocab_size=c.vocab_size, **shape, **override_args))
        model.load_state_dict(from_hf_state_dict(hf.state_dict()))
        return model

    @torch.no_grad()
    def generate(
        self,
        idx: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: Generator | None = None,
        vocab_size: int | None = None,
    ) -> Tensor:
        """nanoGPT's generate: idx (B, T) extended by max_new_tokens tokens, each drawn by sample
        after a forward pass over the last block_size tokens (vocab_size: a padded vocabulary's tail
        left out). The slow reference of nanogpt_perf/generate.py's cached decoding: the same tokens
        from the same generator."""
        for _ in range(max_new_tokens):
            logits, _ = self(idx[:, -self.config.block_size :])
            idx = torch.cat(
                (idx, sample(logits[:, -1, :vocab_size], temperature, top_k, generator)), dim=1
            )
        return idx


def sample(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: Generator | None = None,
    q: Tensor | None = None,
) -> Tensor:
    """One token per row of logits (B, V): the argmax at temperature 0, else drawn from
    softmax(logits / temperature) over the top_k most likely (exactly k, even when the k-th is tied)
    as torch.multinomial draws one sample: argmax(p / q), q ~ Exp(1), so that over the whole
    vocabulary the same generator gives multinomial's token; but without its checks of p, which read
    the device (a host sync). q: drawn beforehand (B, candidates), if given."""
    # argmax as max(...).indices, the same first maximal index: 2 to 4 times faster on a CPU
    # (PyTorch 2.13, 50,304 logits: 25 us against 64 in float32, 37 against 166 in bfloat16)
    if temperature == 0:
        return logits.max(dim=-1, keepdim=True).indices
    logits, ids = logits.float() / temperature, None
    if top_k is not None and top_k < logits.size(-1):
        logits, ids = torch.topk(logits, top_k)
    probs = logits.softmax(dim=-1)
    q = torch.empty_like(probs).exponential_(1, generator=generator) if q is None else q
    choice = (probs / q).max(dim=-1, keepdim=True).indices
    return choice if ids is None else ids.gather(-1, choice)


def decay_groups(params: Iterable[nn.Parameter], weight_decay: float) -> list[dict[str, Any]]:
    """AdamW's groups of the trainable params: weight decay on matrices and embeddings (>= 2-D),
    none on vectors (biases, norms' gains, the recipe's mixing weights)."""
    params = [p for p in params if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def adamw(
    groups: list[dict[str, Any]], betas: tuple[float, float], fused: bool, **kw: Any
) -> torch.optim.AdamW:
    """torch.optim.AdamW over groups, fused where asked and every parameter's device has the kernel
    (a CPU too): torch takes fused=True anywhere, and fails at the first step on a device without
    it."""
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices as fused_devices

    if fused and {p.device.type for g in groups for p in g["params"]} <= set(fused_devices()):
        return torch.optim.AdamW(groups, betas=betas, fused=True, **kw)
    return torch.optim.AdamW(groups, betas=betas, **kw)


def chunked_cross_entropy(
    x: Tensor, weight: Tensor, targets: Tensor, chunk: int, softcap: float = 0.0
) -> Tensor:
    """The mean cross-entropy of the logits x @ weight.T (ignoring targets of -1; capped at softcap
    when > 0), chunk rows of x at a time: each chunk's logits made, reduced to a summed loss and
    dropped, then made again in backward (activation checkpointing), so that at most one (chunk,
    vocab) block of fp32 logits exists, not (B*T, vocab)."""
    x, targets = x.reshape(-1, x.size(-1)), targets.reshape(-1)
    total = sum(
        checkpoint(_summed_cross_entropy, xc, weight, tc, softcap, use_reentrant=False)
        for xc, tc in zip(x.split(chunk), targets.split(chunk), strict=True)
    )
    return total / (targets != -1).sum()


def _summed_cross_entropy(x: Tensor, weight: Tensor, targets: Tensor, softcap: float) -> Tensor:
    logits = softcapped(F.linear(x, weight), softcap)
    return F.cross_entropy(logits.to(wide(logits.dtype)), targets, ignore_index=-1, reduction="sum")


# transformers stores these as Conv1D weights, (in, out): the transpose of nn.Linear's
HF_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def from_hf_state_dict(hf_state: dict[str, Tensor]) -> dict[str, Tensor]:
    """transformers' GPT-2 weights under this model's names (the same names, Conv1D weights
    transposed)."""
    state = {}
    for name, p in hf_state.items():
        if name.endswith((".attn.bias", ".attn.masked_bias")):
            continue  # transformers' causal-mask buffers, not weights
        if not name.startswith(("transformer.", "lm_head.")):
            name = "transformer." + name  # saved from GPT2Model rather than GPT2LMHeadModel
        state[name] = p.t() if name.endswith(HF_TRANSPOSED) else p
    state.setdefault("lm_head.weight", state["transformer.wte.weight"])  # tied
    return state


def to_hf_state_dict(model: GPT, vocab_size: int) -> dict[str, Tensor]:
    """from_hf_state_dict's inverse: model's weights as GPT2LMHeadModel's, on the CPU, the
    vocabulary cut to vocab_size; zero biases where the model has none (the same function:
    transformers' GPT-2 always has them)."""
    state = {n: (p.t() if n.endswith(HF_TRANSPOSED) else p).detach().cpu().contiguous()
             for n, p in model.state_dict().items()}  # fmt: skip
    if not model.config.bias:
        state |= {f"{n}.bias": torch.zeros(m.weight.shape[0]) for n, m in model.named_modules()
                  if isinstance(m, (nn.Linear, nn.LayerNorm)) and n != "lm_head"}  # fmt: skip
    state["lm_head.weight"] = state["transformer.wte.weight"] = state["transformer.wte.weight"][
        :vocab_size
    ].clone()
    return state
