"""Time to a loss: the tokens and the training seconds each configuration takes to reach a target
val loss (by default the baseline's final one), over several seeds, each run a train.py subprocess
(docs/time-to-loss.md says what is measured, how, and what was).

    python lab/time_to_loss.py --sweep=learning_rate=3e-3,2e-3,1e-3   # AdamW's best lr, CPU demo
    python lab/time_to_loss.py --config_set=recipe --max_iters=2000   # baseline, recipe, minus each
    python lab/time_to_loss.py --config_set=recipe --task=kjv_char    # text the tuning never saw

The configurations are named in lab/ttl_configs.py, the first of a set the baseline. Runs go
seed-major, jobs at a time. Writes OUT/time_to_loss.json (every run's curve, the summary) and .png
(val loss against tokens and against training seconds) and prints the tables. A run already
finished in its out_dir is reused where everything that made it is the same (lab/ttl_runs.py).
SIGTERM or Ctrl-C stops the runs (SIGTERM to each, SIGKILL GRACE_S later or at a second signal),
says which, and ends the benchmark: a stopped run is never taken as a finished one.
"""

import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for its modules

from configurator import configure, read_config_file
from lab import ttl_curves, ttl_runs
from lab.charts import loss_curves
from lab.plot import read_log
from nanogpt_perf.config import Config, setting
from nanogpt_perf.errors import UserError
from nanogpt_perf.files import ReadFailed, read_file, write_json
from nanogpt_perf.guard.paths import a_path, optional_path
from nanogpt_perf.manifest import git_state

ROOT = Path(__file__).resolve().parents[1]
GRACE_S = 30  # after SIGTERM, the seconds a run has to finish its step, save and exit


# -----------------------------------------------------------------------------
def a_sweep(value: str) -> None:
    if value and not re.fullmatch(r"\w+=[^,]+(,[^,]+)*", value):
        raise ValueError("'' or KEY=V1,V2,...")


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
                       "out-ttl/TASK-SET-MAX_ITERS[-sweep-KEY]", check=optional_path)  # fmt: skip


def eval_within_the_run(cfg: Config) -> None:
    if cfg.eval_interval > cfg.max_iters:
        raise ValueError(
            f"eval_interval must be <= max_iters ({cfg.max_iters}), not {cfg.eval_interval}"
        )


cfg = configure(ttl=TimeToLossConfig, cross=(eval_within_the_run,))
# -----------------------------------------------------------------------------


def owned(out_dir: Any = None, seed: Any = None) -> dict[str, tuple[Any, str]]:
    """The train.py settings the benchmark sets in every run, after the configuration's (they win):
    key -> (value, what sets it). A configuration, --train_args or --sweep that sets one is refused:
    it would change nothing."""
    mine = {
        "out_dir": (out_dir, "--out: each run has its own folder in it"),
        "overwrite": (True, "a run that is not reused starts afresh"),
        "seed": (seed, "--seeds and --first_seed"),
        "max_iters": (cfg.max_iters, "--max_iters"),
        "lr_decay_iters": (cfg.max_iters, "--max_iters, with --fit_schedule=True (False: yours)"),
        "eval_interval": (cfg.eval_interval, "--eval_interval"),
        "log_interval": (cfg.eval_interval, "--eval_interval: every eval closes a logging window"),
        "eval_iters": (cfg.eval_iters, "--eval_iters"),
        "always_save_checkpoint": (False, "only the log is read"),
    }
    return {k: v for k, v in mine.items() if k != "lr_decay_iters" or cfg.fit_schedule}


def checked(where: str, args: Any) -> list[str]:
    """args, where they are train.py arguments naming no missing config file and setting no
    setting the benchmark owns; else a UserError."""
    if not isinstance(args, list | tuple) or not all(isinstance(a, str) for a in args):
        raise UserError(f"{where} must be a list, its train.py arguments must be strings: {args!r}")
    if missing := [a for a in args if not a.startswith("--") and not (ROOT / a).is_file()]:
        said = "is not a file" if (ROOT / missing[0]).exists() else "not found"
        raise UserError(f"{where}: config file {missing[0]} {said} (paths from {ROOT})")
    mine = owned()
    if taken := [k for a in args if a.startswith("--") and (k := a[2:].partition("=")[0]) in mine]:
        why = mine[taken[0]][1]
        raise UserError(
            f"{where} sets {taken[0]}, which the benchmark sets itself in every run ({why})"
        )
    return list(args)


def configurations() -> dict[str, list[str]]:
    """The runs' configurations, name -> train.py arguments (the task's, the configuration's,
    --train_args'), each checked: the set's (or --only's), each at every --sweep value; the first
    the baseline."""
    here = Path(cfg.configs).is_file() or not (ROOT / cfg.configs).is_file()
    named = read_config_file(cfg.configs if here else str(ROOT / cfg.configs))
    tasks, sets = named.get("TASKS"), named.get("SETS")
    if not isinstance(tasks, dict) or not isinstance(sets, dict):
        raise UserError(f"{cfg.configs} must define TASKS and SETS, dicts of train.py arguments")
    for what, name, known in (("task", cfg.task, tasks), ("config_set", cfg.config_set, sets)):
        if name not in known:
            raise UserError(f"{cfg.configs} has no {what} {name!r}: one of {', '.join(known)}")
    if not isinstance(chosen := sets[cfg.config_set], dict) or not chosen:
        raise UserError(
            f"{cfg.configs}: set {cfg.config_set!r} must be a dict of configurations (name: "
            f"train.py arguments) with one at least, its baseline, not {chosen!r}"
        )
    names = [n.strip() for n in cfg.only.split(",")] if cfg.only else list(chosen)
    if gone := [n for n in names if n not in chosen]:
        known = ", ".join(chosen)
        raise UserError(f"set {cfg.config_set!r} has no configuration {gone[0]!r}: one of {known}")
    try:
        extra = shlex.split(cfg.train_args)
    except ValueError:
        raise UserError(
            f"train_args {cfg.train_args!r} cannot be split as a shell would: close its quotes"
        ) from None
    task, extra = checked(f"task {cfg.task!r}", tasks[cfg.task]), checked("--train_args", extra)
    runs = {n: [*task, *checked(f"configuration {n!r}", chosen[n]), *extra] for n in names}
    if cfg.sweep:
        key, listed = cfg.sweep.split("=", 1)
        flags = checked("--sweep", [f"--{key}={v.strip()}" for v in listed.split(",")])
        runs = {f"{n} {f[2:]}": [*args, f] for n, args in runs.items() for f in flags}
    if len({folder_name(n) for n in runs}) < len(runs):
        raise UserError(f"configuration names {', '.join(runs)} share a folder name: rename one")
    return runs


def folder_name(name: str) -> str:
    return re.sub(r"[^\w.=-]+", "_", name)


def results_folder() -> Path:
    """--out (or its default), made with its runs/ folder."""
    swept = f"-sweep-{cfg.sweep.split('=')[0]}" if cfg.sweep else ""
    results = Path(cfg.out or f"out-ttl/{cfg.task}-{cfg.config_set}-{cfg.max_iters}{swept}")
    if (results := results.resolve()).exists() and not results.is_dir():
        raise UserError(f"out {results} is a file: give a folder (new, or an earlier call's)")
    try:
        (runs := results / "runs").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot make the results folder {runs}: {e.strerror or e}") from None
    return results


def start(name: str, seed: int, args: list[str], results: Path) -> dict[str, Any]:
    """One run: its record where its out_dir holds a finished run that everything the same made
    (when reused, the figures of its session), else its train.py started."""
    out_dir = results / "runs" / f"{folder_name(name)}-s{seed}"
    run = {"config": name, "seed": seed, "out_dir": out_dir, "which": f"run {name!r} seed {seed}"}
    cmd = [*args, *(f"--{k}={v}" for k, (v, _) in owned(out_dir, seed).items())]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    if cfg.threads or cfg.jobs > 1:
        env["OMP_NUM_THREADS"] = str(cfg.threads or max(1, (os.cpu_count() or 1) // cfg.jobs))
    run["identity"] = ttl_runs.run_identity(cmd, env.get("OMP_NUM_THREADS"), ROOT)
    run["identity"]["data"] = ttl_runs.dataset_content(out_dir, ROOT)  # as the data is now
    if not cfg.fresh and (ran := ttl_runs.finished(out_dir, run["identity"], cfg.max_iters)):
        return record(run, ran, reused=True)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / ttl_runs.MARK).unlink(missing_ok=True)  # no run that counts until it ends as one
        # made afresh: a link or a FIFO there is neither written through nor waited on
        (out_dir / "train.out").unlink(missing_ok=True)
        with open(out_dir / "train.out", "x") as out:
            train_py = [sys.executable, "train.py", *cmd]
            run["process"] = subprocess.Popen(train_py, cwd=ROOT, stdout=out, stderr=out, env=env)
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        raise UserError(
            f"{run['which']}: cannot start it in {out_dir}: {where}{e.strerror or e}"
        ) from None
    return run | {"started_at": time.time(), "t0": time.perf_counter()}


def end(run: dict[str, Any], stopping: bool) -> dict[str, Any] | None:
    """The record of a run whose train.py has exited; None where it was stopped with the benchmark.
    Any other end (an error, a signal, a stop before max_iters) is a UserError: not a run."""
    out_dir, returncode = run["out_dir"], run["process"].returncode
    for path in () if cfg.keep_checkpoints else out_dir.glob("ckpt*.pt"):
        path.unlink()  # what the benchmark reads is the log; a run stopped starts afresh
    kind, said = ttl_runs.outcome(returncode, out_dir, cfg.max_iters)
    if kind not in ttl_runs.COUNTED and stopping:
        return None
    output, which = out_dir / "train.out", run["which"]
    if kind == "failed":
        raise UserError(
            f"{which} failed (exit {returncode}): {said} (all of it: {output}; lab/ttl_data.py "
            "prepares the datasets)"
        )
    if kind not in ttl_runs.COUNTED:  # killed, or stopped early (train.py exits 0 on SIGTERM)
        how = said if kind == "killed" else f"stopped ({said})"
        raise UserError(
            f"{which}: train.py was {how} before max_iters={cfg.max_iters}: not a finished run, "
            f"not kept (its output: {output})"
        )
    ran = {"started_at": run["started_at"], "wall_s": time.perf_counter() - run["t0"]}
    ran |= {"outcome": kind, "said": said if kind == "diverged" else None}
    run["identity"]["data"] = ttl_runs.dataset_content(out_dir, ROOT)  # train.py may have made it
    ttl_runs.mark_finished(out_dir, run["identity"], ran)
    return record(run, ran, reused=False)


def record(run: dict[str, Any], ran: dict[str, Any], reused: bool) -> dict[str, Any]:
    """What time_to_loss.json keeps of a run that counts: its identity, outcome and curve."""
    out_dir = run["out_dir"]
    try:
        manifest = json.loads(read_file(out_dir / "manifest.json"))
        shape = manifest["settings"]
        per_iter = shape["batch_size"] * shape["gradient_accumulation_steps"] * shape["block_size"]
    except (OSError, ReadFailed, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{out_dir / 'manifest.json'}: not train.py's manifest ({e})") from None
    log = read_log(out_dir / "log.jsonl")
    curve = ttl_curves.run_curve(log, per_iter, ran["outcome"] == "diverged")
    fields = {"config": run["config"], "seed": run["seed"], "out_dir": str(out_dir)}
    fields |= run["identity"] | {"reused": reused, "said": None} | ran
    return fields | {k: manifest.get(k) for k in ("git_commit", "git_dirty")} | {"curve": curve}


def stop_going(going: dict[int, dict[str, Any]], asked: list[str], deadline: float | None) -> float:
    """At a signal or a failed run: SIGTERM to each train.py going (it finishes its step, saves and
    exits), once; SIGKILL GRACE_S later, or at once at a second signal. Returns the deadline."""
    if deadline is None:
        for run in going.values():
            run["process"].terminate()
        if asked and going:
            which = ", ".join(run["which"] for run in going.values())
            line = f"{asked[0]}: stopping {which} (SIGTERM to train.py; killed in {GRACE_S} s"
            print(f"{line}, or at once at a second signal)", file=sys.stderr, flush=True)
        deadline = time.monotonic() + GRACE_S
    if len(asked) > 1 or time.monotonic() > deadline:
        for run in going.values():
            run["process"].kill()
    return deadline


def stop_benchmark(asked: list[str], failed: UserError | None, names: str, kept: str) -> None:
    """The benchmark's end where it stopped runs (names; '' for none): after a failed run, its error
    and those runs; at a signal, those runs and what it keeps ('3 of 20'): Ctrl-C ends it as a
    KeyboardInterrupt (its line printed by report_errors), SIGTERM with status 143."""
    if not asked:
        raise UserError(f"{failed}; stopped with it: {names}" if names else str(failed))
    which = f"stopped {names}, not finished" if names else "no train.py was going"
    line = f"{which}; {kept} runs finished and kept (the same command reuses them)"
    if asked[0] == "SIGINT":
        raise KeyboardInterrupt(line)
    print(f"stopped by {asked[0]}: {line}", file=sys.stderr, flush=True)
    sys.exit(128 + signal.SIGTERM)


def run_all(chosen: dict[str, list[str]], results: Path) -> list[dict[str, Any]]:
    """Every configuration x seed, seed-major, jobs at a time; each run's line printed as it ends.
    At SIGTERM or Ctrl-C, or once a run has failed, no other starts and those going are stopped."""
    order = [(n, s) for s in range(cfg.first_seed, cfg.first_seed + cfg.seeds) for n in chosen]
    done, going, stopped, asked = {}, {}, [], []
    failed, deadline, k = None, None, 0

    def keep(i: int, run: dict[str, Any]) -> None:
        done[i] = run
        print(ttl_curves.run_line(i, len(order), run), flush=True)

    before = {n: signal.getsignal(n) for n in (signal.SIGTERM, signal.SIGINT)}
    for number in [n for n, handler in before.items() if handler is not signal.SIG_IGN]:
        signal.signal(number, lambda n, _: asked.append(signal.Signals(n).name))
    try:
        while going or (k < len(order) and not (asked or failed)):
            try:
                if k < len(order) and len(going) < cfg.jobs and not (asked or failed):
                    (name, seed), k = order[k], k + 1
                    run = start(name, seed, chosen[name], results)
                    if "process" in run:
                        going[k] = run
                    else:
                        keep(k, run)
                for i, run in [(i, r) for i, r in going.items() if r["process"].poll() is not None]:
                    del going[i]
                    if (ended := end(run, bool(asked or failed))) is None:
                        stopped.append(run["which"])
                    else:
                        keep(i, ended)
            except UserError as e:
                failed = failed or e
            if asked or failed:
                deadline = stop_going(going, asked, deadline)
            time.sleep(0.05)
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)
        for run in going.values():  # (going only where the benchmark itself failed)
            run["process"].kill()
    if asked or failed:
        stop_benchmark(asked, failed, ", ".join(sorted(stopped)), f"{len(done)} of {len(order)}")
    return [done[i] for i in sorted(done)]


def main() -> None:
    chosen, results = configurations(), results_folder()
    t0 = time.perf_counter()
    each = f"{cfg.seeds} seeds, {cfg.max_iters} iterations each, {cfg.jobs} at a time"
    print(f"{len(chosen)} configurations x {each}, into {results}")
    runs = run_all(chosen, results)
    wall = time.perf_counter() - t0
    curves = {name: [r["curve"] for r in runs if r["config"] == name] for name in chosen}
    summary = ttl_curves.summarize(curves, next(iter(chosen)), cfg.target or None)
    sweep = ttl_curves.sweep_summary(cfg.sweep.split("=")[0], curves) if cfg.sweep else None
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
        "sweep": sweep,
        "runs": runs,
    }
    write_json(results / "time_to_loss.json", doc)
    title = f"{cfg.task}, {cfg.config_set}, {cfg.max_iters} iterations, {cfg.seeds} seeds"
    drawn = loss_curves(
        results / "time_to_loss.png", curves, summary, title, ttl_curves.median_curve
    )
    ttl_curves.print_report(summary, bool(cfg.target), sweep, runs)
    reused, each = sum(r["reused"] for r in runs), statistics.median(r["wall_s"] for r in runs)
    print(f"{len(runs)} runs ({reused} reused) in {wall:,.0f} s wall; each {each:,.0f} s, median")
    print(f"wrote {results / 'time_to_loss.json'}\n{drawn}")


if __name__ == "__main__":
    main()
