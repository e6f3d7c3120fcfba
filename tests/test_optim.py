"""nanogpt_perf/optim.py: the Muon update against a plain float64 reference and against
torch.optim.Muon, the AdamW share against torch.optim.AdamW, the split of a GPT's parameters, the
schedule's ratio, the state dict's round trip, a tiny GPT trained by it, and the 'adamw' option as
configure_optimizers' AdamW bit for bit."""

import io
import math
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from conftest import HYPER, assert_one_line_error, refuse_train
from model import GPT, GPTConfig, decay_groups
from nanogpt_perf.config import build, flat_defaults
from nanogpt_perf.errors import UserError
from nanogpt_perf.lowmem import LowMemConfig
from nanogpt_perf.optim import (
    BASE_LR,
    NS_COEFFICIENTS,
    NS_EPS,
    OPTIMIZERS,
    Formats,
    MuonAdamW,
    OptimConfig,
    OptimizerKind,
    adamw_is_fused,
    build_optimizer,
    gram_is_cheaper,
    gram_newton_schulz,
    newton_schulz,
    optimizer_rules,
    orthogonalize,
    set_lr,
    split_parameters,
)


def optim(kind: str, **changes) -> OptimConfig:
    return OptimConfig(optimizer=kind, **(HYPER | changes))


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These tiny matrices run fastest on one thread (and never wait for a busy second core)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=64))


def reference_muon(W, grads, lr, momentum, weight_decay, scale):
    """Muon as Keller Jordan's post writes it, in float64: B <- mu B + g; Nesterov's g + mu B; X =
    that over its Frobenius norm, on the wide side; 5 steps of X <- aX + b(XX^T)X + c(XX^T)^2 X; W
    <- W(1 - lr wd) - lr scale X."""
    a, b, c = 3.4445, -4.7750, 2.0315
    W, B = W.double(), torch.zeros_like(W, dtype=torch.float64)
    for g in grads:
        g = g.double()
        B = momentum * B + g
        X = g + momentum * B
        X = X.T if X.shape[0] > X.shape[1] else X
        X = X / torch.linalg.matrix_norm(X)
        for _ in range(5):
            A = X @ X.T
            X = a * X + b * A @ X + c * A @ A @ X
        X = X.T if W.shape[0] > W.shape[1] else X
        W = W * (1 - lr * weight_decay) - lr * scale(*W.shape) * X
    return W


@pytest.mark.parametrize(
    "adjust, scale",
    [
        ("original", lambda r, c: math.sqrt(max(1, r / c))),
        ("match_rms_adamw", lambda r, c: 0.2 * math.sqrt(max(r, c))),
    ],
)
def test_muon_update_equals_a_plain_reference(adjust, scale):
    torch.manual_seed(0)
    shapes = [(12, 5), (5, 12), (7, 7)]
    start = [torch.randn(s, dtype=torch.float64) for s in shapes]
    grads = [[torch.randn(s, dtype=torch.float64) for s in shapes] for _ in range(4)]
    params = [nn.Parameter(w.clone()) for w in start]
    group = {
        "params": params,
        "muon": True,
        "lr": 0.05,
        "weight_decay": 0.2,
        "adjust_lr_fn": adjust,
    }
    optimizer = MuonAdamW([group], momentum=0.9, ns_dtype=torch.float64)
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad = g.clone()
        optimizer.step()
    for i, p in enumerate(params):
        expected = reference_muon(start[i], [g[i] for g in grads], 0.05, 0.9, 0.2, scale)
        torch.testing.assert_close(p.detach(), expected, rtol=1e-10, atol=1e-12)
        assert not torch.allclose(p.detach(), start[i], atol=0.05)  # it moved


@pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon needs torch >= 2.9")
def test_bfloat16_newton_schulz_is_torch_muon_bit_for_bit_and_a_cpu_takes_float32():
    torch.manual_seed(0)
    shapes = [(24, 8), (8, 24), (16, 16)]
    start = [torch.randn(s) for s in shapes]
    grads = [[torch.randn(s) for s in shapes] for _ in range(3)]
    runs = {}
    for name, ns_dtype in (
        ("bf16", torch.bfloat16),
        ("default", None),
        ("fp32", torch.float32),
        ("torch", None),
    ):
        params = [nn.Parameter(w.clone()) for w in start]
        if name == "torch":
            optimizer = torch.optim.Muon(params, lr=0.02, weight_decay=0.1, momentum=0.95)
        else:
            group = {"params": params, "muon": True, "lr": 0.02, "weight_decay": 0.1}
            optimizer = MuonAdamW([group], momentum=0.95, ns_dtype=ns_dtype)
        for step_grads in grads:
            for p, g in zip(params, step_grads, strict=True):
                p.grad = g.clone()
            optimizer.step()
        runs[name] = [p.detach() for p in params]
    assert all(torch.equal(a, b) for a, b in zip(runs["bf16"], runs["torch"], strict=True))
    assert all(torch.equal(a, b) for a, b in zip(runs["default"], runs["fp32"], strict=True))
    assert not any(torch.equal(a, b) for a, b in zip(runs["fp32"], runs["bf16"], strict=True))
    # the same update but for bf16's rounding
    for a, b in zip(runs["fp32"], runs["bf16"], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-3)


def plain_newton_schulz(X, steps):
    """Keller Jordan's steps as his post writes them."""
    a, b, c = NS_COEFFICIENTS
    for _ in range(steps):
        A = X @ X.T
        X = a * X + b * A @ X + c * A @ A @ X
    return X


@pytest.mark.parametrize(
    "shape, steps", [((128, 512), 4), ((128, 384), 5), ((16, 40), 3), ((8, 9), 5)]
)
def test_gram_newton_schulz_equals_the_plain_steps(shape, steps):
    torch.manual_seed(0)
    X = torch.randn(shape, dtype=torch.float64)
    X = X / X.norm()
    torch.testing.assert_close(
        gram_newton_schulz(X, NS_COEFFICIENTS, steps), plain_newton_schulz(X, steps)
    )
    X32 = X.float()
    torch.testing.assert_close(
        gram_newton_schulz(X32, NS_COEFFICIENTS, steps),
        plain_newton_schulz(X, steps).float(),
        rtol=0,
        atol=1e-5,
    )


@pytest.mark.parametrize(
    "m, n, steps", [(128, 512, 4), (128, 384, 4), (128, 128, 4), (128, 256, 3), (64, 96, 5)]
)
def test_the_form_chosen_is_the_one_flopcounter_counts_fewer_flops_for(m, n, steps):
    X = torch.randn(m, n) / (m * n) ** 0.5
    flops = {}
    for form, run in (("gram", lambda: gram_newton_schulz(X, NS_COEFFICIENTS, steps)),
                      ("plain", lambda: newton_schulz(X, NS_COEFFICIENTS, steps))):  # fmt: skip
        with FlopCounterMode(display=False) as counter:
            run()
        flops[form] = counter.get_total_flops()
    assert gram_is_cheaper(m, n, steps) == (flops["gram"] < flops["plain"])
    G = torch.randn(n, m)  # tall: orthogonalize works on its transpose
    torch.testing.assert_close(
        orthogonalize(G, NS_COEFFICIENTS, steps, 1e-7, torch.float32),
        plain_newton_schulz(G.double().T / G.double().norm(), steps).T.float(), rtol=0, atol=1e-5,
    )  # fmt: skip


def names_of(model: nn.Module, groups: list[dict]) -> list[list[str]]:
    names = {id(p): n for n, p in model.named_parameters()}
    return [sorted(names[id(p)] for p in g["params"]) for g in groups]


def test_the_split_takes_every_parameter_once_on_its_side():
    model = tiny()
    muon, rest = split_parameters(model)
    # AdamW's, as configure_optimizers splits them
    decay, no_decay = names_of(model, decay_groups(rest, 0.1))
    blocks = [
        f"transformer.h.{i}.{m}.weight"
        for i in range(2)
        for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    ]
    assert sorted(muon) == sorted(blocks)
    assert decay == ["transformer.wpe.weight", "transformer.wte.weight"]  # wte is the tied lm_head
    assert no_decay == sorted(n for n, p in model.named_parameters() if p.dim() == 1)
    model.lm_head.weight = nn.Parameter(model.lm_head.weight.detach().clone())  # untied
    model.transformer.wpe.weight.requires_grad_(False)
    optimizer = build_optimizer(model, optim("muon"))
    in_groups = [p for g in optimizer.param_groups for p in g["params"]]
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert len(in_groups) == len({id(p) for p in in_groups}) == len(trainable)
    assert {id(p) for p in in_groups} == {id(p) for p in trainable}
    kinds = [
        (g["muon"], g["lr"], g["weight_decay"], names)
        for g, names in zip(
            optimizer.param_groups, names_of(model, optimizer.param_groups), strict=True
        )
    ]
    assert kinds[0] == (True, 0.03, 0.05, sorted(blocks))
    assert kinds[1] == (False, 3e-3, 0.1, ["lm_head.weight", "transformer.wte.weight"])
    assert kinds[2] == (False, 3e-3, 0.0, no_decay)


def test_adamw_share_is_torch_adamw_and_every_group_follows_the_schedule():
    model, twin = tiny(), tiny()
    optimizer = build_optimizer(model, optim("muon"))
    muon, rest = split_parameters(twin)
    groups = [
        {"params": [p for p in rest if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0},
    ]
    reference = torch.optim.AdamW(groups, lr=3e-3, betas=(0.9, 0.95), fused=True)
    for lr in (1e-3, 3e-3, 2e-3):
        set_lr(optimizer, lr, HYPER["learning_rate"])
        set_lr(reference, lr, HYPER["learning_rate"])
        # configure_optimizers' groups: lr as is
        assert [g["lr"] for g in reference.param_groups] == [lr, lr]
        assert optimizer.param_groups[0]["lr"] == pytest.approx(0.03 * lr / 3e-3, rel=1e-15)
        assert [g["lr"] for g in optimizer.param_groups[1:]] == pytest.approx([lr, lr], rel=1e-15)
        for p, q in zip(model.parameters(), twin.parameters(), strict=True):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        optimizer.step()
        reference.step()
        for name, q in twin.named_parameters():
            if name not in muon:
                assert torch.equal(model.get_parameter(name), q), name
    assert [g[BASE_LR] for g in optimizer.param_groups] == [0.03, 3e-3, 3e-3]


def batches(n: int, seed: int = 0) -> list[torch.Tensor]:
    """Windows of a learnable sequence (a fixed random cycle of 64 tokens), 33 tokens each."""
    cycle = torch.randperm(64, generator=torch.Generator().manual_seed(0)).repeat(4)
    starts = torch.randint(0, 64, (n, 8), generator=torch.Generator().manual_seed(seed))
    return [torch.stack([cycle[s : s + 33] for s in row]) for row in starts]


def train(
    model: GPT, optimizer: torch.optim.Optimizer, data: list[torch.Tensor], first: int = 0
) -> list[float]:
    losses = []
    for it, x in enumerate(data, start=first):
        set_lr(optimizer, HYPER["learning_rate"] * (1 - it / 40), HYPER["learning_rate"])
        _, loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def test_adamw_is_configure_optimizers_bit_for_bit():
    data = batches(4)
    a, b = tiny(), tiny()
    built = build_optimizer(a, optim("adamw"))
    plain = b.configure_optimizers(
        HYPER["weight_decay"], HYPER["learning_rate"], (0.9, 0.95), fused=True
    )
    assert type(built) is torch.optim.AdamW and built.state_dict() == plain.state_dict()
    assert train(a, built, data) == train(b, plain, data)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_adam_eps_is_torch_adamw_built_with_that_epsilon():
    """adam_eps reaches configure_optimizers' AdamW, which trains as torch.optim.AdamW given that
    eps (and not as the default's 1e-8), and Muon's AdamW groups; the Muon group keeps
    Newton-Schulz's own eps."""
    data = batches(4)
    a, b, c = tiny(), tiny(), tiny()
    built = build_optimizer(a, optim("adamw", adam_eps=1e-3))
    groups = decay_groups(b.parameters(), HYPER["weight_decay"])
    plain = torch.optim.AdamW(
        groups, lr=HYPER["learning_rate"], betas=(0.9, 0.95), eps=1e-3, fused=True
    )
    default = build_optimizer(c, optim("adamw"))
    # torch's default: today's runs as they were
    assert [g["eps"] for g in default.param_groups] == [1e-8, 1e-8]
    # a group added later takes it too
    assert built.defaults["eps"] == 1e-3 and default.defaults["eps"] == 1e-8
    assert train(a, built, data) == train(b, plain, data) != train(c, default, data)
    muon = build_optimizer(tiny(), optim("muon", adam_eps=1e-3))
    assert [g["eps"] for g in muon.param_groups] == [NS_EPS, 1e-3, 1e-3]


def test_adamw_is_fused_where_the_device_has_the_kernel_and_plain_elsewhere():
    """One rule for configure_optimizers' AdamW and Muon's: fused on a CPU; unfused on a device
    without the fused kernel (meta here), where torch itself takes fused=True and fails at the first
    step."""
    cpu = tiny()
    assert adamw_is_fused(cpu.configure_optimizers(0.1, 1e-3, (0.9, 0.95)))
    assert adamw_is_fused(build_optimizer(cpu, optim("muon")))
    with torch.device("meta"):
        meta = tiny()
    assert not adamw_is_fused(meta.configure_optimizers(0.1, 1e-3, (0.9, 0.95)))
    assert not adamw_is_fused(build_optimizer(meta, optim("muon")))
    p = meta.lm_head.weight
    p.grad = torch.zeros_like(p)
    with pytest.raises(RuntimeError, match="fused=True"):
        torch.optim.AdamW([p], fused=True).step()  # what asking first spares


def test_a_saved_muon_optimizer_continues_bit_for_bit():
    data = batches(6)
    straight = tiny()
    straight_losses = train(straight, build_optimizer(straight, optim("muon")), data)
    first = tiny()
    optimizer = build_optimizer(first, optim("muon"))
    losses = train(first, optimizer, data[:3])
    buffer = io.BytesIO()
    torch.save({"model": first.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    resumed = tiny(seed=1)
    resumed.load_state_dict(saved["model"])
    fresh = build_optimizer(resumed, optim("muon"))
    fresh.load_state_dict(saved["optimizer"])
    losses += train(resumed, fresh, data[3:], first=3)
    assert losses == straight_losses
    assert all(
        torch.equal(p, q) for p, q in zip(resumed.parameters(), straight.parameters(), strict=True)
    )
    # the settings' learning rates win over the checkpoint's, as nanoGPT's lr does; other kinds of
    # state are refused
    other = build_optimizer(tiny(), optim("muon", muon_lr=0.01))
    other.load_state_dict(saved["optimizer"])
    assert [g[BASE_LR] for g in other.param_groups] == [0.01, 3e-3, 3e-3]
    assert len(other.state) == len(saved["optimizer"]["state"]) == len(list(resumed.parameters()))
    with pytest.raises(ValueError, match="not Muon's"):
        other.load_state_dict(build_optimizer(tiny(), optim("adamw")).state_dict())
    with pytest.raises(ValueError):
        build_optimizer(tiny(), optim("adamw")).load_state_dict(saved["optimizer"])


def test_a_tiny_gpt_learns_with_muon():
    """30 steps: the loss falls from about ln(64) by over a third, and well below where AdamW's
    share alone (the embeddings and vectors, Muon's lr 0) takes it."""
    final = {}
    for muon_lr in (0.0, HYPER["muon_lr"]):
        model = tiny()
        losses = train(model, build_optimizer(model, optim("muon", muon_lr=muon_lr)), batches(30))
        assert losses[0] > 4.1
        final[muon_lr] = sum(losses[-5:]) / 5
    assert final[HYPER["muon_lr"]] < min(0.7 * 4.1, final[0.0] - 0.2)


def test_bad_choices_and_fsdp_shards_are_refused(tmp_path):
    settings = lambda **changes: build(
        {"optim": OptimConfig}, flat_defaults({"optim": OptimConfig}) | changes
    )
    with pytest.raises(UserError, match="optimizer must be one of adamw, muon, not 'sgd'"):
        settings(optimizer="sgd")
    with pytest.raises(UserError, match=r"muon_momentum must be in \[0, 1\), not 1.0"):
        settings(optimizer="muon", muon_momentum=1.0)
    from torch.distributed.tensor import DeviceMesh, Shard, distribute_tensor

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        model = tiny()
        fc = model.transformer.h[0].mlp.c_fc
        fc.weight = nn.Parameter(
            distribute_tensor(fc.weight.detach(), DeviceMesh("cpu", [0]), [Shard(0)])
        )
        assert build_optimizer(model, optim("adamw")) is not None  # AdamW takes shards
        with pytest.raises(ValueError, match="FSDP's shards"):
            build_optimizer(model, optim("muon"))
    finally:
        dist.destroy_process_group()


def toy_sgd(formats: Formats) -> OptimizerKind:
    """An optimizer added as a row of the table: torch's SGD, keeping the formats given (no state of
    its own)."""

    def build(model, cfg, spec, ns_dtype):
        return torch.optim.SGD(model.parameters(), lr=cfg.learning_rate)

    return OptimizerKind(build, formats, lambda spec, matrix: 0)


def test_an_optimizer_is_a_row_refused_a_state_format_it_lacks(monkeypatch, tiny_data, tmp_path):
    """A row is all an optimizer needs: the settings take its name and the builder builds it; a
    saver's format its row lacks is refused by train.py in one line naming both, nothing written,
    and by the builder itself."""
    monkeypatch.setitem(OPTIMIZERS, "sgd", toy_sgd(Formats()))
    assert isinstance(build_optimizer(tiny(), optim("sgd")), torch.optim.SGD)
    refused = refuse_train(tiny_data, tmp_path / "out", "--optimizer=sgd", "--state_bits=8")
    assert_one_line_error(
        refused, "optimizer='sgd' does not keep state_bits=8", "its state_bits: 32"
    )
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="optimizer='sgd' does not keep weights_dtype='bfloat16'"):
        build_optimizer(tiny().bfloat16(), optim("sgd"), LowMemConfig(weights_dtype="bfloat16"))
    # its row: 8 bits too
    monkeypatch.setitem(OPTIMIZERS, "sgd", toy_sgd(Formats(state_bits=(32, 8))))
    optimizer_rules(SimpleNamespace(optim=optim("sgd"), lowmem=LowMemConfig(state_bits=8)))


class EightBitSGD(torch.optim.SGD):
    """SGD with its momentum in 8 bits, as a trail would add it to optim.py: it declares the state
    it keeps (state_like), which is all a resume's checks need of it."""

    def __init__(self, params, lr: float):
        super().__init__(params, lr=lr, momentum=0.9)

    @torch.no_grad()
    def step(self) -> None:
        from nanogpt_perf.lowbit import dequantized, new_momentum

        for p in (p for g in self.param_groups for p in g["params"] if p.grad is not None):
            buffer = self.state[p].setdefault("momentum_buffer", new_momentum(p, "8bit"))
            m = dequantized(buffer).mul_(0.9).add_(p.grad)
            buffer.copy_(m)
            p.add_(m, alpha=-self.param_groups[0]["lr"])

    def state_like(self, p: torch.Tensor, device) -> dict:
        from nanogpt_perf.lowbit import new_momentum

        return {"momentum_buffer": new_momentum(torch.empty_like(p, device=device), "8bit")}


def test_an_optimizer_with_a_low_bit_state_of_its_own_resumes_by_declaring_it(monkeypatch):
    """The low-bit state's checkpoint encoding is the optimizer's: a new row whose optimizer keeps
    an 8-bit momentum saves it as plain data and passes a resume's checks because it says what it
    keeps (state_like); the same optimizer without that declaration is refused in one line."""
    pytest.importorskip("torchao")
    from nanogpt_perf.lowmem_state import check_saved_state

    build_sgd = lambda model, cfg, spec, ns_dtype: EightBitSGD(
        model.parameters(), cfg.learning_rate
    )
    monkeypatch.setitem(
        OPTIMIZERS, "sgd", OptimizerKind(build_sgd, Formats(state_bits=(32, 8)), None)
    )
    spec, model = LowMemConfig(state_bits=8), tiny()
    optimizer = build_optimizer(model, optim("sgd"), spec)
    for _ in range(2):
        model(torch.randint(64, (2, 32)), torch.randint(64, (2, 32)))[1].backward()
        optimizer.step()
    state = optimizer.state_dict()
    encoded = [v for v in state["state"].values() if isinstance(v["momentum_buffer"], dict)]
    assert encoded and all(v["momentum_buffer"]["codes"].dtype == torch.uint8 for v in encoded)
    again = build_optimizer(tiny(), optim("sgd"), spec)
    check_saved_state(again, state)
    again.load_state_dict(state)
    monkeypatch.delattr(EightBitSGD, "state_like")
    with pytest.raises(
        UserError, match="holds 'momentum_buffer', which this optimizer does not keep"
    ):
        check_saved_state(build_optimizer(tiny(), optim("sgd"), spec), state)
