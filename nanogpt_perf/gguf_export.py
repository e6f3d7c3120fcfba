"""One of our models as a GGUF file: what llama.cpp (and Ollama, LM Studio, ... on it) loads.

Architectures, as llama.cpp's src/models/ compute them:
- GPT-2's (every recipe field off but untied_head) as "gpt2": learned positions, LayerNorm, the
  tanh GELU, q, k, v in one tensor. llama.cpp needs every bias: a model without biases gets zero
  ones. An untied head is its own `output` tensor; a tied model leaves it out (llama.cpp reuses
  token_embd).
- rotary + rmsnorm + relu2, without biases, as "arcee": RMSNorm (ours has no weight: ones), RoPE,
  a non-gated ReLU^2 MLP. llama.cpp rotates arcee's heads in its "normal" form, the pairs
  (2i, 2i + 1); ours turns the rotate-half pairs (i, i + head_size/2) by the same angles. q's and
  k's rows of each head are reordered to put each of our pairs where llama.cpp rotates it, which
  leaves the attention scores as they were.
No architecture of llama.cpp has qk_norm, logit_softcap, value_embeds or unet_skips, nor another
mix of rotary, rmsnorm and relu2: architecture_problem says which field, in one line.

Tokenizers: GPT-2's BPE as llama.cpp's "gpt2" model with GPT-2's pre-tokenizer, the tokens in
GPT-2's byte-to-unicode form and the merges, both rebuilt from the tokenizer's own token bytes (no
file, no network); <|endoftext|> is a control token, bos and eos. A character vocabulary as
llama.cpp's "rwkv" model: tokens as byte strings, text split greedily by the longest token that
matches, which for single characters is one token per character, whatever its UTF-8 bytes; it has
no bos or eos (llama.cpp's "gpt2" model would make token 11 the eos: a character that ends text).

File types (FILE_TYPES) are those of the 2-D tensors; 1-D ones (norms, biases) are always float32,
as llama.cpp's converter writes them. q8_0 and q4_0 quantize rows in blocks of 32 values: a tensor
whose rows are not a multiple of 32 long is written float16.
"""

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from model import GPT, ROTARY_BASE, GPTConfig
from nanogpt_perf.data.tokenizer import Tokenizer
from nanogpt_perf.files import write_through_path

# a file type -> the GGML type of its 2-D tensors and llama.cpp's name for the file type, in gguf
FILE_TYPES = {
    "float32": ("F32", "ALL_F32"),
    "float16": ("F16", "MOSTLY_F16"),
    "bfloat16": ("BF16", "MOSTLY_BF16"),
    "q8_0": ("Q8_0", "MOSTLY_Q8_0"),
    "q4_0": ("Q4_0", "MOSTLY_Q4_0"),
}
LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default
RMS_NORM_EPS = torch.finfo(torch.float32).eps  # nn.RMSNorm(eps=None)'s, for float32
ARCEE = ("rotary", "rmsnorm", "relu2")  # llama.cpp's arcee has all three, its gpt2 none
NO_GGUF = {  # a recipe field that no architecture of llama.cpp computes, and what it is
    "qk_norm": "q and k RMS-normalised per head",
    "logit_softcap": "logits = c * tanh(logits / c)",
    "value_embeds": "token embeddings mixed into the values",
    "unet_skips": "skips from the first half's blocks to the second half's",
}
BLOCK = {  # a module of a block of ours -> its tensor in llama.cpp
    "ln_1": "attn_norm",
    "attn.c_attn": "attn_qkv",
    "attn.c_proj": "attn_output",
    "ln_2": "ffn_norm",
    "mlp.c_fc": "ffn_up",
    "mlp.c_proj": "ffn_down",
}


def architecture_problem(config: GPTConfig) -> str | None:
    """Why a model of this config has no GGUF architecture, in one line naming the field; None if
    it has one."""
    fields = GPTConfig.__dataclass_fields__
    for name, what in NO_GGUF.items():
        if getattr(config, name) != fields[name].default:
            return f"GGUF has no architecture with {name} ({what}): export a model without it"
    on = [name for name in ARCEE if getattr(config, name)]
    if on and len(on) < len(ARCEE):
        off = ", ".join(name for name in ARCEE if name not in on)
        return (
            f"GGUF has no architecture with {', '.join(on)} but not {off}: llama.cpp's gpt2 has "
            f"none of {', '.join(ARCEE)}, its arcee all three"
        )
    if on and config.bias:
        return (
            "GGUF's architecture with rotary, rmsnorm and relu2 (llama.cpp's arcee) has no biases: "
            "export a model with bias=False"
        )
    return None


def vocabulary_problem(tokenizer: Tokenizer) -> str | None:
    """Why a tokenizer has no exact GGUF counterpart, in one line; None if it has."""
    for i, token in enumerate(tokenizer.itos or ()):
        if len(token) != 1:
            return f"GGUF's character tokenizer takes single characters, not {token!r} (token {i})"
        try:
            token.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate
            return f"token {i} of the character vocabulary, {token!r}, is no UTF-8 text"
    return None


def write_gguf(model: GPT, tokenizer: Tokenizer, path: Path, file_type: str = "float32") -> None:
    """Write model and its tokenizer to the GGUF file path: its 2-D tensors as file_type (one of
    FILE_TYPES), the vocabulary cut to the tokenizer's; atomically (into a temporary file beside
    path, then renamed). A ValueError, nothing written, for a model or a tokenizer that GGUF
    cannot hold."""
    import gguf

    if file_type not in FILE_TYPES:
        raise ValueError(f"file_type must be one of {', '.join(FILE_TYPES)}, not {file_type!r}")
    if why := architecture_problem(model.config) or vocabulary_problem(tokenizer):
        raise ValueError(why)
    if tokenizer.n_vocab > model.config.vocab_size:
        n, V = tokenizer.n_vocab, model.config.vocab_size
        raise ValueError(f"the tokenizer's {n} tokens are more than the model's {V}")
    arch = "arcee" if model.config.rotary else "gpt2"
    writer = gguf.GGUFWriter(None, arch)  # all in memory first, then written
    add_hyperparameters(writer, model.config, file_type)
    add_vocabulary(writer, tokenizer)
    for name, tensor in gguf_tensors(model, tokenizer.n_vocab).items():
        data, qtype = encoded(tensor, file_type)
        writer.add_tensor(name, data, raw_dtype=qtype)

    def write(tmp: Path) -> None:
        try:
            writer.write_header_to_file(tmp)
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()

    write_through_path(Path(path), write)


def gguf_tensors(model: GPT, n_vocab: int) -> dict[str, np.ndarray]:
    """model's weights under llama.cpp's names, float32 on the CPU, the vocabulary cut to n_vocab:
    gpt2's with every bias (zeros where the model has none), arcee's without any, and q and k
    reordered for its RoPE."""
    cfg, t = model.config, model.transformer
    arcee = cfg.rotary
    tensors = {"token_embd.weight": t.wte.weight[:n_vocab]}
    if not arcee:
        tensors["position_embd.weight"] = t.wpe.weight
    for i, block in enumerate(t.h):
        for ours, theirs in BLOCK.items():
            tensors |= module_tensors(block.get_submodule(ours), f"blk.{i}.{theirs}", not arcee)
        if arcee:
            qkv = f"blk.{i}.attn_qkv.weight"
            tensors[qkv] = interleave_rotary_pairs(tensors[qkv], cfg.n_head)
    tensors |= module_tensors(t.ln_f, "output_norm", not arcee)
    if cfg.untied_head:
        tensors["output.weight"] = model.lm_head.weight[:n_vocab]
    return {name: w.detach().to("cpu", torch.float32).numpy() for name, w in tensors.items()}


def module_tensors(module: nn.Module, name: str, biases: bool) -> dict[str, Tensor]:
    """A Linear's or a norm's weight (ones for an RMSNorm without one) and, where biases, its bias
    (zeros for a module without)."""
    weight = module.weight if module.weight is not None else torch.ones(module.normalized_shape)
    tensors = {f"{name}.weight": weight}
    if biases:
        bias = module.bias
        tensors[f"{name}.bias"] = bias if bias is not None else torch.zeros(len(weight))
    return tensors


def interleave_rotary_pairs(c_attn: Tensor, n_head: int) -> Tensor:
    """c_attn's weight (3C, C) with the rows of q and of k in each head reordered from ours, the
    rotate-half pairs (i, i + hs/2), to llama.cpp's normal RoPE's pairs (2i, 2i + 1): row i goes to
    2i, row i + hs/2 to 2i + 1."""
    C = c_attn.shape[1]
    qk, v = c_attn[: 2 * C], c_attn[2 * C :]
    qk = qk.reshape(2 * n_head, 2, C // n_head // 2, C).transpose(1, 2).reshape(2 * C, C)
    return torch.cat((qk, v))


def encoded(tensor: np.ndarray, file_type: str) -> tuple[np.ndarray, Any]:
    """(the data, its GGML type) that tensor is written as: a 1-D one float32, a 2-D one as
    file_type, or float16 where its rows are not whole blocks of file_type's."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import quantize

    qtype = GGMLQuantizationType[FILE_TYPES[file_type][0]]
    if tensor.ndim == 1:
        qtype = GGMLQuantizationType.F32
    elif tensor.shape[-1] % GGML_QUANT_SIZES[qtype][0]:  # 32 for q8_0 and q4_0, else 1
        qtype = GGMLQuantizationType.F16
    return quantize(tensor, qtype), qtype


def add_hyperparameters(writer: Any, cfg: GPTConfig, file_type: str) -> None:
    """The shape keys llama.cpp reads for gpt2 or arcee, and the file type."""
    from gguf import GGML_QUANT_VERSION, LlamaFileType

    writer.add_context_length(cfg.block_size)
    writer.add_embedding_length(cfg.n_embd)
    writer.add_feed_forward_length(4 * cfg.n_embd)
    writer.add_block_count(cfg.n_layer)
    writer.add_head_count(cfg.n_head)
    if cfg.rotary:
        writer.add_head_count_kv(cfg.n_head)
        writer.add_layer_norm_rms_eps(RMS_NORM_EPS)
        writer.add_rope_dimension_count(cfg.n_embd // cfg.n_head)
        writer.add_rope_freq_base(ROTARY_BASE)
    else:
        writer.add_layer_norm_eps(LAYER_NORM_EPS)
    writer.add_file_type(LlamaFileType[FILE_TYPES[file_type][1]])
    writer.add_quantization_version(GGML_QUANT_VERSION)


def add_vocabulary(writer: Any, tokenizer: Tokenizer) -> None:
    """The tokenizer.ggml.* keys: a character vocabulary as rwkv's, GPT-2's BPE as gpt2's."""
    from gguf import TokenType

    if tokenizer.itos is not None:
        writer.add_tokenizer_model("rwkv")
        writer.add_token_list([c.replace("\\", "\\\\") for c in tokenizer.itos])  # rwkv's escape
        writer.add_token_types([TokenType.NORMAL] * len(tokenizer.itos))
    else:
        pieces = [tokenizer.token_bytes(i) for i in range(tokenizer.n_vocab)]
        ranks = {piece: i for i, piece in enumerate(pieces) if i != tokenizer.eot}
        merges = [merged_pair(p, rank, ranks) for p, rank in ranks.items() if len(p) > 1]
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("gpt-2")
        writer.add_token_list([unicode_text(piece) for piece in pieces])
        kinds = (TokenType.NORMAL, TokenType.CONTROL)
        writer.add_token_types([kinds[i == tokenizer.eot] for i in range(len(pieces))])
        writer.add_token_merges([f"{unicode_text(a)} {unicode_text(b)}" for a, b in merges])
        writer.add_bos_token_id(tokenizer.eot)
        writer.add_eos_token_id(tokenizer.eot)
    writer.add_add_bos_token(False)


def byte_to_unicode() -> list[str]:
    """GPT-2's printable stand-in for each byte: itself where printable (! to ~, ¡ to ¬, ® to ÿ),
    else the next free character from U+0100 on, in byte order."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)}
    printable |= set(range(ord("®"), 256))
    others = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(others)) for b in range(256)]


BYTE_TO_UNICODE = byte_to_unicode()


def unicode_text(piece: bytes) -> str:
    return "".join(BYTE_TO_UNICODE[b] for b in piece)


def merged_pair(piece: bytes, rank: int, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The two tokens whose merge makes piece: BPE over its bytes with the merges ranked below it,
    which ends in two parts (tiktoken keeps only the ranks; GPT-2's vocab.bpe lists these pairs in
    rank order)."""
    parts = [piece[i : i + 1] for i in range(len(piece))]
    while len(parts) > 2:
        pairs = zip(parts, parts[1:], strict=False)
        best, i = min((ranks.get(a + b, math.inf), i) for i, (a, b) in enumerate(pairs))
        if best >= rank:
            raise ValueError(f"token {rank} ({piece!r}) is no merge of two tokens ranked below")
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
    return parts[0], parts[1]
