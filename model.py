"""
The whole GPT-2 in one file: model, optimizer set-up, generation and MFU accounting.

References: OpenAI's GPT-2 release and the transformers implementation (for the maths and the weight layout).
"""

import inspect
import math
from dataclasses import dataclass

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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(
                q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
            )
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
            causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
            y = self.attn_dropout(att) @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()  # exact erf GELU; GPT-2 used the tanh approximation, the difference is within 1e-3
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
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

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Extend idx (B, T) by max_new_tokens, recomputing the (cropped) context for every token."""
        for _ in range(max_new_tokens):
            context = idx[:, -self.config.block_size :]
            logits, _ = self(context)
            next_token = sample_next(logits[:, -1, :], temperature, top_k, generator)
            idx = torch.cat((idx, next_token), dim=1)
        return idx


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
    logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, generator: torch.Generator | None = None
) -> torch.Tensor:
    """One token per row of logits (B, V): greedy at temperature 0, else sampled from the top_k candidates."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.size(-1):
        values, indices = torch.topk(logits, top_k)  # exactly k survive, even when the k-th value is tied
        logits = torch.full_like(logits, float("-inf")).scatter_(-1, indices, values)
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator)


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
