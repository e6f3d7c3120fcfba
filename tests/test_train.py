"""End to end: train.py and sample.py run as a user runs them, and fail with one clear line on bad
input."""

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from conftest import (
    ROOT,
    assert_one_line_error,
    refuse_train,
    run_in_process,
    run_script,
    run_train,
)


@pytest.fixture(scope="module")
def trained(tiny_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    result = run_train(
        tiny_data,
        out,
        "--max_iters=200",
        "--eval_interval=100",
        "--eval_iters=5",
        "--log_interval=50",
        "--learning_rate=1e-2",
        "--warmup_iters=10",
        "--lr_decay_iters=200",
    )
    assert result.returncode == 0, result.stderr
    return out, result.stdout, tiny_data


def test_training_lowers_the_loss_and_logs_every_eval(trained):
    out, stdout, _ = trained
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    evals = [r for r in records if "val_loss" in r]
    assert [r["iter"] for r in evals] == [0, 100, 200]
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 2.0
    steps = [r for r in records if "step_loss" in r]
    assert [r["iter"] for r in steps] == [1, 50, 100, 150, 200]
    for r in steps:
        assert (
            r["ms_per_iter"] > 0
            and r["tokens_per_s"] > 0
            and r["mfu"] is None
            and r["peak_mem_bytes"] > 0
        )
        assert r["grad_norm"] > 0 and 0 <= r["data_wait_ms"] < r["step_ms"]
    assert "device cpu" in stdout and "settings:" in stdout


def test_checkpoint_holds_plain_state_and_exactly_max_iters(trained):
    out, _, _ = trained
    checkpoint = torch.load(out / "ckpt.pt", weights_only=True)
    assert checkpoint["iter_num"] == 200
    assert not any(k.startswith(("_orig_mod.", "module.")) for k in checkpoint["model"])
    assert checkpoint["config"]["max_iters"] == 200 and checkpoint["config"]["dataset"] == "tiny"
    assert set(checkpoint) >= {"optimizer", "scaler", "model_args", "best_val_loss"}
    evals = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert checkpoint["best_val_loss"] == min(r["val_loss"] for r in evals if "val_loss" in r)


def test_sample_uses_the_checkpoint(trained):
    out, _, _ = trained
    result = run_script(
        "sample.py",
        f"--out_dir={out}",
        "--start=the ",
        "--num_samples=2",
        "--max_new_tokens=40",
        "--device=cpu",
        "--temperature=0",
    )
    assert result.returncode == 0, result.stderr
    samples = (
        result.stdout.split("tokenizer: characters")[1].split("\n", 1)[1].split("---------------")
    )
    assert len(samples) == 3  # two samples and the closing figures
    assert samples[0].startswith("the ") and len(samples[0].strip()) >= 40
    # a model trained on two repeated lines continues with words it has seen
    assert any(word in samples[0] for word in ("quick", "brown", "question", "lazy"))


def test_resume_continues_from_the_checkpoint(trained, tmp_path):
    out, _, data_dir = trained
    shutil.copytree(out, tmp_path / "out")
    result = run_train(
        data_dir,
        tmp_path / "out",
        "--init_from=resume",
        "--max_iters=210",
        "--eval_interval=10",
        "--eval_iters=2",
        "--lr_decay_iters=210",
    )
    assert result.returncode == 0, result.stderr
    assert (
        "step 200:" in result.stdout
        and "step 210:" in result.stdout
        and "step 0:" not in result.stdout
    )
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter_num"] == 210


def test_unknown_key_is_one_line(tmp_path):
    assert_one_line_error(
        run_in_process("train.py", "--batchsize=4"), "batchsize", "did you mean 'batch_size'"
    )
    cfg = tmp_path / "cfg.py"
    cfg.write_text("n_layers = 3\n")
    assert_one_line_error(run_in_process("train.py", str(cfg)), "n_layers", "cfg.py", "'n_layer'")


def test_wrong_type_is_one_line():
    assert_one_line_error(run_in_process("train.py", "--max_iters=ten"), "max_iters must be int")
    assert_one_line_error(run_in_process("sample.py", "--top_k=2.5"), "top_k must be int")


def test_missing_config_file_is_one_line():
    assert_one_line_error(run_in_process("train.py", "config/nope.py"), "config/nope.py not found")


def test_missing_dataset_is_one_line(tmp_path):
    assert_one_line_error(
        run_in_process("train.py", f"--data_dir={tmp_path}", "--dataset=owt", "--device=cpu"),
        "dataset 'owt' not found",
    )


def test_resume_without_checkpoint_is_one_line(tiny_data, tmp_path):
    result = refuse_train(tiny_data, tmp_path, "--init_from=resume")
    assert_one_line_error(result, "no checkpoint at")
    assert_one_line_error(
        run_in_process("sample.py", f"--out_dir={tmp_path}", "--device=cpu"), "no checkpoint at"
    )


@pytest.mark.parametrize(
    "flag", ["--block_size=64", "--n_layer=3", "--pad_vocab=128", "--dataset=other"]
)
def test_resuming_with_another_architecture_or_data_is_refused_and_changes_nothing(
    trained, tmp_path, flag
):
    out, _, data_dir = trained
    shutil.copytree(out, tmp_path / "out")
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    result = refuse_train(data_dir, tmp_path / "out", "--init_from=resume", flag)
    key, value = flag[2:].split("=")
    assert_one_line_error(
        result, f"cannot resume with {key}={value!r}" if key == "dataset" else f"{key}={value}"
    )
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before


def test_corrupt_checkpoint_is_one_line_and_left_alone(tmp_path):
    (tmp_path / "ckpt.pt").write_bytes(b"not a checkpoint")
    assert_one_line_error(
        run_in_process("sample.py", f"--out_dir={tmp_path}", "--device=cpu"), "corrupt"
    )
    assert (tmp_path / "ckpt.pt").read_bytes() == b"not a checkpoint"


def test_n_embd_not_divisible_by_n_head_is_one_line(tiny_data, tmp_path):
    result = refuse_train(
        tiny_data,
        tmp_path,
        "--n_embd=30",
        "--n_head=4",
    )
    assert_one_line_error(result, "n_embd=30 is not divisible by n_head=4")


def test_help_lists_every_setting():
    result = run_script("train.py", "--help")
    assert result.returncode == 0
    for key in ("out_dir", "gradient_accumulation_steps", "compile", "peak_flops"):
        assert f"--{key}" in result.stdout
    assert "default 64" in result.stdout.replace("  ", " ")


def test_nanogpt_flags_run_unchanged(tiny_data, tmp_path):
    """nanoGPT's documented CPU command, on a tiny dataset and cut to a few steps."""
    result = run_script(
        "train.py",
        str(ROOT / "config/train_shakespeare_char.py"),
        "--device=cpu",
        "--compile=False",
        "--eval_iters=2",
        "--log_interval=1",
        "--block_size=64",
        "--batch_size=12",
        "--n_layer=4",
        "--n_head=4",
        "--n_embd=128",
        "--max_iters=3",
        "--lr_decay_iters=2000",
        "--dropout=0.0",
        f"--data_dir={tiny_data}",
        "--dataset=tiny",
        f"--out_dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr
    assert "iter 3: step loss" in result.stdout


@pytest.mark.slow
def test_ddp_under_torchrun_on_cpu(tiny_data, tmp_path):
    """Two gloo ranks share the global gradient_accumulation_steps and rank 0 alone writes the
    outputs."""
    flags = ("--max_iters=4", "--eval_interval=4", "--eval_iters=2", "--log_interval=2")
    result = run_train(tiny_data, tmp_path, *flags, "--gradient_accumulation_steps=4", ranks=2)
    assert result.returncode == 0, result.stderr
    assert "(2 micro-batches x 2 ranks x 8 x 32)" in result.stdout
    assert result.stdout.count("step 4:") == 1  # printed once, by rank 0
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["iter_num"] == 4
    uneven = run_train(
        tiny_data, tmp_path, "--gradient_accumulation_steps=3", "--overwrite=True", ranks=2
    )
    assert uneven.returncode != 0 and "not divisible by 2 ranks" in uneven.stderr


# put before each rank's train.py (as sitecustomize, on PYTHONPATH): once train.py has run, before
# the interpreter tears itself down, the number of gloo's threads (a process group's workers and its
# I/O loop) still alive
EXIT_PROBE = """
import atexit, os, sys

def report():
    tasks = "/proc/self/task"
    names = [open(f"{tasks}/{t}/comm").read() for t in os.listdir(tasks)]
    alive = sum(name.startswith(("pt_gloo", "gloo_tcp")) for name in names)
    print(f"rank {os.environ['RANK']}: {alive} gloo threads at exit", file=sys.stderr, flush=True)

if "RANK" in os.environ:
    atexit.register(report)
"""


# train.py's ways to its end on 2 ranks, each through close(): trained and saved, in DDP or in FSDP;
# stopped by the non-finite guard (learning rate 1e30: the second step overflows)
ENDS = {
    "ddp": (),
    "fsdp": ("--parallelism=fsdp",),
    "stopped on non-finite steps": (
        "--learning_rate=1e30",
        "--warmup_iters=0",
        "--max_bad_steps=1",
    ),
}


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
@pytest.mark.parametrize("end", ENDS)
def test_every_rank_ends_its_process_group_before_the_interpreter_ends(
    tiny_data, tmp_path, monkeypatch, end
):
    """A gloo thread alive as the interpreter finalizes may abort the rank
    (nanogpt_perf/train/parallel.py, close): train.py releases what holds the group and close()
    destroys it, so that none is left."""
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "sitecustomize.py").write_text(EXIT_PROBE)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "probe"))
    flags = (
        "--max_iters=2",
        "--eval_interval=2",
        "--eval_iters=1",
        "--gradient_accumulation_steps=2",
    )
    result = run_train(tiny_data, tmp_path / "out", *flags, *ENDS[end], ranks=2)
    if end.startswith("stopped"):
        assert result.returncode != 0 and "(max_bad_steps=1): stopped at iter 2" in result.stderr, (
            result.stderr
        )
    else:
        assert result.returncode == 0, result.stderr
        # saved at the end: the gathers and the barrier came last
        assert (tmp_path / "out" / "ckpt.pt").is_file()
    assert sorted(re.findall(r"rank (\d): (\d+) gloo threads at exit", result.stderr)) == [
        ("0", "0"),
        ("1", "0"),
    ]
