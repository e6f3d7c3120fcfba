"""Never lose work: a run stopped and resumed equals the run never stopped (bitwise on CPU, dropout
on, with gradient accumulation, under DDP); checkpoints kept, checked and fallen back on; SIGTERM;
the NaN guard."""

import json
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import (
    ROOT,
    SCHEDULE,
    TINY_MODEL,
    assert_one_line_error,
    refuse_train,
    run_train,
    sigterm_at,
    step_losses,
)
from model import GPT, GPTConfig
from nanogpt_perf.errors import UserError
from nanogpt_perf.guard.checkpoint import check_ranks
from nanogpt_perf.train.checkpoint import restore_training
from nanogpt_perf.train.parallel import Ranks


def final_weights(out) -> dict[str, torch.Tensor]:
    return torch.load(out / "ckpt.pt", weights_only=True)["model"]


def assert_same_run(straight, resumed, from_iter: int, to_iter: int) -> None:
    a, b = step_losses(straight), step_losses(resumed)
    assert [a[i] for i in range(from_iter + 1, to_iter + 1)] == [
        b[i] for i in range(from_iter + 1, to_iter + 1)
    ]
    wa, wb = final_weights(straight), final_weights(resumed)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("ranks", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_stopped_and_resumed_equals_straight_bitwise(tiny_data, tmp_path, ranks):
    flags = (*SCHEDULE, "--dropout=0.1", "--gradient_accumulation_steps=4", "--eval_interval=100")
    straight = run_train(tiny_data, tmp_path / "straight", *flags, "--max_iters=12", ranks=ranks)
    assert straight.returncode == 0, straight.stderr
    first = run_train(tiny_data, tmp_path / "resumed", *flags, "--max_iters=5", ranks=ranks)
    assert first.returncode == 0, first.stderr
    second = run_train(
        tiny_data, tmp_path / "resumed", *flags, "--max_iters=12", "--init_from=resume", ranks=ranks
    )
    assert second.returncode == 0, second.stderr
    assert "resumed settings overridden: max_iters: 5 -> 12" in second.stdout
    assert_same_run(tmp_path / "straight", tmp_path / "resumed", 5, 12)


# the class of test_stopped_and_resumed_equals_straight_bitwise, with Muon: 3 more runs
@pytest.mark.slow
def test_the_recipe_with_muon_stopped_and_resumed_equals_straight_bitwise(tiny_data, tmp_path):
    """config/speedrun.py (Muon and AdamW in one optimizer, the warmup-stable-decay schedule,
    rotary, RMSNorm, ...): Muon's momentum and AdamW's moments carry over as they are."""
    flags = (
        str(ROOT / "config" / "speedrun.py"),
        "--logit_softcap=15",
        *SCHEDULE,
        "--gradient_accumulation_steps=2",
        "--eval_interval=100",
    )
    straight = run_train(tiny_data, tmp_path / "straight", *flags, "--max_iters=12")
    assert straight.returncode == 0, straight.stderr
    first = run_train(tiny_data, tmp_path / "resumed", *flags, "--max_iters=5")
    assert first.returncode == 0, first.stderr
    second = run_train(
        tiny_data, tmp_path / "resumed", *flags, "--max_iters=12", "--init_from=resume"
    )
    assert second.returncode == 0, second.stderr
    assert_same_run(tmp_path / "straight", tmp_path / "resumed", 5, 12)
    assert (
        torch.load(tmp_path / "resumed" / "ckpt.pt", weights_only=True)["model_args"]["rotary"]
        is True
    )


def test_sigterm_finishes_the_step_saves_and_resumes_exactly(tiny_data, tmp_path):
    flags = [
        *TINY_MODEL,
        f"--data_dir={tiny_data}",
        "--dataset=tiny",
        *SCHEDULE,
        "--eval_interval=1000",
    ]
    train = [sys.executable, "train.py", *flags, "--dropout=0.1", "--max_iters=12"]
    straight = subprocess.run(
        [*train, f"--out_dir={tmp_path / 'straight'}"], cwd=ROOT, capture_output=True, text=True
    )
    assert straight.returncode == 0, straight.stderr
    returncode, out, err = sigterm_at(
        *train[1:], f"--out_dir={tmp_path / 'stopped'}", "--lr_decay_iters=12", line="iter 3:"
    )
    assert returncode == 0, err
    assert "SIGTERM: finishing this step" in err and "--init_from=resume" in out
    stopped_at = max(step_losses(tmp_path / "stopped"))
    assert 3 <= stopped_at < 12
    resumed = subprocess.run(
        [*train, f"--out_dir={tmp_path / 'stopped'}", "--init_from=resume"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert_same_run(tmp_path / "straight", tmp_path / "stopped", stopped_at, 12)


@pytest.fixture(scope="module")
def saved_every_step(tiny_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("kept")
    result = run_train(
        tiny_data,
        out,
        *SCHEDULE,
        "--max_iters=6",
        "--eval_interval=4",
        "--save_interval=1",
        "--keep_last=3",
    )
    assert result.returncode == 0, result.stderr
    return out


def test_the_last_k_and_the_best_are_kept(saved_every_step):
    names = sorted(p.name for p in saved_every_step.glob("ckpt*.pt"))
    assert names == [
        "ckpt-0000004.pt",
        "ckpt-0000005.pt",
        "ckpt-0000006.pt",
        "ckpt-best.pt",
        "ckpt.pt",
    ]
    assert torch.load(saved_every_step / "ckpt.pt", weights_only=True)["iter_num"] == 6
    assert torch.load(saved_every_step / "ckpt-best.pt", weights_only=True)["iter_num"] in (4, 6)


def test_a_corrupt_checkpoint_names_the_newest_good_one_and_falls_back_only_when_asked(
    saved_every_step, tiny_data, tmp_path
):
    out = tmp_path / "out"
    shutil.copytree(saved_every_step, out, copy_function=shutil.copy2)
    newest = out / "ckpt-0000006.pt"
    data = bytearray(newest.read_bytes())
    # a flipped byte in the middle of the weights: torch.load alone would not notice
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(data)
    shutil.copyfile(newest, out / "ckpt.pt")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    refused = refuse_train(tiny_data, out, *SCHEDULE, "--init_from=resume", "--max_iters=8")
    # ckpt-best.pt, iteration 6's (a file of its own once copied), is whole and newer than
    # ckpt-0000005.pt
    assert_one_line_error(refused, "ckpt.pt is corrupt", "ckpt-best.pt", "resume_fallback=True")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    resumed = run_train(
        tiny_data, out, *SCHEDULE, "--init_from=resume", "--max_iters=8", "--resume_fallback=True"
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from" in resumed.stdout and "\niter 7:" in resumed.stdout
    assert torch.load(out / "ckpt.pt", weights_only=True)["iter_num"] == 8


def test_a_truncated_checkpoint_is_detected(saved_every_step, tiny_data, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(saved_every_step, out)
    (out / "ckpt.pt").write_bytes((out / "ckpt.pt").read_bytes()[:5000])
    result = refuse_train(tiny_data, out, "--init_from=resume")
    assert_one_line_error(result, "ckpt.pt is truncated", "ckpt-0000006.pt")


def test_non_finite_steps_are_skipped_then_the_run_stops_with_its_checkpoint_intact(
    tiny_data, tmp_path
):
    out = tmp_path / "out"
    good = run_train(tiny_data, out, *SCHEDULE, "--max_iters=2", "--eval_interval=2")
    assert good.returncode == 0, good.stderr
    before = (out / "ckpt.pt").read_bytes()
    # an absurd learning rate makes the weights overflow: every later loss is inf or nan
    result = run_train(
        tiny_data,
        out,
        "--init_from=resume",
        "--max_iters=30",
        "--learning_rate=1e30",
        "--warmup_iters=0",
        "--max_bad_steps=3",
    )
    assert_one_line_error(result, "3 steps in a row with a non-finite loss", "max_bad_steps=3")
    assert "update skipped (1 in a row)" in result.stdout
    skipped = [
        json.loads(line)
        for line in (out / "log.jsonl").read_text().splitlines()
        if '"skipped"' in line
    ]
    assert len(skipped) == 3
    assert (out / "ckpt.pt").read_bytes() == before


def test_a_checkpoint_of_another_number_of_ranks_is_refused_before_the_ranks_meet(
    tiny_data, tmp_path, monkeypatch
):
    """Under FSDP loading the optimizer state is collective, and a rank that exits just after a
    collective may abort at the interpreter's end (nanogpt_perf/train/parallel.py, close): the guard
    counts the ranks before torch.distributed starts (rank 0 of 2 here would wait for rank 1
    forever), and restore_training trusts it."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=8, vocab_size=16, n_layer=1, n_head=2, n_embd=8))
    trained = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95))
    model(torch.randint(16, (2, 8)), torch.randint(16, (2, 8)))[1].backward()
    trained.step()
    # saved by 1 rank
    checkpoint = {"optimizer": trained.state_dict(), "iter_num": 1, "best_val_loss": 1.0}
    check_ranks(checkpoint, 1)
    with pytest.raises(UserError, match="saved by 2 ranks: resume it with 2"):
        check_ranks(checkpoint | {"ranks": [None, None]}, 1)
    fresh = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95))
    scaler = torch.amp.GradScaler(enabled=False)
    # on 1 rank, it loads
    assert restore_training(checkpoint, model, fresh, scaler, None, Ranks())[0] == 1
    assert run_train(tiny_data, tmp_path / "out", "--max_iters=2").returncode == 0
    torchrun = dict(
        RANK="0", LOCAL_RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29511"
    )
    for key, value in torchrun.items():
        monkeypatch.setenv(key, value)
    refused = refuse_train(tiny_data, tmp_path / "out", "--max_iters=4", "--init_from=resume")
    assert_one_line_error(
        refused, "the checkpoint was saved by 1 ranks: resume it with 1 (nproc_per_node)"
    )


@pytest.mark.slow
def test_fsdp_under_train_py_resumes_within_float_tolerance_and_saves_a_plain_checkpoint(
    tiny_data, tmp_path
):
    """FSDP2 over 2 gloo ranks through train.py: 3 steps then a resume to 6 equals 6 steps straight
    (allclose: the sharded reductions may round differently), and the checkpoint loads into a plain
    GPT in one process."""
    flags = (
        *SCHEDULE,
        "--parallelism=fsdp",
        "--gradient_accumulation_steps=4",
        "--eval_interval=100",
    )
    straight = run_train(tiny_data, tmp_path / "straight", *flags, "--max_iters=6", ranks=2)
    assert straight.returncode == 0, straight.stderr
    first = run_train(tiny_data, tmp_path / "resumed", *flags, "--max_iters=3", ranks=2)
    assert first.returncode == 0, first.stderr
    second = run_train(
        tiny_data, tmp_path / "resumed", *flags, "--max_iters=6", "--init_from=resume", ranks=2
    )
    assert second.returncode == 0, second.stderr
    a, b = step_losses(tmp_path / "straight"), step_losses(tmp_path / "resumed")
    torch.testing.assert_close(
        torch.tensor([b[i] for i in (4, 5, 6)]), torch.tensor([a[i] for i in (4, 5, 6)])
    )
    checkpoint = torch.load(tmp_path / "resumed" / "ckpt.pt", weights_only=True)
    assert GPT.from_checkpoint(checkpoint) is not None
    for name, weight in final_weights(tmp_path / "straight").items():
        torch.testing.assert_close(checkpoint["model"][name], weight, rtol=1e-4, atol=1e-5)
