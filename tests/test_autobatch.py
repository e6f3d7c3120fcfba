"""batch_size='auto' and tokens_per_iter: the micro-batch chosen against a memory limit, the accumulation that keeps
the tokens of a step exact, and train.py running with them."""

import json

import pytest

from conftest import TINY_MODEL, assert_one_line_error, run_in_process, run_script
from nanogpt_perf.bench.autobatch import auto_micro_batch, step_shape
from nanogpt_perf.errors import UserError


def probed(rows: int, limit: int) -> tuple[int, list[int]]:
    """auto_micro_batch against a device where micro-batches up to limit fit, and the sizes it tried."""
    tried = []
    chosen = auto_micro_batch(rows, lambda b: tried.append(b) or b <= limit)
    return chosen, tried


@pytest.mark.parametrize(
    "rows, limit, chosen, tried",
    [
        (480, 40, 32, [256, 128, 64, 32]),  # GPT-2's step on one H100-like device: 32 x 15
        (480, 70, 60, [256, 128, 64]),  # 64 fits but does not divide 480: 60 x 8
        (60, 1000, 30, [32]),  # 8 ranks: 60 sequences each, 32 fits, 30 divides
        (7, 3, 1, [4, 2]),  # 2 fits, but only 1 divides 7
        (480, 0, 0, [256, 128, 64, 32, 16, 8, 4, 2, 1]),  # nothing fits
    ],
)
def test_the_largest_power_of_two_that_fits_then_the_largest_divisor(rows, limit, chosen, tried):
    assert probed(rows, limit) == (chosen, tried)


def shape(given=(), world_size=1, fits_up_to=32, **settings):
    s = dict(batch_size="auto", gradient_accumulation_steps=40, block_size=1024, tokens_per_iter=491520) | settings
    return step_shape(s, set(given), world_size, lambda rows: auto_micro_batch(rows, lambda b: b <= fits_up_to))


def test_step_shape_keeps_the_tokens_of_a_step():
    assert shape() == (32, 15)
    assert shape(world_size=8) == (30, 16)  # 60 sequences a rank: 30 x 2 on each of 8 ranks
    assert shape(batch_size=12) == (12, 40)  # nanoGPT's split
    assert shape(tokens_per_iter=0, batch_size=12) == (12, 40)  # unset: as nanoGPT, the accumulation as given
    assert shape(tokens_per_iter=524288, fits_up_to=100) == (64, 8)


@pytest.mark.parametrize(
    "settings, given, message",
    [
        (dict(tokens_per_iter=0), (), "batch_size='auto' needs tokens_per_iter"),
        (dict(), ("gradient_accumulation_steps",), "give one of the two"),
        (dict(tokens_per_iter=1000), (), "not a whole number of 1024-token sequences"),
        (dict(batch_size=7), (), "not a whole number of micro-batches of batch_size=7"),
        (dict(fits_up_to=0), (), "not even 1 sequence"),
    ],
)
def test_step_shapes_that_do_not_add_up_are_refused(settings, given, message):
    with pytest.raises(UserError, match=message):
        shape(given, **settings)


def test_train_py_chooses_the_micro_batch_and_derives_the_accumulation(tiny_data, tmp_path):
    model = [f for f in TINY_MODEL if not f.startswith("--gradient_accumulation_steps")]
    train = lambda out, *flags: run_script(  # noqa: E731
        "train.py", *model, f"--data_dir={tiny_data}", "--dataset=tiny", f"--out_dir={out}", *flags
    )
    out = tmp_path / "out"
    # 1024 tokens a step = 32 sequences of 32 tokens: on a CPU 8 x 4
    result = train(out, "--batch_size=auto", "--tokens_per_iter=1024", "--max_iters=2", "--eval_interval=2")
    assert result.returncode == 0, result.stderr
    assert "batch_size auto -> 8 (no memory limit to find on cpu" in result.stdout
    assert "tokens per iteration: 1,024 (4 micro-batches x 1 ranks x 8 x 32)" in result.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["settings"]["batch_size"] == 8 and manifest["settings"]["gradient_accumulation_steps"] == 4
    refused = run_in_process(
        "train.py",
        *model,
        f"--data_dir={tiny_data}",
        "--dataset=tiny",
        f"--out_dir={tmp_path / 'other'}",
        "--batch_size=auto",
    )
    assert_one_line_error(refused, "batch_size='auto' needs tokens_per_iter")
    assert not (tmp_path / "other").exists()


def test_a_probe_runs_one_step_of_the_settings_as_set():
    import nanogpt_perf.settings as shared
    from nanogpt_perf.bench.autobatch import step_fits
    from nanogpt_perf.runtime import resolve_runtime

    settings = {k: getattr(shared, k) for k in shared.__all__ if k != "model_config"}
    settings |= dict(n_layer=1, n_head=2, n_embd=16, block_size=16, compile=False, batch_size="auto")
    settings |= dict(gradient_accumulation_steps=40, loss_impl="fused", activation_checkpointing=True)
    lines = []
    assert step_fits(settings, 50, resolve_runtime("cpu", "float32"), lines.append)(4)
    assert lines == ["batch_size auto: 4 fits"]
