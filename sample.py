"""Generate text from a trained model or from GPT-2, streamed as it is produced, with a KV cache.

python sample.py --out_dir=out-shakespeare-char --start="ROMEO:" --num_samples=3
python sample.py --init_from=gpt2 --start=FILE:prompt.txt --top_p=0.9 --stop="\n\n"
python sample.py --out_dir=out-shakespeare --num_samples=16 --batched=True --compile=True
python sample.py --init_from=hf-shakespeare-char   # an export (export.py), with its vocabulary
python sample.py --out_dir=out-shakespeare --quantize=int4 --draft=ngram   # int4, speculative
"""

from nanogpt_perf.errors import report_errors

report_errors()  # from the first moment: Ctrl-C while torch loads is one line too

import os

# Decoding streams every weight once a token: PyTorch's CPU allocator is asked (before torch loads,
# since it reads this once) to place each tensor of 2 MiB or more in huge pages, which this CPU
# streams faster than 4 KiB ones (docs/sample.md); THP_MEM_ALLOC_ENABLE=0 turns it off
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from configurator import configure
from model import GPT
from nanogpt_perf.config import setting
from nanogpt_perf.data.tokenizer import TextStream, Tokenizer
from nanogpt_perf.errors import UserError
from nanogpt_perf.files import read_user_text
from nanogpt_perf.generate import Engine, Sampling, cache_length, for_inference
from nanogpt_perf.gpt2_weights import HF_HUB_NAMES, load_gpt2
from nanogpt_perf.guard.checkpoint import load_checkpoint
from nanogpt_perf.guard.paths import a_path, init_from_one_of
from nanogpt_perf.memory import peak_memory_bytes
from nanogpt_perf.quantize import CPU_DTYPE, QuantizeConfig, int4_problem, kernel_note
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

ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def unescaped(text: str) -> str:
    """text with the escapes a shell passes as typed (--stop="\\n\\n" is a backslash and an n,
    twice) read as the characters they stand for: \\n, \\t and \\\\; any other backslash is kept."""
    return re.sub(r"\\([nt\\])", lambda m: ESCAPES[m[1]], text)


def a_temperature(value: float) -> None:
    if 0 < value < 1e-6:
        raise ValueError("0 (greedy) or >= 1e-06 (below, the logits overflow float32)")


# -----------------------------------------------------------------------------
@dataclass
class SampleConfig:
    """Settings of sample.py: the model, the prompt and how to sample"""

    init_from: str = setting("resume", "the model: 'resume' is out_dir/ckpt.pt",
                             check=init_from_one_of("resume", *HF_HUB_NAMES))  # fmt: skip
    out_dir: str = setting("out", "where ckpt.pt is (init_from='resume')", check=a_path)
    start: str = setting("\n", "the prompt: text, or FILE:path to read it from a file (~ expanded)")
    num_samples: int = setting(10, "samples to generate", min=1)
    batched: bool = setting(False, "all samples at once from one shared prefill (printed when "
                            "done), else one by one (streamed)")  # fmt: skip
    max_new_tokens: int = setting(500, "tokens generated per sample; at most 1,000,000 (batched, "
                                  "nothing shows until the end)", min=1, max=1_000_000)  # fmt: skip
    temperature: float = setting(0.8, "1.0 samples the model's distribution as is, lower is more "
                                 "conservative, 0 is greedy",
                                 min=0, note=" (0 = greedy)", check=a_temperature)  # fmt: skip
    top_k: int = setting(
        200, "keep only the k most likely tokens; 0 = all", min=0, note=" (0 = all)"
    )
    top_p: float = setting(1.0, "then keep the smallest set of them whose probability reaches "
                           "top_p (nucleus); 1.0 = all", interval="(0, 1]")  # fmt: skip
    stop: str = setting("", "end a sample at this text ('' = none; \\n, \\t and \\\\ are a "
                        "newline, a tab and a backslash, as a shell passes them); GPT-2's "
                        "<|endoftext|> always ends one")  # fmt: skip
    kv_cache: bool = setting(
        True, "False recomputes the whole context for every token (the slow reference)"
    )
    cuda_graph: bool = setting(
        True, "CUDA: capture the decode step as a CUDA graph, replayed for every token"
    )


# sampling needs a trained model (no 'scratch'); compile: the decode step, compiled once and timed
# apart
cfg = configure(
    sample=SampleConfig, weights=QuantizeConfig, speculative=DraftConfig, hardware=DeviceConfig,
    precision=PrecisionConfig, compiler=CompileConfig, rng=SeedConfig, defaults={"compile": False},
)  # fmt: skip
# -----------------------------------------------------------------------------

if cfg.draft and (cfg.batched or not cfg.kv_cache):
    raise UserError(
        f"draft={cfg.draft!r} decodes one sequence at a time through the KV cache: batched=False "
        "and "
        "kv_cache=True"
    )
runtime = resolve_runtime(cfg.device, cfg.dtype, cfg.tf32, cpu_auto=CPU_DTYPE[cfg.quantize])
stop = unescaped(cfg.stop)
print(runtime.describe())
generator = torch.Generator(runtime.device).manual_seed(cfg.seed)

# the tokenizer (a checkpoint's, an export's vocabulary, else GPT-2's) checked against the model and
# the prompt against the tokenizer, before the model is built
checkpoint = (
    load_checkpoint(Path(cfg.out_dir) / "ckpt.pt", runtime.device)
    if cfg.init_from == "resume"
    else None
)
tokenizer = Tokenizer.for_model(checkpoint, cfg.init_from)
start = cfg.start
if start.startswith("FILE:"):
    start = read_user_text(Path(os.path.expanduser(start[5:])), "start=FILE: names the prompt file")
try:
    prompt = tokenizer.encode(start)
except ValueError as e:
    raise UserError(
        f"start (the prompt) has {e}; use only characters of the training text"
    ) from None
if not prompt:
    raise UserError("start (the prompt) is empty: give at least one character or token")

model = GPT.from_checkpoint(checkpoint) if checkpoint is not None else load_gpt2(cfg.init_from)
model.eval().to(runtime.device)
if checkpoint is None:  # a model folder: an export's vocabulary is its model's whole (export.py)
    tokenizer.fit_model(model.config.vocab_size, 1, "model folder")
if cfg.quantize == "int4" and (problem := int4_problem(model)):
    raise UserError(f"quantize=int4: {problem}; use int8")
draft_model = None  # the draft's checkpoint, of the same vocabulary, made ready to decode
if cfg.draft not in ("", "ngram"):
    draft_checkpoint = load_checkpoint(Path(cfg.draft) / "ckpt.pt", runtime.device)
    draft_tokenizer = Tokenizer.for_checkpoint(draft_checkpoint)
    if (draft_tokenizer.itos, draft_tokenizer.n_vocab) != (tokenizer.itos, tokenizer.n_vocab):
        raise UserError(
            f"draft {cfg.draft} has the tokenizer {draft_tokenizer.name}, not the model's "
            f"{tokenizer.name}: a draft must share the model's vocabulary"
        )
    draft_model = GPT.from_checkpoint(draft_checkpoint).eval().to(runtime.device)
    size = f"{draft_model.get_num_params() / 1e6:.2f}M parameters"
    draft_weights = "none" if cfg.quantize == "int4" and int4_problem(draft_model) else cfg.quantize
    # as the model's, where it can be
    draft_model = for_inference(draft_model, runtime, draft_weights)
    print(f"draft: {cfg.draft} ({size}, weights {draft_weights}), {cfg.draft_tokens} a pass")
print(f"tokenizer: {tokenizer.name}")
# the sequences generated together; the model
rows, shape = cfg.num_samples if cfg.batched else 1, model.config
positions = cache_length(min(len(prompt), shape.block_size), cfg.max_new_tokens, shape.block_size)
cache_bytes = 2 * shape.n_layer * rows * shape.n_embd * positions * 4  # keys and values, float32
if cache_bytes > (device_memory_bytes(runtime.device) or cache_bytes):
    raise UserError(
        f"num_samples={cfg.num_samples} batched: the KV cache of {rows} sequences needs "
        f"{cache_bytes / 1e9:,.0f} GB, "
        f"more than {runtime.device}'s memory; generate fewer at once, or batched=False"
    )
idx = torch.tensor([prompt], dtype=torch.long, device=runtime.device)

# the engine: the weights quantized (quantize) or cast once, the decode step compiled once when
# asked (a CUDA graph on CUDA), built ahead and timed apart
engine = Engine(
    model, runtime, compile=cfg.compile, cuda_graph=cfg.cuda_graph, quantize=cfg.quantize
)
if cfg.quantize != "none":
    print(kernel_note(engine.model, cfg.quantize))
sampling = Sampling(cfg.temperature, cfg.top_k or None, cfg.top_p, tokenizer.n_vocab)
if cfg.kv_cache and (cfg.compile or engine.graphs):
    decoder = engine.decoder(
        cfg.num_samples if cfg.batched else 1, idx.size(1), cfg.max_new_tokens, sampling
    )
    built = decoder.build_seconds
    how = ("compiled" if cfg.compile else "eager") + (
        ", captured as a CUDA graph" if engine.graphs else ""
    )
    print(f"built the decode step ({how}) in {built:.1f} s")

first_token_at: float | None = None  # when the first sample's first token was ready
drafts = DraftStats()  # speculative decoding's passes and acceptance, over every sample


def tokens(n: int):
    """The generator of next tokens, (n, 1) per step."""
    global first_token_at
    if cfg.draft:
        cache = engine.decoder(1, idx.size(1), cfg.max_new_tokens, sampling).cache_len
        draft = (
            NgramDraft()
            if draft_model is None
            else ModelDraft(draft_model, sampling, cache, generator)
        )
        new = speculative_tokens(
            engine, idx, cfg.max_new_tokens, sampling, draft, cfg.draft_tokens, generator, drafts
        )
    else:
        new = engine.tokens(
            idx, cfg.max_new_tokens, sampling, generator, num_samples=n, use_cache=cfg.kv_cache
        )
    for token in new:
        if first_token_at is None:
            runtime.synchronize()
            first_token_at = time.perf_counter()
        yield token


def ended(ids: list[int]) -> bool:
    return ids[-1] == tokenizer.eot or (stop != "" and stop in tokenizer.decode(ids))


def trim(text: str) -> str:
    return text.split(stop)[0] if stop else text


def stream_one() -> int:
    """Print one sample as it is generated; returns how many tokens it took."""
    stream, ids, text, shown = TextStream(tokenizer), [], "", 0
    print(start, end="", flush=True)
    for token in tokens(1):
        ids.append(token.item())
        if ids[-1] == tokenizer.eot:
            break
        text += stream.push(ids[-1:])
        if stop and stop in text:
            break
        # hold back what may be the beginning of the stop text
        safe = len(text) - max(len(stop) - 1, 0)
        if safe > shown:
            print(text[shown:safe], end="", flush=True)
            shown = safe
    print(trim(text + stream.flush())[shown:])
    return len(ids)


def generate_batch() -> int:
    """All num_samples together, printed when every one has ended; returns the tokens generated."""
    rows = [[] for _ in range(cfg.num_samples)]
    done = [False] * cfg.num_samples
    for token in tokens(cfg.num_samples):
        for row, t in zip(rows, token.view(-1).tolist(), strict=True):
            row.append(t)
        done = [d or ended(row) for d, row in zip(done, rows, strict=True)]
        if all(done):
            break
    for row in rows:
        cut = row.index(tokenizer.eot) if tokenizer.eot in row else len(row)
        print(start + trim(tokenizer.decode(row[:cut])))
        print("---------------")
    return len(rows[0]) * cfg.num_samples


with torch.no_grad():
    runtime.synchronize()
    t0 = time.perf_counter()
    if cfg.batched:
        n_tokens = generate_batch()
    else:
        n_tokens = 0
        for _ in range(cfg.num_samples):
            n_tokens += stream_one()
            print("---------------")
    runtime.synchronize()
    elapsed = time.perf_counter() - t0

mem = peak_memory_bytes(runtime.device)
if cfg.draft:
    print(drafts.describe())
print(
    f"time to first token {(first_token_at - t0) * 1000:.1f} ms; {n_tokens} tokens in "
    f"{elapsed:.2f} s: "
    f"{n_tokens / elapsed:,.1f} tokens/s; peak memory {(mem or 0) / 2**20:.0f} MiB"
)
