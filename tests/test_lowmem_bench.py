"""bench.py's memory figures: the training state's bytes per parameter by part, measured beside the formats'
arithmetic, and the search for the largest model of a family whose step fits a budget (tiny shapes)."""

import json

import pytest
import torch

from conftest import TINY_MODEL, declarations, run_script
from nanogpt_perf.bench.cases import Case
from nanogpt_perf.bench.fit import family, largest_model, parameters
from nanogpt_perf.bench.measure import result, run_case
from nanogpt_perf.data.loader import SyntheticBatches

SHAPE = dict(n_layer=2, n_head=2, n_embd=64, block_size=32, batch_size=2, compile=False, device="cpu")


def case(**changes) -> Case:
    return Case("tiny", declarations("bench.py").config(**SHAPE | dict(vocab_size=64) | changes))


@pytest.mark.parametrize(
    "savers, optimizer, slack",
    [
        ({}, 8.0, 0.01),  # the step counters
        (dict(weights_dtype="bfloat16"), 4.0, 0.01),
        (dict(weights_dtype="bfloat16", state_bits=8), 2.0, 0.5),  # scales, maps, and n_embd=64's vectors plain
    ],
)
def test_the_state_by_part_is_measured_beside_its_arithmetic(savers, optimizer, slack, monkeypatch):
    """One step's state counted from its storages: weights and gradients exactly the arithmetic's; the optimizer's
    the arithmetic's plus its step counters (and 8-bit scales, maps and small tensors kept plain); the rest of the
    step's peak is activations and workspace (the peak against the state itself: in a fresh process, below)."""
    monkeypatch.setattr(torch, "compile", lambda fn=None, **kwargs: fn)  # torchao's step eagerly: the same bytes
    batches = lambda B, T, dev: SyntheticBatches(B, T, 64, dev, 0)  # noqa: E731
    row = run_case(case(**savers), device="cpu", batches=batches, steps=1, burn_in=1)
    assert row["status"] == "ok", row["reason"]
    measured, arithmetic = row["memory"], row["memory_arithmetic"]
    weight = 2.0 if savers else 4.0
    assert measured["weights"] == arithmetic["weights"] == weight
    assert measured["grads"] == arithmetic["grads"] == weight
    assert arithmetic["optimizer"] == optimizer < measured["optimizer"] < optimizer + slack
    assert measured["activations"] == pytest.approx(measured["peak"] - measured["state"])


def test_a_family_keeps_its_aspect_and_head_size():
    tiny = case()
    for n_layer in (1, 3, 8):
        member = family(tiny, n_layer).settings
        assert member.n_layer == n_layer and member.n_embd == 32 * n_layer and member.n_head == n_layer
    assert parameters(family(tiny, 2)) == 12 * 2 * 64**2 + (64 + 32) * 64


def test_the_search_finds_the_largest_that_fits_and_builds_none_whose_state_cannot():
    """A stand-in measurement whose step peak is 20 bytes per parameter: the answer is the largest family member
    under the budget, its successor over it, and a member whose state alone is over the budget never measured."""
    measured = []

    def measure(member: Case) -> dict:
        measured.append(member.settings.n_layer)
        return result(member, "ok", memory={"step_peak_bytes": 20 * parameters(member)})

    tiny = case()
    budget = 20 * parameters(family(tiny, 9)) + 1
    largest, rows = largest_model(tiny, budget, measure)
    assert largest == 9 and 20 * parameters(family(tiny, 10)) > budget
    skipped = [r["settings"]["n_layer"] for r in rows if r["status"] == "skipped"]
    assert skipped and all(16 * parameters(family(tiny, n)) > budget for n in skipped)  # float32 AdamW: 16 B
    assert all(16 * parameters(family(tiny, n)) <= budget for n in measured)


def test_bench_py_finds_the_largest_that_fits_a_budget(tmp_path):
    """The budget stands well above a CPU process's resident set before any model (torch and its imports, 0.3-0.5
    GB). Each size is measured in a fresh process: in one process a size after a larger one measured its peak over
    pages the larger had left, and came out below its own state."""
    out = tmp_path / "fit.json"
    flags = (*TINY_MODEL, "--n_embd=64", "--device=cpu", "--vocab_size=64", f"--out_json={out}")
    result = run_script("bench.py", *flags, "--fit_memory_gb=0.8", "--batch_size=2")
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("largest that fits 0.8 GB"))
    rows = json.loads(out.read_text())["results"]
    assert "n_layer=" in line, result.stdout
    peaks = {r["settings"]["n_layer"]: r["memory"]["step_peak_bytes"] for r in rows if r["status"] == "ok"}
    largest = int(line.split("n_layer=")[1].split(",")[0])
    assert peaks[largest] <= 0.8e9 and all(p > 0.8e9 for n, p in peaks.items() if n > largest), result.stdout
    measured = [r["memory"] for r in rows if r["status"] == "ok"]
    assert len(measured) >= 4 and all(m["peak"] >= m["state"] for m in measured), result.stdout
