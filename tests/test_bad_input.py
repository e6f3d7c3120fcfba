"""Every bad input refused cleanly: one 'error: ' line on stderr naming the setting and what would be valid, a
non-zero exit, no traceback, and every file as it was (no out_dir made, no data prepared, a checkpoint untouched).

Each case runs a script in a folder of its own and fails before any model is built or any data is read. The cases
run inside the test process (conftest.run_in_process: torch is imported once, not 36 times); one case of each script
is also run as a user runs it, in a process of its own, which must say the same."""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import pytest

from conftest import ROOT, assert_one_line_error, run_in_process, run_script

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
CKPT = {"out/ckpt.pt": CHECKPOINT}
DOCS = {"docs.txt": "some text"}
T, S, B, G = "train.py", "sample.py", "bench.py", "benchmarks/generate.py"
OWT, FW = "data/openwebtext/prepare.py", "data/fineweb/prepare.py"

CASES = {
    # train.py: sizes, the schedule, the model's switches, the command line, a config file, a checkpoint to resume
    "train-batch_size=0": Case(T, "--batch_size=0", ("batch_size must be 'auto' or >= 1, not 0",)),
    "train-n_layer=-1": Case(T, "--n_layer=-1", ("n_layer must be >= 1, not -1",)),
    "train-eval_iters=0": Case(T, "--eval_iters=0", ("eval_iters must be >= 1, not 0",)),
    "train-dropout=1.5": Case(T, "--dropout=1.5", ("dropout must be in [0, 1), not 1.5",)),
    "train-learning_rate=-1": Case(T, "--learning_rate=-1", ("learning_rate must be >= 0, not -1.0",)),
    "train-warmup>decay": Case(
        T, "--warmup_iters=100 --lr_decay_iters=50", ("warmup_iters must be <= lr_decay_iters (50)", "not 100")
    ),
    "train-compile_mode": Case(T, "--compile_mode=fastest", ("compile_mode must be one of default", "'fastest'")),
    "train-attention": Case(T, "--attention=flash2", ("attention must be one of manual, sdpa", "'flash2'")),
    "train-data_order": Case(T, "--data_order=shuffled", ("data_order must be one of random, epochs",)),
    "train-parallelism": Case(T, "--parallelism=zero3", ("parallelism must be one of ddp, fsdp, not 'zero3'",)),
    "train-unknown_flag": Case(T, "--lerning_rate=1e-3", ("'lerning_rate'", "did you mean 'learning_rate'")),
    "train-config_file_value": Case(
        T, "{dir}/cfg.py", ("dropout must be in [0, 1), not 2.0",), {"cfg.py": "dropout = 2.0"}
    ),
    "train-resume_bad_value": Case(T, "--init_from=resume --max_iters=-1", ("max_iters must be >= 0",), CKPT),
    # sample.py: the sampling settings, the prompt, the model, the runtime
    "sample-max_new_tokens=-5": Case(S, "--max_new_tokens=-5", ("max_new_tokens must be >= 1, not -5",), CKPT),
    "sample-num_samples=0": Case(S, "--num_samples=0", ("num_samples must be >= 1, not 0",), CKPT),
    "sample-top_p=0": Case(S, "--top_p=0", ("top_p must be in (0, 1], not 0.0",), CKPT),
    "sample-top_p=1.5": Case(S, "--top_p=1.5", ("top_p must be in (0, 1], not 1.5",), CKPT),
    "sample-temperature=-1": Case(S, "--temperature=-1", ("temperature must be >= 0",), CKPT),
    "sample-prompt_outside_vocabulary": Case(S, "--start=abc€z", ("start", "not in the model's vocabulary", "€"), CKPT),
    "sample-init_from=scratch": Case(S, "--init_from=scratch", ("init_from must be resume, gpt2", "'scratch'")),
    "sample-dtype": Case(S, "--dtype=fp8", ("dtype must be one of auto, float32, bfloat16, float16, not 'fp8'",)),
    "sample-device=cuda:99": Case(S, "--device=cuda:99", ("device must be one of", "not 'cuda:99'")),
    # bench.py
    "bench-steps=0": Case(B, "--steps=0", ("steps must be >= 1, not 0",)),
    "bench-beta2=1": Case(B, "--beta2=1.0", ("beta2 must be in [0, 1), not 1.0",)),
    "bench-device=cuda:99": Case(B, "--device=cuda:99", ("device must be one of", "not 'cuda:99'")),
    # benchmarks/generate.py
    "bench_generate-max_new_tokens=1": Case(G, "--max_new_tokens=1", ("max_new_tokens must be >= 2",)),
    "bench_generate-n_embd%n_head": Case(G, "--n_embd=100 --n_head=3", ("n_embd=100 is not divisible by n_head=3",)),
    "bench_generate-device=tpu": Case(G, "--device=tpu", ("device must be one of auto, cpu", "not 'tpu'")),
    "bench_generate-wrong_type": Case(G, "--n_layer=two", ("n_layer must be int",)),
    # export.py
    "export-export_dir=''": Case("export.py", "--export_dir=", ("export_dir must be a path, not ''",), CKPT),
    "export-export_dir_is_a_file": Case("export.py", "", ("export_dir must be a folder",), CKPT | {"hf": "a file"}),
    "export-missing_config": Case("export.py", "{dir}/nope.py", ("nope.py not found",), CKPT),
    # the web-scale data preparation
    "openwebtext-processes=0": Case(OWT, "--processes=0", ("processes must be >= 1, not 0",), DOCS),
    "openwebtext-shard_size=0": Case(OWT, "--shard_size=0", ("shard_size must be >= 1, not 0",), DOCS),
    "openwebtext-unknown_flag": Case(OWT, "--shards=3", ("unknown setting 'shards'",), DOCS),
    "fineweb-shard_size=-1": Case(FW, "--shard_size=-1", ("shard_size must be >= 1, not -1",), DOCS),
    "fineweb-out_dir=''": Case(FW, "--out_dir=", ("out_dir must be a path, not ''",), DOCS),
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


@pytest.mark.parametrize("name", CASES)
def test_refused_with_one_line_and_nothing_written(name: str, checkpoint: bytes, tmp_path):
    result, before, after = run_case(CASES[name], tmp_path, checkpoint)
    assert_one_line_error(result, *CASES[name].names)
    assert after == before


def test_a_process_of_its_own_refuses_as_the_run_in_this_one(checkpoint: bytes, tmp_path_factory):
    """The cases run inside the test process; one case of each script, run as a user runs it, says the same."""
    names = [
        "train-config_file_value",
        "sample-top_p=0",
        "bench-beta2=1",
        "export-export_dir_is_a_file",
        "fineweb-out_dir=''",
    ]
    folders = [(tmp_path_factory.mktemp("inside"), tmp_path_factory.mktemp("own")) for _ in names]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        own = list(pool.map(lambda n, f: run_case(CASES[n], f[1], checkpoint, run_script), names, folders))
    for name, (inside, own_folder), (result, before, after) in zip(names, folders, own, strict=True):
        reference = run_case(CASES[name], inside, checkpoint)[0]
        said = (result.returncode, result.stderr.replace(str(own_folder), "{dir}"))
        assert said == (reference.returncode, reference.stderr.replace(str(inside), "{dir}")), name
        assert_one_line_error(result, *CASES[name].names)
        assert after == before


def test_a_torch_logs_that_torch_refuses_is_one_line():
    """torch reads TORCH_LOGS as it is imported and raises a ValueError of many lines on a name it does not know."""
    env = os.environ | {"TORCH_LOGS": "nonsense"}
    result = subprocess.run([sys.executable, "train.py", "--help"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert_one_line_error(result, "TORCH_LOGS='nonsense' is not what torch takes", "TORCH_LOGS=help")


# every path setting of the benchmarks and tools, pointing nowhere: one line naming it, before any work
NOWHERE = "/nowhere/at/all"
MISSING_INPUTS = [
    ("benchmarks/loader.py", f"--data={NOWHERE}"),
    ("benchmarks/generate.py", f"--nanogpt_dir={NOWHERE}"),
    ("benchmarks/muon.py", f"--text={NOWHERE}.txt"),
    ("benchmarks/prepare.py", f"--input={NOWHERE}.jsonl"),
    ("benchmarks/time_to_loss.py", f"--configs={NOWHERE}.py"),
    ("benchmarks/ttl_data.py", f"--text={NOWHERE}.txt --name=x --data_dir={NOWHERE}"),
    ("scripts/gloo_soak.py", f"--root={NOWHERE}"),
    ("hellaswag.py", f"--file={NOWHERE}.jsonl --init_from=gpt2"),
    ("plot.py", NOWHERE),
    ("bench.py", f"--compare={NOWHERE}.json --baseline={NOWHERE}.json"),
]


@pytest.mark.parametrize("script, flags", MISSING_INPUTS, ids=[s for s, _ in MISSING_INPUTS])
def test_a_missing_input_file_is_one_line(script, flags):
    assert_one_line_error(run_in_process(script, *flags.split()), NOWHERE)
