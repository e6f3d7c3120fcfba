import math

import pytest
import torch

from conftest import micro_batches_equal_one_batch, sdpa_equals_manual
from model import GPT, GPTConfig, sample
from nanogpt_perf.guard.checkpoint import load_checkpoint
from nanogpt_perf.peak_flops import mfu, peak_flops_for_name
from nanogpt_perf.train.checkpoint import save_checkpoint
from nanogpt_perf.train.parallel import unwrap

SMALL = dict(block_size=16, vocab_size=64, n_layer=2, n_head=4, n_embd=32, dropout=0.0)


def small_model(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**SMALL, **overrides}))


def batch(B: int = 4, T: int = 16, V: int = 64, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(V, (B, T), generator=g), torch.randint(V, (B, T), generator=g)


@pytest.mark.parametrize("bias", [True, False])
def test_sdpa_matches_manual_attention_in_outputs_and_gradients(bias):
    sdpa, manual = small_model(bias=bias), small_model(bias=bias)
    for block in manual.transformer.h:
        block.attn.attention = "manual"
    sdpa_equals_manual(sdpa, manual, *batch())


def test_manual_attention_is_causal():
    model = small_model(attention="manual").eval()
    x, _ = batch(B=1)
    x2 = x.clone()
    x2[0, 10:] = (x2[0, 10:] + 1) % 64  # change only the future of position 9
    logits, _ = model(x, x)
    logits2, _ = model(x2, x2)
    torch.testing.assert_close(logits[0, :10], logits2[0, :10])
    assert not torch.allclose(logits[0, 10:], logits2[0, 10:])


def test_k_micro_batches_equal_one_batch_k_times_as_big():
    micro_batches_equal_one_batch(small_model(), small_model(), *batch(B=8))


def test_tied_embeddings_and_scaled_residual_init():
    model = small_model(n_layer=8, n_embd=64)
    assert model.lm_head.weight is model.transformer.wte.weight
    proj = torch.cat([b.mlp.c_proj.weight.flatten() for b in model.transformer.h])
    fc = torch.cat([b.mlp.c_fc.weight.flatten() for b in model.transformer.h])
    assert abs(proj.std().item() - 0.02 / math.sqrt(2 * 8)) < 5e-4
    assert abs(fc.std().item() - 0.02) < 5e-4


RECIPE = dict(
    rotary=True, rmsnorm=True, qk_norm=True, relu2=True, untied_head=True, logit_softcap=30.0
)
RECIPE |= dict(zero_init_proj=True, value_embeds=True, unet_skips=True)


@pytest.mark.parametrize(
    "shape",
    [
        dict(n_layer=2, n_head=4, n_embd=64, block_size=32, vocab_size=256),  # weights dominate
        # attention is over a third
        dict(n_layer=3, n_head=2, n_embd=32, block_size=128, vocab_size=96),
    ],
)
@pytest.mark.parametrize(
    "options",
    [{}, *({k: v} for k, v in RECIPE.items()), RECIPE],
    ids=["default", *RECIPE, "all"],
)
def test_estimate_mfu_counts_the_flops_that_pytorch_counts(shape, options):
    """estimate_mfu's FLOPs per iteration against torch's FlopCounterMode counting a real forward
    and backward. Manual attention, so that the counter sees the attention matmuls (it has no
    formula for CPU flash). The options change what is a matmul: no wpe with rotary, an untied
    head's matmul and not wte's lookup."""
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    model = GPT(GPTConfig(**shape, **options, attention="manual", dropout=0.0))
    B = 3
    x = torch.randint(shape["vocab_size"], (B, shape["block_size"]))
    with FlopCounterMode(display=False) as counter:
        _, loss = model(x, x)
        loss.backward()
    # at dt = 1 s against a peak of 1 FLOP/s, the utilisation is the FLOP count of one iteration
    assert model.estimate_mfu(B, 1.0, peak_flops=1.0) == pytest.approx(
        counter.get_total_flops(), rel=0.03
    )
    # and it scales with the sequence length actually run, attention term included
    T = shape["block_size"] // 2
    with FlopCounterMode(display=False) as counter:
        _, loss = model(x[:, :T], x[:, :T])
        loss.backward()
    assert model.estimate_mfu(B, 1.0, peak_flops=1.0, seq_len=T) == pytest.approx(
        counter.get_total_flops(), rel=0.03
    )


def test_mfu_is_unavailable_rather_than_invented():
    # CPU: no peak in the table
    assert mfu(small_model(), 10, 0.5, torch.device("cpu"), "fp32") is None
    assert peak_flops_for_name("Some Future GPU", "bf16") is None
    assert peak_flops_for_name("NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(989.4e12)
    assert peak_flops_for_name("NVIDIA H100 PCIe", "bf16") == pytest.approx(756e12)
    assert peak_flops_for_name("NVIDIA A100-SXM4-40GB", "tf32") == pytest.approx(156e12)
    assert peak_flops_for_name("NVIDIA A10", "bf16") == pytest.approx(125e12)
    assert peak_flops_for_name("NVIDIA L40S", "bf16") == pytest.approx(362.05e12)
    assert peak_flops_for_name("Tesla V100-SXM2-16GB", "bf16") is None  # V100 has no bf16


def test_top_k_keeps_exactly_k_candidates_even_with_ties():
    logits = torch.tensor([[5.0, 1.0, 3.0, 3.0, 3.0, -2.0]])
    g = torch.Generator().manual_seed(0)
    seen = {sample(logits, temperature=1.0, top_k=2, generator=g).item() for _ in range(400)}
    assert len(seen) == 2 and 0 in seen and seen <= {0, 2, 3, 4}
    seen = {sample(logits, temperature=1.0, top_k=1, generator=g).item() for _ in range(50)}
    assert seen == {0}
    assert sample(logits, temperature=0.0).item() == 0


def test_sample_draws_as_torch_multinomial_does():
    """With every token a candidate, the same generator gives torch.multinomial's one-sample draw,
    token for token (at a temperature, of the softmax of logits / temperature)."""
    logits = torch.randn(3, 1000, generator=torch.Generator().manual_seed(0))
    for temperature in (1.0, 0.7):
        g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
        ours = torch.cat([sample(logits, temperature, generator=g1) for _ in range(200)], dim=1)
        probs = (logits / temperature).softmax(dim=-1)
        theirs = torch.cat([torch.multinomial(probs, 1, generator=g2) for _ in range(200)], dim=1)
        assert torch.equal(ours, theirs)
        assert len(set(ours[0].tolist())) > 20  # really sampled


def test_configure_optimizers_decays_only_matrices():
    model = small_model(bias=True)
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95))
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and all(p.dim() >= 2 for p in decay["params"])
    assert no_decay["weight_decay"] == 0.0 and all(p.dim() < 2 for p in no_decay["params"])
    n = sum(p.numel() for g in opt.param_groups for p in g["params"])
    assert n == sum(p.numel() for p in model.parameters())
    assert opt.defaults.get("fused")  # fused AdamW runs on CPU too


def test_crop_block_size():
    model = small_model()
    model.crop_block_size(8)
    assert model.config.block_size == 8 and model.transformer.wpe.weight.shape[0] == 8
    with pytest.raises(ValueError):
        model(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="larger"):
        model.crop_block_size(9)


def test_n_embd_must_divide_by_n_head():
    with pytest.raises(ValueError, match="not divisible"):
        GPTConfig(n_embd=30, n_head=4)


def test_checkpoint_round_trip_gives_identical_logits(tmp_path):
    model = small_model().eval()
    compiled = torch.compile(model)  # wrapping only: its state dict carries _orig_mod. prefixes
    assert any(k.startswith("_orig_mod.") for k in compiled.state_dict())
    state = unwrap(compiled).state_dict()
    assert not any("_orig_mod" in k for k in state)
    save_checkpoint({"model": state, "model_args": SMALL}, tmp_path / "ckpt.pt")
    # no temporary file left, whatever its name
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]
    checkpoint = load_checkpoint(tmp_path / "ckpt.pt")
    reloaded = GPT(GPTConfig(**checkpoint["model_args"])).eval()
    reloaded.load_state_dict(checkpoint["model"])
    x, _ = batch()
    assert torch.equal(model(x, x)[0], reloaded(x, x)[0])
