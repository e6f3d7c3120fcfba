"""Generation: the KV cache against full recomputation, sampling filters, streaming, GPT-2
interop."""

import copy
import re

import pytest
import torch

from conftest import GENERATE_CONFIG, prompts, run_script, sharp_model, tiny_hf_folder
from model import GPT, GPTConfig, from_hf_state_dict, sample, to_hf_state_dict
from nanogpt_perf.data.tokenizer import TextStream, Tokenizer
from nanogpt_perf.generate import (
    CPU_COMPILE,
    Engine,
    PackedLinear,
    Sampling,
    cached_forward,
    candidates,
    for_inference,
    sample_next,
)
from nanogpt_perf.gpt2_weights import load_gpt2
from nanogpt_perf.runtime import resolve_runtime
from nanogpt_perf.train.checkpoint import save_checkpoint

CPU = resolve_runtime("cpu", "float32")
ALL = dict(
    rotary=True, rmsnorm=True, qk_norm=True, relu2=True, untied_head=True, logit_softcap=20.0
)
ALL |= dict(zero_init_proj=True, value_embeds=True, unet_skips=True)
RECIPES = {
    "default": {},
    **{k: {k: v} for k, v in ALL.items()},
    "all": ALL,
    "all, 3 layers": dict(ALL, n_layer=3),  # a middle layer: no skip, no value embedding
}


def engine_generate(
    model,
    idx,
    max_new_tokens,
    num_samples=1,
    generator=None,
    engine=None,
    use_cache=True,
    **sampling,
) -> torch.Tensor:
    """idx extended by the engine's tokens, as GPT.generate returns it."""
    engine = engine or Engine(model, CPU)
    new = engine.tokens(
        idx, max_new_tokens, Sampling(**sampling), generator, num_samples, use_cache
    )
    return torch.cat([idx.repeat_interleave(num_samples, dim=0), *new], dim=1)


def seeded(seed: int = 5) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("attention", ["sdpa", "manual"])
def test_cached_greedy_equals_uncached_past_block_size(attention):
    model = sharp_model(attention=attention)
    idx = prompts(3, 5)
    cached = engine_generate(model, idx, 40, temperature=0)  # 45 tokens: well past block_size 16
    uncached = model.generate(idx, 40, temperature=0)
    assert torch.equal(cached, uncached)
    assert len(set(cached[0, 5:].tolist())) > 3  # not a degenerate repetition


# a cache shorter than block_size, one that fills it, sliding
@pytest.mark.parametrize("new_tokens", [3, 9, 30])
def test_cached_sampling_equals_uncached_with_the_same_seed(new_tokens):
    model = sharp_model(seed=3)
    # top_p: the engine's alone, uncached as GPT.generate runs
    kwargs = dict(temperature=0.9, top_k=20, top_p=0.95)
    a = engine_generate(model, prompts(2, 7), new_tokens, generator=seeded(), **kwargs)
    b = engine_generate(
        model, prompts(2, 7), new_tokens, generator=seeded(), use_cache=False, **kwargs
    )
    assert torch.equal(a, b)
    # what GPT.generate samples with: its tokens, cached or not
    kwargs = dict(temperature=0.9, top_k=20)
    reference = model.generate(prompts(2, 7), new_tokens, generator=seeded(), **kwargs)
    for use_cache in (True, False):
        ours = engine_generate(
            model, prompts(2, 7), new_tokens, generator=seeded(), use_cache=use_cache, **kwargs
        )
        assert torch.equal(ours, reference)


@pytest.mark.parametrize("options", [k for k in RECIPES if k != "default"])
def test_cached_equals_uncached_with_the_recipes_options(options):
    model = sharp_model(**RECIPES[options])
    idx = prompts(3, 5)
    greedy = engine_generate(model, idx, 24, temperature=0)  # 29 tokens: past block_size 16
    assert torch.equal(greedy, model.generate(idx, 24, temperature=0))
    assert all(len(set(row[5:].tolist())) >= 3 for row in greedy)  # not a degenerate repetition
    # uncached: GPT.generate's loop (the test above)
    kwargs = dict(temperature=0.9, top_k=20, top_p=0.95)
    sampled = engine_generate(model, idx, 20, generator=seeded(), **kwargs)
    assert torch.equal(
        sampled, engine_generate(model, idx, 20, generator=seeded(), use_cache=False, **kwargs)
    )


def test_sampling_draws_as_torch_multinomial_does():
    logits = 3 * torch.randn(3, 1000, generator=seeded(0))
    g1, g2 = seeded(7), seeded(7)
    ours = torch.cat([sample_next(logits, generator=g1) for _ in range(200)], dim=1)
    theirs = torch.cat(
        [torch.multinomial(logits.softmax(dim=-1), 1, generator=g2) for _ in range(200)], dim=1
    )
    assert torch.equal(ours, theirs)
    assert len(set(ours[0].tolist())) > 20  # really sampled


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_is_argmax_ties_and_infinities_included(dtype):
    """sample at temperature 0 takes max's indices, faster than argmax: the same first maximal
    index, where values tie (few distinct logits in bfloat16) and where a row is -inf but one."""
    logits = torch.randint(-3, 3, (64, 50304), generator=seeded(0)).to(dtype)
    logits[1] = float("-inf")
    logits[1, 777] = 0.0
    assert torch.equal(sample(logits, temperature=0), logits.argmax(dim=-1, keepdim=True))


@pytest.mark.parametrize("top_k", [None, 1, 7, 1000])
@pytest.mark.parametrize("temperature", [0.0, 0.6, 1.0])
def test_the_engines_draw_is_model_samples_where_top_p_keeps_every_candidate(top_k, temperature):
    """sample_next's tokens and GPT.generate's (model.sample's) from the same generator and the same
    noise: where top_p is off, or keeps every candidate (its -inf mask then changes nothing), token
    for token."""
    logits = 3 * torch.randn(4, 1000, generator=seeded(0))
    for top_p in (None, 1.0, 1.5):
        g1, g2 = seeded(7), seeded(7)
        ours = [sample_next(logits, temperature, top_k, top_p, generator=g1) for _ in range(50)]
        theirs = [sample(logits, temperature, top_k, generator=g2) for _ in range(50)]
        assert torch.equal(torch.cat(ours, dim=1), torch.cat(theirs, dim=1))
    # noise drawn beforehand (as a CUDA graph replays the rest) is the generator's draw
    for top_p in (None, 0.9):
        noise = torch.empty(4, min(top_k or 1000, 1000)).exponential_(1, generator=seeded(3))
        drawn = sample_next(logits, temperature, top_k, top_p, generator=seeded(3))
        assert torch.equal(sample_next(logits, temperature, top_k, top_p, noise=noise), drawn)


@pytest.mark.parametrize("options", ["default", "all"])
def test_cache_logits_match_a_full_forward_in_float32(options):
    model = sharp_model(dtype=torch.float32, **RECIPES[options])
    idx = prompts(2, 12)
    # per layer: (B, n_head, L, head_size)
    k, v = ([torch.zeros(2, 4, 16, 8) for _ in range(2)] for _ in range(2))
    with torch.no_grad():
        logits = cached_forward(model, idx[:, :4], k, v)
        for t in range(4, 12):
            full, _ = model(idx[:, :t])
            torch.testing.assert_close(logits, full[:, -1], rtol=1e-4, atol=1e-4)
            logits = cached_forward(model, idx[:, t : t + 1], k, v, torch.tensor(t))


def test_batched_equals_one_by_one():
    model = sharp_model(seed=2)
    idx = prompts(4, 6)
    engine = Engine(model, CPU)
    batched = engine_generate(model, idx, 25, engine=engine, temperature=0)
    for i in range(4):
        assert torch.equal(
            batched[i : i + 1],
            engine_generate(model, idx[i : i + 1], 25, engine=engine, temperature=0),
        )


def test_shared_prefill_equals_separate_prefills():
    model = sharp_model(seed=4)
    idx = prompts(1, 6)
    shared = engine_generate(model, idx, 25, num_samples=5, generator=seeded(0))
    separate = engine_generate(model, idx.repeat(5, 1), 25, generator=seeded(0))
    assert shared.shape == (5, 31) and torch.equal(shared, separate)
    # the samples differ from each other
    assert len({tuple(row) for row in shared[:, 6:].tolist()}) > 1
    assert torch.equal(shared, model.generate(idx.repeat(5, 1), 25, generator=seeded(0)))


def test_padded_vocabulary_is_never_sampled():
    model = sharp_model()
    out = engine_generate(
        model, prompts(2, 3), 40, temperature=2.0, vocab_size=10, generator=seeded(0)
    )
    assert out[:, 3:].max() < 10
    assert torch.equal(
        out, model.generate(prompts(2, 3), 40, temperature=2.0, vocab_size=10, generator=seeded(0))
    )


def test_one_decoder_per_shape_reused_across_prompts():
    model = sharp_model()
    engine = Engine(model, CPU)
    for seed in range(3):  # the same prompt length and new tokens: one decoder for all
        idx = prompts(1, 4, seed)
        assert torch.equal(
            engine_generate(model, idx, 8, engine=engine, temperature=0), model.generate(idx, 8, 0)
        )
    assert len(engine.decoders) == 1
    (decoder,) = engine.decoders.values()
    # 4 + 8 - 1 positions, rounded up to 64 but never beyond block_size
    assert decoder.cache_len == 11 + 5


def kept(logits: torch.Tensor, **filters) -> set[int]:
    """The token ids that candidates() lets be drawn from the one row of logits."""
    values, indices = candidates(logits, **filters)
    ids = torch.arange(logits.size(-1)) if indices is None else indices[0]
    return set(ids[torch.isfinite(values[0])].tolist())


def test_top_k_and_top_p_keep_exactly_the_right_candidates():
    probs = torch.tensor([[0.05, 0.4, 0.1, 0.3, 0.15]])
    logits = probs.log()
    assert kept(logits, top_k=2) == {1, 3}
    assert kept(logits, top_p=0.4) == {1}  # 0.4 reaches 0.4
    assert kept(logits, top_p=0.5) == {1, 3}
    assert kept(logits, top_p=0.85) == {1, 3, 4}  # 0.4 + 0.3 = 0.7 < 0.85 <= 0.85
    assert kept(logits, top_p=0.86) == {1, 3, 4, 2}
    assert kept(logits, top_k=3, top_p=0.99) == {1, 3, 4}
    assert kept(logits, top_p=1.0) == {0, 1, 2, 3, 4}
    assert len(kept(torch.zeros(1, 6), top_k=4)) == 4  # ties at the k-th value: still exactly k
    values, indices = candidates(logits, top_p=0.85)
    # renormalised
    assert indices[0, 0] == 1 and values.softmax(-1)[0, 0].item() == pytest.approx(0.4 / 0.85)


def test_top_k_draws_follow_the_renormalised_candidates():
    logits = torch.tensor([[0.05, 0.4, 0.1, 0.3, 0.15]]).log()
    g = seeded(3)
    draws = torch.cat([sample_next(logits, top_k=2, generator=g) for _ in range(4000)]).view(-1)
    assert set(draws.tolist()) == {1, 3}
    assert (draws == 1).float().mean().item() == pytest.approx(0.4 / 0.7, abs=0.03)


def test_streamed_text_equals_decoding_the_whole_sequence():
    tokenizer = Tokenizer()
    text = "Caf\u00e9 \u65e5\u672c\u8a9e, na\u00efve \U0001f642 r\u00e9sum\u00e9!"
    ids = tokenizer.encode(text)
    # split characters
    assert any(len(tokenizer.token_bytes(i).decode("utf-8", errors="ignore")) == 0 for i in ids)
    stream = TextStream(tokenizer)
    pieces = [stream.push([i]) for i in ids] + [stream.flush()]
    assert "".join(pieces) == tokenizer.decode(ids) == text
    assert all("\ufffd" not in p for p in pieces)  # no broken characters printed on the way


def test_import_from_a_transformers_folder_gives_its_logits(tmp_path):
    hf, folder = tiny_hf_folder(tmp_path)
    model = load_gpt2(str(folder)).eval()
    idx = torch.randint(100, (2, 32))
    ours, _ = model(idx, idx)
    theirs = hf(idx).logits
    assert (ours - theirs).abs().max().item() <= 1e-4


def test_weights_to_transformers_and_back_give_the_same_logits():
    """model.py's conversion both ways, without export.py: a model without biases and with a padded
    vocabulary (to_hf_state_dict gives zero biases and cuts the padding) in transformers'
    GPT2LMHeadModel, then back."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = GPT(GPTConfig(**dict(GENERATE_CONFIG, vocab_size=64, bias=False))).eval()
    hf_config = transformers.GPT2Config(
        vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=4
    )
    hf = transformers.GPT2LMHeadModel(hf_config).eval()
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(model, 50), strict=False)
    assert [
        k for k in missing if not k.endswith((".attn.bias", ".attn.masked_bias"))
    ] == [] and unexpected == []
    idx = torch.randint(50, (2, 16))
    ours = model(idx, idx)[0][..., :50]
    assert (hf(idx).logits - ours).abs().max().item() <= 1e-4
    back = GPT(
        GPTConfig(**dict(GENERATE_CONFIG, vocab_size=50))
    ).eval()  # with biases, as transformers' GPT-2: all zero
    back.load_state_dict(from_hf_state_dict(hf.state_dict()))
    torch.testing.assert_close(back(idx, idx)[0], ours, rtol=0, atol=1e-5)


def test_export_round_trip_through_transformers(tmp_path, tiny_data):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    meta_vocab = Tokenizer.for_dataset(tiny_data / "tiny").n_vocab
    # padded vocab, no biases: both undone on export
    model_args = dict(GENERATE_CONFIG, vocab_size=64, bias=False)
    model = GPT(GPTConfig(**model_args)).eval()
    checkpoint = {
        "model": model.state_dict(),
        "model_args": model_args,
        "config": {"data_dir": str(tiny_data), "dataset": "tiny"},
    }
    save_checkpoint(checkpoint, tmp_path / "out" / "ckpt.pt")
    result = run_script(
        "export.py", f"--out_dir={tmp_path / 'out'}", f"--export_dir={tmp_path / 'hf'}"
    )
    assert result.returncode == 0, result.stderr
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.vocab_size == meta_vocab
    idx = torch.randint(meta_vocab, (2, 16))
    ours, _ = model(idx, idx)
    assert (ours[..., :meta_vocab] - hf(idx).logits).abs().max().item() <= 1e-4
    again = load_gpt2(str(tmp_path / "hf")).eval()  # and back in
    assert (again(idx, idx)[0] - ours[..., :meta_vocab]).abs().max().item() <= 1e-4


@pytest.mark.slow
def test_train_and_sample_from_a_transformers_folder(tmp_path, tiny_data):
    _, folder = tiny_hf_folder(tmp_path)
    # the tiny dataset's character ids are < 100, so the tiny GPT-2 can be fine-tuned on them
    result = run_script(
        "train.py",
        f"--init_from={folder}",
        f"--data_dir={tiny_data}",
        "--dataset=tiny",
        f"--out_dir={tmp_path / 'ft'}",
        "--device=cpu",
        "--compile=false",
        "--block_size=16",
        "--batch_size=4",
        "--max_iters=2",
        "--eval_interval=2",
        "--eval_iters=1",
    )
    assert result.returncode == 0, result.stderr
    checkpoint = torch.load(tmp_path / "ft" / "ckpt.pt", weights_only=True)
    assert (
        checkpoint["model_args"]["block_size"] == 16
        and checkpoint["model_args"]["vocab_size"] == 100
    )
    too_long = run_script(
        "train.py",
        f"--init_from={folder}",
        f"--data_dir={tiny_data}",
        "--dataset=tiny",
        "--device=cpu",
        "--block_size=64",
    )
    assert too_long.returncode != 0 and "larger than the" in too_long.stderr


def test_sample_streams_and_stops_at_the_stop_text(tmp_path, tiny_data):
    torch.manual_seed(0)
    model_args = dict(GENERATE_CONFIG, vocab_size=64)
    model = GPT(GPTConfig(**model_args))
    checkpoint = {
        "model": model.state_dict(),
        "model_args": model_args,
        "config": {"data_dir": str(tiny_data), "dataset": "tiny"},
    }
    save_checkpoint(checkpoint, tmp_path / "ckpt.pt")
    common = [
        f"--out_dir={tmp_path}",
        "--device=cpu",
        "--start=the ",
        "--max_new_tokens=60",
        "--temperature=1.0",
    ]
    full = run_script("sample.py", *common, "--num_samples=1")
    assert full.returncode == 0, full.stderr
    text = full.stdout.split("tokenizer: ")[1].split("\n", 1)[1].split("---------------")[0]
    assert "time to first token" in full.stdout and "tokens/s" in full.stdout
    # a piece of what the model writes with this seed, across a line's end
    at = text.index("\n", 10)
    stop = text[at - 1 : at + 1]
    # as a shell passes --stop="e\n": \ and n
    typed = stop.replace("\\", "\\\\").replace("\n", "\\n")
    stopped = run_script("sample.py", *common, "--num_samples=1", f"--stop={typed}")
    cut = stopped.stdout.split("tokenizer: ")[1].split("\n", 1)[1].split("---------------")[0]
    assert cut.rstrip("\n") == text[: text.index(stop)]
    # greedy: the batched, uncached path writes what the streamed, cached one does, for every sample
    greedy = run_script("sample.py", *common, "--num_samples=1", "--temperature=0")
    batched = run_script(
        "sample.py",
        *common,
        "--num_samples=3",
        "--batched=True",
        "--kv_cache=false",
        "--temperature=0",
    )
    assert batched.returncode == 0 and batched.stdout.count("---------------") == 3
    first = greedy.stdout.split("tokenizer: ")[1].split("\n", 1)[1].split("---------------")[0]
    assert (
        batched.stdout.split("tokenizer: ")[1].split("\n", 1)[1].split("---------------")[0]
        == first
    )


@pytest.fixture
def quick_compile(monkeypatch):
    """A CPU's decode step compiled without timing inductor's GEMM choices (a minute on these tiny
    models): the numerics and the graphs are the same; tests/test_quantize.py compiles with every
    choice timed (slow)."""
    monkeypatch.setitem(CPU_COMPILE, "max_autotune", False)


# "all" (-m slow): the recipe's options through the same compiled step; eagerly, they are
# test_cached_equals_uncached_with_the_recipes_options's
@pytest.mark.parametrize("options", ["default", pytest.param("all", marks=pytest.mark.slow)])
def test_compiled_decode_step_gives_the_same_tokens_without_recompiling(options, quick_compile):
    import torch._dynamo

    torch._dynamo.reset()
    model = sharp_model(dtype=torch.float32, **RECIPES[options])
    engine = Engine(model, CPU, compile=True)
    idx = prompts(2, 5)
    decoder = engine.decoder(2, 5, 30, Sampling(temperature=0))
    assert decoder.build_seconds > 0
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    # 30 positions, past block_size too
    compiled = engine_generate(model, idx, 30, engine=engine, temperature=0)
    # one graph for every position
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs
    assert torch.equal(compiled, model.generate(idx, 30, temperature=0))
    sampled = engine_generate(model, idx, 30, engine=engine, generator=seeded(), top_k=10)
    assert torch.equal(sampled, model.generate(idx, 30, top_k=10, generator=seeded()))


def test_decoders_past_dynamos_recompile_limit_are_still_compiled(quick_compile):
    """Every Decoder compiles cached_forward, whose compiled graphs dynamo keeps in one cache per
    code object: past its limit it would run them eagerly, silently (fullgraph=True makes that an
    error here)."""
    import torch._dynamo

    torch._dynamo.reset()
    model = sharp_model(dtype=torch.float32, n_layer=1)
    engine = Engine(model, CPU, compile=True)
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    with torch._dynamo.config.patch(recompile_limit=1):
        for B in (1, 2, 3):  # three shapes: three graphs
            idx = prompts(B, 4)
            ours = engine_generate(model, idx, 6, engine=engine, temperature=0)
            assert torch.equal(ours, model.generate(idx, 6, temperature=0))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == before + 3


def test_compiled_steps_of_two_models_of_one_shape_each_decode_their_own(quick_compile):
    """Both models' steps are graphs of one code object (cached_forward), each with its own frozen
    weights, and a step keeps few guards on its model (frozen_model): its identity must still pick
    the graph, alternating between the models."""
    import torch._dynamo

    torch._dynamo.reset()
    models = [sharp_model(seed, dtype=torch.float32, n_layer=1) for seed in (0, 1)]
    engines = [Engine(model, CPU, compile=True) for model in models]
    idx = prompts(1, 4)
    for model, engine in 2 * list(zip(models, engines, strict=True)):
        ours = engine_generate(model, idx, 8, engine=engine, temperature=0)
        assert torch.equal(ours, model.generate(idx, 8, temperature=0))
    # the two models' tokens differ, so a step run with the other's weights would fail above
    assert not torch.equal(models[0].generate(idx, 8, temperature=0), ours)


def cache_loops(caches: str) -> list[int]:
    """The bounds of the loops in Inductor's code for one compiled decode step of a 2-layer model
    whose KV cache is a list of per-layer tensors or one stacked (n_layer, ...) tensor: a loop
    bounded by one layer's cache size copies a whole cache."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    model = sharp_model(dtype=torch.float32)
    shape = (2, 4, 16, 8)  # B, n_head, L, head_size
    k, v = ([torch.zeros(shape) for _ in range(2)] for _ in range(2))
    if caches == "stacked":
        k, v = torch.stack(k), torch.stack(v)
    step = torch.compile(cached_forward, dynamic=False)
    with torch.no_grad():
        _, code = run_and_get_code(step, model, prompts(2, 1), k, v, torch.tensor(5))
    bound = r"for\s*\(\s*int64_t\s+\w+\s*=.*?;\s*\w+\s*<\s*(?:static_cast<int64_t>\()?(\d+)L"
    return [int(b) for b in re.findall(bound, "\n".join(code))]


def test_compiled_decode_step_writes_one_position_not_the_whole_cache():
    layer_cache = 2 * 4 * 16 * 8
    per_layer, stacked = cache_loops("per-layer"), cache_loops("stacked")
    assert len(per_layer) > 10 and layer_cache not in per_layer
    # the check sees them where they are: writes through views of one tensor
    assert stacked.count(layer_cache) >= 2


def sdpa_calls(fn) -> list[dict]:
    """The SDPA kernels allowed at each scaled_dot_product_attention call that fn makes."""
    backends = torch.backends.cuda
    seen = []

    class Record(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.nn.functional.scaled_dot_product_attention:
                enabled = dict(
                    flash=backends.flash_sdp_enabled(),
                    efficient=backends.mem_efficient_sdp_enabled(),
                )
                seen.append(
                    enabled
                    | dict(cudnn=backends.cudnn_sdp_enabled(), math=backends.math_sdp_enabled())
                )
            return func(*args, **(kwargs or {}))

    with Record():
        fn()
    return seen


def test_prefill_and_decode_never_use_cudnn():
    model = sharp_model(dtype=torch.float32)
    engine = Engine(model, CPU)
    idx = prompts(2, 5)
    training = sdpa_calls(lambda: model(idx))
    assert training and all(call["cudnn"] for call in training)  # SDPA's own choice: cuDNN allowed
    decoding = sdpa_calls(lambda: list(engine.tokens(idx, 4, Sampling(temperature=0))))
    prefill, decode = decoding[: GENERATE_CONFIG["n_layer"]], decoding[GENERATE_CONFIG["n_layer"] :]
    assert len(decode) == 3 * GENERATE_CONFIG["n_layer"]
    assert all(call == dict(flash=True, efficient=True, cudnn=False, math=True) for call in prefill)
    assert all(not call["cudnn"] and call["efficient"] for call in decode)


def mask_ops(n_layer: int) -> int:
    """How many times one eager decode step of an n_layer model runs the ops that make an attention
    mask."""
    from torch.utils._python_dispatch import TorchDispatchMode

    made = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket.__name__ in (
                "arange",
                "le",
                "gt",
                "masked_fill",
                "where",
                "logical_not",
            ):
                made.append(func)
            return func(*args, **(kwargs or {}))

    model = sharp_model(dtype=torch.float32, n_layer=n_layer)
    k, v = ([torch.zeros(1, 4, 16, 8) for _ in range(n_layer)] for _ in range(2))
    with torch.no_grad():
        cached_forward(model, prompts(1, 5), k, v)
        with Count():
            cached_forward(model, prompts(1, 1), k, v, torch.tensor(5))
    return len(made)


def test_one_attention_mask_per_decode_step_whatever_the_depth():
    assert 0 < mask_ops(1) == mask_ops(4)


@pytest.mark.gpu
def test_decoders_share_one_cuda_graph_pool():
    runtime = resolve_runtime("cuda", "float32", tf32=False)
    model = sharp_model().cuda()
    idx = prompts(2, 5).cuda()
    engine = Engine(model, runtime)
    for sampling in (dict(temperature=0), dict(top_k=20)):
        g = torch.Generator("cuda").manual_seed(0)
        ours = torch.cat([idx, *engine.tokens(idx, 8, Sampling(**sampling), g)], dim=1)
        reference = model.generate(
            idx, 8, **sampling, generator=torch.Generator("cuda").manual_seed(0)
        )
        assert torch.equal(ours, reference)
    pools = {d.graph.pool() for d in engine.decoders.values()}
    assert len(engine.decoders) == 2 and len(pools) == 1


def test_packed_bfloat16_model_generates_the_same_tokens():
    """On a CPU in bfloat16 the Linears are packed for oneDNN (float32 keeps nn.Linear: MKL reads it
    faster here, docs/sample.md); the packed model's greedy tokens are the plain bfloat16 model's
    (nanoGPT's generate)."""
    model = sharp_model(dtype=torch.float32)
    idx = prompts(2, 5)
    assert type(for_inference(copy.deepcopy(model), CPU).lm_head) is torch.nn.Linear
    bf16 = resolve_runtime("cpu", "bfloat16")
    # as compiled: torch.compile takes no packing
    plain = for_inference(copy.deepcopy(model), bf16, pack=False)
    assert type(plain.lm_head) is torch.nn.Linear and plain.lm_head.weight.dtype == torch.bfloat16
    fast = for_inference(copy.deepcopy(model), bf16)
    assert type(fast.lm_head) is PackedLinear and fast.lm_head.weight.is_mkldnn
    reference = plain.generate(idx, 30, temperature=0)
    assert torch.equal(
        engine_generate(fast, idx, 30, engine=Engine(fast, bf16), temperature=0), reference
    )


def test_a_checkpoints_vocabulary_covers_its_model_less_the_padding():
    """Issue 44: a tokenizer with fewer tokens than padding explains is refused (sampling would
    draw from its ids alone); GPT-2's weights, and a transformers folder's vocabulary that no
    padding made, fine-tune on any data."""
    from nanogpt_perf.errors import UserError

    chars = lambda n: Tokenizer([chr(256 + i) for i in range(n)])  # noqa: E731
    assert chars(65).fit_model(128, 64) and chars(128).fit_model(128, None)
    assert chars(65).fit_model(65, 1)
    assert chars(30).fit_model(100, 64)  # a transformers folder's 100 tokens, fine-tuned on 30
    assert chars(65).fit_model(50257, 1)  # GPT-2's weights fine-tuned on characters
    for n, model_tokens, pad_vocab in [(64, 128, 64), (2, 128, None), (64, 65, 1)]:
        fewer = f"has {n} tokens, fewer than its model's vocabulary of {model_tokens}"
        with pytest.raises(UserError, match=fewer):
            chars(n).fit_model(model_tokens, pad_vocab)
    with pytest.raises(UserError, match="more than its model's vocabulary of 64"):
        chars(65).fit_model(64, 64)
