"""The loader over llm.c shards: the format (written independently here, as llm.c documents it),
each malformed shard's error, both window orders, ranks, state save and restore, and flat memory."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import assert_one_line_error, llmc_folder, llmc_shard, refuse_train, run_train
from nanogpt_perf.data.loader import TokenBatches
from nanogpt_perf.data.order import EpochWindows
from nanogpt_perf.data.shards import ShardError, read_shard_header, split_files, write_shard

CPU = torch.device("cpu")


def test_write_shard_round_trips_and_matches_llmc_bytes(tmp_path):
    tokens = np.array([50256, 15496, 995, 11, 0, 65535], dtype=np.uint16)
    write_shard(tmp_path / "ours.bin", tokens)
    llmc_shard(tmp_path / "theirs.bin", tokens)
    assert (tmp_path / "ours.bin").read_bytes() == (tmp_path / "theirs.bin").read_bytes()
    shard = read_shard_header(tmp_path / "ours.bin")
    assert shard.n_tokens == 6 and np.array_equal(shard.tokens(), tokens)


def test_a_folder_of_llmc_shards_trains_without_conversion(tmp_path):
    folder = llmc_folder(tmp_path / "fineweb", [3000, 5000, 4000])
    assert [f.path.name for f in split_files(folder, "train")] == [
        "fineweb_train_000001.bin",
        "fineweb_train_000002.bin",
    ]
    batches = TokenBatches(folder, 8, 16, CPU, seed=0)
    for _ in range(20):
        x, y = batches.next_batch()
        # one window of one shard each
        assert torch.equal(y, x + 1) and torch.equal(x[:, 1:], x[:, :-1] + 1)
        assert set((x // 10000).flatten().tolist()) <= {1, 2}  # training shards only
    (vx, _), *_ = batches.eval_batches("val", 1)
    assert int(vx.max()) < 3000  # evaluation reads the val shard
    batches.stop()


def test_train_py_runs_on_llmc_shards_in_epochs(tmp_path):
    llmc_folder(tmp_path / "data" / "tiny", [3000, 5000, 4000])  # no meta.pkl: GPT-2's vocabulary
    result = run_train(
        tmp_path / "data",
        tmp_path / "out",
        "--max_iters=4",
        "--data_order=epochs",
        "--eval_iters=1",
    )
    assert result.returncode == 0, result.stderr
    assert "vocab_size 50257" in result.stdout and "waiting for data" in result.stdout
    records = [
        json.loads(line) for line in (tmp_path / "out" / "log.jsonl").read_text().splitlines()
    ]
    assert [r["iter"] for r in records if "data_wait_ms" in r] == [1, 2, 3, 4]


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda p: p.write_bytes(p.read_bytes()[:1000]), "truncated"),
        (lambda p: llmc_shard(p, np.arange(100), magic=20240521), "magic"),
        (lambda p: llmc_shard(p, np.arange(100), version=2), "version"),
        (lambda p: llmc_shard(p, np.arange(100), count=101), "header says 101"),
        (lambda p: p.write_bytes(p.read_bytes()[:-2]), "header says"),
    ],
)
def test_a_malformed_shard_is_one_line_naming_the_file(tmp_path, damage, message):
    folder = llmc_folder(tmp_path / "data" / "tiny", [2000, 2000, 2000])
    bad = folder / "fineweb_train_000002.bin"
    damage(bad)
    with pytest.raises(ShardError, match=message):
        read_shard_header(bad)
    before = bad.read_bytes()
    result = refuse_train(tmp_path / "data", tmp_path / "out", "--max_iters=1")
    assert_one_line_error(result, str(bad), message)
    assert bad.read_bytes() == before and not (tmp_path / "out" / "ckpt.pt").exists()


def epoch_of(
    file_tokens: list[int], T: int, rank: int, world: int, n: int
) -> list[tuple[int, int]]:
    return EpochWindows(file_tokens, T, seed=5, rank=rank, world_size=world).take(n)


def test_epochs_visit_every_window_once_and_ranks_are_disjoint():
    # a file too short for any window, counts not multiples of the world size
    sizes, T = [101, 37, 0, 250], 8
    every = {(f, k * T) for f, n in enumerate(sizes) for k in range((n - 1) // T)}
    one = epoch_of(sizes, T, 0, 1, len(every))
    assert len(set(one)) == len(one) and set(one) == every
    first, second = (
        epoch_of(sizes, T, 0, 2, (len(every) + 1) // 2),
        epoch_of(sizes, T, 1, 2, len(every) // 2),
    )
    assert not set(first) & set(second) and set(first) | set(second) == every
    assert one != sorted(one)  # shuffled
    two_epochs = epoch_of(sizes, T, 0, 1, 2 * len(every))
    # a new order each epoch
    assert set(two_epochs[len(every) :]) == every and two_epochs[len(every) :] != one


def test_epochs_through_the_loader_read_each_window_once(tmp_path):
    folder = llmc_folder(tmp_path, [1000, 1601, 801])  # 100 + 50 windows of 16 (+1) tokens
    batches = TokenBatches(folder, 10, 16, CPU, seed=1, data_order="epochs")
    starts = [int(s) for _ in range(15) for s in batches.next_batch()[0][:, 0]]
    expected = {i * 10000 + k * 16 for i, n in ((1, 1601), (2, 801)) for k in range((n - 1) // 16)}
    assert len(starts) == len(set(starts)) == 150 and set(starts) == expected
    batches.stop()


@pytest.mark.parametrize("order", ["random", "epochs"])
def test_a_restored_state_gives_the_same_next_batches(tmp_path, order):
    folder = llmc_folder(tmp_path, [1000, 3000, 2000])
    first = TokenBatches(folder, 4, 16, CPU, seed=2, data_order=order, prefetch=3)
    for _ in range(7):
        first.next_batch()
    state = first.state_dict()  # the thread has built batches ahead: they are not part of the state
    expected = [first.next_batch()[0] for _ in range(60)]  # past the end of an epoch
    second = TokenBatches(folder, 4, 16, CPU, seed=2, data_order=order)
    second.next_batch()
    second.load_state_dict(state)
    assert all(torch.equal(second.next_batch()[0], x) for x in expected)
    first.stop(), second.stop()


def maps_of(path: Path) -> int:
    """How many mappings of path this process holds now."""
    return sum(
        line.split()[-1] == str(path) for line in Path("/proc/self/maps").read_text().splitlines()
    )


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc")
def test_no_map_of_a_shard_outlives_its_batch(tmp_path):
    """Memory stays flat over a long run: a map kept for the whole run holds every page it has
    touched (tens of MB here), so each batch maps the file afresh and lets go. Counted as maps, not
    as the process's resident size, which the heap and the kernel's page-cache folios move by tens
    of MB from one batch to the next."""
    shard = (tmp_path / "big_train_000001.bin").resolve()
    llmc_shard(tmp_path / "big_val_000000.bin", np.zeros(10000))
    write_shard(shard, np.random.default_rng(0).integers(0, 50000, 8_000_000, np.uint16))
    batches = TokenBatches(tmp_path, 16, 1024, CPU, seed=0)
    held = []
    for _ in range(300):
        batches.next_batch()
        held.append(maps_of(shard))
    assert max(held) <= 1  # at most the one the thread is filling a batch from
    batches.stop()
    assert maps_of(shard) == 0


def test_a_partly_prepared_dataset_is_not_trained_on(tmp_path):
    folder = llmc_folder(tmp_path / "data" / "tiny", [3000, 5000])
    (folder / "prepare_state.json").write_text("{}")  # what a killed preparation leaves
    result = refuse_train(tmp_path / "data", tmp_path / "out", "--max_iters=1")
    assert_one_line_error(result, "only partly prepared", "prepare.py")
