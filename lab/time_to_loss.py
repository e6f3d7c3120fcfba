"""Time to a loss: the tokens and the training seconds each configuration takes to reach a target
val loss (by default the baseline's final one), over several seeds, each run a train.py subprocess.

    python lab/time_to_loss.py --sweep=learning_rate=3e-3,2e-3,1e-3   # AdamW's best lr, CPU demo
    python lab/time_to_loss.py --config_set=recipe --max_iters=2000   # baseline, recipe, minus each
    python lab/time_to_loss.py --config_set=recipe --task=kjv_char    # text the tuning never saw

The configurations are named in lab/ttl_configs.py: tasks (the data and the model's shape) and sets
of configurations (train.py's config files and flags), the first of a set the baseline. Runs go
seed-major, so that drift in the machine's speed touches all alike, one at a time by default. Every
run evaluates every eval_interval iterations on the same eval_iters windows; its seconds are
training seconds, the sum of train.py's logging windows (log_interval = eval_interval), evals and
checkpoint writes left out. A crossing is interpolated linearly between the evals around it.

Writes OUT/time_to_loss.json (every run's curve, the summary), .csv (the summary) and .png (val loss
against tokens and against seconds, the median over seeds, the seeds' range as a band), and prints
the tables. A run already finished in its out_dir is reused where everything that made it is the
same (lab/ttl_runs.py), so an interrupted benchmark resumes; --fresh=True runs everything again. A
run that train.py stops on non-finite steps (diverged) is "never". SIGTERM or Ctrl-C stops the runs
(SIGTERM to each, SIGKILL 30 s later or at a second signal), says which, and ends the benchmark: a
stopped run is never taken as a finished one.
"""

import json
import os
import re
import shlex
import signal
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for its modules

from configurator import configure, read_config_file
from lab.charts import loss_curves
from lab.plot import read_log
from lab.ttl_curves import (
    median_curve,
    print_report,
    run_curve,
    run_line,
    seed_major,
    summarize,
    summary_csv,
    sweep_summary,  # noqa: I001
)
from lab.ttl_runs import (
    COUNTED,
    MARK,
    Runs,
    catch_signals,
    dataset_content,
    finished,
    mark_finished,
    outcome,
    run_identity,
)
from nanogpt_perf.config import Config, setting
from nanogpt_perf.errors import UserError
from nanogpt_perf.files import ReadFailed, read_file, write_json, write_text
from nanogpt_perf.guard.paths import a_path
from nanogpt_perf.manifest import git_state

ROOT = Path(__file__).resolve().parents[1]


# -----------------------------------------------------------------------------
def a_sweep(value: str) -> None:
    if value and not re.fullmatch(r"\w+=[^,]+(,[^,]+)*", value):
        raise ValueError("'' or KEY=V1,V2,...")


def no_nul(value: str) -> None:
    if "\0" in value:
        raise ValueError("a path without a NUL character")


@dataclass
class TimeToLossConfig:
    """Settings of lab/time_to_loss.py: the configurations, the runs and where the results go"""

    configs: str = setting("lab/ttl_configs.py", "a Python file naming TASKS and SETS of "
                           "configurations (train.py arguments)", check=a_path)  # fmt: skip
    task: str = setting(
        "char", "a task of that file: the data and model shape every configuration starts from"
    )
    config_set: str = setting(
        "adamw", "a set of that file: its configurations, the first being the baseline"
    )
    only: str = setting("", "comma-separated configurations of the set to run, the first the "
                        "baseline ('' = all, in the file's order)")  # fmt: skip
    train_args: str = setting("", "more train.py arguments for every run, after the "
                              "configuration's own (shell-quoted)")  # fmt: skip
    sweep: str = setting("", "'KEY=V1,V2,...': every configuration at each value of one train.py "
                         "setting, e.g. learning_rate=3e-3,1e-3", check=a_sweep)  # fmt: skip
    seeds: int = setting(3, "seeds per configuration: first_seed, first_seed + 1, ...; at most "
                         "1,000", min=1, max=1_000)  # fmt: skip
    first_seed: int = setting(1337, "the first run's seed", min=0)
    max_iters: int = setting(
        600, "the horizon: every run's max_iters (and lr_decay_iters, with fit_schedule)", min=1
    )
    fit_schedule: bool = setting(
        True, "lr_decay_iters = max_iters: the schedule ends with the run at every horizon"
    )
    eval_interval: int = setting(25, "iterations between evals (and logging windows): the "
                                 "crossing's resolution", min=1)  # fmt: skip
    eval_iters: int = setting(20, "batches per split at each eval, the same windows every time; at "
                              "most 1,000,000 (as train.py)", min=1, max=1_000_000)  # fmt: skip
    target: float = setting(0.0, "the val loss to reach; 0 = the baseline's final val loss, median "
                            "over its seeds",
                            min=0, note=" (0 = the baseline's final val loss)")  # fmt: skip
    jobs: int = setting(1, "runs at a time", min=1)
    threads: int = setting(0, "torch's threads per run (OMP_NUM_THREADS); 0 = torch's default "
                           "with jobs=1, else cores // jobs", min=0, note=" (0 = torch's "
                           "default with jobs=1, else cores // jobs)")  # fmt: skip
    fresh: bool = setting(
        False, "run again even where a finished run of the same command is in its out_dir"
    )
    keep_checkpoints: bool = setting(False, "keep each run's checkpoints (deleted once it has "
                                     "finished: only its log is read)")  # fmt: skip
    out: str = setting("", "the results folder, runs in OUT/runs/; '' = "
                       "out-ttl/TASK-SET-MAX_ITERS[-sweep-KEY]", check=no_nul)  # fmt: skip


def eval_within_the_run(cfg: Config) -> None:
    if cfg.eval_interval > cfg.max_iters:
        raise ValueError(
            f"eval_interval must be <= max_iters ({cfg.max_iters}), not {cfg.eval_interval}"
        )


cfg = configure(ttl=TimeToLossConfig, cross=(eval_within_the_run,))
# -----------------------------------------------------------------------------


def owned(
    out_dir: Path | str = "OUT/runs/NAME-sSEED", seed: int | str = "SEED"
) -> dict[str, tuple[Any, str]]:
    """The train.py settings the benchmark sets in every run, after the configuration's (they win):
    key -> (value, what sets it). A configuration, --train_args or --sweep that sets one is refused:
    it would change nothing."""
    schedule = {
        "lr_decay_iters": (
            cfg.max_iters,
            "--max_iters, with --fit_schedule=True; False leaves it to you",
        )
    }
    return {
        "out_dir": (out_dir, "--out: each run has its own folder in it"),
        "overwrite": (True, "a run that is not reused starts afresh"),
        "seed": (seed, "--seeds and --first_seed"),
        "max_iters": (cfg.max_iters, "--max_iters"),
        **(schedule if cfg.fit_schedule else {}),
        "eval_interval": (cfg.eval_interval, "--eval_interval"),
        "log_interval": (cfg.eval_interval, "--eval_interval: every eval closes a logging window"),
        "eval_iters": (cfg.eval_iters, "--eval_iters"),
        "always_save_checkpoint": (
            False,
            "only the log is read; --keep_checkpoints keeps the best ones",
        ),
    }


def command(args: list[str], out_dir: Path, seed: int) -> list[str]:
    """train.py's arguments for one run: the configuration's, then the benchmark's (which win)."""
    return [*args, *(f"--{key}={value}" for key, (value, _) in owned(out_dir, seed).items())]


def check_arguments(where: str, args: list[Any]) -> None:
    """A UserError where args are not train.py arguments, name a missing config file or set a
    setting the benchmark owns."""
    if not all(isinstance(a, str) for a in args):
        raise UserError(f"{where}: train.py arguments must be strings, got {args!r}")
    if missing := [a for a in args if not a.startswith("--") and not (ROOT / a).is_file()]:
        said = "is not a file" if (ROOT / missing[0]).exists() else "not found"
        raise UserError(f"{where}: config file {missing[0]} {said} (paths from {ROOT})")
    mine = owned()
    if taken := [
        key for a in args if a.startswith("--") and (key := a[2:].partition("=")[0]) in mine
    ]:
        raise UserError(
            f"{where} sets {taken[0]}, which the benchmark sets itself in every run "
            f"({mine[taken[0]][1]})"
        )


def named_lists() -> tuple[list[Any], dict[str, list[Any]]]:
    """The task's train.py arguments and the chosen configurations' (the set's or --only's, the
    first the baseline), as the configurations file names them."""
    path = (
        cfg.configs
        if Path(cfg.configs).is_file() or not (ROOT / cfg.configs).is_file()
        else str(ROOT / cfg.configs)
    )
    named = read_config_file(path)
    tasks, sets = named.get("TASKS"), named.get("SETS")
    if not isinstance(tasks, dict) or not isinstance(sets, dict):
        raise UserError(
            f"{cfg.configs} must define TASKS and SETS, dicts of train.py arguments (see "
            "ttl_configs.py)"
        )
    if cfg.task not in tasks or cfg.config_set not in sets:
        which = f"task {cfg.task!r}: one of {', '.join(tasks)}" if cfg.task not in tasks else ""
        which = which or f"config_set {cfg.config_set!r}: one of {', '.join(sets)}"
        raise UserError(f"{cfg.configs} has no {which}")
    chosen = sets[cfg.config_set]
    if not isinstance(chosen, dict) or not chosen:
        raise UserError(
            f"{cfg.configs}: set {cfg.config_set!r} must be a dict of configurations (name: "
            "train.py "
            f"arguments) with one at least, its baseline, not {chosen!r}"
        )
    names = [n.strip() for n in cfg.only.split(",")] if cfg.only else list(chosen)
    if missing := [n for n in names if n not in chosen]:
        raise UserError(
            f"set {cfg.config_set!r} has no configuration {missing[0]!r}: one of "
            f"{', '.join(chosen)}"
        )
    lists = {f"task {cfg.task!r}": tasks[cfg.task]} | {
        f"configuration {n!r}": chosen[n] for n in names
    }
    if wrong := [where for where, args in lists.items() if not isinstance(args, list | tuple)]:
        raise UserError(f"{cfg.configs}: {wrong[0]} must be a list of train.py arguments")
    return list(tasks[cfg.task]), {n: list(chosen[n]) for n in names}


def configurations() -> dict[str, list[str]]:
    """The runs' configurations, name -> train.py arguments (task's, configuration's, --train_args):
    the set's (or --only's), each at every --sweep value; the first is the baseline."""
    task_args, lists = named_lists()
    try:
        extra = shlex.split(cfg.train_args)
    except ValueError as e:
        raise UserError(
            f"train_args {cfg.train_args!r} cannot be split as a shell would ({e}): close its "
            "quotes"
        ) from None
    check_arguments(f"task {cfg.task!r}", task_args)
    for name, args in lists.items():
        check_arguments(f"configuration {name!r}", args)
    check_arguments("--train_args", extra)
    chosen = {n: [*task_args, *args, *extra] for n, args in lists.items()}
    if cfg.sweep:
        key, listed = cfg.sweep.split("=", 1)
        if key in owned():
            raise UserError(
                f"--sweep over {key}: the benchmark sets {key} itself in every run "
                f"({owned()[key][1]}), "
                "so every value would run the same command"
            )
        values = [v.strip() for v in listed.split(",")]
        chosen = {
            f"{n} {key}={v}": [*args, f"--{key}={v}"] for n, args in chosen.items() for v in values
        }
    folders = [folder_name(n) for n in chosen]
    if len(set(folders)) < len(folders):
        raise UserError(f"configuration names {', '.join(chosen)} share a folder name: rename one")
    return chosen


def folder_name(name: str) -> str:
    return re.sub(r"[^\w.=-]+", "_", name)


def results_folder() -> Path:
    """--out (or its default), made with its runs/ folder."""
    swept = f"-sweep-{cfg.sweep.split('=')[0]}" if cfg.sweep else ""
    results = Path(
        cfg.out or f"out-ttl/{cfg.task}-{cfg.config_set}-{cfg.max_iters}{swept}"
    ).resolve()
    if results.exists() and not results.is_dir():
        raise UserError(
            f"out {results} is a file: give a folder (a new one, or the results folder of an "
            "earlier call)"
        )
    try:
        (results / "runs").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(
            f"cannot make the results folder {results / 'runs'}: {e.strerror or e}"
        ) from None
    return results


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    if cfg.threads or cfg.jobs > 1:
        env["OMP_NUM_THREADS"] = str(cfg.threads or max(1, (os.cpu_count() or 1) // cfg.jobs))
    return env


def run_train(
    which: str, cmd: list[str], env: dict[str, str], out_dir: Path, runs: Runs
) -> dict[str, Any] | None:
    """train.py with cmd in out_dir, and what its mark records: when it started, its wall seconds
    and its outcome ('finished', or 'diverged' with the line that said so); None when it was stopped
    with the runs. Any other end (an error, a signal, a stop before max_iters) is a UserError: not a
    run."""
    started, t0 = time.time(), time.perf_counter()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / MARK).unlink(missing_ok=True)  # not a run that counts until it has ended as one
        train_py = [sys.executable, "train.py", *cmd]
        returncode = runs.run(which, train_py, out_dir / "train.out", env, ROOT)
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        reason = f"{where}{e.strerror or e}"
        raise UserError(f"{which}: cannot start it in {out_dir}: {reason}") from None
    if returncode is None:
        return None
    # what the benchmark reads is the log; a run stopped is started afresh
    if not cfg.keep_checkpoints:
        for path in out_dir.glob("ckpt*.pt"):
            path.unlink()
    kind, said = outcome(returncode, out_dir, cfg.max_iters)
    if kind not in COUNTED and runs.stopping:  # stopped (or failed) as the benchmark stopped
        runs.stopped.append(which)
        return None
    output = out_dir / "train.out"
    if kind == "failed":
        raise UserError(f"{which} failed (exit {returncode}): {said} (all of it: {output}; "
                        f"lab/ttl_data.py prepares the datasets)")  # fmt: skip
    if kind not in COUNTED:  # killed, or stopped early (train.py saves and exits 0 on SIGTERM)
        raise UserError(
            f"{which}: train.py was {said if kind == 'killed' else f'stopped ({said})'} before "
            f"max_iters={cfg.max_iters}: not a finished run, not kept (its output: "
            f"{output})"
        )
    ran = {"started_at": started, "wall_s": time.perf_counter() - t0, "outcome": kind}
    return ran | ({"said": said} if kind == "diverged" else {})


def train(
    name: str, seed: int, args: list[str], out_dir: Path, runs: Runs
) -> dict[str, Any] | None:
    """One run of train.py in out_dir, or the one already there that everything the same made: its
    record and its curve; None when the runs were stopped before it ended."""
    cmd, env = command(args, out_dir, seed), environment()
    identity = run_identity(cmd, env.get("OMP_NUM_THREADS"), ROOT)
    identity["data"] = dataset_content(out_dir, ROOT)  # the run there's, as the data is now
    # when reused, the figures of its session
    ran = None if cfg.fresh else finished(out_dir, identity, cfg.max_iters)
    reused = ran is not None
    if ran is None:
        ran = run_train(f"run {name!r} seed {seed}", cmd, env, out_dir, runs)
        if ran is None:
            return None
        identity["data"] = dataset_content(out_dir, ROOT)  # train.py may have prepared it
        mark_finished(out_dir, identity, ran)
    manifest = read_json(out_dir / "manifest.json")
    try:
        shape = manifest["settings"]
        per_iter = shape["batch_size"] * shape["gradient_accumulation_steps"] * shape["block_size"]
    except (KeyError, TypeError):
        raise UserError(
            f"{out_dir / 'manifest.json'} has no batch_size, gradient_accumulation_steps "
            "and block_size in its settings: not a manifest of train.py's"
        ) from None
    curve = run_curve(read_log(out_dir / "log.jsonl"), per_iter, ran["outcome"] == "diverged")
    return {
        "config": name,
        "seed": seed,
        "out_dir": str(out_dir),
        **identity,
        "reused": reused,
        "outcome": ran["outcome"],
        "said": ran.get("said"),
        "git_commit": manifest.get("git_commit"),
        "git_dirty": manifest.get("git_dirty"),
        "started_at": ran.get("started_at"),
        "wall_s": ran.get("wall_s"),
        "curve": curve,
    }


def read_json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(read_file(path))
    except (OSError, ValueError, ReadFailed) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    if not isinstance(doc, dict):
        raise UserError(f"{path} is not a JSON object")
    return doc


def stop_benchmark(name: str, runs: Runs, ended: list[dict[str, Any] | None]) -> None:
    """The benchmark's end at a signal: which runs it stopped, and what it keeps. Ctrl-C ends it as
    a KeyboardInterrupt (its line printed by report_errors), SIGTERM with status 143."""
    which = (
        f"stopped {', '.join(sorted(runs.stopped))}, not finished"
        if runs.stopped
        else "no train.py was going"
    )
    kept = sum(r is not None for r in ended)
    line = f"{which}; {kept} of {len(ended)} runs finished and kept (the same command reuses them)"
    if name == "SIGINT":
        raise KeyboardInterrupt(line)
    print(f"stopped by {name}: {line}", file=sys.stderr, flush=True)
    sys.exit(128 + signal.SIGTERM)


def run_all(chosen: dict[str, list[str]], results: Path) -> list[dict[str, Any]]:
    """Every configuration x seed, seed-major, jobs at a time; each run's line printed as it
    ends."""
    order = seed_major(list(chosen), range(cfg.first_seed, cfg.first_seed + cfg.seeds))
    runs = Runs()

    def one(k: int, name: str, seed: int) -> dict[str, Any] | None:
        if runs.stopping:
            return None
        run = train(
            name, seed, chosen[name], results / "runs" / f"{folder_name(name)}-s{seed}", runs
        )
        if run is not None:
            print(run_line(k, len(order), run), flush=True)
        return run

    before = catch_signals(runs.asked)
    try:
        with ThreadPoolExecutor(max_workers=cfg.jobs) as pool:
            futures = [pool.submit(one, k + 1, name, seed) for k, (name, seed) in enumerate(order)]
            runs.supervise(futures)
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)
    failed = [f.exception() for f in futures if f.exception() is not None]
    if runs.asked:
        stop_benchmark(
            runs.asked[0], runs, [None if f.exception() else f.result() for f in futures]
        )
    if failed and isinstance(failed[0], UserError) and runs.stopped:
        raise UserError(
            f"{failed[0]}; stopped with it: {', '.join(sorted(runs.stopped))}"
        ) from None
    if failed:
        raise failed[0]
    return [f.result() for f in futures]


def main() -> None:
    chosen, results = configurations(), results_folder()
    t0 = time.perf_counter()
    each = f"{cfg.seeds} seeds, {cfg.max_iters} iterations each, {cfg.jobs} at a time"
    print(f"{len(chosen)} configurations x {each}, into {results}")
    runs = run_all(chosen, results)
    wall = time.perf_counter() - t0
    curves = {name: [r["curve"] for r in runs if r["config"] == name] for name in chosen}
    summary = summarize(curves, next(iter(chosen)), cfg.target or None)
    sweep_doc = sweep_summary(cfg.sweep.split("=")[0], curves) if cfg.sweep else None
    commit, dirty = git_state(ROOT)
    doc = {
        "kind": "time_to_loss",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git_commit": commit,
        "git_dirty": dirty,
        "cpu_count": os.cpu_count(),
        "command": sys.argv,
        "settings": cfg.as_dict(),
        "configurations": chosen,
        "wall_s": wall,
        "summary": summary,
        "sweep": sweep_doc,
        "runs": runs,
    }
    write_json(results / "time_to_loss.json", doc)
    write_text(results / "time_to_loss.csv", summary_csv(summary))
    title = f"{cfg.task}, {cfg.config_set}, {cfg.max_iters} iterations, {cfg.seeds} seeds"
    drawn = loss_curves(results / "time_to_loss.png", curves, summary, title, median_curve)
    print_report(summary, bool(cfg.target), sweep_doc, runs)
    walls = [r["wall_s"] for r in runs if r["wall_s"] is not None]
    each = f"; each run {statistics.median(walls):,.0f} s wall, median (as it ran)" if walls else ""
    print(f"{len(runs)} runs ({sum(r['reused'] for r in runs)} reused) in {wall:,.0f} s wall{each}")
    print(f"wrote {results / 'time_to_loss.json'}\nwrote {results / 'time_to_loss.csv'}\n{drawn}")


if __name__ == "__main__":
    main()
