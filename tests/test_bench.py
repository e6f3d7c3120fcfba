"""The memory savers against the plain paths, the fused switch of configure_optimizers, and what train.py gained
with them: the savers as settings, a profile and the run manifest."""

import json
from dataclasses import replace

import pytest
import torch
from conftest import ROOT, TINY_MODEL, run_script

from common import git_state
from model import GPT, GPTConfig

SMALL = GPTConfig(block_size=16, vocab_size=80, n_layer=2, n_head=4, n_embd=32, dropout=0.0)


def loss_and_grads(config: GPTConfig, ignore: bool = True) -> tuple:
    """The loss, every parameter's gradient, the shapes autograd saved for backward and the logits, from a fixed
    model and batch."""
    torch.manual_seed(0)
    model = GPT(config)
    g = torch.Generator().manual_seed(1)
    x, y = (torch.randint(config.vocab_size, (4, config.block_size), generator=g) for _ in range(2))
    if ignore:
        y[0, :5] = -1  # ignored targets count in neither the sum nor the mean
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        logits, loss = model(x, y)
    loss.backward()
    return loss, {name: p.grad for name, p in model.named_parameters()}, saved, logits


@pytest.mark.parametrize("chunk", [1, 7, 16, 64, 1000])  # 7 does not divide B*T = 64; 1000 is one chunk
def test_chunked_loss_equals_the_plain_loss_and_gradients(chunk):
    loss, grads, saved, logits = loss_and_grads(SMALL)
    loss_c, grads_c, saved_c, logits_c = loss_and_grads(replace(SMALL, loss_chunk=chunk))
    torch.testing.assert_close(loss_c, loss, rtol=1e-6, atol=1e-6)
    for name, grad in grads.items():
        torch.testing.assert_close(grads_c[name], grad, rtol=1e-5, atol=1e-7, msg=name)
    assert logits is not None and logits_c is None
    kept_logits = lambda shapes: [s for s in shapes if len(s) and s[-1] == SMALL.vocab_size]
    assert sum(s.numel() for s in kept_logits(saved)) >= 4 * 16 * 80  # the plain path keeps all the logits
    assert kept_logits(saved_c) == []  # the chunked one keeps none


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_activation_checkpointing_gives_the_same_gradients(dropout):
    config = replace(SMALL, dropout=dropout)
    loss, grads, saved, _ = loss_and_grads(config)
    loss_c, grads_c, saved_c, _ = loss_and_grads(replace(config, activation_checkpointing=True))
    torch.testing.assert_close(loss_c, loss)
    for name, grad in grads.items():
        torch.testing.assert_close(grads_c[name], grad, rtol=1e-5, atol=1e-7, msg=name)
    # the blocks' activations are recomputed in backward, not kept
    assert sum(s.numel() for s in saved_c) < sum(s.numel() for s in saved) / 2


def test_both_memory_savers_together_still_learn():
    torch.manual_seed(0)
    model = GPT(replace(SMALL, loss_chunk=10, activation_checkpointing=True))
    optimizer = model.configure_optimizers(0.0, 1e-2, (0.9, 0.95), "cpu")
    x = torch.randint(80, (4, 16), generator=torch.Generator().manual_seed(2))
    losses = []
    for _ in range(20):
        _, loss = model(x, x)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 1.0


def test_negative_loss_chunk_is_refused():
    with pytest.raises(ValueError, match="loss_chunk"):
        replace(SMALL, loss_chunk=-1)


def test_configure_optimizers_fused_switch():
    model = GPT(SMALL)
    assert model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu").defaults["fused"]
    assert not model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu", fused=False).defaults["fused"]


def test_git_state_outside_a_checkout(tmp_path):
    assert git_state(tmp_path) == ("unknown", None)
    commit, dirty = git_state(ROOT)
    assert len(commit) == 40 and isinstance(dirty, bool)


def test_train_with_memory_savers_profile_and_manifest(tiny_data, tmp_path):
    result = run_script(
        "train.py",
        *TINY_MODEL,
        f"--data_dir={tiny_data}",
        "--dataset=tiny",
        f"--out_dir={tmp_path}",
        "--loss_chunk=100",
        "--activation_checkpointing=True",
        "--profile=True",
        "--max_iters=6",
        "--eval_interval=6",
        "--eval_iters=2",
        "--log_interval=1",
    )
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["iter"] for r in records if "loss" in r] == [1, 2, 3, 4, 5, 6]
    assert all(0 < r["loss"] < 10 for r in records if "loss" in r) and records[-1]["val_loss"] > 0
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["settings"]["loss_chunk"] == 100 and manifest["model_args"]["activation_checkpointing"] is True
    assert manifest["device"] == "cpu" and manifest["world_size"] == 1 and len(manifest["git_commit"]) == 40
    assert (tmp_path / "trace.json").is_file() and "Self CPU" in result.stdout
    checkpoint = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert checkpoint["model_args"]["loss_chunk"] == 100
