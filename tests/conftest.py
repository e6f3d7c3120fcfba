import contextlib
import copy
import io
import json
import os
import pickle
import runpy
import signal
import socket
import struct
import subprocess
import sys
import zipfile
from functools import cache
from pathlib import Path
from typing import NamedTuple

# One thread for torch here and in every script a test starts: the tensors are tiny, and where two
# pytest workers (or any other load) share 2 cores, OpenMP's threads spin waiting for a core (a tiny
# train.py took 10 times as long on 2 threads as on 1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save as safetensors_bytes  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# the optimizer's settings of test_optim.py's and test_lowmem.py's small runs
HYPER = dict(learning_rate=3e-3, weight_decay=0.1, beta1=0.9, beta2=0.95, muon_lr=0.03,
             muon_weight_decay=0.05)  # fmt: skip
sys.path.insert(0, str(ROOT))

TINY_MODEL = [
    "--n_layer=2",
    "--n_head=2",
    "--n_embd=32",
    "--block_size=32",
    "--batch_size=8",
    "--compile=false",
    "--device=cpu",
    "--dropout=0.0",
    "--gradient_accumulation_steps=1",
]


def run_script(*args: str, cwd: Path = ROOT, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run a script of the suite as a user would, capturing its output."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
    )


def sigterm_at(*args: str, line: str) -> tuple[int, str, str]:
    """Run a script as run_script does and send it SIGTERM once a line of its output starts with
    `line`: its exit status and its stdout (from that line on, the line left out) and stderr."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    run = subprocess.Popen([sys.executable, *args], cwd=ROOT, text=True, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    for printed in run.stdout:
        if printed.startswith(line):
            run.send_signal(signal.SIGTERM)
            break
    stdout, stderr = run.communicate(timeout=120)
    return run.returncode, stdout, stderr


def run_in_process(script: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run a script of the suite as run_script does, but inside this process (torch is imported
    already: a tenth of the time), for inputs refused before any work: its exit status and output as
    Python's would be, an uncaught exception printed as a traceback on stderr.
    tests/test_bad_input.py checks that both ways agree."""
    out, err, argv, where, code = io.StringIO(), io.StringIO(), [script, *args], os.getcwd(), 0
    saved_argv, sys.argv, saved_hook = sys.argv, argv, sys.excepthook
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_path(str(cwd / script), run_name="__main__")
            # as the interpreter ends on it: a message goes to stderr with status 1
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else int(e.code is not None)
                if isinstance(e.code, str):
                    print(e.code, file=sys.stderr)
            # as the interpreter ends on it: the script's handler (errors.report_errors)
            except BaseException as e:
                sys.excepthook(type(e), e, e.__traceback__)
                code = 130 if isinstance(e, KeyboardInterrupt) else 1
    finally:
        sys.argv, sys.excepthook = saved_argv, saved_hook
        os.chdir(where)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def run_train(
    data_dir: Path, out_dir: Path, *flags: str, ranks: int = 1
) -> subprocess.CompletedProcess:
    """train.py with the tiny model on the dataset 'tiny' under data_dir; under torchrun when ranks
    > 1."""
    torchrun = (
        ("-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}")
        if ranks > 1
        else ()
    )
    dataset = (f"--data_dir={data_dir}", "--dataset=tiny", f"--out_dir={out_dir}")
    return run_script(*torchrun, "train.py", *TINY_MODEL, *dataset, *flags)


def refuse_train(data_dir: Path, out_dir: Path, *flags: str) -> subprocess.CompletedProcess:
    """run_train for a command that is refused before any work: in this process (run_in_process)."""
    dataset = (f"--data_dir={data_dir}", "--dataset=tiny", f"--out_dir={out_dir}")
    return run_in_process("train.py", *TINY_MODEL, *dataset, *flags)


def assert_one_line_error(result, *fragments: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def pytest_collection_modifyitems(config, items) -> None:
    """Tests marked gpu (the CUDA paths: pytest -m gpu) are skipped where there is no CUDA."""
    import torch

    if not torch.cuda.is_available():
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))


@pytest.fixture(autouse=True)
def float32_matmuls_as_they_were():
    """Each test leaves float32's matmul precision as it found it: resolve_runtime sets it for the
    process (TF32 on a GPU), and a later test's float32 tolerances would otherwise hold TF32's
    products to them."""
    precision, cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    yield
    torch.set_float32_matmul_precision(precision)
    torch.backends.cudnn.allow_tf32 = cudnn


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """A data_dir holding a small character-level dataset 'tiny', made by the real prepare
    script."""
    from data.shakespeare_char.prepare import prepare

    data_dir = tmp_path_factory.mktemp("data")
    folder = data_dir / "tiny"
    folder.mkdir()
    lines = [
        "the quick brown fox jumps over the lazy dog.",
        "to be, or not to be: that is the question.",
    ]
    (folder / "input.txt").write_text("\n".join(lines * 300) + "\n")
    prepare(folder)
    return data_dir


class Declarations(NamedTuple):
    """What a script hands configure(): its parts, every setting's default as it declares them, and
    its rules between settings (train.py's are those it hands merged_settings, once a resumed run's
    settings are merged)."""

    parts: dict
    defaults: dict
    cross: tuple

    def config(self, **values):
        """The Config the script would run with these settings changed, checked as configure checks
        them."""
        from nanogpt_perf.config import build

        return build(self.parts, self.defaults | values, (), self.cross, self.defaults)


class _Captured(Exception):
    pass


@cache
def declarations(script: str) -> Declarations:
    """A script's declarations, run up to its configure() call (which is replaced for it)."""
    import configurator
    from nanogpt_perf.config import flat_defaults

    def capture(argv=None, cross=(), defaults=None, usage="", **parts):
        raise _Captured(Declarations(parts, flat_defaults(parts, defaults), tuple(cross)))

    real, configurator.configure = configurator.configure, capture
    try:
        runpy.run_path(str(ROOT / script), run_name="__main__")
    except _Captured as e:
        found = e.args[0]
    finally:
        configurator.configure = real
    if script == "train.py":
        from nanogpt_perf.lowmem import lowmem_rules
        from nanogpt_perf.optim import muon_rules, schedule_rules
        from nanogpt_perf.train.build import kernels_run_here

        found = found._replace(cross=(schedule_rules, muon_rules, kernels_run_here, lowmem_rules))
    return found


# -- shared by the hostile tests (tests/test_hostile_*.py): a script refused before any work --

# in Case.files: the tiny checkpoint (a character vocabulary of abcdefgh and space)
CHECKPOINT = None
# files a case starts from: a checkpoint in out/, a document, a HellaSwag file of one example
CKPT = {"out/ckpt.pt": CHECKPOINT}
DOCS = {"docs.txt": "some text"}
HELLASWAG = {"hs.jsonl": json.dumps({"ctx": "A man", "endings": ["a", "b", "c", "d"], "label": 0})}


class Case(NamedTuple):
    script: str
    flags: str  # space-separated; {dir} is the case's own folder
    names: tuple[str, ...]  # what the error line must say
    # made in the folder first: path -> text, bytes, or CHECKPOINT
    files: dict[str, str | bytes | None] = {}


# flags every case of a script starts with, so that whatever a script would write lands in the
# case's folder
COMMON = {
    "train.py": "--out_dir={dir}/out --data_dir={dir}/data --dataset=tiny --device=cpu "
    "--compile=false",
    "sample.py": "--out_dir={dir}/out --device=cpu --start=abc",
    "export.py": "--out_dir={dir}/out --export_dir={dir}/hf",
    "bench.py": "--out_json={dir}/bench.json --device=cpu --compile=false",
    "lab/generate.py": "--device=cpu",
    "lab/loader.py": "--device=cpu",
    "lab/prepare.py": "",
    "hellaswag.py": "--out_dir={dir}/out --device=cpu",
    "data/openwebtext/prepare.py": "--out_dir={dir}/out --input={dir}/docs.txt",
    "data/fineweb/prepare.py": "--out_dir={dir}/out --input={dir}/docs.txt",
}


def contents(folder: Path) -> dict[str, bytes | None]:
    """Every file's bytes and every folder (None) under folder, by relative path."""
    return {
        str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None
        for p in folder.rglob("*")
    }


def run_case(case: Case, folder: Path, checkpoint: bytes, run=run_in_process) -> tuple:
    """(the run, the folder's contents before, after)."""
    for path, text in case.files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        data = (
            checkpoint if text is CHECKPOINT else text if isinstance(text, bytes) else text.encode()
        )
        (folder / path).write_bytes(data)
    before = contents(folder)
    flags = [f.replace("{dir}", str(folder)) for f in f"{COMMON[case.script]} {case.flags}".split()]
    return run(case.script, *flags), before, contents(folder)


def refuse_case(case: Case, folder: Path, checkpoint: bytes) -> None:
    """run_case for a refused command: one error line naming what it must, every file of folder as
    it was."""
    result, before, after = run_case(case, folder, checkpoint)
    assert_one_line_error(result, *(n.replace("{dir}", str(folder)) for n in case.names))
    assert after == before


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> bytes:
    from model import GPT, GPTConfig
    from nanogpt_perf.train.checkpoint import save_checkpoint

    model_args = dict(block_size=16, vocab_size=16, n_layer=1, n_head=2, n_embd=8, dropout=0.0)
    tokenizer = {"kind": "characters", "itos": list("abcdefgh ")}
    path = tmp_path_factory.mktemp("checkpoint") / "ckpt.pt"
    save_checkpoint(
        {
            "model": GPT(GPTConfig(**model_args)).state_dict(),
            "model_args": model_args,
            "tokenizer": tokenizer,
        },
        path,
    )
    return path.read_bytes()


def write_files(folder: Path, files: dict[str, str | bytes]) -> None:
    """Make each file (path -> text or bytes) under folder."""
    for path, data in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(data if isinstance(data, bytes) else data.encode())


from model import GPT, GPTConfig  # noqa: E402
from nanogpt_perf.data.identity import dataset_identity  # noqa: E402
from nanogpt_perf.data.shards import HEADER_INTS, MAGIC, VERSION  # noqa: E402
from nanogpt_perf.guard.lock import LOCK_NAME, process_start  # noqa: E402


# a character dataset 'tiny' of 29 tokens (a to z, {, |, }), each file as bytes
def uint16(tokens) -> bytes:
    return np.asarray(tokens, dtype="<u2").tobytes()


def meta(vocab_size=29, n=29, **changes) -> bytes:
    itos = {i: chr(97 + i) for i in range(n)}
    return pickle.dumps(
        {"vocab_size": vocab_size, "itos": itos, "stoi": {s: i for i, s in itos.items()}} | changes
    )


def shard(tokens, magic=MAGIC, version=VERSION, count=None) -> bytes:
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = magic, version, len(tokens) if count is None else count
    return header.tobytes() + uint16(tokens)


TOKENS = np.arange(3000) % 29
DATA = {
    "data/tiny/train.bin": uint16(TOKENS),
    "data/tiny/val.bin": uint16(TOKENS[:1500]),
    "data/tiny/meta.pkl": meta(),
}
SHARDS = {
    "data/tiny/tiny_val_000000.bin": shard(TOKENS[:1500]),
    "data/tiny/tiny_train_000001.bin": shard(TOKENS),
}
ITOS = {i: chr(97 + i) for i in range(29)}


def with_data(**files: bytes | None) -> dict:
    """DATA with files changed (name -> bytes) or left out (None)."""
    changed = DATA | {f"data/tiny/{k.replace('_', '.', 1)}": v for k, v in files.items()}
    return {k: v for k, v in changed.items() if v is not None}


# a tiny GPT-2 in transformers' format: its config.json and model.safetensors, each spoilt one way
# by a case
HF_CONFIG = {
    "model_type": "gpt2",
    "n_layer": 1,
    "n_head": 2,
    "n_embd": 8,
    "n_positions": 32,
    "vocab_size": 64,
}


def hf_weights(**changes) -> dict[str, torch.Tensor]:
    d, shapes = (
        8,
        {"wte.weight": (64, 8), "wpe.weight": (32, 8), "ln_f.weight": (8,), "ln_f.bias": (8,)},
    )
    block = {
        "ln_1": (d,),
        "ln_2": (d,),
        "attn.c_attn": (d, 3 * d),
        "attn.c_proj": (d, d),
        "mlp.c_fc": (d, 4 * d),
    }
    for name, shape in (block | {"mlp.c_proj": (4 * d, d)}).items():
        shapes[f"h.0.{name}.weight"], shapes[f"h.0.{name}.bias"] = shape, shape[-1:]
    weights = {
        f"transformer.{k}": torch.zeros(v) for k, v in (shapes | changes).items() if v is not None
    }
    return weights


def hf(
    config: dict | str | None = None, weights: bytes | None = None, name: str = "model.safetensors"
) -> dict:
    files = {
        "hf/README": "a folder",
        f"hf/{name}": safetensors_bytes(hf_weights()) if weights is None else weights,
    }
    if config is not None:
        files["hf/config.json"] = (
            config if isinstance(config, str) else json.dumps(HF_CONFIG | config)
        )
    return files


HF_OK = json.dumps(HF_CONFIG)


T, S, E, H, B, G = (
    "train.py",
    "sample.py",
    "export.py",
    "hellaswag.py",
    "bench.py",
    "lab/generate.py",
)
BL, BP, P = "lab/loader.py", "lab/prepare.py", "lab/plot.py"
OWT, FW, CHAR, BPE = (
    "data/openwebtext/prepare.py",
    "data/fineweb/prepare.py",
    "data/shakespeare_char/prepare.py",
    "data/shakespeare/prepare.py",
)


# -- more shared cases: a script's flags and files (ScriptCase), a run's checkpoint and environment
# (RunCase) ----

LONG = "a" * 300  # a name longer than any file system takes (255 bytes)

DEEP = "/".join(["b" * 200] * 25)  # a path longer than PATH_MAX (4096 bytes), each name valid


class Ckpt(NamedTuple):
    """In Hostile.files: a tiny checkpoint's bytes, its tokenizer a character vocabulary of n
    characters (the model's is 16)."""

    characters: int = 9


class ScriptCase(NamedTuple):
    script: str
    flags: str  # space-separated; {dir} is the case's own folder
    names: tuple[str, ...]  # what the error line must say
    files: dict = {}  # made in the folder first: path -> text, bytes or Ckpt
    # HOME is {dir}/home, a file: a ~ expanded (once the configurator expands it) leads nowhere
    home: bool = False


SCRIPT_COMMON = {  # so that whatever a script would write lands in the case's folder
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
MODEL_CKPT = {"out/ckpt.pt": Ckpt()}
HOME = {"home": "a file: ~ leads nowhere"}
BELOW = {"f": "a file where a folder is named"}
LOG_RUN = {"run/log.jsonl": json.dumps({"iter": 1, "step_loss": 1.0, "lr": 1e-3}) + "\n"}
HELLASWAG_LINE = {
    "hs.jsonl": json.dumps({"ctx": "A man", "endings": ["a", "b", "c", "d"], "label": 0}) + "\n"
}
CHARS = {"d/train.bin": uint16(TOKENS), "d/val.bin": uint16(TOKENS[:300]), "d/meta.pkl": meta()}
GPT2_META = pickle.dumps({"vocab_size": 50257, "tokenizer": "gpt2", "source": "elsewhere"})
BPE_DATA = {
    "d/train.bin": uint16(TOKENS),
    "d/val.bin": uint16(TOKENS[:300]),
    "d/meta.pkl": GPT2_META,
}
TINY = {"data/tiny/input.txt": "some text to prepare"}
MARKER = "from pathlib import Path\nPath(__file__).with_name('ran').write_text('it ran')\n"


def bench_output(**result) -> str:
    row = {
        "name": "a",
        "status": "ok",
        "reason": "",
        "settings": {"n_layer": 1},
        "ms_median": 1.0,
    } | result
    return json.dumps(
        {"kind": "single", "manifest": {"device_name": "cpu", "torch": "2"}, "results": [row]}
    )


def compare(new: str | bytes, baseline: str | bytes | None = None) -> dict:
    """bench.py's regression check of new against baseline (a good output when None)."""
    return {"new.json": new, "old.json": bench_output() if baseline is None else baseline}


REGRESSION = "--compare={dir}/new.json --baseline={dir}/old.json"
VOCABULARY = lambda itos: {"hf/vocabulary.json": json.dumps({"kind": "characters", "itos": itos})}


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """Ckpt(n) -> the bytes of a tiny checkpoint (a model of 16 tokens) whose tokenizer has n
    characters, made on first use."""
    from model import GPT, GPTConfig
    from nanogpt_perf.train.checkpoint import save_checkpoint

    class Made(dict):
        def __missing__(self, ckpt: Ckpt) -> bytes:
            model_args = dict(
                block_size=16, vocab_size=16, n_layer=1, n_head=2, n_embd=8, dropout=0.0
            )
            tokenizer = {
                "kind": "characters",
                "itos": [chr(97 + i) for i in range(ckpt.characters)],
            }
            path = tmp_path_factory.mktemp("ckpt") / "ckpt.pt"
            model = GPT(GPTConfig(**model_args)).state_dict()
            save_checkpoint(
                {"model": model, "model_args": model_args, "tokenizer": tokenizer}, path
            )
            self[ckpt] = path.read_bytes()
            return self[ckpt]

    return Made()


def make_files(folder: Path, files: dict, checkpoints: dict) -> None:
    for path, data in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        data = checkpoints[data] if isinstance(data, Ckpt) else data
        (folder / path).write_bytes(data if isinstance(data, bytes) else data.encode())


def refuse_script_case(case: ScriptCase, checkpoints: dict, folder: Path, monkeypatch) -> None:
    """Run a ScriptCase in this process: one error line naming what it must, every file of folder as
    it was."""
    if case.home:
        monkeypatch.setenv("HOME", str(folder / "home"))
    make_files(folder, case.files, checkpoints)
    before = contents(folder)
    flags = [
        f.replace("{dir}", str(folder))
        for f in f"{SCRIPT_COMMON[case.script]} {case.flags}".split()
    ]
    result = run_in_process(case.script, *flags)
    assert_one_line_error(result, *(n.replace("{dir}", str(folder)) for n in case.names))
    # a regression check compared nothing: 2
    assert result.returncode == (2 if case.flags == REGRESSION else 1)
    assert contents(folder) == before


TORCHRUN = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE")

LAUNCH = {
    "RANK": "0",
    "LOCAL_RANK": "0",
    "WORLD_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29533",
}


def lock_text(pid: int, host: str, start: str | None) -> str:
    return json.dumps(
        {"pid": pid, "host": host, "process_start": start, "started": "2026-01-01T00:00:00+00:00"}
    )


LIVE_LOCK = {
    f"out/{LOCK_NAME}": lock_text(os.getpid(), socket.gethostname(), process_start(os.getpid()))
}
OTHER_HOST_LOCK = {f"out/{LOCK_NAME}": lock_text(4242, "another-host.example", None)}


class RunCase(NamedTuple):
    # train.py (or sample.py, export.py), its flags, what the line must say, text files made first
    case: Case
    checkpoint: str | None = None  # a variant (VARIANTS) written to out/ckpt.pt first
    env: dict[str, str] = {}  # torchrun's variables, as set by hand


def train_case(flags: str, *names: str, files: dict | None = None, **kw) -> RunCase:
    return RunCase(Case("train.py", flags, names, files or {}), **kw)


RESUME = "--init_from=resume"


class _Payload:
    """Unpickling this would call Path.touch(marker): what a hostile checkpoint could do with any
    callable."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (type(self.marker).touch, (self.marker,))


def saved(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def resumable_checkpoint() -> dict:
    """A checkpoint as nanoGPT's train.py writes one (at iter 5, max_iters 5), with our tokenizer
    for sample.py."""
    torch.manual_seed(0)
    model_args = dict(
        n_layer=2, n_head=2, n_embd=8, block_size=16, bias=False, vocab_size=16, dropout=0.0
    )
    model = GPT(GPTConfig(**model_args))
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
    config = dict(
        dataset="tiny", max_iters=5, eval_interval=5, eval_iters=2, batch_size=8, learning_rate=1e-3
    )
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "model_args": model_args,
        "iter_num": 5,
        "best_val_loss": torch.tensor(3.25),
        "config": config,
        "tokenizer": {"kind": "characters", "itos": list("abcdefgh ")},
    }


def identity_of(files: dict[str, bytes], folder: Path) -> dict:
    """The identity that a run records of the dataset tiny made of files (test_hostile_inputs' DATA)
    in folder."""
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


@pytest.fixture(scope="session")
def variants(tmp_path_factory) -> tuple[dict[str, bytes], Path]:
    """Each checkpoint the cases name, and the file that unpickling the hostile one would create."""
    base, marker = resumable_checkpoint(), tmp_path_factory.mktemp("marker") / "it-ran"
    # DATA's files, as a run on them records them
    identity = identity_of(DATA, tmp_path_factory.mktemp("data"))
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
        "identity_str": variant(base, top("data_identity", "files")),
        "identity_no_folder": variant(base, top("data_identity", {"files": {}})),
        "unknown_option": variant(base, args("rotary_v2", True)),
        "relu2": variant(base, args("relu2", True)),
        "other_data": variant(
            base, top("data_identity", identity | {"files": files | {"train.bin": other}})
        ),
        "other_data_dir": variant(
            base,
            lambda c: c.update(
                data_identity=identity | {"files": files | {"train.bin": other}},
                config=c["config"] | {"data_dir": "/elsewhere"},
            ),
        ),
        "other_meta": variant(
            base, top("data_identity", identity | {"files": files | {"meta.pkl": other}})
        ),
    }
    return made, marker


def refuse_run_case(hostile: RunCase, variants, tmp_path: Path, monkeypatch) -> None:
    """Run a RunCase in this process: its checkpoint variant in out/, torchrun's variables as it
    sets them; one error line naming what it must, every file as it was, and nothing a hostile
    checkpoint would run has run."""
    made, marker = variants
    for key in TORCHRUN:
        monkeypatch.delenv(key, raising=False)
    for key, value in hostile.env.items():
        monkeypatch.setenv(key, value)
    if hostile.checkpoint:
        (tmp_path / "out").mkdir(exist_ok=True)
        (tmp_path / "out" / "ckpt.pt").write_bytes(made[hostile.checkpoint])
    refuse_case(hostile.case, tmp_path, made["ours"])
    assert not marker.exists()


# -- shared by the tests of the model, generation, resuming, the loader and the GPU suite
# ------------------------------

SMALL = GPTConfig(block_size=16, vocab_size=80, n_layer=2, n_head=4, n_embd=32, dropout=0.0)


GENERATE_CONFIG = dict(block_size=16, vocab_size=64, n_layer=2, n_head=4, n_embd=32, dropout=0.0)


def sharp_model(seed: int = 0, dtype=torch.float64, **overrides) -> GPT:
    """A random model with weights scaled up, so its logits are far from uniform and argmax ties are
    not an issue; float64 so that rounding never decides a token."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**GENERATE_CONFIG, **overrides})).to(dtype).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            # a zero init (zero_init_proj) would leave no path to test
            if p.dim() == 2 and not p.any():
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
            p.mul_(4)
    return model


def prompts(B: int, T: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(64, (B, T), generator=torch.Generator().manual_seed(seed))


def tiny_hf_folder(tmp_path, seed: int = 0):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=100, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    hf = transformers.GPT2LMHeadModel(config).eval()
    hf.save_pretrained(tmp_path / "hf")
    return hf, tmp_path / "hf"


SCHEDULE = (
    "--learning_rate=1e-2",
    "--warmup_iters=2",
    "--lr_decay_iters=12",
    "--eval_iters=2",
    "--log_interval=1",
)


def step_losses(out) -> dict[int, float]:
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return {r["iter"]: r["step_loss"] for r in records if "step_loss" in r}


def llmc_shard(
    path: Path,
    tokens: np.ndarray,
    magic: int = 20240520,
    version: int = 1,
    count: int | None = None,
):
    """A shard as llm.c's data scripts write it: 256 little-endian int32 (magic, version, token
    count, zeros), then the tokens as little-endian uint16."""
    header = struct.pack(
        "<256i", magic, version, len(tokens) if count is None else count, *([0] * 253)
    )
    path.write_bytes(header + tokens.astype("<u2").tobytes())


def llmc_folder(folder: Path, shard_tokens: list[int]) -> Path:
    """fineweb_val_000000.bin then fineweb_train_000001.bin, ...: shard i holds i * 10000, i * 10000
    + 1, ..., so that a token tells which shard and where it came from."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, n in enumerate(shard_tokens):
        split = "val" if i == 0 else "train"
        llmc_shard(folder / f"fineweb_{split}_{i:06d}.bin", np.arange(i * 10000, i * 10000 + n))
    return folder


def sdpa_equals_manual(sdpa: GPT, manual: GPT, x: torch.Tensor, y: torch.Tensor) -> None:
    """The logits, the loss's and every parameter's gradient of two models, one attending through
    SDPA, the other through the masked-softmax reference, equal."""
    logits_s, loss_s = sdpa(x, y)
    logits_m, loss_m = manual(x, y)
    torch.testing.assert_close(logits_s, logits_m, rtol=1e-5, atol=1e-5)
    loss_s.backward()
    loss_m.backward()
    for (name, p_s), p_m in zip(sdpa.named_parameters(), manual.parameters(), strict=True):
        torch.testing.assert_close(p_s.grad, p_m.grad, rtol=1e-4, atol=1e-6, msg=name)


def micro_batches_equal_one_batch(
    big: GPT, micro: GPT, x: torch.Tensor, y: torch.Tensor, k: int = 4
) -> None:
    """The gradients of the batch (x, y) in big equal those of its k micro-batches, each loss / k,
    in micro."""
    _, loss = big(x, y)
    loss.backward()
    for xs, ys in zip(x.chunk(k), y.chunk(k), strict=True):
        _, loss = micro(xs, ys)
        (loss / k).backward()
    for (name, p_big), p_micro in zip(big.named_parameters(), micro.parameters(), strict=True):
        torch.testing.assert_close(p_big.grad, p_micro.grad, rtol=1e-4, atol=1e-7, msg=name)
