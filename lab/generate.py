"""Time generation as training is timed, in interleaved rounds: tokens/s, the bytes a decode step
reads per token and the bandwidth that makes (its MBU against this machine's streaming bandwidth),
for each of the weights asked for (float32, bfloat16, int8, int4), with and without a draft
(speculative decoding), beside the uncached reference, nanoGPT's generate, llama.cpp and
transformers on the same weights. A model of a given shape with random weights (speed does not
depend on what the weights are), or a checkpoint's (out_dir): then also each weights' val loss and
greedy agreement with float32's. The engine and the reference produce exactly the same tokens (the
tests check it); this measures what it saves. The figures, and the commands behind them:
docs/sample.md.

    python lab/generate.py          # GPT-2 (124M) shape, 16-token prompt, 500 new tokens
    python lab/generate.py --weights=float32,bfloat16,int8,int4 --rivals=True --temperature=0
    python lab/generate.py --out_dir=out-shakespeare-cpu --weights=float32,int8,int4 --draft=ngram
    python lab/generate.py --nanogpt_dir=../nanoGPT --uncached=False --repeats=3
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for its modules
from nanogpt_perf.errors import report_errors

report_errors()  # from the first moment: Ctrl-C while torch loads is one line too

import os

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # weights in huge pages, as sample.py says why

import atexit
import copy
import importlib.util
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import partial
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from configurator import configure
from model import GPT, NANOGPT_FIELDS, RECIPE_ARCHITECTURE, GPTConfig, to_hf_state_dict
from nanogpt_perf.config import Config, setting
from nanogpt_perf.data.loader import TokenBatches
from nanogpt_perf.data.tokenizer import GPT2_VOCAB_SIZE, Tokenizer
from nanogpt_perf.errors import UserError, quiet_loggers
from nanogpt_perf.files import write_json
from nanogpt_perf.generate import Engine, Sampling, cache_length, for_inference
from nanogpt_perf.gguf_export import write_gguf
from nanogpt_perf.gpt2_weights import gpt2_config
from nanogpt_perf.guard.checkpoint import load_checkpoint
from nanogpt_perf.guard.paths import comma_separated, optional_path, output_file
from nanogpt_perf.guard.weights import model_size_problem
from nanogpt_perf.manifest import run_manifest
from nanogpt_perf.memory import peak_memory_bytes
from nanogpt_perf.quantize import (
    CPU_DTYPE,
    QUANTIZE,
    PackedLinear,
    int4_problem,
    kernel_note,
)
from nanogpt_perf.runtime import (
    CompileConfig,
    DeviceConfig,
    PrecisionConfig,
    SeedConfig,
    device_memory_bytes,
    resolve_runtime,
)
from nanogpt_perf.speculative import (
    DraftConfig,
    DraftStats,
    ModelDraft,
    NgramDraft,
    speculative_tokens,
)

WEIGHTS = ("float32", "bfloat16", "int8", "int4")


# -----------------------------------------------------------------------------
@dataclass
class GenerateConfig:
    """Settings of lab/generate.py: what is generated, what is timed, where the figures go"""

    out_dir: str = setting("", "a checkpoint's folder: its model, val loss and greedy agreement; "
                           "'' = random weights of the shape given",
                           check=optional_path)  # fmt: skip
    weights: str = setting("", "a row each: comma-separated float32, bfloat16, int8, int4; '' = "
                           "the dtype's, as before", words=("",),
                           check=comma_separated(*WEIGHTS))  # fmt: skip
    vocab_size: int = setting(50304, "of the random weights and prompt", min=1)
    prompt_tokens: int = setting(16, "the prompt's length", min=1)
    prompts: int = setting(1, "our rows generate from this many prompts in turn (out_dir's: "
                           "of its val split): tokens/s over them all, the time to a first "
                           "token and the quality the first's; at most 8",
                           min=1, max=8)  # fmt: skip
    max_new_tokens: int = setting(500, "tokens generated per sequence; at most 1,000,000 (a row "
                                  "shows nothing until it ends)", min=2, max=1_000_000,
                                  note=" (one decode step at least)")  # fmt: skip
    batch_size: int = setting(1, "sequences generated together from one shared prefill", min=1)
    temperature: float = setting(
        1.0, "sampling's temperature; 0 = greedy (the rivals decode greedily)", min=0
    )
    top_k: int = setting(200, "sampling's top_k; 0 = all", min=0, note=" (0 = all)")
    uncached: bool = setting(True, "also time the uncached reference (slow: the whole context is "
                             "recomputed for every token)")  # fmt: skip
    cuda_graph: bool = setting(True, "CUDA: capture the decode step as a CUDA graph")
    onednn: bool = setting(
        True, "CPU, bfloat16, not compiled: Linear layers through oneDNN (nanogpt_perf/generate.py)"
    )
    rivals: bool = setting(False, "also llama.cpp (llama-cpp-python) and transformers on the same "
                           "weights, where installed")  # fmt: skip
    nanogpt_dir: str = setting("", "a nanoGPT checkout: also time its model.py's generate on the "
                               "same weights", check=optional_path)  # fmt: skip
    eval_iters: int = setting(
        50, "out_dir: batches of 8 of the val split for each weights' val loss", min=1
    )
    repeats: int = setting(1, "rounds of every row, interleaved; the median of each row is "
                           "reported; at most 1,000", min=1, max=1_000)  # fmt: skip
    out_json: str = setting("", "the figures as JSON; '' = print only", check=output_file(".json"))


def fits(cfg: Config) -> None:
    """The prompt fits the context, the model this machine, and the rows asked for go together."""
    if cfg.prompt_tokens > cfg.block_size:
        raise ValueError(
            f"prompt_tokens must be <= block_size ({cfg.block_size}), not {cfg.prompt_tokens}"
        )
    if problem := model_size_problem(cfg.n_layer, cfg.n_embd, cfg.vocab_size, cfg.block_size):
        raise ValueError(problem)
    if cfg.prompts > 1 and (cfg.rivals or cfg.nanogpt_dir):
        raise ValueError("prompts > 1 times our engine alone: rivals=False, nanogpt_dir=''")
    if cfg.draft and cfg.batch_size > 1:
        raise ValueError(f"draft={cfg.draft!r} decodes one sequence at a time: batch_size=1")


# the model's shape and options are model.py's (GPTConfig: GPT-2's by default); compile: the cached
# decode step
cfg = configure(
    generate=GenerateConfig,
    speculative=DraftConfig,
    model=GPTConfig,
    hardware=DeviceConfig,
    precision=PrecisionConfig,
    compiler=CompileConfig,
    rng=SeedConfig,
    defaults={"compile": False},
    cross=(fits,),
)
# -----------------------------------------------------------------------------

if cfg.nanogpt_dir and not (Path(cfg.nanogpt_dir) / "model.py").is_file():
    raise UserError(
        f"nanogpt_dir must be a nanoGPT checkout (with model.py), not {cfg.nanogpt_dir!r}"
    )
runtime = resolve_runtime(cfg.device, cfg.dtype, cfg.tf32)
print(runtime.describe())
torch.manual_seed(cfg.seed)
checkpoint = load_checkpoint(Path(cfg.out_dir) / "ckpt.pt") if cfg.out_dir else None
if checkpoint is not None:  # the checkpoint's model and tokenizer, prompts from its val split
    model = GPT.from_checkpoint(checkpoint)
    tokenizer = Tokenizer.for_checkpoint(checkpoint)
    data_path = Path(checkpoint["config"]["data_dir"]) / checkpoint["config"]["dataset"]
    batches = TokenBatches(data_path, 8, model.config.block_size, torch.device("cpu"), cfg.seed)
    val = next(batches.eval_batches("val", 1))[0]  # 8 windows of the val split
    prompts = list(val[: cfg.prompts, None, : cfg.prompt_tokens])
else:
    model = GPT(replace(cfg.model, vocab_size=cfg.vocab_size))
    vocab = min(cfg.vocab_size, GPT2_VOCAB_SIZE)  # the rivals' files need a tokenizer
    tokenizer = Tokenizer([chr(256 + i) for i in range(vocab)] if vocab < GPT2_VOCAB_SIZE else None)
    prompts = list(torch.randint(vocab, (cfg.prompts, 1, cfg.prompt_tokens)))
model.eval().to(runtime.device)
prompts = [p.to(runtime.device) for p in prompts]
prompt = prompts[0]
B, T, new_tokens, shape = cfg.batch_size, prompt.size(1), cfg.max_new_tokens, model.config
# the recipe's options this model has, which nanoGPT's and transformers' GPT-2 have not
recipe = [k for k in RECIPE_ARCHITECTURE if getattr(shape, k) != cfg.defaults[k]]
if cfg.nanogpt_dir and recipe:
    raise UserError(
        f"nanoGPT's model has no {', '.join(recipe)}: nanogpt_dir times a model of GPT-2's "
        "architecture"
    )
positions = cache_length(min(T, shape.block_size), new_tokens, shape.block_size)
filled = T + (new_tokens - 1) / 2  # the positions a dynamic KV cache holds, on average
kv_size = 2 * shape.n_layer * shape.n_embd  # the keys' and values' elements a position holds
cache_bytes = kv_size * B * positions * 4  # float32
if cache_bytes > (device_memory_bytes(runtime.device) or cache_bytes):
    memory = f"{cache_bytes / 1e9:,.0f} GB, more than {runtime.device}'s memory"
    raise UserError(f"batch_size={B}: the KV cache needs {memory}")
weights = [w.strip() for w in cfg.weights.split(",")] if cfg.weights else [""]
if "int4" in weights and (problem := int4_problem(model)):
    raise UserError(f"weights int4: {problem}")
print(
    f"model: {model.get_num_params() / 1e6:.1f}M parameters; {len(prompts)} prompt(s) of {T} "
    f"tokens, {new_tokens} new, batch {B}, temperature {cfg.temperature}, top_k {cfg.top_k}"
)


def seconds(work: Callable[[], object]) -> float:
    """work()'s time, the device synchronized before and after."""
    runtime.synchronize()
    t0 = time.perf_counter()
    work()
    runtime.synchronize()
    return time.perf_counter() - t0


def stream_bandwidth() -> float:
    """This device's streaming read bandwidth, bytes/s: the median of 5 sums over 2 GiB (more than
    any cache), 1 GiB on a GPU with less than 16 GiB."""
    n = 2**29 if device_memory_bytes(runtime.device) >= 2**34 else 2**28
    x = torch.ones(n, device=runtime.device)
    return 4 * n / statistics.median([seconds(x.sum) for _ in range(6)][1:])


def decode_bytes(engine: Engine) -> float:
    """Bytes a decode step reads per token, on average over this generation: every weight but the
    lookups' (an embedding reads a row), and the KV cache in the embedding's dtype, its filled part
    (a static step's: all of it; B sequences share the weights)."""
    model, decoder = engine.model, engine.decoder(B, T, new_tokens, sampling)
    embedding = lambda m: isinstance(m, torch.nn.Embedding)
    # an embedding's weight is read whole where a tied head reads it too
    linear = {id(m.weight) for m in model.modules() if hasattr(m, "weight") and not embedding(m)}
    lookups = {id(m.weight) for m in model.modules() if embedding(m)} - linear
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()] if id(t) not in lookups}
    packed = [m.weight for m in model.modules() if isinstance(m, PackedLinear)]  # not parameters
    weights = sum(t.numel() * t.element_size() for t in [*tensors.values(), *packed])
    kv = kv_size * model.transformer.wte.weight.element_size()
    return weights / B + kv * (decoder.cache_len if decoder.static else filled)


def engine_for(w: str) -> Engine:
    """A copy of the model made ready to decode as w: float32 and bfloat16 as named, a quantized
    model in what its CPU kernels take ('auto') or the dtype given."""
    dtype = w if w in ("float32", "bfloat16") else cfg.dtype
    computes = resolve_runtime(cfg.device, dtype, cfg.tf32, cpu_auto=CPU_DTYPE.get(w, "float32"))
    quantize = w if w in QUANTIZE else "none"
    return Engine(copy.deepcopy(model), computes, cfg.compile, cfg.cuda_graph, quantize, cfg.onednn)


class Measured(NamedTuple):
    first: float | None  # seconds to the first token
    rate: float  # new tokens per second over the whole generation
    bytes: float | None  # read per token
    drafts: DraftStats | None = None


def time_engine(engine: Engine, use_cache: bool = True, draft: str | GPT | None = None) -> Measured:
    """engine's generation from each prompt in turn, each token read on the host as it comes, as
    sample.py streams them (one sync a token); with a draft ('ngram', or a model made ready as
    engine's), speculatively (one sequence)."""
    stats, total, first = DraftStats() if draft is not None else None, 0.0, None
    for prompt in prompts:
        g = torch.Generator(runtime.device).manual_seed(cfg.seed)
        if draft is None:
            tokens = engine.tokens(prompt.expand(B, -1), new_tokens, sampling, g, 1, use_cache)
        else:
            d = NgramDraft() if draft == "ngram" else ModelDraft(draft, sampling, positions, g)
            tokens = speculative_tokens(
                engine, prompt, new_tokens, sampling, d, cfg.draft_tokens, g, stats
            )
        runtime.synchronize()
        t0 = time.perf_counter()
        for token in tokens:
            token.view(-1).tolist()
            first = first or time.perf_counter() - t0
        total += time.perf_counter() - t0
    rate = len(prompts) * B * new_tokens / total
    return Measured(first, rate, decode_bytes(engine) if use_cache else None, stats)


def nanogpt_row() -> Callable[[], Measured]:
    """nanoGPT's generate as its sample.py calls it, from its model.py (imported from the checkout)
    with our weights: the same names and shapes."""
    path = Path(cfg.nanogpt_dir) / "model.py"
    spec = importlib.util.spec_from_file_location("nanogpt_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = {k: v for k, v in asdict(shape).items() if k in NANOGPT_FIELDS}
    theirs = module.GPT(module.GPTConfig(**args))
    theirs.load_state_dict(model.state_dict())
    theirs.eval().to(runtime.device)

    def run() -> Measured:
        torch.manual_seed(cfg.seed)
        with runtime.autocast_ctx():
            generate = partial(theirs.generate, prompt.repeat(B, 1), new_tokens, top_k=cfg.top_k)
            return Measured(None, B * new_tokens / seconds(generate), None)

    return run


def llama_cpp_row(w: str, folder: Path) -> Callable[[], Measured] | None:
    """llama.cpp (llama-cpp-python) on the model's weights as w's GGUF type, written in folder by
    export.py's writer, decoding greedily one token at a time; None without llama_cpp."""
    if importlib.util.find_spec("llama_cpp") is None or w not in WEIGHTS:
        return None
    from llama_cpp import Llama

    kind = {"int8": "q8_0", "int4": "q4_0"}.get(w, w)  # the GGUF file type
    path = folder / f"model-{kind}.gguf"
    try:
        write_gguf(model, tokenizer, path, kind)
    except ValueError as e:  # a model or a tokenizer that GGUF cannot hold
        raise UserError(f"rivals=True: llama.cpp reads a GGUF file, and {e}") from None
    threads, ids = torch.get_num_threads(), prompt[0].tolist()
    llama = Llama(model_path=str(path), n_ctx=T + new_tokens, n_threads=threads,
                  n_threads_batch=threads, n_batch=512, verbose=False)  # fmt: skip
    atexit.register(llama.close)  # before the interpreter tears down what its finaliser calls
    # read per token: the file less position_embd (float32, a row read), the KV cache's filled part
    # (float16 by default)
    lookups = shape.block_size * shape.n_embd * 4 if not shape.rotary else 0
    per_token = path.stat().st_size - lookups + kv_size * 2 * filled
    vocab = llama.n_vocab()

    def run() -> Measured:
        llama.reset()
        t0, first = time.perf_counter(), None
        llama.eval(ids)
        for _ in range(new_tokens):
            # the last token's logits (Llama.scores holds them only with logits_all)
            logits = np.ctypeslib.as_array(llama._ctx.get_logits_ith(-1), shape=(vocab,))
            token = int(logits.argmax())
            first = first or time.perf_counter() - t0
            llama.eval([token])
        return Measured(first, new_tokens / (time.perf_counter() - t0), per_token)

    return run


def transformers_row(w: str, cache: str) -> Callable[[], Measured] | None:
    """transformers' GPT2LMHeadModel on the model's weights in float32 or bfloat16, its generate
    greedy with its KV cache ('dynamic', its default, or 'static': it compiles its forward itself);
    None without transformers, for other weights, or for a model not of GPT-2's architecture."""
    if recipe or w not in ("float32", "bfloat16") or not importlib.util.find_spec("transformers"):
        return None
    with quiet_loggers("torchao", "torch.utils._pytree"):
        from transformers import GPT2LMHeadModel
    vocab, dtype = tokenizer.n_vocab, getattr(torch, w)
    hf = GPT2LMHeadModel(gpt2_config(shape, vocab, pad_token_id=0))
    hf.load_state_dict(to_hf_state_dict(model, vocab), strict=False)
    hf = hf.to(runtime.device, dtype).eval()
    # a lookup reads one row of wpe
    weights = sum(p.nbytes for p in hf.parameters()) - hf.transformer.wpe.weight.nbytes
    idx = prompt.repeat(B, 1)
    how = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False}
    how |= {} if cache == "dynamic" else {"cache_implementation": cache}
    generate = partial(hf.generate, idx, attention_mask=torch.ones_like(idx), **how)
    per_token = weights / B + kv_size * dtype.itemsize * filled
    return lambda: Measured(None, B * new_tokens / seconds(generate), per_token)


# a row each: our engine for each weights (a copy of the model made ready by it), with the draft,
# the uncached reference once, the rivals on the same weights, nanoGPT's generate
sampling = Sampling(
    cfg.temperature, cfg.top_k or None, vocab_size=tokenizer.n_vocab if checkpoint else None
)
draft = None
if cfg.draft not in ("", "ngram"):
    draft = GPT.from_checkpoint(load_checkpoint(Path(cfg.draft) / "ckpt.pt"))
    draft = draft.eval().to(runtime.device)
rows: dict[str, Callable[[], Measured] | None] = {}
engines: dict[str, Engine] = {}
scratch = tempfile.TemporaryDirectory(prefix="generate-")  # the rivals' GGUF files, removed at exit
for w in weights:
    engine = engines[w] = engine_for(w)
    name = f"{w}, KV cache" if w else "KV cache"
    name += (", compiled" if cfg.compile else "") + (", CUDA graph" if engine.graphs else "")
    build = engine.decoder(B, T, new_tokens, sampling).build_seconds
    print(f"{name}: decode step built in {build:.1f} s")
    if w in ("int8", "int4"):
        print(kernel_note(engine.model, w))
    rows[name] = lambda e=engine: time_engine(e)
    if cfg.draft == "ngram":
        rows[f"{name}, draft ngram"] = lambda e=engine: time_engine(e, draft="ngram")
    elif draft is not None:  # the draft model, quantized as the model is where it can be
        quantize = w if w in QUANTIZE and not (w == "int4" and int4_problem(draft)) else "none"
        d = for_inference(copy.deepcopy(draft), engine.runtime, quantize)
        rows[f"{name}, draft {cfg.draft}"] = lambda e=engine, d=d: time_engine(e, draft=d)
    if cfg.uncached and w == weights[0]:
        rows["uncached"] = lambda e=engine: time_engine(e, use_cache=False)
    if cfg.rivals:
        rival = w or runtime.dtype
        rows[f"llama.cpp, {rival}"] = llama_cpp_row(rival, Path(scratch.name)) if B == 1 else None
        for cache in ("dynamic", "static") if runtime.device_type == "cuda" else ("dynamic",):
            rows[f"transformers, {rival}, {cache} cache"] = transformers_row(rival, cache)
if cfg.nanogpt_dir:
    rows["nanoGPT generate"] = nanogpt_row()

runs = {name: [] for name, run in rows.items() if run is not None}
for r in range(cfg.repeats):
    for name in runs:
        runs[name].append(m := rows[name]())
        first = "" if m.first is None else f", time to first token {m.first * 1000:.1f} ms"
        print(f"round {r + 1}: {name:>34}: {m.rate:9.1f} tokens/s{first}", flush=True)

bandwidth = stream_bandwidth()
print(
    f"\nmedian of {cfg.repeats} round(s), batch {B}; streaming bandwidth {bandwidth / 1e9:.1f} "
    "GB/s (MBU: the bytes read per token times tokens/s, over it)"
)
results = []
for name, measured in runs.items():
    rate, per_token = statistics.median(m.rate for m in measured), measured[0].bytes
    firsts = [m.first for m in measured if m.first is not None]
    row = {
        "name": name,
        "tokens_per_s": rate,
        "tokens_per_s_runs": [m.rate for m in measured],
        "ttft_ms": statistics.median(firsts) * 1000 if firsts else None,
        "bytes_per_token": per_token,
        "mbu": per_token * rate / bandwidth if per_token else None,
    }
    base = results[0]["tokens_per_s"] if results else rate
    line = f"{name:>34}: {rate:9.1f} tokens/s ({rate / base:.2f}x the first row)"
    if per_token:
        line += f", {per_token / 1e6:6.1f} MB/token, {per_token * rate / 1e9:5.1f} GB/s"
        line += f", MBU {row['mbu']:.0%}"
    if (stats := measured[-1].drafts) is not None:
        row |= {"acceptance": stats.acceptance, "tokens_per_step": stats.tokens_per_step}
        line += f"; {stats.describe()}"
    results.append(row)
    print(line)
mem = peak_memory_bytes(runtime.device)
print(f"peak memory {(mem or 0) / 2**20:.0f} MiB")


def assess(engine: Engine, reference: list[int] | None = None) -> tuple[list[int], float, float]:
    """engine's greedy tokens after the prompt; its mean loss over eval_iters batches of the val
    split (the same windows for every model); of the positions of reference (float32's greedy
    tokens, else its own) within the context, the share where its most likely next token, given
    those tokens so far, is reference's."""
    model, greedy = engine.model, Sampling(temperature=0, vocab_size=tokenizer.n_vocab)
    tokens = torch.cat(list(engine.tokens(prompt, new_tokens, greedy)), 1)[0].tolist()
    seq = torch.tensor([prompt[0].tolist() + (reference or tokens)], device=runtime.device)
    seq, losses = seq[:, : shape.block_size + 1], []
    with torch.no_grad():
        logits = lambda x: model.head(model.hidden_states(x.to(runtime.device))).float()
        for x, y in batches.eval_batches("val", cfg.eval_iters):
            y = y.to(runtime.device)
            losses.append(F.cross_entropy(logits(x).flatten(0, 1), y.flatten()).item())
        choices = logits(seq[:, :-1])[0, T - 1 :, : tokenizer.n_vocab].argmax(-1)
    return tokens, statistics.mean(losses), (choices == seq[0, T:]).float().mean().item()


quality = []
if checkpoint is not None:  # each weights' val loss and greedy tokens against float32's
    reference, loss32, _ = assess(engines.get("float32") or engine_for("float32"))
    print(
        f"\nquality on {data_path} (val, {cfg.eval_iters} batches of 8), greedy over {new_tokens} "
        "tokens:"
    )
    for w, engine in engines.items():
        tokens, loss, agreement = assess(engine, reference)
        differ = [i for i, (a, b) in enumerate(zip(tokens, reference, strict=True)) if a != b]
        same = differ[0] if differ else len(reference)
        row = {"weights": w or runtime.dtype, "val_loss": loss, "vs_float32": loss / loss32 - 1,
               "greedy_prefix": same, "agreement": agreement}  # fmt: skip
        quality.append(row)
        print(
            f"{row['weights']:>10}: val loss {loss:.4f} ({row['vs_float32']:+.2%} of float32's), "
            f"the first {same} greedy tokens float32's, its next-token choice float32's at "
            f"{agreement:.1%} of positions"
        )

if cfg.out_json:
    build_s = engines[weights[0]].decoder(B, T, new_tokens, sampling).build_seconds
    doc = {"kind": "generation", "manifest": run_manifest(cfg.as_dict(), runtime)}
    doc |= {"build_s": build_s, "stream_bytes_per_s": bandwidth, "results": results}
    write_json(Path(cfg.out_json), doc | {"quality": quality, "peak_mem_bytes": mem})
    print(f"wrote {cfg.out_json}")
