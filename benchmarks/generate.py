"""
Time generation on a model of a given shape (random weights: speed does not depend on what the weights are): the
KV-cache engine (nanogpt_perf/generate.py), the uncached reference, and optionally nanoGPT's own generate on the
same weights, in interleaved rounds.

    python benchmarks/generate.py                                  # GPT-2 (124M) shape, 16-token prompt, 500 new tokens
    python benchmarks/generate.py --batch_size=16 --compile=True --uncached=False --device=cuda
    python benchmarks/generate.py --nanogpt_dir=../nanoGPT --uncached=False --repeats=3

The engine and the reference produce exactly the same tokens (the tests check it); this measures what it saves.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for its modules
from nanogpt_perf.errors import report_errors

report_errors()  # from the first moment: Ctrl-C while torch loads is one line too

import importlib.util
import statistics
import time

import torch

from configurator import configure
from model import GPT, GPTConfig
from nanogpt_perf.errors import UserError
from nanogpt_perf.files import write_json
from nanogpt_perf.generate import Engine, Sampling, cache_length, onednn_for_cpu_inference
from nanogpt_perf.manifest import run_manifest
from nanogpt_perf.memory import model_size_problem, peak_memory_bytes
from nanogpt_perf.rules import at_least, not_above, one_of, optional_path, output_file
from nanogpt_perf.runtime import PTDTYPES, device_memory_bytes, device_problem, resolve_runtime
from nanogpt_perf.settings import gpt_config_problem

# -----------------------------------------------------------------------------
n_layer = 12
n_head = 12
n_embd = 768
block_size = 1024
vocab_size = 50304
prompt_tokens = 16
max_new_tokens = 500
batch_size = 1  # sequences generated together from one shared prefill
top_k = 200
uncached = True  # also time the uncached reference (slow: the whole context is recomputed for every token)
compile = False  # torch.compile the cached decode step (build time reported apart)
cuda_graph = True  # CUDA: capture the decode step as a CUDA graph
onednn = True  # CPU, float32, not compiled: Linear layers through oneDNN (nanogpt_perf/generate.py)
nanogpt_dir = ""  # a nanoGPT checkout: also time its model.py's generate on the same weights
repeats = 1  # rounds of every row, interleaved; the median of each row is reported
out_json = ""  # the figures as JSON; '' = print only
device = "auto"
dtype = "auto"
seed = 1337
settings = configure(
    globals(),
    rules={
        **{k: at_least(1) for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "prompt_tokens")},
        "max_new_tokens": at_least(2, " (one decode step at least)"),
        "batch_size": at_least(1),
        "top_k": at_least(0, " (0 = all)"),
        "repeats": at_least(1),
        "device": device_problem,
        "dtype": one_of("auto", *PTDTYPES),
        "seed": at_least(0),
        "out_json": output_file(".json"),
        "nanogpt_dir": optional_path,
    },
    cross=[
        gpt_config_problem,
        not_above("prompt_tokens", "block_size"),
        lambda s: model_size_problem(s["n_layer"], s["n_embd"], s["vocab_size"], s["block_size"]),
    ],
)
# -----------------------------------------------------------------------------

if nanogpt_dir and not (Path(nanogpt_dir) / "model.py").is_file():
    raise UserError(f"nanogpt_dir must be a nanoGPT checkout (with model.py), not {nanogpt_dir!r}")
runtime = resolve_runtime(device, dtype)
print(runtime.describe())
positions = cache_length(min(prompt_tokens, block_size), max_new_tokens, block_size)
cache_bytes = 2 * n_layer * batch_size * n_embd * positions * 4  # keys and values, float32
if cache_bytes > (device_memory_bytes(runtime.device) or cache_bytes):
    raise UserError(
        f"batch_size={batch_size}: the KV cache needs {cache_bytes / 1e9:,.0f} GB, more than {runtime.device}'s memory"
    )
torch.manual_seed(seed)
config = GPTConfig(block_size=block_size, vocab_size=vocab_size, n_layer=n_layer, n_head=n_head, n_embd=n_embd)
model = GPT(config).eval().to(runtime.device)
prompt = torch.randint(vocab_size, (1, prompt_tokens), device=runtime.device)
print(
    f"model: {model.get_num_params() / 1e6:.1f}M parameters; prompt {prompt_tokens} tokens, {max_new_tokens} new, "
    f"batch {batch_size}, top_k {top_k}"
)


def nanogpt_model() -> torch.nn.Module:
    """nanoGPT's GPT (its model.py, imported from the checkout) with our weights: the same names and shapes."""
    spec = importlib.util.spec_from_file_location("nanogpt_model", Path(nanogpt_dir) / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    shape = dict(block_size=block_size, vocab_size=vocab_size, n_layer=n_layer, n_head=n_head, n_embd=n_embd)
    theirs = module.GPT(module.GPTConfig(**shape, dropout=0.0, bias=True))
    theirs.load_state_dict(model.state_dict())
    return theirs.eval().to(runtime.device)


theirs = nanogpt_model() if nanogpt_dir else None
if onednn and not compile:
    model = onednn_for_cpu_inference(model, runtime)
engine = Engine(model, runtime, compile=compile, cuda_graph=cuda_graph)
sampling = Sampling(top_k=top_k)
cached_name = "KV cache" + (", compiled" if compile else "") + (", CUDA graph" if engine.graphs else "")
build_s = engine.decoder(batch_size, prompt_tokens, max_new_tokens, sampling).build_seconds
print(f"decode step built in {build_s:.1f} s")


def time_engine(use_cache: bool) -> tuple[float, float]:
    """(seconds to the first token, new tokens per second over the whole generation), each token read on the host
    as it comes, as sample.py streams them (one sync per token)."""
    generator = torch.Generator(runtime.device).manual_seed(seed)
    runtime.synchronize()
    t0, first = time.perf_counter(), None
    for token in engine.tokens(prompt, max_new_tokens, sampling, generator, batch_size, use_cache):
        token.view(-1).tolist()
        first = first or time.perf_counter() - t0
    return first, batch_size * max_new_tokens / (time.perf_counter() - t0)


def time_nanogpt() -> tuple[None, float]:
    """nanoGPT's generate as its sample.py calls it (it yields nothing before the end: no time to first token)."""
    torch.manual_seed(seed)
    runtime.synchronize()
    t0 = time.perf_counter()
    with torch.no_grad(), runtime.autocast_ctx():
        theirs.generate(prompt.repeat(batch_size, 1), max_new_tokens, temperature=1.0, top_k=top_k)
    runtime.synchronize()
    return None, batch_size * max_new_tokens / (time.perf_counter() - t0)


rows = {cached_name: lambda: time_engine(True)}
if uncached:
    rows["uncached"] = lambda: time_engine(False)
if theirs is not None:
    rows["nanoGPT generate"] = time_nanogpt
runs: dict[str, list[tuple]] = {name: [] for name in rows}
for r in range(repeats):
    for name, run in rows.items():
        ttft, rate = run()
        runs[name].append((ttft, rate))
        first = "" if ttft is None else f", time to first token {ttft * 1000:.1f} ms"
        print(f"round {r + 1}: {name:>28}: {rate:9.1f} tokens/s{first}", flush=True)

results = []
for name, measured in runs.items():
    rates = [rate for _, rate in measured]
    firsts = [t for t, _ in measured if t is not None]
    results.append(
        {
            "name": name,
            "tokens_per_s": statistics.median(rates),
            "tokens_per_s_runs": rates,
            "ttft_ms": statistics.median(firsts) * 1000 if firsts else None,
        }
    )
print(f"\nmedian of {repeats} round(s), batch {batch_size}:")
for row in results:
    ratios = ", ".join(
        f"{row['tokens_per_s'] / other['tokens_per_s']:.2f}x {other['name']}" for other in results if other is not row
    )
    print(f"{row['name']:>28}: {row['tokens_per_s']:9.1f} tokens/s" + (f" ({ratios})" if ratios else ""))
mem = peak_memory_bytes(runtime.device)
print(f"peak memory {(mem or 0) / 2**20:.0f} MiB")
if out_json:
    doc = {"kind": "generation", "manifest": run_manifest(settings, runtime), "build_s": build_s, "results": results}
    write_json(Path(out_json), doc | {"peak_mem_bytes": mem})
    print(f"wrote {out_json}")
