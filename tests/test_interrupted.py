"""Interrupted, moved and changed (issue 25): Ctrl-C in every script from its first moment (a
process of its own, interrupted as it starts importing torch or its first heavy module) and
mid-work; SIGTERM through a temporary folder's removal, and through a web-scale preparation that
then resumes; HellaSwag's scoring stopped between examples, every rank asked as often; a dataset
prepared again under a live loader; a resume that changes data_order or meets other windows; a
dataset's identity; a full disk while appending log.jsonl; an export of a character-level model
taken back by sample.py; a run killed while it writes a checkpoint, then resumed."""

import errno
import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from conftest import (
    ROOT,
    SCHEDULE,
    TINY_MODEL,
    assert_one_line_error,
    run_in_process,
    run_script,
    run_train,
    sigterm_at,
)
from nanogpt_perf.data.identity import BLOCK, SAMPLES, dataset_identity
from nanogpt_perf.data.loader import TokenBatches
from nanogpt_perf.data.shards import write_shard
from nanogpt_perf.errors import UserError
from nanogpt_perf.files import write_bytes
from nanogpt_perf.guard.checkpoint import check_whole
from nanogpt_perf.guard.dataset import identity_change
from nanogpt_perf.guard.lock import LOCK_NAME
from nanogpt_perf.train.preemption import resume_command

CPU = torch.device("cpu")

# a process of its own, Ctrl-C'd (SIGINT to itself) the moment it starts to import `module`
INTERRUPT_AT_IMPORT = textwrap.dedent("""
    import os, runpy, signal, sys
    module, script = sys.argv[1], sys.argv[2]
    class Interrupt:
        def find_spec(self, name, path=None, target=None):
            if name == module:
                sys.meta_path.remove(self)
                os.kill(os.getpid(), signal.SIGINT)
            return None
    sys.meta_path.insert(0, Interrupt())
    sys.argv, sys.path[0] = sys.argv[2:], os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")
""")


def default_sigint() -> None:
    """In the child, before it starts: SIGINT as a terminal's process has it. A shell's background
    job (CI run with `&`) starts with SIGINT ignored, which Python keeps, and then no Ctrl-C reaches
    the script."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def environment(**changes: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    return env | changes


@pytest.mark.parametrize(
    "module, script, args",
    [
        ("torch", "sample.py", ["--device=cpu"]),
        ("torch", "export.py", []),
        ("torch", "hellaswag.py", []),
        ("torch", "lab/generate.py", []),
        ("torch", "lab/loader.py", []),
        ("configurator", "lab/prepare.py", []),
        ("numpy", "data/shakespeare_char/prepare.py", ["--help"]),
        ("numpy", "data/shakespeare/prepare.py", ["--help"]),
        ("configurator", "data/openwebtext/prepare.py", []),
        ("matplotlib", "lab/plot.py", ["{run}"]),
    ],
)
def test_ctrl_c_while_a_script_loads_is_one_line_and_status_130(module, script, args, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "log.jsonl").write_text(json.dumps({"iter": 1, "step_loss": 1.0}) + "\n")
    command = [
        sys.executable,
        "-c",
        INTERRUPT_AT_IMPORT,
        module,
        script,
        *(a.format(run=run) for a in args),
    ]
    result = subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=environment(),
        preexec_fn=default_sigint,
    )
    assert result.returncode == -signal.SIGINT, result.stderr  # a shell shows it as 130
    assert result.stderr.strip() == "interrupted (Ctrl-C)", result.stderr
    assert sorted(os.listdir(tmp_path)) == ["run"]


def signal_at(*args: str, line: str, sig: int, env: dict[str, str] | None = None, cwd: Path = ROOT):
    """Run a script and send it sig once a line of its output starts with `line`
    (conftest.sigterm_at for any signal, stdout and stderr read together): its exit status and
    everything it printed."""
    run = subprocess.Popen(
        [sys.executable, *args],
        cwd=cwd,
        text=True,
        env=env or environment(),
        preexec_fn=default_sigint,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    for printed in run.stdout:
        if printed.startswith(line):
            run.send_signal(sig)
            break
    output, _ = run.communicate(timeout=120)
    return run.returncode, output


def test_ctrl_c_while_sample_generates_is_one_line(tmp_path):
    from model import GPT, GPTConfig
    from nanogpt_perf.train.checkpoint import save_checkpoint

    model_args = dict(block_size=32, vocab_size=16, n_layer=1, n_head=2, n_embd=8, dropout=0.0)
    checkpoint = {"model": GPT(GPTConfig(**model_args)).state_dict(), "model_args": model_args}
    save_checkpoint(
        checkpoint | {"tokenizer": {"kind": "characters", "itos": list("abcdefgh ")}},
        tmp_path / "ckpt.pt",
    )
    flags = [
        f"--out_dir={tmp_path}",
        "--device=cpu",
        "--start=abc",
        "--num_samples=1",
        "--max_new_tokens=1000000",
    ]
    returncode, output = signal_at("sample.py", *flags, line="tokenizer:", sig=signal.SIGINT)
    assert returncode == -signal.SIGINT
    assert output.rstrip().endswith("interrupted (Ctrl-C)") and "Traceback" not in output, output


def test_sigterm_ends_the_loader_benchmark_through_its_temporary_folders_removal(tmp_path):
    flags = [
        "--shards=2",
        "--shard_tokens=5000",
        "--batch_size=2",
        "--block_size=16",
        "--batches=2000",
    ]
    env = environment(TMPDIR=str(tmp_path))
    flags.append("--repeats=1000")  # minutes in all: stopped after the first
    returncode, output = signal_at(
        "lab/loader.py", *flags, line="run 1", sig=signal.SIGTERM, env=env
    )
    assert returncode == 128 + signal.SIGTERM and "Traceback" not in output, output
    assert os.listdir(tmp_path) == []  # the synthetic shards went with their folder


def test_sigterm_stops_a_web_scale_preparation_which_then_resumes(tmp_path):
    documents = "".join(
        json.dumps({"text": f"document {i} " + "word " * (i % 50)}) + "\n" for i in range(2000)
    )
    (tmp_path / "docs.jsonl").write_text(documents)
    out = tmp_path / "out"
    flags = [
        f"--input={tmp_path / 'docs.jsonl'}",
        f"--out_dir={out}",
        "--processes=1",
        "--shard_size=500",
    ]
    run = subprocess.Popen(
        [sys.executable, "data/openwebtext/prepare.py", *flags, "--block_size=8"],
        cwd=ROOT,
        env=environment(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    while run.poll() is None:  # until the first shard is saved
        try:
            if json.loads((out / "prepare_state.json").read_text())["shards"] >= 1:
                break
        except (OSError, ValueError):
            time.sleep(0.002)
    run.send_signal(signal.SIGTERM)
    _, stderr = run.communicate(timeout=120)
    assert run.returncode == 1, "the preparation ended before SIGTERM"
    assert_one_line_error(
        subprocess.CompletedProcess([], 1, "", stderr.splitlines()[-1] + "\n"), "stopped by SIGTERM"
    )
    assert (
        "shard(s) kept: run the same command again to resume" in stderr
        and "Traceback" not in stderr
    )
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]
    resumed = run_in_process("data/openwebtext/prepare.py", *flags, "--block_size=8")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming after" in resumed.stdout and (out / "prepare.json").is_file()


# --------------------------------------------------------------- HellaSwag stopped between examples


def test_hellaswag_scoring_stops_between_examples_and_every_rank_asks_as_often(monkeypatch):
    from model import GPT, GPTConfig
    from nanogpt_perf.hellaswag import score

    model = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=8)).train()
    examples = [{"ctx": "ab", "endings": ["c", "dd", "e", "ff"], "label": i % 4} for i in range(5)]
    encode = lambda text: [ord(c) % 64 for c in text]  # noqa: E731
    asked = []
    stop_at_third = lambda: asked.append(len(asked)) or len(asked) == 3  # noqa: E731
    assert score(model, examples, encode, CPU, torch.no_grad, stop_at_third) is None
    assert len(asked) == 3 and model.training  # stopped before the third example; the mode restored
    whole = score(model, examples, encode, CPU, torch.no_grad, lambda: False)
    assert whole["examples"] == 5 and whole == score(model, examples, encode, CPU, torch.no_grad)

    # two ranks, 3 examples for rank 0 and 2 for rank 1: both ask 3 times (an all-reducing stop
    # needs it)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "all_reduce", lambda tensor: None)
    counts = {}
    for rank in (0, 1):
        monkeypatch.setattr(dist, "get_rank", lambda r=rank: r)
        asks = []
        result = score(
            model, examples, encode, CPU, torch.no_grad, lambda a=asks: a.append(1) and False
        )
        counts[rank] = (len(asks), result["examples"])
    assert counts == {0: (3, 3), 1: (3, 2)}


# -------------------------------------------------------------------- data that changes under a run


def char_dataset(folder: Path, n: int, seed: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tokens = np.random.default_rng(seed).integers(0, 29, n).astype(np.uint16)
    (folder / "train.bin").write_bytes(tokens.tobytes())
    (folder / "val.bin").write_bytes(tokens[: n // 10].tobytes())
    return folder


def test_a_dataset_prepared_again_under_a_live_loader_leaves_it_on_the_data_it_started_with(
    tmp_path, capsys
):
    live = char_dataset(tmp_path / "live", 20_000)
    copy = char_dataset(tmp_path / "copy", 20_000)  # the same tokens, never touched
    batches, reference = (TokenBatches(f, 4, 16, CPU, seed=3) for f in (live, copy))
    for _ in range(3):
        assert torch.equal(batches.next_batch()[0], reference.next_batch()[0])
    assert batches.changed_files() == [] and batches.changed_line() is None
    # prepared again, atomically: 1% of it
    write_bytes(live / "train.bin", np.zeros(200, np.uint16).tobytes())
    write_bytes(live / "val.bin", np.zeros(20, np.uint16).tobytes())
    for _ in range(50):
        assert torch.equal(batches.next_batch()[0], reference.next_batch()[0])
    assert all(
        torch.equal(a[0], b[0])
        for a, b in zip(
            batches.eval_batches("val", 3), reference.eval_batches("val", 3), strict=True
        )
    )
    assert batches.changed_files() == ["train.bin", "val.bin"]
    line = capsys.readouterr().out  # said by rank 0's first evaluation after the change
    assert line == (
        "dataset live was prepared again while this run reads it (train.bin, val.bin): the run "
        "goes on with the "
        "data it started with\n"
    )
    assert batches.changed_line() is None  # said once
    list(batches.eval_batches("val", 1))
    assert capsys.readouterr().out == ""
    (live / "val.bin").unlink()
    assert batches.changed_files() == ["train.bin", "val.bin"]
    batches.close(), reference.close()


def test_a_resume_that_changes_data_order_or_meets_other_windows_starts_the_order_afresh(
    tmp_path, capsys
):
    folder = char_dataset(tmp_path / "d", 5_000)
    random_run = TokenBatches(folder, 4, 16, CPU, seed=1, data_order="random")
    random_run.next_batch()
    saved = random_run.state_dict()
    epochs, fresh = (
        TokenBatches(folder, 4, 16, CPU, seed=1, data_order="epochs") for _ in range(2)
    )
    line = epochs.load_state_dict(saved)
    assert line == "the loader starts data_order='epochs' at its beginning: data_order was 'random'"
    assert capsys.readouterr().out.strip() == line  # rank 0 prints it
    assert all(torch.equal(epochs.next_batch()[0], fresh.next_batch()[0]) for _ in range(5))

    fresh.next_batch()
    at_epochs = fresh.state_dict()
    smaller = TokenBatches(
        char_dataset(tmp_path / "small", 1_000), 4, 16, CPU, seed=1, data_order="epochs"
    )
    assert (
        "its saved position counts 312 windows in 1 files, there are now 62 in 1"
        in smaller.load_state_dict(at_epochs)
    )
    assert "not one of this order's" in smaller.load_state_dict(at_epochs | {"file_pos": 5})
    assert "not one of this order's" in random_run.load_state_dict(
        {"order": "random", "rng": "nonsense"}
    )
    same = TokenBatches(folder, 4, 16, CPU, seed=1, data_order="epochs")
    # the same order on the same files: exactly where it was
    assert same.load_state_dict(at_epochs) is None
    assert torch.equal(same.next_batch()[0], fresh.next_batch()[0])
    for loader in (random_run, epochs, fresh, smaller, same):
        loader.close()


def test_a_datasets_identity_names_what_changed_and_survives_a_move(tmp_path):
    folder = char_dataset(tmp_path / "d", 50_000)
    (folder / "meta.pkl").write_bytes(b"vocabulary")
    saved = dataset_identity(folder)
    assert set(saved["files"]) == {"train.bin", "val.bin", "meta.pkl"} and saved["folder"] == str(
        folder.resolve()
    )
    moved = tmp_path / "elsewhere"
    folder.rename(moved)
    # the same files in another place
    assert identity_change(saved, dataset_identity(moved)) is None
    tokens = np.fromfile(moved / "train.bin", dtype=np.uint16)
    (moved / "train.bin").write_bytes(tokens[:500].tobytes())  # rewritten to 1% of its size
    assert (
        identity_change(saved, dataset_identity(moved)) == "train.bin has 1,000 bytes, not 100,000"
    )
    (moved / "train.bin").write_bytes(np.roll(tokens, 1).tobytes())  # the same size, other tokens
    assert (
        identity_change(saved, dataset_identity(moved))
        == "train.bin has other contents (the same 100,000 bytes)"
    )
    (moved / "train.bin").write_bytes(tokens.tobytes())
    (moved / "meta.pkl").unlink()
    assert identity_change(saved, dataset_identity(moved)) == "meta.pkl is gone"
    for name in ("train.bin", "val.bin"):
        (moved / name).unlink()
    write_shard(moved / "d_val_000000.bin", tokens[:100])
    write_shard(moved / "d_train_000001.bin", tokens)
    assert identity_change(saved, dataset_identity(moved)).startswith(
        "d_train_000001.bin is new; d_val_000000.bin"
    )
    assert "not one" in identity_change({"files": "x"}, dataset_identity(moved))


def test_a_fingerprint_reads_a_few_blocks_of_a_large_file(tmp_path, monkeypatch):
    from nanogpt_perf.data import identity

    big = tmp_path / "big" / "train.bin"
    big.parent.mkdir()
    with open(big, "wb") as f:
        f.truncate(10**9)  # 1 GB, sparse
    read = []
    pread = os.pread
    monkeypatch.setattr(identity.os, "pread", lambda fd, n, at: read.append(n) or pread(fd, n, at))
    (big.parent / "val.bin").write_bytes(bytes(100))
    first = dataset_identity(big.parent)["files"]["train.bin"]
    assert sum(read) == SAMPLES * BLOCK  # 32 KiB of the 1 GB
    with open(big, "r+b") as f:
        f.seek(10**9 - 1)
        f.write(b"\x01")  # the last byte: in the last block read
    assert dataset_identity(big.parent)["files"]["train.bin"]["fingerprint"] != first["fingerprint"]


# -------------------------------------------------------------- a full disk while appending the log


class FullDisk:
    """log.jsonl's file object, on a disk that takes `room` more bytes: a write past them writes
    what fits, then fails (or returns short, as write(2) may)."""

    def __init__(self, file, room: int, short: bool):
        self.file, self.room, self.short = file, room, short

    def fileno(self) -> int:
        return self.file.fileno()

    def write(self, data: bytes) -> int:
        written = os.write(self.fileno(), data[: self.room])
        self.room -= written
        if written < len(data) and not self.short:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return written

    def close(self) -> None:
        self.file.close()


@pytest.mark.parametrize("short", [False, True])
def test_a_full_disk_while_appending_the_log_leaves_whole_records_and_one_line(tmp_path, short):
    from nanogpt_perf.train.progress import RunLog

    (tmp_path / "ckpt.pt").write_bytes(b"a checkpoint")
    log = RunLog(tmp_path, True, None, {})
    log.write({"iter": 1, "loss": 2.0})
    log.file = FullDisk(log.file, room=30, short=short)
    log.write({"iter": 2, "loss": 1.5})  # 26 bytes: it fits
    with pytest.raises(UserError) as error:
        log.write({"iter": 3, "loss": 1.25, "note": "longer than what is left"})
    assert str(error.value) == (
        f"cannot append to {tmp_path / 'log.jsonl'}: no space left on the device; the log ends at "
        "its last whole "
        f"record; the last checkpoint is {tmp_path / 'ckpt.pt'}"
    )
    lines = (tmp_path / "log.jsonl").read_bytes().decode().splitlines(keepends=True)
    assert [json.loads(line)["iter"] for line in lines] == [1, 2] and lines[-1].endswith("\n")
    log.close()


def test_a_torn_last_record_is_cut_when_the_log_is_opened_again(tmp_path):
    from nanogpt_perf.train.progress import RunLog

    # a writer killed mid-record
    (tmp_path / "log.jsonl").write_text('{"iter": 1}\n{"iter": 2, "lo')
    log = RunLog(tmp_path, True, None, {})
    log.write({"iter": 3})
    log.close()
    assert (tmp_path / "log.jsonl").read_text() == '{"iter": 1}\n{"iter": 3}\n'
    with pytest.raises(UserError, match="cannot append to .*: it is a folder"):
        (tmp_path / "folder" / "log.jsonl").mkdir(parents=True)
        RunLog(tmp_path / "folder", True, None, {})


# ------------------------------------------------------------------- a round trip through an export


def test_an_export_of_a_character_model_carries_its_vocabulary_back_to_sample(tiny_data, tmp_path):
    pytest.importorskip("transformers")
    from model import GPT, GPTConfig
    from nanogpt_perf.data.tokenizer import tokenizer_spec
    from nanogpt_perf.train.checkpoint import save_checkpoint

    torch.manual_seed(0)
    spec = tokenizer_spec(tiny_data / "tiny")
    model_args = dict(block_size=16, vocab_size=64, n_layer=1, n_head=2, n_embd=8, dropout=0.0)
    checkpoint = {
        "model": GPT(GPTConfig(**model_args)).state_dict(),
        "model_args": model_args,
        "tokenizer": spec,
    }
    save_checkpoint(checkpoint, tmp_path / "out" / "ckpt.pt")
    export = run_in_process(
        "export.py", f"--out_dir={tmp_path / 'out'}", f"--export_dir={tmp_path / 'hf'}"
    )
    assert export.returncode == 0, export.stderr
    assert json.loads((tmp_path / "hf" / "vocabulary.json").read_text()) == spec
    common = [
        "--device=cpu",
        "--start=the ",
        "--num_samples=1",
        "--max_new_tokens=20",
        "--temperature=0",
    ]
    exported = run_in_process("sample.py", f"--init_from={tmp_path / 'hf'}", *common)
    original = run_in_process("sample.py", f"--out_dir={tmp_path / 'out'}", *common)
    assert exported.returncode == 0 and original.returncode == 0, exported.stderr + original.stderr
    assert f"tokenizer: characters ({len(spec['itos'])})" in exported.stdout
    text = lambda r: r.stdout.split("tokenizer: ")[1].split("---------------")[0]  # noqa: E731
    # the same greedy text: weights and vocabulary came back whole
    assert text(exported) == text(original)
    again = run_in_process(
        "export.py", f"--out_dir={tmp_path / 'out'}", f"--export_dir={tmp_path / 'hf'}"
    )
    # an earlier export, vocabulary.json included, is replaced
    assert again.returncode == 0, again.stderr


# -- a run stopped, and how it ends (from the hostile runs)
# --------------------------------------------------------


def test_sigterm_during_an_evaluation_stops_at_its_next_batch(tiny_data, tmp_path):
    """An evaluation of a million batches, SIGTERM as it starts: the run stops at a batch boundary,
    not at its end."""
    out = tmp_path / "out"
    flags = [
        *TINY_MODEL,
        f"--data_dir={tiny_data}",
        "--dataset=tiny",
        f"--out_dir={out}",
        "--eval_iters=1000000",
    ]
    run = subprocess.Popen(
        [sys.executable, "train.py", *flags, "--max_iters=2"],
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    # written once SIGTERM stops it cleanly
    while not (out / "manifest.json").exists() and run.poll() is None:
        time.sleep(0.05)
    time.sleep(0.5)  # in the evaluation of iter 0
    run.send_signal(signal.SIGTERM)
    stdout, stderr = run.communicate(timeout=120)
    assert run.returncode == 0, stderr
    assert (
        "stopped by SIGTERM after iter 0, before any checkpoint" in stdout
        and "step 0:" not in stdout
    )


@pytest.mark.slow
def test_the_command_printed_after_sigterm_runs_as_printed_with_a_space_in_out_dir(
    tiny_data, tmp_path
):
    out = tmp_path / "my out"
    flags = [
        *TINY_MODEL,
        f"--data_dir={tiny_data}",
        "--dataset=tiny",
        f"--out_dir={out}",
        "--eval_iters=1",
    ]
    returncode, stdout, stderr = sigterm_at(
        "train.py", *flags, "--max_iters=12", "--eval_interval=100", line="iter 2:"
    )
    assert returncode == 0, stderr
    printed = stdout.split(": resume with\n  ")[1].splitlines()[0]
    command = shlex.split(printed)
    assert (
        command[0] == sys.executable
        and f"--out_dir={out}" in command
        and command[-1] == "--init_from=resume"
    )
    assert not (out / LOCK_NAME).exists()
    stopped_at = torch.load(out / "ckpt.pt", weights_only=True)["iter_num"]
    assert 2 <= stopped_at < 12
    resumed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert f"iter {stopped_at + 1}:" in resumed.stdout
    assert torch.load(out / "ckpt.pt", weights_only=True)["iter_num"] == 12


def test_the_resume_command_under_torchrun_is_a_torchrun_command():
    argv = ["train.py", "config/x.py", "--out_dir=a b", "--init_from=gpt2", "--overwrite=True"]
    environ = {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4", "RANK": "0"}
    command = shlex.split(resume_command(argv, environ))
    assert command == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=4",
        "train.py",
        "config/x.py",
        "--out_dir=a b",
        "--init_from=resume",
    ]
    assert shlex.split(resume_command(argv, {}))[:2] == [sys.executable, "train.py"]


def test_a_run_that_ends_on_non_finite_steps_saves_nothing_and_fails(tiny_data, tmp_path):
    out = tmp_path / "out"
    result = run_train(tiny_data, out, "--learning_rate=1e30", "--warmup_iters=0", "--max_iters=4",
                       "--eval_interval=2", "--eval_iters=1")  # fmt: skip
    assert_one_line_error(
        result, "the run ended at iter 4 on 3 non-finite steps, unsaved", "no checkpoint was saved"
    )
    assert "iter 2: not saved, the last step was not finite" in result.stdout
    assert not list(out.glob("ckpt*")) and not (out / LOCK_NAME).exists()


# train.py as run_train runs it, SIGKILLed once it has written the start of iteration 4's checkpoint
KILLED_MID_CHECKPOINT = textwrap.dedent("""
    import os, runpy, signal, sys, torch
    save = torch.save
    def torn(obj, f, *args, **kwargs):
        if isinstance(obj, dict) and obj.get("iter_num") == 4:
            f.write(b"the start of a checkpoint")
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        save(obj, f, *args, **kwargs)
    torch.save = torn
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
""")


def test_a_run_killed_mid_checkpoint_resumes_to_the_weights_of_a_run_never_killed(
    tiny_data, tmp_path
):
    """SIGKILL while a checkpoint is written (no handler runs: the lock, the torn temporary file and
    the log are left as they were): the earlier checkpoints are whole, and the run resumed from them
    ends with the weights of the run never killed, bitwise (with dropout and accumulation)."""
    flags = (*SCHEDULE, "--dropout=0.1", "--gradient_accumulation_steps=2", "--max_iters=8")
    flags += ("--save_interval=1", "--eval_interval=100")
    straight, out = tmp_path / "straight", tmp_path / "killed"
    assert run_train(tiny_data, straight, *flags).returncode == 0
    dataset = (f"--data_dir={tiny_data}", "--dataset=tiny", f"--out_dir={out}")
    killed = run_script("-c", KILLED_MID_CHECKPOINT, "train.py", *TINY_MODEL, *dataset, *flags)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert [p.name for p in out.glob(".ckpt-0000004.pt.tmp-*")] != []
    for path in out.glob("ckpt*.pt"):
        check_whole(path)
    assert torch.load(out / "ckpt.pt", weights_only=True)["iter_num"] == 3
    resumed = run_train(tiny_data, out, *flags, "--init_from=resume")
    assert resumed.returncode == 0, resumed.stderr
    a, b = (torch.load(d / "ckpt.pt", weights_only=True)["model"] for d in (straight, out))
    assert all(torch.equal(a[k], b[k]) for k in a)
