"""The fused lm_head + cross-entropy (the operator nanogpt::fused_linear_cross_entropy) against the
plain path, logits then F.cross_entropy: float64 to 1e-10, bf16 autocast, compiled, without
gradients, untied; and the Triton classifier on triton's CPU interpreter and compiled ahead of time
for an H100 (pytest -m triton; pip install -e ".[triton]")."""

import importlib
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from conftest import ROOT
from model import GPT, GPTConfig, chunked_cross_entropy
from nanogpt_perf.kernels.losses import chunk_rows, fused_cross_entropy

SMALL = GPTConfig(block_size=16, vocab_size=80, n_layer=2, n_head=4, n_embd=32, dropout=0.0)
BRANCH_POINT = "ff38d87"  # the commit this fused loss replaced


def head_inputs(n: int = 70, c: int = 16, v: int = 50, dtype=torch.float64, seed: int = 0) -> tuple:
    """Hidden states x (n, c) and a head weight (v, c), both requiring grad, and targets with
    ignored (-1) rows."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, generator=g, dtype=dtype).requires_grad_()
    w = (torch.randn(v, c, generator=g, dtype=dtype) / c**0.5).requires_grad_()
    targets = torch.randint(v, (n,), generator=g)
    targets[:5] = -1
    targets[n // 2] = -1
    return x, w, targets


def plain_loss(
    x: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, softcap: float = 0.0
) -> torch.Tensor:
    logits = (x @ w.t()).to(torch.promote_types(x.dtype, torch.float32))
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    return F.cross_entropy(logits, targets, ignore_index=-1)


def loss_and_grads(loss_fn, x, w, targets, scale: float = 1.0, **kwargs) -> tuple:
    x.grad = w.grad = None
    loss = loss_fn(x, w, targets, **kwargs)
    (scale * loss).backward()
    return loss.detach(), x.grad, w.grad


@pytest.mark.parametrize("softcap", [0.0, 5.0])
# 0: by budget; 7 and 64 do not divide 70; 1000 is one chunk
@pytest.mark.parametrize("chunk", [0, 1, 7, 64, 1000])
def test_fused_equals_the_plain_loss_and_both_gradients_in_float64(chunk, softcap):
    x, w, targets = head_inputs()
    loss, dx, dw = loss_and_grads(plain_loss, x, w, targets, scale=3.0, softcap=softcap)
    loss_f, dx_f, dw_f = loss_and_grads(
        fused_cross_entropy, x, w, targets, scale=3.0, chunk=chunk, softcap=softcap
    )
    assert loss_f.dtype == dx_f.dtype == dw_f.dtype == torch.float64
    assert abs(loss_f.item() - loss.item()) <= 1e-10
    assert (dx_f - dx).abs().max().item() <= 1e-10 and (dw_f - dw).abs().max().item() <= 1e-10
    assert dx[:5].abs().max() == 0 and dx_f[:5].abs().max() == 0  # ignored rows get no gradient


def test_the_softcap_changes_the_loss_and_is_differentiated_through_tanh():
    x, w, targets = head_inputs()
    x.data *= 20  # logits well beyond the cap, where tanh saturates
    capped = loss_and_grads(fused_cross_entropy, x, w, targets, softcap=2.0)
    uncapped = loss_and_grads(fused_cross_entropy, x, w, targets)
    assert capped[0] < uncapped[0] / 2  # logits within +-2 cannot be confidently wrong
    # a finite-difference check of d/dx through the cap, along one direction
    direction = torch.randn_like(x)
    eps = 1e-6
    with torch.no_grad():
        up = fused_cross_entropy(x + eps * direction, w, targets, softcap=2.0)
        down = fused_cross_entropy(x - eps * direction, w, targets, softcap=2.0)
    assert abs((up - down).item() / (2 * eps) - (capped[1] * direction).sum().item()) <= 1e-7


def test_fused_under_bf16_autocast_is_as_accurate_as_the_plain_path():
    """Both run their GEMMs in bf16 and the softmax in fp32. Against the float64 truth, the fused
    loss's error is within 1e-3 of the loss and its gradients' errors within 1.5x the plain path's
    (which sums dW over all rows in one bf16 GEMM, where the fused path sums chunks' bf16 products
    in fp32)."""
    x64, w64, targets = head_inputs(n=256, c=64, v=300)
    truth = loss_and_grads(plain_loss, x64, w64, targets)
    x, w = (t.detach().float().requires_grad_() for t in (x64, w64))
    with torch.autocast("cpu", torch.bfloat16):
        plain = loss_and_grads(plain_loss, x, w, targets)
        fused = loss_and_grads(fused_cross_entropy, x, w, targets, chunk=100)
    assert fused[1].dtype == fused[2].dtype == torch.float32
    assert abs(fused[0].item() - truth[0].item()) <= 1e-3 * truth[0].item()
    for got, ref, exact in zip(fused[1:], plain[1:], truth[1:], strict=True):
        assert (got - exact).norm() <= 1.5 * (ref - exact).norm() + 1e-6
        assert (got - ref).norm() <= 2e-2 * ref.norm()


@pytest.mark.parametrize("grad_mode", [True, False])
@pytest.mark.parametrize("needs", [(True, True), (True, False), (False, True), (False, False)])
def test_only_the_gradient_gemms_autograd_will_use_are_run(grad_mode, needs):
    x, w, targets = head_inputs(n=64)
    x.requires_grad_(needs[0])
    w.requires_grad_(needs[1])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with torch.set_grad_enabled(grad_mode):
            loss = fused_cross_entropy(x, w, targets, chunk=16)  # 4 chunks
    gemms = sum(e.name in ("aten::mm", "aten::addmm", "aten::addmm_") for e in prof.events())
    wanted = sum(needs) if grad_mode else 0
    assert gemms == 4 * (1 + wanted)
    assert loss.requires_grad == (wanted > 0)
    if wanted:
        loss.backward()
        assert (x.grad is not None) == needs[0] and (w.grad is not None) == needs[1]


def test_no_vocab_sized_tensor_is_kept_for_backward():
    x, w, targets = head_inputs(n=64, v=50)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: saved.append(t.shape) or t, lambda t: t
    ):
        loss = fused_cross_entropy(x, w, targets, chunk=16)
    loss.backward()
    # d/dx and d/dweight, made in forward, and nothing else
    assert sorted(saved) == sorted([x.shape, w.shape])


def test_a_second_backward_through_the_same_loss_is_refused():
    """backward scales the gradients made in forward in place: once."""
    x, w, targets = head_inputs()
    loss = fused_cross_entropy(x, w, targets)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_the_chunks_are_few_even_and_within_the_budget():
    cases = [(32768, 50304, "cuda", 4), (32768, 50304, "cuda", 2), (2048, 50304, "cpu", 4),
             (70, 50, "cpu", 8), (1, 50304, "cuda", 4), (5000, 65, "cpu", 4)]  # fmt: skip
    for n, vocab, device, itemsize in cases:
        budget = 1 << 30 if device == "cuda" else 24 << 20
        rows = chunk_rows(n, vocab, torch.device(device), itemsize)
        chunks = -(-n // rows)
        assert rows * vocab * itemsize <= budget or rows == 1
        # one chunk fewer would not fit
        assert chunks == 1 or -(-n // (chunks - 1)) * vocab * itemsize > budget
        # the last chunk is no more than chunks rows short
        assert rows - n % rows < chunks or n % rows == 0
    # 7 chunks (64 before: the GPU review's finding 3)
    assert chunk_rows(32768, 50304, torch.device("cuda")) == 4682


def test_compiled_fused_loss_is_one_opaque_call_and_equals_eager():
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    x, w, targets = head_inputs(n=256, c=32, v=100, dtype=torch.float32)
    eager = loss_and_grads(fused_cross_entropy, x, w, targets, chunk=16)
    compiled_loss = torch.compile(fused_cross_entropy, fullgraph=True)
    compiled, code = run_and_get_code(
        lambda: loss_and_grads(compiled_loss, x, w, targets, chunk=16)
    )
    for got, want in zip(compiled, eager, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    code = "\n".join(code)
    # 16 chunks, one call
    assert code.count("torch.ops.nanogpt.fused_linear_cross_entropy.default(") == 1
    # no GEMM unrolled outside it
    assert "extern_kernels.mm" not in code and "extern_kernels.addmm" not in code
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    loss_and_grads(compiled_loss, x, w, targets, chunk=16)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == frames  # no recompile
    torch._dynamo.reset()


def model_loss_and_grads(config: GPTConfig, untie: bool = False) -> tuple:
    torch.manual_seed(0)
    model = GPT(config).double()
    if untie:  # lm_head with a weight of its own, as GPTConfig.untied_head will make it
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone() * 0.5)
    g = torch.Generator().manual_seed(1)
    x, y = (torch.randint(config.vocab_size, (4, config.block_size), generator=g) for _ in range(2))
    y[0, :5] = -1
    _, loss = model(x, y)
    loss.backward()
    return loss, {name: p.grad for name, p in model.named_parameters()}


def test_an_untied_head_gets_its_own_gradient():
    loss, grads = model_loss_and_grads(SMALL, untie=True)
    loss_f, grads_f = model_loss_and_grads(
        replace(SMALL, loss_impl="fused", loss_chunk=7), untie=True
    )
    assert "lm_head.weight" in grads and "transformer.wte.weight" in grads
    assert abs(loss_f.item() - loss.item()) <= 1e-10
    for name, grad in grads.items():
        assert (grads_f[name] - grad).abs().max().item() <= 1e-10, name
    assert not torch.allclose(grads["lm_head.weight"], grads["transformer.wte.weight"])


def branch_point_module():
    """model.py as it was at BRANCH_POINT, loaded as a module of its own (skips outside a git
    checkout with it)."""
    show = subprocess.run(
        ["git", "show", f"{BRANCH_POINT}:model.py"], cwd=ROOT, capture_output=True, text=True
    )
    if show.returncode != 0:
        pytest.skip(f"no git history with {BRANCH_POINT}")
    namespace = {"__name__": "model_at_branch_point"}
    exec(compile(show.stdout, "model_at_branch_point.py", "exec"), namespace)
    return namespace


def test_the_chunked_loss_is_bit_for_bit_what_it_was_without_a_softcap():
    old = branch_point_module()
    x, w, targets = head_inputs(n=70, dtype=torch.float32)
    now = loss_and_grads(chunked_cross_entropy, x, w, targets, chunk=16)
    before = loss_and_grads(old["chunked_cross_entropy"], x, w, targets, chunk=16)
    assert all(torch.equal(a, b) for a, b in zip(now, before, strict=True))


def test_triton_without_cuda_or_the_interpreter_is_refused_in_one_line(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    model = GPT(replace(SMALL, loss_impl="triton"))
    x = torch.randint(SMALL.vocab_size, (2, SMALL.block_size))
    with pytest.raises(ValueError, match="loss_impl='triton' cannot run here") as refused:
        model(x, x)
    assert "\n" not in str(refused.value)
    # generation makes no loss: nothing to refuse
    assert model(x)[0].shape == (2, 1, SMALL.vocab_size)


# --------------------------------------------------------------------------------------------------
# the Triton classifier, opt-in: pytest -m triton on a GPU, or TRITON_INTERPRET=1 pytest -m triton
# on a CPU, where triton's interpreter runs it (~5 ms a program: small grids). Triton reads
# TRITON_INTERPRET once, when it is first imported, so the variable must be set before the test
# process starts.

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def classifier():
    """nanogpt_perf.kernels.classifier, where its kernel can run: on CUDA, or interpreted on a
    CPU."""
    pytest.importorskip("triton")
    from nanogpt_perf.kernels import triton_problem

    if problem := triton_problem(DEVICE):
        pytest.fail(f"{problem}: run TRITON_INTERPRET=1 pytest -m triton")
    return importlib.import_module("nanogpt_perf.kernels.classifier")


@pytest.mark.triton
@pytest.mark.parametrize("softcap", [0.0, 15.0])
# 4097: a 1-column block
@pytest.mark.parametrize("rows, vocab", [(8, 50304), (64, 65), (16, 4097), (32, 1000)])
def test_the_triton_classifier_equals_torch_in_float32(classifier, rows, vocab, softcap):
    g = torch.Generator().manual_seed(vocab)
    logits = (4 * torch.randn(rows, vocab, generator=g)).to(DEVICE)
    targets = torch.randint(vocab, (rows,), generator=g).to(DEVICE)
    targets[1] = -1
    targets[2] = vocab - 1  # the last column, in the last (partial) block
    z = logits.clone().requires_grad_()
    capped = softcap * torch.tanh(z / softcap) if softcap else z
    reference = F.cross_entropy(capped, targets, ignore_index=-1, reduction="none")
    reference.sum().backward()

    losses, grad = classifier.cross_entropy_in_place(logits, targets, softcap)
    assert grad.data_ptr() == logits.data_ptr()  # in place
    torch.testing.assert_close(losses, reference.detach(), rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(grad, z.grad, rtol=1e-5, atol=1e-6)
    assert grad[1].abs().max() == 0


@pytest.mark.triton
def test_the_triton_classifier_takes_bf16_logits_and_can_leave_them_alone(classifier):
    g = torch.Generator().manual_seed(0)
    logits = (4 * torch.randn(16, 50304, generator=g)).bfloat16().to(DEVICE)
    targets = torch.randint(50304, (16,), generator=g).to(DEVICE)
    reference = F.cross_entropy(logits.float(), targets, reduction="none")
    kept = logits.clone()
    losses, grad = classifier.cross_entropy_in_place(kept, targets, with_grad=False)
    assert grad is None and torch.equal(kept, logits)
    # fp32 sums over the bf16 values
    torch.testing.assert_close(losses, reference, rtol=1e-6, atol=1e-5)
    losses, grad = classifier.cross_entropy_in_place(logits, targets)
    assert grad.dtype == torch.bfloat16
    z = kept.float().requires_grad_()
    F.cross_entropy(z, targets, reduction="sum").backward()  # softmax - onehot in fp32
    # rounded once to bf16 (values within [-1, 1])
    assert (grad.float() - z.grad).abs().max() <= 2**-8


@pytest.mark.triton
@pytest.mark.parametrize("softcap", [0.0, 5.0])
def test_the_triton_loss_equals_the_plain_one(classifier, softcap):
    x, w, targets = (
        t.detach().to(DEVICE) for t in head_inputs(n=96, c=32, v=1000, dtype=torch.float32)
    )
    x.requires_grad_(), w.requires_grad_()
    plain = loss_and_grads(plain_loss, x, w, targets, scale=2.0, softcap=softcap)
    triton = loss_and_grads(
        fused_cross_entropy, x, w, targets, scale=2.0, chunk=40, softcap=softcap, use_triton=True
    )
    for got, want in zip(triton, plain, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def training_losses(config: GPTConfig, steps: int = 8) -> list[float]:
    torch.manual_seed(0)
    model = GPT(config).to(DEVICE)
    optimizer = model.configure_optimizers(0.0, 1e-2, (0.9, 0.95))
    x = torch.randint(80, (4, 16), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    losses = []
    for _ in range(steps):
        _, loss = model(x, x)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.triton
def test_a_model_trains_with_the_triton_loss_as_with_the_plain_one(classifier):
    triton, plain = training_losses(replace(SMALL, loss_impl="triton")), training_losses(SMALL)
    assert triton == pytest.approx(plain, rel=1e-5)
    assert triton[-1] < triton[0] - 1.0


AOT_COMPILE = """
import json, time
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from nanogpt_perf.kernels.classifier import cross_entropy_rows_kernel, launch_config
figures = []
for dtype, softcap in [("bf16", False), ("bf16", True), ("fp32", False)]:
    config = launch_config(50304)
    signature = {"logits_ptr": "*" + dtype, "targets_ptr": "*i64", "losses_ptr": "*fp32",
                 "n_cols": "i32",
                 "row_stride": "i32", "softcap": "fp32", "ignore_index": "i32",
                 "BLOCK": "constexpr", "SOFTCAP": "constexpr", "WRITE_GRAD": "constexpr"}
    constexprs = {"BLOCK": config["BLOCK"], "SOFTCAP": softcap, "WRITE_GRAD": True}
    t0 = time.perf_counter()
    kernel = triton.compile(ASTSource(cross_entropy_rows_kernel, signature, constexprs),
                            target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": config["num_warps"]})
    figures.append(dict(dtype=dtype, softcap=softcap, seconds=time.perf_counter() - t0,
                        shared=kernel.metadata.shared, cubin=len(kernel.asm["cubin"]),
                        ptx=kernel.asm["ptx"]))
print(json.dumps(figures))
"""


@pytest.mark.triton
def test_the_triton_classifier_compiles_for_an_h100(tmp_path):
    """Ahead of time, with no GPU: triton's own ptxas makes an sm_90 cubin (compile errors and a
    shared-memory overflow would show here). In a process of its own: this module's other tests
    interpret the kernel."""
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # compiled afresh, not from a cache
    env |= {"TRITON_DEFAULT_FP_FUSION": "1", "TRITON_CACHE_DIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(AOT_COMPILE)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr
    for figure in json.loads(run.stdout):
        assert figure["cubin"] > 0 and ".target sm_90" in figure["ptx"]
        assert figure["shared"] <= 227 * 1024  # an H100's shared memory per block
        print(f"sm_90 {figure['dtype']} softcap={figure['softcap']}: {figure['seconds']:.1f} s, "
              f"{figure['shared']} B shared")  # fmt: skip
