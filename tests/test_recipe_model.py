"""The modern recipe's options of GPTConfig (rotary, rmsnorm, qk_norm, relu2, untied_head,
logit_softcap, zero_init_proj, value_embeds, unet_skips): with all of them off, the model of the
branch point bit for bit; with each on, a model that trains, whose fast paths equal the slow ones,
and whose checkpoints keep what it is."""

import importlib.util
import math
import subprocess
from dataclasses import asdict

import pytest
import torch

from conftest import ROOT, micro_batches_equal_one_batch, sdpa_equals_manual
from model import ARCHITECTURE, GPT, GPTConfig, ReLUSquared, rotary_angles, rotate
from nanogpt_perf.guard.checkpoint import load_checkpoint
from nanogpt_perf.train.checkpoint import CHECKPOINT_KEYS, save_checkpoint, training_state

SMALL = dict(block_size=16, vocab_size=64, n_layer=2, n_head=4, n_embd=32, dropout=0.0)
# the commit this branch started from: its model.py is the reference for the defaults
BRANCH_POINT = "ff38d879d042b443c7e157755ec9fcc304d37f0f"
OPTIONS = {
    "rotary": dict(rotary=True),
    "rmsnorm": dict(rmsnorm=True),
    "qk_norm": dict(qk_norm=True),
    "relu2": dict(relu2=True),
    "untied_head": dict(untied_head=True),
    "logit_softcap": dict(logit_softcap=5.0),
    "zero_init_proj": dict(zero_init_proj=True),
    "value_embeds": dict(value_embeds=True),
    "unet_skips": dict(unet_skips=True),
}
ALL = {k: v for option in OPTIONS.values() for k, v in option.items()}
# 5: a middle layer without skip or table
CASES = {**OPTIONS, "all": ALL, "all, 5 layers": dict(ALL, n_layer=5)}


def model_with(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**SMALL, **overrides}))


def batch(B: int = 4, T: int = 16, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(64, (B, T), generator=g), torch.randint(64, (B, T), generator=g)


def model_at_branch_point():
    """model.py as it was where this branch started, from git, as a module of its own."""
    try:
        source = subprocess.run(
            ["git", "show", f"{BRANCH_POINT}:model.py"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("needs git and the history of this repository")
    module = importlib.util.module_from_spec(
        importlib.util.spec_from_loader("model_at_branch_point", loader=None)
    )
    exec(compile(source, "model_at_branch_point.py", "exec"), module.__dict__)
    return module


@pytest.mark.parametrize(
    "shape",
    [
        dict(),
        dict(bias=False),
        dict(attention="manual"),
        dict(dropout=0.1, activation_checkpointing=True),
    ],
)
def test_defaults_are_the_branch_points_model_bit_for_bit(shape):
    old = model_at_branch_point()
    config = {**SMALL, **shape}
    torch.manual_seed(0)
    theirs = old.GPT(old.GPTConfig(**config))
    rng_theirs = torch.get_rng_state()
    ours = model_with(**config)
    assert torch.equal(torch.get_rng_state(), rng_theirs)  # the same random numbers drawn, as many
    a, b = theirs.state_dict(), ours.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    x, y = batch()
    losses = []
    for model in (theirs, ours):
        torch.manual_seed(2)  # the same dropout masks
        _, loss = model(x, y)
        loss.backward()
        losses.append(loss)
    assert torch.equal(*losses)
    for (name, p), q in zip(theirs.named_parameters(), ours.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad), name
    theirs.eval(), ours.eval()
    assert torch.equal(
        theirs.generate(x[:, :4], 20, temperature=0), ours.generate(x[:, :4], 20, temperature=0)
    )


def test_options_that_are_off_make_no_weights_and_those_on_make_theirs():
    default = set(model_with().state_dict())
    for name in ("qk_norm", "relu2", "logit_softcap", "zero_init_proj"):
        assert set(model_with(**OPTIONS[name]).state_dict()) == default, name
    assert set(model_with(rotary=True).state_dict()) == default - {"transformer.wpe.weight"}
    rms = set(model_with(rmsnorm=True).state_dict())
    assert rms == {k for k in default if ".ln_" not in k} and not list(
        model_with(rmsnorm=True).buffers()
    )
    untied = model_with(untied_head=True)
    assert (
        untied.lm_head.weight is not untied.transformer.wte.weight
        and "lm_head.weight" in untied.state_dict()
    )
    assert set(model_with(unet_skips=True).state_dict()) == default | {"skip_weights"}
    deeper = set(model_with(n_layer=8).state_dict())
    ve = set(model_with(value_embeds=True, n_layer=8).state_dict()) - deeper
    # three tables, in the first and last three layers
    tables = {f"transformer.ve.{i}.weight" for i in range(3)}
    assert ve == tables | {f"transformer.h.{i}.attn.ve_mix" for i in (0, 1, 2, 5, 6, 7)}
    assert not list(model_with(**ALL).buffers())


def test_architecture_lists_every_option_that_changes_what_the_weights_are_or_do():
    # an init only: the weights then are what they are
    assert set(ALL) - set(ARCHITECTURE) == {"zero_init_proj"}


@pytest.mark.parametrize("case", CASES)
def test_each_option_trains(case):
    model = model_with(**CASES[case])
    optimizer = model.configure_optimizers(0.0, 1e-2, (0.9, 0.95))
    x, y = batch(B=8)
    y = torch.roll(x, 1, dims=1)  # the previous token: learnt only through attention to it
    losses = []
    for _ in range(40):
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.5 * losses[0], losses[::8]


@pytest.mark.parametrize("case", ["rotary", "qk_norm", "value_embeds", "all"])
def test_sdpa_equals_manual_attention_with_the_options(case):
    sdpa, manual = model_with(**CASES[case]), model_with(**CASES[case], attention="manual")
    sdpa_equals_manual(randomise(sdpa), randomise(manual), *batch())


def randomise(model: GPT, std: float = 0.1) -> GPT:
    """Every parameter drawn anew from a seeded generator, so that no zero init hides a path:
    matrices and biases about 0, gains and mixing weights about 1."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            gain = p.dim() == 1 and not name.endswith("bias")
            p.copy_(torch.randn(p.shape, generator=g) * std + gain)
    return model


def test_k_micro_batches_equal_one_batch_with_every_option():
    micro_batches_equal_one_batch(
        randomise(model_with(**ALL)), randomise(model_with(**ALL)), *batch(B=8)
    )


def test_rotary_scores_depend_only_on_the_distance_between_positions():
    g = torch.Generator().manual_seed(0)
    q, k = (
        torch.randn(1, 1, 1, 16, generator=g, dtype=torch.float64),
        torch.randn(1, 1, 1, 16, generator=g),
    )
    k = k.double()
    cos, sin = rotary_angles(64, 16, torch.arange(64), torch.float64)

    def score(i: int, j: int) -> float:
        return (rotate(q, cos[i], sin[i]) * rotate(k, cos[j], sin[j])).sum().item()

    assert score(9, 4) == pytest.approx(score(5, 0)) and score(40, 35) == pytest.approx(score(5, 0))
    assert score(9, 3) != pytest.approx(score(9, 4))  # and it does depend on the distance
    assert rotate(q, cos[7], sin[7]).norm().item() == pytest.approx(q.norm().item())  # a rotation
    assert torch.equal(rotate(q, cos[0], sin[0]), q)  # position 0 is not turned


def test_qk_norm_makes_attention_blind_to_the_scale_of_q_and_k():
    model, scaled = randomise(model_with(qk_norm=True)), randomise(model_with(qk_norm=True))
    plain, plain_scaled = randomise(model_with()), randomise(model_with())
    C = SMALL["n_embd"]
    with torch.no_grad():
        for m in (scaled, plain_scaled):
            for block in m.transformer.h:
                block.attn.c_attn.weight[: 2 * C] *= 7.0  # q and k, not v
                block.attn.c_attn.bias[: 2 * C] *= 7.0
    x, _ = batch()
    torch.testing.assert_close(model(x, x)[0], scaled(x, x)[0], rtol=1e-5, atol=1e-5)
    # without it, the scale counts
    assert not torch.allclose(plain(x, x)[0], plain_scaled(x, x)[0], atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_relu_squared_is_autograds_relu_then_square_bit_for_bit(dtype):
    torch.manual_seed(0)
    h = (torch.randn(64, 96) * 3).to(dtype)
    h[0, :8] = 0.0  # relu's kink
    fast, slow = h.clone().requires_grad_(), h.clone().requires_grad_()
    y_fast, y_slow = ReLUSquared.apply(fast), torch.nn.functional.relu(slow).square()
    g = torch.randn_like(y_slow)
    y_fast.backward(g)
    y_slow.backward(g)
    assert torch.equal(y_fast, y_slow) and torch.equal(fast.grad, slow.grad)
    assert fast.grad[0, :8].eq(0).all() and (fast.grad != 0).float().mean() > 0.4


def test_rmsnorm_leaves_unit_rms_and_has_no_weights():
    model = randomise(model_with(rmsnorm=True))
    h = model.hidden_states(batch()[0])
    torch.testing.assert_close(h.pow(2).mean(-1), torch.ones(h.shape[:2]), rtol=1e-4, atol=1e-4)
    assert not [n for n, _ in model.named_parameters() if "ln_" in n]


def test_logit_softcap_bounds_the_logits_and_leaves_small_ones_alone():
    capped, free = (
        randomise(model_with(logit_softcap=2.0), std=0.5),
        randomise(model_with(), std=0.5),
    )
    wide = randomise(model_with(logit_softcap=1e4), std=0.5)
    x, y = batch()
    logits, loss = capped(x, y)
    assert logits.abs().max() < 2.0 and free(x, y)[0].abs().max() > 2.0  # the cap does bite
    # a cap far away: none
    torch.testing.assert_close(wide(x, y)[0], free(x, y)[0], rtol=1e-5, atol=1e-5)
    assert capped(x)[0].abs().max() < 2.0  # generation's logits too
    loss.backward()


def test_untied_head_and_token_embedding_are_two_weights_that_learn_apart():
    model = model_with(untied_head=True)
    wte, head = model.transformer.wte.weight, model.lm_head.weight
    # drawn as every Linear is
    assert not torch.equal(wte, head) and abs(head.std().item() - 0.02) < 2e-3
    x, y = batch()
    _, loss = model(x, y)
    loss.backward()
    unseen = torch.ones(SMALL["vocab_size"], dtype=torch.bool)
    unseen[x.unique()] = False
    # a lookup: only the tokens seen get a gradient
    assert unseen.any() and torch.all(wte.grad[unseen] == 0)
    assert torch.all(head.grad.abs().sum(dim=1) > 0)  # the head: every token's logit
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95))
    # its own, decayed
    assert sum(p is head for g in optimizer.param_groups for p in g["params"]) == 1
    assert any(p is head for p in optimizer.param_groups[0]["params"])


def test_zero_init_proj_makes_every_block_the_identity_at_init():
    model = model_with(zero_init_proj=True)
    projections = [p for n, p in model.named_parameters() if n.endswith("c_proj.weight")]
    assert len(projections) == 2 * SMALL["n_layer"] and all(torch.all(p == 0) for p in projections)
    x, _ = batch()
    T = x.size(1)
    embeddings = model.transformer.wte(x) + model.transformer.wpe(torch.arange(T))
    torch.testing.assert_close(model.hidden_states(x), model.transformer.ln_f(embeddings))


@pytest.mark.parametrize("case", ["default", "rotary"])
def test_crop_block_size_keeps_the_logits_of_short_sequences(case):
    model = randomise(model_with(**({} if case == "default" else OPTIONS[case])))
    x, _ = batch(T=8)
    before, _ = model(x, x)
    model.crop_block_size(8)
    assert model.config.block_size == 8
    torch.testing.assert_close(model(x, x)[0], before, rtol=0, atol=0)
    with pytest.raises(ValueError):
        model(torch.zeros(1, 9, dtype=torch.long))


@pytest.mark.parametrize("case", ["rotary", "untied_head", "all"])
def test_checkpoints_keep_the_options(tmp_path, case):
    model = randomise(model_with(**CASES[case])).eval()
    model_args = {k: getattr(model.config, k) for k in (*ARCHITECTURE, "dropout")}
    save_checkpoint({"model": model.state_dict(), "model_args": model_args}, tmp_path / "ckpt.pt")
    checkpoint = load_checkpoint(tmp_path / "ckpt.pt")
    # a config: the kernels from it, the architecture from the checkpoint
    for config in (None, GPTConfig(**SMALL)):
        reloaded = GPT.from_checkpoint(checkpoint, config).eval()
        x, _ = batch()
        assert torch.equal(model(x, x)[0], reloaded(x, x)[0])


def test_training_checkpoints_name_the_options_that_are_on_and_only_those():
    """nanoGPT's GPTConfig(**model_args) must take a GPT-2 checkpoint of ours, and refuse one it
    cannot run."""
    state = {k: None for k in CHECKPOINT_KEYS}
    gpt2 = training_state(**state | {"model_args": asdict(GPTConfig(**SMALL))})["model_args"]
    assert set(gpt2) == {
        "n_layer",
        "n_head",
        "n_embd",
        "bias",
        "vocab_size",
        "block_size",
        "dropout",
    }
    recipe = training_state(
        **state | {"model_args": asdict(GPTConfig(**SMALL, rotary=True, logit_softcap=15))}
    )
    assert set(recipe["model_args"]) - set(gpt2) == {"rotary", "logit_softcap"}


def test_hellaswag_scores_with_the_logits_the_model_gives():
    from torch.nn import functional as F

    from nanogpt_perf.hellaswag import ending_scores

    model = randomise(model_with(logit_softcap=1.0), std=0.5).eval()
    x, _ = batch()
    total, _ = ending_scores(model, x, torch.ones_like(x, dtype=torch.bool))
    logits, _ = model(x[:, :-1], x[:, 1:])
    expected = F.log_softmax(logits, dim=-1).gather(-1, x[:, 1:, None]).squeeze(-1).sum(dim=1)
    torch.testing.assert_close(total, expected)


def test_config_refuses_what_cannot_work():
    for softcap in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="logit_softcap"):
            GPTConfig(logit_softcap=softcap)
    with pytest.raises(ValueError, match="logit_softcap"):
        # the fused losses cap; liger-kernel cannot
        GPTConfig(logit_softcap=30.0, loss_impl="liger")
    with pytest.raises(ValueError, match="even head size"):
        GPTConfig(n_embd=36, n_head=4, rotary=True)
    softcap = GPTConfig(logit_softcap=30).logit_softcap
    assert softcap == 30.0 and type(softcap) is float  # as a checkpoint's model_args keep it
