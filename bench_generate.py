"""
Time generation with and without the KV cache on a model of a given shape (random weights: speed does not depend
on what the weights are).

    python bench_generate.py                                  # GPT-2 (124M) shape, 16-token prompt, 500 new tokens
    python bench_generate.py --batch_size=16 --compile=True --uncached=False --device=cuda

Both paths produce exactly the same tokens (the tests check it); this measures what the cache saves.
"""

import time

import torch

from configurator import configure
from model import GPT, GPTConfig
from nanogpt_perf.inference import compile_decode_step, onednn_for_cpu_inference
from nanogpt_perf.memory import peak_memory_bytes
from nanogpt_perf.runtime import resolve_runtime
from nanogpt_perf.validation import at_least

# -----------------------------------------------------------------------------
n_layer = 12
n_head = 12
n_embd = 768
block_size = 1024
vocab_size = 50304
prompt_tokens = 16
max_new_tokens = 500
batch_size = 1  # sequences generated together from one shared prefill
uncached = True  # also time the uncached reference (slow: the whole context is recomputed for every token)
compile = False  # torch.compile the cached decode step (compile time reported apart)
onednn = True  # CPU, float32, not compiled: Linear layers through oneDNN (nanogpt_perf/inference.py)
device = "auto"
dtype = "auto"
seed = 1337
settings = configure(globals(), rules={"max_new_tokens": at_least(2, " (one decode step at least)")})
# -----------------------------------------------------------------------------

runtime = resolve_runtime(device, dtype)
print(runtime.describe())
torch.manual_seed(seed)
config = GPTConfig(block_size=block_size, vocab_size=vocab_size, n_layer=n_layer, n_head=n_head, n_embd=n_embd)
model = GPT(config).eval().to(runtime.device)
prompt = torch.randint(vocab_size, (1, prompt_tokens), device=runtime.device)
print(
    f"model: {model.get_num_params() / 1e6:.1f}M parameters; prompt {prompt_tokens} tokens, {max_new_tokens} new, "
    f"batch {batch_size}"
)

decode_step = None
if compile:
    decode_step, seconds = compile_decode_step(model, batch_size, runtime)
    print(f"compile time of the decode step: {seconds:.1f} s")
elif onednn:
    model = onednn_for_cpu_inference(model, runtime)


def time_generation(use_cache: bool) -> tuple[float, float]:
    """(seconds to the first token, new tokens per second over the whole generation)."""
    generator = torch.Generator(runtime.device).manual_seed(seed)
    runtime.synchronize()
    t0 = time.perf_counter()
    first = None
    with torch.no_grad(), runtime.autocast_ctx():
        for i, _ in enumerate(
            model.generate_tokens(
                prompt,
                max_new_tokens,
                generator=generator,
                top_k=200,
                num_samples=batch_size,
                use_cache=use_cache,
                decode_step=decode_step,
            )
        ):
            if i == 0:
                runtime.synchronize()
                first = time.perf_counter() - t0
    runtime.synchronize()
    return first, batch_size * max_new_tokens / (time.perf_counter() - t0)


tokens_per_s = {}
for use_cache in (True, False) if uncached else (True,):
    name = "KV cache" + (", compiled" if compile else "") if use_cache else "uncached"
    ttft, tokens_per_s[use_cache] = time_generation(use_cache)
    print(f"{name:>20}: {tokens_per_s[use_cache]:8.1f} tokens/s, time to first token {ttft * 1000:.1f} ms")
if uncached:
    print(f"speedup of the cache: {tokens_per_s[True] / tokens_per_s[False]:.1f}x")
mem = peak_memory_bytes(runtime.device)
print(f"peak memory {(mem or 0) / 2**20:.0f} MiB")
