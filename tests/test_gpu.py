"""The CUDA paths, against the same references as on a CPU: `pytest -m gpu` on a machine with a GPU
(every test here is skipped without CUDA; about 3 minutes on one H100). Graph decoding against eager
decoding and the uncached reference, with no host sync per token, and in bf16 as the suite times it;
a compiled run stopped and resumed against the run never stopped (within the tolerance
docs/robustness.md states); bf16 against fp32; DDP and FSDP2 over NCCL, saved and resumed; the fused
losses against the plain one; batch_size='auto' probing the device."""

import copy
import gc
import json
from dataclasses import replace

import pytest
import torch

from conftest import (
    SCHEDULE,
    SMALL,
    TINY_MODEL,
    prompts,
    run_script,
    run_train,
    sharp_model,
    step_losses,
)
from model import GPT, GPTConfig
from nanogpt_perf.generate import Engine, Sampling
from nanogpt_perf.runtime import resolve_runtime

pytestmark = pytest.mark.gpu

CUDA = ["--device=cuda", "--dtype=bfloat16"]  # after TINY_MODEL's --device=cpu: the last flag wins
# relative, per step loss, bf16 and compiled (docs/robustness.md, "Never losing work")
RESUME_TOLERANCE = 1e-2


def generate(
    engine: Engine, idx: torch.Tensor, n: int, seed: int, use_cache: bool = True, **sampling
) -> torch.Tensor:
    generator = torch.Generator("cuda").manual_seed(seed)
    tokens = engine.tokens(idx, n, Sampling(**sampling), generator, use_cache=use_cache)
    return torch.cat([idx, *tokens], dim=1)


@pytest.mark.parametrize(
    "sampling", [dict(temperature=0), dict(temperature=0.9, top_k=20, top_p=0.95)]
)
def test_graph_decoding_equals_eager_decoding_and_the_reference(sampling):
    runtime = resolve_runtime("cuda", "float32", tf32=False)
    model = sharp_model().cuda()  # float64: rounding never decides a token
    idx = prompts(2, 5).cuda()
    eager, graph = Engine(model, runtime, cuda_graph=False), Engine(model, runtime, cuda_graph=True)
    # past block_size
    a, b = generate(eager, idx, 30, 3, **sampling), generate(graph, idx, 30, 3, **sampling)
    # GPT.generate's loop; it has no top_p
    reference = generate(eager, idx, 30, 3, use_cache=False, **sampling)
    assert torch.equal(a, b) and torch.equal(a, reference)
    if "top_p" not in sampling:
        assert torch.equal(
            a, model.generate(idx, 30, **sampling, generator=torch.Generator("cuda").manual_seed(3))
        )
    assert all(d.graph is not None for d in graph.decoders.values())


def test_an_engine_made_after_the_last_one_is_freed_captures_its_graph():
    """The shared graph pool outlives every Engine: a capture into a pool whose graphs were all
    freed fails inside PyTorch (the second test of a session once did, and every one after it)."""
    runtime = resolve_runtime("cuda", "float32", tf32=False)
    model, idx = sharp_model().cuda(), prompts(2, 5).cuda()
    runs = []
    for _ in range(2):
        engine = Engine(model, runtime)
        runs.append(generate(engine, idx, 8, 0, temperature=0))
        assert all(d.graph is not None for d in engine.decoders.values())
        del engine
        gc.collect()
    assert torch.equal(runs[0], runs[1])


def test_compiled_graph_decoding_gives_the_eager_tokens_without_a_host_sync():
    runtime = resolve_runtime("cuda", "float32", tf32=False)
    model = sharp_model(dtype=torch.float32).cuda()
    idx = prompts(2, 5).cuda()
    compiled = Engine(model, runtime, compile=True)
    a = generate(compiled, idx, 10, 0, temperature=0)
    assert torch.equal(
        a, generate(Engine(model, runtime, cuda_graph=False), idx, 10, 0, temperature=0)
    )
    compiled.decoder(2, 5, 10, Sampling(top_k=20))  # built (compiled, captured) beforehand
    g = torch.Generator("cuda").manual_seed(0)
    torch.cuda.set_sync_debug_mode("error")  # any host sync inside generation raises
    try:
        tokens = list(compiled.tokens(idx, 10, Sampling(top_k=20), g))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len(tokens) == 10


GREEDY, SAMPLED = dict(temperature=0, top_k=200), dict(temperature=1.0, top_k=200)


@pytest.mark.parametrize(
    "sampling, compile",
    [(GREEDY, False), (GREEDY, True), (SAMPLED, False)],
    ids=["greedy", "greedy-compiled", "sampled"],
)
def test_bf16_graph_decoding_gives_the_eager_tokens(sampling, compile):
    """The path lab/gpu_suite.py times: the weights cast to bf16 by the Engine under a bf16 runtime,
    more than two sequences, top-k 200 over a vocabulary padded past the real one (whose tail is
    never drawn), past block_size. A replay runs the eager step's own kernels, so the tokens are the
    same, not merely close."""
    runtime = resolve_runtime("cuda", "bfloat16")
    model = sharp_model(dtype=torch.float32, vocab_size=320).cuda()
    idx = prompts(4, 5).cuda()
    eager = Engine(model, runtime, compile=compile, cuda_graph=False)
    graph = Engine(model, runtime, compile=compile, cuda_graph=True)
    assert model.lm_head.weight.dtype == torch.bfloat16
    a, b = (generate(engine, idx, 30, 3, **sampling, vocab_size=300) for engine in (eager, graph))
    assert torch.equal(a, b)
    assert int(a.max()) < 300 and len(set(a[:, 5:].flatten().tolist())) > 1
    assert all(d.graph is not None for d in graph.decoders.values())


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_int8_graph_decoding_gives_the_eager_tokens(compile):
    """int8 weights on a GPU (lab/generate.py --weights=int8: the weight dequantized inside the
    product), the head's zero bias included: a replay gives the eager step's tokens."""
    runtime = resolve_runtime("cuda", "bfloat16")
    model = sharp_model(dtype=torch.float32, vocab_size=320).cuda()
    idx = prompts(4, 5).cuda()
    eager, graph = (
        Engine(copy.deepcopy(model), runtime, compile=compile, cuda_graph=g, quantize="int8")
        for g in (False, True)
    )
    assert type(graph.model.lm_head).__name__ == "Int8Linear"
    a, b = (generate(engine, idx, 30, 3, **GREEDY, vocab_size=300) for engine in (eager, graph))
    assert torch.equal(a, b) and len(set(a[:, 5:].flatten().tolist())) > 1


def test_compiled_run_stopped_and_resumed_stays_within_tolerance_of_the_straight_run(
    tiny_data, tmp_path
):
    flags = (*CUDA, "--compile=True", *SCHEDULE, "--eval_interval=100")
    straight = run_train(tiny_data, tmp_path / "straight", *flags, "--max_iters=8")
    first = run_train(tiny_data, tmp_path / "resumed", *flags, "--max_iters=4")
    second = run_train(
        tiny_data, tmp_path / "resumed", *flags, "--max_iters=8", "--init_from=resume"
    )
    for run in (straight, first, second):
        assert run.returncode == 0, run.stderr
    a, b = step_losses(tmp_path / "straight"), step_losses(tmp_path / "resumed")
    for i in range(5, 9):
        assert abs(a[i] - b[i]) <= RESUME_TOLERANCE * a[i], (i, a[i], b[i])


def test_bf16_loss_is_within_tolerance_of_fp32_on_a_fixed_batch():
    torch.manual_seed(0)
    model = GPT(SMALL).cuda()
    x, y = (torch.randint(SMALL.vocab_size, (4, SMALL.block_size), device="cuda") for _ in range(2))
    with torch.no_grad():
        _, fp32 = model(x, y)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, bf16 = model(x, y)
    assert abs(bf16.item() - fp32.item()) <= 1e-2 * fp32.item()


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_one_nccl_rank_saves_and_resumes(tiny_data, tmp_path, parallelism):
    torchrun = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1")
    dataset = (
        f"--data_dir={tiny_data}",
        "--dataset=tiny",
        f"--out_dir={tmp_path}",
        f"--parallelism={parallelism}",
    )
    flags = (*TINY_MODEL, *CUDA, "--backend=nccl", *dataset, *SCHEDULE, "--eval_interval=100")
    first = run_script(*torchrun, "train.py", *flags, "--max_iters=4")
    assert first.returncode == 0, first.stderr
    second = run_script(*torchrun, "train.py", *flags, "--max_iters=6", "--init_from=resume")
    assert second.returncode == 0, second.stderr
    assert sorted(step_losses(tmp_path)) == [1, 2, 3, 4, 5, 6]
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["iter_num"] == 6


def fused_and_plain(loss_impl: str) -> tuple:
    """The loss and every gradient of the same model and batch under bf16 autocast, with loss_impl
    and plain."""
    out = []
    for config in (replace(SMALL, loss_impl=loss_impl), SMALL):
        torch.manual_seed(0)
        model = GPT(config).cuda()
        g = torch.Generator("cuda").manual_seed(1)
        x, y = (
            torch.randint(SMALL.vocab_size, (4, SMALL.block_size), device="cuda", generator=g)
            for _ in range(2)
        )
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = model(x, y)
        loss.backward()
        out.append((loss, {n: p.grad for n, p in model.named_parameters()}))
    return out


@pytest.mark.parametrize("loss_impl", ["fused", "triton", "liger"])
def test_the_fused_losses_equal_the_plain_one(loss_impl):
    if loss_impl in ("liger", "triton"):
        pytest.importorskip({"liger": "liger_kernel", "triton": "triton"}[loss_impl])
    (loss, grads), (plain_loss, plain_grads) = fused_and_plain(loss_impl)
    assert abs(loss.item() - plain_loss.item()) <= 1e-3 * plain_loss.item()
    for name, grad in plain_grads.items():
        assert (grads[name] - grad).norm() <= 2e-2 * grad.norm(), name


def test_batch_size_auto_probes_the_gpu(tiny_data, tmp_path):
    model = [f for f in TINY_MODEL if not f.startswith("--gradient_accumulation_steps")]
    result = run_script("train.py", *model, *CUDA, f"--data_dir={tiny_data}", "--dataset=tiny",
                        f"--out_dir={tmp_path}", "--batch_size=auto", "--tokens_per_iter=2048",
                        "--max_iters=2", "--eval_interval=2", "--eval_iters=1")  # fmt: skip
    assert result.returncode == 0, result.stderr
    # 64 sequences of 32 tokens: all of them
    assert "batch_size auto -> 64 (the largest that fits" in result.stdout
    settings = json.loads((tmp_path / "manifest.json").read_text())["settings"]
    assert settings["batch_size"] == 64 and settings["gradient_accumulation_steps"] == 1


def test_a_model_on_the_gpu_matches_the_cpu():
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(**dict(block_size=16, vocab_size=64, n_layer=2, n_head=4, n_embd=32))
    ).double()
    idx = prompts(2, 16)
    cpu, _ = model(idx, idx)
    gpu, _ = model.cuda()(idx.cuda(), idx.cuda())
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-9, atol=1e-9)
