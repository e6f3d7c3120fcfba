"""The training step that train.py runs and bench.py times, against independent references: 2 DDP
ranks against one process, and a training stream that evaluation does not disturb."""

import json

import torch

from conftest import run_script, run_train
from model import GPT, GPTConfig


def test_two_ddp_ranks_equal_one_process_with_all_the_micro_batches(tmp_path):
    """torchrun with 2 gloo ranks and k micro-batches each against 1 process with 2k, over the same
    data: the same step losses, gradient norms (the clipping is active) and updated weights."""
    k = 2
    one = run_script("tests/ddp_parity.py", str(tmp_path / "one.pt"), str(k))
    assert one.returncode == 0, one.stderr
    torchrun = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2")
    two = run_script(*torchrun, "tests/ddp_parity.py", str(tmp_path / "two.pt"), str(k))
    assert two.returncode == 0, two.stderr
    a, b = (torch.load(tmp_path / f"{n}.pt", weights_only=True) for n in ("one", "two"))
    torch.testing.assert_close(
        torch.tensor(b["losses"]), torch.tensor(a["losses"]), rtol=1e-5, atol=1e-6
    )
    torch.testing.assert_close(
        torch.tensor(b["grad_norms"]), torch.tensor(a["grad_norms"]), rtol=1e-5, atol=1e-6
    )
    assert min(a["grad_norms"]) > 0.5  # above grad_clip, so clipping took part
    for name, weight in a["model"].items():
        torch.testing.assert_close(b["model"][name], weight, rtol=1e-5, atol=1e-6, msg=name)
    torch.manual_seed(0)
    initial = GPT(
        GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32, bias=False)
    ).state_dict()
    # every weight was updated
    assert all(not torch.equal(initial[n], w) for n, w in a["model"].items())


def test_the_training_stream_does_not_depend_on_evaluation(tiny_data, tmp_path):
    """Two runs that evaluate at other intervals and over other numbers of batches train on the same
    batches: the same loss at every step (dropout on: evaluation draws no random numbers either)."""
    runs = []
    for name, interval, iters in (("a", 2, 1), ("b", 3, 4)):
        flags = (
            "--max_iters=6",
            f"--eval_interval={interval}",
            f"--eval_iters={iters}",
            "--dropout=0.1",
        )
        result = run_train(tiny_data, tmp_path / name, *flags, "--log_interval=1")
        assert result.returncode == 0, result.stderr
        records = [
            json.loads(line) for line in (tmp_path / name / "log.jsonl").read_text().splitlines()
        ]
        runs.append({r["iter"]: r["step_loss"] for r in records if "step_loss" in r})
    assert list(runs[0]) == [1, 2, 3, 4, 5, 6]
    assert runs[0] == runs[1]
