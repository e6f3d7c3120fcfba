"""More hostile inputs (issue 25), each refused before any work in one 'error: ' line with every file of the case's
folder byte-identical, in this process (conftest.run_in_process): paths a shell left a ~ in, names the OS rejects,
folders below a file; JSON that bench.py's regression check and plot.py did not write (damaged, foreign, nested
without end); the side scripts' flags; data folders whose code must not run, and prepare scripts pointed at another
kind of dataset; vocabularies that do not fit their model. Then what is no refusal: a prepare script's --help, ~ in
a prepare script's FOLDER, the same folder by other names, and the helpers behind the table."""

import json
import os
import pickle
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from configurator import configure
from conftest import HF_CONFIG, ROOT, assert_one_line_error, contents, hf, meta, run_in_process, shard, uint16
from nanogpt_perf.config import setting
from nanogpt_perf.guard.paths import a_path, init_from_one_of, optional_path, output_file, output_folder

T, S, E, H, B, G = "train.py", "sample.py", "export.py", "hellaswag.py", "bench.py", "benchmarks/generate.py"
BL, BP, P = "benchmarks/loader.py", "benchmarks/prepare.py", "plot.py"
OWT, FW, CHAR, BPE = (
    "data/openwebtext/prepare.py",
    "data/fineweb/prepare.py",
    "data/shakespeare_char/prepare.py",
    "data/shakespeare/prepare.py",
)
LONG = "a" * 300  # a name longer than any file system takes (255 bytes)
DEEP = "/".join(["b" * 200] * 25)  # a path longer than PATH_MAX (4096 bytes), each name valid


class Ckpt(NamedTuple):
    """In Hostile.files: a tiny checkpoint's bytes, its tokenizer a character vocabulary of n characters (the
    model's is 16)."""

    characters: int = 9


class Hostile(NamedTuple):
    script: str
    flags: str  # space-separated; {dir} is the case's own folder
    names: tuple[str, ...]  # what the error line must say
    files: dict = {}  # made in the folder first: path -> text, bytes or Ckpt
    home: bool = False  # HOME is {dir}/home, a file: a ~ expanded (once the configurator expands it) leads nowhere


COMMON = {  # so that whatever a script would write lands in the case's folder
    T: "--out_dir={dir}/out --data_dir={dir}/data --dataset=tiny --device=cpu --compile=false",
    S: "--out_dir={dir}/out --device=cpu --start=abc",
    E: "--out_dir={dir}/out --export_dir={dir}/hf",
    H: "--out_dir={dir}/out --device=cpu --file={dir}/hs.jsonl",
    B: "--device=cpu --compile=false",
    G: "--device=cpu",
    BL: "--device=cpu",
    BP: "",
    P: "{dir}/run",
    OWT: "--out_dir={dir}/out --input={dir}/docs.txt --processes=1",
    FW: "--out_dir={dir}/out --input={dir}/docs.txt --processes=1",
    CHAR: "",
    BPE: "",
}
CKPT = {"out/ckpt.pt": Ckpt()}
HOME = {"home": "a file: ~ leads nowhere"}
BELOW = {"f": "a file where a folder is named"}
DOCS = {"docs.txt": "some text"}
RUN = {"run/log.jsonl": json.dumps({"iter": 1, "step_loss": 1.0, "lr": 1e-3}) + "\n"}
HELLASWAG = {"hs.jsonl": json.dumps({"ctx": "A man", "endings": ["a", "b", "c", "d"], "label": 0}) + "\n"}
TOKENS = np.arange(3000) % 29
CHARS = {"d/train.bin": uint16(TOKENS), "d/val.bin": uint16(TOKENS[:300]), "d/meta.pkl": meta()}
GPT2_META = pickle.dumps({"vocab_size": 50257, "tokenizer": "gpt2", "source": "elsewhere"})
BPE_DATA = {"d/train.bin": uint16(TOKENS), "d/val.bin": uint16(TOKENS[:300]), "d/meta.pkl": GPT2_META}
TINY = {"data/tiny/input.txt": "some text to prepare"}
MARKER = "from pathlib import Path\nPath(__file__).with_name('ran').write_text('it ran')\n"


def bench_output(**result) -> str:
    row = {"name": "a", "status": "ok", "reason": "", "settings": {"n_layer": 1}, "ms_median": 1.0} | result
    return json.dumps({"kind": "single", "manifest": {"device_name": "cpu", "torch": "2"}, "results": [row]})


def compare(new: str | bytes, baseline: str | bytes | None = None) -> dict:
    """bench.py's regression check of new against baseline (a good output when None)."""
    return {"new.json": new, "old.json": bench_output() if baseline is None else baseline}


REGRESSION = "--compare={dir}/new.json --baseline={dir}/old.json"
VOCABULARY = lambda itos: {"hf/vocabulary.json": json.dumps({"kind": "characters", "itos": itos})}  # noqa: E731

CASES = {
    # a ~ that no shell expanded (the shell expands it only at a word's start, not after --out_dir=)
    "sample-out_dir~": Hostile(S, "--out_dir=~/runs/x", ("out_dir must be",), HOME | CKPT, home=True),
    "train-out_dir~": Hostile(T, "--out_dir=~/runs/x", ("out_dir must be",), HOME, home=True),
    "train-data_dir~": Hostile(T, "--data_dir=~/data", ("data_dir must be",), HOME, home=True),
    "export-export_dir~": Hostile(E, "--export_dir=~/hf", ("export_dir must be",), HOME | CKPT, home=True),
    "export-out_dir~": Hostile(E, "--out_dir=~/out", ("out_dir must be",), HOME, home=True),
    "hellaswag-out_json~": Hostile(H, "--out_json=~/hs.json", ("out_json must be",), HOME | CKPT, home=True),
    "hellaswag-file~": Hostile(H, "--file=~/hs.jsonl", ("file must be",), HOME | CKPT, home=True),
    "bench-out_json~": Hostile(B, "--out_json=~/b.json", ("out_json must be",), HOME, home=True),
    "generate-out_json~": Hostile(G, "--out_json=~/g.json", ("out_json must be",), HOME, home=True),
    "generate-nanogpt_dir~": Hostile(G, "--nanogpt_dir=~/nanoGPT", ("nanogpt_dir must be",), HOME, home=True),
    "loader-data~": Hostile(BL, "--data=~/data", ("data must be",), HOME, home=True),
    "openwebtext-out_dir~": Hostile(OWT, "--out_dir=~/owt", ("out_dir must be",), HOME | DOCS, home=True),
    "plot-out~": Hostile(P, "--out=~/c.png", ("out must be",), HOME | RUN, home=True),
    # names the OS rejects: one longer than 255 bytes, a path longer than 4096, a file where a folder must be
    "sample-out_dir-name-too-long": Hostile(S, f"--out_dir={{dir}}/{LONG}", ("out_dir must be", "255 bytes")),
    "train-data_dir-name-too-long": Hostile(T, f"--data_dir={{dir}}/{LONG}", ("data_dir must be", "255 bytes")),
    "train-dataset-name-too-long": Hostile(T, f"--dataset={LONG}", ("dataset folder must be", "255 bytes")),
    "train-out_dir-path-too-long": Hostile(T, f"--out_dir={{dir}}/{DEEP}", ("out_dir must be", "4,096 bytes")),
    "export-export_dir-name-too-long": Hostile(E, f"--export_dir={{dir}}/{LONG}", ("export_dir", "255"), CKPT),
    "hellaswag-out_json-name-too-long": Hostile(H, f"--out_json={{dir}}/{LONG}.json", ("out_json", "255"), CKPT),
    "hellaswag-file-path-too-long": Hostile(H, f"--file={{dir}}/{DEEP}", ("file must be", "4,096 bytes"), CKPT),
    "bench-out_json-name-too-long": Hostile(B, f"--out_json={{dir}}/{LONG}.json", ("out_json", "255 bytes")),
    "plot-OUT_DIR-name-too-long": Hostile(P, f"{{dir}}/{LONG}", ("OUT_DIR must be", "255 bytes"), RUN),
    "plot-out-name-too-long": Hostile(P, f"--out={{dir}}/{LONG}.png", ("out must be", "255 bytes"), RUN),
    "regression-compare-name-too-long": Hostile(
        B, f"--compare={{dir}}/{LONG} --baseline=x", ("compare must be", "255 bytes")
    ),
    "sample-out_dir-below-a-file": Hostile(S, "--out_dir={dir}/f/out", ("in folders ({dir}/f is a file)",), BELOW),
    "train-out_dir-below-a-file": Hostile(
        T, "--out_dir={dir}/f/out", ("out_dir must be", "in folders ({dir}/f is a file)"), BELOW
    ),
    "train-data_dir-below-a-file": Hostile(
        T, "--data_dir={dir}/f/d", ("data_dir must be", "in folders ({dir}/f is a file)"), BELOW
    ),
    "hellaswag-file-below-a-file": Hostile(
        H, "--file={dir}/f/hs.jsonl", ("file must be", "in folders ({dir}/f is a file)"), BELOW
    ),
    "export-export_dir-below-a-file": Hostile(
        E, "--export_dir={dir}/f/hf", ("in folders ({dir}/f is a file)",), BELOW | CKPT
    ),
    "openwebtext-out_dir-below-a-file": Hostile(
        OWT, "--out_dir={dir}/f/o", ("in folders ({dir}/f is a file)",), BELOW | DOCS
    ),
    # JSON that bench.py's regression check and plot.py did not write
    "regression-nested-without-end": Hostile(B, REGRESSION, ("new.json", "nested too deeply"), compare("[" * 100_000)),
    "regression-truncated": Hostile(B, REGRESSION, ("new.json is not JSON",), compare(bench_output()[:40])),
    "regression-not-utf8": Hostile(B, REGRESSION, ("new.json is not JSON",), compare(b"\xff\xfe{}")),
    "regression-results-a-dict": Hostile(
        B, REGRESSION, ("no results list and manifest",), compare('{"results": {}, "manifest": {}}')
    ),
    "regression-manifest-a-list": Hostile(
        B, REGRESSION, ("no results list and manifest",), compare('{"results": [], "manifest": []}')
    ),
    "regression-result-a-number": Hostile(
        B, REGRESSION, ("its result 0 has no name and status",), compare('{"results": [1], "manifest": {}}')
    ),
    "regression-metric-a-string": Hostile(
        B, REGRESSION, ("ms_median 'fast', not a finite number",), compare(bench_output(ms_median="fast"))
    ),
    "regression-metric-infinite": Hostile(
        B, REGRESSION, ("old.json", "ms_median 'inf'"), compare(bench_output(), bench_output(ms_median=float("inf")))
    ),
    "regression-metric-a-bool": Hostile(
        B, REGRESSION, ("tokens_per_s 'True'",), compare(bench_output(tokens_per_s=True))
    ),
    "regression-two-results-of-one-name": Hostile(
        B,
        REGRESSION,
        ("two results are named 'a'",),
        compare(json.dumps({"manifest": {}, "results": [json.loads(bench_output())["results"][0]] * 2})),
    ),
    "regression-ok-without-settings": Hostile(
        B, REGRESSION, ("its result 'a' has no settings",), compare(bench_output(settings=None))
    ),
    "regression-not-a-file": Hostile(B, REGRESSION, ("no bench output at",), {"new.json/x": "", "old.json": "{}"}),
    "plot-log-nested-without-end": Hostile(P, "", ("line 1", "nested too deeply"), {"run/log.jsonl": "[" * 100_000}),
    "plot-log-of-lists": Hostile(P, "", ("line 1 is not a JSON object",), {"run/log.jsonl": "[1, 2]\n"}),
    # the side scripts' numbers and paths
    "loader-data-a-file": Hostile(BL, "--data={dir}/f", ("data must be '' or a dataset folder",), BELOW),
    "loader-data-missing": Hostile(BL, "--data={dir}/nowhere", ("data must be '' or a dataset folder",)),
    "loader-batches=100": Hostile(BL, "--batches=100", ("batches must be > 100",)),
    "loader-repeats=-1": Hostile(BL, "--repeats=-1", ("repeats must be >= 1, not -1",)),
    "loader-orders-empty": Hostile(BL, "--orders=", ("orders must be a comma-separated list of random, epochs",)),
    "loader-block_size=nan": Hostile(BL, "--block_size=nan", ("block_size must be int",)),
    "generate-nanogpt_dir-a-file": Hostile(G, "--nanogpt_dir={dir}/f", ("nanogpt_dir must be a nanoGPT",), BELOW),
    "generate-repeats=0": Hostile(G, "--repeats=0", ("repeats must be >= 1, not 0",)),
    "generate-top_k=-1": Hostile(G, "--top_k=-1", ("top_k must be >= 0",)),
    "bench_prepare-process_counts=1,x": Hostile(BP, "--process_counts=1,x", ("comma-separated integers",)),
    "bench_prepare-process_counts=0": Hostile(BP, "--process_counts=0", ("process_counts must all be >= 1",)),
    "bench_prepare-repeats=0": Hostile(BP, "--repeats=0", ("repeats must be >= 1, not 0",)),
    "bench_prepare-shard_size=-5": Hostile(BP, "--shard_size=-5", ("shard_size must be >= 1, not -5",)),
    # code in a data folder never runs unasked; a prepare script never overwrites another kind of dataset
    "train-a-data-folders-own-code": Hostile(
        T,
        "",
        ("data/tiny/prepare.py is not one of this repository's preparers", "run_data_preparer=True"),
        TINY | {"data/tiny/prepare.py": MARKER},
    ),  # fmt: skip
    "train-a-changed-copy-of-a-preparer": Hostile(
        T,
        "--dataset=shakespeare_char",
        ("shakespeare_char/prepare.py is not one of this repository's preparers",),
        {"data/shakespeare_char/prepare.py": (ROOT / CHAR).read_text() + "\n" + MARKER},
    ),
    "bench-a-data-folders-own-code": Hostile(
        B,
        "--data_dir={dir}/data --dataset=tiny",
        ("is not one of this repository's preparers",),
        TINY | {"data/tiny/prepare.py": MARKER},
    ),  # fmt: skip
    "char-unknown-option": Hostile(CHAR, "--out_dir={dir}/d", ("unknown option '--out_dir={dir}/d'", "--help")),
    "char-two-folders": Hostile(CHAR, "{dir}/a {dir}/b", ("one FOLDER at most, not 2",)),
    "char-folder-name-too-long": Hostile(CHAR, f"{{dir}}/{LONG}", ("the FOLDER must be", "255 bytes")),
    "bpe-over-a-character-dataset": Hostile(
        BPE, "{dir}/d", ("must be new or an earlier gpt2 preparation", "a preparation of characters kind"), CHARS
    ),
    "char-over-a-bpe-dataset": Hostile(CHAR, "{dir}/d", ("earlier characters preparation", "gpt2 kind"), BPE_DATA),
    "char-over-nanogpts-bpe-without-meta": Hostile(
        CHAR, "{dir}/d", ("holds train.bin without a meta.pkl",), {"d/train.bin": uint16(TOKENS), "d/input.txt": "ab"}
    ),
    "char-over-shards": Hostile(
        BPE, "{dir}/d", ("another kind of dataset (x_train_000001.bin)",), {"d/x_train_000001.bin": shard(TOKENS)}
    ),
    "char-over-a-damaged-meta": Hostile(CHAR, "{dir}/d", ("is not a valid meta.pkl",), {"d/meta.pkl": b"junk"}),
    "openwebtext-over-a-character-dataset": Hostile(
        OWT, "--out_dir={dir}/d", ("out_dir", "holds another dataset (train.bin, val.bin, meta.pkl)"), DOCS | CHARS
    ),
    "fineweb-over-openwebtext-shards": Hostile(
        FW,
        "--out_dir={dir}/d",
        ("another dataset (openwebtext_train_000001.bin)",),
        DOCS | {"d/openwebtext_train_000001.bin": shard(TOKENS)},
    ),  # fmt: skip
    # vocabularies that do not fit their model (checkpoints: before the model is built)
    "sample-tokenizer-past-the-model": Hostile(
        S,
        "",
        ("the checkpoint's tokenizer (characters (100)) has 100 tokens", "vocabulary of 16"),
        {"out/ckpt.pt": Ckpt(100)},
    ),  # fmt: skip
    "export-tokenizer-past-the-model": Hostile(
        E, "", ("has 100 tokens, more than its model's vocabulary of 16",), {"out/ckpt.pt": Ckpt(100)}
    ),
    "hellaswag-tokenizer-past-the-model": Hostile(H, "", ("has 100 tokens",), {"out/ckpt.pt": Ckpt(100)} | HELLASWAG),
    "sample-export-vocabulary-not-json": Hostile(
        S, "--init_from={dir}/hf", ("vocabulary.json is not a vocabulary",), hf({}) | {"hf/vocabulary.json": "{"}
    ),
    "sample-export-vocabulary-twice-a-character": Hostile(
        S, "--init_from={dir}/hf", ("itos gives two token ids the same string",), hf({}) | VOCABULARY(["a", "a"])
    ),
    "sample-export-vocabulary-past-the-model": Hostile(
        S,
        "--init_from={dir}/hf",
        ("model folder's tokenizer", "100 tokens", "vocabulary of 64"),
        hf({}) | VOCABULARY(list("abc") + [chr(200 + i) for i in range(97)]),
    ),  # fmt: skip
    "hellaswag-export-of-characters": Hostile(
        H, "--init_from={dir}/hf", ("scored in GPT-2's tokens", "characters (3)"), hf({}) | VOCABULARY(list("abc"))
    ),
    "hellaswag-model-folder-smaller-than-gpt2": Hostile(
        H,
        "--init_from={dir}/hf",
        ("GPT-2 BPE) has 50257 tokens, more than its model's vocabulary of 64",),
        hf({}) | HELLASWAG,
    ),  # fmt: skip
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Ckpt(n) -> the bytes of a tiny checkpoint (a model of 16 tokens) whose tokenizer has n characters."""
    from model import GPT, GPTConfig
    from nanogpt_perf.train.checkpoint import save_checkpoint

    made = {}
    for n in {c.characters for case in CASES.values() for c in case.files.values() if isinstance(c, Ckpt)}:
        model_args = dict(block_size=16, vocab_size=16, n_layer=1, n_head=2, n_embd=8, dropout=0.0)
        tokenizer = {"kind": "characters", "itos": [chr(97 + i) for i in range(n)]}
        path = tmp_path_factory.mktemp("ckpt") / "ckpt.pt"
        save_checkpoint(
            {"model": GPT(GPTConfig(**model_args)).state_dict(), "model_args": model_args, "tokenizer": tokenizer}, path
        )
        made[Ckpt(n)] = path.read_bytes()
    return made


def make_files(folder: Path, files: dict, checkpoints: dict) -> None:
    for path, data in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        data = checkpoints[data] if isinstance(data, Ckpt) else data
        (folder / path).write_bytes(data if isinstance(data, bytes) else data.encode())


@pytest.mark.parametrize("name", CASES)
def test_refused_with_one_line_and_nothing_written(name, checkpoints, tmp_path, monkeypatch):
    case = CASES[name]
    if case.home:
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
    make_files(tmp_path, case.files, checkpoints)
    before = contents(tmp_path)
    flags = [f.replace("{dir}", str(tmp_path)) for f in f"{COMMON[case.script]} {case.flags}".split()]
    result = run_in_process(case.script, *flags)
    assert_one_line_error(result, *(n.replace("{dir}", str(tmp_path)) for n in case.names))
    assert result.returncode == (2 if case.flags == REGRESSION else 1)  # a regression check compared nothing: 2
    assert contents(tmp_path) == before


def test_the_table_is_large_enough():
    assert len(CASES) >= 70


# ----------------------------------------------------------------------------- what is no refusal


@pytest.mark.parametrize("script", [CHAR, BPE, OWT, FW])
def test_every_prepare_script_prints_its_usage_for_help_and_writes_nothing(script, tmp_path):
    before = contents(tmp_path)
    result = run_in_process(script, "--help", cwd=ROOT)
    assert result.returncode == 0 and result.stderr == ""
    assert "usage" in result.stdout.lower() or "FOLDER" in result.stdout
    assert not (ROOT / "--help").exists() and not (ROOT / "-h").exists() and contents(tmp_path) == before


ENTRY_SCRIPTS = [
    "train.py", "bench.py", "sample.py", "export.py", "hellaswag.py", "plot.py", "benchmarks/generate.py",
    "benchmarks/loader.py", "benchmarks/losses.py", "benchmarks/muon.py", "benchmarks/prepare.py",
    "benchmarks/time_to_loss.py", "benchmarks/ttl_data.py", "scripts/gpu_suite.py", "scripts/soak.py",
    "scripts/preemption_check.py",
]  # fmt: skip


@pytest.mark.parametrize("script", ENTRY_SCRIPTS)
def test_every_entry_script_prints_its_usage_for_help(script, monkeypatch):
    """Each script imports and reads its command line: a name it imports that is gone is a failure here."""
    monkeypatch.syspath_prepend(str((ROOT / script).parent))  # as python puts a script's own folder first
    result = run_in_process(script, "--help", cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "usage" in (result.stdout + result.stderr).lower()


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
    assert own_preparer(own) == ROOT / CHAR and own_preparer(ROOT / "data" / "shakespeare_char") == ROOT / CHAR
    prepare_if_missing(own)  # this repository's script, run on the folder: nothing of the folder's code
    assert (own / "train.bin").is_file() and pickle.loads((own / "meta.pkl").read_bytes())["kind"] == "characters"

    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "prepare.py").write_text(MARKER + "Path(__file__).with_name('train.bin').write_bytes(bytes(4))\n")
    assert own_preparer(foreign) is None
    prepare_if_missing(foreign, allow_foreign=True)  # run_data_preparer=True: the user asked for it
    assert (foreign / "ran").is_file() and (foreign / "train.bin").is_file()


@dataclass
class Paths:
    """A setting of each path check, and one of free text."""

    out_dir: str = setting("o", "a folder", check=a_path)
    file: str = setting("", "a file or none", check=optional_path)
    out_json: str = setting("", "a JSON file to write", check=output_file(".json"))
    export_dir: str = setting("e", "a folder to write", check=output_folder)
    init_from: str = setting("scratch", "a choice or a folder", check=init_from_one_of("scratch"))
    n: str = setting("", "free text")


def test_path_rules_and_the_home_expansion_the_configurator_can_apply(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    given = {"out_dir": "~/o", "file": "~", "out_json": "~/r.json", "export_dir": "~/e", "init_from": "~", "n": "~"}
    cfg = configure([f"--{k}={v}" for k, v in given.items()], paths=Paths)  # each expanded value then checked
    assert cfg.as_dict() == {k: str(tmp_path) + v[1:] if k != "n" else "~" for k, v in given.items()}
    for k, v in cfg.as_dict().items():
        if check := cfg.metadata(k).get("check"):
            assert check(v) is None
    with pytest.raises(ValueError, match=re.escape("write it out: " + str(tmp_path / "o"))):
        a_path("~/o")
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match=r"^a folder \(this is a file\)$"):
        output_folder(str(tmp_path / "f"))
    assert output_folder(str(tmp_path / "new" / "deeper")) is None and optional_path("") is None
    with pytest.raises(ValueError, match="^scratch or a transformers folder$"):  # not an OSError
        init_from_one_of("scratch")(LONG)


def test_the_same_folder_by_other_names(tmp_path, monkeypatch):
    from nanogpt_perf.guard.dataset import canonical_folder, same_folder

    data = tmp_path / "data" / "tiny"
    data.mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "data")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path / "data")
    for other in ("tiny", "./tiny/", "~/data/tiny", str(tmp_path / "link" / "tiny"), "../data/tiny/../tiny"):
        assert same_folder(data, other), other
        assert canonical_folder(other) == str(data.resolve())
    (tmp_path / "data" / "other").mkdir()
    assert not same_folder(data, "other") and not same_folder(data, "missing")


def test_meta_of_every_preparer_records_its_kind(tmp_path):
    from data.shakespeare_char.prepare import prepare
    from data.tiny_shakespeare import folder_problem, kind_of

    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "input.txt").write_text("ab ba\n" * 100)
    assert prepare(folder)["kind"] == "characters"
    assert folder_problem(folder, "characters") is None  # prepared again over itself: allowed
    assert "characters kind" in folder_problem(folder, "gpt2")
    assert kind_of({"vocab_size": 3, "itos": {}}) == "characters" and kind_of({"tokenizer": "gpt2"}) == "gpt2"
    assert kind_of({"vocab_size": 3}) is None and HF_CONFIG["vocab_size"] == 64
    assert os.path.getsize(folder / "train.bin") == 2 * int(0.9 * 600)


def test_a_model_folders_vocabulary_against_a_datasets():
    from nanogpt_perf.errors import UserError
    from nanogpt_perf.guard.vocabulary import check_same_vocabulary

    chars = lambda s: {"kind": "characters", "itos": list(s)}  # noqa: E731
    check_same_vocabulary(chars("abc"), chars("abc"), "tiny")
    check_same_vocabulary({"kind": "gpt2"}, chars("abc"), "tiny")  # GPT-2's weights, any data
    with pytest.raises(UserError) as refused:
        check_same_vocabulary(chars("abc"), chars("abd"), "tiny")
    assert str(refused.value) == (
        "the model folder's vocabulary (3 characters, its vocabulary.json) is not dataset tiny's (3 characters): "
        "its token ids would mean other characters"
    )
    with pytest.raises(UserError, match=r"\(GPT-2's BPE\)"):
        check_same_vocabulary(chars("ab"), {"kind": "gpt2"}, "owt")
