"""FSDP2 (nanogpt_perf.train.parallel) through the shared TrainStep: 2 sharded gloo ranks against
one process with all the micro-batches, with activation checkpointing, compile and bf16 mixed
precision; checkpoints of the full state that resume exactly and load into a plain GPT without
torch.distributed."""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from conftest import run_script
from model import GPT, GPTConfig
from nanogpt_perf.guard.checkpoint import load_checkpoint
from nanogpt_perf.runtime import resolve_runtime
from nanogpt_perf.train.parallel import full_state, load_full_state, wrap_model

K = 2  # micro-batches per rank and step; the single process takes 2K


def run(out: Path, *options: str, ranks: int = 2) -> dict:
    """tests/fsdp_parity.py alone (ranks=1) or under torchrun; its results."""
    torchrun = (
        ("-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}")
        if ranks > 1
        else ()
    )
    result = run_script(*torchrun, "tests/fsdp_parity.py", str(out), str(K), *options)
    assert result.returncode == 0, result.stderr
    return torch.load(out / "result.pt", weights_only=True)


@pytest.fixture(scope="module")
def one(tmp_path_factory) -> dict:
    """One process, no wrapper, fp32: the reference."""
    return run(tmp_path_factory.mktemp("one"), ranks=1)


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("fsdp")
    return run(out), out


def assert_same_training(a: dict, b: dict, rtol: float, atol: float) -> None:
    """The same step losses, gradient norms (clipping active) and weights after 2 and 3 steps."""
    torch.testing.assert_close(
        torch.tensor(b["losses"]), torch.tensor(a["losses"]), rtol=rtol, atol=atol
    )
    torch.testing.assert_close(
        torch.tensor(b["grad_norms"]), torch.tensor(a["grad_norms"]), rtol=rtol, atol=atol
    )
    assert min(a["grad_norms"]) > 0.5  # above grad_clip
    for name, weight in a["model"].items():
        torch.testing.assert_close(b["model"][name], weight, rtol=rtol, atol=atol, msg=name)
        torch.testing.assert_close(
            b["at_two"]["model"][name], a["at_two"]["model"][name], rtol=rtol, atol=atol
        )


def assert_resumed_exactly(b: dict) -> None:
    """2 steps, save, a fresh model loads it, 1 step: as 3 steps without a break."""
    torch.testing.assert_close(b["resumed_loss"][0], b["losses"][2], rtol=1e-6, atol=1e-7)
    for name, weight in b["model"].items():
        torch.testing.assert_close(b["resumed_model"][name], weight, rtol=1e-6, atol=1e-7, msg=name)


def test_two_fsdp_ranks_equal_one_process_with_all_the_micro_batches(one, fsdp):
    b, _ = fsdp
    assert_same_training(one, b, rtol=1e-5, atol=1e-6)
    # fp32: no casts
    assert b["compute_dtype"] == "torch.float32" and b["shard_dtypes"] == ["torch.float32"]
    # the gathered optimizer state is laid out as one process's optimizer.state_dict(): numbered,
    # same groups
    a_opt, b_opt = one["at_two"]["optimizer"], b["at_two"]["optimizer"]
    assert (
        b_opt["param_groups"] == a_opt["param_groups"]
        and b_opt["state"].keys() == a_opt["state"].keys()
    )
    for i, state in a_opt["state"].items():
        for key, value in state.items():
            torch.testing.assert_close(
                b_opt["state"][i][key], value, rtol=1e-5, atol=1e-7, msg=f"{i} {key}"
            )


def test_an_fsdp_checkpoint_resumes_exactly_and_loads_without_torch_distributed(one, fsdp):
    b, out = fsdp
    assert_resumed_exactly(b)
    assert not dist.is_initialized()
    checkpoint = load_checkpoint(out / "ckpt" / "ckpt.pt")  # what sample.py and export.py do
    model = GPT.from_checkpoint(checkpoint)
    model.load_state_dict(checkpoint["model"])
    # saved once
    assert checkpoint["model"]["lm_head.weight"] is checkpoint["model"]["transformer.wte.weight"]
    for name, weight in one["at_two"]["model"].items():
        torch.testing.assert_close(model.state_dict()[name], weight, rtol=1e-5, atol=1e-6, msg=name)
    optimizer = model.configure_optimizers(0.1, 1e-2, (0.9, 0.95))
    optimizer.load_state_dict(checkpoint["optimizer"])


@pytest.mark.slow
def test_fsdp_composes_with_activation_checkpointing_and_compile(one, tmp_path):
    b = run(tmp_path, "ac", "compile")
    # the blocks compiled whole, FSDP's hooks included
    assert b["graphs"] > 0 and b["graph_breaks"] == 0
    assert_same_training(one, b, rtol=1e-5, atol=1e-5)  # compiled kernels round differently
    assert_resumed_exactly(b)


@pytest.mark.slow
def test_fsdp_mixed_precision_computes_in_bf16_and_keeps_fp32_shards(one, tmp_path):
    b = run(tmp_path, "bf16")
    assert b["compute_dtype"] == "torch.bfloat16" and b["shard_dtypes"] == ["torch.float32"]
    torch.testing.assert_close(
        torch.tensor(b["losses"]), torch.tensor(one["losses"]), rtol=1e-3, atol=0
    )
    torch.testing.assert_close(
        torch.tensor(b["grad_norms"]), torch.tensor(one["grad_norms"]), rtol=1e-2, atol=0
    )
    assert_resumed_exactly(b)


def tiny(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32, bias=False))


def test_one_process_and_ddp_wrap_as_before_and_save_plain_state(tmp_path):
    """Without torch.distributed: the model itself (or compiled); with it, DDP; their full state is
    the plain state dicts, loaded back as they are."""
    runtime = resolve_runtime("cpu", "float32")
    model = tiny()
    assert wrap_model(model, "fsdp", runtime, False, "default") is model
    assert wrap_model(tiny(), "ddp", runtime, True, "default")._orig_mod is not None
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        wrapped = wrap_model(model, "ddp", runtime, False, "default")
        assert isinstance(wrapped, DDP)
        optimizer = model.configure_optimizers(0.1, 1e-2, (0.9, 0.95))
        model_state, optimizer_state = full_state(wrapped, optimizer)
        assert (
            model_state.keys() == model.state_dict().keys()
            and optimizer_state == optimizer.state_dict()
        )
        fresh = tiny(seed=1)
        fresh_optimizer = fresh.configure_optimizers(0.1, 1e-2, (0.9, 0.95))
        load_full_state(fresh, fresh_optimizer, model_state, optimizer_state)
        torch.testing.assert_close(fresh.state_dict(), model.state_dict(), rtol=0, atol=0)
    finally:
        dist.destroy_process_group()
