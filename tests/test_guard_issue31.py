"""Issue 31's refusals and fixes, checked against real state (the optimizer's groups, the files on disk), not
against printed lines: a resume's settings apply; a shape flag that disagrees with the weights a run starts from is
refused; an out_dir is one run's, checked again under the lock; checkpoints are never written through a link; a
resume on data changed by one token is refused; resume_fallback finds ckpt-best.pt; an out_dir that cannot be
written is refused before any work."""

import os
import shutil
from pathlib import Path

import pytest
import torch

from conftest import (
    DATA,
    TINY_MODEL,
    assert_one_line_error,
    contents,
    hf,
    refuse_train,
    run_in_process,
    run_train,
    write_files,
)
from nanogpt_perf.guard.dataset import BLOCK, SAMPLES, dataset_identity

SHORT = ("--eval_interval=2", "--eval_iters=1", "--log_interval=1")


def optimizer_groups(out: Path) -> list[dict]:
    """The param_groups of the optimizer state out_dir/ckpt.pt holds: what the run trained with."""
    return torch.load(out / "ckpt.pt", weights_only=True)["optimizer"]["param_groups"]


# -- a resume's settings apply ------------------------------------------------------------------------------------


def test_a_resume_trains_with_the_adamw_settings_it_gives(tiny_data, tmp_path):
    out = tmp_path / "out"
    first = run_train(tiny_data, out, *SHORT, "--max_iters=2")
    assert first.returncode == 0, first.stderr
    before = optimizer_groups(out)
    assert {g["weight_decay"] for g in before} == {0.1, 0.0} and {tuple(g["betas"]) for g in before} == {(0.9, 0.95)}
    assert all(g["fused"] for g in before)
    changed = ("--weight_decay=0.05", "--beta1=0.8", "--beta2=0.9", "--fused_adamw=False")
    resumed = run_train(tiny_data, out, *SHORT, "--init_from=resume", "--max_iters=4", *changed)
    assert resumed.returncode == 0, resumed.stderr
    groups = optimizer_groups(out)
    assert torch.load(out / "ckpt.pt", weights_only=True)["iter_num"] == 4
    assert {g["weight_decay"] for g in groups} == {0.05, 0.0}  # the decayed group's, the other's none
    assert {tuple(g["betas"]) for g in groups} == {(0.8, 0.9)}
    assert not any(g["fused"] for g in groups)


def test_a_resume_trains_with_the_muon_settings_it_gives(tiny_data, tmp_path):
    out, muon = tmp_path / "out", ("--optimizer=muon", "--learning_rate=1e-3")
    first = run_train(tiny_data, out, *SHORT, *muon, "--max_iters=2")
    assert first.returncode == 0, first.stderr
    (muon_group,) = [g for g in optimizer_groups(out) if g["muon"]]
    assert (muon_group["momentum"], muon_group["ns_steps"], muon_group["weight_decay"]) == (0.95, 5, 0.0)
    assert muon_group["base_lr"] == 0.02
    changed = ("--muon_momentum=0.8", "--muon_ns_steps=3", "--muon_weight_decay=0.01", "--muon_lr=0.01")
    changed += ("--learning_rate=2e-3", "--weight_decay=0.05", "--beta1=0.8", "--beta2=0.9")
    resumed = run_train(tiny_data, out, *SHORT, *muon, "--init_from=resume", "--max_iters=4", *changed)
    assert resumed.returncode == 0, resumed.stderr
    groups = optimizer_groups(out)
    (muon_group,) = [g for g in groups if g["muon"]]
    assert (muon_group["momentum"], muon_group["ns_steps"], muon_group["weight_decay"]) == (0.8, 3, 0.01)
    assert muon_group["base_lr"] == 0.01
    adamw = [g for g in groups if not g["muon"]]
    assert {g["base_lr"] for g in adamw} == {2e-3} and {tuple(g["betas"]) for g in adamw} == {(0.8, 0.9)}
    assert {g["weight_decay"] for g in adamw} == {0.05, 0.0}


def test_muon_without_a_learning_rate_to_scale_by_is_refused(tiny_data, tmp_path):
    result = refuse_train(tiny_data, tmp_path / "out", "--optimizer=muon", "--learning_rate=0", "--min_lr=0")
    assert_one_line_error(result, "learning_rate must be > 0", "optimizer='adamw'")
    assert not (tmp_path / "out").exists()


# -- a shape flag against the weights a run starts from -----------------------------------------------------------

FROM_FOLDER = "--out_dir={dir}/out --data_dir={dir}/data --dataset=tiny --device=cpu --compile=false"
FROM_FOLDER += " --init_from={dir}/hf --block_size=16"
AGAINST_THE_WEIGHTS = {  # the flag, what the line says (the folder's GPT-2: n_layer 1, n_head 2, n_embd 8, biases)
    "n_layer": ("--n_layer=4", "the weights fix n_layer=1, not n_layer=4"),
    "n_head": ("--n_head=4", "the weights fix n_head=2, not n_head=4"),
    "n_embd": ("--n_embd=16 --n_head=2", "the weights fix n_embd=8, not n_embd=16"),
    "bias": ("--bias=False", "the weights fix bias=True, not bias=False"),
    "two_at_once": ("--n_layer=3 --n_embd=16 --n_head=2", "n_layer=1, n_embd=8, not n_layer=3, n_embd=16"),
    "an_init": ("--zero_init_proj=True", "zero_init_proj not applied, not zero_init_proj=True"),
    "a_recipe_field": ("--rotary=True", "GPT-2's weights fix its architecture; drop rotary"),
}


@pytest.mark.parametrize("name", AGAINST_THE_WEIGHTS)
def test_a_flag_that_the_weights_do_not_have_is_refused(name, tmp_path):
    flag, line = AGAINST_THE_WEIGHTS[name]
    write_files(tmp_path, DATA | hf({}))
    before = contents(tmp_path)
    result = run_in_process("train.py", *f"{FROM_FOLDER} {flag}".replace("{dir}", str(tmp_path)).split())
    assert_one_line_error(result, f"init_from={tmp_path}/hf", line)
    assert contents(tmp_path) == before


def test_a_flag_that_agrees_with_the_weights_trains_and_is_recorded(tmp_path):
    write_files(tmp_path, DATA | hf({}))
    flags = f"{FROM_FOLDER} --n_layer=1 --n_head=2 --bias=True --max_iters=1 --eval_interval=1 --eval_iters=1"
    result = run_in_process("train.py", *flags.replace("{dir}", str(tmp_path)).split())
    assert result.returncode == 0, result.stderr
    model_args = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["model_args"]
    assert (model_args["n_layer"], model_args["n_head"], model_args["n_embd"]) == (1, 2, 8)


@pytest.mark.parametrize("flag", ["--n_layer=3", "--bias=True", "--zero_init_proj=True", "--block_size=16"])
def test_a_resume_refuses_a_change_to_what_its_weights_fix(tiny_data, tmp_path, flag):
    out = tmp_path / "out"
    assert run_train(tiny_data, out, *SHORT, "--max_iters=2").returncode == 0
    before = contents(out)
    result = refuse_train(tiny_data, out, "--init_from=resume", "--max_iters=4", *SHORT, flag)
    assert_one_line_error(result, f"cannot resume with {flag[2:].split('=')[0]}=", "are fixed")
    assert contents(out) == before


def test_every_architecture_and_init_field_is_fixed_on_resume():
    from model import ARCHITECTURE, fields_of_kind
    from nanogpt_perf.guard.admission import FIXED_ON_RESUME

    assert set(ARCHITECTURE) - {"vocab_size"} <= set(FIXED_ON_RESUME)  # vocab_size: the data's, through pad_vocab
    assert set(fields_of_kind("init")) <= set(FIXED_ON_RESUME) and "pad_vocab" in FIXED_ON_RESUME


# -- an out_dir is one run's, checked again under the lock --------------------------------------------------------


def plan_for(tiny_data: Path, out: Path, *flags: str):
    """train.py's settings and the guard's Plan for them, in this process, up to the claim of out_dir."""
    from configurator import configure
    from conftest import declarations
    from nanogpt_perf.guard.admission import preflight, resolve_settings
    from nanogpt_perf.runtime import resolve_runtime
    from nanogpt_perf.train.build import TRAINING_DEFAULTS
    from nanogpt_perf.train.parallel import Ranks

    argv = [*TINY_MODEL, f"--data_dir={tiny_data}", "--dataset=tiny", f"--out_dir={out}", "--eval_iters=1", *flags]
    decl = declarations("train.py")
    settings = resolve_settings(configure(argv, defaults=TRAINING_DEFAULTS, **decl.parts), decl.cross)
    return preflight(settings, Ranks(device="cpu"), resolve_runtime("cpu", "float32", False))


def test_a_run_admitted_into_an_empty_out_dir_is_refused_if_another_used_it_meanwhile(tiny_data, tmp_path):
    from nanogpt_perf.errors import UserError
    from nanogpt_perf.guard.admission import claim_out_dir
    from nanogpt_perf.train.parallel import Ranks

    out = tmp_path / "out"
    waiting = plan_for(tiny_data, out, "--max_iters=2")  # admitted while out_dir is empty
    other = run_train(tiny_data, out, *SHORT, "--max_iters=2")  # another run starts, trains and ends there
    assert other.returncode == 0, other.stderr
    before = contents(out)
    with pytest.raises(UserError, match="holds an earlier run's checkpoints"):
        claim_out_dir(waiting, Ranks(device="cpu"))
    assert contents(out) == before  # the other run's checkpoints and log as it left them, the lock released


def test_a_resume_admitted_on_one_checkpoint_is_refused_if_another_run_saved_meanwhile(tiny_data, tmp_path):
    from nanogpt_perf.errors import UserError
    from nanogpt_perf.guard.admission import claim_out_dir
    from nanogpt_perf.train.parallel import Ranks

    out = tmp_path / "out"
    assert run_train(tiny_data, out, *SHORT, "--max_iters=2").returncode == 0
    waiting = plan_for(tiny_data, out, "--init_from=resume", "--max_iters=6")  # has read ckpt.pt at iter 2
    other = run_train(tiny_data, out, *SHORT, "--init_from=resume", "--max_iters=4")  # resumed and saved at iter 4
    assert other.returncode == 0, other.stderr
    with pytest.raises(UserError, match="changed while this run was starting"):
        claim_out_dir(waiting, Ranks(device="cpu"))
    assert not (out / "train.lock").exists()


def test_a_claim_on_an_unchanged_out_dir_takes_the_lock(tiny_data, tmp_path):
    from nanogpt_perf.guard.admission import claim_out_dir
    from nanogpt_perf.train.parallel import Ranks

    out = tmp_path / "out"
    lock = claim_out_dir(plan_for(tiny_data, out, "--max_iters=2"), Ranks(device="cpu"))
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


# -- checkpoints are out_dir's own files -------------------------------------------------------------------------


def test_a_checkpoint_replaced_by_a_link_is_not_written_through(tiny_data, tmp_path):
    out, users = tmp_path / "out", tmp_path / "users_file.pt"
    assert run_train(tiny_data, out, *SHORT, "--max_iters=2").returncode == 0
    users.write_bytes((out / "ckpt.pt").read_bytes())
    for name in ("ckpt.pt", "ckpt-best.pt", "ckpt-0000004.pt"):  # one that exists and one that the resume writes
        (out / name).unlink(missing_ok=True)
        (out / name).symlink_to(users)
    kept = users.read_bytes()
    resumed = run_train(tiny_data, out, *SHORT, "--init_from=resume", "--max_iters=4")
    assert resumed.returncode == 0, resumed.stderr
    assert users.read_bytes() == kept  # the link's target untouched
    for name in ("ckpt.pt", "ckpt-0000004.pt"):
        assert not (out / name).is_symlink() and (out / name).is_file()
    assert torch.load(out / "ckpt.pt", weights_only=True)["iter_num"] == 4


def test_an_out_dir_that_is_a_link_is_the_folder_it_names(tiny_data, tmp_path):
    """A link to a folder elsewhere (a larger disk): documented as taken, its checkpoints files in that folder."""
    (tmp_path / "disk").mkdir()
    (tmp_path / "out").symlink_to(tmp_path / "disk")
    result = run_train(tiny_data, tmp_path / "out", *SHORT, "--max_iters=2")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "disk" / "ckpt-0000002.pt").is_file() and (tmp_path / "out").is_symlink()


# -- resume_fallback finds ckpt-best.pt ----------------------------------------------------------------------------


def test_resume_fallback_takes_ckpt_best_when_it_is_the_only_whole_one(tiny_data, tmp_path):
    out = tmp_path / "out"
    assert run_train(tiny_data, out, *SHORT, "--max_iters=2").returncode == 0
    best = out / "ckpt-best.pt"
    copy = best.read_bytes()
    best.unlink()
    best.write_bytes(copy)  # a file of its own (as where the file system has no links)
    for path in [out / "ckpt.pt", *out.glob("ckpt-0*.pt")]:
        path.write_bytes(path.read_bytes()[:100])  # truncated
    refused = refuse_train(tiny_data, out, "--init_from=resume", "--max_iters=4", *SHORT)
    assert_one_line_error(refused, "the newest whole one is", "ckpt-best.pt", "resume_fallback=True")
    resumed = run_train(tiny_data, out, *SHORT, "--init_from=resume", "--max_iters=4", "--resume_fallback=True")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from" in resumed.stdout and "ckpt-best.pt" in resumed.stdout


def test_resume_fallback_prefers_a_newer_iteration_to_ckpt_best(tmp_path):
    from nanogpt_perf.guard.checkpoint import newest_whole

    for name in ("ckpt-best.pt", "ckpt-0000002.pt", "ckpt-0000004.pt"):
        torch.save({"x": 1}, tmp_path / name)
    os.utime(tmp_path / "ckpt-best.pt", ns=(1, 1))  # saved before the iterations
    assert newest_whole(tmp_path) == tmp_path / "ckpt-0000004.pt"
    (tmp_path / "ckpt-0000004.pt").write_bytes(b"torn")
    assert newest_whole(tmp_path) == tmp_path / "ckpt-0000002.pt"
    (tmp_path / "ckpt-0000002.pt").write_bytes(b"torn")
    assert newest_whole(tmp_path) == tmp_path / "ckpt-best.pt"


# -- a resume on data changed by one token -------------------------------------------------------------------------


def unsampled_offset(size: int) -> int:
    """An even byte offset inside no block that the fingerprint reads."""
    starts = [(size - BLOCK) * k // (SAMPLES - 1) for k in range(SAMPLES)]
    gap = next(a + BLOCK for a, b in zip(starts, starts[1:], strict=False) if b - a > BLOCK + 2)
    return gap + gap % 2


def test_a_resume_on_data_changed_by_one_token_is_refused(tiny_data, tmp_path):
    out, data = tmp_path / "out", tmp_path / "data"
    shutil.copytree(tiny_data, data)
    assert run_train(data, out, *SHORT, "--max_iters=2").returncode == 0
    train_bin = data / "tiny" / "train.bin"
    fingerprint = dataset_identity(data / "tiny")["files"]["train.bin"]["fingerprint"]
    tokens = bytearray(train_bin.read_bytes())
    at = unsampled_offset(len(tokens))
    tokens[at] = (tokens[at] + 1) % 60  # one token id, still inside the vocabulary
    train_bin.write_bytes(bytes(tokens))
    assert dataset_identity(data / "tiny")["files"]["train.bin"]["fingerprint"] == fingerprint  # between samples
    before = contents(out)
    refused = refuse_train(data, out, "--init_from=resume", "--max_iters=4", *SHORT)
    assert_one_line_error(refused, "dataset tiny changed since the checkpoint was saved", "train.bin has other")
    assert contents(out) == before


def test_the_whole_file_hash_is_cached_and_a_rewrite_with_the_old_mtime_is_read_again(tmp_path, monkeypatch):
    from nanogpt_perf.guard import dataset

    folder = tmp_path / "tiny"
    write_files(tmp_path, {f"tiny/{Path(k).name}": v for k, v in DATA.items()})
    first = dataset.check_token_ids(folder, 29, cache_from_bytes=0)
    read = []
    scan = dataset.scan_file
    monkeypatch.setattr(dataset, "scan_file", lambda f: read.append(f.path.name) or scan(f))
    assert dataset.check_token_ids(folder, 29, cache_from_bytes=0) == first and read == []
    stat = (folder / "train.bin").stat()
    tokens = bytearray((folder / "train.bin").read_bytes())
    tokens[1000] ^= 1
    (folder / "train.bin").write_bytes(bytes(tokens))
    os.utime(folder / "train.bin", ns=(stat.st_atime_ns, stat.st_mtime_ns))  # size and mtime as they were
    now = dataset.check_token_ids(folder, 29, cache_from_bytes=0)
    assert read == ["train.bin"] and now["train.bin"] != first["train.bin"]  # its ctime changed: read again
