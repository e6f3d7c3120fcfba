import pickle
from pathlib import Path

import numpy as np
import torch

from conftest import assert_one_line_error, run_in_process, run_script
from data.tiny_shakespeare import markdown_play_to_text
from nanogpt_perf.data.loader import TokenBatches

# Markdown ends a line inside a speech with two spaces
PLAY = "\n".join(
    [
        "# Hamlet",
        "",
        "## ACT I",
        "",
        "### SCENE I. Elsinore.",
        "",
        "_FRANCISCO at his post. Enter to him BERNARDO_",
        "",
        "**BERNARDO**  ",
        "Who's there?",
        "",
        "**FRANCISCO**  ",
        "Nay, answer me: stand,  ",
        "and unfold yourself\\*.",
        "",
        "_Exit_",
    ]
)


def test_markdown_play_becomes_speaker_lines():
    assert (
        markdown_play_to_text(PLAY)
        == "BERNARDO:\nWho's there?\n\nFRANCISCO:\nNay, answer me: stand,\n"
        "and unfold yourself*.\n\n"
    )


def test_char_prepare_on_local_input(tmp_path):
    from data.shakespeare_char.prepare import prepare

    text = "First Citizen:\nBefore we proceed any further, hear me speak.\n\n" * 20
    (tmp_path / "input.txt").write_text(text)
    meta = prepare(tmp_path)
    train = np.fromfile(tmp_path / "train.bin", dtype=np.uint16)
    val = np.fromfile(tmp_path / "val.bin", dtype=np.uint16)
    assert len(train) + len(val) == len(text) and len(train) == int(0.9 * len(text))
    assert "".join(meta["itos"][i] for i in np.concatenate([train, val]).tolist()) == text
    assert meta["source"].startswith("local file")
    assert pickle.loads((tmp_path / "meta.pkl").read_bytes())["vocab_size"] == len(set(text))


def test_a_prepare_script_never_writes_over_another_dataset(tmp_path):
    """FOLDER may hold the text to prepare (tests/test_prepare.py: never the user's own files)."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "input.txt").write_text("to be, or not to be: that is the question.\n" * 20)
    prepared = run_script("data/shakespeare_char/prepare.py", str(folder))
    assert prepared.returncode == 0, prepared.stderr
    assert sorted(p.name for p in folder.iterdir()) == [
        "input.txt",
        "meta.pkl",
        "train.bin",
        "val.bin",
    ]
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    refused = run_in_process("data/shakespeare/prepare.py", str(folder))  # GPT-2 tokens: refused
    assert_one_line_error(refused, "a preparation of characters kind")
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_bpe_prepare_on_local_input(tmp_path):
    from data.shakespeare.prepare import prepare
    from nanogpt_perf.data.tokenizer import gpt2_encoding

    text = "Hello world, said the king.\n" * 50
    (tmp_path / "input.txt").write_text(text)
    prepare(tmp_path)
    ids = np.concatenate(
        [np.fromfile(tmp_path / f"{s}.bin", dtype=np.uint16) for s in ("train", "val")]
    )
    assert gpt2_encoding().decode(ids.tolist()) == text


def test_gpt2_encoding_matches_the_published_ids():
    from nanogpt_perf.data.tokenizer import gpt2_encoding

    enc = gpt2_encoding()
    assert enc.encode_ordinary("Hello world,") == [15496, 995, 11]
    assert enc.n_vocab == 50257 and enc.eot_token == 50256


def counting_dataset(folder: Path, n: int = 5000) -> Path:
    """train.bin and val.bin holding 0, 1, 2, ... so that a window's tokens tell where it came
    from."""
    folder.mkdir(parents=True, exist_ok=True)
    np.arange(n, dtype=np.uint16).tofile(folder / "train.bin")
    np.arange(n, 2 * n, dtype=np.uint16).tofile(folder / "val.bin")
    return folder


def test_batches_are_windows_with_targets_shifted_by_one(tmp_path):
    batches = TokenBatches(counting_dataset(tmp_path), 4, 8, torch.device("cpu"), seed=0)
    x, y = batches.next_batch()
    assert x.shape == y.shape == (4, 8) and x.dtype == torch.int64
    assert torch.equal(y, x + 1)  # targets: the inputs shifted by one token
    assert torch.equal(x[:, 1:], x[:, :-1] + 1)  # each row is one contiguous window of the file
    assert int(x.max()) + 1 < 5000  # the window and its last target fit in the file
    (vx, vy), *_ = batches.eval_batches("val", 1)
    assert int(vx.min()) >= 5000 and torch.equal(vy, vx + 1)  # evaluation reads the val split


def test_a_seed_fixes_the_stream_and_ranks_draw_different_windows(tmp_path):
    path = counting_dataset(tmp_path)

    def first_starts(seed: int, rank: int = 0, n: int = 5) -> list[list[int]]:
        batches = TokenBatches(path, 4, 8, torch.device("cpu"), seed, rank)
        return [batches.next_batch()[0][:, 0].tolist() for _ in range(n)]

    assert first_starts(0) == first_starts(0)
    assert first_starts(0) != first_starts(1)
    rank0, rank1 = first_starts(0, 0), first_starts(0, 1)
    # 40 windows each of ~5000 starts: none shared here
    assert not set(sum(rank0, [])) & set(sum(rank1, []))


def test_evaluation_reads_fixed_windows_and_leaves_the_training_stream_alone(tmp_path):
    path = counting_dataset(tmp_path)
    with_evals = TokenBatches(path, 4, 8, torch.device("cpu"), seed=3)
    without = TokenBatches(path, 4, 8, torch.device("cpu"), seed=3)
    evals = []
    for _ in range(4):
        evals.append([x[:, 0].tolist() for x, _ in with_evals.eval_batches("val", 2)])
        assert torch.equal(with_evals.next_batch()[0], without.next_batch()[0])
    assert all(e == evals[0] for e in evals)  # the same windows at every eval
    assert evals[0][0] != evals[0][1]  # but not one window repeated
