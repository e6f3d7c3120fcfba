"""Hostile settings, every script: flags and config files with values out of range, of the wrong
type, not finite or past what consumes them; config files that raise, exit or are interrupted; paths
a shell left a ~ in, names the OS rejects, folders below a file; torchrun's variables set by hand
and wrong. Each is refused before any work in one 'error: ' line with every file of the case's
folder as it was, in this process (conftest.run_in_process); one case of each script also as a user
runs it. Then what is accepted: inf where it means no limit, the path rules, --help."""

import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from configurator import configure
from conftest import (
    BELOW,
    BL,
    BP,
    CKPT,
    DATA,
    DEEP,
    DOCS,
    FW,
    HOME,
    LAUNCH,
    LOG_RUN,
    LONG,
    MODEL_CKPT,
    OWT,
    ROOT,
    B,
    Case,
    E,
    G,
    H,
    P,
    S,
    ScriptCase,
    T,
    assert_one_line_error,
    hf,
    refuse_case,
    refuse_run_case,
    refuse_script_case,
    run_case,
    run_in_process,
    run_script,
    run_train,
    train_case,
)
from nanogpt_perf.config import setting
from nanogpt_perf.errors import UserError
from nanogpt_perf.guard.paths import (
    a_path,
    init_from_one_of,
    optional_path,
    output_file,
    output_folder,
)
from nanogpt_perf.train.parallel import torchrun_problem, torchrun_rank

CASES = {
    # train.py: sizes, the schedule, the model's switches, the command line, a config file, a
    # checkpoint to resume
    "train-batch_size=0": Case(T, "--batch_size=0", ("batch_size must be 'auto' or >= 1, not 0",)),
    "train-n_layer=-1": Case(T, "--n_layer=-1", ("n_layer must be >= 1, not -1",)),
    "train-eval_iters=0": Case(T, "--eval_iters=0", ("eval_iters must be >= 1, not 0",)),
    "train-dropout=1.5": Case(T, "--dropout=1.5", ("dropout must be in [0, 1), not 1.5",)),
    "train-learning_rate=-1": Case(
        T, "--learning_rate=-1", ("learning_rate must be >= 0, not -1.0",)
    ),
    "train-warmup>decay": Case(
        T,
        "--warmup_iters=100 --lr_decay_iters=50",
        ("warmup_iters must be <= lr_decay_iters (50)", "not 100"),
    ),
    "train-compile_mode": Case(
        T, "--compile_mode=fastest", ("compile_mode must be one of default", "'fastest'")
    ),
    "train-attention": Case(
        T, "--attention=flash2", ("attention must be one of manual, sdpa", "'flash2'")
    ),
    "train-data_order": Case(
        T, "--data_order=shuffled", ("data_order must be one of random, epochs",)
    ),
    "train-parallelism": Case(
        T, "--parallelism=zero3", ("parallelism must be one of ddp, fsdp, not 'zero3'",)
    ),
    "train-unknown_flag": Case(
        T, "--lerning_rate=1e-3", ("'lerning_rate'", "did you mean 'learning_rate'")
    ),
    "train-config_file_value": Case(
        T, "{dir}/cfg.py", ("dropout must be in [0, 1), not 2.0",), {"cfg.py": "dropout = 2.0"}
    ),
    "train-resume_bad_value": Case(
        T, "--init_from=resume --max_iters=-1", ("max_iters must be >= 0",), CKPT
    ),
    # sample.py: the sampling settings, the prompt, the model, the runtime
    "sample-max_new_tokens=-5": Case(
        S, "--max_new_tokens=-5", ("max_new_tokens must be >= 1, not -5",), CKPT
    ),
    "sample-num_samples=0": Case(S, "--num_samples=0", ("num_samples must be >= 1, not 0",), CKPT),
    "sample-top_p=0": Case(S, "--top_p=0", ("top_p must be in (0, 1], not 0.0",), CKPT),
    "sample-top_p=1.5": Case(S, "--top_p=1.5", ("top_p must be in (0, 1], not 1.5",), CKPT),
    "sample-temperature=-1": Case(S, "--temperature=-1", ("temperature must be >= 0",), CKPT),
    "sample-prompt_outside_vocabulary": Case(
        S, "--start=abc€z", ("start", "not in the model's vocabulary", "€"), CKPT
    ),
    "sample-init_from=scratch": Case(
        S, "--init_from=scratch", ("init_from must be resume, gpt2", "'scratch'")
    ),
    "sample-dtype": Case(
        S, "--dtype=fp8", ("dtype must be one of auto, float32, bfloat16, float16, not 'fp8'",)
    ),
    "sample-device=cuda:99": Case(
        S, "--device=cuda:99", ("device must be one of", "not 'cuda:99'")
    ),
    # bench.py
    "bench-steps=0": Case(B, "--steps=0", ("steps must be >= 1, not 0",)),
    "bench-beta2=1": Case(B, "--beta2=1.0", ("beta2 must be in [0, 1), not 1.0",)),
    "bench-device=cuda:99": Case(B, "--device=cuda:99", ("device must be one of", "not 'cuda:99'")),
    # lab/generate.py
    "bench_generate-max_new_tokens=1": Case(
        G, "--max_new_tokens=1", ("max_new_tokens must be >= 2",)
    ),
    "bench_generate-n_embd%n_head": Case(
        G, "--n_embd=100 --n_head=3", ("n_embd=100 is not divisible by n_head=3",)
    ),
    "bench_generate-device=tpu": Case(
        G, "--device=tpu", ("device must be one of auto, cpu", "not 'tpu'")
    ),
    "bench_generate-wrong_type": Case(G, "--n_layer=two", ("n_layer must be int",)),
    "bench_generate-prompts_with_rivals": Case(
        G, "--prompts=2 --rivals=True", ("prompts > 1 times our engine alone",)
    ),
    "bench_generate-prompts_with_nanogpt": Case(
        G, "--prompts=2 --nanogpt_dir=nanoGPT", ("prompts > 1 times our engine alone",)
    ),
    # export.py
    "export-export_dir=''": Case(
        "export.py", "--export_dir=", ("export_dir must be a path, not ''",), CKPT
    ),
    "export-export_dir_is_a_file": Case(
        "export.py", "", ("export_dir must be a folder",), CKPT | {"hf": "a file"}
    ),
    "export-missing_config": Case("export.py", "{dir}/nope.py", ("nope.py not found",), CKPT),
    # the web-scale data preparation
    "openwebtext-processes=0": Case(OWT, "--processes=0", ("processes must be >= 1, not 0",), DOCS),
    "openwebtext-shard_size=0": Case(
        OWT, "--shard_size=0", ("shard_size must be >= 1, not 0",), DOCS
    ),
    "openwebtext-unknown_flag": Case(OWT, "--shards=3", ("unknown setting 'shards'",), DOCS),
    "fineweb-shard_size=-1": Case(
        FW, "--shard_size=-1", ("shard_size must be >= 1, not -1",), DOCS
    ),
    "fineweb-out_dir=''": Case(FW, "--out_dir=", ("out_dir must be a path, not ''",), DOCS),
    # found while merging: past what consumes them, a dataset larger than the model it starts from,
    # bad bytes
    "train-eval_iters=2**40": Case(
        T, "--eval_iters=1099511627776", ("eval_iters must be <= 1000000, not 1099511627776",)
    ),
    "openwebtext-processes=2**40": Case(
        OWT, "--processes=1099511627776", ("processes must be <= 1024, not 1099511627776",), DOCS
    ),
    "hellaswag-file_not_utf8": Case(
        H,
        "--init_from={dir}/hf --file={dir}/hs.jsonl",
        ("the HellaSwag file", "cannot be read as UTF-8 text"),
        hf({}) | {"hs.jsonl": b"\xff\xfe"},
    ),  # fmt: skip
    # numbers: not finite, past 64 bits, past what consumes them, negative
    "train-learning_rate=1e999": Case(
        T, "--learning_rate=1e999", ("learning_rate must be a finite number, not inf",)
    ),
    "train-learning_rate=nan": Case(
        T, "--learning_rate=nan", ("learning_rate must be a finite number, not nan",)
    ),
    "train-dropout=-inf": Case(T, "--dropout=-inf", ("dropout must be a finite number, not -inf",)),
    "train-grad_clip=inf": Case(T, "--grad_clip=inf", ("grad_clip must be a finite number",)),
    "train-beta2=nan_in_config": Case(
        T,
        "{dir}/cfg.py",
        ("beta2 must be a finite number, not nan",),
        {"cfg.py": "beta2 = float('nan')"},
    ),
    "train-seed=2**64": Case(
        T, "--seed=18446744073709551616", ("seed must be an integer within 64 bits",)
    ),
    "train-seed=-1": Case(T, "--seed=-1", ("seed must be >= 0, not -1",)),
    "train-max_iters=1e30": Case(
        T, "--max_iters=1e30", ("max_iters must be an integer within 64 bits",)
    ),
    # read, never built: no hang
    "train-seed=1e999999999": Case(T, "--seed=1e999999999", ("seed must be int",)),
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
    "train-batch_size=2**40": Case(
        T, "--batch_size=1099511627776", ("batch_size=1099511627776", "host memory"), DATA
    ),
    "train-prefetch=2**40": Case(
        T, "--prefetch=1099511627776", ("prefetch=1099511627776", "host memory"), DATA
    ),
    "train-n_layer=10**9": Case(
        T, "--n_layer=1000000000", ("n_layer=1000000000", "more than this machine's"), DATA
    ),
    "train-pad_vocab=2**40": Case(
        T, "--pad_vocab=1099511627776", ("vocab_size=1099511627776", "memory"), DATA
    ),
    "sample-temperature=1e-40": Case(
        S, "--temperature=1e-40", ("temperature must be 0 (greedy) or >= 1e-06",), CKPT
    ),
    "sample-top_p=nan": Case(S, "--top_p=nan", ("top_p must be a finite number, not nan",), CKPT),
    "sample-top_k=1e30": Case(
        S, "--top_k=1e30", ("top_k must be an integer within 64 bits",), CKPT
    ),
    "sample-num_samples=2**40_batched": Case(
        S,
        "--num_samples=1099511627776 --batched=True",
        ("num_samples=1099511627776", "KV cache"),
        CKPT,
    ),
    "bench-tolerance_pct=nan": Case(
        B, "--tolerance_pct=nan", ("tolerance_pct must be a finite number, or inf",)
    ),
    "bench-peak_flops=inf": Case(
        B, "--peak_flops=inf", ("peak_flops must be a finite number, not inf",)
    ),
    "bench_generate-vocab_size=2**40": Case(
        G, "--vocab_size=1099511627776", ("more than this machine's",)
    ),
    "bench_generate-batch_size=2**40": Case(
        G, "--batch_size=1099511627776", ("batch_size=1099511627776", "KV cache")
    ),
    "bench_generate-prompt>block": Case(
        G, "--prompt_tokens=2048", ("prompt_tokens must be <= block_size (1024)",)
    ),
    "bench_loader-shard_tokens=1e15": Case(
        BL, "--shard_tokens=1e15", ("synthetic shards", "GB free")
    ),
    "bench_prepare-copies=1e15": Case(BP, "--copies=1e15", ("copies=1000000000000000", "GB free")),
    "hellaswag-limit=1e30": Case(H, "--limit=1e30", ("limit must be an integer within 64 bits",)),
    "openwebtext-val_tokens=-1e30": Case(
        OWT, "--val_tokens=-1e30", ("val_tokens must be an integer within 64",), DOCS
    ),
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
    "sample-prompt_file_a_folder": Case(
        S,
        "--start=FILE:{dir}/prompt",
        ("prompt file {dir}/prompt is a folder, not a file",),
        CKPT | {"prompt/x": ""},
    ),
    "hellaswag-file_a_folder": Case(
        H,
        "--init_from={dir}/hf --file={dir}/hs.jsonl",
        ("the HellaSwag file {dir}/hs.jsonl is a folder, not a file",),
        hf({}) | {"hs.jsonl/x": ""},
    ),
    "bench-out_json_a_folder": Case(
        B,
        "--out_json={dir}/x.json",
        ("out_json must be '' or a .json file (a file, not a folder)",),
        {"x.json/a": ""},
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
    "config-sys.exit(0)": Case(
        S, "{dir}/cfg.py", ("line 1: it exits (sys.exit(0))",), {"cfg.py": "exit(0)"}
    ),
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
    "config-SyntaxError": Case(
        G, "{dir}/cfg.py", ("cfg.py, line 1: SyntaxError",), {"cfg.py": "n_layer = (\n"}
    ),
    "config-not_utf8": Case(
        T, "{dir}/cfg.py", ("cfg.py, line 1: SyntaxError",), {"cfg.py": b"n_layer = '\xff'\n"}
    ),
    "config-NUL_byte": Case(
        T, "{dir}/cfg.py", ("cfg.py: ", "null bytes"), {"cfg.py": b"n_layer = 2\x00\n"}
    ),
    "config-deep_expression": Case(
        T,
        "{dir}/cfg.py",
        ("cfg.py cannot be read as Python: RecursionError",),
        {"cfg.py": "n_layer = 1" + " +1" * 999},
    ),
    "config-name_too_long": Case(
        T, "{dir}/" + "a" * 300 + ".py", ("cannot be read as Python: OSError",)
    ),
    "config-folder": Case(
        T, "{dir}/d.py", ("config file {dir}/d.py is not a file",), {"d.py/x": "n_layer = 2"}
    ),
    # shown, not obeyed
    "config-escape_in_name": Case(T, "{dir}/no\x1b[2Kx.py", ("{dir}/no\\x1b[2Kx.py not found",)),
    "config-~_and_NUL": Case(
        T, "{dir}/cfg.py", ("out_dir must be a path without",), {"cfg.py": "out_dir = '~\\0'"}
    ),
    "config-type()_instance": Case(
        T,
        "{dir}/cfg.py",
        ("n_layer must be int", "got a X"),
        {"cfg.py": "n_layer = type('X', (), {})()"},
    ),
    "config-unprintable_exception": Case(
        H,
        "{dir}/cfg.py",
        ("cfg.py, line 3: E: (its message cannot be shown)",),
        {"cfg.py": "class E(Exception):\n    __str__ = lambda self: 1 / 0\nraise E()"},
    ),
}


PATHS = {
    # a ~ that no shell expanded (the shell expands it only at a word's start, not after --out_dir=)
    "sample-out_dir~": ScriptCase(
        S, "--out_dir=~/runs/x", ("out_dir must be",), HOME | MODEL_CKPT, home=True
    ),
    "train-out_dir~": ScriptCase(T, "--out_dir=~/runs/x", ("out_dir must be",), HOME, home=True),
    "train-data_dir~": ScriptCase(T, "--data_dir=~/data", ("data_dir must be",), HOME, home=True),
    "export-export_dir~": ScriptCase(
        E, "--export_dir=~/hf", ("export_dir must be",), HOME | MODEL_CKPT, home=True
    ),
    "export-out_dir~": ScriptCase(E, "--out_dir=~/out", ("out_dir must be",), HOME, home=True),
    "hellaswag-out_json~": ScriptCase(
        H, "--out_json=~/hs.json", ("out_json must be",), HOME | MODEL_CKPT, home=True
    ),
    "hellaswag-file~": ScriptCase(
        H, "--file=~/hs.jsonl", ("file must be",), HOME | MODEL_CKPT, home=True
    ),
    "bench-out_json~": ScriptCase(B, "--out_json=~/b.json", ("out_json must be",), HOME, home=True),
    "generate-out_json~": ScriptCase(
        G, "--out_json=~/g.json", ("out_json must be",), HOME, home=True
    ),
    "generate-nanogpt_dir~": ScriptCase(
        G, "--nanogpt_dir=~/nanoGPT", ("nanogpt_dir must be",), HOME, home=True
    ),
    "loader-data~": ScriptCase(BL, "--data=~/data", ("data must be",), HOME, home=True),
    "openwebtext-out_dir~": ScriptCase(
        OWT, "--out_dir=~/owt", ("out_dir must be",), HOME | DOCS, home=True
    ),
    "plot-out~": ScriptCase(P, "--out=~/c.png", ("out must be",), HOME | LOG_RUN, home=True),
    # names the OS rejects: one longer than 255 bytes, a path longer than 4096, a file where a
    # folder must be
    "sample-out_dir-name-too-long": ScriptCase(
        S, f"--out_dir={{dir}}/{LONG}", ("out_dir must be", "255 bytes")
    ),
    "train-data_dir-name-too-long": ScriptCase(
        T, f"--data_dir={{dir}}/{LONG}", ("data_dir must be", "255 bytes")
    ),
    "train-dataset-name-too-long": ScriptCase(
        T, f"--dataset={LONG}", ("dataset folder must be", "255 bytes")
    ),
    "train-out_dir-path-too-long": ScriptCase(
        T, f"--out_dir={{dir}}/{DEEP}", ("out_dir must be", "4,096 bytes")
    ),
    "export-export_dir-name-too-long": ScriptCase(
        E, f"--export_dir={{dir}}/{LONG}", ("export_dir", "255"), MODEL_CKPT
    ),
    "hellaswag-out_json-name-too-long": ScriptCase(
        H, f"--out_json={{dir}}/{LONG}.json", ("out_json", "255"), MODEL_CKPT
    ),
    "hellaswag-file-path-too-long": ScriptCase(
        H, f"--file={{dir}}/{DEEP}", ("file must be", "4,096 bytes"), MODEL_CKPT
    ),
    "bench-out_json-name-too-long": ScriptCase(
        B, f"--out_json={{dir}}/{LONG}.json", ("out_json", "255 bytes")
    ),
    "plot-OUT_DIR-name-too-long": ScriptCase(
        P, f"{{dir}}/{LONG}", ("OUT_DIR must be", "255 bytes"), LOG_RUN
    ),
    "plot-out-name-too-long": ScriptCase(
        P, f"--out={{dir}}/{LONG}.png", ("out must be", "255 bytes"), LOG_RUN
    ),
    "regression-compare-name-too-long": ScriptCase(
        B, f"--compare={{dir}}/{LONG} --baseline=x", ("compare must be", "255 bytes")
    ),
    "sample-out_dir-below-a-file": ScriptCase(
        S, "--out_dir={dir}/f/out", ("in folders ({dir}/f is a file)",), BELOW
    ),
    "train-out_dir-below-a-file": ScriptCase(
        T, "--out_dir={dir}/f/out", ("out_dir must be", "in folders ({dir}/f is a file)"), BELOW
    ),
    "train-data_dir-below-a-file": ScriptCase(
        T, "--data_dir={dir}/f/d", ("data_dir must be", "in folders ({dir}/f is a file)"), BELOW
    ),
    "hellaswag-file-below-a-file": ScriptCase(
        H, "--file={dir}/f/hs.jsonl", ("file must be", "in folders ({dir}/f is a file)"), BELOW
    ),
    "export-export_dir-below-a-file": ScriptCase(
        E, "--export_dir={dir}/f/hf", ("in folders ({dir}/f is a file)",), BELOW | MODEL_CKPT
    ),
    "openwebtext-out_dir-below-a-file": ScriptCase(
        OWT, "--out_dir={dir}/f/o", ("in folders ({dir}/f is a file)",), BELOW | DOCS
    ),
    # the side scripts' numbers and paths
    "loader-data-a-file": ScriptCase(
        BL, "--data={dir}/f", ("data must be '' or a dataset folder",), BELOW
    ),
    "loader-data-missing": ScriptCase(
        BL, "--data={dir}/nowhere", ("data must be '' or a dataset folder",)
    ),
    "loader-batches=100": ScriptCase(BL, "--batches=100", ("batches must be > 100",)),
    "loader-repeats=-1": ScriptCase(BL, "--repeats=-1", ("repeats must be >= 1, not -1",)),
    "loader-orders-empty": ScriptCase(
        BL, "--orders=", ("orders must be a comma-separated list of random, epochs",)
    ),
    "loader-block_size=nan": ScriptCase(BL, "--block_size=nan", ("block_size must be int",)),
    "generate-nanogpt_dir-a-file": ScriptCase(
        G, "--nanogpt_dir={dir}/f", ("nanogpt_dir must be a nanoGPT",), BELOW
    ),
    "generate-repeats=0": ScriptCase(G, "--repeats=0", ("repeats must be >= 1, not 0",)),
    "generate-top_k=-1": ScriptCase(G, "--top_k=-1", ("top_k must be >= 0",)),
    "bench_prepare-process_counts=1,x": ScriptCase(
        BP, "--process_counts=1,x", ("comma-separated integers",)
    ),
    "bench_prepare-process_counts=0": ScriptCase(
        BP, "--process_counts=0", ("process_counts must all be >= 1",)
    ),
    "bench_prepare-repeats=0": ScriptCase(BP, "--repeats=0", ("repeats must be >= 1, not 0",)),
    "bench_prepare-shard_size=-5": ScriptCase(
        BP, "--shard_size=-5", ("shard_size must be >= 1, not -5",)
    ),
}


TORCHRUN_VARIABLES = {
    # torchrun's variables set by hand
    "rank_alone": train_case(
        "",
        "RANK set but not LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT",
        "torchrun",
        env={"RANK": "1"},
    ),
    "world_size_alone": train_case(
        "", "WORLD_SIZE set but not RANK", "unset WORLD_SIZE", env={"WORLD_SIZE": "2"}
    ),
    "no_master_addr": train_case(
        "",
        "set but not MASTER_ADDR, MASTER_PORT",
        env={"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"},
    ),
    "rank_beyond_world_size": train_case(
        "", "RANK must be in [0, WORLD_SIZE=2), not 5", env=LAUNCH | {"RANK": "5"}
    ),
    "rank_negative": train_case(
        "", "RANK must be in [0, WORLD_SIZE=2), not -1", env=LAUNCH | {"RANK": "-1"}
    ),
    "local_rank_not_an_int": train_case(
        "", "LOCAL_RANK must be an integer, not 'gpu0'", env=LAUNCH | {"LOCAL_RANK": "gpu0"}
    ),
    "local_rank_beyond": train_case(
        "", "LOCAL_RANK must be in [0, WORLD_SIZE=2), not 2", env=LAUNCH | {"LOCAL_RANK": "2"}
    ),
    "world_size_zero": train_case(
        "", "WORLD_SIZE must be >= 1, not 0", env=LAUNCH | {"WORLD_SIZE": "0"}
    ),
    "rank_empty": train_case("", "RANK must be an integer, not ''", env=LAUNCH | {"RANK": ""}),
    "master_port_out_of_range": train_case(
        "", "MASTER_PORT must be a port number", env=LAUNCH | {"MASTER_PORT": "99999"}
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_a_setting_refused_with_one_line_and_nothing_written(
    name: str, checkpoint: bytes, tmp_path
):
    refuse_case(CASES[name], tmp_path, checkpoint)


def test_a_process_of_its_own_refuses_as_the_run_in_this_one(checkpoint: bytes, tmp_path_factory):
    """The cases run inside the test process; one case of each script, run as a user runs it, says
    the same."""
    names = [
        "train-config_file_value",
        "sample-top_p=0",
        "bench-beta2=1",
        "export-export_dir_is_a_file",
        "fineweb-out_dir=''",
    ]
    folders = [(tmp_path_factory.mktemp("inside"), tmp_path_factory.mktemp("own")) for _ in names]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        own = list(
            pool.map(lambda n, f: run_case(CASES[n], f[1], checkpoint, run_script), names, folders)
        )
    for name, (inside, own_folder), (result, before, after) in zip(
        names, folders, own, strict=True
    ):
        reference = run_case(CASES[name], inside, checkpoint)[0]
        said = (result.returncode, result.stderr.replace(str(own_folder), "{dir}"))
        assert said == (reference.returncode, reference.stderr.replace(str(inside), "{dir}")), name
        assert_one_line_error(result, *CASES[name].names)
        assert after == before


@pytest.mark.parametrize("name", PATHS)
def test_a_path_refused_with_one_line_and_nothing_written(name, checkpoints, tmp_path, monkeypatch):
    refuse_script_case(PATHS[name], checkpoints, tmp_path, monkeypatch)


@pytest.mark.parametrize("name", TORCHRUN_VARIABLES)
def test_torchrun_variables_refused_with_one_line_and_nothing_written(
    name, variants, tmp_path, monkeypatch
):
    refuse_run_case(TORCHRUN_VARIABLES[name], variants, tmp_path, monkeypatch)


def test_a_config_file_that_exits_or_is_interrupted_says_so_in_its_own_process(tmp_path):
    """As a user runs it: not exit status 3 in silence, nor a traceback."""
    for name, code in [
        ("exits.py", "import sys\nsys.exit(3)\n"),
        ("interrupted.py", "raise KeyboardInterrupt\n"),
    ]:
        (tmp_path / name).write_text(code)
        result = run_script("sample.py", str(tmp_path / name))
        assert result.returncode == 1
        assert_one_line_error(result, f"config file {tmp_path / name}, line")


@dataclass
class Limits:
    """A setting where inf means no limit, and one where it means nothing."""

    tolerance_pct: float = setting(
        5.0, "how much worse, in percent (inf: never fail)", min=0, inf=True
    )
    learning_rate: float = setting(1e-3, "a rate", min=0)


def test_inf_is_taken_where_it_means_no_limit_and_nan_nowhere():
    from configurator import configure

    run = lambda *flags: configure(list(flags), limits=Limits)  # noqa: E731
    assert run("--tolerance_pct=inf").tolerance_pct == float("inf")
    assert run("--tolerance_pct=1e999").tolerance_pct == float("inf")
    for flag, message in [
        (
            "--tolerance_pct=-inf",
            "tolerance_pct must be a finite number, or inf (no limit), not -inf",
        ),
        (
            "--tolerance_pct=nan",
            "tolerance_pct must be a finite number, or inf (no limit), not nan",
        ),
        ("--learning_rate=inf", "learning_rate must be a finite number, not inf"),
    ]:
        with pytest.raises(UserError, match=rf"^{re.escape(message)}$"):
            run(flag)


ENTRY_SCRIPTS = [
    "train.py",
    "bench.py",
    "sample.py",
    "export.py",
    "hellaswag.py",
    "lab/plot.py",
    "lab/generate.py",
    "lab/loader.py",
    "lab/prepare.py",
    "lab/time_to_loss.py",
    "lab/ttl_data.py",
    "lab/gpu_suite.py",
]


@pytest.mark.parametrize("script", ENTRY_SCRIPTS)
def test_every_entry_script_prints_its_usage_for_help(script, monkeypatch):
    """Each script imports and reads its command line: a name it imports that is gone is a failure
    here."""
    # as python puts a script's own folder first
    monkeypatch.syspath_prepend(str((ROOT / script).parent))
    result = run_in_process(script, "--help", cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "usage" in (result.stdout + result.stderr).lower()


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
    given = {
        "out_dir": "~/o",
        "file": "~",
        "out_json": "~/r.json",
        "export_dir": "~/e",
        "init_from": "~",
        "n": "~",
    }
    # each expanded value then checked
    cfg = configure([f"--{k}={v}" for k, v in given.items()], paths=Paths)
    assert cfg.as_dict() == {
        k: str(tmp_path) + v[1:] if k != "n" else "~" for k, v in given.items()
    }
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


def test_a_home_path_in_a_flag_is_expanded(tiny_data, tmp_path, monkeypatch):
    """--out_dir=~/out: no shell expands ~ inside a flag; the configurator does, in every path
    setting."""
    monkeypatch.setenv("HOME", str(tmp_path))
    result = run_train(tiny_data, "~/out", "--max_iters=1", "--eval_interval=1", "--eval_iters=1")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "ckpt.pt").is_file() and not (ROOT / "~").exists()


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"},
        LAUNCH,
        LAUNCH | {"WORLD_SIZE": "1", "RANK": "0"},
    ],
)
def test_torchrun_variables_that_are_accepted(environ):
    """None (one process), MASTER_ADDR and MASTER_PORT alone (some clusters set them for everyone:
    one process), or all of them consistent (a launch by torchrun, or by hand, which waits for its
    other ranks)."""
    assert torchrun_problem(environ) is None
    assert torchrun_rank(environ) == int(environ.get("RANK", 0))


def test_a_long_value_is_shown_by_its_start_and_its_end():
    """An error line names a long path by both ends, so its file name shows, and says its length."""
    from nanogpt_perf.errors import shown

    path = "/tmp/" + "deep/" * 30 + "notes.txt"
    line = shown(path)
    assert line.startswith(repr(path[:40]))
    assert line.endswith(f"notes.txt' ({len(path)} characters)")
    assert len(line) < 110 and shown("short") == "'short'"


def test_rivals_beside_a_model_gguf_cannot_hold_is_one_line():
    """llama.cpp reads a GGUF file, which has no architecture with qk_norm: one line naming both,
    not write_gguf's traceback."""
    pytest.importorskip("llama_cpp")
    shape = "--n_layer=1 --n_head=2 --n_embd=64 --block_size=64 --vocab_size=512 --qk_norm=True"
    flags = "--max_new_tokens=4 --uncached=False --rivals=True --device=cpu"
    result = run_in_process(G, *shape.split(), *flags.split())
    assert_one_line_error(result, "rivals=True", "qk_norm")
