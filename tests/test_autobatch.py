"""batch_size='auto' and tokens_per_iter: the micro-batch chosen against a memory limit, the
accumulation that keeps the tokens of a step exact, and train.py running with them."""

import json

import pytest

from conftest import TINY_MODEL, assert_one_line_error, declarations, run_in_process, run_script
from nanogpt_perf.config import build
from nanogpt_perf.errors import UserError
from nanogpt_perf.train.autobatch import choose_micro_batch, divisors, step_shape

GiB = 2**30


def device(held: float, per_row: float, fits: float, grows: float = 0.0):
    """A fake device for choose_micro_batch: a step at micro-batch b holds `held` GiB of weights and
    optimizer state and peaks at held + per_row * b (+ grows * b * b: a peak that an extrapolation
    from a small b underestimates), and fits when that peak is at most `fits` GiB. The probe's calls
    are recorded."""
    tried = []

    def probe(b: int) -> tuple[int, int] | None:
        tried.append(b)
        peak = (held + per_row * b + grows * b * b) * GiB
        return (int(peak), int(held * GiB)) if peak <= fits * GiB else None

    return probe, tried


@pytest.mark.parametrize(
    "rows, held, per_row, fits, grows, chosen, tried",
    [
        # GPT-2's step on an 80 GB H100-like device: one probe, one check
        (480, 2, 0.63, 72, 0, 96, [4, 96]),
        # the peak grows faster than the probe says: 96 fails, 80 fits
        (480, 2, 0.63, 72, 0.002, 80, [4, 96, 80]),
        # not even the probe fits: the smaller divisors, one by one
        (480, 2, 0.63, 4, 0, 3, [4, 3]),
        (480, 2, 0.63, 1, 0, 0, [4, 3, 2, 1]),  # nothing fits
        # 7 sequences: 1 and 7 are the only micro-batches that keep them exact
        (7, 1, 1, 100, 0, 7, [1, 7]),
        # 60 = 8 ranks' share: the probe is the largest divisor <= 4, none above fits
        (60, 1, 1, 4.5, 0, 3, [4, 3]),
    ],
)
def test_the_largest_divisor_predicted_to_fit_then_checked(
    rows, held, per_row, fits, grows, chosen, tried
):
    probe, probed = device(held, per_row, fits, grows)
    budget = int(fits * GiB)
    assert choose_micro_batch(rows, budget, probe, lambda line: None) == chosen
    assert probed == tried
    assert chosen == 0 or rows % chosen == 0


def shape(given=(), world_size=1, fits_up_to=32, **settings):
    s = (
        dict(
            batch_size="auto",
            gradient_accumulation_steps=40,
            block_size=1024,
            tokens_per_iter=491520,
        )
        | settings
    )
    cfg = train_settings(given, **s)
    largest_that_fits = lambda rows: next((b for b in divisors(rows) if b <= fits_up_to), 0)
    return step_shape(cfg, world_size, largest_that_fits)


def train_settings(given, **values):
    """train.py's settings with values, as its command gave the settings named in given."""
    declared = declarations("train.py")
    return build(declared.parts, declared.defaults | values, given, (), declared.defaults)


def test_step_shape_keeps_the_tokens_of_a_step():
    assert shape() == (32, 15)
    assert shape(world_size=8) == (30, 16)  # 60 sequences a rank: 30 x 2 on each of 8 ranks
    assert shape(batch_size=12) == (12, 40)  # nanoGPT's split
    # unset: as nanoGPT, the accumulation as given
    assert shape(tokens_per_iter=0, batch_size=12) == (12, 40)
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
    result = train(
        out, "--batch_size=auto", "--tokens_per_iter=1024", "--max_iters=2", "--eval_interval=2"
    )
    assert result.returncode == 0, result.stderr
    assert "batch_size auto -> 8 (no memory limit to find on cpu" in result.stdout
    assert "tokens per iteration: 1,024 (4 micro-batches x 1 ranks x 8 x 32)" in result.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert (
        manifest["settings"]["batch_size"] == 8
        and manifest["settings"]["gradient_accumulation_steps"] == 4
    )
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
    from nanogpt_perf.runtime import resolve_runtime
    from nanogpt_perf.train.autobatch import probe_steps

    settings = declarations("train.py").config(
        n_layer=1, n_head=2, n_embd=16, block_size=16, compile=False, batch_size="auto",
        gradient_accumulation_steps=40, loss_impl="fused", activation_checkpointing=True,
    )  # fmt: skip
    peak, held = probe_steps(settings, 50, resolve_runtime("cpu", "float32"))(4)
    # a step ran (on a CPU the two are resident sets, not an allocator's figures)
    assert peak > 0 and held > 0
