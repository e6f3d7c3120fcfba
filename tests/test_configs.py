"""The GPT-2 configs (nanoGPT's train and eval configs, and the FineWeb variant) parse and point at
their web-scale dataset, which is never replaced by another when it is not prepared."""

from pathlib import Path

import pytest

from conftest import ROOT, assert_one_line_error, run_in_process

CONFIGS = {
    "train_gpt2.py": "openwebtext",
    "train_gpt2_fineweb.py": "fineweb",
    "eval_gpt2.py": "openwebtext",
    "eval_gpt2_medium.py": "openwebtext",
    "eval_gpt2_large.py": "openwebtext",
    "eval_gpt2_xl.py": "openwebtext",
}


@pytest.mark.parametrize("config, dataset", CONFIGS.items())
def test_a_gpt2_config_asks_for_its_unprepared_dataset(tmp_path: Path, config: str, dataset: str):
    (tmp_path / dataset).mkdir()
    (tmp_path / dataset / "prepare.py").write_text("raise SystemExit('must not run unasked')\n")
    result = run_in_process(
        "train.py",
        str(ROOT / "config" / config),
        f"--data_dir={tmp_path}",
        "--device=cpu",
        f"--out_dir={tmp_path / 'out'}",
    )
    assert_one_line_error(
        result, f"dataset {dataset} is not prepared", "prepare.py", "GB of shards"
    )
    assert not (tmp_path / "out").exists()
