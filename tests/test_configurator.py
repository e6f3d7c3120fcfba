"""Settings: flags and config files convert to each setting's type only where nothing is lost, every
value is checked against its declaration once, and every script's declarations are whole (each
number bounded, each default valid)."""

import copy
import pickle
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from configurator import configure, read_overrides, sweep_values
from conftest import ROOT, declarations
from nanogpt_perf.config import build, declared, flat_defaults, setting
from nanogpt_perf.errors import UserError, one_line


@dataclass
class Demo:
    """Settings of a demo"""

    max_iters: int = setting(100, "steps", min=0)
    learning_rate: float = setting(6e-4, "peak", min=0)
    compile: bool = setting(True, "compile")
    out_dir: str = setting("out", "where")
    wandb_run_name: str = setting("gpt2", "a name")
    seed: int = setting(1337, "seed", min=0)


DEFAULTS = flat_defaults({"demo": Demo})


def overrides(argv: list[str]) -> dict:
    return DEFAULTS | read_overrides(DEFAULTS, {}, argv)


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
        # past float's exact integers: read exactly
        ("--seed=9007199254740993.0", "seed", 9007199254740993),
        ("--seed=1e20", "seed", 10**20),
        ("--seed=0x10", "seed", 16),
        ("--seed=1_000", "seed", 1000),
        ("--learning_rate=1_0.5", "learning_rate", 10.5),
    ],
)
def test_flags_convert_to_the_setting_type(flag, key, expected):
    value = overrides([flag])[key]
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize(
    "flag",
    ["--max_iters=1.5", "--max_iters=abc", "--learning_rate=fast", "--compile=maybe", "--compile=2",
     "--max_iters=True", "--seed=9007199254740993.5", "--seed=(1e20)", "--seed=-(1e20)",
     "--seed=1e999999999", "--seed=inf", "--seed=sNaN", "--learning_rate=0x1p3",
     "--seed=0.99999999999999999", "--seed=1e-400",
     "--seed=2.0000000000000001", "--seed=1e4300", "--nonexistent"],
)  # fmt: skip
def test_lossy_or_wrong_values_are_refused(flag):
    with pytest.raises(UserError, match=flag[2:].split("=")[0]):
        overrides([flag])


def test_a_config_files_float_past_exact_integers_is_refused_for_an_int(tmp_path):
    """9007199254740993.0 in a config file is a float already, 2**53 + 1 rounded away: nothing can
    say what was meant, so an int setting refuses it rather than take 2**53."""
    cfg = tmp_path / "cfg.py"
    cfg.write_text("seed = 9007199254740993.0\n")
    with pytest.raises(UserError, match="seed must be int"):
        overrides([str(cfg)])


def test_unknown_flag_suggests_the_closest_key():
    with pytest.raises(UserError, match="did you mean 'max_iters'"):
        overrides(["--max_iter=10"])


def test_flag_without_value_is_refused():
    with pytest.raises(UserError, match="no value"):
        overrides(["--compile"])


def test_config_file_then_flags_in_order(tmp_path):
    cfg = tmp_path / "cfg.py"
    cfg.write_text(
        "import time\nmax_iters = 20\nlearning_rate = 1\nout_dir = 'a' + str(1)\n_helper = 3\n"
    )
    settings = overrides([str(cfg), "--max_iters=30"])
    assert (
        settings["max_iters"] == 30
        and settings["learning_rate"] == 1.0
        and settings["out_dir"] == "a1"
    )
    assert overrides(["--max_iters=30", str(cfg)])["max_iters"] == 20


def test_a_config_files_imports_functions_and_classes_are_not_settings(tmp_path):
    """configurator.py says imports and helpers in a config file are ignored: `from math import pi`
    binds a float."""
    cfg = tmp_path / "cfg.py"
    cfg.write_text(
        "from math import pi, e as euler\nimport os.path\n\ndef half(x):\n    return x / 2\n\n"
        "class Helper:\n    pass\n\nlearning_rate = half(pi) / 1000\n"
    )
    assert overrides([str(cfg)])["learning_rate"] == pytest.approx(1.5707963e-3)


def test_unknown_key_in_config_file_names_the_file(tmp_path):
    cfg = tmp_path / "cfg.py"
    cfg.write_text("learnin_rate = 1e-3\n")
    with pytest.raises(UserError, match=r"cfg\.py; did you mean 'learning_rate'"):
        overrides([str(cfg)])


def test_wrong_type_in_config_file(tmp_path):
    cfg = tmp_path / "cfg.py"
    cfg.write_text("max_iters = '10'\n")
    with pytest.raises(UserError, match="max_iters must be int"):
        overrides([str(cfg)])


def test_a_config_file_sets_what_it_assigns_in_an_if_or_a_try_not_in_a_function(tmp_path):
    """As nanoGPT's exec of it would: a setting assigned inside a block counts (it once went unseen,
    silently)."""
    cfg = tmp_path / "cfg.py"
    cfg.write_text("if True:\n    max_iters = 7\ntry:\n    seed = 3\nexcept Exception:\n    pass\n"
                   "def f():\n    learning_rate = 5.0\nf()\n")  # fmt: skip
    values = overrides([str(cfg)])
    assert (values["max_iters"], values["seed"], values["learning_rate"]) == (7, 3, 6e-4)


BOUND = {  # each way Python binds a name, as a config file might set max_iters (default 100)
    "globals": ('globals()["max_iters"] = 0', 0),
    "for": ("for max_iters in range(3):\n    pass", 2),
    "exec": ('exec("max_iters = 0")', 0),
    "augmented": ("max_iters = 5\nmax_iters += 1", 6),
    "walrus": ("(max_iters := 4)", 4),
    "walrus_in_a_comprehension": ("[max_iters := n for n in range(3)]", 2),
    "unpacking": ("max_iters, (seed, _) = 1, (2, 3)", 1),
    "with": ("import contextlib\nwith contextlib.nullcontext(7) as max_iters:\n    pass", 7),
    "match": ("match 8:\n    case max_iters:\n        pass", 8),
    "global_in_a_function": ("def f():\n    global max_iters\n    max_iters = 9\nf()", 9),
    "if": ("if 1 > 2:\n    max_iters = 0\nelse:\n    max_iters = 3", 3),
    "if_not_taken": ("if False:\n    max_iters = 0", 100),
    "del": ("max_iters = 0\ndel max_iters", 100),
    "a_comprehensions_own": ("[max_iters for max_iters in range(3)]", 100),
    "annotation_only": ("max_iters: int", 100),
}


@pytest.mark.parametrize("code, expected", BOUND.values(), ids=BOUND)
def test_a_config_file_sets_what_it_leaves_bound_however_it_binds_it(code, expected, tmp_path):
    """As nanoGPT's exec of it would: globals()[...], for and exec() once went unseen, silently."""
    cfg = tmp_path / "cfg.py"
    cfg.write_text(code + "\n")
    assert overrides([str(cfg)])["max_iters"] == expected


REFUSED = {  # a binding that cannot be a setting: one line naming it, never ignored
    "augmented_unbound": ("max_iters += 1", "line 1: NameError: name 'max_iters' is not defined; "),
    "import_as": ("import os as max_iters", "max_iters must be int (default 100), got a module"),
    "from_import_as": ("from math import pi as max_iters", "max_iters must be int (default 100)"),
    "def": ("def max_iters():\n    return 0", "max_iters must be int (default 100), got a func"),
    "class": ("class max_iters:\n    pass", "max_iters must be int (default 100), got a type"),
    "lambda": ("seed = lambda: 0", "seed must be int (default 1337), got a function"),
    "for_misspelt": ("for max_iter in [0]:\n    pass", "unknown setting 'max_iter' in "),
    "for_a_helper": ("for i in range(3):\n    pass", "the settings (a config file's own names"),
    "hostile_class": ("class X:\n    __class__ = property(lambda s: 1 / 0)\nx = X()", "'x' in "),
    "globals_misspelt": ('globals()["max_iter"] = 0', "did you mean 'max_iters'"),
    "globals_not_a_name": ("globals()[1] = 2", "cfg.py binds 1 in its globals(), which is no name"),
}


@pytest.mark.parametrize("code, message", REFUSED.values(), ids=REFUSED)
def test_a_config_file_binding_that_is_no_setting_is_one_line(code, message, tmp_path):
    cfg = tmp_path / "cfg.py"
    cfg.write_text(code + "\n")
    with pytest.raises(UserError) as refused:
        overrides([str(cfg)])
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_config_files_helpers_are_no_settings_however_bound(tmp_path):
    """What its imports bind (from math import *), its functions, classes and modules, and names
    starting with _: none is a setting, so none is refused as an unknown one."""
    cfg = tmp_path / "cfg.py"
    cfg.write_text(
        "from math import *\nfrom functools import partial\nimport os.path as osp\n"
        "half = lambda x: x / 2\nthird = partial(lambda x, d: x / d, d=3)\n"
        "for _i in range(2):\n    pass\nlearning_rate = half(pi) / 1000\n"
    )
    assert overrides([str(cfg)])["learning_rate"] == pytest.approx(1.5707963e-3)


def test_a_config_copies_and_pickles_whole():
    cfg = build({"demo": Demo}, DEFAULTS).replace(seed=7)
    for twin in (copy.deepcopy(cfg), pickle.loads(pickle.dumps(cfg))):
        assert twin.as_dict() == cfg.as_dict() and twin.demo == cfg.demo and twin.seed == 7


def test_an_error_line_stays_one_line_whatever_a_name_in_it_holds(capsys):
    one_line(UserError, UserError("config file a\nerror: b.py not found"), None)
    assert capsys.readouterr().err == "error: config file a\\nerror: b.py not found\n"


def test_missing_config_file():
    with pytest.raises(UserError, match="not found"):
        overrides(["config/does_not_exist.py"])


# every script's declarations, as it hands them to configure()

SCRIPTS = [
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
    "data/openwebtext/prepare.py",
    "data/fineweb/prepare.py",
]


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_default_is_valid_and_every_number_is_bounded(script):
    declared = declarations(script)
    assert declared.defaults and declared.config() is not None
    for name, default in declared.defaults.items():
        meta = declared.config().metadata(name)
        # a number a user could make endless, or absurd, has a bound
        if type(default) in (int, float):
            rules = ("min", "max", "above", "interval", "choices", "check")
            # choices=() bounds nothing
            assert any(meta.get(rule) not in (None, ()) for rule in rules), name


@pytest.mark.parametrize("config", sorted(p.name for p in (ROOT / "config").glob("*.py")))
def test_every_config_is_valid(config):
    train = declarations("train.py")
    words = {
        k: f.metadata.get("words", ())
        for part in train.parts.values()
        for k, f in declared(part).items()
    }
    values = read_overrides(train.defaults, words, [str(ROOT / "config" / config)])
    assert train.config(**values) is not None


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
        (
            "train.py",
            {"save_interval": -1},
            "save_interval must be >= 0 (0 = at evals only), not -1",
        ),
        ("train.py", {"max_bad_steps": 0}, "max_bad_steps must be >= 1, not 0"),
        ("train.py", {"muon_ns_steps": 10**9}, "muon_ns_steps must be <= 100, not 1000000000"),
        (
            "lab/loader.py",
            {"batches": 100},
            "batches must be > 100 (memory is read after 100), not 100",
        ),
        (
            "lab/loader.py",
            {"orders": "random,shuffled"},
            "orders must be a comma-separated list of random, epochs, not 'random,shuffled'",
        ),
        ("train.py", {"backend": "mpi"}, "backend must be one of auto, nccl, gloo, not 'mpi'"),
        (
            "train.py",
            {"compile_mode": "fast"},
            "compile_mode must be one of default, reduce-overhead, max-autotune",
        ),
        (
            "train.py",
            {"attention": "flash2"},
            "attention must be one of manual, sdpa, flash, efficient, cudnn, math, not 'flash2'",
        ),
        (
            "sample.py",
            {"dtype": "half"},
            "dtype must be one of auto, float32, bfloat16, float16, not 'half'",
        ),
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
            "train.py",
            {"optimizer": "muon", "learning_rate": 0.0, "min_lr": 0.0},
            "learning_rate must be > 0",
        ),
        (
            "lab/loader.py",
            {"shard_tokens": 64, "block_size": 64},
            "shard_tokens must be > block_size (64), not 64",
        ),
    ],
)
def test_a_value_out_of_range_names_the_setting_and_the_range(script, settings, message):
    declared = declarations(script)
    with pytest.raises(UserError) as refused:
        declared.config(**settings)
    assert message in str(refused.value)


def test_rules_between_settings_apply_only_where_they_matter():
    train, bench = declarations("train.py"), declarations("bench.py")
    assert train.config(decay_lr=False, warmup_iters=11, lr_decay_iters=10, min_lr=1.0) is not None
    assert train.config(decay_lr=True, warmup_iters=10, lr_decay_iters=10) is not None
    assert bench.config(warmup_iters=11, lr_decay_iters=10) is not None  # bench.py runs no schedule
    assert (
        train._replace(cross=()).config(decay_lr=True, warmup_iters=11, lr_decay_iters=10)
        is not None
    )
    assert train.config(init_from=str(ROOT)) is not None  # an existing folder


def test_configure_checks_the_final_values_once_and_says_what_was_given(capsys):
    @dataclass
    class Run:
        """Settings of a run"""

        batch_size: int = setting(4, "rows", min=1)
        warmup_iters: int = setting(100, "warmup", min=1)
        lr_decay_iters: int = setting(1000, "decay", min=1)
        max_new_tokens: int = setting(500, "tokens", min=2, note=" (at least two)")

    def warmup_first(cfg):
        if cfg.warmup_iters > cfg.lr_decay_iters:
            raise ValueError(f"warmup_iters must be <= lr_decay_iters ({cfg.lr_decay_iters})")

    run = lambda argv, cross=(warmup_first,): configure(argv, cross, run=Run)  # noqa: E731
    with pytest.raises(UserError, match=r"^batch_size must be >= 1, not 0$"):
        run(["--batch_size=8", "--batch_size=0"])
    with pytest.raises(UserError, match=r"^warmup_iters must be <= lr_decay_iters \(1000\)"):
        run(["--warmup_iters=2000"])
    cfg = run(["--warmup_iters=2000", "--lr_decay_iters=3000"])
    assert (
        cfg.warmup_iters == 2000
        and cfg.run.lr_decay_iters == 3000
        and cfg.given == {"warmup_iters", "lr_decay_iters"}
    )
    assert run(["--batch_size=8", "--batch_size=9"]).given == {"batch_size"}
    with pytest.raises(UserError, match=r"^max_new_tokens must be >= 2 \(at least two\), not 1$"):
        run(["--max_new_tokens=1"])
    with pytest.raises(UserError, match="batch_size must be >= 1, not 0"):
        cfg.replace(batch_size=0)  # a changed copy is checked as a flag is
    with pytest.raises(AttributeError, match="read-only"):
        cfg.batch_size = 3
    assert "overridden: warmup_iters=2000, lr_decay_iters=3000" in capsys.readouterr().out


def test_a_setting_declared_twice_is_a_mistake_of_the_code():
    @dataclass
    class Other:
        """Another part"""

        seed: int = setting(1, "again", min=0)

    with pytest.raises(TypeError, match="seed is declared twice"):
        flat_defaults({"demo": Demo, "other": Other})


def test_sweep_values_are_read_converted_and_checked_as_flags():
    cfg = build({"demo": Demo}, DEFAULTS)
    assert sweep_values(cfg, "max_iters=1, 2,4e1") == ("max_iters", [1, 2, 40])
    assert sweep_values(cfg, "compile=true,false") == ("compile", [True, False])
    for text, message in [
        ("max_iter=1,2", "did you mean 'max_iters'"),
        ("max_iters=", "sweep must be KEY=V1,V2"),
        ("max_iters", "sweep must be KEY=V1,V2"),
        ("max_iters=1,-1", "max_iters must be >= 0, not -1"),
        ("max_iters=1.5", "max_iters must be int"),
        ("out_dir=a,b", "cannot sweep out_dir"),
    ]:
        with pytest.raises(UserError, match=message):
            sweep_values(cfg, text, fixed=("out_dir",))


@pytest.mark.parametrize("script", ["train.py", "bench.py", "sample.py"])
def test_help_lists_every_setting_and_survives_a_closed_pipe(script):
    """--help is built from the declarations (a setting reassigned below keeps its text:
    tokens_per_iter), and `python train.py --help | head -1` ends quietly, with no BrokenPipeError
    traceback."""
    full = subprocess.run(
        [sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True
    )
    assert full.returncode == 0 and "Traceback" not in full.stderr
    if script == "train.py":
        assert "--tokens_per_iter" in full.stdout and "tokens per optimizer step" in full.stdout
        assert (
            "--muon_ns_steps" in full.stdout
            and "--n_layer" in full.stdout
            and "(model.GPTConfig)" in full.stdout
        )
        said = {
            line.split()[0]: line for line in full.stdout.splitlines() if line.startswith("  --")
        }
        assert said["--eval_iters"].endswith("[>= 1, <= 1,000,000]") and said["--dropout"].endswith(
            "[in [0, 1)]"
        )
        # its bounds
        assert said["--grad_clip"].endswith("[>= 0 (0 = off)]") and "[" not in said["--compile"]
    piped = subprocess.run(
        f"{sys.executable} {script} --help | head -1",
        shell=True,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert piped.stdout.startswith("usage:") and piped.stderr == "", piped.stderr


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_help_to_a_full_disk_is_one_error_line():
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [sys.executable, "sample.py", "--help"],
            cwd=ROOT,
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
        )
    assert (
        result.returncode == 1
        and result.stderr == "error: cannot print the help: No space left on device\n"
    )


def test_the_configurator_imports_no_torch():
    """The data preparation scripts' spawned workers import it: they must not pay for torch."""
    code = "import sys, configurator, nanogpt_perf.config; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


# a number that multiplies the work of a step, an eval, a row or a run, which shows nothing until it
# ends: bounded
BOUNDED = [
    ("train.py", "gradient_accumulation_steps", 10_000),
    ("train.py", "tokens_per_iter", 2**30),
    ("train.py", "eval_iters", 1_000_000),
    ("train.py", "muon_ns_steps", 100),
    ("bench.py", "gradient_accumulation_steps", 10_000),
    ("bench.py", "burn_in", 1_000),
    ("bench.py", "steps", 100_000),
    ("sample.py", "max_new_tokens", 1_000_000),
    ("lab/generate.py", "max_new_tokens", 1_000_000),
    ("lab/generate.py", "repeats", 1_000),
    ("lab/generate.py", "prompts", 8),
    ("lab/loader.py", "batches", 10_000_000),
    ("lab/loader.py", "repeats", 1_000),
    ("lab/prepare.py", "repeats", 1_000),
    ("lab/time_to_loss.py", "seeds", 1_000),
    ("lab/time_to_loss.py", "eval_iters", 1_000_000),
]


@pytest.mark.parametrize("script, name, most", BOUNDED, ids=[f"{s}:{n}" for s, n, _ in BOUNDED])
def test_a_number_that_multiplies_unseen_work_has_a_bound(script, name, most, capsys):
    found = declarations(script)

    def configured(value: int):
        return configure([f"--{name}={value}"], found.cross, found.defaults, **found.parts)

    assert getattr(configured(most), name) == most
    with pytest.raises(UserError, match=rf"^{name} must be <= {most}, not {most + 1}$"):
        configured(most + 1)
