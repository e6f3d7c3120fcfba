import contextlib
import io
import json
import os
import pickle
import runpy
import signal
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import torch
from safetensors.torch import save as safetensors_bytes

ROOT = Path(__file__).resolve().parents[1]
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
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def sigterm_at(*args: str, line: str) -> tuple[int, str, str]:
    """Run a script as run_script does and send it SIGTERM once a line of its output starts with `line`: its exit
    status and its stdout (from that line on, the line left out) and stderr."""
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
    """Run a script of the suite as run_script does, but inside this process (torch is imported already: a tenth of
    the time), for inputs refused before any work: its exit status and output as Python's would be, an uncaught
    exception printed as a traceback on stderr. tests/test_bad_input.py checks that both ways agree."""
    out, err, argv, where, code = io.StringIO(), io.StringIO(), [script, *args], os.getcwd(), 0
    saved_argv, sys.argv, saved_hook = sys.argv, argv, sys.excepthook
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_path(str(cwd / script), run_name="__main__")
            except SystemExit as e:  # as the interpreter ends on it: a message goes to stderr with status 1
                code = e.code if isinstance(e.code, int) else int(e.code is not None)
                if isinstance(e.code, str):
                    print(e.code, file=sys.stderr)
            except BaseException as e:  # as the interpreter ends on it: the script's handler (errors.report_errors)
                sys.excepthook(type(e), e, e.__traceback__)
                code = 130 if isinstance(e, KeyboardInterrupt) else 1
    finally:
        sys.argv, sys.excepthook = saved_argv, saved_hook
        os.chdir(where)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def run_train(data_dir: Path, out_dir: Path, *flags: str, ranks: int = 1) -> subprocess.CompletedProcess:
    """train.py with the tiny model on the dataset 'tiny' under data_dir; under torchrun when ranks > 1."""
    torchrun = ("-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}") if ranks > 1 else ()
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


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """A data_dir holding a small character-level dataset 'tiny', made by the real prepare script."""
    from data.shakespeare_char.prepare import prepare

    data_dir = tmp_path_factory.mktemp("data")
    folder = data_dir / "tiny"
    folder.mkdir()
    lines = ["the quick brown fox jumps over the lazy dog.", "to be, or not to be: that is the question."]
    (folder / "input.txt").write_text("\n".join(lines * 300) + "\n")
    prepare(folder)
    return data_dir


class Declarations(NamedTuple):
    """What a script hands configure(): its parts, every setting's default as it declares them, and its rules
    between settings (train.py's are those it hands admission, once a resumed run's settings are merged)."""

    parts: dict
    defaults: dict
    cross: tuple

    def config(self, **values):
        """The Config the script would run with these settings changed, checked as configure checks them."""
        from nanogpt_perf.config import build

        return build(self.parts, self.defaults | values, (), self.cross, self.defaults)


class _Captured(Exception):
    pass


@cache
def declarations(script: str) -> Declarations:
    """A script's declarations, run up to its configure() call (which is replaced for it)."""
    import configurator
    from nanogpt_perf.config import flat_defaults

    def capture(argv=None, cross=(), defaults=None, **parts):
        raise _Captured(Declarations(parts, flat_defaults(parts, defaults), tuple(cross)))

    real, configurator.configure = configurator.configure, capture
    try:
        runpy.run_path(str(ROOT / script), run_name="__main__")
    except _Captured as e:
        found = e.args[0]
    finally:
        configurator.configure = real
    if script == "train.py":
        from nanogpt_perf.optim import muon_rules, schedule_rules
        from nanogpt_perf.train.build import kernels_run_here

        found = found._replace(cross=(schedule_rules, muon_rules, kernels_run_here))
    return found


# -- shared by the hostile tests (tests/test_hostile_*.py): cases of a script refused before any work ----------------

CHECKPOINT = None  # in Case.files: the tiny checkpoint (a character vocabulary of abcdefgh and space)


class Case(NamedTuple):
    script: str
    flags: str  # space-separated; {dir} is the case's own folder
    names: tuple[str, ...]  # what the error line must say
    files: dict[str, str | bytes | None] = {}  # made in the folder first: path -> text, bytes, or CHECKPOINT


# flags every case of a script starts with, so that whatever a script would write lands in the case's folder
COMMON = {
    "train.py": "--out_dir={dir}/out --data_dir={dir}/data --dataset=tiny --device=cpu --compile=false",
    "sample.py": "--out_dir={dir}/out --device=cpu --start=abc",
    "export.py": "--out_dir={dir}/out --export_dir={dir}/hf",
    "bench.py": "--out_json={dir}/bench.json --device=cpu --compile=false",
    "benchmarks/generate.py": "--device=cpu",
    "benchmarks/loader.py": "--device=cpu",
    "benchmarks/prepare.py": "",
    "hellaswag.py": "--out_dir={dir}/out --device=cpu",
    "data/openwebtext/prepare.py": "--out_dir={dir}/out --input={dir}/docs.txt",
    "data/fineweb/prepare.py": "--out_dir={dir}/out --input={dir}/docs.txt",
}


def contents(folder: Path) -> dict[str, bytes | None]:
    """Every file's bytes and every folder (None) under folder, by relative path."""
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in folder.rglob("*")}


def run_case(case: Case, folder: Path, checkpoint: bytes, run=run_in_process) -> tuple:
    """(the run, the folder's contents before, after)."""
    for path, text in case.files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        data = checkpoint if text is CHECKPOINT else text if isinstance(text, bytes) else text.encode()
        (folder / path).write_bytes(data)
    before = contents(folder)
    flags = [f.replace("{dir}", str(folder)) for f in f"{COMMON[case.script]} {case.flags}".split()]
    return run(case.script, *flags), before, contents(folder)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> bytes:
    from model import GPT, GPTConfig
    from nanogpt_perf.train.checkpoint import save_checkpoint

    model_args = dict(block_size=16, vocab_size=16, n_layer=1, n_head=2, n_embd=8, dropout=0.0)
    tokenizer = {"kind": "characters", "itos": list("abcdefgh ")}
    path = tmp_path_factory.mktemp("checkpoint") / "ckpt.pt"
    save_checkpoint(
        {"model": GPT(GPTConfig(**model_args)).state_dict(), "model_args": model_args, "tokenizer": tokenizer}, path
    )
    return path.read_bytes()


def write_files(folder: Path, files: dict[str, str | bytes]) -> None:
    """Make each file (path -> text or bytes) under folder."""
    for path, data in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(data if isinstance(data, bytes) else data.encode())


from nanogpt_perf.data.shards import HEADER_INTS, MAGIC, VERSION  # noqa: E402


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
