"""Low-bit weights: each kernel against the dequantized weight's plain product, the quantized
model's logits against float32's within a stated tolerance, and the KV cache against recomputation
on the quantized model."""

import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from conftest import (
    GENERATE_CONFIG,
    ROOT,
    assert_one_line_error,
    prompts,
    run_in_process,
    sharp_model,
)
from model import GPT, GPTConfig
from nanogpt_perf.generate import Engine, Sampling
from nanogpt_perf.kernels import vnni
from nanogpt_perf.quantize import (
    Int4Linear,
    Int8Linear,
    fbgemm_usable,
    int4_problem,
    quantize_int4,
    quantize_int8,
)
from nanogpt_perf.runtime import resolve_runtime
from nanogpt_perf.train.checkpoint import save_checkpoint

CPU = resolve_runtime("cpu", "float32")
OURS = [] if vnni.problem() else ["vnni"]
INT8_KERNELS = ["int8pack", None] + (["fbgemm"] if fbgemm_usable() else []) + OURS
INT4_KERNELS = ["int4pack"] + OURS
VNNI = pytest.mark.skipif(bool(vnni.problem()), reason=f"{vnni.problem()}")


def linear(n_out: int = 65, n_in: int = 128, seed: int = 0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(n_in, n_out)


def group_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """How far x @ w.T may move when each input moves by half of its group's step (max |x| / 127
    over 32 inputs), as the VNNI kernels quantize x."""
    half_step = x.float().unflatten(-1, (-1, 32)).abs().amax(-1) / 254
    return half_step @ w.float().abs().unflatten(-1, (-1, 32)).sum(-1).t()


def test_quantized_weights_are_within_half_a_step_of_the_float_ones():
    w = linear().weight.detach()
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and q.abs().max() == 127
    assert ((q * scale[:, None] - w).abs() <= scale[:, None] / 2 + 1e-7).all()
    codes, scale, zero = quantize_int4(w)
    assert codes.min() == 0 and codes.max() == 15
    groups = w.view(65, 4, 32)
    back = (codes.view(65, 4, 32) - 8) * scale[..., None] + zero[..., None]
    assert ((back - groups).abs() <= scale[..., None] / 2 + 1e-6).all()


@pytest.mark.parametrize("kernel", INT8_KERNELS)
def test_int8_kernels_compute_the_dequantized_product(kernel):
    lin = linear()
    x = torch.randn(3, 5, 128)
    q, scale = quantize_int8(lin.weight.detach())
    w = q * scale[:, None]
    reference = F.linear(x, w, lin.bias)
    y = Int8Linear(lin, torch.float32, kernel)(x)
    if kernel == "vnni":  # each input off by at most half of its group's step
        assert ((y - reference).abs() <= group_bound(x, w) + 1e-4).all()
        assert (y - reference).abs().max() > 1e-6  # it did quantize
        return
    if kernel != "fbgemm":  # weight-only: the same product, up to float32's rounding
        torch.testing.assert_close(y, reference, rtol=1e-5, atol=1e-5)
        return
    # FBGEMM quantizes each row of x to 8 bits over its range: each input is off by at most half of
    # its step
    step = (x.amax(-1, keepdim=True) - x.amin(-1, keepdim=True)) / 255
    bound = step / 2 * w.abs().sum(dim=1) + 1e-4
    assert ((y - reference).abs() <= bound).all()
    # it did quantize (a test that could not fail would not say so)
    assert (y - reference).abs().max() > 1e-6


@pytest.mark.skipif(not fbgemm_usable(), reason="FBGEMM's int8 kernel is an x86 CPU's")
def test_fbgemm_rows_are_quantized_alone_and_never_saturate():
    layer = Int8Linear(linear(), torch.float32, "fbgemm")
    x = torch.randn(6, 128)
    one_by_one = torch.cat([layer(row[None]) for row in x])
    assert torch.equal(layer(x), one_by_one)  # a row's result does not depend on the rows beside it
    # every activation at the top of its range and every weight at +127: 255 * 127 products whose
    # pairs pass int16 (a saturating kernel would give less), and a constant row (a zero range)
    big = torch.nn.Linear(768, 16, bias=False)
    big.weight.data.fill_(1.0)
    x = torch.ones(2, 768)
    x[0, 0] = 0.0
    y = Int8Linear(big, torch.float32, "fbgemm")(x)
    torch.testing.assert_close(y, x @ big.weight.t(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("kernel", INT4_KERNELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int4_kernels_compute_the_dequantized_product(kernel, dtype):
    lin = linear()  # 65 rows: the CPU kernels' packing pads them to 80
    x = torch.randn(2, 7, 128)
    y = Int4Linear(lin, dtype, kernel)(x.to(dtype)).float()
    # ours holds the scales and zeros in bfloat16 whatever dtype
    w = Int4Linear(lin, torch.bfloat16 if kernel == "vnni" else dtype, None).dequantized(dtype)
    reference = F.linear(x.to(dtype), w, lin.bias.detach().to(dtype)).float()
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2  # bfloat16: its 8 bits of mantissa
    if kernel == "int4pack":  # weight-only: the same product, up to the dtype's rounding
        torch.testing.assert_close(y, reference, rtol=tolerance, atol=tolerance)
    else:  # each input off by at most half of its group's step
        bound = group_bound(x.to(dtype), w) + tolerance * reference.abs() + 1e-4
        assert ((y - reference).abs() <= bound).all()
        if dtype == torch.float32:  # it did quantize (bfloat16's rounding alone would pass)
            assert (y - reference).abs().max() > 1e-4
    codes, scale, zero = quantize_int4(lin.weight.detach())  # the codes two to a byte, read back
    w = ((codes.view(65, 4, 32) - 8) * scale[..., None] + zero[..., None]).flatten(1)
    torch.testing.assert_close(Int4Linear(lin, torch.float32, None).dequantized(torch.float32), w)


@VNNI
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "n_out", "n_in"), [(1, 2304, 768), (5, 65, 128), (3, 16, 3072)])
def test_vnni_kernels_do_the_arithmetic_of_their_references(bits, dtype, rows, n_out, n_in):
    """int4_vnni_mm and int8_vnni_mm against the same integer arithmetic in float64 torch ops
    (vnni.reference_int4, reference_int8), row quantization included: float32's rounding apart
    (bfloat16's, out in bfloat16). A row of zeros and a group of zeros (no step to divide by) among
    them."""
    torch.manual_seed(rows)
    w = torch.randn(-(-n_out // 16) * 16, n_in) * 0.02
    x = torch.randn(rows, n_in) * torch.rand(rows, n_in // 32).repeat_interleave(32, 1) * 4
    x[0, :32] = 0
    if rows > 1:
        x[1] = 0
    x = x.to(dtype)
    if bits == 4:
        q, scale, zero = quantize_int4(w)
        y = torch.ops.nanogpt_perf.int4_vnni_mm(x, *vnni.pack_int4(q, scale, zero), n_out)
        reference = vnni.reference_int4(x, q, scale, zero)
    else:
        q, scale = quantize_int8(w)
        y = torch.ops.nanogpt_perf.int8_vnni_mm(x, *vnni.pack_int8(q, scale), n_out)
        reference = vnni.reference_int8(x, q, scale)
    assert y.dtype == dtype and y.shape == (rows, n_out)
    tolerance = 1e-5 if dtype == torch.float32 else 2**-8  # bfloat16's rounding of the output
    torch.testing.assert_close(y.float(), reference[:, :n_out], rtol=tolerance, atol=1e-5)


@VNNI
def test_int8_vnni_sums_the_largest_products_without_saturating():
    """Every weight at +127 (its code 255) or -127 (1), every input at the top of its range: int8
    products whose pairs pass int16, summed exactly."""
    lin = torch.nn.Linear(768, 32, bias=False)
    lin.weight.data.fill_(1.0)[16:] = -1
    x = torch.ones(2, 768)
    x[1, ::2] = -1
    y = Int8Linear(lin, torch.float32, "vnni")(x)
    torch.testing.assert_close(y, x @ lin.weight.detach().t(), rtol=1e-6, atol=1e-4)


@VNNI
@pytest.mark.parametrize("layer", [Int8Linear, Int4Linear])
def test_vnni_rows_are_computed_alone(layer):
    """A row's result does not depend on the rows beside it: a speculative step's rows are the
    decode step's, bit for bit."""
    layer = layer(linear(n_in=256), torch.bfloat16, "vnni")
    x = torch.randn(6, 256).bfloat16()
    assert torch.equal(layer(x), torch.cat([layer(row[None]) for row in x]))


def test_low_bits_fall_back_to_pytorchs_kernels_where_the_vnni_ones_cannot_be_built(tmp_path):
    """A compiler that fails, half a library written, and int4 and int8 take PyTorch's kernels,
    saying why, with nothing left in the cache to load (a fresh process: this one may have loaded
    the kernels already)."""
    compiler = tmp_path / "broken-c++"
    compiler.write_text(
        '#!/bin/sh\nwhile [ "$1" != -o ]; do shift; done\necho half > "$2"\n'
        'echo "vnni.cpp:1:1: error: no space left" >&2\nexit 1\n'
    )
    compiler.chmod(0o755)
    code = (
        "import torch; from nanogpt_perf.quantize import int4_kernel, int8_kernel; "
        "from nanogpt_perf.kernels import vnni; cpu = torch.device('cpu'); "
        "print(int4_kernel(cpu), int8_kernel(cpu, 768)); print(vnni.problem())"
    )
    cache = tmp_path / "cache"
    env = dict(os.environ, CXX=str(compiler), XDG_CACHE_HOME=str(cache), PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    kernels, why = result.stdout.splitlines()
    assert kernels.split() == ["int4pack", "fbgemm" if fbgemm_usable() else "int8pack"]
    if vnni.cpu_flags() >= set(vnni.ISA):
        assert why == f"building it with {compiler} failed: vnni.cpp:1:1: error: no space left"
        assert not list(cache.rglob("*.so")) and not list(cache.rglob("*.part"))
    else:
        assert why.startswith("this CPU")


def test_the_vnni_kernels_build_where_the_cpu_and_a_compiler_allow():
    """Where this CPU has the instructions and a compiler is here, the kernels build and load:
    else every test of them would be skipped, and a broken build pass unseen."""
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if not vnni.cpu_flags() >= set(vnni.ISA) or compiler is None:
        pytest.skip("no AVX-512 VNNI or no compiler: the fallback's case")
    assert vnni.problem() is None


def test_int8_takes_another_kernel_for_inputs_not_in_whole_groups():
    """Our kernels quantize the activations per 32 inputs: a Linear of 24 or 100 inputs takes
    FBGEMM's or PyTorch's kernel, and still computes its product."""
    for n_in in (24, 100):
        lin = linear(n_in=n_in)
        layer = Int8Linear(lin, torch.float32)
        assert layer.kernel != "vnni"
        x = torch.randn(3, n_in)
        q, scale = quantize_int8(lin.weight.detach())
        reference = F.linear(x, q * scale[:, None], lin.bias)
        torch.testing.assert_close(layer(x), reference, rtol=0.05, atol=0.05)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_quantized_linears_keep_every_tensor_on_the_weights_device(bias):
    """A GPU's Linears quantized there keep all of their tensors there (a head without a bias once
    got a CPU one); the meta device stands in for the GPU, with no kernel of the CPU's."""
    lin = torch.nn.Linear(64, 48, bias=bias, device="meta")
    for q in (Int8Linear(lin, torch.bfloat16), Int4Linear(lin, torch.bfloat16)):
        assert {t.device.type for t in q.buffers()} == {"meta"}


def trained_like(seed: int = 0, **overrides) -> GPT:
    """A float32 model whose logits are far from uniform (sharp_model's), a copy of it kept
    aside."""
    return sharp_model(seed=seed, dtype=torch.float32, **overrides)


@pytest.fixture(scope="module")
def trained() -> dict:
    """The weights of a small GPT trained (100 steps) on a noisy chain: token t is followed by (5t +
    3) mod 64, else by a random one; its weights and logits look like a trained model's, not a
    random or scaled one's."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**GENERATE_CONFIG))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    x = torch.empty(100 * 16, 17, dtype=torch.long)
    x[:, 0] = torch.randint(64, (len(x),), generator=g)
    for t in range(16):
        noise = torch.randint(64, (len(x),), generator=g)
        x[:, t + 1] = torch.where(
            torch.rand(len(x), generator=g) < 0.8, (5 * x[:, t] + 3) % 64, noise
        )
    for batch in x.split(16):
        _, loss = model(batch[:, :-1], batch[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval().state_dict()


def from_state(state: dict) -> GPT:
    model = GPT(GPTConfig(**GENERATE_CONFIG)).eval()
    model.load_state_dict(state)
    return model


@pytest.mark.parametrize(
    ("quantize", "dtype", "tolerance"), [("int8", "float32", 0.01), ("int4", "bfloat16", 0.1)]
)
def test_quantized_logits_stay_within_a_stated_tolerance_of_float32s(
    trained, quantize, dtype, tolerance
):
    """Every logit of a trained model within 1% (int8) or 10% (int4, bfloat16 activations) of the
    logits' spread (max - min over the vocabulary) of float32's, and the most likely token float32's
    at every position."""
    idx = prompts(4, 16)
    with torch.no_grad():
        full, _ = from_state(trained)(idx, idx)
        low = Engine(from_state(trained), resolve_runtime("cpu", dtype), quantize=quantize).model
        ours = low.head(low.hidden_states(idx)).float()
    spread = full.amax(-1, keepdim=True) - full.amin(-1, keepdim=True)
    error = ((ours - full).abs() / spread).max().item()
    assert 1e-5 < error <= tolerance  # quantized, and close
    assert torch.equal(ours.argmax(-1), full.argmax(-1))


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_quantized_cache_gives_the_tokens_of_recomputation(quantize):
    """The KV cache against GPT.generate's full recomputation, both on the same quantized model
    (float32 activations: int8's and int4's kernel rows are each computed alone)."""
    model = Engine(trained_like(seed=2), CPU, quantize=quantize).model
    assert type(model.lm_head) is (Int8Linear if quantize == "int8" else Int4Linear)
    assert model.transformer.wte.weight.dtype == torch.float32  # the lookup keeps its float weights
    idx = prompts(2, 5)
    cached = torch.cat([idx, *Engine(model, CPU).tokens(idx, 30, Sampling(temperature=0))], dim=1)
    assert torch.equal(cached, model.generate(idx, 30, temperature=0))


def test_int8_greedy_tokens_are_float32s_on_a_trained_model(trained):
    idx = prompts(2, 5)
    reference = from_state(trained).generate(idx, 30, temperature=0)
    engine = Engine(from_state(trained), CPU, quantize="int8")
    assert torch.equal(
        torch.cat([idx, *engine.tokens(idx, 30, Sampling(temperature=0))], dim=1), reference
    )


def test_int4_needs_input_widths_in_multiples_of_32(tmp_path):
    assert int4_problem(GPT(GPTConfig(**GENERATE_CONFIG))) is None
    odd = GPT(GPTConfig(**dict(GENERATE_CONFIG, n_embd=24, n_head=4)))
    assert "multiple of 32, not 24" in int4_problem(odd)
    model_args = dict(GENERATE_CONFIG, n_embd=24, n_head=4)
    tokenizer = {"kind": "characters", "itos": [chr(97 + i) for i in range(26)]}
    model_args["vocab_size"] = 26
    save_checkpoint({"model": GPT(GPTConfig(**model_args)).state_dict(), "model_args": model_args,
                     "tokenizer": tokenizer}, tmp_path / "ckpt.pt")  # fmt: skip
    flags = (f"--out_dir={tmp_path}", "--device=cpu", "--quantize=int4", "--start=ab")
    result = run_in_process("sample.py", *flags)
    assert_one_line_error(result, "quantize=int4", "multiple of 32, not 24", "use int8")


# where ours took their places, FBGEMM's int8 kernel and PyTorch's int4 one too
CPU_KERNELS = [] if vnni.problem() else ["fbgemm"] * fbgemm_usable() + ["int4pack"]


@pytest.mark.slow  # up to six compilations, 20 to 40 s each cold (every GEMM choice timed)
@pytest.mark.parametrize(
    ("quantize", "dtype", "kernel"),
    [("int8", "float32", "auto"), ("none", "float32", "auto"), ("none", "bfloat16", "auto"),
     ("int4", "bfloat16", "auto")]
    + [("int8" if k == "fbgemm" else "int4", "float32" if k == "fbgemm" else "bfloat16", k)
       for k in CPU_KERNELS],
)  # fmt: skip
def test_compiled_steps_take_the_packed_kernels_and_give_the_eager_tokens(
    trained, quantize, dtype, kernel, monkeypatch
):
    """Compiled, the step calls our VNNI kernels, FBGEMM's packed int8 weights (torch.compile
    traces a slot, not the objects) and PyTorch's int4 kernel through their ops, float weights
    frozen into inductor's own GEMM (eager: MKL, or oneDNN's packing in bfloat16), and writes the
    eager step's greedy tokens, one graph for every position."""
    import torch._dynamo

    import nanogpt_perf.quantize

    if kernel != "auto":  # a kernel the machine would not take by itself
        monkeypatch.setattr(nanogpt_perf.quantize, f"{quantize}_kernel", lambda *_: kernel)

    torch._dynamo.reset()
    runtime, idx, greedy = resolve_runtime("cpu", dtype), prompts(1, 5), Sampling(temperature=0)
    eager = torch.cat(
        list(Engine(from_state(trained), runtime, quantize=quantize).tokens(idx, 10, greedy)), 1
    )
    engine = Engine(from_state(trained), runtime, compile=True, quantize=quantize)
    engine.decoder(1, 5, 10, greedy)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert torch.equal(torch.cat(list(engine.tokens(idx, 10, greedy)), 1), eager)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs
