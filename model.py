"""
The whole GPT-2 in one file: model, optimizer set-up, generation and MFU accounting.

References: OpenAI's GPT-2 release and the transformers implementation (for the maths and the weight layout).
"""

import math
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from nanogpt_perf.peak_flops import device_peak_flops

# SDPA held to one kernel (a kernel the device lacks is an error when it runs), by its name in the settings
SDPA_BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}
# the masked-softmax reference, SDPA choosing its kernel, or SDPA held to one
ATTENTION = ("manual", "sdpa", *SDPA_BACKENDS)


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64 for faster matmuls
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # biases in Linears and LayerNorms, as in GPT-2; False is a little better and faster
    attention: str = "sdpa"  # "sdpa", "manual" (the masked-softmax reference), or one of SDPA_BACKENDS
    loss_chunk: int = 0  # rows of the (B*T, n_embd) hidden states per chunk of lm_head + cross-entropy; 0 = unchunked
    activation_checkpointing: bool = False  # recompute each block's activations in backward instead of keeping them

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if self.loss_chunk < 0:
            raise ValueError(f"loss_chunk must be >= 0 (0 = unchunked), not {self.loss_chunk}")
        if self.attention not in ATTENTION:
            raise ValueError(f"attention must be one of {', '.join(ATTENTION)}, not {self.attention!r}")


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v for all heads
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.attention = config.attention

    def forward(
        self, x: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor] | None = None, pos: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Causal self-attention over x (B, T, C). With a cache kv = (k, v), each (B, nh, block_size, hs): without
        pos, a prefill that writes the keys and values of positions 0..T-1; with pos (a 0-d tensor), one decode
        step for the token at that position, attending to the cache up to it."""
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        mask = None  # None: causal over the T positions of x
        if kv is not None and pos is None:
            kv[0][:, :, :T] = k
            kv[1][:, :, :T] = v
        elif kv is not None:
            # static shapes, so that a compiled decode step never recompiles: attend to the whole cache, masked
            kv[0].index_copy_(2, pos.view(1), k)
            kv[1].index_copy_(2, pos.view(1), v)
            k, v = kv
            mask = (torch.arange(k.size(2), device=x.device) <= pos).view(1, 1, 1, -1)
        y = self.attend(q, k, v, mask)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        dropout_p = self.dropout if self.training else 0.0
        if self.attention != "manual":
            backend = SDPA_BACKENDS.get(self.attention)
            with sdpa_kernel(backend) if backend else nullcontext():
                if mask is None:
                    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        if mask is None:
            mask = torch.ones(q.size(2), k.size(2), dtype=torch.bool, device=q.device).tril()
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        return self.attn_dropout(att) @ v


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2's GELU, so that its weights give its logits
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(
        self, x: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor] | None = None, pos: torch.Tensor | None = None
    ) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), kv, pos)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied input and output embeddings
        self.apply(self._init_weights)
        # GPT-2 scales the init of the projections that write into the residual stream by 1/sqrt(2 * n_layer)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def get_num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; the position embedding is left out by default (the token one is the tied lm_head)."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer.wpe.weight.numel() if non_embedding else n

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Logits for every position and the mean cross-entropy when targets are given, else logits
        for the last position only (all that generation needs). With loss_chunk set and targets given, the
        logits are None: the chunked loss never makes them all at once."""
        T = idx.size(1)
        if T > self.config.block_size:
            raise ValueError(f"sequence of length {T} is longer than block_size={self.config.block_size}")
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            if self.config.activation_checkpointing and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        x = self.transformer.ln_f(x)
        if targets is None:
            return self.lm_head(x[:, [-1], :]), None
        if self.config.loss_chunk:
            return None, chunked_cross_entropy(x, self.lm_head.weight, targets, self.config.loss_chunk)
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    def crop_block_size(self, block_size: int) -> None:
        """Shrink the context length, e.g. to fine-tune GPT-2 (1024) at 256."""
        if block_size > self.config.block_size:
            raise ValueError(f"block_size={block_size} is larger than the model's {self.config.block_size}")
        self.config.block_size = block_size
        self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size])

    def configure_optimizers(
        self, weight_decay: float, learning_rate: float, betas: tuple[float, float], fused: bool = True
    ) -> torch.optim.AdamW:
        """AdamW with weight decay on matrices and embeddings (>= 2-D) only, fused (when asked) where the device
        supports it."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        if fused:
            try:
                return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=True)
            except RuntimeError:  # this device has no fused kernel
                pass
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)

    def estimate_mfu(
        self,
        fwdbwd_per_iter: int,
        dt: float,
        precision: str = "bf16",
        peak_flops: float | None = None,
        seq_len: int | None = None,
    ) -> float | None:
        """Model FLOPs utilisation: achieved FLOP/s over the peak of this device at this precision.

        FLOPs per token follow the PaLM paper (appendix B): 6N for the weights plus 12*L*H*Q*T for attention,
        at the sequence length T actually run. peak_flops (FLOP/s) overrides the table; None is returned when
        the peak is unknown, rather than guessing one."""
        peak = peak_flops or device_peak_flops(next(self.parameters()).device, precision)
        if not peak:
            return None
        cfg = self.config
        L, H, Q, T = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, seq_len or cfg.block_size
        flops_per_token = 6 * self.get_num_params() + 12 * L * H * Q * T
        return flops_per_token * T * fwdbwd_per_iter / dt / peak

    @classmethod
    def from_checkpoint(cls, checkpoint: dict[str, Any]) -> "GPT":
        """The model saved in one of our checkpoints (as nanogpt_perf.checkpoint.load_checkpoint reads it)."""
        model = cls(GPTConfig(**checkpoint["model_args"]))
        model.load_state_dict(checkpoint["model"])
        return model

    # ------------------------------------------------------------------------------------------------------------
    # generation with a KV cache

    def new_cache(self, batch_size: int, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Preallocated keys and values for every layer: two tensors (n_layer, B, n_head, block_size, head_size),
        in the autocast dtype when autocast is on, else in the weights' dtype."""
        cfg = self.config
        shape = (cfg.n_layer, batch_size, cfg.n_head, cfg.block_size, cfg.n_embd // cfg.n_head)
        device = self.lm_head.weight.device
        if dtype is None:
            autocast = torch.is_autocast_enabled(device.type)
            dtype = torch.get_autocast_dtype(device.type) if autocast else self.lm_head.weight.dtype
        return torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)

    def prefill(self, idx: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """Run the context idx (B, T) from position 0, filling the cache; logits (B, V) for the next token."""
        return self.cached_forward(idx, k_cache, v_cache)

    def decode_step(
        self, token: torch.Tensor, pos: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        """One token (B, 1) at position pos (a 0-d tensor), attending to the cache; logits (B, V) for the next.
        Every shape is fixed, so torch.compile builds this once for all positions."""
        return self.cached_forward(token, k_cache, v_cache, pos)

    def cached_forward(
        self, idx: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logits (B, V) after the last token of idx: a prefill from position 0 without pos, else one token at pos."""
        positions = torch.arange(idx.size(1), device=idx.device) if pos is None else pos.view(1)
        x = self.transformer.wte(idx) + self.transformer.wpe(positions)
        for i, block in enumerate(self.transformer.h):
            x = block(x, (k_cache[i], v_cache[i]), pos)
        return self.lm_head(self.transformer.ln_f(x[:, -1, :]))

    @torch.no_grad()
    def generate_tokens(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
        num_samples: int = 1,
        use_cache: bool = True,
        vocab_size: int | None = None,
        decode_step: Callable | None = None,
    ) -> Iterator[torch.Tensor]:
        """Yield the next token of each sequence, (B * num_samples, 1), max_new_tokens times. idx is (B, T) prompts;
        each is prefilled once and its cache shared by its num_samples sequences, which are rows
        b * num_samples ... (b + 1) * num_samples - 1. vocab_size leaves out the padded logits beyond the real
        vocabulary; decode_step may be a compiled self.decode_step. use_cache=False recomputes the whole context
        for every token: the reference."""
        bs = self.config.block_size
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, not {num_samples}")
        if not use_cache:
            idx = idx.repeat_interleave(num_samples, dim=0)
            for _ in range(max_new_tokens):
                logits, _ = self(idx[:, -bs:])
                token = sample_next(logits[:, -1, :vocab_size], temperature, top_k, top_p, generator)
                idx = torch.cat((idx, token), dim=1)
                yield token
            return
        eager = decode_step is None
        decode_step = decode_step or self.decode_step
        k_cache, v_cache = self.new_cache(idx.size(0))
        logits = self.prefill(idx[:, -bs:], k_cache, v_cache)
        length = min(idx.size(1), bs)  # positions filled in the cache
        if num_samples > 1:  # each prompt's cache, logits and tokens, repeated for its samples
            k_cache, v_cache = (c.repeat_interleave(num_samples, dim=1) for c in (k_cache, v_cache))
            logits, idx = logits.repeat_interleave(num_samples, dim=0), idx.repeat_interleave(num_samples, dim=0)
        for step in range(max_new_tokens):
            token = sample_next(logits[:, :vocab_size], temperature, top_k, top_p, generator)
            yield token
            if step == max_new_tokens - 1:
                break
            idx = torch.cat((idx, token), dim=1)
            if length < bs:
                # a compiled step sees the whole cache, so its shapes never change; eagerly, only the filled part
                # is read (views: the step still writes into the cache)
                k, v = (
                    (k_cache, v_cache)
                    if not eager
                    else (k_cache[:, :, :, : length + 1], v_cache[:, :, :, : length + 1])
                )
                logits = decode_step(token, torch.tensor(length, device=idx.device), k, v)
                length += 1
            else:
                # The window slides past block_size. A learned absolute position embedding cannot be shifted, so
                # the keys and values of every kept token change: re-prefill the last block_size tokens. This
                # gives exactly the tokens of the uncached model, at the cost of a full pass per token from here.
                logits = self.prefill(idx[:, -bs:], k_cache, v_cache)

    def generate(self, idx: torch.Tensor, max_new_tokens: int, **kwargs) -> torch.Tensor:
        """idx (B, T) extended by max_new_tokens; keyword arguments as for generate_tokens."""
        new = list(self.generate_tokens(idx, max_new_tokens, **kwargs))
        return torch.cat([idx.repeat_interleave(kwargs.get("num_samples", 1), dim=0), *new], dim=1)


def chunked_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int) -> torch.Tensor:
    """The mean cross-entropy of the logits x @ weight.T (ignoring targets of -1), chunk rows of x at a time.

    Each chunk's logits are made, reduced to a summed loss and dropped, then made again in backward (activation
    checkpointing), so at most one (chunk, vocab) block of fp32 logits exists instead of all (B*T, vocab)."""
    x, targets = x.reshape(-1, x.size(-1)), targets.reshape(-1)
    total = sum(
        checkpoint(_summed_cross_entropy, xc, weight, tc, use_reentrant=False)
        for xc, tc in zip(x.split(chunk), targets.split(chunk), strict=True)
    )
    return total / (targets != -1).sum()


def _summed_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(F.linear(x, weight).float(), targets, ignore_index=-1, reduction="sum")


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """One token per row of logits (B, V): greedy at temperature 0, else sampled after filter_logits."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    probs = filter_logits(logits.float() / temperature, top_k, top_p).softmax(dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator)


def filter_logits(logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """-inf for every token but the top_k most likely, then but the smallest set of those whose probability
    reaches top_p (nucleus); the most likely token always survives."""
    if top_k is not None and top_k < logits.size(-1):
        values, indices = torch.topk(logits, top_k)  # exactly k survive, even when the k-th value is tied
        logits = torch.full_like(logits, float("-inf")).scatter_(-1, indices, values)
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # the probability of the tokens ranked above each one
        sorted_logits[before >= top_p] = float("-inf")
        logits = torch.full_like(logits, float("-inf")).scatter_(-1, order, sorted_logits)
    return logits
