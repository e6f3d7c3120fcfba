"""
Time to a loss: the tokens and the training seconds each configuration takes to reach a target val loss (by default
the baseline's final one), over several seeds, each run a train.py subprocess.

    python benchmarks/time_to_loss.py --sweep=learning_rate=3e-3,2e-3,1e-3     # AdamW's best lr on the CPU demo
    python benchmarks/time_to_loss.py --config_set=recipe --max_iters=2000     # baseline, recipe, recipe minus each
    python benchmarks/time_to_loss.py --config_set=recipe --task=kjv_char      # on text the tuning never saw

The configurations are named in a Python file (benchmarks/ttl_configs.py): tasks (the data and the model's shape)
and sets of configurations (train.py's config files and flags), the first of a set being the baseline. Runs go
seed-major (every configuration's first seed, then every second seed, ...) so that drift in the machine's speed
touches all alike, one at a time by default (torch's threads on every core). Every run evaluates every
eval_interval iterations on the same eval_iters windows; its seconds are training seconds: the sum of train.py's
logging windows (log_interval = eval_interval), which leave the evals and checkpoint writes out. A crossing is placed
by linear interpolation between the eval before it and the first eval at or below the target.

Writes OUT/time_to_loss.json (every run's curve, the summary), .csv (the summary) and .png (val loss against tokens
and against seconds, the median over seeds with the seeds' range as a band), and prints the tables. A run already
finished in its out_dir by the same command is not run again (an interrupted benchmark resumes); --fresh=True runs
everything again.
"""

import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parents[i]) for i in (0, 1)]  # benchmarks/ and the repository root

from ttl_curves import MARK, best_values, finished, mark_finished, run_curve, seed_major, summarize
from ttl_report import summary_csv, summary_table, sweep_table, write_chart

from configurator import configure, read_config_file
from nanogpt_perf.bench.report import fmt
from nanogpt_perf.config import Config, setting
from nanogpt_perf.errors import UserError
from nanogpt_perf.files import write_json, write_text
from nanogpt_perf.manifest import git_state
from nanogpt_perf.rules import a_path
from plot import read_log

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
    """Settings of benchmarks/time_to_loss.py: the configurations, the runs and where the results go"""

    configs: str = setting("benchmarks/ttl_configs.py", "a Python file naming TASKS and SETS of configurations "
                           "(train.py arguments)", check=a_path)  # fmt: skip
    task: str = setting("char", "a task of that file: the data and model shape every configuration starts from")
    config_set: str = setting("adamw", "a set of that file: its configurations, the first being the baseline")
    only: str = setting("", "comma-separated configurations of the set to run, the first the baseline ('' = all, in "
                        "the file's order)")  # fmt: skip
    train_args: str = setting("", "more train.py arguments for every run, after the configuration's own "
                              "(shell-quoted)")  # fmt: skip
    sweep: str = setting("", "'KEY=V1,V2,...': every configuration at each value of one train.py setting, e.g. "
                         "learning_rate=3e-3,1e-3", check=a_sweep)  # fmt: skip
    seeds: int = setting(3, "seeds per configuration: first_seed, first_seed + 1, ...", min=1)
    first_seed: int = setting(1337, "the first run's seed", min=0)
    max_iters: int = setting(600, "the horizon: every run's max_iters (and lr_decay_iters, with fit_schedule)", min=1)
    fit_schedule: bool = setting(True, "lr_decay_iters = max_iters: the schedule ends with the run at every horizon")
    eval_interval: int = setting(25, "iterations between evals (and logging windows): the crossing's resolution",
                                 min=1)  # fmt: skip
    eval_iters: int = setting(20, "batches per split at each eval, the same windows every time", min=1)
    target: float = setting(0.0, "the val loss to reach; 0 = the baseline's final val loss, median over its seeds",
                            min=0, note=" (0 = the baseline's final val loss)")  # fmt: skip
    jobs: int = setting(1, "runs at a time", min=1)
    threads: int = setting(0, "torch's threads per run (OMP_NUM_THREADS); 0 = torch's default with jobs=1, else "
                           "cores // jobs", min=0,
                           note=" (0 = torch's default with jobs=1, else cores // jobs)")  # fmt: skip
    fresh: bool = setting(False, "run again even where a finished run of the same command is in its out_dir")
    keep_checkpoints: bool = setting(False, "keep each run's checkpoints (deleted once it has finished: only its log "
                                     "is read)")  # fmt: skip
    out: str = setting("", "the results folder, runs in OUT/runs/; '' = out-ttl/TASK-SET-MAX_ITERS[-sweep-KEY]",
                       check=no_nul)  # fmt: skip


def eval_within_the_run(cfg: Config) -> None:
    if cfg.eval_interval > cfg.max_iters:
        raise ValueError(f"eval_interval must be <= max_iters ({cfg.max_iters}), not {cfg.eval_interval}")


cfg = configure(ttl=TimeToLossConfig, cross=(eval_within_the_run,))
settings = cfg.as_dict()
configs, task, config_set, only, train_args = cfg.configs, cfg.task, cfg.config_set, cfg.only, cfg.train_args
sweep, seeds, first_seed, max_iters, fit_schedule = (
    cfg.sweep,
    cfg.seeds,
    cfg.first_seed,
    cfg.max_iters,
    cfg.fit_schedule,
)
eval_interval, eval_iters, target, jobs, threads = cfg.eval_interval, cfg.eval_iters, cfg.target, cfg.jobs, cfg.threads
fresh, keep_checkpoints, out = cfg.fresh, cfg.keep_checkpoints, cfg.out
# -----------------------------------------------------------------------------


def configurations() -> dict[str, list[str]]:
    """The runs' configurations, name -> train.py arguments (task's, configuration's, --train_args): the set's (or
    --only's), each at every --sweep value; the first is the baseline."""
    path = configs if Path(configs).is_file() or not (ROOT / configs).is_file() else str(ROOT / configs)
    named = read_config_file(path)
    tasks, sets = named.get("TASKS"), named.get("SETS")
    if not isinstance(tasks, dict) or not isinstance(sets, dict):
        raise UserError(f"{configs} must define TASKS and SETS, dicts of train.py arguments (see ttl_configs.py)")
    if task not in tasks or config_set not in sets:
        which = f"task {task!r}: one of {', '.join(tasks)}" if task not in tasks else ""
        which = which or f"config_set {config_set!r}: one of {', '.join(sets)}"
        raise UserError(f"{configs} has no {which}")
    chosen = sets[config_set]
    names = [n.strip() for n in only.split(",")] if only else list(chosen)
    if missing := [n for n in names if n not in chosen]:
        raise UserError(f"set {config_set!r} has no configuration {missing[0]!r}: one of {', '.join(chosen)}")
    lists = {f"task {task!r}": tasks[task]} | {f"configuration {n!r}": chosen[n] for n in names}
    if wrong := [where for where, args in lists.items() if not isinstance(args, list | tuple)]:
        raise UserError(f"{configs}: {wrong[0]} must be a list of train.py arguments")
    extra = shlex.split(train_args)
    chosen = {n: [*tasks[task], *chosen[n], *extra] for n in names}
    if sweep:
        key, listed = sweep.split("=", 1)
        values = [v.strip() for v in listed.split(",")]
        chosen = {f"{n} {key}={v}": [*args, f"--{key}={v}"] for n, args in chosen.items() for v in values}
    folders = [folder_name(n) for n in chosen]
    if len(set(folders)) < len(folders):
        raise UserError(f"configuration names {', '.join(chosen)} share a folder name: rename one")
    for name, args in chosen.items():
        if not all(isinstance(a, str) for a in args):
            raise UserError(f"configuration {name!r}: train.py arguments must be strings, got {args!r}")
        if missing := [a for a in args if not a.startswith("--") and not (ROOT / a).is_file()]:
            raise UserError(f"configuration {name!r}: config file {missing[0]} not found (paths from {ROOT})")
    return chosen


def folder_name(name: str) -> str:
    return re.sub(r"[^\w.=-]+", "_", name)


def command(args: list[str], out_dir: Path, seed: int) -> list[str]:
    """train.py's arguments for one run: the configuration's, then the benchmark's (which win)."""
    schedule = [f"--lr_decay_iters={max_iters}"] if fit_schedule else []
    return [
        *args, f"--out_dir={out_dir}", "--overwrite=True", f"--seed={seed}", f"--max_iters={max_iters}", *schedule,
        f"--eval_interval={eval_interval}", f"--log_interval={eval_interval}", f"--eval_iters={eval_iters}",
        "--always_save_checkpoint=False",
    ]  # fmt: skip


def train(name: str, seed: int, args: list[str], out_dir: Path) -> dict[str, Any]:
    """One run of train.py in out_dir, or the finished one already there; its record and its curve."""
    cmd = command(args, out_dir, seed)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    if threads or jobs > 1:
        env["OMP_NUM_THREADS"] = str(threads or max(1, (os.cpu_count() or 1) // jobs))
    identity = {"command": cmd, "omp_num_threads": env.get("OMP_NUM_THREADS")}  # the threads change the seconds
    earlier = None if fresh else finished(out_dir, identity, max_iters)
    started, t0 = time.time(), time.perf_counter()
    if earlier is None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / MARK).unlink(missing_ok=True)  # unfinished until train.py has finished
        with open(out_dir / "train.out", "w") as output:
            rc = subprocess.run([sys.executable, "train.py", *cmd], cwd=ROOT, stdout=output, stderr=subprocess.STDOUT,
                                env=env).returncode  # fmt: skip
        if rc != 0:
            lines = (out_dir / "train.out").read_text(errors="replace").strip().splitlines() or ["(no output)"]
            raise UserError(f"run {name!r} seed {seed} failed (exit {rc}): {lines[-1]} (all of it: "
                            f"{out_dir / 'train.out'}; benchmarks/ttl_data.py prepares the datasets)")  # fmt: skip
        if not keep_checkpoints:
            for path in out_dir.glob("ckpt*.pt"):
                path.unlink()
        mark_finished(out_dir, identity, {"started_at": started, "wall_s": time.perf_counter() - t0})
    ran = finished(out_dir, identity, max_iters) or {}  # when reused, the figures of the session that ran it
    manifest = read_json(out_dir / "manifest.json")
    shape = manifest["settings"]
    tokens_per_iter = shape["batch_size"] * shape["gradient_accumulation_steps"] * shape["block_size"]
    curve = run_curve(read_log(out_dir / "log.jsonl"), tokens_per_iter)
    return {"config": name, "seed": seed, "out_dir": str(out_dir), **identity, "reused": earlier is not None,
            "git_commit": manifest.get("git_commit"), "git_dirty": manifest.get("git_dirty"),
            "started_at": ran.get("started_at"), "wall_s": ran.get("wall_s"), "curve": curve}  # fmt: skip


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path}: {e}") from None


def run_all(chosen: dict[str, list[str]], results: Path) -> list[dict[str, Any]]:
    """Every configuration x seed, seed-major, jobs at a time; each run's line printed as it ends."""
    order = seed_major(list(chosen), range(first_seed, first_seed + seeds))

    def one(k: int, name: str, seed: int) -> dict[str, Any]:
        run = train(name, seed, chosen[name], results / "runs" / f"{folder_name(name)}-s{seed}")
        c = run["curve"]
        how = "reused" if run["reused"] else f"{run['wall_s']:,.0f} s wall"
        ms = fmt(c["ms_per_iter"], ",.1f")
        print(f"[{k}/{len(order)}] {name}, seed {seed}: final val {c['final_val_loss']:.4f}, "
              f"{c['training_seconds']:,.1f} s training, {ms} ms/iter ({how})", flush=True)  # fmt: skip
        return run

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(one, k + 1, name, seed) for k, (name, seed) in enumerate(order)]
        try:
            runs = [f.result() for f in futures]
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return runs


chosen = configurations()
swept = sweep.split("=")[0]
results = Path(out or f"out-ttl/{task}-{config_set}-{max_iters}" + (f"-sweep-{swept}" if sweep else "")).resolve()
baseline = next(iter(chosen))
t0 = time.perf_counter()
print(f"{len(chosen)} configurations x {seeds} seeds, {max_iters} iterations each, {jobs} at a time, into {results}")
runs = run_all(chosen, results)
wall = time.perf_counter() - t0

curves = {name: [r["curve"] for r in runs if r["config"] == name] for name in chosen}
summary = summarize(curves, baseline, target or None)
finals = {}
if sweep:
    for name in chosen:
        config, value = name.rsplit(f" {swept}=", 1)
        finals.setdefault(config, {})[value] = [c["final_val_loss"] for c in curves[name]]
sweep_doc = {"key": swept, "table": best_values(finals)} if sweep else None
commit, dirty = git_state(ROOT)
doc = {
    "kind": "time_to_loss",
    "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    "git_commit": commit,
    "git_dirty": dirty,
    "cpu_count": os.cpu_count(),
    "command": sys.argv,
    "settings": settings,
    "configurations": chosen,
    "wall_s": wall,
    "summary": summary,
    "sweep": sweep_doc,
    "runs": runs,
}
results.mkdir(parents=True, exist_ok=True)
write_json(results / "time_to_loss.json", doc)
write_text(results / "time_to_loss.csv", summary_csv(summary))
title = f"{task}, {config_set}, {max_iters} iterations, {seeds} seeds"
lines = [f"wrote {results / 'time_to_loss.json'}", f"wrote {results / 'time_to_loss.csv'}"]
lines.append(write_chart(results / "time_to_loss.png", curves, summary, title))
print()
print(f"target val loss {summary['target']:.4f} ({'given' if target else f'the final val loss of {baseline}, median'})"
      f"; seconds are training seconds, evals left out; medians over seeds [min, max]")  # fmt: skip
print(summary_table(summary))
if sweep_doc:
    print()
    print(sweep_table(sweep_doc))
per_iter = {tuple(r["tokens_per_iter"]) for r in summary["rows"].values()}
if len(per_iter) > 1:
    print(f"note: the configurations differ in tokens per iteration ({sorted(per_iter)}): compare tokens, not iters")
walls = [r["wall_s"] for r in runs if r["wall_s"] is not None]
each = f"; each run {statistics.median(walls):,.0f} s wall, median (as it ran)" if walls else ""
print(f"{len(runs)} runs ({sum(r['reused'] for r in runs)} reused) in {wall:,.0f} s wall{each}")
print("\n".join(lines))
