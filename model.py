"""
The whole GPT-2 in one file: model, optimizer set-up, generation and MFU accounting.

References: OpenAI's GPT-2 release and the transformers implementation (for the maths and the weight layout).
"""

import inspect
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64 for faster matmuls
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # biases in Linears and LayerNorms, as in GPT-2; False is a little better and faster
    attention: str = "sdpa"  # "sdpa" (flash / memory-efficient kernels) or "manual" (the masked-softmax reference)
    loss_chunk: int = 0  # rows of the (B*T, n_embd) hidden states per chunk of lm_head + cross-entropy; 0 = unchunked
    activation_checkpointing: bool = False  # recompute each block's activations in backward instead of keeping them

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if self.loss_chunk < 0:
            raise ValueError(f"loss_chunk must be >= 0 (0 = unchunked), not {self.loss_chunk}")
        if self.attention not in ("sdpa", "manual"):
            raise ValueError(f"attention must be 'sdpa' or 'manual', not {self.attention!r}")


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's has no bias=False before 2.1)."""

    def __init__(self, ndim: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


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
        if self.attention == "sdpa":
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
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
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
                ln_f=LayerNorm(config.n_embd, bias=config.bias),
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
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1), ignore_index=-1)
        return logits, loss

    def crop_block_size(self, block_size: int) -> None:
        """Shrink the context length, e.g. to fine-tune GPT-2 (1024) at 256."""
        if block_size > self.config.block_size:
            raise ValueError(f"block_size={block_size} is larger than the model's {self.config.block_size}")
        self.config.block_size = block_size
        self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size])

    def configure_optimizers(
        self,
        weight_decay: float,
        learning_rate: float,
        betas: tuple[float, float],
        device_type: str,
        fused: bool = True,
    ) -> torch.optim.AdamW:
        """AdamW with weight decay on matrices and embeddings (>= 2-D) only, fused (when asked) where the device
        supports it."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        if fused and "fused" in inspect.signature(torch.optim.AdamW).parameters:
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

    # ------------------------------------------------------------------------------------------------------------
    # GPT-2 weights in transformers' layout

    @classmethod
    def from_checkpoint(cls, checkpoint: dict[str, Any]) -> "GPT":
        """The model saved in one of our checkpoints (as common.load_checkpoint reads it)."""
        model = cls(GPTConfig(**checkpoint["model_args"]))
        model.load_state_dict(checkpoint["model"])
        return model

    @classmethod
    def from_pretrained(cls, name_or_path: str, **overrides: Any) -> "GPT":
        """GPT-2 from the Hugging Face hub (gpt2, gpt2-medium, gpt2-large, gpt2-xl) or from a local folder in
        transformers' format (config.json with model.safetensors or pytorch_model.bin). overrides: GPTConfig
        fields that leave the weights as they are (dropout, attention, loss_chunk, activation_checkpointing)."""
        folder = Path(name_or_path)
        if not folder.is_dir():
            folder = download_hf_model(name_or_path)
        if not (folder / "config.json").is_file():
            raise ValueError(f"{folder} has no config.json: not a model folder in transformers' format")
        hf = json.loads((folder / "config.json").read_text())
        if hf.get("model_type") != "gpt2" or hf.get("activation_function") not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"{folder} is not a GPT-2 model with GPT-2's tanh GELU")
        shape = dict(n_layer=hf["n_layer"], n_head=hf["n_head"], n_embd=hf["n_embd"], bias=True)
        config = GPTConfig(block_size=hf["n_positions"], vocab_size=hf["vocab_size"], **shape, **overrides)
        model = cls(config)
        model.load_state_dict(from_hf_state_dict(read_hf_weights(folder)))
        return model

    def to_hf_state_dict(self, vocab_size: int) -> dict[str, torch.Tensor]:
        """This model's weights in transformers' GPT2LMHeadModel layout, without the vocab padding."""
        out = {
            n: (p.t() if n.endswith(HF_TRANSPOSED) else p).detach().cpu().contiguous()
            for n, p in self.state_dict().items()
        }
        if not self.config.bias:  # transformers' GPT-2 always has biases: zeros compute the same function
            for name, module in self.named_modules():
                if isinstance(module, (nn.Linear, LayerNorm)) and name != "lm_head":
                    out[f"{name}.bias"] = torch.zeros(module.weight.shape[0])
        out["transformer.wte.weight"] = out["transformer.wte.weight"][:vocab_size].clone()
        out["lm_head.weight"] = out["transformer.wte.weight"]
        return out

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
        """Yield the next token of each sequence, (B, 1), max_new_tokens times. idx is (B, T); with B == 1 and
        num_samples > 1, the prompt is prefilled once and its cache shared by num_samples sequences.
        vocab_size leaves out the padded logits beyond the real vocabulary; decode_step may be a compiled
        self.decode_step. use_cache=False recomputes the whole context for every token: the reference."""
        bs = self.config.block_size
        if not use_cache:
            idx = idx.expand(num_samples, -1) if num_samples > 1 else idx
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
        if num_samples > 1:
            k_cache, v_cache = k_cache.repeat(1, num_samples, 1, 1, 1), v_cache.repeat(1, num_samples, 1, 1, 1)
            logits, idx = logits.expand(num_samples, -1), idx.expand(num_samples, -1)
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
        if kwargs.get("num_samples", 1) > 1:
            idx = idx.expand(kwargs["num_samples"], -1)
        return torch.cat([idx, *new], dim=1)


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


# Dense (no sparsity) peak TFLOP/s by precision, from the vendors' data sheets. Matched against the device name
# in order, so more specific names come first ("h100 nvl" before "h100", "a100" before "a10").
PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    ("h100 nvl", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    ("h100 pcie", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2}),
    ("h100", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),  # SXM
    ("h200 nvl", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    ("h200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),  # SXM
    ("gh200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("a100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("a10", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    ("l40s", {"bf16": 362.05, "fp16": 362.05, "tf32": 183.0, "fp32": 91.6}),
    ("l40", {"bf16": 181.05, "fp16": 181.05, "tf32": 90.5, "fp32": 90.5}),
    ("l4", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    ("rtx 6000 ada", {"bf16": 364.2, "fp16": 364.2, "tf32": 182.1, "fp32": 91.1}),
    ("rtx a6000", {"bf16": 154.8, "fp16": 154.8, "tf32": 77.4, "fp32": 38.7}),
    ("rtx 4090", {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6}),
    ("rtx 3090", {"bf16": 71.0, "fp16": 71.0, "tf32": 35.6, "fp32": 35.6}),
    ("v100", {"fp16": 125.0, "fp32": 15.7}),  # no bf16 or tf32 units
    ("t4", {"fp16": 65.0, "fp32": 8.1}),
]


def device_peak_flops(device: torch.device | str, precision: str) -> float | None:
    """Peak FLOP/s of a CUDA device at 'bf16', 'fp16', 'tf32' or 'fp32'; None when not in the table."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device).lower()
    return peak_flops_for_name(name, precision)


def peak_flops_for_name(name: str, precision: str) -> float | None:
    name = name.lower()
    for key, peaks in PEAK_TFLOPS:
        if key in name:
            tflops = peaks.get(precision)
            return tflops * 1e12 if tflops else None
    return None


# transformers stores these as Conv1D weights, (in, out): the transpose of nn.Linear's
HF_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
HF_HUB_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")


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
