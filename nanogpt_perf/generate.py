"""Generation, fast: each prompt prefilled once, then one token at a time against a KV cache, in a
decode step whose shapes are the same at every position. It compiles once and, on CUDA, is captured
once as a CUDA graph that each token replays (one launch instead of ~450 kernels). Sampling
(temperature, top-k, top-p, the padded vocabulary) stays on the device: the only host sync per token
is the caller's read of it. GPT.generate (model.py) is the slow reference: greedy, or sampled with
the same seed, both give the same tokens (tests/test_generate.py). What only generation uses lives
here: the forward pass against the cache (cached_forward) and top_p's nucleus (sample_next,
candidates), whose draw is model.sample's, GPT.generate's own: one piece of maths for both."""

import functools
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from model import GPT, sample
from nanogpt_perf.quantize import PackedLinear, quantize_linears, replace_linears
from nanogpt_perf.runtime import PTDTYPES, Runtime

# A decode step attends to a cache of fixed length, masked past its position: kernels that take the
# mask as data and build nothing per shape. On CUDA that is the memory-efficient kernel (flash takes
# no mask there); cuDNN, which SDPA prefers on Hopper, is left out: it builds an execution plan for
# every new shape it meets. On a CPU, flash takes the mask.
DECODE_KERNELS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]
# A prefill (causal, one call per prompt length) under attention="sdpa": flash or memory-efficient,
# math where neither takes the dtype (float64); not cuDNN, which would build a new execution plan
# for every prompt length.
PREFILL_KERNELS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    noise: torch.Tensor | None = None,
) -> torch.Tensor:
    """One token per row of logits (B, V): model.sample's (greedy at temperature 0, else drawn as
    torch.multinomial draws, over the top_k most likely), and with top_p < 1 over the nucleus of
    those (see candidates). noise is sample's q, the exponentials drawn beforehand (one per
    candidate), as a CUDA graph that replays the rest needs."""
    if temperature == 0 or top_p is None or top_p >= 1.0:
        return sample(logits, temperature, top_k, generator, noise)
    values, indices = candidates(logits.float() / temperature, top_k, top_p)
    return indices.gather(-1, sample(values, generator=generator, q=noise))


def candidates(
    logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The logits of the tokens that may be drawn and their ids: the top_k most likely (exactly k,
    even when the k-th value is tied), then of those the smallest set whose probability reaches
    top_p (nucleus: the others are -inf; the most likely always stays), sorted most likely first;
    with neither filter, logits as they are and ids None. No shape depends on the values (no boolean
    indexing), so this runs on the device without a sync."""
    nucleus = top_p is not None and top_p < 1.0
    if top_k is not None and top_k < logits.size(-1):
        values, indices = torch.topk(logits, top_k)
    elif nucleus:
        values, indices = logits.sort(dim=-1, descending=True)
    else:
        return logits, None
    if nucleus:
        probs = values.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # the probability of the tokens ranked above each one
        values = values.masked_fill(before >= top_p, float("-inf"))
    return values, indices


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0  # 0 is greedy
    top_k: int | None = None
    top_p: float | None = None
    # tokens from here on are never drawn (a padded vocabulary's tail)
    vocab_size: int | None = None

    def draw(
        self, logits: torch.Tensor, noise: torch.Tensor | None = None, generator=None
    ) -> torch.Tensor:
        """The next token (B, 1) after logits (B, V); noise as sample_next takes it."""
        return sample_next(
            logits[:, : self.vocab_size], self.temperature, self.top_k, self.top_p, generator, noise
        )

    def noise_size(self, vocab_size: int) -> int:
        """How many exponentials a draw takes per row: one per candidate."""
        vocab_size = min(vocab_size, self.vocab_size or vocab_size)
        return min(self.top_k, vocab_size) if self.top_k else vocab_size


def cache_length(prompt_len: int, max_new_tokens: int, block_size: int) -> int:
    """Positions the cache needs: every prompt token and every new one but the last (which is never
    run), rounded up to a multiple of 64 for the kernels, at most block_size (beyond it the window
    slides)."""
    needed = prompt_len + max_new_tokens - 1
    return min(block_size, -(-needed // 64) * 64)


def write_cache(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    pos: torch.Tensor | int | None,
    mask: torch.Tensor | None,
    k: torch.Tensor,
    v: torch.Tensor,
    kernels: SDPBackend | None,
) -> tuple:
    """One layer's KV cache, as CausalSelfAttention calls it (bound to its caches, pos and mask by
    cached_forward): k and v written into the caches (B, nh, L, hs); the keys, values, mask and SDPA
    kernels to attend with. pos as cached_forward takes it: None (a prefill, causal over itself:
    kernels the layer's, else PREFILL_KERNELS), an int (the filled part of the cache, up to these
    tokens) or a 0-d tensor (the whole cache, masked past pos); a decode step's kernels are
    cached_forward's, set once for every layer (a context costs ~15 us on a CPU)."""
    if isinstance(pos, torch.Tensor):
        k_cache.index_copy_(2, pos.view(1), k)
        v_cache.index_copy_(2, pos.view(1), v)
        return k_cache, v_cache, mask, None
    start, end = pos or 0, (pos or 0) + k.size(2)
    k_cache[:, :, start:end] = k
    v_cache[:, :, start:end] = v
    if start == 0:
        return k, v, None, kernels or PREFILL_KERNELS
    return k_cache[:, :, :end], v_cache[:, :, :end], mask, None


def cached_forward(
    model: GPT,
    idx: torch.Tensor,
    k_cache: Sequence[torch.Tensor],
    v_cache: Sequence[torch.Tensor],
    pos: torch.Tensor | int | None = None,
    every: bool = False,
) -> torch.Tensor:
    """Logits (B, V) of the token after idx (every: (B, T, V), after each of its tokens), keeping
    every layer's keys and values in its caches: k_cache and v_cache hold one (B, n_head, L,
    head_size) tensor per layer (rotary keys as turned). idx (B, T) stands at positions pos ... pos
    + T - 1, pos one of:
    - None: a prefill from position 0;
    - an int (known on the host): idx attends to the cache's filled part alone, causally (a decode
      step, or the draft tokens a speculative step checks at once);
    - a 0-d tensor on the device: one token attending to the whole cache, masked past pos by one
      additive mask made here for every layer, so that every shape is the same at every position
      (compiled, CUDA graphs). A cache of per-layer tensors, not one (n_layer, ...) tensor: under
      torch.compile, writes into views of one tensor become copies of all of it at every step."""
    T, mask, dtype = idx.size(1), None, k_cache[0].dtype
    if isinstance(pos, torch.Tensor):
        positions, L = pos.view(1), k_cache[0].size(2)
        past = torch.arange(L, device=idx.device) > pos
        mask = torch.zeros(L, dtype=dtype, device=idx.device).masked_fill(past, float("-inf"))
        mask = mask.view(1, 1, 1, L)
    else:
        positions = torch.arange(pos or 0, (pos or 0) + T, device=idx.device)
        if pos:  # query i sees the keys up to its own position
            later = torch.arange(pos + T, device=idx.device) > positions[:, None]
            mask = torch.zeros(later.shape, dtype=dtype, device=idx.device).masked_fill(
                later, float("-inf")
            )
    caches = [
        functools.partial(write_cache, k, v, pos, mask)
        for k, v in zip(k_cache, v_cache, strict=True)
    ]
    # a decode step's, every layer's
    with sdpa_kernel(DECODE_KERNELS) if mask is not None else nullcontext():
        x = model.blocks(idx, positions, caches)
    return model.head(model.transformer.ln_f(x if every else x[:, -1, :]))


def kv_cache(
    model: GPT, batch_size: int, length: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Zeroed keys and values for length positions of batch_size sequences: a (B, n_head, L,
    head_size) tensor per layer each, in the model's dtype and on its device."""
    cfg, wte = model.config, model.transformer.wte.weight
    shape = (batch_size, cfg.n_head, length, cfg.n_embd // cfg.n_head)
    return (
        [torch.zeros(shape, dtype=wte.dtype, device=wte.device) for _ in range(cfg.n_layer)]
        for _ in range(2)
    )


@functools.cache
def graph_pool(device: torch.device) -> "torch.cuda.MemPool | None":
    """The one memory pool of every decode step's CUDA graph on device in this process, so that a
    Decoder per shape and sampling does not hold a pool of its own. Sharing is safe: a step leaves
    nothing of its own alive between replays (it writes its results into tensors made outside the
    graph), so graphs replayed in any order never read what another wrote. Held as a MemPool for
    the process's life: a bare handle's pool dies with its last graph, and PyTorch (2.11) asserts on
    a capture into a dead pool whose memory is not yet freed (the next Engine's). None before
    PyTorch 2.11, the first whose MemPool this was run with (an H200): a pool per graph."""
    if torch.__version__ < "2.11":
        return None
    with torch.cuda.device(device):
        return torch.cuda.MemPool()


# A CPU's decode step: its wrapper in C++ (the Python around the kernels is a fifth of a step), the
# weights frozen into the graph as constants and every Linear timed against inductor's C++ GEMM
# template, which streams a weight at M=1 faster than MKL or oneDNN (GPT-2's shape: float32 +12%,
# bfloat16 +30%; docs/sample.md)
CPU_COMPILE = {
    "cpp_wrapper": True,
    "freezing": True,
    "max_autotune": True,
    "max_autotune_gemm_backends": "CPP,ATEN",
    "autotune_num_choices_displayed": 0,  # the timings of the choices, not printed
    "max_autotune_report_choices_stats": False,
}


def frozen_model(guards: list) -> list[bool]:
    """The guards a CPU's decode step keeps: on the model, only its own and its parameters'
    identities (which tell one model's step from another's), not the ~1,900 on its modules'
    attributes (hooks, types, flags), whose checks were a few percent of every token. Freezing bakes
    the weights into the step already, so it holds only while the model is not changed: decoding
    changes none of it."""
    return [not g.name.startswith("model.") or g.guard_type == "ID_MATCH" for g in guards]


def compile_decode_step(model: GPT, tensors: list[torch.Tensor], static: bool) -> Callable:
    """cached_forward compiled, once for every position. static (a CUDA graph replays it): for one
    shape, the caches marked as static addresses (the same tensors at every step, so that cudagraphs
    need not copy them in). Else (a CPU): its position and the cache's filled length symbolic, one
    graph for every position, the shapes of the caches and the token fixed, and on a CPU its wrapper
    in C++ (cpp_wrapper: the Python around the kernels is a fifth of a step). torch.compile keeps
    its graphs per code object, so every Decoder of the process shares cached_forward's; past
    dynamo's recompile limit (8) the step would run eagerly without a word, and a CUDA graph would
    capture that: the limit is raised with every Decoder compiled."""
    import torch._dynamo

    for tensor in tensors:
        torch._dynamo.mark_static_address(tensor) if static else torch._dynamo.mark_static(tensor)
    Decoder.compiled += 1
    config = torch._dynamo.config
    # torch < 2.6
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), 2 * Decoder.compiled + 8))
    if static:
        return torch.compile(cached_forward, dynamic=False, fullgraph=True)
    if tensors[0].device.type != "cpu":
        return torch.compile(cached_forward, dynamic=True, fullgraph=True)
    filters = hasattr(torch.compiler, "skip_guard_on_all_nn_modules_unsafe")  # torch >= 2.8
    guards = {"guard_filter_fn": frozen_model} if filters else {}
    compiled = torch.compile(cached_forward, dynamic=True, fullgraph=True, options=guards)

    # freezing is read outside torch.compile's options: patched where it compiles
    def cpu_step(*args, **kwargs):
        with torch._inductor.config.patch(CPU_COMPILE):
            return compiled(*args, **kwargs)

    return cpu_step


class Decoder:
    """The decoding state of batch_size sequences: a KV cache of cache_len positions (one K and one
    V tensor per layer), the current token (B, 1) and the positions filled. step() runs token
    against the cache, draws the next token into token with exponential noise drawn just before
    (what torch.multinomial would draw from the same generator) and advances. Eager, the step
    attends to the filled part of the cache alone, its length known on the host (filled). Static
    (compiled, or a CUDA graph), its position is a 0-d tensor on the device (pos) and it attends to
    the whole cache, masked: nothing changes shape or returns to the host, so on CUDA it is captured
    once as a CUDA graph; the noise is drawn outside the graph, so a graph and an eager step draw
    alike."""

    compiled = 0  # Decoders built with compile=True in this process

    def __init__(
        self,
        model: GPT,
        runtime: Runtime,
        batch_size: int,
        cache_len: int,
        sampling: Sampling,
        compile: bool = False,
        cuda_graph: bool = True,
    ):
        cfg, dev = model.config, runtime.device
        self.static = dev.type == "cuda" and (compile or cuda_graph)
        # eager, a spare position: the filled part is never the whole cache, whose slice alone would
        # be contiguous (a compiled step would guard on it and compile again for the last position)
        self.k, self.v = kv_cache(model, batch_size, cache_len + (not self.static))
        self.token = torch.zeros(batch_size, 1, dtype=torch.long, device=dev)
        self.pos, self.filled = torch.zeros((), dtype=torch.long, device=dev), 0
        self.noise = torch.ones(batch_size, sampling.noise_size(cfg.vocab_size), device=dev)
        self.model, self.runtime, self.sampling, self.cache_len = (
            model,
            runtime,
            sampling,
            cache_len,
        )
        tensors = self.k + self.v + ([] if self.static else [self.token])
        self.forward = (
            compile_decode_step(model, tensors, self.static) if compile else cached_forward
        )
        self.graph: torch.cuda.CUDAGraph | None = None
        start = time.perf_counter()
        if cuda_graph and dev.type == "cuda":
            self.graph = self.capture()
        # compiles now, so that generation is timed apart from it (a position past 0 and 1, which
        elif compile:
            self.filled = min(2, cache_len - 1)  # dynamo would specialise)
            self.run_step()
        runtime.synchronize()
        self.build_seconds = time.perf_counter() - start

    def forward_at(self, idx: torch.Tensor, filled: int, every: bool = False) -> torch.Tensor:
        """cached_forward of idx after the filled positions of the cache, compiled where the step is
        compiled for a host position (not a static step's, nor at 0 and 1, which dynamo would
        specialise: see __init__)."""
        forward = self.forward if not self.static and filled > 1 else cached_forward
        return forward(self.model, idx, self.k, self.v, filled, every)

    def run_step(self) -> None:
        with torch.no_grad():
            if self.static:
                logits = self.forward(self.model, self.token, self.k, self.v, self.pos)
            else:
                logits = self.forward_at(self.token, self.filled)
            self.token.copy_(self.sampling.draw(logits, self.noise))
            self.pos.add_(1)
            self.filled += 1

    def capture(self) -> torch.cuda.CUDAGraph:
        """run_step as a CUDA graph: warmed up on a side stream first (compilation, cuBLAS
        workspaces and autotuning happen outside the capture), then recorded once."""
        stream = torch.cuda.Stream(self.runtime.device)
        stream.wait_stream(torch.cuda.current_stream(self.runtime.device))
        with torch.cuda.stream(stream):
            for _ in range(3):
                self.run_step()
        torch.cuda.current_stream(self.runtime.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        pool = graph_pool(self.runtime.device)
        with torch.cuda.graph(graph, pool=pool and pool.id):
            self.run_step()
        return graph

    def draw_noise(self, generator: torch.Generator | None) -> None:
        if self.sampling.temperature > 0:
            self.noise.exponential_(1, generator=generator)

    def prefill(
        self, idx: torch.Tensor, num_samples: int, generator: torch.Generator | None
    ) -> None:
        """Run the prompts idx (B, T) from position 0 into the cache, each prompt's rows repeated
        for its num_samples sequences (rows b * num_samples ... (b + 1) * num_samples - 1), and draw
        their first tokens."""
        B, T = idx.shape
        with torch.no_grad():
            logits = cached_forward(
                self.model, idx, [k[:B] for k in self.k], [v[:B] for v in self.v]
            )
            if num_samples > 1:
                for cache in self.k + self.v:
                    cache.copy_(cache[:B].repeat_interleave(num_samples, dim=0))
                logits = logits.repeat_interleave(num_samples, dim=0)
            self.draw_noise(generator)
            self.token.copy_(self.sampling.draw(logits, self.noise))
            self.pos.fill_(T)
            self.filled = T

    def step(self, generator: torch.Generator | None) -> None:
        """The next token of every sequence, into token: one graph replay on CUDA."""
        self.draw_noise(generator)
        if self.graph is not None:
            self.graph.replay()
        else:
            self.run_step()


class Engine:
    """Generation from one model: a Decoder per batch size and cache length, built on first use and
    kept (a compiled or captured step is built once for every prompt of that shape). The model is
    made ready to decode here, in place (for_inference): under a runtime with autocast its weights
    cast to its dtype once, its Linears quantized to int8 or int4 (quantize), or packed for oneDNN
    (pack: a CPU in bfloat16, eager)."""

    def __init__(
        self,
        model: GPT,
        runtime: Runtime,
        compile: bool = False,
        cuda_graph: bool = True,
        quantize: str = "none",
        pack: bool = True,
    ):
        # compiled, inductor's own GEMM takes the plain weights (CPU_COMPILE); oneDNN's packing
        # serves eager steps
        self.model = for_inference(model, runtime, quantize, pack and not compile)
        self.runtime, self.compile = runtime, compile
        # decode steps captured as CUDA graphs
        self.graphs = cuda_graph and runtime.device_type == "cuda"
        self.decoders: dict[tuple, Decoder] = {}

    def decoder(
        self, batch_size: int, prompt_len: int, max_new_tokens: int, sampling: Sampling
    ) -> Decoder:
        block_size = self.model.config.block_size
        cache_len = cache_length(min(prompt_len, block_size), max_new_tokens, block_size)
        key = (batch_size, cache_len, sampling)
        if key not in self.decoders:
            self.decoders[key] = Decoder(
                self.model, self.runtime, batch_size, cache_len, sampling, self.compile, self.graphs
            )
        return self.decoders[key]

    def tokens(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        sampling: Sampling,
        generator: torch.Generator | None = None,
        num_samples: int = 1,
        use_cache: bool = True,
    ) -> Iterator[torch.Tensor]:
        """Yield the next token of every sequence, (B * num_samples, 1), max_new_tokens times, after
        the prompts idx (B, T); each prompt is prefilled once and shared by its num_samples
        sequences (rows b * num_samples ... (b + 1) * num_samples - 1). use_cache=False recomputes
        the whole context for every token (the reference: GPT.generate's loop)."""
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, not {num_samples}")
        if not use_cache:
            idx = idx.repeat_interleave(num_samples, dim=0)
            yield from self.uncached_tokens(idx, max_new_tokens, sampling, generator)
            return
        block_size = self.model.config.block_size
        idx = idx[:, -block_size:]
        decoder = self.decoder(idx.size(0) * num_samples, idx.size(1), max_new_tokens, sampling)
        decoder.prefill(idx, num_samples, generator)
        slides = idx.size(1) + max_new_tokens - 1 > block_size
        # what a re-prefill needs
        context = idx.repeat_interleave(num_samples, dim=0) if slides else None
        length = idx.size(1)  # positions filled in the cache
        for i in range(max_new_tokens):
            token = decoder.token.clone()
            yield token
            if i == max_new_tokens - 1:
                break
            if context is not None:
                context = torch.cat((context, token), dim=1)
            if length < decoder.cache_len:
                decoder.step(generator)
                length += 1
            else:
                # The window slides past block_size. A learned absolute position embedding cannot be
                # shifted, so the keys and values of every kept token change: prefill the last
                # block_size tokens again. This gives exactly the tokens of the uncached model, at
                # the cost of a full pass per token from here.
                decoder.prefill(context[:, -block_size:], 1, generator)

    def uncached_tokens(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        sampling: Sampling,
        generator: torch.Generator | None,
    ) -> Iterator[torch.Tensor]:
        """GPT.generate's loop, a forward pass over the whole context (its last block_size tokens)
        for every token, drawn by sampling (top_p too)."""
        for _ in range(max_new_tokens):
            with torch.no_grad():
                logits, _ = self.model(idx[:, -self.model.config.block_size :])
                token = sampling.draw(logits[:, -1], generator=generator)
            idx = torch.cat((idx, token), dim=1)
            yield token


def for_inference(model: GPT, runtime: Runtime, quantize: str = "none", pack: bool = True) -> GPT:
    """model made ready to decode on runtime, in place. Under autocast its weights are cast to
    runtime's dtype once (autocast would cast every weight again at every token, reading three times
    the bytes that decoding needs); its Linears quantized ('int8', 'int4':
    nanogpt_perf/quantize.py), computing in that dtype, or on a CPU in bfloat16 packed once for
    oneDNN (pack). For inference only: a tied lm_head gets its own weight."""
    dtype = PTDTYPES[runtime.dtype] if runtime.autocast else model.transformer.wte.weight.dtype
    if quantize != "none":
        quantize_linears(model, quantize, dtype)
    elif (
        pack
        and runtime.device_type == "cpu"
        and dtype == torch.bfloat16
        and torch.backends.mkldnn.is_available()
    ):
        replace_linears(model, lambda linear: PackedLinear(linear, dtype))
    return model.to(dtype)
