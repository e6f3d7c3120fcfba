"""lab/time_to_loss.py: the arithmetic on synthetic train.py records (crossings, the seconds axis,
medians over seeds with runs that never reach the target, ratios, the loss at equal tokens, the run
order, the reuse of finished runs), its refusals, and one end-to-end run on a tiny model."""

import importlib.util
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import pytest

from conftest import ROOT, TINY_MODEL, assert_one_line_error, run_in_process, run_script
from lab.ttl_curves import (
    crossing,
    interpolate,
    median_spread,
    reach,
    run_curve,
    summarize,
    summary_table,
    sweep_summary,
    sweep_table,
)
from lab.ttl_runs import (
    code_digest,
    file_digest,
    finished,
    mark_finished,
    outcome,
    run_identity,
)
from nanogpt_perf.files import process_alive


def records(
    losses: list[float], every: int = 25, ms: float = 100.0, first_ms: float = 1000.0
) -> list[dict]:
    """A train.py log: an eval every `every` iterations with these val losses, a logging window
    closing at each eval (the first step logged alone, as train.py does, taking first_ms), elapsed_s
    counting the evals too."""
    out = [
        {"iter": 0, "train_loss": losses[0], "val_loss": losses[0], "lr": 1e-3, "elapsed_s": 5.0}
    ]
    for k, loss in enumerate(losses[1:], start=1):
        if k == 1:
            out.append({"iter": 1, "ms_per_iter": first_ms, "step_loss": loss, "elapsed_s": 99.0})
        out.append({"iter": k * every, "ms_per_iter": ms, "step_loss": loss, "elapsed_s": 99.0 * k})
        out.append(
            {
                "iter": k * every,
                "train_loss": loss,
                "val_loss": loss,
                "lr": 1e-3,
                "elapsed_s": 99.0 * k,
            }
        )
    return out


def test_crossing_interpolates_between_the_evals_around_it():
    iters, losses = [0, 25, 50, 75], [4.0, 3.0, 2.0, 1.5]
    # halfway from 3.0 (at 25) to 2.0 (at 50)
    assert crossing(iters, losses, 2.5) == pytest.approx(37.5)
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
    # eval 25: the first step (1 s) + 24 steps of 100 ms; eval 50: 25 more steps of 100 ms;
    # elapsed_s is ignored
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
    # halfway through the 2.5 s between evals 25 and 50
    assert at["seconds"] == pytest.approx(3.4 + 0.5 * 2.5)
    assert reach(curve, 1.0) == {"iters": None, "tokens": None, "seconds": None}


def test_median_and_spread_over_seeds_with_runs_that_never_reach():
    assert median_spread([3.0, 1.0, 2.0]) == {
        "median": 2.0,
        "min": 1.0,
        "max": 3.0,
        "reached": 3,
        "runs": 3,
    }
    assert median_spread([1.0, None, 2.0]) == {
        "median": 2.0,
        "min": 1.0,
        "max": None,
        "reached": 2,
        "runs": 3,
    }
    assert median_spread([None, None, 1.0])["median"] is None  # most seeds never got there
    assert median_spread([4.0, 2.0]) == {
        "median": 3.0,
        "min": 2.0,
        "max": 4.0,
        "reached": 2,
        "runs": 2,
    }
    assert median_spread([4.0, None])["median"] == 4.0  # by then half the seeds had reached it
    assert median_spread([None, None]) == {
        "median": None,
        "min": None,
        "max": None,
        "reached": 0,
        "runs": 2,
    }
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
        # twice the tokens per iteration: its eval at iter 10 is at the baseline's final 2,000
        # tokens
        "wide": [curve_of([4.0, 2.0, 1.0], tokens_per_iter=200)] * 3,
    }  # fmt: skip
    s = summarize(curves, "base", None)
    assert s["target"] == pytest.approx(2.2) and s["equal_tokens"] == 2000
    base, fast, wide = s["rows"]["base"], s["rows"]["fast"], s["rows"]["wide"]
    assert base["tokens_to_target"] == {
        "median": 2000,
        "min": 1000 * (1 + 0.8),
        "max": None,
        "reached": 2,
        "runs": 3,
    }
    assert fast["tokens_to_target"]["median"] == pytest.approx(1000)
    assert fast["tokens_ratio"] == pytest.approx(0.5)
    assert fast["ms_ratio"] == pytest.approx(2.0)
    # 20 steps of 10 ms for the baseline's median seed, 10 steps of 20 ms: the same seconds
    assert base["seconds_to_target"]["median"] == pytest.approx(0.2)
    assert fast["seconds_to_target"]["median"] == pytest.approx(0.2)
    assert fast["seconds_ratio"] == pytest.approx(1.0)
    assert base["val_loss_at_equal_tokens"]["median"] == pytest.approx(2.2)
    assert fast["val_loss_at_equal_tokens"]["median"] == pytest.approx(1.2)
    # its eval at iter 10 = 2,000 tokens
    assert wide["val_loss_at_equal_tokens"]["median"] == pytest.approx(2.0)
    assert wide["tokens_per_iter"] == [200]
    given = summarize(curves, "base", 3.0)
    assert given["target"] == 3.0 and given["rows"]["base"]["tokens_to_target"][
        "median"
    ] == pytest.approx(1200)


def test_loss_at_equal_tokens_is_none_for_a_run_that_did_not_get_that_far():
    curves = {
        "base": [curve_of([4.0, 3.0, 2.0])],
        "short": [curve_of([4.0, 2.0], tokens_per_iter=50)],
    }
    assert (
        summarize(curves, "base", None)["rows"]["short"]["val_loss_at_equal_tokens"]["median"]
        is None
    )


def best_values(finals: dict[str, dict[str, list]]) -> dict:
    """sweep_summary's table over a sweep of 'lr' with these final val losses: configuration ->
    value -> the seeds' (None: a seed that diverged)."""
    curves = {
        f"{config} lr={value}": [{"final_val_loss": loss} for loss in losses]
        for config, by_value in finals.items()
        for value, losses in by_value.items()
    }
    return sweep_summary("lr", curves)["table"]


def test_best_value_of_a_sweep_is_the_lowest_median_final_loss():
    table = best_values(
        {"adamw": {"3e-3": [1.6, 1.7, 1.5], "2e-3": [1.55, 1.58, 1.9], "1e-3": [1.7, 1.7, 1.7]}}
    )
    assert table["adamw"]["best"] == "2e-3"
    assert table["adamw"]["values"]["3e-3"]["median"] == pytest.approx(1.6)
    diverged = best_values({"a": {"x": [math.nan, math.nan, 1.0], "y": [2.0, 2.0, 2.0]}})["a"]
    # a NaN is worse than any loss
    assert diverged["best"] == "y" and diverged["values"]["x"]["median"] is None


def write_log(out_dir: Path, lines: list[dict]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_a_finished_run_is_reused_only_with_its_whole_identity_and_a_log_that_says_so(tmp_path):
    run = {
        "command": ["config/x.py", "--seed=1", "--max_iters=50"],
        "omp_num_threads": None,
        "code": "c0de",
    }
    ran = {"started_at": 1.5, "wall_s": 42.0, "outcome": "finished"}
    write_log(tmp_path / "done", records([4.0, 3.0, 2.0]))
    assert finished(tmp_path / "done", run, 50) is None  # no mark: train.py may have been stopped
    mark_finished(tmp_path / "done", run, ran)
    # with the figures of the session that ran it
    assert finished(tmp_path / "done", run, 50) == ran
    assert (
        finished(
            tmp_path / "done", run | {"command": [*run["command"], "--learning_rate=1e-3"]}, 50
        )
        is None
    )
    # other threads: other seconds
    assert finished(tmp_path / "done", run | {"omp_num_threads": "1"}, 50) is None
    assert finished(tmp_path / "done", run | {"code": "c0df"}, 50) is None  # other code
    assert finished(tmp_path / "done", run, 75) is None  # another horizon
    write_log(tmp_path / "cut", records([4.0, 3.0, 2.0])[:-3])  # a log that ends before max_iters
    mark_finished(tmp_path / "cut", run, ran)
    assert finished(tmp_path / "cut", run, 50) is None
    # ends where train.py stopped it
    mark_finished(tmp_path / "cut", run, ran | {"outcome": "diverged"})
    assert finished(tmp_path / "cut", run, 50) == ran | {"outcome": "diverged"}
    mark_finished(tmp_path / "done", run, ran | {"outcome": "stopped"})  # never written: not a run
    assert finished(tmp_path / "done", run, 50) is None
    (tmp_path / "done" / "ttl_run.json").write_text("[1, 2")  # a damaged mark
    assert finished(tmp_path / "done", run, 50) is None
    assert finished(tmp_path / "nothing", run, 50) is None


def nonfinite_line(out_dir: Path, max_bad_steps: int | None) -> str:
    from nanogpt_perf.train.progress import nonfinite_end

    return "error: " + nonfinite_end(3, 4, out_dir, max_bad_steps)  # as train.py prints it


@pytest.mark.parametrize(
    "returncode, evals, said, kind, line",
    [
        (0, 3, "timing: median 3.2 ms/iter", "finished", "timing: median 3.2 ms/iter"),
        (0, 2, "stopped by SIGTERM after iter 25, saved ckpt.pt: resume with\n  python train.py",
         "stopped", "stopped by SIGTERM after iter 25, saved ckpt.pt: resume with"),
        (-9, 2, "iter 30: loss 2.1", "killed", "killed by SIGKILL"),
        (-15, 2, "", "killed", "killed by SIGTERM"),
        (130, 2, "second Ctrl-C: exiting now, without saving", "killed", "killed by SIGINT"),
        (1, 2, "NONFINITE", "diverged", "NONFINITE"),
        (1, 3, "NONFINITE_AT_END", "diverged", "NONFINITE_AT_END"),
        (1, 1, "error: dataset 'x' not found", "failed", "error: dataset 'x' not found"),
        (1, 1, "Traceback (most recent call last):\nValueError: non-finite", "failed",
         "ValueError: non-finite"),
    ],
)  # fmt: skip
def test_what_a_train_py_exit_means(tmp_path, returncode, evals, said, kind, line):
    lines = {
        "NONFINITE": nonfinite_line(tmp_path, 3),
        "NONFINITE_AT_END": nonfinite_line(tmp_path, None),
    }
    said, line = lines.get(said, said), lines.get(line, line)
    write_log(tmp_path, records([4.0, 3.0, 2.0])[: 1 + 3 * (evals - 1)])  # evals at 0, 25 and 50
    (tmp_path / "train.out").write_text(f"iter 0: val 4.0\n{said}\n")
    assert outcome(returncode, tmp_path, 50) == (kind, line)


def git(root: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
    )


def write_tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_code_digest_is_the_code_on_disk_committed_or_not(tmp_path):
    root = tmp_path / "repo"
    write_tree(
        root,
        {
            "train.py": "a = 1\n",
            "pkg/mod.py": "b = 2\n",
            "tests/test_x.py": "t = 0\n",
            "config/c.py": "",
            "lab/b.py": "",
            "docs/x.md": "doc\n",
            ".gitignore": "out*/\n",
            "out-x/run.py": "",
        },
    )
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-qm", "first")
    first = code_digest(root)
    write_tree(
        root,
        {
            "docs/x.md": "other\n",
            "tests/test_x.py": "t = 1\n",
            "lab/b.py": "c = 3\n",
            "out-x/run.py": "d = 4\n",
            "pkg/notes.txt": "not code\n",
            "config/c.py": "e = 5\n",
        },
    )
    # what no run executes, out* folders, config files (by their command)
    assert code_digest(root) == first
    write_tree(root, {"train.py": "a = 2\n"})
    edited = code_digest(root)
    assert edited != first  # an uncommitted edit
    git(root, "commit", "-qam", "second")
    assert code_digest(root) == edited  # the same code, committed: the same digest
    write_tree(root, {"pkg/new.py": ""})
    assert code_digest(root) != edited  # a new file, untracked
    (root / "pkg/new.py").unlink()
    (root / "pkg/mod.py").unlink()
    assert code_digest(root) not in (first, edited)  # a tracked file deleted
    git(root, "checkout", "--", "pkg/mod.py")
    assert code_digest(root) == edited
    shutil.copytree(root, tmp_path / "plain", ignore=shutil.ignore_patterns(".git"))
    assert code_digest(tmp_path / "plain") == edited  # outside git: the same files, found on disk
    write_tree(root, {".gitignore": "out*/\nscratch/\n", "scratch/mine.py": ""})
    assert code_digest(root) != edited  # a file git ignores is code all the same


@pytest.mark.parametrize("git_init", [False, True])
def test_the_code_digest_holds_a_linked_package_not_a_linked_data_folder(tmp_path, git_init):
    if git_init and shutil.which("git") is None:
        pytest.skip("needs git")
    root, package, data = tmp_path / "repo", tmp_path / "package", tmp_path / "data"
    write_tree(package, {"__init__.py": "", "mod.py": "a = 1\n"})
    write_tree(data, {"notes.py": "not imported\n"})
    write_tree(root, {"train.py": "import pkg\n"})
    (root / "pkg").symlink_to(package)
    (root / "data").symlink_to(data)
    (package / "again").symlink_to(package)  # a loop
    if git_init:
        git(root, "init", "-q")
        git(root, "add", ".")
        git(root, "commit", "-qm", "first")
    first = code_digest(root)
    write_tree(data, {"notes.py": "still not imported\n"})
    assert code_digest(root) == first
    write_tree(package, {"mod.py": "a = 2\n"})
    assert code_digest(root) != first


def not_files(folder: Path) -> Path:
    """In folder: a FIFO, a link to /dev/zero, a folder, a dangling link and a socket, each named
    *.py; the FIFO's path."""
    folder.mkdir(parents=True, exist_ok=True)
    os.mkfifo(folder / "fifo.py")
    (folder / "zero.py").symlink_to("/dev/zero")
    (folder / "folder.py").mkdir()
    (folder / "gone.py").symlink_to(folder / "nothing")
    if len(str(folder / "sock.py")) < 100:  # a socket's path has a limit
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(folder / "sock.py"))
    return folder / "fifo.py"


def within(seconds: float, call, fifo: Path):
    """call() in a thread, or the test fails where it has not returned in seconds (a reader blocked
    on the FIFO is then let go: the suite never hangs)."""
    result = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # the blocked open returns, reads EOF
        pytest.fail(f"still going after {seconds} s: it waits on a FIFO")
    return result[0]


@pytest.mark.parametrize("git_init", [False, True])
def test_the_code_digest_never_waits_on_nor_reads_what_is_not_a_file(tmp_path, git_init):
    if git_init and shutil.which("git") is None:
        pytest.skip("needs git")
    root = tmp_path / "repo"
    write_tree(root, {"train.py": "a = 1\n", "pkg/mod.py": "b = 2\n"})
    if git_init:  # git lists a tracked file that a FIFO has replaced
        git(root, "init", "-q")
        git(root, "add", ".")
        git(root, "commit", "-qm", "first")
        (root / "pkg/mod.py").unlink()
    fifo = not_files(root / "pkg")
    if git_init:
        os.rename(fifo, root / "pkg/mod.py")
        fifo = root / "pkg/mod.py"
    first = within(20, lambda: code_digest(root), fifo)
    assert code_digest(root) == first
    assert file_digest(fifo) is None and file_digest(root / "pkg/zero.py") is None
    write_tree(root, {"train.py": "a = 2\n"})
    assert code_digest(root) != first  # the code beside them still counts


def test_a_run_identity_holds_the_machine_and_the_packages_its_steps_run_on(tmp_path):
    import numpy

    identity = run_identity(["--seed=1"], None, tmp_path)
    assert identity["numpy"] == numpy.__version__ and identity["torch"] is not None
    assert "triton" in identity
    machine = identity["machine"]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert machine["cores"] == cores and machine["cpu"]
    assert isinstance(machine["gpus"], list)


def test_a_run_identity_holds_its_config_files_contents(tmp_path):
    write_tree(tmp_path, {"config/a.py": "x = 1\n"})
    outside = tmp_path.parent / f"{tmp_path.name}-outside.py"
    outside.write_text("y = 1\n")
    cmd = ["config/a.py", str(outside), "--seed=1"]
    first = run_identity(cmd, None, tmp_path)
    assert run_identity(cmd, None, tmp_path) == first
    assert run_identity(cmd, "1", tmp_path) != first  # other threads
    outside.write_text("y = 2\n")
    second = run_identity(cmd, None, tmp_path)
    assert second["config_files"] != first["config_files"] and second["code"] == first["code"]
    write_tree(tmp_path, {"config/a.py": "x = 2\n"})
    assert run_identity(cmd, None, tmp_path)["config_files"] not in (
        first["config_files"],
        second["config_files"],
    )
    outside.unlink()
    # gone: no digest
    assert run_identity(cmd, None, tmp_path)["config_files"][str(outside)] is None


def test_a_run_that_diverged_is_never_whatever_it_reached_before():
    base = [curve_of([4.0, 3.0, 2.0]) for _ in range(3)]
    flaky = [
        curve_of([4.0, 2.0, 1.0]),
        run_curve(records([4.0, 1.0], every=10, ms=10.0, first_ms=10.0), 100, True),
    ]
    s = summarize({"base": base, "flaky": flaky}, "base", None)
    row = s["rows"]["flaky"]
    assert flaky[1]["final_val_loss"] is None and flaky[1]["val_loss"][-1] == 1.0
    assert row["tokens_to_target"] == {
        "median": 1000,
        "min": 1000,
        "max": None,
        "reached": 1,
        "runs": 2,
    }
    assert row["final_val_loss"]["reached"] == 1 and row["val_loss_at_equal_tokens"]["reached"] == 1
    assert row["ms_per_iter"] == 10.0  # its steps were timed all the same
    wild = [
        run_curve(records([4.0, 3.0], every=10, ms=10.0, first_ms=10.0), 100, True)
        for _ in range(2)
    ]
    # a baseline that diverged in most seeds
    s = summarize({"wild": wild, "base": base}, "wild", None)
    assert s["target"] is None and s["equal_tokens"] == 1000
    assert (
        s["rows"]["base"]["tokens_to_target"]["reached"] == 0
        and s["rows"]["base"]["tokens_ratio"] is None
    )
    assert "never" in summary_table(s)
    sweep = best_values({"a": {"x": [None, None], "y": [None, 2.0]}, "b": {"x": [None]}})
    # no value with a median: none is best
    assert sweep["a"]["best"] == "y" and sweep["b"]["best"] is None
    assert "1/2 diverged" in sweep_table({"key": "lr", "table": sweep})


SCRIPT = "lab/time_to_loss.py"


def configs_file(folder: Path, data_dir: Path) -> Path:
    path = folder / "configs.py"
    task = [
        *TINY_MODEL,
        f"--data_dir={data_dir}",
        "--dataset=tiny",
        "--warmup_iters=2",
        "--min_lr=1e-4",
    ]
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
        ("--train_args=config/none.py", ("--train_args: config file config/none.py not found",)),
    ],
)
def test_bad_settings_are_one_error_line(tmp_path, flags, fragments):
    configs = configs_file(tmp_path, tmp_path / "data")
    result = run_in_process(
        SCRIPT, f"--configs={configs}", "--task=tiny", "--config_set=two", *flags.split()
    )
    assert_one_line_error(result, *fragments)


@pytest.mark.parametrize(
    "text, fragments",
    [
        ("TASKS = {'tiny': []}\n", ("must define TASKS and SETS",)),
        (
            "TASKS = {'tiny': '--n_layer=2'}\nSETS = {'two': {'a': []}}\n",
            ("task 'tiny' must be a list",),
        ),
        (
            "TASKS = {'tiny': []}\nSETS = {'two': {'a b': [], 'a_b': []}}\n",
            ("share a folder name",),
        ),
        ("TASKS = {'tiny': [1]}\nSETS = {'two': {'a': []}}\n", ("arguments must be strings",)),
    ],
)
def test_a_bad_configurations_file_is_one_error_line(tmp_path, text, fragments):
    (tmp_path / "configs.py").write_text(text)
    flags = (f"--configs={tmp_path / 'configs.py'}", "--task=tiny", "--config_set=two")
    assert_one_line_error(run_in_process(SCRIPT, *flags), *fragments)


def test_end_to_end_two_configurations_two_seeds(tmp_path, tiny_data):
    out = tmp_path / "out"
    flags = [
        f"--configs={configs_file(tmp_path, tiny_data)}",
        "--task=tiny",
        "--config_set=two",
        "--seeds=2",
        "--max_iters=20",
        "--eval_interval=5",
        "--eval_iters=2",
        f"--out={out}",
        "--jobs=2",
    ]
    result = run_script(SCRIPT, *flags)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    doc = json.loads((out / "time_to_loss.json").read_text())
    runs = doc["runs"]
    assert [(r["config"], r["seed"]) for r in runs] == [
        ("slow", 1337),
        ("fast", 1337),
        ("slow", 1338),
        ("fast", 1338),
    ]
    first, second = ([r["started_at"] for r in runs if r["seed"] == seed] for seed in (1337, 1338))
    # seed-major: the two of seed 1337 together (jobs=2), then those of 1338
    assert max(first) < min(second)
    finals = {}
    for r in runs:  # the final val losses as train.py logged them
        lines = [
            json.loads(line) for line in (Path(r["out_dir"]) / "log.jsonl").read_text().splitlines()
        ]
        evals = [x for x in lines if "val_loss" in x]
        assert [x["iter"] for x in evals] == [0, 5, 10, 15, 20]
        finals.setdefault(r["config"], []).append(evals[-1]["val_loss"])
        assert not list(Path(r["out_dir"]).glob("ckpt*.pt"))  # only the log is kept
        assert set(r["data"]) == {"meta.pkl", "train.bin", "val.bin"}  # the dataset it trained on
    summary = doc["summary"]
    assert summary["baseline"] == "slow"
    assert summary["target"] == pytest.approx(sum(finals["slow"]) / 2)  # the median of two seeds
    assert (
        summary["rows"]["fast"]["final_val_loss"]["median"]
        < summary["rows"]["slow"]["final_val_loss"]["median"]
    )
    # the higher learning rate gets there first, in 20 steps
    assert summary["rows"]["fast"]["tokens_ratio"] < 1
    assert list(summary["rows"]) == ["slow", "fast"]  # the baseline first, in the set's order
    assert "| configuration |" in result.stdout and "train s to target" in result.stdout
    if importlib.util.find_spec("matplotlib"):
        assert (out / "time_to_loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # every run finished with the same command: none is run again
    again = run_script(SCRIPT, *flags)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "4 runs (4 reused)" in again.stdout
    redone = json.loads((out / "time_to_loss.json").read_text())
    assert redone["summary"] == summary
    # as they ran
    assert [r["started_at"] for r in redone["runs"]] == [r["started_at"] for r in runs]


# ------------------------------------------------------------------------- refusals before any work


OWNED = [
    "out_dir",
    "overwrite",
    "seed",
    "max_iters",
    "lr_decay_iters",
    "eval_interval",
    "log_interval",
    "eval_iters",
    "always_save_checkpoint",
]


@pytest.mark.parametrize("key", OWNED)
def test_a_sweep_over_a_setting_the_benchmark_sets_is_refused(tmp_path, key):
    configs = configs_file(tmp_path, tmp_path / "data")
    result = run_in_process(
        SCRIPT, f"--configs={configs}", "--task=tiny", "--config_set=two", f"--sweep={key}=1,2"
    )
    assert_one_line_error(
        result, f"--sweep sets {key}, which the benchmark sets itself in every run"
    )
    assert not (ROOT / "out-ttl" / f"tiny-two-600-sweep-{key}").exists()


@pytest.mark.parametrize(
    "where, text, fragments",
    [
        ("task", "'--eval_iters=5'", ("task 'tiny' sets eval_iters", "(--eval_iters)")),
        (
            "configuration",
            "'--seed=7'",
            ("configuration 'slow' sets seed", "(--seeds and --first_seed)"),
        ),
        ("train_args", "--max_iters=5", ("--train_args sets max_iters", "(--max_iters)")),
        (
            "train_args",
            "--lr_decay_iters=5",
            ("--train_args sets lr_decay_iters", "--fit_schedule=True"),
        ),
    ],
)
def test_a_configuration_that_sets_a_setting_the_benchmark_sets_is_refused(
    tmp_path, where, text, fragments
):
    tasks = {"tiny": ["--n_layer=1"] + ([eval(text)] if where == "task" else [])}
    sets = {
        "two": {
            "slow": ["--n_layer=2"] + ([eval(text)] if where == "configuration" else []),
            "fast": [],
        }
    }
    (tmp_path / "configs.py").write_text(f"TASKS = {tasks!r}\nSETS = {sets!r}\n")
    flags = [f"--configs={tmp_path / 'configs.py'}", "--task=tiny", "--config_set=two"]
    result = run_in_process(
        SCRIPT, *flags, *([f"--train_args={text}"] if where == "train_args" else [])
    )
    assert_one_line_error(result, *fragments, "which the benchmark sets itself in every run")


@pytest.mark.parametrize(
    "case, fragments",
    [
        (
            "empty set",
            (
                "set 'two' must be a dict of configurations",
                "with one at least, its baseline, not {}",
            ),
        ),
        ("set a list", ("set 'two' must be a dict of configurations", "not ['a']")),
        (
            "unbalanced quote",
            ('train_args "\'--n_layer=2" cannot be split as a shell would', "close its quotes"),
        ),
        ("out a file", ("is a file: give a folder",)),
        ("out in a file", ("out must be '' or a path in folders", "file is a file")),
        ("configs a folder", ("is not a file",)),
        ("configs binary", ("cannot be read as Python", "null bytes")),
    ],
)
def test_what_used_to_be_a_traceback_is_one_error_line(tmp_path, case, fragments):
    configs, blocker = configs_file(tmp_path, tmp_path / "data"), tmp_path / "file"
    blocker.write_text("kept\n")
    flags = {
        "empty set": [f"--configs={tmp_path / 'empty.py'}"],
        "set a list": [f"--configs={tmp_path / 'list.py'}"],
        "unbalanced quote": ["--train_args='--n_layer=2"],
        "out a file": [f"--out={blocker}"],
        "out in a file": [f"--out={blocker / 'results'}"],
        "configs a folder": [f"--configs={tmp_path}"],
        "configs binary": [f"--configs={tmp_path / 'binary.py'}"],
    }[case]
    (tmp_path / "empty.py").write_text("TASKS = {'tiny': []}\nSETS = {'two': {}}\n")
    (tmp_path / "list.py").write_text("TASKS = {'tiny': []}\nSETS = {'two': ['a']}\n")
    (tmp_path / "binary.py").write_bytes(b"TASKS = {}\0\xff")
    result = run_in_process(
        SCRIPT, f"--configs={configs}", "--task=tiny", "--config_set=two", *flags
    )
    if "Python" in fragments[0]:
        fragments = ("binary.py",)  # the configurator's own words for a file with NUL bytes
    assert_one_line_error(result, *fragments)
    assert blocker.read_text() == "kept\n"


@pytest.mark.parametrize(
    "script, flags, fragments",
    [
        ("prepare", ["--input={tmp}/missing.txt"], ("input file", "missing.txt not found")),
        ("prepare", ["--input={tmp}"], ("is a folder: give its files",)),
        ("prepare", ["--input={tmp}/empty.jsonl"], ("empty.jsonl is empty: no documents",)),
        ("ttl_data", ["--text={tmp}/empty.txt", "--name=x", "--data_dir={tmp}/data"],
         ("the text for x is empty",)),
        ("ttl_data", ["--text={tmp}/short.txt", "--name=x", "--data_dir={tmp}/short.txt"],
         ("cannot make the dataset folder", "short.txt/x")),
        ("ttl_data", ["--text={tmp}/binary.txt", "--name=x", "--data_dir={tmp}/data"],
         ("cannot be read as UTF-8",)),
    ],
)  # fmt: skip
def test_a_benchmarks_missing_or_odd_input_file_is_one_error_line(
    tmp_path, script, flags, fragments
):
    write_tree(tmp_path, {"short.txt": "abcdef", "empty.txt": " \n", "empty.jsonl": ""})
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00 not text")
    before = sorted(p.name for p in tmp_path.iterdir())
    result = run_in_process(f"lab/{script}.py", *(f.format(tmp=tmp_path) for f in flags))
    assert_one_line_error(result, *fragments)
    assert (
        sorted(p.name for p in tmp_path.iterdir()) == before
        and (tmp_path / "short.txt").read_text() == "abcdef"
    )


# -------------------------------------------------------------- a checkout with a stand-in train.py

FAKE_TRAIN = r"""
# A stand-in for train.py: the records the benchmark reads, made up from its flags (val loss 4 / (1
# + rate x iter)), and the ends a run can have (--end=): finish, diverge (train.py's line for
# non-finite steps), fail, sleep (until SIGTERM or SIGINT, which stop it as they stop train.py: it
# exits 0 before max_iters; --ignore_sigterm=1: SIGTERM does nothing). A seed in --diverge_seeds
# diverges; --after=PATH: the end waits for PATH to exist. Its manifest names --data_dir and
# --dataset where given; it replaces the one there, as train.py's.
import json, os, signal, sys, time
from pathlib import Path

flags = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--"))
out, max_iters, every = Path(flags["out_dir"]), int(flags["max_iters"]), int(flags["eval_interval"])
rate, end = float(flags.get("learning_rate", "0.1")), flags.get("end", "finish")
end = "diverge" if flags["seed"] in flags.get("diverge_seeds", "").split(",") else end
asked = []
signal.signal(signal.SIGINT, lambda n, f: asked.append("SIGINT"))
on_term = signal.SIG_IGN if "ignore_sigterm" in flags else lambda n, f: asked.append("SIGTERM")
signal.signal(signal.SIGTERM, on_term)
out.mkdir(parents=True, exist_ok=True)
settings = {"batch_size": 2, "gradient_accumulation_steps": 1, "block_size": 8}
settings |= {k: flags[k] for k in ("data_dir", "dataset") if k in flags}
(out / "manifest.tmp").write_text(json.dumps({"settings": settings, "git_commit": "fake"}))
os.replace(out / "manifest.tmp", out / "manifest.json")
with open(out / "log.jsonl", "w") as log:
    for it in range(0, max_iters + 1, every):
        if it:
            log.write(json.dumps({"iter": it, "ms_per_iter": 10.0, "step_loss": 1.0}) + "\n")
        val = {"iter": it, "val_loss": 4 / (1 + rate * it), "train_loss": 1.0}
        log.write(json.dumps(val) + "\n")
        log.flush()
        if it == every and end != "finish":
            break
(out / "pid").write_text(str(os.getpid()))
while "after" in flags and not Path(flags["after"]).exists():
    time.sleep(0.02)
if end == "diverge":
    sys.exit(f"error: 3 steps in a row with a non-finite loss or gradient norm (max_bad_steps=3): "
             f"stopped at iter {every + 3}; no checkpoint was saved in {out}")
if end == "fail":
    sys.exit("error: the stand-in fails")
if end == "sleep":
    print("sleeping", flush=True)
    while not asked:
        time.sleep(0.02)
    print(f"stopped by {asked[0]} after iter {every}, before any checkpoint: nothing to resume "
          "(start it again)")
"""


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A checkout whose train.py is FAKE_TRAIN (a fraction of a second a run): lab/ copied, the
    modules the benchmark imports linked, and config/ of its own."""
    root = tmp_path / "checkout"
    (root / "lab").mkdir(parents=True)
    (root / "config").mkdir()
    for path in (ROOT / "lab").glob("*.py"):
        shutil.copy(path, root / "lab" / path.name)
    for name in ("configurator.py", "model.py", "nanogpt_perf"):
        (root / name).symlink_to(ROOT / name)
    (root / "train.py").write_text(FAKE_TRAIN)
    return root


def fake_flags(root: Path, sets: dict[str, list[str]], *flags: str) -> list[str]:
    """The benchmark's command in root for one set of configurations (SETS' 's'), 4 iterations, an
    eval every 2."""
    (root / "configs.py").write_text(f"TASKS = {{'fake': []}}\nSETS = {{'s': {sets!r}}}\n")
    return [
        str(root / SCRIPT),
        f"--configs={root / 'configs.py'}",
        "--task=fake",
        "--config_set=s",
        "--seeds=1",
        "--max_iters=4",
        "--eval_interval=2",
        "--eval_iters=1",
        f"--out={root / 'out'}",
        *flags,
    ]


def run_fake(root: Path, sets: dict[str, list[str]], *flags: str) -> subprocess.CompletedProcess:
    """The benchmark in root, in this process (torch is imported already), its runs the stand-in's
    processes."""
    result = run_in_process(*fake_flags(root, sets, *flags), cwd=root)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result


def reused(root: Path) -> dict[str, bool]:
    return {f"{r['config']} s{r['seed']}": r["reused"] for r in read_doc(root)["runs"]}


def read_doc(root: Path) -> dict:
    return json.loads((root / "out" / "time_to_loss.json").read_text())


def test_an_edited_config_file_runs_its_configurations_again_and_no_other(checkout):
    (checkout / "config" / "lr.py").write_text("learning_rate = 0.1\n")
    sets = {"a": ["config/lr.py"], "b": ["--learning_rate=0.2"]}
    run_fake(checkout, sets, "--seeds=2")
    assert reused(checkout) == {
        "a s1337": False,
        "b s1337": False,
        "a s1338": False,
        "b s1338": False,
    }
    # same command, other contents
    (checkout / "config" / "lr.py").write_text("learning_rate = 0.3\n")
    run_fake(checkout, sets, "--seeds=2")
    assert reused(checkout) == {
        "a s1337": False,
        "b s1337": True,
        "a s1338": False,
        "b s1338": True,
    }


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_an_edit_of_train_py_runs_everything_again_committed_or_not(checkout):
    """(The code's digest, committed or not, edits that are not code:
    test_the_code_digest_is_the_code_on_disk...)"""
    git(checkout, "init", "-q")
    git(checkout, "add", ".")
    git(checkout, "commit", "-qm", "the code")
    sets = {"a": [], "b": ["--learning_rate=0.2"]}
    run_fake(checkout, sets)
    (checkout / "train.py").write_text(FAKE_TRAIN + "# an edit, not committed\n")
    run_fake(checkout, sets)
    assert reused(checkout) == {"a s1337": False, "b s1337": False}
    git(checkout, "commit", "-qam", "the edit")  # the same code, committed
    (checkout / "docs").mkdir()
    (checkout / "docs" / "notes.md").write_text("no code\n")  # neither is this
    run_fake(checkout, sets)
    assert reused(checkout) == {"a s1337": True, "b s1337": True}


def prepare_chars(folder: Path, text: str) -> None:
    from data.shakespeare_char.prepare import prepare

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "input.txt").write_text(text * 200)
    prepare(folder)


def test_a_dataset_prepared_again_from_other_text_runs_its_configurations_again(checkout):
    data = checkout / "data"
    prepare_chars(data / "chars", "To be, or not to be: that is the question. Whether 'tis...\n")
    sets = {"a": [f"--data_dir={data}", "--dataset=chars"], "b": []}
    run_fake(checkout, sets)
    assert set(read_doc(checkout)["runs"][0]["data"]) == {"meta.pkl", "train.bin", "val.bin"}
    run_fake(checkout, sets)
    assert reused(checkout) == {"a s1337": True, "b s1337": True}
    for path in (data / "chars").iterdir():  # the same contents written again: the same data
        path.write_bytes(path.read_bytes())
    run_fake(checkout, sets)
    assert reused(checkout) == {"a s1337": True, "b s1337": True}
    (data / "chars" / "input.txt").unlink()
    prepare_chars(data / "chars", "ab ba\n")  # the same command, another vocabulary: other data
    run_fake(checkout, sets)
    assert reused(checkout) == {"a s1337": False, "b s1337": True}
    run_fake(checkout, sets)
    assert reused(checkout) == {"a s1337": True, "b s1337": True}


def ended_within(process: subprocess.Popen, seconds: float = 90) -> subprocess.CompletedProcess:
    """ended(process), or the test fails, the process killed, where it has not ended in seconds."""
    try:
        stdout, stderr = process.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail(f"still going after {seconds} s: it hangs")
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def test_a_fifo_named_py_in_a_checkout_without_git_is_never_waited_on(checkout):
    not_files(checkout / "pkg")
    result = ended_within(start(*fake_flags(checkout, {"a": []}), cwd=checkout))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "1 runs (0 reused)" in result.stdout


def test_what_is_not_a_file_in_a_run_folder_is_never_waited_on_nor_written_through(checkout):
    run_fake(checkout, {"a": []})
    run = checkout / "out" / "runs" / "a-s1337"
    for name in ("ttl_run.json", "manifest.json"):  # (log.jsonl: the next test; train.py's own)
        (run / name).unlink()
        os.mkfifo(run / name)
    mine = checkout / "mine.txt"
    mine.write_text("kept\n")
    (run / "train.out").unlink()
    (run / "train.out").symlink_to(mine)
    result = ended_within(start(*fake_flags(checkout, {"a": []}), cwd=checkout))
    assert result.returncode == 0, result.stderr[-2000:]
    assert reused(checkout) == {"a s1337": False}  # no mark to read: run again
    assert mine.read_text() == "kept\n" and not (run / "train.out").is_symlink()
    for name in ("ttl_run.json", "train.out"):
        (run / name).unlink()
        (run / name).mkdir()
        result = ended_within(start(*fake_flags(checkout, {"a": []}), cwd=checkout))
        assert_one_line_error(result, f"run 'a' seed 1337: cannot start it in {run}: {run / name}")
        (run / name).rmdir()


def test_a_fifo_for_a_log_or_an_output_is_never_waited_on(tmp_path):
    run = {"command": ["--seed=1"], "code": "c0de"}
    write_log(tmp_path, records([4.0, 3.0, 2.0]))
    mark_finished(tmp_path, run, {"outcome": "finished"})
    for name in ("log.jsonl", "train.out"):
        (tmp_path / name).unlink(missing_ok=True)
        os.mkfifo(tmp_path / name)
    assert within(20, lambda: finished(tmp_path, run, 50), tmp_path / "log.jsonl") is None
    said = within(20, lambda: outcome(0, tmp_path, 50), tmp_path / "train.out")
    assert said == ("stopped", "(no output)")  # no log to say it finished


@pytest.mark.parametrize("where", ["configs", "train_args"])
def test_a_fifo_for_a_config_file_is_one_error_line(tmp_path, where):
    fifo = tmp_path / "fifo.py"
    os.mkfifo(fifo)
    configs = configs_file(tmp_path, tmp_path / "data") if where == "train_args" else fifo
    flags = [f"--configs={configs}", "--task=tiny", "--config_set=two"]
    flags += [f"--train_args={fifo}"] if where == "train_args" else []
    result = run_script(SCRIPT, *flags, timeout=90)
    assert_one_line_error(result, f"config file {fifo} is not a file")


def test_a_sweep_over_lr_decay_iters_applies_when_the_schedule_is_left_to_the_configurations(
    checkout,
):
    result = run_fake(checkout, {"a": []}, "--fit_schedule=False", "--sweep=lr_decay_iters=10,20")
    commands = {r["config"]: r["command"] for r in read_doc(checkout)["runs"]}
    for value in ("10", "20"):
        flags = [
            f for f in commands[f"a lr_decay_iters={value}"] if f.startswith("--lr_decay_iters=")
        ]
        assert flags == [f"--lr_decay_iters={value}"]
    assert "lr_decay_iters=10" in result.stdout and "lr_decay_iters=20" in result.stdout


def test_diverging_seeds_are_never_and_the_tables_still_print(checkout):
    sets = {"base": [], "flaky": ["--diverge_seeds=1338"]}
    result = run_fake(checkout, sets, "--seeds=3", "--sweep=learning_rate=0.1,0.3")
    doc = read_doc(checkout)
    # seed-major
    assert [r["started_at"] for r in doc["runs"]] == sorted(r["started_at"] for r in doc["runs"])
    assert [(r["config"], r["seed"]) for r in doc["runs"][:4]] == [
        (c, 1337) for c in doc["configurations"]
    ]
    rows = doc["summary"]["rows"]
    # the target: base at 0.1's final val loss, which flaky at 0.3 reaches sooner, in two seeds of
    # three
    assert rows["flaky learning_rate=0.3"]["tokens_to_target"]["reached"] == 2
    assert rows["flaky learning_rate=0.3"]["tokens_to_target"]["max"] is None
    assert rows["flaky learning_rate=0.3"]["final_val_loss"]["reached"] == 2
    assert rows["base learning_rate=0.3"]["tokens_to_target"]["reached"] == 3
    assert "| flaky learning_rate=0.3 |     2/3 |" in result.stdout
    swept = [
        line.split("|")[1:-1] for line in result.stdout.splitlines() if line.startswith("| flaky  ")
    ]
    assert [[cell.strip() for cell in row] for row in swept] == [
        ["flaky", "learning_rate=0.1", "2.8571 [2.8571, -]", "1/3 diverged"],
        ["flaky", "learning_rate=0.3", "1.8182 [1.8182, -]", "best, 1/3 diverged"],
    ]  # the sweep's table: a seed that diverged has no final val loss
    assert (
        "diverged (non-finite steps; 'never', with no final val loss): flaky learning_rate=0.1 "
        "seed 1338, "
        "flaky learning_rate=0.3 seed 1338" in result.stdout
    )
    assert "diverged (non-finite steps): never" in result.stdout  # its line as it ended
    again = run_fake(checkout, sets, "--seeds=3", "--sweep=learning_rate=0.1,0.3")
    assert "12 runs (12 reused)" in again.stdout  # a diverged run is a run: reused as the others


def test_a_baseline_that_diverged_leaves_no_target_and_the_table_prints(checkout):
    result = run_fake(checkout, {"base": ["--diverge_seeds=1337"], "other": []})
    assert "no target: most seeds of the baseline 'base' diverged" in result.stdout
    assert "| other         |     0/1 |            never |" in result.stdout
    assert read_doc(checkout)["summary"]["target"] is None


# ----------------------------------------------------------------- signals, and runs that end early


def default_sigint() -> None:
    """In the benchmark's process, before it starts: SIGINT as a terminal's process has it (a CI job
    started with `&` ignores it, and Python keeps that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(*args: str, cwd: Path = ROOT, **popen) -> subprocess.Popen:
    """The benchmark started as a terminal starts it: no torchrun variables, SIGINT its default."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=cwd,
        text=True,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=default_sigint,
        **popen,
    )


def ended(process: subprocess.Popen) -> subprocess.CompletedProcess:
    stdout, stderr = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def wait_for(ready, what: str) -> None:
    deadline = time.monotonic() + 120
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def sleeping_child(root: Path, name: str) -> int:
    """The pid of configuration name's stand-in train.py (seed 1337), once it sleeps."""
    out_dir = root / "out" / "runs" / f"{name}-s1337"
    wait_for(
        lambda: (
            "sleeping"
            in ((out_dir / "train.out").read_text() if (out_dir / "train.out").exists() else "")
        ),
        f"{name} to start",
    )
    return int((out_dir / "pid").read_text())


@pytest.mark.parametrize(
    "sig, group", [(signal.SIGTERM, False), (signal.SIGINT, False), (signal.SIGINT, True)]
)
def test_sigterm_or_ctrl_c_stops_the_running_train_py_and_says_so(checkout, sig, group):
    """group: Ctrl-C in a terminal, which reaches the benchmark and its train.py at once."""
    flags = fake_flags(checkout, {"done": [], "sleepy": ["--end=sleep"]})
    bench = start(*flags, cwd=checkout, start_new_session=True)
    child = sleeping_child(checkout, "sleepy")
    if group:
        os.killpg(bench.pid, sig)
    else:
        bench.send_signal(sig)
    result = ended(bench)
    assert not process_alive(child)
    runs = checkout / "out" / "runs"
    line = "stopped run 'sleepy' seed 1337, not finished; 1 of 2 runs finished and kept "
    line += "(the same command reuses them)"
    if not group:  # (in a group, train.py may have stopped before the benchmark would stop it)
        name = signal.Signals(sig).name
        assert result.stderr.startswith(
            f"{name}: stopping run 'sleepy' seed 1337 (SIGTERM to train.py; killed in 30"
        )
    if sig == signal.SIGTERM:
        assert result.returncode == 143 and result.stderr.strip().endswith(
            f"stopped by SIGTERM: {line}"
        )
    else:
        assert result.returncode == -signal.SIGINT and result.stderr.strip().endswith(
            f"interrupted (Ctrl-C): {line}"
        )
    assert "Traceback" not in result.stderr
    # asked to stop, as train.py is
    said = f"stopped by {'SIGINT' if group else 'SIGTERM'} after iter 2"
    assert said in (runs / "sleepy-s1337" / "train.out").read_text()
    assert (runs / "done-s1337" / "ttl_run.json").is_file() and not (
        runs / "sleepy-s1337" / "ttl_run.json"
    ).exists()
    assert not (checkout / "out" / "time_to_loss.json").exists()


def test_a_second_signal_kills_a_train_py_that_does_not_stop(checkout):
    bench = start(
        *fake_flags(checkout, {"sleepy": ["--end=sleep", "--ignore_sigterm=1"]}), cwd=checkout
    )
    child = sleeping_child(checkout, "sleepy")
    bench.send_signal(signal.SIGTERM)
    assert bench.stderr.readline().startswith("SIGTERM: stopping run 'sleepy' seed 1337")
    assert process_alive(child)  # it ignores SIGTERM
    bench.send_signal(signal.SIGTERM)
    result = ended(bench)
    assert result.returncode == 143 and not process_alive(child)
    assert (
        result.stderr.strip()
        == "stopped by SIGTERM: stopped run 'sleepy' seed 1337, not finished; 0 of 1 runs "
        "finished and kept (the same command reuses them)"
    )
    # killed
    assert (
        "stopped by" not in (checkout / "out" / "runs" / "sleepy-s1337" / "train.out").read_text()
    )


@pytest.mark.parametrize(
    "sig, said",
    [
        (signal.SIGTERM, "train.py was stopped (stopped by SIGTERM after iter 2, before any "
                         "checkpoint: nothing to resume (start it again)) before max_iters=4"),
        pytest.param(signal.SIGINT, "train.py was stopped (stopped by SIGINT after iter 2",
                     marks=pytest.mark.slow),
        (signal.SIGKILL, "train.py was killed by SIGKILL before max_iters=4"),
    ],
)  # fmt: skip
def test_a_train_py_stopped_or_killed_from_elsewhere_is_not_a_finished_run(checkout, sig, said):
    bench = start(*fake_flags(checkout, {"sleepy": ["--end=sleep"]}), cwd=checkout)
    os.kill(sleeping_child(checkout, "sleepy"), sig)
    assert_one_line_error(
        ended(bench), f"run 'sleepy' seed 1337: {said}", "not a finished run, not kept"
    )
    assert not (checkout / "out" / "runs" / "sleepy-s1337" / "ttl_run.json").exists()
    assert not (checkout / "out" / "time_to_loss.json").exists()


def test_a_failed_run_stops_the_runs_going_with_it(checkout):
    sleepy = checkout / "out" / "runs" / "sleepy-s1337"
    sets = {"sleepy": ["--end=sleep"], "broken": ["--end=fail", f"--after={sleepy / 'pid'}"]}
    bench = start(*fake_flags(checkout, sets, "--jobs=2"), cwd=checkout)
    child = sleeping_child(checkout, "sleepy")
    result = ended(bench)
    assert_one_line_error(
        result,
        "run 'broken' seed 1337 failed (exit 1): error: the stand-in fails",
        "; stopped with it: run 'sleepy' seed 1337",
    )
    assert (
        not process_alive(child)
        and "stopped by SIGTERM after iter 2" in (sleepy / "train.out").read_text()
    )


# ----------------------------------------------------------------------------- the real train.py


# the stand-in's: test_a_train_py_stopped_or_killed_from_elsewhere_is_not_a_finished_run
@pytest.mark.slow
def test_a_real_train_py_stopped_by_sigterm_is_not_a_finished_run(tmp_path, tiny_data):
    out, configs = tmp_path / "out", configs_file(tmp_path, tiny_data)
    flags = [
        "--task=tiny",
        "--config_set=two",
        "--only=slow",
        "--seeds=1",
        "--max_iters=100000",
        "--eval_interval=50",
    ]
    bench = start(
        SCRIPT, f"--configs={configs}", *flags, "--eval_iters=1", f"--out={out}", "--threads=1"
    )
    run = out / "runs" / "slow-s1337"
    wait_for(
        lambda: (run / "log.jsonl").exists() and '"ms_per_iter"' in (run / "log.jsonl").read_text(),
        "a step",
    )
    # train.py's own, as a scheduler
    os.kill(json.loads((run / "train.lock").read_text())["pid"], signal.SIGTERM)
    assert_one_line_error(
        ended(bench),
        "run 'slow' seed 1337: train.py was stopped (stopped by SIGTERM after iter",
        "before max_iters=100000: not a finished run, not kept",
    )
    assert not (run / "ttl_run.json").exists() and not (out / "time_to_loss.json").exists()
    # the checkpoint it saved as it stopped: the next call starts afresh
    assert not list(run.glob("ckpt*.pt"))


def test_a_real_run_that_diverges_is_never_and_the_table_prints(tmp_path, tiny_data):
    task = [*TINY_MODEL, f"--data_dir={tiny_data}", "--dataset=tiny", "--warmup_iters=0"]
    # the weights overflow at once
    sets = {"wild": {"wild": ["--learning_rate=1e30", "--max_bad_steps=2"]}}
    (tmp_path / "configs.py").write_text(f"TASKS = {{'tiny': {task!r}}}\nSETS = {sets!r}\n")
    result = run_in_process(
        SCRIPT,
        f"--configs={tmp_path / 'configs.py'}",
        "--task=tiny",
        "--config_set=wild",
        "--seeds=1",
        "--max_iters=6",
        "--eval_interval=2",
        "--eval_iters=1",
        f"--out={tmp_path / 'out'}",
        "--threads=1",
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "| wild          |     0/1 |            never |" in result.stdout
    assert (
        "diverged (non-finite steps; 'never', with no final val loss): wild seed 1337"
        in result.stdout
    )
    (run,) = json.loads((tmp_path / "out" / "time_to_loss.json").read_text())["runs"]
    assert run["outcome"] == "diverged" and "2 steps in a row with a non-finite loss" in run["said"]


# ----------------------------------------------------------------------------- from any folder


def without_the_install() -> dict[str, str]:
    """The environment of a python that has the packages but not this checkout's editable install (a
    user who never ran pip install -e .): with -S, site-packages on PYTHONPATH, whose .pth files are
    not read."""
    paths = dict.fromkeys(sysconfig.get_paths()[kind] for kind in ("purelib", "platlib"))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    return env | {"PYTHONPATH": os.pathsep.join(paths)}


def run_from(script: Path, cwd: Path) -> subprocess.CompletedProcess:
    shown = script.name if script.parent == cwd else str(script)
    return subprocess.run(
        [sys.executable, "-S", shown, "--help"],
        cwd=cwd,
        env=without_the_install(),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    "module, where",
    [("ttl_curves.py", "its folder"), ("ttl_curves.py", "another"), ("ttl_runs.py", "its folder")],
)  # every script from both: test_every_script_runs_from_any_folder (slow)
def test_the_time_to_loss_modules_say_what_they_are_from_any_folder(tmp_path, module, where):
    script = ROOT / "lab" / module
    result = run_from(script, script.parent if where == "its folder" else tmp_path)
    assert_one_line_error(result, f"{module} is a module of lab/time_to_loss.py: run that one")


SCRIPTS = sorted(
    str(p.relative_to(ROOT)) for pattern in ("lab/*.py", "scripts/*.py", "data/*/prepare.py")
    for p in ROOT.glob(pattern)
)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_runs_from_any_folder(tmp_path, script):
    for cwd in (ROOT / script).parent, tmp_path:
        result = run_from(ROOT / script, cwd)
        assert "Traceback" not in result.stderr, result.stderr
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 0 or (len(lines) == 1 and "is a module of" in lines[0]), (
            result.stderr
        )
