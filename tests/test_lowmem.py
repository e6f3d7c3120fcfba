"""nanogpt_perf/lowmem.py and its parts (lowbit.py, lowmem_state.py, in_backward.py,
memory.training_state_bytes): stochastic rounding against float32 in expectation (and a
round-to-nearest that this check catches), low-bit state and Muon's low-precision momentum against
float32 within stated tolerances, the step inside backward against the step after it bit for bit,
save -> load -> continue against uninterrupted bit for bit for each saver's state, a corrupt or
foreign state refused in one line, each conflict refused in one line, and the state's bytes by part.

torchao's optimizers compile each parameter shape's step on first use (minutes on a CPU): here they
run the same function eagerly (torch.compile made the identity for this module);
tests/test_lowmem_slow.py runs it compiled."""

import io
from types import SimpleNamespace

import pytest
import torch

from conftest import HYPER
from model import GPT, GPTConfig
from nanogpt_perf.errors import UserError
from nanogpt_perf.in_backward import OptimizerInBackward
from nanogpt_perf.lowmem import LowMemConfig, cast_weights, lowmem_rules, offload_rules
from nanogpt_perf.lowmem_state import check_saved_state
from nanogpt_perf.memory import storage_bytes, training_state_bytes
from nanogpt_perf.optim import MuonAdamW, OptimConfig, build_optimizer, optimizer_rules, set_lr
from nanogpt_perf.runtime import Runtime
from nanogpt_perf.train.step import TrainStep

pytest.importorskip("torchao")
V, T, B = 64, 16, 4


@pytest.fixture(autouse=True, scope="module")
def eager_torchao_on_one_thread():
    """torchao's step function run eagerly (the same maths, no minutes of compiling per shape), on
    one thread (these tiny tensors run fastest there, and never wait for a busy second core)."""
    compile_, threads = torch.compile, torch.get_num_threads()
    torch.compile = lambda fn, **kwargs: fn
    torch.set_num_threads(1)
    yield
    torch.compile = compile_
    torch.set_num_threads(threads)


def tiny(seed: int = 0, n_embd: int = 64) -> GPT:
    """Every matrix of n_embd=64 has >= 4096 values, a multiple of 256: torchao quantizes its
    state."""
    torch.manual_seed(seed)
    return GPT(
        GPTConfig(n_layer=2, n_head=2, n_embd=n_embd, block_size=T, vocab_size=V, bias=False)
    )


def batches(n: int, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(V, (B, T + 1), generator=g) for _ in range(n)]


def optim_config(optimizer: str) -> OptimConfig:
    return OptimConfig(optimizer=optimizer, **HYPER)


def build(model: GPT, optimizer: str, spec: LowMemConfig) -> torch.optim.Optimizer:
    cast_weights(model, spec)
    return build_optimizer(model, optim_config(optimizer), spec)


def train(
    model: GPT,
    optimizer: torch.optim.Optimizer,
    data: list[torch.Tensor],
    in_backward: bool = False,
) -> None:
    hooks = OptimizerInBackward(model, optimizer) if in_backward else None
    for tokens in data:
        _, loss = model(tokens[:, :-1], tokens[:, 1:])
        if hooks:
            hooks.backward(loss)
        else:
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    if hooks:
        hooks.remove()


def relative_gap(a: GPT, b: GPT, start: GPT) -> float:
    """||a - b|| / ||b - start|| over all weights: how far a's training ended from b's, in units
    of b's travel."""
    wa, wb, w0 = (
        torch.cat([p.detach().float().flatten() for p in m.parameters()]) for m in (a, b, start)
    )
    return float((wa - wb).norm() / (wb - w0).norm())


# --- stochastic rounding
# ---------------------------------------------------------------------------------------


def one_step(optimizer: str, dtype: torch.dtype, lr: float) -> torch.Tensor:
    """A 64 x 64 weight of ones (bfloat16 or float32) after one step on a gradient of ones: every
    entry takes the same update, so that the entries are 4096 draws of one rounding."""
    w = torch.nn.Parameter(torch.ones(64, 64, dtype=dtype))
    w.grad = torch.ones_like(w)
    if optimizer == "muon":
        group = {"params": [w], "muon": True, "lr": lr, "weight_decay": 0.0}
        MuonAdamW([group], momentum=0.95, ns_dtype=torch.float32).step()
    else:
        from torchao.optim import _AdamW

        _AdamW([w], lr=lr, weight_decay=0.0, bf16_stochastic_round=True).step()
    return w.detach()


def unbiased(draws: torch.Tensor, exact: float) -> bool:
    """Whether the mean of draws (each one of the two bfloat16 neighbours of exact) is exact within
    6 standard deviations of a mean of Bernoulli draws one ulp apart (at most ulp / 2 / sqrt(n))."""
    ulp = 2.0**-8  # the spacing of bfloat16 in [0.5, 1)
    return abs(draws.double().mean().item() - exact) <= 6 * ulp / 2 / draws.numel() ** 0.5


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_stochastic_rounding_keeps_an_update_under_half_an_ulp_in_expectation(optimizer):
    """An update of about 1e-3 on a weight of 1.0 (half a bfloat16 ulp below 1 is 2^-9 ~ 2e-3):
    rounded to nearest it vanishes; stochastically rounded, the mean over 4096 entries is the
    float32 result within 6 sigma."""
    torch.manual_seed(0)
    # Muon's entries are lr * (about 1/64 after Newton-Schulz)
    lr = 1e-3 if optimizer == "adamw" else 0.07
    exact = one_step(optimizer, torch.float32, lr)
    # under half an ulp: nearest loses it
    assert exact.unique().numel() == 1 and 1 - 2.0**-9 < exact[0, 0] < 1
    draws = one_step(optimizer, torch.bfloat16, lr)
    assert draws.dtype == torch.bfloat16 and draws.unique().numel() == 2  # both neighbours drawn
    assert unbiased(draws, exact[0, 0].item())
    # what the update would be rounded to nearest: this check would catch it
    nearest = exact.to(torch.bfloat16)
    assert torch.equal(nearest, torch.ones_like(nearest)) and not unbiased(
        nearest, exact[0, 0].item()
    )


# --- low-bit state and Muon's momentum against float32
# ---------------------------------------------------------


@pytest.mark.parametrize(
    "optimizer, spec, tolerance",
    [
        ("adamw", LowMemConfig(state_bits=8), 0.05),  # measured 0.014
        # 0.22: 4-bit's known early-step error (the second moment near 0)
        ("adamw", LowMemConfig(state_bits=4), 0.35),
        # 0.059 (bfloat16 weights alone: 0.058)
        ("adamw", LowMemConfig(weights_dtype="bfloat16", state_bits=8), 0.1),
        ("muon", LowMemConfig(muon_momentum_dtype="bfloat16"), 0.05),  # 0.017
        # 0.12 (block 64: 0.10; a linear int8 map: 0.08)
        ("muon", LowMemConfig(muon_momentum_dtype="8bit"), 0.2),
        # 0.126
        (
            "muon",
            LowMemConfig(weights_dtype="bfloat16", state_bits=8, muon_momentum_dtype="8bit"),
            0.2,
        ),
    ],
)
def test_a_saver_trains_within_its_tolerance_of_float32(optimizer, spec, tolerance):
    """6 steps of a tiny GPT: the weights end within tolerance (relative to how far float32 training
    moved them) of float32 state's, and the state is kept as asked (quantized, bfloat16). For scale:
    Muon's Newton-Schulz in bfloat16 (torch.optim.Muon's on a GPU) ends 0.033 from float32's;
    Newton-Schulz turns a momentum's small relative errors into full-size directions, so 8-bit
    momentum stays further off than 8-bit AdamW."""
    data = batches(6)
    start, reference, saver = tiny(), tiny(), tiny()
    train(reference, build(reference, optimizer, LowMemConfig()), data)
    optim = build(saver, optimizer, spec)
    train(saver, optim, data)
    assert relative_gap(saver, reference, start) < tolerance
    kinds = {
        type(v).__name__ if type(v) is not torch.Tensor else str(v.dtype)
        for s in optim.state.values()
        for v in s.values()
    }
    want = {8: "OptimState8bit", 4: "OptimState4bit"}.get(spec.state_bits)
    assert want is None or want in kinds
    assert spec.muon_momentum_dtype != "8bit" or "OptimState8bit" in kinds
    assert spec.muon_momentum_dtype != "bfloat16" or "torch.bfloat16" in kinds


# --- the step inside backward
# ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "optimizer, spec",
    [
        ("adamw", LowMemConfig()),
        ("muon", LowMemConfig()),
        ("adamw", LowMemConfig(state_bits=8)),
        ("muon", LowMemConfig(muon_momentum_dtype="8bit")),
    ],
)
def test_in_backward_steps_equal_steps_after_backward(optimizer, spec):
    """Each parameter's update is elementwise (AdamW, fused or torchao's) or its own matrix's
    (Muon), so stepping them one by one in backward's order takes the same arithmetic as all at once
    after it: equal bit for bit, no gradient left behind, and the norm reported is get_total_norm's.
    (Stochastic rounding draws its random numbers in another order: bfloat16 weights are not
    compared here.)"""
    data = batches(3)
    after, inside = tiny(), tiny()
    after_optim, inside_optim = build(after, optimizer, spec), build(inside, optimizer, spec)
    hooks = OptimizerInBackward(inside, inside_optim)
    for tokens in data:
        _, loss = after(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        norm = torch.nn.utils.get_total_norm([p.grad for p in after.parameters()])
        after_optim.step()
        after_optim.zero_grad(set_to_none=True)
        _, loss = inside(tokens[:, :-1], tokens[:, 1:])
        inside_norm, skipped = hooks.backward(loss)
        assert not skipped and all(p.grad is None for p in inside.parameters())
        torch.testing.assert_close(inside_norm, norm, rtol=1e-6, atol=0)
    for (name, a), b in zip(after.state_dict().items(), inside.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


class FixedBatches:
    """What TrainStep asks of its loader, over a list of (B, T + 1) windows."""

    def __init__(self, data: list[torch.Tensor]):
        self.stream = iter(data)

    def state_dict(self) -> dict:
        return {}

    def host_batch(self) -> torch.Tensor:
        return next(self.stream)

    def to_device(self, window: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return window[:, :-1], window[:, 1:]


def train_step(
    model: GPT, optimizer: torch.optim.Optimizer, data, in_backward: bool, **kwargs
) -> TrainStep:
    runtime = Runtime(torch.device("cpu"), "float32", False, "test")
    hooks = OptimizerInBackward(model, optimizer) if in_backward else None
    return TrainStep(
        model,
        optimizer,
        runtime.grad_scaler(),
        runtime,
        FixedBatches(data),
        1,
        0.0,
        hooks,
        **kwargs,
    )


def test_train_step_in_backward_is_train_step_and_its_guard_skips_what_is_not_finite():
    """TrainStep with in_backward against TrainStep: the same losses, norms and weights (bit for
    bit). A non-finite loss skips the whole update before backward; a gradient made infinite skips
    its own parameter's step (its weight and state as they were) while the others step, and the step
    says skipped."""
    data = batches(6)
    plain_model, model = tiny(), tiny()
    plain = train_step(
        plain_model, build(plain_model, "muon", LowMemConfig()), data, in_backward=False
    )
    optimizer = build(model, "muon", LowMemConfig())
    step = train_step(model, optimizer, data, in_backward=True)
    for _ in range(3):
        a, b = plain(), step()
        assert torch.equal(a.loss, b.loss) and not a.skipped and not b.skipped
        torch.testing.assert_close(b.grad_norm, a.grad_norm, rtol=1e-6, atol=0)
    assert all(
        torch.equal(p, q) for p, q in zip(plain_model.parameters(), model.parameters(), strict=True)
    )

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    wpe = model.transformer.wpe.weight
    handle = wpe.register_hook(lambda g: g * float("inf"))
    result = step()
    handle.remove()
    assert result.skipped and not torch.isfinite(result.grad_norm)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert "transformer.wpe.weight" not in changed and len(changed) == len(before) - 1
    assert optimizer.state[wpe]["step"] == 3  # its state not stepped either

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        model.transformer.ln_f.weight[0] = float("nan")  # the loss is NaN
    result = step()
    assert result.skipped and not torch.isfinite(result.loss)
    assert all(p.grad is None for p in model.parameters())
    assert all(
        torch.equal(p, before[n])
        for n, p in model.named_parameters()
        if n != "transformer.ln_f.weight"
    )


# --- checkpoints
# -----------------------------------------------------------------------------------------------

SAVERS = [
    ("adamw", LowMemConfig(state_bits=8)),
    ("adamw", LowMemConfig(weights_dtype="bfloat16", state_bits=4)),
    ("adamw", LowMemConfig(weights_dtype="bfloat16")),
    ("muon", LowMemConfig(muon_momentum_dtype="bfloat16")),
    ("muon", LowMemConfig(weights_dtype="bfloat16", state_bits=8, muon_momentum_dtype="8bit")),
    ("muon", LowMemConfig(state_bits=8, muon_momentum_dtype="8bit", in_backward=True)),
]


def only_plain_tensors(value) -> bool:
    if isinstance(value, torch.Tensor):
        return type(value) is torch.Tensor
    if isinstance(value, dict):
        return all(only_plain_tensors(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(only_plain_tensors(v) for v in value)
    return True


def same(a, b) -> bool:
    """Equal bit for bit, through nested dicts and lists, dtypes included."""
    if isinstance(a, torch.Tensor):
        return type(a) is type(b) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def saved(model: GPT, optimizer: torch.optim.Optimizer) -> dict:
    """A checkpoint's share of the run, written and read back as train.py's are (weights_only)."""
    buffer = io.BytesIO()
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "rng": torch.get_rng_state(),
        },
        buffer,
    )
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("optimizer, spec", SAVERS)
def test_save_load_continue_is_uninterrupted_bit_for_bit(optimizer, spec):
    """2 steps, a checkpoint, 2 more steps; against a fresh model and optimizer loaded from the
    checkpoint (its generator too: stochastic rounding draws from it) taking the same 2: the same
    weights and optimizer state bit for bit, dtypes and formats included; and the checkpoint's
    optimizer state is plain tensors."""
    data = batches(4)
    whole = tiny()
    optim = build(whole, optimizer, spec)
    train(whole, optim, data[:2], spec.in_backward)
    checkpoint = saved(whole, optim)
    train(whole, optim, data[2:], spec.in_backward)
    assert only_plain_tensors(checkpoint["optimizer"])

    resumed = tiny(seed=1)
    resumed_optim = build(resumed, optimizer, spec)
    resumed.load_state_dict(checkpoint["model"])
    resumed_optim.load_state_dict(checkpoint["optimizer"])
    torch.set_rng_state(checkpoint["rng"])
    train(resumed, resumed_optim, data[2:], spec.in_backward)
    assert same(whole.state_dict(), resumed.state_dict())
    assert same(optim.state_dict(), resumed_optim.state_dict())
    kinds = {type(v) for s in optim.state.values() for v in s.values()}
    # OptimStates rebuilt
    assert kinds == {type(v) for s in resumed_optim.state.values() for v in s.values()}


def eight_bit_checkpoint() -> tuple[GPT, torch.optim.Optimizer, dict]:
    model = tiny()
    optim = build(model, "adamw", LowMemConfig(state_bits=8))
    train(model, optim, batches(1))
    return model, optim, saved(model, optim)["optimizer"]


def foreign_states() -> dict:
    """An 8-bit AdamW's checkpoint spoiled in each way, and what its error line must name."""
    from torchao.optim.subclass_8bit import OptimState8bit

    def entry(state: dict) -> dict:
        return next(s["exp_avg"] for s in state["state"].values() if isinstance(s["exp_avg"], dict))

    def nan_scale(state):
        entry(state)["scale"][0] = float("nan")

    def float_codes(state):
        entry(state)["codes"] = entry(state)["codes"].float()

    def subclass(state):  # torchao's own object, which weights_only admits once torchao is imported
        s = next(s for s in state["state"].values() if isinstance(s["exp_avg"], dict))
        s["exp_avg"] = OptimState8bit.zeros(s["exp_avg"]["codes"].shape, True, 256)

    def other_groups(state):
        state["param_groups"][1]["params"] = state["param_groups"][1]["params"][:-1]

    return {
        nan_scale: "not finite and >= 0 (corrupt)",
        float_codes: "codes that are not torch.uint8",
        subclass: "not plain tensors: a foreign file's",
        other_groups: "has groups of",
    }


@pytest.mark.parametrize(
    "spoil, words", list(foreign_states().items()), ids=lambda x: getattr(x, "__name__", "")
)
def test_a_corrupt_or_foreign_low_bit_state_is_one_error_line_and_loads_nothing(spoil, words):
    model, optim, state = eight_bit_checkpoint()
    before = saved(model, optim)["optimizer"]
    spoil(state)
    # as train/checkpoint.restore_training checks it before loading
    with pytest.raises(UserError) as error:
        check_saved_state(optim, state)
    assert words in str(error.value) and "\n" not in str(error.value)
    assert str(error.value).startswith("the checkpoint's optimizer state ")
    assert same(saved(model, optim)["optimizer"], before)


@pytest.mark.parametrize(
    "source, words",
    [
        (LowMemConfig(state_bits=4), "keeps exp_avg in 4-bit, this run in 8-bit"),
        (LowMemConfig(), "in float32, this run in 8-bit"),
    ],
)
def test_a_state_of_another_precision_is_refused_in_one_line(source, words):
    """A 4-bit or a float32 (today's) AdamW checkpoint resumed with state_bits=8: one line naming
    both."""
    model = tiny()
    other = build(model, "adamw", source)
    train(model, other, batches(1))
    state = saved(model, other)["optimizer"]
    _, optim, _ = eight_bit_checkpoint()
    with pytest.raises(UserError, match=words):
        check_saved_state(optim, state)


# --- refusals
# --------------------------------------------------------------------------------------------------


def run(spec: LowMemConfig, **settings) -> SimpleNamespace:
    """What lowmem_rules reads of a run: one process on the CPU in float32, AdamW unclipped, one
    micro-batch."""
    plain = dict(
        optimizer="adamw",
        device="cpu",
        dtype="float32",
        grad_clip=0.0,
        gradient_accumulation_steps=1,
    )
    return SimpleNamespace(lowmem=spec, **plain | dict(parallelism="ddp") | settings)


@pytest.mark.parametrize(
    "spec, settings, ranks, words",
    [
        (LowMemConfig(in_backward=True), dict(grad_clip=1.0), 1, "grad_clip=1.0 cannot clip it"),
        (
            LowMemConfig(in_backward=True),
            dict(gradient_accumulation_steps=4),
            1,
            "gradient_accumulation_steps=4",
        ),
        (LowMemConfig(in_backward=True), {}, 2, "before DDP has reduced it"),
        (LowMemConfig(in_backward=True), dict(dtype="float16"), 1, "before the GradScaler"),
        (LowMemConfig(offload=True), {}, 1, "this run is on cpu"),
        (
            LowMemConfig(state_bits=8),
            dict(parallelism="fsdp"),
            2,
            "state_bits=8 is for whole tensors",
        ),
        (LowMemConfig(weights_dtype="bfloat16"), {}, 2, "DDP's replicas would drift apart"),
    ],
)
def test_each_conflict_is_one_error_line(spec, settings, ranks, words, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", str(ranks))
    with pytest.raises(ValueError) as error:
        lowmem_rules(run(spec, **settings))
    assert words in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    "spec, grad_clip, words",
    [
        (LowMemConfig(offload=True, state_bits=8), 0.0, "not state_bits=8"),
        (LowMemConfig(offload=True), 1.0, "before grad_clip=1.0 could clip it"),
        (LowMemConfig(offload=True, in_backward=True), 0.0, "from its own copies of the gradients"),
    ],
)
def test_each_conflict_of_the_offload_on_cuda_is_one_error_line(spec, grad_clip, words):
    with pytest.raises(ValueError, match=words):
        offload_rules(spec, "cuda", grad_clip)
    offload_rules(LowMemConfig(offload=True), "cuda", 0.0)  # what can run
    muon_offloaded = SimpleNamespace(optim=optim_config("muon"), lowmem=LowMemConfig(offload=True))
    # its row's
    with pytest.raises(ValueError, match="optimizer='muon' does not keep offload=True"):
        optimizer_rules(muon_offloaded)


def test_a_saver_setting_out_of_its_choices_is_one_error_line():
    from configurator import configure

    refusals = (
        ("--state_bits=16", "state_bits must be one of 32, 8, 4, not 16"),
        ("--weights_dtype=float16", "weights_dtype must be one of float32, bfloat16"),
    )
    for flag, words in refusals:
        with pytest.raises(UserError, match=words):
            configure([flag], lowmem=LowMemConfig)


def test_what_can_run_is_not_refused_and_a_wrong_build_raises(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    lowmem_rules(run(LowMemConfig(), parallelism="fsdp", grad_clip=1.0, dtype="float16"))
    monkeypatch.setenv("WORLD_SIZE", "1")
    every = LowMemConfig(
        weights_dtype="bfloat16", state_bits=4, muon_momentum_dtype="8bit", in_backward=True
    )
    lowmem_rules(run(every, optimizer="muon", dtype="bfloat16"))
    # bfloat16 asked, the weights left in float32
    with pytest.raises(ValueError, match="cast_weights"):
        build_optimizer(tiny(), optim_config("adamw"), LowMemConfig(weights_dtype="bfloat16"))
    model = tiny()
    optim = build(model, "adamw", LowMemConfig())
    runtime, hooks = (
        Runtime(torch.device("cpu"), "float32", False, "test"),
        OptimizerInBackward(model, optim),
    )
    # TrainStep trusts what lowmem_rules refuses
    with pytest.raises(AssertionError, match="one micro-batch"):
        TrainStep(model, optim, runtime.grad_scaler(), runtime, FixedBatches([]), 2, 0.0, hooks)


# --- the schedule, the defaults, the bytes
# -------------------------------------------------------------------------


def test_set_lr_fills_a_tensor_lr_with_the_float_it_would_set():
    """torchao's groups keep their lr tensor (the same object, else torchao refuses to step), filled
    with what a float group gets from the same call; float groups get floats, as today."""
    floats_model, tensors_model = tiny(), tiny()
    floats = build(floats_model, "muon", LowMemConfig())
    tensors = build(tensors_model, "muon", LowMemConfig(state_bits=8))
    lr_tensors = [g["lr"] for g in tensors.param_groups if not g["muon"]]
    assert all(isinstance(lr, torch.Tensor) for lr in lr_tensors)
    for lr in (3e-3, 1.234e-4, 0.0):
        set_lr(floats, lr, HYPER["learning_rate"])
        set_lr(tensors, lr, HYPER["learning_rate"])
        for f, t in zip(floats.param_groups, tensors.param_groups, strict=True):
            assert type(f["lr"]) is float
            want = torch.tensor(f["lr"], dtype=torch.float32)
            assert (
                torch.equal(t["lr"], want)
                if isinstance(t["lr"], torch.Tensor)
                else t["lr"] == f["lr"]
            )
    # the same objects
    assert [g["lr"] for g in tensors.param_groups if not g["muon"]] == lr_tensors
    train(tensors_model, tensors, batches(1))  # torchao steps


def test_no_saver_is_todays_optimizer_bit_for_bit():
    data = batches(3)
    for optimizer in ("adamw", "muon"):
        today, saver = tiny(), tiny()
        train(today, build_optimizer(today, optim_config(optimizer)), data)
        built = build(saver, optimizer, LowMemConfig())
        assert not built._optimizer_state_dict_post_hooks  # no codec: its state_dict is today's
        train(saver, built, data)
        assert same(today.state_dict(), saver.state_dict())


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
@pytest.mark.parametrize("bits", [8, 4])
def test_adam_eps_reaches_torchaos_adamw(optimizer, bits):
    """torchao's AdamW, alone or inside Muon, takes adam_eps: it trains as it does given that eps in
    its groups, and not as it does with the default's 1e-8."""
    spec, data = LowMemConfig(state_bits=bits), batches(2)
    runs = []
    for eps, given in ((1e-2, True), (1e-2, False), (1e-8, False)):
        model = tiny()
        cast_weights(model, spec)
        cfg = OptimConfig(optimizer=optimizer, **HYPER | ({"adam_eps": eps} if given else {}))
        built = build_optimizer(model, cfg, spec)
        if not given:  # the reference: today's build, its AdamW groups given the eps by hand
            for group in built.param_groups:
                if not group.get("muon"):
                    group["eps"] = eps
        assert {g["eps"] for g in built.param_groups if not g.get("muon")} == {eps}
        train(model, built, data)
        runs.append(model.state_dict())
    assert same(runs[0], runs[1]) and not same(runs[0], runs[2])


def test_the_training_state_is_counted_once_per_storage_by_part():
    """A tied weight counted once; a float32 AdamW's state 8 bytes per parameter plus its step
    counters; torchao's 8-bit state counted by its codes, scales and maps, about 2 bytes per
    parameter; bfloat16 weights 2 + 2."""
    model = tiny()
    optim = build(model, "adamw", LowMemConfig())
    train(model, optim, batches(1))
    params = sum(p.numel() for p in model.parameters())  # wte and lm_head are one Parameter
    counters = sum(s["step"].untyped_storage().nbytes() for s in optim.state.values())
    assert training_state_bytes(model, optim) == dict(
        weights=4 * params, grads=0, optimizer=8 * params + counters, params=params
    )
    _, loss = model(*FixedBatches(batches(1)).to_device(batches(1)[0]))
    loss.backward()
    assert training_state_bytes(model, optim)["grads"] == 4 * params

    model = tiny()
    optim = build(model, "adamw", LowMemConfig(weights_dtype="bfloat16", state_bits=8))
    train(model, optim, batches(1))
    counted = training_state_bytes(model, optim)
    assert counted["weights"] == 2 * params and counted["grads"] == 0
    # + scales, 1 KB maps, small tensors kept plain
    assert 2.0 * params < counted["optimizer"] < 2.5 * params
    w = model.transformer.wte.weight
    assert storage_bytes([w, w[:4], w.detach().T], set()) == 2 * w.numel()  # views hold one storage
