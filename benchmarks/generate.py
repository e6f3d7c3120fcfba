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
from dataclasses import asdict, dataclass, replace

import torch

from configurator import configure
from model import GPT, NANOGPT_FIELDS, RECIPE_ARCHITECTURE, GPTConfig
from nanogpt_perf.config import Config, setting
from nanogpt_perf.errors import UserError
from nanogpt_perf.files import write_json
from nanogpt_perf.generate import Engine, Sampling, cache_length, onednn_for_cpu_inference
from nanogpt_perf.guard.paths import optional_path, output_file
from nanogpt_perf.manifest import run_manifest
from nanogpt_perf.memory import model_size_problem, peak_memory_bytes
from nanogpt_perf.runtime import (
    CompileConfig,
    DeviceConfig,
    PrecisionConfig,
    SeedConfig,
    device_memory_bytes,
    resolve_runtime,
)


# -----------------------------------------------------------------------------
@dataclass
class GenerateConfig:
    """Settings of benchmarks/generate.py: what is generated, what is timed, where the figures go"""

    vocab_size: int = setting(50304, "of the random weights and prompt", min=1)
    prompt_tokens: int = setting(16, "the prompt's length", min=1)
    max_new_tokens: int = setting(500, "tokens generated per sequence; at most 1,000,000 (a row shows nothing until "
                                  "it ends)", min=2, max=1_000_000, note=" (one decode step at least)")  # fmt: skip
    batch_size: int = setting(1, "sequences generated together from one shared prefill", min=1)
    top_k: int = setting(200, "sampling's top_k; 0 = all", min=0, note=" (0 = all)")
    uncached: bool = setting(True, "also time the uncached reference (slow: the whole context is recomputed for "
                             "every token)")  # fmt: skip
    cuda_graph: bool = setting(True, "CUDA: capture the decode step as a CUDA graph")
    onednn: bool = setting(True, "CPU, float32, not compiled: Linear layers through oneDNN (nanogpt_perf/generate.py)")
    nanogpt_dir: str = setting("", "a nanoGPT checkout: also time its model.py's generate on the same weights",
                               check=optional_path)  # fmt: skip
    repeats: int = setting(1, "rounds of every row, interleaved; the median of each row is reported; at most 1,000",
                           min=1, max=1_000)  # fmt: skip
    out_json: str = setting("", "the figures as JSON; '' = print only", check=output_file(".json"))


def fits(cfg: Config) -> None:
    """The prompt fits in the context, and the model in this machine."""
    if cfg.prompt_tokens > cfg.block_size:
        raise ValueError(f"prompt_tokens must be <= block_size ({cfg.block_size}), not {cfg.prompt_tokens}")
    if problem := model_size_problem(cfg.n_layer, cfg.n_embd, cfg.vocab_size, cfg.block_size):
        raise ValueError(problem)


# the model's shape and options are model.py's (GPTConfig: GPT-2's by default); compile: the cached decode step
cfg = configure(
    generate=GenerateConfig, model=GPTConfig, hardware=DeviceConfig, precision=PrecisionConfig, compiler=CompileConfig,
    rng=SeedConfig, defaults={"compile": False}, cross=(fits,),
)  # fmt: skip
# -----------------------------------------------------------------------------

if cfg.nanogpt_dir and not (Path(cfg.nanogpt_dir) / "model.py").is_file():
    raise UserError(f"nanogpt_dir must be a nanoGPT checkout (with model.py), not {cfg.nanogpt_dir!r}")
if cfg.nanogpt_dir and (recipe := [k for k in RECIPE_ARCHITECTURE if getattr(cfg, k) != cfg.defaults[k]]):
    raise UserError(f"nanoGPT's model has no {', '.join(recipe)}: nanogpt_dir times a model of GPT-2's architecture")
runtime = resolve_runtime(cfg.device, cfg.dtype, cfg.tf32)
print(runtime.describe())
B, T, new_tokens = cfg.batch_size, cfg.prompt_tokens, cfg.max_new_tokens
positions = cache_length(min(T, cfg.block_size), new_tokens, cfg.block_size)
cache_bytes = 2 * cfg.n_layer * B * cfg.n_embd * positions * 4  # keys and values, float32
if cache_bytes > (device_memory_bytes(runtime.device) or cache_bytes):
    memory = f"{cache_bytes / 1e9:,.0f} GB, more than {runtime.device}'s memory"
    raise UserError(f"batch_size={B}: the KV cache needs {memory}")
torch.manual_seed(cfg.seed)
model = GPT(replace(cfg.model, vocab_size=cfg.vocab_size)).eval().to(runtime.device)
prompt = torch.randint(cfg.vocab_size, (1, T), device=runtime.device)
print(
    f"model: {model.get_num_params() / 1e6:.1f}M parameters; prompt {T} tokens, {new_tokens} new, batch {B}, top_k "
    f"{cfg.top_k}"
)


def nanogpt_model() -> torch.nn.Module:
    """nanoGPT's GPT (its model.py, imported from the checkout) with our weights: the same names and shapes."""
    spec = importlib.util.spec_from_file_location("nanogpt_model", Path(cfg.nanogpt_dir) / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    shape = {k: v for k, v in asdict(model.config).items() if k in NANOGPT_FIELDS}
    theirs = module.GPT(module.GPTConfig(**shape))
    theirs.load_state_dict(model.state_dict())
    return theirs.eval().to(runtime.device)


theirs = nanogpt_model() if cfg.nanogpt_dir else None
if cfg.onednn and not cfg.compile:
    model = onednn_for_cpu_inference(model, runtime)
engine = Engine(model, runtime, compile=cfg.compile, cuda_graph=cfg.cuda_graph)
sampling = Sampling(top_k=cfg.top_k)
cached_name = "KV cache" + (", compiled" if cfg.compile else "") + (", CUDA graph" if engine.graphs else "")
build_s = engine.decoder(B, T, new_tokens, sampling).build_seconds
print(f"decode step built in {build_s:.1f} s")


def time_engine(use_cache: bool) -> tuple[float, float]:
    """(seconds to the first token, new tokens per second over the whole generation), each token read on the host
    as it comes, as sample.py streams them (one sync per token)."""
    generator = torch.Generator(runtime.device).manual_seed(cfg.seed)
    runtime.synchronize()
    t0, first = time.perf_counter(), None
    for token in engine.tokens(prompt, new_tokens, sampling, generator, B, use_cache):
        token.view(-1).tolist()
        first = first or time.perf_counter() - t0
    return first, B * new_tokens / (time.perf_counter() - t0)


def time_nanogpt() -> tuple[None, float]:
    """nanoGPT's generate as its sample.py calls it (it yields nothing before the end: no time to first token)."""
    torch.manual_seed(cfg.seed)
    runtime.synchronize()
    t0 = time.perf_counter()
    with torch.no_grad(), runtime.autocast_ctx():
        theirs.generate(prompt.repeat(B, 1), new_tokens, temperature=1.0, top_k=cfg.top_k)
    runtime.synchronize()
    return None, B * new_tokens / (time.perf_counter() - t0)


rows = {cached_name: lambda: time_engine(True)}
if cfg.uncached:
    rows["uncached"] = lambda: time_engine(False)
if theirs is not None:
    rows["nanoGPT generate"] = time_nanogpt
runs: dict[str, list[tuple]] = {name: [] for name in rows}
for r in range(cfg.repeats):
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
print(f"\nmedian of {cfg.repeats} round(s), batch {B}:")
for row in results:
    ratios = ", ".join(
        f"{row['tokens_per_s'] / other['tokens_per_s']:.2f}x {other['name']}" for other in results if other is not row
    )
    print(f"{row['name']:>28}: {row['tokens_per_s']:9.1f} tokens/s" + (f" ({ratios})" if ratios else ""))
mem = peak_memory_bytes(runtime.device)
print(f"peak memory {(mem or 0) / 2**20:.0f} MiB")
if cfg.out_json:
    manifest = run_manifest(cfg.as_dict(), runtime)
    doc = {"kind": "generation", "manifest": manifest, "build_s": build_s, "results": results}
    write_json(Path(cfg.out_json), doc | {"peak_mem_bytes": mem})
    print(f"wrote {cfg.out_json}")
