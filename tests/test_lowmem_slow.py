"""torchao's low-bit AdamW as it really runs, its step compiled per parameter shape (minutes on a
CPU the first time: opt-in, -m slow), against the eager run of the same function that
tests/test_lowmem.py uses throughout: the same weights within float rounding, and a save -> load ->
continue bit for bit."""

import io

import pytest
import torch

from model import GPT, GPTConfig
from nanogpt_perf.lowmem import LowMemConfig, cast_weights
from nanogpt_perf.optim import OptimConfig, build_optimizer

pytest.importorskip("torchao")
pytestmark = pytest.mark.slow
ADAMW = OptimConfig(learning_rate=3e-3, weight_decay=0.1, beta1=0.9, beta2=0.95)


def run(spec: LowMemConfig, eager: bool, steps: int = 3, resume_at: int | None = None) -> GPT:
    """A one-layer GPT (every matrix 64 x 64: one compiled shape for its quantized states) trained
    steps steps, through a checkpoint at resume_at when given."""
    torch.manual_seed(0)
    model = cast_weights(
        GPT(GPTConfig(n_layer=1, n_head=1, n_embd=64, block_size=16, vocab_size=64, bias=False)),
        spec,
    )
    optim = build_optimizer(model, ADAMW, spec)
    compile_ = torch.compile
    if eager:
        torch.compile = lambda fn, **kwargs: fn
    try:
        g = torch.Generator().manual_seed(1)
        for step in range(steps):
            if step == resume_at:
                buffer = io.BytesIO()
                torch.save({"optimizer": optim.state_dict(), "model": model.state_dict()}, buffer)
                buffer.seek(0)
                saved = torch.load(buffer, weights_only=True)
                model.load_state_dict(saved["model"])
                optim = build_optimizer(model, ADAMW, spec)
                optim.load_state_dict(saved["optimizer"])
            tokens = torch.randint(64, (4, 17), generator=g)
            _, loss = model(tokens[:, :-1], tokens[:, 1:])
            loss.backward()
            optim.step()
            optim.zero_grad(set_to_none=True)
    finally:
        torch.compile = compile_
    return model


@pytest.mark.parametrize("spec", [LowMemConfig(state_bits=8), LowMemConfig(state_bits=4)])
def test_compiled_low_bit_adamw_is_the_eager_one_and_resumes_bit_for_bit(spec):
    compiled, eager = run(spec, eager=False), run(spec, eager=True)
    for (name, a), b in zip(
        compiled.state_dict().items(), eager.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    resumed = run(spec, eager=False, resume_at=2)
    for (name, a), b in zip(
        compiled.state_dict().items(), resumed.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name


@pytest.mark.gpu
def test_offloaded_adamw_trains_as_adamw_on_the_device_and_holds_no_state_there():
    """CUDA only (never run on the CPU machines that wrote it): torchao's CPUOffloadOptimizer
    against torch's fused AdamW on the device, 3 steps of a tiny GPT: the same weights within float
    rounding (fused CPU vs CUDA kernels), and no optimizer state on the device."""
    from nanogpt_perf.memory import training_state_bytes

    cuda = torch.device("cuda")
    g = torch.Generator().manual_seed(1)
    data = [torch.randint(64, (4, 17), generator=g).to(cuda) for _ in range(3)]
    models = []
    for spec in (LowMemConfig(), LowMemConfig(offload=True)):
        torch.manual_seed(0)
        model = GPT(
            GPTConfig(n_layer=1, n_head=1, n_embd=128, block_size=16, vocab_size=64, bias=False)
        ).to(cuda)
        optim = build_optimizer(model, ADAMW, spec)
        for tokens in data:
            _, loss = model(tokens[:, :-1], tokens[:, 1:])
            loss.backward()
            optim.step()
            optim.zero_grad(set_to_none=True)
        models.append(model)
    for (name, a), b in zip(
        models[0].state_dict().items(), models[1].state_dict().values(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)
    on_device = [v for s in optim.d_opt.state.values() for v in s.values()] if optim.d_opt else []
    assert training_state_bytes(models[1], optim)["optimizer"] > 8 * 128 * 128  # on the host
    # small ones
    assert sum(t.numel() for t in on_device if isinstance(t, torch.Tensor) and t.is_cuda) < 8 * 4096
