"""What a user would run instead, on our weights, for lab/generate.py's interleaved rounds:
llama.cpp (llama-cpp-python, reading a GGUF file written by export.py's writer) and transformers'
GPT-2 (its generate, with its KV cache). Each runner decodes greedily one token at a time from the
same prompt and gives back (seconds to the first token, new tokens per second, bytes read per
token); None when its package is missing."""

import atexit
import importlib.util
import os
import time
from collections.abc import Callable
from pathlib import Path

if __name__ == "__main__":  # before the project's imports, which only generate.py's sys.path finds
    raise SystemExit("error: rivals.py is a module of lab/generate.py: run that one (--help)")

import numpy as np
import torch

from model import GPT, RECIPE_ARCHITECTURE, GPTConfig, to_hf_state_dict
from nanogpt_perf.data.tokenizer import Tokenizer
from nanogpt_perf.errors import quiet_loggers
from nanogpt_perf.gpt2_weights import gpt2_config

Runner = Callable[[], tuple[float, float, float]]
# our weights' names in lab/generate.py -> the GGUF file type llama.cpp reads them from
LLAMA_TYPES = {"float32": "float32", "bfloat16": "bfloat16", "int8": "q8_0", "int4": "q4_0"}
LLAMA_CACHE_BYTES = 2  # llama.cpp's KV cache holds float16 keys and values by default


def llama_cpp_runner(
    model: GPT, tokenizer: Tokenizer, weights: str, prompt: list[int], new_tokens: int, folder: Path
) -> Runner | None:
    """llama.cpp on model's weights as weights' GGUF type (in folder), or None without llama_cpp."""
    if importlib.util.find_spec("llama_cpp") is None or weights not in LLAMA_TYPES:
        return None
    from llama_cpp import Llama

    from nanogpt_perf.gguf_export import write_gguf

    path = folder / f"model-{LLAMA_TYPES[weights]}.gguf"
    write_gguf(model, tokenizer, path, LLAMA_TYPES[weights])
    threads = torch.get_num_threads()
    llama = Llama(model_path=str(path), n_ctx=len(prompt) + new_tokens, n_threads=threads,
                  n_threads_batch=threads, n_batch=512, verbose=False)  # fmt: skip
    atexit.register(llama.close)  # before the interpreter tears down what its finaliser calls
    cfg = model.config
    # position_embd, float32: one row read
    lookups = cfg.block_size * cfg.n_embd * 4 if not cfg.rotary else 0
    per_position = 2 * cfg.n_layer * cfg.n_embd * LLAMA_CACHE_BYTES

    n_vocab = llama.n_vocab()

    # the last token's (Llama.scores holds them only with logits_all)
    def last_logits() -> np.ndarray:
        return np.ctypeslib.as_array(llama._ctx.get_logits_ith(-1), shape=(n_vocab,))

    def run() -> tuple[float, float, float]:
        llama.reset()
        t0 = time.perf_counter()
        llama.eval(prompt)
        first = None
        for _ in range(new_tokens):
            token = int(last_logits().argmax())
            first = first or time.perf_counter() - t0
            llama.eval([token])
        rate = new_tokens / (time.perf_counter() - t0)
        cache = per_position * (len(prompt) + (new_tokens - 1) / 2)
        return first, rate, os.path.getsize(path) - lookups + cache

    return run


def transformers_runner(
    model: GPT, vocab_size: int, weights: str, prompt: list[int], new_tokens: int, batch_size: int,
    device: torch.device, cache: str = "dynamic",
) -> Runner | None:  # fmt: skip
    """transformers' GPT2LMHeadModel on model's weights in float32 or bfloat16, its generate greedy
    with its KV cache ('dynamic', its default, or 'static': it compiles its forward itself); None
    without transformers, for other weights, or for a model that is not GPT-2's architecture."""
    fields = GPTConfig.__dataclass_fields__
    gpt2 = all(getattr(model.config, k) == fields[k].default for k in RECIPE_ARCHITECTURE)
    if (
        importlib.util.find_spec("transformers") is None
        or weights not in ("float32", "bfloat16")
        or not gpt2
    ):
        return None
    with quiet_loggers("torchao", "torch.utils._pytree"):
        from transformers import GPT2LMHeadModel
    cfg = model.config
    hf = GPT2LMHeadModel(gpt2_config(cfg, vocab_size, pad_token_id=0))
    hf.load_state_dict(to_hf_state_dict(model, vocab_size), strict=False)
    dtype = torch.float32 if weights == "float32" else torch.bfloat16
    hf = hf.to(device, dtype).eval()
    idx = torch.tensor([prompt] * batch_size, device=device)
    how = {} if cache == "dynamic" else {"cache_implementation": cache}
    per_token = (
        sum(p.numel() * p.element_size() for p in hf.parameters())
        - hf.transformer.wpe.weight.nbytes
    )
    per_position = 2 * cfg.n_layer * cfg.n_embd * torch.finfo(dtype).bits // 8

    def run() -> tuple[float, float, float]:
        t0 = time.perf_counter()
        with torch.no_grad():
            hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=new_tokens,
                        min_new_tokens=new_tokens, do_sample=False, **how)  # fmt: skip
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        rate = batch_size * new_tokens / (time.perf_counter() - t0)
        return (
            None,
            rate,
            per_token / batch_size + per_position * (len(prompt) + (new_tokens - 1) / 2),
        )

    return run
