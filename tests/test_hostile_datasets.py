"""Hostile datasets: token files and meta.pkl that lie about their vocabulary or size, shards with
bad headers, data folders whose code must not run, prepare scripts pointed at another kind of
dataset, a resume on data that changed. Each is refused in one 'error: ' line with every file as it
was. Then the cached scan of the token ids (a second run reads no tokens, a changed file is read
again), what is accepted (the same data by another spelling, changed data with
--allow_changed_data=True) and issue 31's one-token change."""

import json
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import (
    BPE,
    BPE_DATA,
    CHAR,
    CHARS,
    DATA,
    DOCS,
    FW,
    HF_CONFIG,
    ITOS,
    LONG,
    MARKER,
    OWT,
    RESUME,
    ROOT,
    SHARDS,
    TINY,
    TOKENS,
    B,
    Case,
    ScriptCase,
    T,
    assert_one_line_error,
    contents,
    hf,
    meta,
    refuse_case,
    refuse_run_case,
    refuse_script_case,
    refuse_train,
    run_in_process,
    run_train,
    shard,
    train_case,
    uint16,
    with_data,
    write_files,
)
from nanogpt_perf.data import identity as token_check
from nanogpt_perf.data.identity import BLOCK, CACHE_NAME, SAMPLES, check_token_ids, dataset_identity
from nanogpt_perf.errors import UserError

CASES = {
    "train-dataset_past_the_model's_vocabulary": Case(
        T,
        "--init_from={dir}/hf --block_size=16",
        ("dataset tiny has 100 tokens, more than the", "vocabulary of 64"),
        with_data(meta_pkl=meta(100, 100)) | hf({}),
    ),
    # datasets that lie: a vocabulary too small, an inconsistent meta.pkl, odd or missing token
    # files, bad shards
    "data-meta_vocab_too_small": Case(
        T,
        "",
        (
            "train.bin holds token id 28, outside the vocabulary of 20 tokens",
            "meta.pkl's vocab_size",
        ),
        with_data(meta_pkl=meta(20, 20)),
    ),
    "data-val_past_the_vocabulary": Case(
        T,
        "",
        ("val.bin holds token id 40000, outside the vocabulary of 29",),
        with_data(val_bin=uint16([1, 40000, 2])),
    ),
    "data-gpt2_tokens_past_50257": Case(
        T,
        "",
        ("tiny_train_000001.bin holds token id 60000", "50257 tokens (GPT-2's"),
        {
            "data/tiny/tiny_val_000000.bin": shard(TOKENS),
            "data/tiny/tiny_train_000001.bin": shard([*TOKENS, 60000]),
        },
    ),
    "data-stoi_not_inverse": Case(
        T,
        "",
        ("meta.pkl is not a valid meta.pkl: stoi is not the inverse of itos",),
        with_data(meta_pkl=meta(stoi={"a": 1, "b": 0})),
    ),
    "data-itos_shorter": Case(
        T, "", ("vocab_size is 30 but itos has 29 tokens",), with_data(meta_pkl=meta(30))
    ),
    "data-itos_duplicates": Case(
        T,
        "",
        ("itos gives two token ids the same string",),
        with_data(meta_pkl=meta(itos=ITOS | {1: "a"}, stoi=None)),
    ),
    "data-vocab_size_zero": Case(
        T, "", ("vocab_size must be a positive int, not 0",), with_data(meta_pkl=meta(0, 0))
    ),
    "data-vocab_size_bool": Case(
        T, "", ("vocab_size must be a positive int, not True",), with_data(meta_pkl=meta(True))
    ),
    "data-stoi_without_itos": Case(
        T, "", ("stoi without itos",), with_data(meta_pkl=meta(itos=None))
    ),
    "data-meta_truncated": Case(
        T, "", ("is not a valid meta.pkl",), with_data(meta_pkl=meta()[:20])
    ),
    "data-train.bin_odd_bytes": Case(
        T, "", ("train.bin: 6001 bytes, an odd number",), with_data(train_bin=uint16(TOKENS) + b"x")
    ),
    "data-val.bin_empty": Case(T, "", ("the val split has 0 tokens",), with_data(val_bin=b"")),
    "data-val_split_missing": Case(T, "", ("has no val tokens",), with_data(val_bin=None)),
    "data-shard_bad_magic": Case(
        T,
        "",
        ("tiny_val_000000.bin: not a token shard: magic 7",),
        SHARDS | {"data/tiny/tiny_val_000000.bin": shard(TOKENS, magic=7)},
    ),
    "data-shard_bad_version": Case(
        T,
        "",
        ("shard version 2",),
        SHARDS | {"data/tiny/tiny_train_000001.bin": shard(TOKENS, version=2)},
    ),
    "data-shard_count_lies": Case(
        T,
        "",
        ("header says 3,001 tokens but the file holds 3,000",),
        SHARDS | {"data/tiny/tiny_train_000001.bin": shard(TOKENS, count=3001)},
    ),
    "data-shard_header_truncated": Case(
        T,
        "",
        ("truncated: 100 bytes",),
        SHARDS | {"data/tiny/tiny_val_000000.bin": shard(TOKENS)[:100]},
    ),
    "data-shard_is_a_folder": Case(
        T,
        "",
        ("tiny_val_000001.bin is a folder, not a file",),
        SHARDS | {"data/tiny/tiny_val_000001.bin/x": "a folder named like a shard"},
    ),
}


PREPARATIONS = {
    # code in a data folder never runs unasked; a prepare script never overwrites another kind of
    # dataset
    "train-a-data-folders-own-code": ScriptCase(
        T,
        "",
        (
            "data/tiny/prepare.py is not one of this repository's preparers",
            "run_data_preparer=True",
        ),
        TINY | {"data/tiny/prepare.py": MARKER},
    ),  # fmt: skip
    "train-a-changed-copy-of-a-preparer": ScriptCase(
        T,
        "--dataset=shakespeare_char",
        ("shakespeare_char/prepare.py is not one of this repository's preparers",),
        {"data/shakespeare_char/prepare.py": (ROOT / CHAR).read_text() + "\n" + MARKER},
    ),
    "bench-a-data-folders-own-code": ScriptCase(
        B,
        "--data_dir={dir}/data --dataset=tiny",
        ("is not one of this repository's preparers",),
        TINY | {"data/tiny/prepare.py": MARKER},
    ),  # fmt: skip
    "char-unknown-option": ScriptCase(
        CHAR, "--out_dir={dir}/d", ("unknown option '--out_dir={dir}/d'", "--help")
    ),
    "char-two-folders": ScriptCase(CHAR, "{dir}/a {dir}/b", ("one FOLDER at most, not 2",)),
    "char-folder-name-too-long": ScriptCase(
        CHAR, f"{{dir}}/{LONG}", ("the FOLDER must be", "255 bytes")
    ),
    "bpe-over-a-character-dataset": ScriptCase(
        BPE,
        "{dir}/d",
        ("must be new or an earlier gpt2 preparation", "a preparation of characters kind"),
        CHARS,
    ),
    "char-over-a-bpe-dataset": ScriptCase(
        CHAR, "{dir}/d", ("earlier characters preparation", "gpt2 kind"), BPE_DATA
    ),
    "char-over-nanogpts-bpe-without-meta": ScriptCase(
        CHAR,
        "{dir}/d",
        ("holds train.bin without a meta.pkl",),
        {"d/train.bin": uint16(TOKENS), "d/input.txt": "ab"},
    ),
    "char-over-shards": ScriptCase(
        BPE,
        "{dir}/d",
        ("another kind of dataset (x_train_000001.bin)",),
        {"d/x_train_000001.bin": shard(TOKENS)},
    ),
    "char-over-a-damaged-meta": ScriptCase(
        CHAR, "{dir}/d", ("is not a valid meta.pkl",), {"d/meta.pkl": b"junk"}
    ),
    "openwebtext-over-a-character-dataset": ScriptCase(
        OWT,
        "--out_dir={dir}/d",
        ("out_dir", "holds another dataset (train.bin, val.bin, meta.pkl)"),
        DOCS | CHARS,
    ),
    "fineweb-over-openwebtext-shards": ScriptCase(
        FW,
        "--out_dir={dir}/d",
        ("another dataset (openwebtext_train_000001.bin)",),
        DOCS | {"d/openwebtext_train_000001.bin": shard(TOKENS)},
    ),  # fmt: skip
}


RESUMED_DATA = {
    "resume_on_changed_data": train_case(
        RESUME + " --max_iters=10",
        "dataset tiny changed since the checkpoint was saved",
        "train.bin has",
        "--allow_changed_data=True",
        files=DATA,
        checkpoint="other_data",
    ),
    "resume_on_other_data_elsewhere": train_case(
        RESUME + " --max_iters=10",
        "cannot resume with data_dir=",
        "not the checkpoint's data (train.bin has",
        "--allow_changed_data=True",
        files=DATA,
        checkpoint="other_data_dir",
    ),
    "resume_on_removed_meta": train_case(
        RESUME + " --max_iters=10",
        "meta.pkl",
        "--allow_changed_data=True",
        files=DATA,
        checkpoint="other_meta",
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_a_dataset_refused_with_one_line_and_nothing_written(
    name: str, checkpoint: bytes, tmp_path
):
    refuse_case(CASES[name], tmp_path, checkpoint)


@pytest.mark.parametrize("name", PREPARATIONS)
def test_a_preparation_refused_with_one_line_and_nothing_written(
    name, checkpoints, tmp_path, monkeypatch
):
    refuse_script_case(PREPARATIONS[name], checkpoints, tmp_path, monkeypatch)


@pytest.mark.parametrize("name", RESUMED_DATA)
def test_a_resume_on_other_data_refused_with_one_line_and_nothing_written(
    name, variants, tmp_path, monkeypatch
):
    refuse_run_case(RESUMED_DATA[name], variants, tmp_path, monkeypatch)


def dataset(folder, train=TOKENS, val=TOKENS[:1500]):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.bin").write_bytes(uint16(train))
    (folder / "val.bin").write_bytes(uint16(val))
    (folder / "meta.pkl").write_bytes(meta())
    return folder


def counting_scans(monkeypatch) -> list:
    scanned, scan = [], token_check.scan_file
    monkeypatch.setattr(token_check, "scan_file", lambda f: scanned.append(f.path.name) or scan(f))
    return scanned


def test_a_second_check_reads_no_tokens_and_a_changed_file_is_read_again(tmp_path, monkeypatch):
    folder, scanned = dataset(tmp_path / "tiny"), counting_scans(monkeypatch)
    check_token_ids(folder, 29, cache_from_bytes=0)
    assert sorted(scanned) == ["train.bin", "val.bin"]
    cache = json.loads((folder / CACHE_NAME).read_text())["files"]
    assert cache["train.bin"]["max_id"] == 28 and cache["val.bin"]["bytes"] == 3000
    scanned.clear()
    check_token_ids(folder, 29, cache_from_bytes=0)
    assert scanned == []  # every file unchanged: read from the cache
    # the same size, a new id and mtime
    (folder / "val.bin").write_bytes(uint16([*TOKENS[:1499], 29]))
    with pytest.raises(
        UserError, match=r"val\.bin holds token id 29, outside the vocabulary of 29 tokens"
    ):
        check_token_ids(folder, 29, cache_from_bytes=0)
    assert scanned == ["val.bin"]
    # a refusal writes nothing
    assert json.loads((folder / CACHE_NAME).read_text())["files"] == cache


def test_the_cache_is_keyed_by_the_files_stat_and_a_damaged_one_is_rebuilt(tmp_path, monkeypatch):
    folder, scanned = dataset(tmp_path / "tiny"), counting_scans(monkeypatch)
    (folder / CACHE_NAME).write_text('{"files": {"train.bin": {"bytes": 1}}')  # not JSON
    check_token_ids(folder, 29, cache_from_bytes=0)
    assert sorted(scanned) == ["train.bin", "val.bin"]
    entry = json.loads((folder / CACHE_NAME).read_text())["files"]["train.bin"]
    scanned.clear()
    # the file is not the one scanned: scanned again
    for key in ("bytes", "mtime_ns", "ctime_ns", "inode"):
        scanned.clear()
        lie = {"files": {"train.bin": entry | {key: entry[key] + 1, "max_id": 3}}}
        (folder / CACHE_NAME).write_text(json.dumps(lie))
        check_token_ids(folder, 29, cache_from_bytes=0)
        assert sorted(scanned) == ["train.bin", "val.bin"]


def test_a_small_dataset_is_scanned_every_time_and_gets_no_cache(tmp_path, monkeypatch):
    folder, scanned = dataset(tmp_path / "tiny"), counting_scans(monkeypatch)
    before = sorted(p.name for p in folder.iterdir())
    for _ in range(2):
        check_token_ids(folder, 29)  # 9 kB, under CACHE_FROM_BYTES
    assert (
        scanned == ["train.bin", "val.bin"] * 2
        and sorted(p.name for p in folder.iterdir()) == before
    )


def test_the_scan_reads_in_chunks_and_finds_the_largest_anywhere(tmp_path, monkeypatch):
    monkeypatch.setattr(token_check, "CHUNK_TOKENS", 1000)
    tokens = np.zeros(10_000, dtype=np.uint16)
    tokens[7777] = 65535  # the last chunk but two; uint16's largest
    folder = dataset(tmp_path / "tiny", train=tokens)
    with pytest.raises(UserError, match=r"train\.bin holds token id 65535"):
        check_token_ids(folder, 50257)
    check_token_ids(folder, 65536)


@pytest.mark.parametrize("script", [CHAR, BPE, OWT, FW])
def test_every_prepare_script_prints_its_usage_for_help_and_writes_nothing(script, tmp_path):
    before = contents(tmp_path)
    result = run_in_process(script, "--help", cwd=ROOT)
    assert result.returncode == 0 and result.stderr == ""
    assert "usage" in result.stdout.lower() or "FOLDER" in result.stdout
    assert (
        not (ROOT / "--help").exists()
        and not (ROOT / "-h").exists()
        and contents(tmp_path) == before
    )


def test_a_tilde_in_a_prepare_scripts_folder_is_home(tmp_path, monkeypatch):
    from data.tiny_shakespeare import folder_argument

    monkeypatch.setenv("HOME", str(tmp_path))
    assert folder_argument(["~/d"], Path("default")) == tmp_path / "d"
    assert folder_argument([], Path("default")) == Path("default")
    assert folder_argument(["-h"], Path("default")) is None


def test_the_repositorys_own_preparer_runs_for_its_copy_and_a_foreign_one_only_when_asked(tmp_path):
    from nanogpt_perf.data.dataset import own_preparer, prepare_if_missing

    own = tmp_path / "shakespeare_char"
    own.mkdir()
    shutil.copy(ROOT / CHAR, own / "prepare.py")
    (own / "input.txt").write_text("to be or not to be\n" * 50)
    assert (
        own_preparer(own) == ROOT / CHAR
        and own_preparer(ROOT / "data" / "shakespeare_char") == ROOT / CHAR
    )
    # this repository's script, run on the folder: nothing of the folder's code
    prepare_if_missing(own)
    assert (own / "train.bin").is_file() and pickle.loads((own / "meta.pkl").read_bytes())[
        "kind"
    ] == "characters"

    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "prepare.py").write_text(
        MARKER + "Path(__file__).with_name('train.bin').write_bytes(bytes(4))\n"
    )
    assert own_preparer(foreign) is None
    prepare_if_missing(foreign, allow_foreign=True)  # run_data_preparer=True: the user asked for it
    assert (foreign / "ran").is_file() and (foreign / "train.bin").is_file()


def test_the_same_folder_by_other_names(tmp_path, monkeypatch):
    from nanogpt_perf.data.identity import canonical_folder

    data = tmp_path / "data" / "tiny"
    data.mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "data")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path / "data")
    for other in (
        "tiny",
        "./tiny/",
        "~/data/tiny",
        str(tmp_path / "link" / "tiny"),
        "../data/tiny/../tiny",
    ):
        assert canonical_folder(other) == str(data.resolve()), other
    (tmp_path / "data" / "other").mkdir()
    assert canonical_folder("other") != canonical_folder(data) != canonical_folder("missing")


def test_meta_of_every_preparer_records_its_kind(tmp_path):
    from data.shakespeare_char.prepare import prepare
    from data.tiny_shakespeare import folder_problem, kind_of

    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "input.txt").write_text("ab ba\n" * 100)
    assert prepare(folder)["kind"] == "characters"
    assert folder_problem(folder, "characters") is None  # prepared again over itself: allowed
    assert "characters kind" in folder_problem(folder, "gpt2")
    assert (
        kind_of({"vocab_size": 3, "itos": {}}) == "characters"
        and kind_of({"tokenizer": "gpt2"}) == "gpt2"
    )
    assert kind_of({"vocab_size": 3}) is None and HF_CONFIG["vocab_size"] == 64
    assert os.path.getsize(folder / "train.bin") == 2 * int(0.9 * 600)


def test_a_resume_on_the_same_data_by_another_spelling_goes_on(tiny_data, tmp_path):
    """The data folder named by a link, from another working directory: the same files, the same
    run."""
    out = tmp_path / "out"
    first = run_train(tiny_data, out, "--max_iters=2", "--eval_interval=2", "--eval_iters=1")
    assert first.returncode == 0, first.stderr
    (tmp_path / "link").symlink_to(tiny_data)
    resumed = run_train(
        tmp_path / "link", out, "--init_from=resume", "--max_iters=3", "--eval_iters=1"
    )
    assert resumed.returncode == 0, resumed.stderr


def test_changed_data_accepted_by_the_flag_says_so(tiny_data, tmp_path):
    out, data = tmp_path / "out", tmp_path / "data"
    shutil.copytree(tiny_data, data)
    first = run_train(data, out, "--max_iters=2", "--eval_interval=2", "--eval_iters=1")
    assert first.returncode == 0, first.stderr
    tokens = (data / "tiny" / "train.bin").read_bytes()
    # the same size, other tokens
    (data / "tiny" / "train.bin").write_bytes(tokens[2:] + tokens[:2])
    resumed = run_train(
        data,
        out,
        "--init_from=resume",
        "--max_iters=3",
        "--eval_iters=1",
        "--allow_changed_data=True",
    )
    assert resumed.returncode == 0, resumed.stderr
    assert (
        "train.bin has other contents" in resumed.stdout
        and "as allow_changed_data=True asks" in resumed.stdout
    )


# -- issue 31
# --------------------------------------------------------------------------------------------------


SHORT = ("--eval_interval=2", "--eval_iters=1", "--log_interval=1")


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
    # between samples
    assert dataset_identity(data / "tiny")["files"]["train.bin"]["fingerprint"] == fingerprint
    before = contents(out)
    refused = refuse_train(data, out, "--init_from=resume", "--max_iters=4", *SHORT)
    assert_one_line_error(
        refused, "dataset tiny changed since the checkpoint was saved", "train.bin has other"
    )
    assert contents(out) == before


def test_the_whole_file_hash_is_cached_and_a_rewrite_with_the_old_mtime_is_read_again(
    tmp_path, monkeypatch
):
    from nanogpt_perf.data import identity as dataset

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
    # size and mtime as they were
    os.utime(folder / "train.bin", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    now = dataset.check_token_ids(folder, 29, cache_from_bytes=0)
    # its ctime changed: read again
    assert read == ["train.bin"] and now["train.bin"] != first["train.bin"]
