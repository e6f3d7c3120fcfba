"""Hostile runs: an out_dir belongs to one run, a resume must have iterations left, checkpoints that are not ours
or nanoGPT's are refused, and so are torchrun's variables set by hand and wrong. Each refusal is one 'error: ' line
with every file as it was (tests/test_bad_input.py's Case and run_case, inside this process); what is accepted does
what it says (a few real runs: two live runs on one out_dir, a killed run's lock taken over, overwrite=True, the
command printed after SIGTERM run as printed, a run that ends on non-finite steps)."""

import copy
import importlib.util
import io
import json
import os
import pickle
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

from conftest import (
    DATA,
    ROOT,
    TINY_MODEL,
    Case,
    assert_one_line_error,
    refuse_train,
    run_case,
    run_in_process,
    run_script,
    run_train,
    sigterm_at,
)
from model import GPT, GPTConfig
from nanogpt_perf.errors import UserError
from nanogpt_perf.guard.dataset import dataset_identity
from nanogpt_perf.guard.out_dir import LOCK_NAME, OutDirLock, is_running, process_start, process_stat
from nanogpt_perf.train.parallel import torchrun_problem, torchrun_rank
from nanogpt_perf.train.preemption import resume_command

TORCHRUN = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE")
LAUNCH = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29533"}


def lock_text(pid: int, host: str, start: str | None) -> str:
    return json.dumps({"pid": pid, "host": host, "process_start": start, "started": "2026-01-01T00:00:00+00:00"})


LIVE_LOCK = {f"out/{LOCK_NAME}": lock_text(os.getpid(), socket.gethostname(), process_start(os.getpid()))}
OTHER_HOST_LOCK = {f"out/{LOCK_NAME}": lock_text(4242, "another-host.example", None)}


class Hostile(NamedTuple):
    case: Case  # train.py (or sample.py, export.py), its flags, what the line must say, text files made first
    checkpoint: str | None = None  # a variant (VARIANTS) written to out/ckpt.pt first
    env: dict[str, str] = {}  # torchrun's variables, as set by hand


def train(flags: str, *names: str, files: dict | None = None, **kw) -> Hostile:
    return Hostile(Case("train.py", flags, names, files or {}), **kw)


RESUME = "--init_from=resume"
CASES = {
    # an out_dir holds one run
    "scratch_over_checkpoints": train("", "holds an earlier run's checkpoints (ckpt.pt)", "overwrite=True",
                                      checkpoint="ours"),
    "folder_weights_over_checkpoints": train("--init_from={dir}/hf", "earlier run's checkpoints", "overwrite=True",
                                             files={"hf/config.json": "{}"}, checkpoint="ours"),
    "eval_only_scratch_over_checkpoints": train("--eval_only=True", "earlier run's checkpoints", "another out_dir",
                                                checkpoint="ours"),
    "scratch_over_numbered_checkpoints": train("", "(ckpt-0000005.pt)", "init_from=resume",
                                               files={"out/ckpt-0000005.pt": "x"}),
    "live_run_holds_out_dir": train("", "is in use by another run", f"pid {os.getpid()}", files=LIVE_LOCK),
    "live_run_holds_out_dir_resume": train(RESUME, "is in use by another run", files=LIVE_LOCK, checkpoint="ours"),
    "lock_of_another_host": train("", "another host", "another-host.example", f"delete {{dir}}/out/{LOCK_NAME}",
                                  files=OTHER_HOST_LOCK),
    "lock_not_ours": train("", f"out/{LOCK_NAME} is not a lock of train.py's", files={f"out/{LOCK_NAME}": "garbage"}),
    "lock_with_pid_0": train("", "is not a lock of train.py's", files={f"out/{LOCK_NAME}": lock_text(0, "h", None)}),
    "out_dir_is_a_file": train("", "is a file, not a folder", files={"out": "a file"}),
    "out_dir_inside_a_file": train("--out_dir={dir}/file/out", "{dir}/file is a file", files={"file": "a file"}),
    # a resume must have iterations left
    "resume_max_iters_below": train(RESUME + " --max_iters=3", "checkpoint in {dir}/out is at iter 5 and max_iters=3",
                                    "nothing to train", checkpoint="ours"),
    "resume_max_iters_equal": train(RESUME + " --max_iters=5", "at iter 5 and max_iters=5", checkpoint="ours"),
    "resume_saved_max_iters": train(RESUME, "at iter 5 and max_iters=5", "eval_only=True", checkpoint="ours"),
    # checkpoints that are not ours or nanoGPT's
    "a_random_dict": train(RESUME, "not a nanogpt-perf checkpoint (missing model, model_args)", checkpoint="dict"),
    "a_tensor": train(RESUME, "not a nanogpt-perf checkpoint", checkpoint="tensor"),
    "a_list": train(RESUME, "not a nanogpt-perf checkpoint", checkpoint="list"),
    "a_pickled_class": train(RESUME, "holds a Python object", "not loaded (it could run code)", checkpoint="class"),
    "a_plain_pickle": train(RESUME, "truncated or not a checkpoint", checkpoint="pickle"),
    "a_zip_not_a_checkpoint": train(RESUME, "corrupt or not a torch checkpoint", checkpoint="zip"),
    "an_empty_file": train(RESUME, "truncated or not a checkpoint", checkpoint="empty"),
    "model_args_missing_a_key": train(RESUME, "weights lack transformer.h.0.attn.c_attn.bias (its model_args lack "
                                      "bias: GPTConfig's defaults were taken)", checkpoint="no_bias"),
    "model_args_missing_vocab_size": train(RESUME, "(16, 8), its model_args make it (50304, 8)", "lack vocab_size",
                                           checkpoint="no_vocab"),
    "model_args_wrong_type": train(RESUME, "model_args' n_layer must be an int >= 1, not '2'", checkpoint="str_layers"),
    "model_args_zero": train(RESUME, "model_args' n_head must be an int >= 1, not 0", checkpoint="zero_heads"),
    "model_args_not_a_dict": train(RESUME, "model_args are a list, not a dict", checkpoint="args_list"),
    "model_args_bad_dropout": train(RESUME, "dropout must be a number in [0, 1), not 'high'", checkpoint="dropout"),
    "model_args_more_layers": train(RESUME, "n_layer=3, its weights hold 2 layers", checkpoint="three_layers"),
    "model_args_other_shape": train(RESUME, "transformer.wte.weight is (16, 8), its model_args make it (32, 8)",
                                    checkpoint="vocab_32"),
    "model_args_inconsistent": train(RESUME, "n_embd=8 is not divisible by n_head=3", checkpoint="three_heads"),
    "model_not_a_state_dict": train(RESUME, "its model is not a state dict", checkpoint="model_list"),
    "iter_num_a_string": train(RESUME, "iter_num must be an int >= 0, not '5'", checkpoint="iter_str"),
    "iter_num_negative": train(RESUME, "iter_num must be an int >= 0, not -1", checkpoint="iter_neg"),
    "best_val_loss_a_string": train(RESUME, "best_val_loss must be a number, not 'low'", checkpoint="best_str"),
    "optimizer_missing": train(RESUME, "its optimizer is not an optimizer's state dict", checkpoint="no_optimizer"),
    "config_not_a_dict": train(RESUME, "its config", "is not a dict", checkpoint="config_str"),
    "config_value_wrong_type": train(RESUME, "settings are not this train.py's", "max_iters must be int",
                                     checkpoint="config_type"),
    "config_value_out_of_range": train(RESUME, "the checkpoint's eval_interval=0 is not valid here (>= 1)",
                                       "give eval_interval", checkpoint="config_range"),
    "ranks_not_a_list": train(RESUME, "its ranks", "are not a list of dicts", checkpoint="ranks_str"),
    "model_args_an_unknown_option": train(RESUME, "its model_args name rotary_v2: an option this code does not know",
                                          checkpoint="unknown_option"),
    # what a resumed run cannot change, and the data it resumes on
    "resume_with_another_optimizer": train(RESUME + " --max_iters=10 --optimizer=muon", "cannot resume with "
                                           "optimizer='muon' (checkpoint: 'adamw')", checkpoint="ours"),
    "resume_with_rotary": train(RESUME + " --max_iters=10 --rotary=True", "rotary=True (checkpoint: False)",
                                checkpoint="ours"),
    "resume_on_changed_data": train(RESUME + " --max_iters=10", "dataset tiny changed since the checkpoint was saved",
                                    "train.bin has", "--allow_changed_data=True", files=DATA, checkpoint="other_data"),
    "resume_on_other_data_elsewhere": train(RESUME + " --max_iters=10", "cannot resume with data_dir=",
                                            "not the checkpoint's data (train.bin has", "--allow_changed_data=True",
                                            files=DATA, checkpoint="other_data_dir"),
    "resume_on_removed_meta": train(RESUME + " --max_iters=10", "meta.pkl", "--allow_changed_data=True", files=DATA,
                                    checkpoint="other_meta"),
    "sample_model_args_missing_a_key": Hostile(Case("sample.py", "", ("lack bias",)), checkpoint="no_bias"),
    "sample_model_args_bad_attention": Hostile(Case("sample.py", "", ("attention must be one of",)),
                                               checkpoint="attention"),
    "sample_model_args_an_unknown_option": Hostile(Case("sample.py", "", ("an option this code does not know",)),
                                                   checkpoint="unknown_option"),
    "export_the_recipe_architecture": Hostile(Case("export.py", "", ("transformers' GPT-2 has no relu2",)),
                                              checkpoint="relu2"),
    "export_other_shape": Hostile(Case("export.py", "", ("its model_args make it (32, 8)",)), checkpoint="vocab_32"),
    # torchrun's variables set by hand
    "rank_alone": train("", "RANK set but not LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT", "torchrun",
                        env={"RANK": "1"}),
    "world_size_alone": train("", "WORLD_SIZE set but not RANK", "unset WORLD_SIZE", env={"WORLD_SIZE": "2"}),
    "no_master_addr": train("", "set but not MASTER_ADDR, MASTER_PORT",
                            env={"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}),
    "rank_beyond_world_size": train("", "RANK must be in [0, WORLD_SIZE=2), not 5", env=LAUNCH | {"RANK": "5"}),
    "rank_negative": train("", "RANK must be in [0, WORLD_SIZE=2), not -1", env=LAUNCH | {"RANK": "-1"}),
    "local_rank_not_an_int": train("", "LOCAL_RANK must be an integer, not 'gpu0'",
                                   env=LAUNCH | {"LOCAL_RANK": "gpu0"}),
    "local_rank_beyond": train("", "LOCAL_RANK must be in [0, WORLD_SIZE=2), not 2", env=LAUNCH | {"LOCAL_RANK": "2"}),
    "world_size_zero": train("", "WORLD_SIZE must be >= 1, not 0", env=LAUNCH | {"WORLD_SIZE": "0"}),
    "rank_empty": train("", "RANK must be an integer, not ''", env=LAUNCH | {"RANK": ""}),
    "master_port_out_of_range": train("", "MASTER_PORT must be a port number", env=LAUNCH | {"MASTER_PORT": "99999"}),
}  # fmt: skip


class _Payload:
    """Unpickling this would call Path.touch(marker): what a hostile checkpoint could do with any callable."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (type(self.marker).touch, (self.marker,))


def saved(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def resumable_checkpoint() -> dict:
    """A checkpoint as nanoGPT's train.py writes one (at iter 5, max_iters 5), with our tokenizer for sample.py."""
    torch.manual_seed(0)
    model_args = dict(n_layer=2, n_head=2, n_embd=8, block_size=16, bias=False, vocab_size=16, dropout=0.0)
    model = GPT(GPTConfig(**model_args))
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
    config = dict(dataset="tiny", max_iters=5, eval_interval=5, eval_iters=2, batch_size=8, learning_rate=1e-3)
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "model_args": model_args,
            "iter_num": 5, "best_val_loss": torch.tensor(3.25), "config": config,
            "tokenizer": {"kind": "characters", "itos": list("abcdefgh ")}}  # fmt: skip


def identity_of(files: dict[str, bytes], folder: Path) -> dict:
    """The identity that a run records of the dataset tiny made of files (test_hostile_inputs' DATA) in folder."""
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return dataset_identity(folder / "data" / "tiny")


def variant(base: dict, change) -> bytes:
    checkpoint = copy.deepcopy(base)
    change(checkpoint)
    return saved(checkpoint)


def zip_bytes() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("archive/data.pkl", b"not a pickle")
    return buffer.getvalue()


def other_shape(c: dict) -> None:
    c["model_args"]["vocab_size"] = 32


@pytest.fixture(scope="module")
def variants(tmp_path_factory) -> tuple[dict[str, bytes], Path]:
    """Each checkpoint the cases name, and the file that unpickling the hostile one would create."""
    base, marker = resumable_checkpoint(), tmp_path_factory.mktemp("marker") / "it-ran"
    identity = identity_of(DATA, tmp_path_factory.mktemp("data"))  # DATA's files, as a run on them records them
    files, other = identity["files"], {"bytes": 2, "fingerprint": "0" * 32}
    args = lambda key, value: lambda c: c["model_args"].__setitem__(key, value)  # noqa: E731
    top = lambda key, value: lambda c: c.__setitem__(key, value)  # noqa: E731
    made = {
        "ours": saved(base),
        "dict": saved({"a": 1, "b": [1, 2]}),
        "tensor": saved(torch.zeros(3)),
        "list": saved([1, 2, 3]),
        "class": saved({"model": _Payload(marker), "model_args": {}}),
        "pickle": pickle.dumps({"model": {}, "model_args": {}}),
        "zip": zip_bytes(),
        "empty": b"",
        "no_bias": variant(base, lambda c: c["model_args"].pop("bias")),
        "no_vocab": variant(base, lambda c: c["model_args"].pop("vocab_size")),
        "attention": variant(base, args("attention", "flash9")),
        "str_layers": variant(base, args("n_layer", "2")),
        "zero_heads": variant(base, args("n_head", 0)),
        "args_list": variant(base, top("model_args", [2, 2, 8])),
        "dropout": variant(base, args("dropout", "high")),
        "three_layers": variant(base, args("n_layer", 3)),
        "vocab_32": variant(base, other_shape),
        "three_heads": variant(base, args("n_head", 3)),
        "model_list": variant(base, top("model", [1, 2])),
        "iter_str": variant(base, top("iter_num", "5")),
        "iter_neg": variant(base, top("iter_num", -1)),
        "best_str": variant(base, top("best_val_loss", "low")),
        "no_optimizer": variant(base, lambda c: c.pop("optimizer")),
        "config_str": variant(base, top("config", "max_iters=5")),
        "config_type": variant(base, lambda c: c["config"].update(max_iters="ten")),
        "config_range": variant(base, lambda c: c["config"].update(eval_interval=0)),
        "ranks_str": variant(base, top("ranks", "rank 0")),
        "unknown_option": variant(base, args("rotary_v2", True)),
        "relu2": variant(base, args("relu2", True)),
        "other_data": variant(base, top("data_identity", identity | {"files": files | {"train.bin": other}})),
        "other_data_dir": variant(
            base,
            lambda c: c.update(
                data_identity=identity | {"files": files | {"train.bin": other}},
                config=c["config"] | {"data_dir": "/elsewhere"},
            ),
        ),
        "other_meta": variant(base, top("data_identity", identity | {"files": files | {"meta.pkl": other}})),
    }
    return made, marker


@pytest.mark.parametrize("name", CASES)
def test_refused_with_one_line_and_nothing_written(name, variants, tmp_path, monkeypatch):
    hostile, (made, marker) = CASES[name], variants
    for key in TORCHRUN:
        monkeypatch.delenv(key, raising=False)
    for key, value in hostile.env.items():
        monkeypatch.setenv(key, value)
    if hostile.checkpoint:
        (tmp_path / "out").mkdir(exist_ok=True)
        (tmp_path / "out" / "ckpt.pt").write_bytes(made[hostile.checkpoint])
    result, before, after = run_case(hostile.case, tmp_path, made["ours"])
    assert_one_line_error(result, *(n.replace("{dir}", str(tmp_path)) for n in hostile.case.names))
    assert after == before
    assert not marker.exists()


def test_the_matrix_is_large_enough():
    assert len(CASES) >= 30


def test_a_resume_on_the_same_data_by_another_spelling_goes_on(tiny_data, tmp_path):
    """The data folder named by a link, from another working directory: the same files, the same run."""
    out = tmp_path / "out"
    first = run_train(tiny_data, out, "--max_iters=2", "--eval_interval=2", "--eval_iters=1")
    assert first.returncode == 0, first.stderr
    (tmp_path / "link").symlink_to(tiny_data)
    resumed = run_train(tmp_path / "link", out, "--init_from=resume", "--max_iters=3", "--eval_iters=1")
    assert resumed.returncode == 0, resumed.stderr


def test_changed_data_accepted_by_the_flag_says_so(tiny_data, tmp_path):
    out, data = tmp_path / "out", tmp_path / "data"
    shutil.copytree(tiny_data, data)
    first = run_train(data, out, "--max_iters=2", "--eval_interval=2", "--eval_iters=1")
    assert first.returncode == 0, first.stderr
    tokens = (data / "tiny" / "train.bin").read_bytes()
    (data / "tiny" / "train.bin").write_bytes(tokens[2:] + tokens[:2])  # the same size, other tokens
    resumed = run_train(data, out, "--init_from=resume", "--max_iters=3", "--eval_iters=1", "--allow_changed_data=True")
    assert resumed.returncode == 0, resumed.stderr
    assert "train.bin has other contents" in resumed.stdout and "as allow_changed_data=True asks" in resumed.stdout


def test_a_home_path_in_a_flag_is_expanded(tiny_data, tmp_path, monkeypatch):
    """--out_dir=~/out: no shell expands ~ inside a flag; the configurator does, in every path setting."""
    monkeypatch.setenv("HOME", str(tmp_path))
    result = run_train(tiny_data, "~/out", "--max_iters=1", "--eval_interval=1", "--eval_iters=1")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "ckpt.pt").is_file() and not (ROOT / "~").exists()


def test_sigterm_during_an_evaluation_stops_at_its_next_batch(tiny_data, tmp_path):
    """An evaluation of a million batches, SIGTERM as it starts: the run stops at a batch boundary, not at its end."""
    out = tmp_path / "out"
    flags = [*TINY_MODEL, f"--data_dir={tiny_data}", "--dataset=tiny", f"--out_dir={out}", "--eval_iters=1000000"]
    run = subprocess.Popen([sys.executable, "train.py", *flags, "--max_iters=2"], cwd=ROOT, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    while not (out / "manifest.json").exists() and run.poll() is None:  # written once SIGTERM stops it cleanly
        time.sleep(0.05)
    time.sleep(0.5)  # in the evaluation of iter 0
    run.send_signal(signal.SIGTERM)
    stdout, stderr = run.communicate(timeout=120)
    assert run.returncode == 0, stderr
    assert "stopped by SIGTERM after iter 0, before any checkpoint" in stdout and "step 0:" not in stdout


# -- the lock itself ---------------------------------------------------------------------------------------------


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
    """The pid is alive but started at another time than the lock says: the run that wrote it is dead."""
    if process_start(os.getpid()) is None:
        pytest.skip("no /proc: start times cannot be told apart")
    (tmp_path / LOCK_NAME).write_text(lock_text(os.getpid(), socket.gethostname(), "1"))
    lock = OutDirLock(tmp_path)
    lock.claim()
    assert "taking over the lock of a run that is no longer running" in capsys.readouterr().out
    lock.release()


def test_a_lock_of_a_process_that_ended_unreaped_is_stale():
    """A killed run whose parent has not collected it yet (a zombie) still has its pid, but runs no more."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        holder = {"pid": child.pid, "host": socket.gethostname(), "process_start": process_start(child.pid)}
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
from nanogpt_perf.guard.out_dir import OutDirLock
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


WAYS_OUT = [("exception", 1), ("keyboard", -signal.SIGINT), ("second_ctrl_c", 130)]  # a UserError is an exception too


@pytest.mark.parametrize("how, code", WAYS_OUT)
def test_the_lock_is_released_on_every_way_out(tmp_path, how, code):
    result = run_script("-c", RELEASE, str(tmp_path), how)
    assert result.returncode == code, result.stderr
    assert not (tmp_path / LOCK_NAME).exists()


# -- real runs ---------------------------------------------------------------------------------------------------


def test_two_live_runs_then_a_killed_runs_lock_taken_over(tiny_data, tmp_path):
    """A run holds its out_dir: a second is refused with one line naming it; killed (SIGKILL: no chance to release
    the lock), the next run takes the lock over, says so, trains and releases it; an eval_only resume evaluates
    the checkpoint whose max_iters is reached."""
    out = tmp_path / "out dir"
    flags = [*TINY_MODEL, f"--data_dir={tiny_data}", "--dataset=tiny", f"--out_dir={out}", "--eval_iters=1"]
    first = subprocess.Popen([sys.executable, "train.py", *flags, "--max_iters=100000", "--eval_interval=100000"],
                             cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
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
    assert f"taking over the lock of a run that is no longer running (pid {first.pid}" in third.stdout
    assert not (out / LOCK_NAME).exists()
    evaluated = run_train(tiny_data, out, "--init_from=resume", "--eval_only=True", "--eval_iters=1")
    assert evaluated.returncode == 0, evaluated.stderr
    assert "step 2: train loss" in evaluated.stdout and not (out / LOCK_NAME).exists()


def test_overwrite_replaces_the_earlier_run(tiny_data, tmp_path, variants):
    out = tmp_path / "out"
    out.mkdir()
    for name in ("ckpt-0000100.pt", "ckpt.pt", "ckpt-best.pt"):
        (out / name).write_bytes(variants[0]["ours"])
    (out / "log.jsonl").write_text('{"iter": 100, "val_loss": 1.0}\n')
    (out / "notes.txt").write_text("mine")
    result = run_train(tiny_data, out, "--overwrite=True", "--max_iters=2", "--eval_interval=2", "--eval_iters=1")
    assert result.returncode == 0, result.stderr
    assert (
        "overwrite=True: deleted the earlier run's ckpt.pt, ckpt-best.pt, ckpt-0000100.pt, log.jsonl" in result.stdout
    )
    names = sorted(p.name for p in out.iterdir())
    assert names == ["ckpt-0000002.pt", "ckpt-best.pt", "ckpt.pt", "log.jsonl", "manifest.json", "notes.txt"]
    assert [json.loads(line)["iter"] for line in (out / "log.jsonl").read_text().splitlines()][0] == 0
    assert torch.load(out / "ckpt-best.pt", weights_only=True)["iter_num"] == 2


@pytest.mark.slow
def test_the_command_printed_after_sigterm_runs_as_printed_with_a_space_in_out_dir(tiny_data, tmp_path):
    out = tmp_path / "my out"
    flags = [*TINY_MODEL, f"--data_dir={tiny_data}", "--dataset=tiny", f"--out_dir={out}", "--eval_iters=1"]
    returncode, stdout, stderr = sigterm_at("train.py", *flags, "--max_iters=12", "--eval_interval=100", line="iter 2:")
    assert returncode == 0, stderr
    printed = stdout.split(": resume with\n  ")[1].splitlines()[0]
    command = shlex.split(printed)
    assert command[0] == sys.executable and f"--out_dir={out}" in command and command[-1] == "--init_from=resume"
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
    assert command == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
                       "train.py", "config/x.py", "--out_dir=a b", "--init_from=resume"]  # fmt: skip
    assert shlex.split(resume_command(argv, {}))[:2] == [sys.executable, "train.py"]


def test_a_run_that_ends_on_non_finite_steps_saves_nothing_and_fails(tiny_data, tmp_path):
    out = tmp_path / "out"
    result = run_train(tiny_data, out, "--learning_rate=1e30", "--warmup_iters=0", "--max_iters=4",
                       "--eval_interval=2", "--eval_iters=1")  # fmt: skip
    assert_one_line_error(result, "the run ended at iter 4 on 3 non-finite steps, unsaved", "no checkpoint was saved")
    assert "iter 2: not saved, the last step was not finite" in result.stdout
    assert not list(out.glob("ckpt*")) and not (out / LOCK_NAME).exists()


def test_torchrun_refusing_on_rank_0_stops_every_rank(tiny_data, tmp_path, variants):
    """Rank 0 refuses an out_dir that holds checkpoints; torchrun stops the other rank, nothing hangs."""
    (tmp_path / "ckpt.pt").write_bytes(variants[0]["ours"])
    before = (tmp_path / "ckpt.pt").read_bytes()
    start = time.monotonic()
    result = run_train(tiny_data, tmp_path, "--max_iters=2", ranks=2)
    assert result.returncode != 0 and time.monotonic() - start < 120
    assert "error: out_dir" in result.stderr and "overwrite=True" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"] and (tmp_path / "ckpt.pt").read_bytes() == before


def test_sample_and_export_read_an_out_dir_that_a_run_holds(tmp_path, variants):
    out = tmp_path / "out"
    out.mkdir()
    (out / "ckpt.pt").write_bytes(variants[0]["ours"])
    (out / LOCK_NAME).write_text(LIVE_LOCK[f"out/{LOCK_NAME}"])
    sample = run_in_process("sample.py", f"--out_dir={out}", "--device=cpu", "--start=abc", "--num_samples=1",
                            "--max_new_tokens=5")  # fmt: skip
    assert sample.returncode == 0, sample.stderr
    pytest.importorskip("safetensors")
    export = run_in_process("export.py", f"--out_dir={out}", f"--export_dir={tmp_path / 'hf'}")
    assert export.returncode == 0, export.stderr
    assert (out / LOCK_NAME).read_text() == LIVE_LOCK[f"out/{LOCK_NAME}"]


def test_a_run_refused_at_its_last_check_has_written_nothing(tiny_data, tmp_path):
    """wandb_log=True without wandb: the last check before the run takes out_dir, after the model is built."""
    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed")
    result = refuse_train(tiny_data, tmp_path / "out", "--wandb_log=True", "--max_iters=1")
    assert_one_line_error(result, "wandb_log=True needs wandb")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "environ",
    [{}, {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}, LAUNCH, LAUNCH | {"WORLD_SIZE": "1", "RANK": "0"}],
)
def test_torchrun_variables_that_are_accepted(environ):
    """None (one process), MASTER_ADDR and MASTER_PORT alone (some clusters set them for everyone: one process),
    or all of them consistent (a launch by torchrun, or by hand, which waits for its other ranks)."""
    assert torchrun_problem(environ) is None
    assert torchrun_rank(environ) == int(environ.get("RANK", 0))
