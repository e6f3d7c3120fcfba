import pytest

from configurator import ConfigError, apply_overrides, settings_of

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
    with pytest.raises(ConfigError, match=flag[2:].split("=")[0]):
        apply_overrides(DEFAULTS, [flag])


def test_unknown_flag_suggests_the_closest_key():
    with pytest.raises(ConfigError, match="did you mean 'max_iters'"):
        apply_overrides(DEFAULTS, ["--max_iter=10"])


def test_flag_without_value_is_refused():
    with pytest.raises(ConfigError, match="no value"):
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
    with pytest.raises(ConfigError, match=r"cfg\.py; did you mean 'learning_rate'"):
        apply_overrides(DEFAULTS, [str(cfg)])


def test_wrong_type_in_config_file(tmp_path):
    cfg = tmp_path / "cfg.py"
    cfg.write_text("max_iters = '10'\n")
    with pytest.raises(ConfigError, match="max_iters must be int"):
        apply_overrides(DEFAULTS, [str(cfg)])


def test_missing_config_file():
    with pytest.raises(ConfigError, match="not found"):
        apply_overrides(DEFAULTS, ["config/does_not_exist.py"])
