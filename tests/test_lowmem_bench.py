"""bench.py's memory figures: the training state's bytes per parameter by part, measured beside the
formats' arithmetic, and the search for the largest model of a family whose step fits a budget (tiny
shapes)."""

import json

import pytest
import torch

from conftest import (
    ROOT,
    TINY_MODEL,
    assert_one_line_error,
    declarations,
    run_in_process,
    run_script,
)
from lab.bench_cases import Case, most_tries
from lab.bench_fit import family, largest_model, most_layers, parameters
from lab.bench_measure import result, run_case
from lab.bench_report import MEMORY_PARTS
from nanogpt_perf.config import declared
from nanogpt_perf.data.loader import SyntheticBatches
from nanogpt_perf.runtime import host_memory_bytes

SHAPE = dict(
    n_layer=2, n_head=2, n_embd=64, block_size=32, batch_size=2, compile=False, device="cpu"
)
SETTINGS = [f"--{k}={v}" for k, v in SHAPE.items()] + ["--vocab_size=64"]


def case(**changes) -> Case:
    return Case("tiny", declarations("bench.py").config(**SHAPE | dict(vocab_size=64) | changes))


@pytest.mark.parametrize(
    "savers, optimizer, slack",
    [
        ({}, 8.0, 0.01),  # the step counters
        (dict(weights_dtype="bfloat16"), 4.0, 0.01),
        # scales, maps, and n_embd=64's vectors plain
        (dict(weights_dtype="bfloat16", state_bits=8), 2.0, 0.5),
    ],
)
def test_the_state_by_part_is_measured_beside_its_arithmetic(savers, optimizer, slack, monkeypatch):
    """One step's state counted from its storages: weights and gradients exactly the arithmetic's;
    the optimizer's the arithmetic's plus its step counters (and 8-bit scales, maps and small
    tensors kept plain); the rest of the step's peak is activations and workspace (the peak against
    the state itself: in a fresh process, below)."""
    # torchao's step eagerly: the same bytes
    monkeypatch.setattr(torch, "compile", lambda fn=None, **kwargs: fn)
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
        assert (
            member.n_layer == n_layer and member.n_embd == 32 * n_layer and member.n_head == n_layer
        )
    assert parameters(family(tiny, 2)) == 12 * 2 * 64**2 + (64 + 32) * 64


def test_the_search_says_its_bound_first_then_each_size_and_finds_the_largest_that_fits():
    """A stand-in measurement whose process peak is 20 bytes per parameter: the answer is the
    largest family member under the budget, its successor over it. Before the first size the search
    says how many it tries at most (none whose state alone is over the budget), then a line for
    each size as it ends."""
    measured, said = [], []

    def measure(member: Case) -> dict:
        measured.append(member.settings.n_layer)
        assert len(said) == len(measured), "a size's line comes before the next size is built"
        memory = {"process_peak_bytes": 20 * parameters(member), "peak": 20.0}
        return result(member, "ok", memory=memory)

    tiny = case()
    budget = 20 * parameters(family(tiny, 9)) + 1
    largest, rows = largest_model(tiny, budget, measure, said.append)
    assert largest == 9 and 20 * parameters(family(tiny, 10)) > budget
    bound, most = most_layers(tiny, budget), most_tries(most_layers(tiny, budget))
    state = lambda n: 16 * parameters(family(tiny, n))  # noqa: E731  (float32 AdamW: 16 B/param)
    assert state(bound) <= budget < state(bound + 1)
    beyond = f"from n_layer={bound + 1} on, the state alone is over the budget"
    first = f"searching n_layer=1 to {bound} ({beyond}): at most {most} sizes, one step each"
    assert said[0] == first
    assert len(rows) == len(measured) == len(said) - 1 <= most and max(measured) <= bound
    for i, (n_layer, line) in enumerate(zip(measured, said[1:], strict=True)):
        peak = f"{20 * parameters(family(tiny, n_layer)) / 1e9:,.2f}"
        name = family(tiny, n_layer).name
        assert line == f"[{i + 1}/{most}] {name}: process peak {peak} GB (peak rise 20.00 B/param)"


def test_a_budget_over_the_machines_memory_or_under_one_layer_is_one_line():
    """Refused before any size is built: a budget over this machine's memory (on a GPU, its own),
    whose search would build sizes the machine cannot hold, or one under a layer's state."""
    over = 2 * host_memory_bytes() / 1e9
    result = run_in_process("bench.py", *SETTINGS, f"--fit_memory_gb={over:g}")
    assert_one_line_error(result, f"fit_memory_gb={over:g} is over this machine's memory")
    result = run_in_process("bench.py", *SETTINGS, "--fit_memory_gb=1e-5")
    assert_one_line_error(result, "not even n_layer=1 fits 1e-05 GB: its state alone is about")
    assert "searching" not in result.stdout


def test_bench_py_finds_the_largest_that_fits_a_budget(tmp_path):
    """The budget stands well above a CPU process's resident set before any model (torch and its
    imports, 0.3-0.5 GB). Each size is measured in a fresh process: in one process a size after a
    larger one measured its peak over pages the larger had left, and came out below its own state.
    Each size's line gives its two figures as the JSON and the bytes table name them: the process
    peak (what the budget holds) and the peak rise."""
    out = tmp_path / "fit.json"
    flags = (*TINY_MODEL, "--n_embd=64", "--device=cpu", "--vocab_size=64", f"--out_json={out}")
    result = run_script("bench.py", *flags, "--fit_memory_gb=0.8", "--batch_size=2")
    assert result.returncode == 0, result.stderr
    printed = result.stdout.splitlines()
    line = next(line for line in printed if line.startswith("largest that fits 0.8 GB"))
    rows = json.loads(out.read_text())["results"]
    assert "n_layer=" in line, result.stdout
    ok = [r for r in rows if r["status"] == "ok"]
    peaks = {r["settings"]["n_layer"]: r["memory"]["process_peak_bytes"] for r in ok}
    largest = int(line.split("n_layer=")[1].split(",")[0])
    assert peaks[largest] <= 0.8e9, result.stdout
    assert all(p > 0.8e9 for n, p in peaks.items() if n > largest), result.stdout
    assert len(ok) >= 4 and all(r["memory"]["peak"] >= r["memory"]["state"] for r in ok)
    searching = next(line for line in printed if line.startswith("searching n_layer=1 to "))
    most = int(searching.split("at most ")[1].split(" sizes")[0])
    lines = [line for line in printed if line.startswith("[")]
    assert len(lines) == len(rows) <= most, result.stdout
    for i, (line, r) in enumerate(zip(lines, rows, strict=True)):
        peak, rise = r["memory"]["process_peak_bytes"] / 1e9, r["memory"]["peak"]
        assert line == f"[{i + 1}/{most}] {r['name']}: process peak {peak:,.2f} GB " \
            f"(peak rise {rise:.2f} B/param)"  # fmt: skip


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--time=True", "--rounds=-1"], "rounds must be >= 1, not -1"),
        (["--time=True", "--rounds=0"], "rounds must be >= 1, not 0"),
        (["--batch=0"], "batch must be >= 1, not 0"),
        (["--block=1000000"], "block must be <= 1024, not 1000000"),
        (["--sizes=1B"], "sizes must be a comma-separated list of 124M, 350M, small"),
        (["--configs=adamw,sgd"], "configs must be a comma-separated list of adamw,"),
        (["--time"], "write --time=VALUE"),
    ],
)
def test_bad_memory_benchmark_settings_are_one_line(flags, message):
    assert_one_line_error(run_in_process("lab/memory.py", *flags), message)


@pytest.mark.parametrize("script", ["bench.py", "lab/memory.py"])
def test_every_number_the_memory_benchmarks_take_has_its_range(script):
    """Each numeric setting of their own declares what is valid, so that a bad value is one line,
    not a traceback (lab/memory.py's rounds=-1 was a StatisticsError)."""
    own = declarations(script).parts["bench" if script == "bench.py" else "memory"]
    for name, f in declared(own).items():
        if type(f.default) in (int, float):
            assert {"min", "above", "interval"} & set(f.metadata), name


def test_each_memory_figure_has_one_name():
    """'step peak' named the process peak in the search's lines and the peak rise in the bytes
    table: each figure has a name of its own where bench.py and the benchmark print and in the
    docs."""
    assert MEMORY_PARTS["peak"] == "peak rise"
    files = [ROOT / "bench.py", ROOT / "lab" / "memory.py"]
    files += [*(ROOT / "nanogpt_perf").glob("**/*.py"), *(ROOT / "docs").glob("*.md")]
    assert [f.name for f in files if "step peak" in f.read_text().lower()] == []
