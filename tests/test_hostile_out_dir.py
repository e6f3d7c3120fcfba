"""Hostile out_dirs: an out_dir belongs to one run (a live run's lock, another host's, one that is
not a lock, a file in its place, an earlier run's checkpoints), refused in one 'error: ' line with
every file as it was; the lock itself (taken over from a dead run, released on every way out); what
is accepted (two live runs, a killed run's lock taken over, overwrite=True); and issue 31's: checked
again under the lock, refused where it cannot be written."""

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import (
    LIVE_LOCK,
    OTHER_HOST_LOCK,
    RESUME,
    ROOT,
    TINY_MODEL,
    assert_one_line_error,
    contents,
    lock_text,
    refuse_run_case,
    refuse_train,
    run_in_process,
    run_script,
    run_train,
    train_case,
)
from nanogpt_perf.errors import UserError
from nanogpt_perf.guard.lock import LOCK_NAME, OutDirLock, is_running, process_start, process_stat


def lock_of(pid: int, start=None) -> dict:
    """A lock of this host naming pid (and start, its process's start time)."""
    return {f"out/{LOCK_NAME}": lock_text(pid, socket.gethostname(), start)}


OUT_DIRS = {
    # an out_dir holds one run
    "scratch_over_checkpoints": train_case(
        "", "holds an earlier run's checkpoints (ckpt.pt)", "overwrite=True", checkpoint="ours"
    ),
    "folder_weights_over_checkpoints": train_case(
        "--init_from={dir}/hf",
        "earlier run's checkpoints",
        "overwrite=True",
        files={"hf/config.json": "{}"},
        checkpoint="ours",
    ),
    "eval_only_scratch_over_checkpoints": train_case(
        "--eval_only=True", "earlier run's checkpoints", "another out_dir", checkpoint="ours"
    ),
    "scratch_over_numbered_checkpoints": train_case(
        "", "(ckpt-0000005.pt)", "init_from=resume", files={"out/ckpt-0000005.pt": "x"}
    ),
    "live_run_holds_out_dir": train_case(
        "", "is in use by another run", f"pid {os.getpid()}", files=LIVE_LOCK
    ),
    "live_run_holds_out_dir_resume": train_case(
        RESUME, "is in use by another run", files=LIVE_LOCK, checkpoint="ours"
    ),
    "lock_of_another_host": train_case(
        "",
        "another host",
        "another-host.example",
        f"delete {{dir}}/out/{LOCK_NAME}",
        files=OTHER_HOST_LOCK,
    ),
    "lock_not_ours": train_case(
        "", f"out/{LOCK_NAME} is not a lock of train.py's", files={f"out/{LOCK_NAME}": "garbage"}
    ),
    "lock_with_pid_0": train_case(
        "", "is not a lock of train.py's", files={f"out/{LOCK_NAME}": lock_text(0, "h", None)}
    ),
    # issue 44's: pids no process has (OverflowError), a start time no text (a live run taken over)
    "lock_with_pid_2**40": train_case("", "is not a lock of train.py's", files=lock_of(2**40)),
    "lock_with_pid_10**23": train_case("", "is not a lock of train.py's", files=lock_of(10**23)),
    "lock_whose_start_is_a_number": train_case(
        "", "is not a lock of train.py's", files=lock_of(os.getpid(), start=123)
    ),
    "out_dir_is_a_file": train_case("", "is a file, not a folder", files={"out": "a file"}),
    "out_dir_inside_a_file": train_case(
        "--out_dir={dir}/file/out", "{dir}/file is a file", files={"file": "a file"}
    ),
}


@pytest.mark.parametrize("name", OUT_DIRS)
def test_an_out_dir_refused_with_one_line_and_nothing_written(
    name, variants, tmp_path, monkeypatch
):
    refuse_run_case(OUT_DIRS[name], variants, tmp_path, monkeypatch)


def test_a_second_claim_is_refused_while_the_first_holds_and_the_lock_is_only_ever_ours(tmp_path):
    first, second = OutDirLock(tmp_path / "out"), OutDirLock(tmp_path / "out")
    first.claim()
    holder = json.loads((tmp_path / "out" / LOCK_NAME).read_text())
    assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
    with pytest.raises(UserError, match="is in use by another run"):
        second.claim()
    second.release()  # not its lock: left alone
    assert (tmp_path / "out" / LOCK_NAME).exists()
    first.release()
    first.release()
    assert not (tmp_path / "out" / LOCK_NAME).exists()
    second.claim()
    second.release()


def test_a_lock_whose_pid_now_belongs_to_another_process_is_taken_over(tmp_path, capsys):
    """The pid is alive but started at another time than the lock says: the run that wrote it is
    dead."""
    if process_start(os.getpid()) is None:
        pytest.skip("no /proc: start times cannot be told apart")
    (tmp_path / LOCK_NAME).write_text(lock_text(os.getpid(), socket.gethostname(), "1"))
    lock = OutDirLock(tmp_path)
    lock.claim()
    assert "taking over the lock of a run that is no longer running" in capsys.readouterr().out
    lock.release()


def test_a_lock_of_a_process_that_ended_unreaped_is_stale():
    """A killed run whose parent has not collected it yet (a zombie) still has its pid, but runs no
    more."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        holder = {
            "pid": child.pid,
            "host": socket.gethostname(),
            "process_start": process_start(child.pid),
        }
        deadline = time.monotonic() + 30
        while process_stat(child.pid) is not None and process_stat(child.pid)[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert not is_running(holder)
    finally:
        child.wait()
    assert not is_running(holder)


RELEASE = """
import os, signal, sys
from pathlib import Path
from nanogpt_perf.guard.lock import OutDirLock
from nanogpt_perf.train.preemption import StopRequest
lock = OutDirLock(Path(sys.argv[1]))
lock.claim()
assert (Path(sys.argv[1]) / "train.lock").exists()
how = sys.argv[2]
if how == "exception":
    raise RuntimeError("a bug")
if how == "keyboard":
    raise KeyboardInterrupt
stop = StopRequest(lock.release)  # a second Ctrl-C: os._exit, which runs no atexit handler
os.kill(os.getpid(), signal.SIGINT)
os.kill(os.getpid(), signal.SIGINT)
"""


# a UserError is an exception too
WAYS_OUT = [("exception", 1), ("keyboard", -signal.SIGINT), ("second_ctrl_c", 130)]


@pytest.mark.parametrize("how, code", WAYS_OUT)
def test_the_lock_is_released_on_every_way_out(tmp_path, how, code):
    result = run_script("-c", RELEASE, str(tmp_path), how)
    assert result.returncode == code, result.stderr
    assert not (tmp_path / LOCK_NAME).exists()


def test_two_live_runs_then_a_killed_runs_lock_taken_over(tiny_data, tmp_path):
    """A run holds its out_dir: a second is refused with one line naming it; killed (SIGKILL: no
    chance to release the lock), the next run takes the lock over, says so, trains and releases it;
    an eval_only resume evaluates the checkpoint whose max_iters is reached."""
    out = tmp_path / "out dir"
    flags = [
        *TINY_MODEL,
        f"--data_dir={tiny_data}",
        "--dataset=tiny",
        f"--out_dir={out}",
        "--eval_iters=1",
    ]
    first = subprocess.Popen(
        [sys.executable, "train.py", *flags, "--max_iters=100000", "--eval_interval=100000"],
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        for line in first.stdout:
            if line.startswith("step 0:"):
                break
        second = refuse_train(tiny_data, out, "--max_iters=2")
        assert_one_line_error(second, f"out_dir {out} is in use by another run", f"pid {first.pid}")
    finally:
        first.kill()
        first.communicate()
    assert json.loads((out / LOCK_NAME).read_text())["pid"] == first.pid
    third = run_train(tiny_data, out, "--max_iters=2", "--eval_interval=2", "--eval_iters=1")
    assert third.returncode == 0, third.stderr
    assert (
        f"taking over the lock of a run that is no longer running (pid {first.pid}" in third.stdout
    )
    assert not (out / LOCK_NAME).exists()
    evaluated = run_train(
        tiny_data, out, "--init_from=resume", "--eval_only=True", "--eval_iters=1"
    )
    assert evaluated.returncode == 0, evaluated.stderr
    assert "step 2: train loss" in evaluated.stdout and not (out / LOCK_NAME).exists()


def test_overwrite_replaces_the_earlier_run(tiny_data, tmp_path, variants):
    out = tmp_path / "out"
    out.mkdir()
    for name in ("ckpt-0000100.pt", "ckpt.pt", "ckpt-best.pt"):
        (out / name).write_bytes(variants[0]["ours"])
    (out / "log.jsonl").write_text('{"iter": 100, "val_loss": 1.0}\n')
    (out / "notes.txt").write_text("mine")
    result = run_train(
        tiny_data, out, "--overwrite=True", "--max_iters=2", "--eval_interval=2", "--eval_iters=1"
    )
    assert result.returncode == 0, result.stderr
    assert (
        "overwrite=True: deleted the earlier run's ckpt.pt, ckpt-best.pt, ckpt-0000100.pt, "
        "log.jsonl" in result.stdout
    )
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "ckpt-0000002.pt",
        "ckpt-best.pt",
        "ckpt.pt",
        "log.jsonl",
        "manifest.json",
        "notes.txt",
    ]
    assert [json.loads(line)["iter"] for line in (out / "log.jsonl").read_text().splitlines()][
        0
    ] == 0
    assert torch.load(out / "ckpt-best.pt", weights_only=True)["iter_num"] == 2


def test_torchrun_refusing_on_rank_0_stops_every_rank(tiny_data, tmp_path, variants):
    """Rank 0 refuses an out_dir that holds checkpoints; torchrun stops the other rank, nothing
    hangs."""
    (tmp_path / "ckpt.pt").write_bytes(variants[0]["ours"])
    before = (tmp_path / "ckpt.pt").read_bytes()
    start = time.monotonic()
    result = run_train(tiny_data, tmp_path, "--max_iters=2", ranks=2)
    assert result.returncode != 0 and time.monotonic() - start < 120
    assert "error: out_dir" in result.stderr and "overwrite=True" in result.stderr
    assert (
        sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]
        and (tmp_path / "ckpt.pt").read_bytes() == before
    )


def test_sample_and_export_read_an_out_dir_that_a_run_holds(tmp_path, variants):
    out = tmp_path / "out"
    out.mkdir()
    (out / "ckpt.pt").write_bytes(variants[0]["ours"])
    (out / LOCK_NAME).write_text(LIVE_LOCK[f"out/{LOCK_NAME}"])
    sample = run_in_process(
        "sample.py",
        f"--out_dir={out}",
        "--device=cpu",
        "--start=abc",
        "--num_samples=1",
        "--max_new_tokens=5",
    )
    assert sample.returncode == 0, sample.stderr
    pytest.importorskip("safetensors")
    export = run_in_process("export.py", f"--out_dir={out}", f"--export_dir={tmp_path / 'hf'}")
    assert export.returncode == 0, export.stderr
    assert (out / LOCK_NAME).read_text() == LIVE_LOCK[f"out/{LOCK_NAME}"]


def test_a_run_refused_at_its_last_check_has_written_nothing(tiny_data, tmp_path):
    """wandb_log=True without wandb: the last check before the run takes out_dir, after the model is
    built."""
    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed")
    result = refuse_train(tiny_data, tmp_path / "out", "--wandb_log=True", "--max_iters=1")
    assert_one_line_error(result, "wandb_log=True needs wandb")
    assert not (tmp_path / "out").exists()


# -- issue 31
# --------------------------------------------------------------------------------------------------


SHORT = ("--eval_interval=2", "--eval_iters=1", "--log_interval=1")


def seen_at_start(out: Path) -> tuple:
    """What train.py's start sees of out_dir (guard/out_dir.admit_out_dir), in this process:
    claim_out_dir checks it again under the lock."""
    from nanogpt_perf.guard.out_dir import admit_out_dir

    return admit_out_dir(out, scratch=False, overwrite=False, eval_only=False)


def test_a_run_admitted_into_an_empty_out_dir_is_refused_if_another_used_it_meanwhile(
    tiny_data, tmp_path
):
    from nanogpt_perf.errors import UserError
    from nanogpt_perf.train.checkpoint import claim_out_dir
    from nanogpt_perf.train.parallel import Ranks

    out = tmp_path / "out"
    seen = seen_at_start(out)  # admitted while out_dir is empty
    # another run starts, trains and ends there
    other = run_train(tiny_data, out, *SHORT, "--max_iters=2")
    assert other.returncode == 0, other.stderr
    before = contents(out)
    with pytest.raises(UserError, match="holds an earlier run's checkpoints"):
        claim_out_dir(out, False, False, False, seen, Ranks(device="cpu"))
    # the other run's checkpoints and log as it left them, the lock released
    assert contents(out) == before


def test_a_resume_admitted_on_one_checkpoint_is_refused_if_another_run_saved_meanwhile(
    tiny_data, tmp_path
):
    from nanogpt_perf.errors import UserError
    from nanogpt_perf.train.checkpoint import claim_out_dir
    from nanogpt_perf.train.parallel import Ranks

    out = tmp_path / "out"
    assert run_train(tiny_data, out, *SHORT, "--max_iters=2").returncode == 0
    seen = seen_at_start(out)  # a resume that has seen ckpt.pt at iter 2
    # resumed and saved at iter 4
    other = run_train(tiny_data, out, *SHORT, "--init_from=resume", "--max_iters=4")
    assert other.returncode == 0, other.stderr
    with pytest.raises(UserError, match="changed while this run was starting"):
        claim_out_dir(out, True, False, False, seen, Ranks(device="cpu"))
    assert not (out / "train.lock").exists()


def test_a_claim_on_an_unchanged_out_dir_takes_the_lock(tiny_data, tmp_path):
    from nanogpt_perf.train.checkpoint import claim_out_dir
    from nanogpt_perf.train.parallel import Ranks

    out = tmp_path / "out"
    lock = claim_out_dir(out, False, False, False, seen_at_start(out), Ranks(device="cpu"))
    assert (out / "train.lock").is_file()
    lock.release()


@pytest.mark.parametrize("where", ["/proc/x", "/proc/self/x/y", "/sys/x"])
def test_an_out_dir_that_cannot_be_written_is_refused_before_any_work(tiny_data, where):
    result = refuse_train(tiny_data, Path(where), "--max_iters=1")
    assert_one_line_error(result, f"out_dir {where} cannot be written", "choose another out_dir")
    assert "vocab_size" not in result.stdout  # refused before the data


def test_an_out_dir_in_a_read_only_folder_is_refused(tiny_data, tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes into any folder")
    (tmp_path / "ro").mkdir(mode=0o555)
    assert_one_line_error(refuse_train(tiny_data, tmp_path / "ro" / "out"), "is not writable")


def test_an_out_dir_that_is_a_link_is_the_folder_it_names(tiny_data, tmp_path):
    """A link to a folder elsewhere (a larger disk): documented as taken, its checkpoints files in
    that folder."""
    (tmp_path / "disk").mkdir()
    (tmp_path / "out").symlink_to(tmp_path / "disk")
    result = run_train(tiny_data, tmp_path / "out", *SHORT, "--max_iters=2")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "disk" / "ckpt-0000002.pt").is_file() and (tmp_path / "out").is_symlink()


# -- issue 44: what a run reads or writes in out_dir that is no file ----------------------------

NOT_FILES = {  # what a name can be instead of a file, made by
    "a FIFO (a named pipe)": os.mkfifo,
    "a folder": os.mkdir,
    "a link to nothing": lambda path: os.symlink("nowhere", path),
}
RUN_NAMES = [LOCK_NAME, "ckpt.pt", "ckpt-0000002.pt", "log.jsonl"]


def out_dir_with(tmp_path: Path, name: str, kind: str, checkpoint: bytes) -> Path:
    """out_dir holding a resumable checkpoint, and kind at name."""
    out = tmp_path / "out"
    out.mkdir()
    if name != "ckpt.pt":
        (out / "ckpt.pt").write_bytes(checkpoint)
    NOT_FILES[kind](out / name)
    return out


@pytest.mark.parametrize("name", RUN_NAMES)
def test_a_fifo_in_out_dir_is_refused_and_never_waited_on(name, tiny_data, variants, tmp_path):
    """A FIFO's open waits for a writer: a resume blocked on a FIFO train.lock for ever. In a
    process of its own, so that a wait fails the test instead of hanging the suite."""
    out = out_dir_with(tmp_path, name, "a FIFO (a named pipe)", variants[0]["ours"])
    flags = (*TINY_MODEL, f"--data_dir={tiny_data}", "--dataset=tiny", f"--out_dir={out}", RESUME)
    result = run_script("train.py", *flags, timeout=120)
    assert_one_line_error(result, f"{out / name} is a FIFO (a named pipe), not a file")
    assert (out / name).is_fifo()


@pytest.mark.parametrize("kind", ["a folder", "a link to nothing"])
@pytest.mark.parametrize("name", RUN_NAMES)
def test_a_folder_or_a_link_to_nothing_is_refused(name, kind, tiny_data, variants, tmp_path):
    out = out_dir_with(tmp_path, name, kind, variants[0]["ours"])
    assert_one_line_error(refuse_train(tiny_data, out, RESUME), f"{out / name} is {kind}")
    assert os.path.lexists(out / name)


def test_an_out_dir_that_is_a_link_to_nothing_is_refused_in_one_line(tiny_data, tmp_path):
    (tmp_path / "out").symlink_to(tmp_path / "nowhere")
    result = refuse_train(tiny_data, tmp_path / "out")
    said = (f"out_dir {tmp_path / 'out'} cannot be made", "is a link to nothing, not a folder")
    assert_one_line_error(result, *said)
    assert not (tmp_path / "nowhere").exists()


def test_sample_names_a_checkpoint_that_is_a_folder_for_what_it_is(tmp_path):
    """It said 'no checkpoint at ...'."""
    path = tmp_path / "out" / "ckpt.pt"
    path.mkdir(parents=True)
    result = run_in_process("sample.py", f"--out_dir={path.parent}", "--device=cpu")
    assert_one_line_error(result, f"checkpoint {path} is a folder, not a file")


def test_a_lock_that_is_a_fifo_never_blocks_a_release(tmp_path):
    """A lock replaced by a FIFO under a running run: its release at exit never waits on it."""
    code = f"""
import os
from pathlib import Path
from nanogpt_perf.guard.lock import OutDirLock
lock = OutDirLock(Path({str(tmp_path)!r}))
lock.claim()
os.unlink(lock.path)
os.mkfifo(lock.path)
lock.release()
print("released")
"""
    result = run_script("-c", code, timeout=60)
    assert result.returncode == 0 and result.stdout == "released\n", result.stderr
    assert (tmp_path / LOCK_NAME).is_fifo()
