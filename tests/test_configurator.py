import runpy
import subprocess
import sys
from typing import NamedTuple

import pytest

from configurator import apply_overrides, configure, configure_command, declared, settings_of
from conftest import ROOT
from nanogpt_perf.errors import UserError
from nanogpt_perf.rules import at_least, not_above, settings_problem, unruled
from nanogpt_perf.settings import SHARED_CROSS

DEFAULTS = {"max_iters": 100, "learning_rate": 6e-4, "compile": True, "out_dir": "out", "wandb_run_name": "gpt2"}


def test_settings_of_keeps_only_plain_public_values():
    import math

    namespace = {"a": 1, "b": 2.0, "c": "x", "d": False, "_private": 3, "math": math, "f": len, "l": [1]}
    assert settings_of(namespace) == {"a": 1, "b": 2.0, "c": "x", "d": False}


@pytest.mark.parametrize(
    "flag, key, expected",
    [
        ("--max_iters=1e5", "max_iters", 100000),
        ("--max_iters=250", "max_iters", 250),
        ("--learning_rate=1", "learning_rate", 1.0),
        ("--learning_rate=3e-4", "learning_rate", 3e-4),
        ("--compile=false", "compile", False),
        ("--compile=False", "compile", False),
        ("--compile=True", "compile", True),
        ("--compile=0", "compile", False),
        ("--out_dir=runs/a=b", "out_dir", "runs/a=b"),
        ("--wandb_run_name=123", "wandb_run_name", "123"),
    ],
)
def test_flags_convert_to_the_setting_type(flag, key, expected):
    value = apply_overrides(DEFAULTS, [flag])[key]
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize(
    "flag",
    [
        "--max_iters=1.5",
        "--max_iters=abc",
        "--learning_rate=fast",
        "--compile=maybe",
        "--compile=2",
        "--max_iters=True",
    ],
)
def test_lossy_or_wrong_values_are_refused(flag):
    with pytest.raises(UserError, match=flag[2:].split("=")[0]):
        apply_overrides(DEFAULTS, [flag])


def test_unknown_flag_suggests_the_closest_key():
    with pytest.raises(UserError, match="did you mean 'max_iters'"):
        apply_overrides(DEFAULTS, ["--max_iter=10"])


def test_flag_without_value_is_refused():
    with pytest.raises(UserError, match="no value"):
        apply_overrides(DEFAULTS, ["--compile"])


def test_config_file_then_flags_in_order(tmp_path):
    cfg = tmp_path / "cfg.py"
    cfg.write_text("import time\nmax_iters = 20\nlearning_rate = 1\nout_dir = 'a' + str(1)\n_helper = 3\n")
    settings = apply_overrides(DEFAULTS, [str(cfg), "--max_iters=30"])
    assert settings["max_iters"] == 30 and settings["learning_rate"] == 1.0 and settings["out_dir"] == "a1"
    assert apply_overrides(DEFAULTS, ["--max_iters=30", str(cfg)])["max_iters"] == 20


def test_unknown_key_in_config_file_names_the_file(tmp_path):
    cfg = tmp_path / "cfg.py"
    cfg.write_text("learnin_rate = 1e-3\n")
    with pytest.raises(UserError, match=r"cfg\.py; did you mean 'learning_rate'"):
        apply_overrides(DEFAULTS, [str(cfg)])


def test_wrong_type_in_config_file(tmp_path):
    cfg = tmp_path / "cfg.py"
    cfg.write_text("max_iters = '10'\n")
    with pytest.raises(UserError, match="max_iters must be int"):
        apply_overrides(DEFAULTS, [str(cfg)])


def test_missing_config_file():
    with pytest.raises(UserError, match="not found"):
        apply_overrides(DEFAULTS, ["config/does_not_exist.py"])


# the range checks (nanogpt_perf/rules.py), applied by configure() to the final values

SCRIPTS = [
    "train.py",
    "bench.py",
    "sample.py",
    "export.py",
    "benchmarks/generate.py",
    "benchmarks/loader.py",
    "scripts/soak.py",
    "scripts/preemption_check.py",
    "data/openwebtext/prepare.py",
    "data/fineweb/prepare.py",
]


class Captured(Exception):
    """What a script passes to configure()."""


class Script(NamedTuple):
    settings: dict
    rules: dict
    cross: tuple
    words: dict


def defaults_of(script: str, monkeypatch) -> Script:
    """A script's settings as it defines them (and the shared ones it takes), its rules, its rules between settings
    and the words its settings take besides values of their types, run up to its configure() call. train.py checks
    its rules between settings itself, once a resumed run's are merged: its CROSS."""
    import configurator

    def capture(namespace, argv=None, rules=None, cross=(), shared=None):
        settings, rules = declared(namespace, shared, rules)
        words = {k: rule.words for k, rule in rules.items() if hasattr(rule, "words")}
        if "CROSS" in namespace:  # train.py's, checked by its admission with the shared ones, once merged on resume
            cross = (*SHARED_CROSS, *namespace["CROSS"])
        raise Captured(Script(settings, rules, cross, words))

    monkeypatch.setattr(configurator, "configure", capture)
    monkeypatch.setattr(configurator, "configure_command", capture)
    with pytest.raises(Captured) as captured:
        runpy.run_path(str(ROOT / script), run_name="__main__")
    return captured.value.args[0]


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_default_is_valid_and_every_number_has_a_rule(script, monkeypatch):
    if not (ROOT / script).is_file():
        pytest.skip(f"{script} is not there")
    settings, rules, cross, _ = defaults_of(script, monkeypatch)
    assert settings and settings_problem(settings, rules, cross) is None
    assert unruled(settings, settings, rules) == []
    assert set(rules) <= set(settings)  # no rule for a setting the script does not have


@pytest.mark.parametrize("config", sorted(p.name for p in (ROOT / "config").glob("*.py")))
def test_every_config_is_valid(config, monkeypatch):
    defaults, rules, cross, words = defaults_of("train.py", monkeypatch)
    settings = apply_overrides(defaults, [str(ROOT / "config" / config)], words)
    assert settings_problem(settings, rules, cross) is None


@pytest.mark.parametrize(
    "script, settings, message",
    [
        ("bench.py", {"batch_size": 0}, "batch_size must be >= 1, not 0"),
        ("train.py", {"n_head": -2}, "n_head must be >= 1, not -2"),
        ("train.py", {"dropout": 1.0}, "dropout must be in [0, 1), not 1.0"),
        ("train.py", {"beta1": -0.1}, "beta1 must be in [0, 1), not -0.1"),
        ("sample.py", {"top_p": 0.0}, "top_p must be in (0, 1], not 0.0"),
        ("sample.py", {"top_p": 1.01}, "top_p must be in (0, 1], not 1.01"),
        ("sample.py", {"temperature": -0.5}, "temperature must be >= 0 (0 = greedy), not -0.5"),
        ("sample.py", {"top_k": -1}, "top_k must be >= 0 (0 = all), not -1"),
        ("train.py", {"weight_decay": -1e-3}, "weight_decay must be >= 0, not -0.001"),
        ("train.py", {"grad_clip": -1.0}, "grad_clip must be >= 0 (0 = off), not -1.0"),
        ("train.py", {"loss_chunk": -1}, "loss_chunk must be >= 0 (0 = unchunked), not -1"),
        ("train.py", {"prefetch": 0}, "prefetch must be >= 1 (batches built ahead), not 0"),
        ("train.py", {"log_interval": 0}, "log_interval must be >= 1, not 0"),
        ("train.py", {"save_interval": -1}, "save_interval must be >= 0 (0 = at evals only), not -1"),
        ("train.py", {"max_bad_steps": 0}, "max_bad_steps must be >= 1, not 0"),
        ("benchmarks/loader.py", {"batches": 100}, "batches must be > 100 (memory is read after 100), not 100"),
        (
            "benchmarks/loader.py",
            {"orders": "random,shuffled"},
            "orders must be a comma-separated list of random, epochs, not 'random,shuffled'",
        ),
        ("train.py", {"backend": "mpi"}, "backend must be one of auto, nccl, gloo, not 'mpi'"),
        ("train.py", {"compile_mode": "fast"}, "compile_mode must be one of default, reduce-overhead, max-autotune"),
        (
            "train.py",
            {"attention": "flash2"},
            "attention must be one of manual, sdpa, flash, efficient, cudnn, math, not 'flash2'",
        ),
        ("sample.py", {"dtype": "half"}, "dtype must be one of auto, float32, bfloat16, float16, not 'half'"),
        ("train.py", {"device": "tpu"}, "device must be one of auto, cpu"),
        ("train.py", {"device": "cuda:99"}, "not 'cuda:99'"),
        (
            "train.py",
            {"init_from": "gpt-3"},
            "init_from must be scratch, resume, gpt2, gpt2-medium, gpt2-large, gpt2-xl or a",
        ),
        ("train.py", {"out_dir": ""}, "out_dir must be a path, not ''"),
        ("train.py", {"n_embd": 30, "n_head": 4}, "n_embd=30 is not divisible by n_head=4"),
        (
            "train.py",
            {"decay_lr": True, "warmup_iters": 11, "lr_decay_iters": 10},
            "warmup_iters must be <= lr_decay_iters (10)",
        ),
        (
            "train.py",
            {"decay_lr": True, "min_lr": 1.0, "learning_rate": 0.1},
            "min_lr must be <= learning_rate (0.1)",
        ),
        (
            "benchmarks/loader.py",
            {"shard_tokens": 64, "block_size": 64},
            "shard_tokens must be > block_size (64), not 64",
        ),
    ],
)
def test_a_value_out_of_range_names_the_setting_and_the_range(script, settings, message, monkeypatch):
    defaults, rules, cross, _ = defaults_of(script, monkeypatch)
    assert message in settings_problem(defaults | settings, rules, cross)


def test_rules_between_settings_apply_only_where_they_matter(monkeypatch):
    train, bench = defaults_of("train.py", monkeypatch), defaults_of("bench.py", monkeypatch)
    check = lambda script, settings, cross=None: settings_problem(  # noqa: E731
        script.settings | settings, script.rules, script.cross if cross is None else cross
    )
    assert check(train, {"decay_lr": False, "warmup_iters": 11, "lr_decay_iters": 10, "min_lr": 1.0}) is None
    assert check(train, {"decay_lr": True, "warmup_iters": 10, "lr_decay_iters": 10}) is None
    assert check(bench, {"warmup_iters": 11, "lr_decay_iters": 10}) is None  # no decay_lr: not a schedule
    assert check(train, {"decay_lr": True, "warmup_iters": 11, "lr_decay_iters": 10}, cross=()) is None
    assert check(train, {"init_from": str(ROOT)}) is None  # an existing folder


def test_configure_checks_the_final_values_once(capsys):
    namespace = {"batch_size": 4, "decay_lr": True, "warmup_iters": 100, "lr_decay_iters": 1000, "init_from": "scratch"}
    rules = {k: at_least(1) for k in ("batch_size", "warmup_iters", "lr_decay_iters")}
    cross = [not_above("warmup_iters", "lr_decay_iters", "decay_lr")]
    run = lambda argv: configure(dict(namespace), argv, rules, cross)  # noqa: E731
    with pytest.raises(UserError, match=r"^batch_size must be >= 1, not 0$"):
        run(["--batch_size=8", "--batch_size=0"])
    with pytest.raises(UserError, match=r"^warmup_iters must be <= lr_decay_iters \(1000\)"):
        run(["--warmup_iters=2000"])
    assert run(["--warmup_iters=2000", "--lr_decay_iters=3000"])["warmup_iters"] == 2000
    # resumed: the base is the checkpoint's settings, which the script merges and checks itself (no cross here)
    assert configure(dict(namespace), ["--init_from=resume", "--lr_decay_iters=10"], rules)["lr_decay_iters"] == 10
    with pytest.raises(TypeError, match="no rule for the setting"):
        configure(dict(namespace), [], {})  # a number without a rule: a mistake of the script's, not the user's
    assert configure_command(dict(namespace), ["--batch_size=8", "--batch_size=9"], rules)[1] == {"batch_size"}
    with pytest.raises(UserError, match=r"^max_new_tokens must be >= 2 \(at least two\), not 1$"):
        configure(
            {"max_new_tokens": 500}, ["--max_new_tokens=1"], rules={"max_new_tokens": at_least(2, " (at least two)")}
        )
    assert "Traceback" not in capsys.readouterr().err


def test_the_configurator_imports_no_torch():
    """The data preparation scripts' spawned workers import it: they must not pay for torch."""
    code = "import sys, configurator; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0
