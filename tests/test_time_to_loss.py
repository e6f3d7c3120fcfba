"""benchmarks/time_to_loss.py: the arithmetic on synthetic train.py records (crossings, the seconds axis, medians
over seeds with runs that never reach the target, ratios, the loss at equal tokens, the run order, the reuse of
finished runs), its refusals, and one end-to-end run on a tiny model."""

import csv
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from conftest import ROOT, TINY_MODEL, assert_one_line_error, run_in_process, run_script

sys.path.insert(0, str(ROOT / "benchmarks"))
from ttl_curves import (  # noqa: E402
    best_values,
    crossing,
    finished,
    interpolate,
    mark_finished,
    median_spread,
    reach,
    run_curve,
    seed_major,
    summarize,
)


def records(losses: list[float], every: int = 25, ms: float = 100.0, first_ms: float = 1000.0) -> list[dict]:
    """A train.py log: an eval every `every` iterations with these val losses, a logging window closing at each
    eval (the first step logged alone, as train.py does, taking first_ms), elapsed_s counting the evals too."""
    out = [{"iter": 0, "train_loss": losses[0], "val_loss": losses[0], "lr": 1e-3, "elapsed_s": 5.0}]
    for k, loss in enumerate(losses[1:], start=1):
        if k == 1:
            out.append({"iter": 1, "ms_per_iter": first_ms, "step_loss": loss, "elapsed_s": 99.0})
        out.append({"iter": k * every, "ms_per_iter": ms, "step_loss": loss, "elapsed_s": 99.0 * k})
        out.append({"iter": k * every, "train_loss": loss, "val_loss": loss, "lr": 1e-3, "elapsed_s": 99.0 * k})
    return out


def test_crossing_interpolates_between_the_evals_around_it():
    iters, losses = [0, 25, 50, 75], [4.0, 3.0, 2.0, 1.5]
    assert crossing(iters, losses, 2.5) == pytest.approx(37.5)  # halfway from 3.0 (at 25) to 2.0 (at 50)
    assert crossing(iters, losses, 2.0) == 50  # at an eval exactly
    assert crossing(iters, losses, 1.75) == pytest.approx(62.5)
    assert crossing(iters, losses, 9.0) == 0  # the first eval is already there
    assert crossing(iters, losses, 1.0) is None  # never reached


def test_crossing_is_the_first_one_when_the_loss_goes_up_again():
    assert crossing([0, 10, 20, 30], [3.0, 1.0, 2.5, 0.5], 2.0) == pytest.approx(5.0)
    assert crossing([0, 10, 20], [3.0, math.nan, 1.0], 2.0) == 20  # no interpolation from a NaN


def test_interpolate_inside_and_outside():
    assert interpolate([0, 10, 20], [0.0, 1.0, 5.0], 15) == pytest.approx(3.0)
    assert interpolate([0, 10, 20], [0.0, 1.0, 5.0], 20) == 5.0
    assert interpolate([0, 10, 20], [0.0, 1.0, 5.0], 21) is None
    assert interpolate([0, 10, 20], [0.0, 1.0, 5.0], -1) is None


def test_the_seconds_axis_is_training_time_from_the_logging_windows_not_elapsed():
    curve = run_curve(records([4.0, 3.0, 2.0], ms=100.0, first_ms=1000.0), tokens_per_iter=1024)
    # eval 25: the first step (1 s) + 24 steps of 100 ms; eval 50: 25 more steps of 100 ms; elapsed_s is ignored
    assert curve["seconds"] == pytest.approx([0.0, 3.4, 5.9])
    assert curve["tokens"] == [0, 25 * 1024, 50 * 1024]
    assert curve["ms_per_iter"] == 100.0  # the first window (warm-up) left out
    assert curve["final_val_loss"] == 2.0


def test_a_log_appended_to_by_an_earlier_run_counts_only_the_last_run():
    curve = run_curve(records([9.0, 8.0, 7.0]) + records([4.0, 3.0]), tokens_per_iter=1)
    assert curve["iters"] == [0, 25] and curve["val_loss"] == [4.0, 3.0]


def test_reach_gives_tokens_and_seconds_at_the_crossing():
    curve = run_curve(records([4.0, 3.0, 2.0], ms=100.0, first_ms=1000.0), tokens_per_iter=1024)
    at = reach(curve, 2.5)
    assert at["iters"] == pytest.approx(37.5)
    assert at["tokens"] == pytest.approx(37.5 * 1024)
    assert at["seconds"] == pytest.approx(3.4 + 0.5 * 2.5)  # halfway through the 2.5 s between evals 25 and 50
    assert reach(curve, 1.0) == {"iters": None, "tokens": None, "seconds": None}


def test_median_and_spread_over_seeds_with_runs_that_never_reach():
    assert median_spread([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "reached": 3, "runs": 3}
    assert median_spread([1.0, None, 2.0]) == {"median": 2.0, "min": 1.0, "max": None, "reached": 2, "runs": 3}
    assert median_spread([None, None, 1.0])["median"] is None  # most seeds never got there
    assert median_spread([4.0, 2.0]) == {"median": 3.0, "min": 2.0, "max": 4.0, "reached": 2, "runs": 2}
    assert median_spread([4.0, None])["median"] == 4.0  # by then half the seeds had reached it
    assert median_spread([None, None]) == {"median": None, "min": None, "max": None, "reached": 0, "runs": 2}
    assert median_spread([math.nan, 1.0, math.inf]) == {
        "median": None,
        "min": 1.0,
        "max": None,
        "reached": 1,
        "runs": 3,
    }


def curve_of(losses: list[float], tokens_per_iter: int = 100, ms: float = 10.0) -> dict:
    return run_curve(records(losses, every=10, ms=ms, first_ms=ms), tokens_per_iter)


def test_summary_target_ratios_and_loss_at_equal_tokens():
    curves = {
        # the baseline's final losses 2.0, 2.2, 2.4: the target is their median, 2.2
        "base": [curve_of([4.0, 3.0, 2.0]), curve_of([4.0, 3.2, 2.2]), curve_of([4.0, 3.4, 2.4])],
        # twice as fast per token, at twice the time per iteration
        "fast": [curve_of([4.0, 2.2, final], ms=20.0) for final in (1.0, 1.2, 1.4)],
        # twice the tokens per iteration: its eval at iter 10 is at the baseline's final 2,000 tokens
        "wide": [curve_of([4.0, 2.0, 1.0], tokens_per_iter=200)] * 3,
    }  # fmt: skip
    s = summarize(curves, "base", None)
    assert s["target"] == pytest.approx(2.2) and s["equal_tokens"] == 2000
    base, fast, wide = s["rows"]["base"], s["rows"]["fast"], s["rows"]["wide"]
    assert base["tokens_to_target"] == {"median": 2000, "min": 1000 * (1 + 0.8), "max": None, "reached": 2, "runs": 3}
    assert fast["tokens_to_target"]["median"] == pytest.approx(1000)
    assert fast["tokens_ratio"] == pytest.approx(0.5)
    assert fast["ms_ratio"] == pytest.approx(2.0)
    # 20 steps of 10 ms for the baseline's median seed, 10 steps of 20 ms: the same seconds
    assert base["seconds_to_target"]["median"] == pytest.approx(0.2)
    assert fast["seconds_to_target"]["median"] == pytest.approx(0.2)
    assert fast["seconds_ratio"] == pytest.approx(1.0)
    assert base["val_loss_at_equal_tokens"]["median"] == pytest.approx(2.2)
    assert fast["val_loss_at_equal_tokens"]["median"] == pytest.approx(1.2)
    assert wide["val_loss_at_equal_tokens"]["median"] == pytest.approx(2.0)  # its eval at iter 10 = 2,000 tokens
    assert wide["tokens_per_iter"] == [200]
    given = summarize(curves, "base", 3.0)
    assert given["target"] == 3.0 and given["rows"]["base"]["tokens_to_target"]["median"] == pytest.approx(1200)


def test_loss_at_equal_tokens_is_none_for_a_run_that_did_not_get_that_far():
    curves = {"base": [curve_of([4.0, 3.0, 2.0])], "short": [curve_of([4.0, 2.0], tokens_per_iter=50)]}
    assert summarize(curves, "base", None)["rows"]["short"]["val_loss_at_equal_tokens"]["median"] is None


def test_best_value_of_a_sweep_is_the_lowest_median_final_loss():
    table = best_values({"adamw": {"3e-3": [1.6, 1.7, 1.5], "2e-3": [1.55, 1.58, 1.9], "1e-3": [1.7, 1.7, 1.7]}})
    assert table["adamw"]["best"] == "2e-3"
    assert table["adamw"]["values"]["3e-3"]["median"] == pytest.approx(1.6)
    diverged = best_values({"a": {"x": [math.nan, math.nan, 1.0], "y": [2.0, 2.0, 2.0]}})["a"]
    assert diverged["best"] == "y" and diverged["values"]["x"]["median"] is None  # a NaN is worse than any loss


def test_runs_go_seed_major():
    assert seed_major(["a", "b", "c"], [1, 2]) == [("a", 1), ("b", 1), ("c", 1), ("a", 2), ("b", 2), ("c", 2)]


def write_log(out_dir: Path, lines: list[dict]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_a_finished_run_of_the_same_command_is_reused_and_nothing_else(tmp_path):
    run = {"command": ["config/x.py", "--seed=1", "--max_iters=50"], "omp_num_threads": None}
    ran = {"started_at": 1.5, "wall_s": 42.0}
    write_log(tmp_path / "done", records([4.0, 3.0, 2.0]))
    assert finished(tmp_path / "done", run, 50) is None  # no mark: train.py may have been stopped
    mark_finished(tmp_path / "done", run, ran)
    assert finished(tmp_path / "done", run, 50) == ran  # with the figures of the session that ran it
    assert finished(tmp_path / "done", run | {"command": [*run["command"], "--learning_rate=1e-3"]}, 50) is None
    assert finished(tmp_path / "done", run | {"omp_num_threads": "1"}, 50) is None  # other threads: other seconds
    assert finished(tmp_path / "done", run, 75) is None  # another horizon
    write_log(tmp_path / "cut", records([4.0, 3.0, 2.0])[:-3])  # a log that ends before max_iters
    mark_finished(tmp_path / "cut", run, ran)
    assert finished(tmp_path / "cut", run, 50) is None
    (tmp_path / "done" / "ttl_run.json").write_text("[1, 2")  # a damaged mark
    assert finished(tmp_path / "done", run, 50) is None
    assert finished(tmp_path / "nothing", run, 50) is None


SCRIPT = "benchmarks/time_to_loss.py"


def configs_file(folder: Path, data_dir: Path) -> Path:
    path = folder / "configs.py"
    task = [*TINY_MODEL, f"--data_dir={data_dir}", "--dataset=tiny", "--warmup_iters=2", "--min_lr=1e-4"]
    sets = {"two": {"slow": ["--learning_rate=3e-4"], "fast": ["--learning_rate=3e-3"]}}
    path.write_text(f"TASKS = {{'tiny': {task!r}}}\nSETS = {sets!r}\n")
    return path


@pytest.mark.parametrize(
    "flags, fragments",
    [
        ("--task=nope", ("no task 'nope': one of tiny",)),
        ("--config_set=nope", ("no config_set 'nope': one of two",)),
        ("--only=slow,quick", ("set 'two' has no configuration 'quick': one of slow, fast",)),
        ("--sweep=learning_rate", ("sweep must be '' or KEY=V1,V2,...",)),
        ("--eval_interval=30 --max_iters=20", ("eval_interval must be <= max_iters (20)",)),
        ("--train_args=config/none.py", ("configuration 'slow': config file config/none.py not found",)),
    ],
)
def test_bad_settings_are_one_error_line(tmp_path, flags, fragments):
    configs = configs_file(tmp_path, tmp_path / "data")
    result = run_in_process(SCRIPT, f"--configs={configs}", "--task=tiny", "--config_set=two", *flags.split())
    assert_one_line_error(result, *fragments)


@pytest.mark.parametrize(
    "text, fragments",
    [
        ("TASKS = {'tiny': []}\n", ("must define TASKS and SETS",)),
        ("TASKS = {'tiny': '--n_layer=2'}\nSETS = {'two': {'a': []}}\n", ("task 'tiny' must be a list",)),
        ("TASKS = {'tiny': []}\nSETS = {'two': {'a b': [], 'a_b': []}}\n", ("share a folder name",)),
        ("TASKS = {'tiny': [1]}\nSETS = {'two': {'a': []}}\n", ("arguments must be strings",)),
    ],
)
def test_a_bad_configurations_file_is_one_error_line(tmp_path, text, fragments):
    (tmp_path / "configs.py").write_text(text)
    flags = (f"--configs={tmp_path / 'configs.py'}", "--task=tiny", "--config_set=two")
    assert_one_line_error(run_in_process(SCRIPT, *flags), *fragments)


def test_end_to_end_two_configurations_two_seeds(tmp_path, tiny_data):
    out = tmp_path / "out"
    flags = [f"--configs={configs_file(tmp_path, tiny_data)}", "--task=tiny", "--config_set=two", "--seeds=2",
             "--max_iters=20", "--eval_interval=5", "--eval_iters=2", f"--out={out}", "--jobs=2"]  # fmt: skip
    result = run_script(SCRIPT, *flags)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    doc = json.loads((out / "time_to_loss.json").read_text())
    runs = doc["runs"]
    assert [(r["config"], r["seed"]) for r in runs] == [("slow", 1337), ("fast", 1337), ("slow", 1338), ("fast", 1338)]
    assert [r["started_at"] for r in runs] == sorted(r["started_at"] for r in runs)  # started seed-major
    finals = {}
    for r in runs:  # the final val losses as train.py logged them
        lines = [json.loads(line) for line in (Path(r["out_dir"]) / "log.jsonl").read_text().splitlines()]
        evals = [x for x in lines if "val_loss" in x]
        assert [x["iter"] for x in evals] == [0, 5, 10, 15, 20]
        finals.setdefault(r["config"], []).append(evals[-1]["val_loss"])
        assert not list(Path(r["out_dir"]).glob("ckpt*.pt"))  # only the log is kept
    summary = doc["summary"]
    assert summary["baseline"] == "slow"
    assert summary["target"] == pytest.approx(sum(finals["slow"]) / 2)  # the median of two seeds
    assert summary["rows"]["fast"]["final_val_loss"]["median"] < summary["rows"]["slow"]["final_val_loss"]["median"]
    assert summary["rows"]["fast"]["tokens_ratio"] < 1  # the higher learning rate gets there first, in 20 steps
    rows = list(csv.DictReader((out / "time_to_loss.csv").open()))
    assert [r["configuration"] for r in rows] == ["slow", "fast"]
    assert "| configuration |" in result.stdout and "train s to target" in result.stdout
    if importlib.util.find_spec("matplotlib"):
        assert (out / "time_to_loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = run_script(SCRIPT, *flags)  # every run finished with the same command: none is run again
    assert again.returncode == 0, again.stderr[-2000:]
    assert "4 runs (4 reused)" in again.stdout
    redone = json.loads((out / "time_to_loss.json").read_text())
    assert redone["summary"] == summary
    assert [r["started_at"] for r in redone["runs"]] == [r["started_at"] for r in runs]  # as they ran
