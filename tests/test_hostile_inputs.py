"""Hostile inputs, every script: numbers that are not (NaN, inf), too large for what consumes them or negative; wrong
types, empty and odd strings; config files that raise, exit or are interrupted; datasets that lie about their
vocabulary or their size; transformers folders that are not what they say. Each is refused before any work in one
'error: ' line naming the problem, and every file in the case's folder is as it was (tests/test_bad_input.py's
Case, run in this process). Then the cached scan of the token ids: a second run reads no tokens, a changed file is
read again."""

import json
import pickle
import re
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from safetensors.torch import save as safetensors_bytes
from test_bad_input import CHECKPOINT, Case, run_case
from test_bad_input import checkpoint as checkpoint  # the fixture: a tiny checkpoint's bytes

from conftest import assert_one_line_error, run_script
from nanogpt_perf.config import setting
from nanogpt_perf.data import token_check
from nanogpt_perf.data.shards import HEADER_INTS, MAGIC, VERSION
from nanogpt_perf.data.token_check import CACHE_NAME, check_token_ids
from nanogpt_perf.errors import UserError

T, S, B, G, H = "train.py", "sample.py", "bench.py", "benchmarks/generate.py", "hellaswag.py"
OWT, FW, BL, BP = (
    "data/openwebtext/prepare.py",
    "data/fineweb/prepare.py",
    "benchmarks/loader.py",
    "benchmarks/prepare.py",
)
CKPT = {"out/ckpt.pt": CHECKPOINT}
DOCS = {"docs.txt": "some text"}


# a character dataset 'tiny' of 29 tokens (a to z, {, |, }), each file as bytes
def uint16(tokens) -> bytes:
    return np.asarray(tokens, dtype="<u2").tobytes()


def meta(vocab_size=29, n=29, **changes) -> bytes:
    itos = {i: chr(97 + i) for i in range(n)}
    return pickle.dumps({"vocab_size": vocab_size, "itos": itos, "stoi": {s: i for i, s in itos.items()}} | changes)


def shard(tokens, magic=MAGIC, version=VERSION, count=None) -> bytes:
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = magic, version, len(tokens) if count is None else count
    return header.tobytes() + uint16(tokens)


TOKENS = np.arange(3000) % 29
DATA = {"data/tiny/train.bin": uint16(TOKENS), "data/tiny/val.bin": uint16(TOKENS[:1500]), "data/tiny/meta.pkl": meta()}
SHARDS = {"data/tiny/tiny_val_000000.bin": shard(TOKENS[:1500]), "data/tiny/tiny_train_000001.bin": shard(TOKENS)}
ITOS = {i: chr(97 + i) for i in range(29)}


def with_data(**files: bytes | None) -> dict:
    """DATA with files changed (name -> bytes) or left out (None)."""
    changed = DATA | {f"data/tiny/{k.replace('_', '.', 1)}": v for k, v in files.items()}
    return {k: v for k, v in changed.items() if v is not None}


# a tiny GPT-2 in transformers' format: its config.json and model.safetensors, each spoilt one way by a case
HF_CONFIG = {"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 8, "n_positions": 32, "vocab_size": 64}


def hf_weights(**changes) -> dict[str, torch.Tensor]:
    d, shapes = 8, {"wte.weight": (64, 8), "wpe.weight": (32, 8), "ln_f.weight": (8,), "ln_f.bias": (8,)}
    block = {"ln_1": (d,), "ln_2": (d,), "attn.c_attn": (d, 3 * d), "attn.c_proj": (d, d), "mlp.c_fc": (d, 4 * d)}
    for name, shape in (block | {"mlp.c_proj": (4 * d, d)}).items():
        shapes[f"h.0.{name}.weight"], shapes[f"h.0.{name}.bias"] = shape, shape[-1:]
    weights = {f"transformer.{k}": torch.zeros(v) for k, v in (shapes | changes).items() if v is not None}
    return weights


def hf(config: dict | str | None = None, weights: bytes | None = None, name: str = "model.safetensors") -> dict:
    files = {"hf/README": "a folder", f"hf/{name}": safetensors_bytes(hf_weights()) if weights is None else weights}
    if config is not None:
        files["hf/config.json"] = config if isinstance(config, str) else json.dumps(HF_CONFIG | config)
    return files


HF_OK = json.dumps(HF_CONFIG)
HELLASWAG = {"hs.jsonl": json.dumps({"ctx": "A man", "endings": ["a", "b", "c", "d"], "label": 0})}
INIT = {T: "--init_from={dir}/hf", S: "--init_from={dir}/hf", H: "--init_from={dir}/hf --file={dir}/hs.jsonl"}
BROKEN_FOLDERS = {
    "config.json_missing": (hf(), "no readable config.json"),
    "config.json_not_json": (hf('{"model_type": "gpt2",'), "no readable config.json (JSONDecodeError)"),
    "config.json_not_gpt2": (hf({"model_type": "llama"}), "does not describe a GPT-2"),
    "config.json_n_layer_text": (hf({"n_layer": "two"}), "n_layer must be a positive int, not 'two'"),
    "config.json_heads": (hf({"n_head": 3}), "n_embd=8 is not divisible by n_head=3"),
    "config.json_activation": (hf({"activation_function": "relu"}), "activation_function is 'relu'"),
    "config.json_huge": (hf({"n_layer": 10**9}), "n_layer=1000000000", "more than this machine's"),
    "safetensors_missing": ({"hf/config.json": HF_OK}, "neither model.safetensors nor pytorch_model.bin"),
    "safetensors_truncated": (hf({}, safetensors_bytes(hf_weights())[:3000]), "model.safetensors cannot be read"),
    "safetensors_lacks_a_weight": (
        hf({}, safetensors_bytes(hf_weights(**{"h.0.mlp.c_fc.weight": None}))),
        "model.safetensors has no h.0.mlp.c_fc.weight",
    ),
    "safetensors_wrong_shape": (
        hf({}, safetensors_bytes(hf_weights(**{"wpe.weight": (16, 8)}))),
        "holds wpe.weight as [16, 8], config.json makes it [32, 8]",
    ),
    "pytorch_model.bin_garbage": (hf({}, b"not a checkpoint", "pytorch_model.bin"), "pytorch_model.bin cannot be read"),
}

CASES = {
    # found while merging: past what consumes them, a dataset larger than the model it starts from, bad bytes
    "train-eval_iters=2**40": Case(
        T, "--eval_iters=1099511627776", ("eval_iters must be <= 1000000, not 1099511627776",)
    ),
    "openwebtext-processes=2**40": Case(
        OWT, "--processes=1099511627776", ("processes must be <= 1024, not 1099511627776",), DOCS
    ),
    "train-dataset_past_the_model's_vocabulary": Case(
        T,
        "--init_from={dir}/hf --block_size=16",
        ("dataset tiny has 100 tokens, more than the", "vocabulary of 64"),
        with_data(meta_pkl=meta(100, 100)) | hf({}),
    ),
    "hellaswag-file_not_utf8": Case(
        H,
        "--init_from={dir}/hf --file={dir}/hs.jsonl",
        ("the HellaSwag file", "cannot be read as UTF-8 text"),
        hf({}) | {"hs.jsonl": b"\xff\xfe"},
    ),  # fmt: skip
    # numbers: not finite, past 64 bits, past what consumes them, negative
    "train-learning_rate=1e999": Case(T, "--learning_rate=1e999", ("learning_rate must be a finite number, not inf",)),
    "train-learning_rate=nan": Case(T, "--learning_rate=nan", ("learning_rate must be a finite number, not nan",)),
    "train-dropout=-inf": Case(T, "--dropout=-inf", ("dropout must be a finite number, not -inf",)),
    "train-grad_clip=inf": Case(T, "--grad_clip=inf", ("grad_clip must be a finite number",)),
    "train-beta2=nan_in_config": Case(
        T, "{dir}/cfg.py", ("beta2 must be a finite number, not nan",), {"cfg.py": "beta2 = float('nan')"}
    ),
    "train-seed=2**64": Case(T, "--seed=18446744073709551616", ("seed must be an integer within 64 bits",)),
    "train-seed=-1": Case(T, "--seed=-1", ("seed must be >= 0, not -1",)),
    "train-max_iters=1e30": Case(T, "--max_iters=1e30", ("max_iters must be an integer within 64 bits",)),
    "train-max_iters=10**30": Case(T, "--max_iters=10**30", ("max_iters must be int", "'10**30'")),
    "train-max_iters=10**5000_in_config": Case(
        T, "{dir}/cfg.py", ("max_iters", "about 5,001 digits"), {"cfg.py": "max_iters = 10**5000"}
    ),
    "train-learning_rate=10**400_in_config": Case(
        T,
        "{dir}/cfg.py",
        ("learning_rate must be a float (at most about 1.8e308)",),
        {"cfg.py": "learning_rate = 10**400"},
    ),
    "train-batch_size=2**40": Case(T, "--batch_size=1099511627776", ("batch_size=1099511627776", "host memory"), DATA),
    "train-prefetch=2**40": Case(T, "--prefetch=1099511627776", ("prefetch=1099511627776", "host memory"), DATA),
    "train-n_layer=10**9": Case(T, "--n_layer=1000000000", ("n_layer=1000000000", "more than this machine's"), DATA),
    "train-pad_vocab=2**40": Case(T, "--pad_vocab=1099511627776", ("vocab_size=1099511627776", "memory"), DATA),
    "sample-temperature=1e-40": Case(S, "--temperature=1e-40", ("temperature must be 0 (greedy) or >= 1e-06",), CKPT),
    "sample-top_p=nan": Case(S, "--top_p=nan", ("top_p must be a finite number, not nan",), CKPT),
    "sample-top_k=1e30": Case(S, "--top_k=1e30", ("top_k must be an integer within 64 bits",), CKPT),
    "sample-num_samples=2**40_batched": Case(
        S, "--num_samples=1099511627776 --batched=True", ("num_samples=1099511627776", "KV cache"), CKPT
    ),
    "bench-tolerance_pct=nan": Case(B, "--tolerance_pct=nan", ("tolerance_pct must be a finite number, or inf",)),
    "bench-peak_flops=inf": Case(B, "--peak_flops=inf", ("peak_flops must be a finite number, not inf",)),
    "bench_generate-vocab_size=2**40": Case(G, "--vocab_size=1099511627776", ("more than this machine's",)),
    "bench_generate-batch_size=2**40": Case(G, "--batch_size=1099511627776", ("batch_size=1099511627776", "KV cache")),
    "bench_generate-prompt>block": Case(G, "--prompt_tokens=2048", ("prompt_tokens must be <= block_size (1024)",)),
    "bench_loader-shard_tokens=1e15": Case(BL, "--shard_tokens=1e15", ("synthetic shards", "GB free")),
    "bench_prepare-copies=1e15": Case(BP, "--copies=1e15", ("copies=1000000000000000", "GB free")),
    "hellaswag-limit=1e30": Case(H, "--limit=1e30", ("limit must be an integer within 64 bits",)),
    "openwebtext-val_tokens=-1e30": Case(OWT, "--val_tokens=-1e30", ("val_tokens must be an integer within 64",), DOCS),
    "fineweb-processes=2**64": Case(
        FW, "--processes=18446744073709551616", ("processes must be an integer within",), DOCS
    ),
    # wrong types, empty strings, unicode, set non-settings
    "train-n_layer=True": Case(T, "--n_layer=True", ("n_layer must be int", "got True")),
    "train-out_dir_a_list": Case(
        T, "{dir}/cfg.py", ("out_dir must be str", "got a list"), {"cfg.py": "out_dir = ['a']"}
    ),
    "train-numpy_int_in_config": Case(
        T,
        "{dir}/cfg.py",
        ("n_layer must be int", "got a numpy.int64"),
        {"cfg.py": "import numpy\nn_layer = numpy.int64(2)"},
    ),
    "train-out_dir_with_NUL": Case(
        T, "{dir}/cfg.py", ("a path without a NUL character",), {"cfg.py": "out_dir = 'a\\0b'"}
    ),
    "train-init_from=''": Case(T, "--init_from=", ("init_from must be scratch, resume", "not ''")),
    "train-device=''": Case(T, "--device=", ("device must be one of auto, cpu", "not ''")),
    "train-dataset_unicode": Case(T, "--dataset=ünïcødé", ("dataset 'ünïcødé' not found",)),
    "train-non_setting": Case(
        T, "{dir}/cfg.py", ("unknown setting 'GPT2_VOCAB_SIZE'",), {"cfg.py": "GPT2_VOCAB_SIZE = 7"}
    ),
    "sample-prompt_file_not_utf8": Case(
        S,
        "--start=FILE:{dir}/prompt.txt",
        ("prompt file", "cannot be read as UTF-8"),
        CKPT | {"prompt.txt": b"\xff\xfe"},
    ),
    "bench-out_json_a_folder": Case(
        B, "--out_json={dir}/x.json", ("out_json must be '' or a .json file (a file, not a folder)",), {"x.json/a": ""}
    ),
    "hellaswag-out_json_under_a_file": Case(
        H,
        "--out_json={dir}/f/x.json",
        ("out_json must be '' or a .json file in a folder", "is a file)"),
        {"f": "a file"},
    ),
    # config files that raise, exit, are interrupted, import what is not there, cannot be read
    "config-sys.exit(3)": Case(
        T,
        "{dir}/cfg.py",
        ("cfg.py, line 3: it exits (sys.exit(3))",),
        {"cfg.py": "n_layer = 2\nimport sys\nsys.exit(3)"},
    ),
    "config-sys.exit(0)": Case(S, "{dir}/cfg.py", ("line 1: it exits (sys.exit(0))",), {"cfg.py": "exit(0)"}),
    "config-KeyboardInterrupt": Case(
        T,
        "{dir}/cfg.py",
        ("cfg.py, line 2: interrupted (KeyboardInterrupt)",),
        {"cfg.py": "def f():\n  raise KeyboardInterrupt\nf()"},
    ),
    "config-missing_module": Case(
        B,
        "{dir}/cfg.py",
        ("cfg.py, line 1: ModuleNotFoundError: No module named 'no_such_module'",),
        {"cfg.py": "import no_such_module"},
    ),
    "config-ZeroDivisionError": Case(
        FW,
        "{dir}/cfg.py",
        ("cfg.py, line 2: ZeroDivisionError: division by zero",),
        DOCS | {"cfg.py": "a = 1\nb = a / 0"},
    ),
    "config-SyntaxError": Case(G, "{dir}/cfg.py", ("cfg.py, line 1: SyntaxError",), {"cfg.py": "n_layer = (\n"}),
    "config-not_utf8": Case(T, "{dir}/cfg.py", ("cfg.py, line 1: SyntaxError",), {"cfg.py": b"n_layer = '\xff'\n"}),
    "config-NUL_byte": Case(T, "{dir}/cfg.py", ("cfg.py: ", "null bytes"), {"cfg.py": b"n_layer = 2\x00\n"}),
    "config-unprintable_exception": Case(
        H,
        "{dir}/cfg.py",
        ("cfg.py, line 3: E: (its message cannot be shown)",),
        {"cfg.py": "class E(Exception):\n    __str__ = lambda self: 1 / 0\nraise E()"},
    ),
    # datasets that lie: a vocabulary too small, an inconsistent meta.pkl, odd or missing token files, bad shards
    "data-meta_vocab_too_small": Case(
        T,
        "",
        ("train.bin holds token id 28, outside the vocabulary of 20 tokens", "meta.pkl's vocab_size"),
        with_data(meta_pkl=meta(20, 20)),
    ),
    "data-val_past_the_vocabulary": Case(
        T, "", ("val.bin holds token id 40000, outside the vocabulary of 29",), with_data(val_bin=uint16([1, 40000, 2]))
    ),
    "data-gpt2_tokens_past_50257": Case(
        T,
        "",
        ("tiny_train_000001.bin holds token id 60000", "50257 tokens (GPT-2's"),
        {"data/tiny/tiny_val_000000.bin": shard(TOKENS), "data/tiny/tiny_train_000001.bin": shard([*TOKENS, 60000])},
    ),
    "data-stoi_not_inverse": Case(
        T,
        "",
        ("meta.pkl is not a valid meta.pkl: stoi is not the inverse of itos",),
        with_data(meta_pkl=meta(stoi={"a": 1, "b": 0})),
    ),
    "data-itos_shorter": Case(T, "", ("vocab_size is 30 but itos has 29 tokens",), with_data(meta_pkl=meta(30))),
    "data-itos_duplicates": Case(
        T,
        "",
        ("itos gives two token ids the same string",),
        with_data(meta_pkl=meta(itos=ITOS | {1: "a"}, stoi=None)),
    ),
    "data-vocab_size_zero": Case(T, "", ("vocab_size must be a positive int, not 0",), with_data(meta_pkl=meta(0, 0))),
    "data-vocab_size_bool": Case(
        T, "", ("vocab_size must be a positive int, not True",), with_data(meta_pkl=meta(True))
    ),
    "data-stoi_without_itos": Case(T, "", ("stoi without itos",), with_data(meta_pkl=meta(itos=None))),
    "data-meta_truncated": Case(T, "", ("is not a valid meta.pkl",), with_data(meta_pkl=meta()[:20])),
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
        T, "", ("shard version 2",), SHARDS | {"data/tiny/tiny_train_000001.bin": shard(TOKENS, version=2)}
    ),
    "data-shard_count_lies": Case(
        T,
        "",
        ("header says 3,001 tokens but the file holds 3,000",),
        SHARDS | {"data/tiny/tiny_train_000001.bin": shard(TOKENS, count=3001)},
    ),
    "data-shard_header_truncated": Case(
        T, "", ("truncated: 100 bytes",), SHARDS | {"data/tiny/tiny_val_000000.bin": shard(TOKENS)[:100]}
    ),
    "data-shard_is_a_folder": Case(
        T,
        "",
        ("tiny_val_000001.bin: not a file",),
        SHARDS | {"data/tiny/tiny_val_000001.bin/x": "a folder named like a shard"},
    ),
}
for script, flags in INIT.items():
    present = DATA if script == T else HELLASWAG if script == H else {}
    for name, (files, *names) in BROKEN_FOLDERS.items():
        CASES[f"{script.removesuffix('.py')}-hf_{name}"] = Case(
            script, flags, ("is not a GPT-2 folder", *names), present | files
        )


@pytest.mark.parametrize("name", CASES)
def test_refused_with_one_line_and_nothing_written(name: str, checkpoint: bytes, tmp_path):
    result, before, after = run_case(CASES[name], tmp_path, checkpoint)
    assert_one_line_error(result, *CASES[name].names)
    assert after == before


def test_a_config_file_that_exits_or_is_interrupted_says_so_in_its_own_process(tmp_path):
    """As a user runs it: not exit status 3 in silence, nor a traceback."""
    for name, code in [("exits.py", "import sys\nsys.exit(3)\n"), ("interrupted.py", "raise KeyboardInterrupt\n")]:
        (tmp_path / name).write_text(code)
        result = run_script("sample.py", str(tmp_path / name))
        assert result.returncode == 1
        assert_one_line_error(result, f"config file {tmp_path / name}, line")


@dataclass
class Limits:
    """A setting where inf means no limit, and one where it means nothing."""

    tolerance_pct: float = setting(5.0, "how much worse, in percent (inf: never fail)", min=0, inf=True)
    learning_rate: float = setting(1e-3, "a rate", min=0)


def test_inf_is_taken_where_it_means_no_limit_and_nan_nowhere():
    from configurator import configure

    run = lambda *flags: configure(list(flags), limits=Limits)  # noqa: E731
    assert run("--tolerance_pct=inf").tolerance_pct == float("inf")
    assert run("--tolerance_pct=1e999").tolerance_pct == float("inf")
    for flag, message in [
        ("--tolerance_pct=-inf", "tolerance_pct must be a finite number, or inf (no limit), not -inf"),
        ("--tolerance_pct=nan", "tolerance_pct must be a finite number, or inf (no limit), not nan"),
        ("--learning_rate=inf", "learning_rate must be a finite number, not inf"),
    ]:
        with pytest.raises(UserError, match=rf"^{re.escape(message)}$"):
            run(flag)


def test_a_transformers_folder_that_is_whole_loads_quietly(tmp_path, capfd):
    """The cases' folder unspoilt loads, and transformers says nothing on stderr (no progress bar, no notes)."""
    from nanogpt_perf.gpt2_weights import load_gpt2

    for path, data in hf({}).items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(data if isinstance(data, bytes) else data.encode())
    capfd.readouterr()
    model = load_gpt2(str(tmp_path / "hf"))
    assert model.config.n_layer == 1 and model.config.vocab_size == 64
    assert capfd.readouterr().err == ""


# the cached scan of the largest token ids


def dataset(folder, train=TOKENS, val=TOKENS[:1500]):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.bin").write_bytes(uint16(train))
    (folder / "val.bin").write_bytes(uint16(val))
    (folder / "meta.pkl").write_bytes(meta())
    return folder


def counting_scans(monkeypatch) -> list:
    scanned, largest = [], token_check.largest_id
    monkeypatch.setattr(token_check, "largest_id", lambda f: scanned.append(f.path.name) or largest(f))
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
    (folder / "val.bin").write_bytes(uint16([*TOKENS[:1499], 29]))  # the same size, a new id and mtime
    with pytest.raises(UserError, match=r"val\.bin holds token id 29, outside the vocabulary of 29 tokens"):
        check_token_ids(folder, 29, cache_from_bytes=0)
    assert scanned == ["val.bin"]
    assert json.loads((folder / CACHE_NAME).read_text())["files"] == cache  # a refusal writes nothing


def test_the_cache_is_keyed_by_size_and_time_and_a_damaged_one_is_rebuilt(tmp_path, monkeypatch):
    folder, scanned = dataset(tmp_path / "tiny"), counting_scans(monkeypatch)
    (folder / CACHE_NAME).write_text('{"files": {"train.bin": {"bytes": 1}}')  # not JSON
    check_token_ids(folder, 29, cache_from_bytes=0)
    assert sorted(scanned) == ["train.bin", "val.bin"]
    entry = json.loads((folder / CACHE_NAME).read_text())["files"]["train.bin"]
    scanned.clear()
    lie = {"files": {"train.bin": entry | {"mtime_ns": entry["mtime_ns"] + 1, "max_id": 3}}}
    (folder / CACHE_NAME).write_text(json.dumps(lie))  # the file is not the one scanned: scanned again
    check_token_ids(folder, 29, cache_from_bytes=0)
    assert sorted(scanned) == ["train.bin", "val.bin"]


def test_a_small_dataset_is_scanned_every_time_and_gets_no_cache(tmp_path, monkeypatch):
    folder, scanned = dataset(tmp_path / "tiny"), counting_scans(monkeypatch)
    before = sorted(p.name for p in folder.iterdir())
    for _ in range(2):
        check_token_ids(folder, 29)  # 9 kB, under CACHE_FROM_BYTES
    assert scanned == ["train.bin", "val.bin"] * 2 and sorted(p.name for p in folder.iterdir()) == before


def test_the_scan_reads_in_chunks_and_finds_the_largest_anywhere(tmp_path, monkeypatch):
    monkeypatch.setattr(token_check, "CHUNK_TOKENS", 1000)
    tokens = np.zeros(10_000, dtype=np.uint16)
    tokens[7777] = 65535  # the last chunk but two; uint16's largest
    folder = dataset(tmp_path / "tiny", train=tokens)
    with pytest.raises(UserError, match=r"train\.bin holds token id 65535"):
        check_token_ids(folder, 50257)
    check_token_ids(folder, 65536)
