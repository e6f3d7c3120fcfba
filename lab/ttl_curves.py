"""The arithmetic and the report of lab/time_to_loss.py, on the records train.py writes (no
training, no torch):

- a run's curve: its evals' val loss against iterations, tokens and training seconds. Training
  seconds are the sum of the logging windows' ms_per_iter x the window's iterations: train.py's
  windows leave out evals and checkpoint writes, so the seconds axis counts training alone;
- the crossing of a target val loss: the first eval at or below it, placed by linear
  interpolation (in iterations) from the eval before it; None when no eval reaches it;
- medians and spreads over seeds where "not reached" counts as later than any reached, ratios to
  the baseline, the val loss at equal tokens; the order of the runs (seed-major);
- the markdown tables (the summary, a sweep's values) and the summary's CSV (its chart:
  lab/charts.py's loss_curves).

A run that diverged (train.py stopped it on non-finite steps) is "never" at every target and has
no final val loss.
"""

import csv
import io
import math
import statistics
from collections.abc import Sequence
from typing import Any


def interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float | None:
    """y at x on the polyline through (xs, ys) (xs increasing); None outside [xs[0], xs[-1]]."""
    if not xs or x < xs[0] or x > xs[-1]:
        return None
    for i in range(1, len(xs)):
        if x <= xs[i]:
            x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
            return y1 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[0]  # a single point, at x


def crossing(xs: Sequence[float], losses: Sequence[float], target: float) -> float | None:
    """The x where the loss first reaches target (<=), linear between the eval before and the first
    at or below it; None when no eval reaches it."""
    for i, loss in enumerate(losses):
        if loss <= target:
            if i == 0 or not math.isfinite(losses[i - 1]):  # nothing to interpolate from
                return xs[i]
            x0, x1, y0 = xs[i - 1], xs[i], losses[i - 1]
            return x0 + (x1 - x0) * (y0 - target) / (y0 - loss)
    return None


def training_seconds(
    windows: list[dict[str, Any]], start_iter: int = 0
) -> tuple[list[int], list[float]]:
    """The cumulative training seconds at the end of each logging window, from (start_iter, 0)."""
    iters, seconds = [start_iter], [0.0]
    for w in windows:
        iters.append(w["iter"])
        seconds.append(seconds[-1] + w["ms_per_iter"] * (w["iter"] - iters[-2]) / 1000)
    return iters, seconds


def last_run(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of the last run in a log (a log appended to by several runs starts again at a
    lower iter)."""
    start = 0
    for i in range(1, len(records)):
        if records[i]["iter"] < records[i - 1]["iter"]:
            start = i
    return records[start:]


def run_curve(
    records: list[dict[str, Any]], tokens_per_iter: int, diverged: bool = False
) -> dict[str, Any]:
    """A run's evals on the three axes, its median ms per iteration (first window, which warms up,
    left out) and its final val loss (None for a run that diverged)."""
    records = last_run(records)
    windows = [r for r in records if "ms_per_iter" in r]
    evals = [r for r in records if "val_loss" in r]
    w_iters, w_seconds = training_seconds(windows, evals[0]["iter"] if evals else 0)
    iters = [r["iter"] for r in evals]
    return {
        "iters": iters,
        "tokens": [i * tokens_per_iter for i in iters],
        "seconds": [interpolate(w_iters, w_seconds, i) for i in iters],
        "val_loss": [r["val_loss"] for r in evals],
        "train_loss": [r["train_loss"] for r in evals],
        "ms_per_iter": statistics.median(w["ms_per_iter"] for w in windows[1:])
        if len(windows) > 1
        else None,
        "training_seconds": w_seconds[-1],
        "final_val_loss": evals[-1]["val_loss"] if evals and not diverged else None,
        "tokens_per_iter": tokens_per_iter,
        "diverged": diverged,
    }


def reach(curve: dict[str, Any], target: float | None) -> dict[str, float | None]:
    """The iteration, tokens and training seconds at which a run's val loss reaches target (None:
    not reached, no target, or a run that diverged)."""
    it = (
        None
        if target is None or curve.get("diverged")
        else crossing(curve["iters"], curve["val_loss"], target)
    )
    if it is None:
        return {"iters": None, "tokens": None, "seconds": None}
    seconds = interpolate(curve["iters"], curve["seconds"], it)
    return {"iters": it, "tokens": it * curve["tokens_per_iter"], "seconds": seconds}


def median_spread(values: list[float | None]) -> dict[str, Any]:
    """Median, min and max over seeds, None standing for "not reached" (later than any value; a NaN
    or inf, a run that diverged, counts as None: worse than any). The median is the usual one where
    the middle values are reached; where only the lower of two middle values is (an even count),
    that one: by then half the seeds have reached the target. A median or max that falls on "not
    reached" is None; 'reached' counts the values that are not None."""
    values = [None if v is None or not math.isfinite(v) else v for v in values]
    reached = sorted(v for v in values if v is not None)
    ordered = reached + [math.inf] * (len(values) - len(reached))
    n = len(ordered)
    if n == 0:
        median = math.inf
    elif n % 2 or ordered[n // 2] == math.inf:
        median = ordered[(n - 1) // 2]
    else:
        median = (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    finite = lambda v: None if v == math.inf else v  # noqa: E731
    return {
        "median": finite(median),
        "min": finite(ordered[0]) if ordered else None,
        "max": finite(ordered[-1]) if ordered else None,
        "reached": len(reached),
        "runs": len(values),
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def summarize(
    curves: dict[str, list[dict[str, Any]]], baseline: str, target: float | None
) -> dict[str, Any]:
    """Per configuration (curves: its runs' curves, one per seed): the tokens and seconds to target,
    medians and spreads, ratios to the baseline, ms per iteration, the val loss at the baseline's
    final tokens and the final val loss. target None: the baseline's final val loss, median over its
    seeds (None, and every run "never", where most of its seeds diverged). A run that diverged has
    "never" and "-" in every column but ms per iteration."""
    if target is None:
        target = median_spread([c["final_val_loss"] for c in curves[baseline]])["median"]
    equal_tokens = max((c["tokens"][-1] for c in curves[baseline] if c["tokens"]), default=0)
    rows = {}
    for name, runs in curves.items():
        reached = [reach(c, target) for c in runs]
        at_equal = [
            None if c["diverged"] else interpolate(c["tokens"], c["val_loss"], equal_tokens)
            for c in runs
        ]
        rows[name] = {
            "tokens_to_target": median_spread([r["tokens"] for r in reached]),
            "seconds_to_target": median_spread([r["seconds"] for r in reached]),
            "ms_per_iter": median_spread([c["ms_per_iter"] for c in runs])["median"],
            "val_loss_at_equal_tokens": median_spread(at_equal),
            "final_val_loss": median_spread([c["final_val_loss"] for c in runs]),
            "tokens_per_iter": sorted({c["tokens_per_iter"] for c in runs}),
        }
    base = rows[baseline]
    for row in rows.values():
        for key in ("tokens_to_target", "seconds_to_target"):
            row[key.split("_")[0] + "_ratio"] = ratio(row[key]["median"], base[key]["median"])
        row["ms_ratio"] = ratio(row["ms_per_iter"], base["ms_per_iter"])
    return {"target": target, "baseline": baseline, "equal_tokens": equal_tokens, "rows": rows}


def best_values(finals: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, Any]]:
    """A sweep: per configuration, each value's median final val loss (and min, max) over seeds, and
    the value with the lowest median (the best; None where no value has one). finals: configuration
    -> value -> the seeds' final val losses (None: a seed that diverged)."""
    table = {}
    for config, by_value in finals.items():
        spreads = {value: median_spread(losses) for value, losses in by_value.items()}
        ranked = [value for value in spreads if spreads[value]["median"] is not None]
        best = min(ranked, key=lambda v: spreads[v]["median"], default=None)
        table[config] = {"values": spreads, "best": best}
    return table


def seed_major(configs: Sequence[str], seeds: Sequence[int]) -> list[tuple[str, int]]:
    """Every configuration's first seed, then every configuration's second, ...: drift in the
    machine's speed touches every configuration alike."""
    return [(config, seed) for seed in seeds for config in configs]


def median_curve(
    curves: list[dict[str, Any]], axis: str
) -> tuple[list[float], list[float], list[float], list[float]]:
    """Over a configuration's seeds, at each eval of its first seed's: the median x on axis
    ('tokens' or 'seconds'), the median val loss, and the lowest and highest val loss (the band)."""
    xs, median, low, high = [], [], [], []
    for it in curves[0]["iters"]:
        at = [
            (c[axis][c["iters"].index(it)], c["val_loss"][c["iters"].index(it)])
            for c in curves
            if it in c["iters"]
        ]
        points = [(x, v) for x, v in at if x is not None and v is not None and math.isfinite(v)]
        if not points:
            continue
        xs.append(statistics.median(x for x, _ in points))
        losses = [v for _, v in points]
        median.append(statistics.median(losses))
        low.append(min(losses))
        high.append(max(losses))
    return xs, median, low, high


def tokens_text(tokens: float | None) -> str:
    if tokens is None:
        return "never"
    for per, unit in ((1e9, "B"), (1e6, "M")):
        if tokens >= per:
            return f"{tokens / per:,.3g}{unit}"  # 3 significant digits
    return f"{tokens / 1e3:.3g}k"


def seconds_text(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:,.1f}"


def loss_text(loss: float | None) -> str:
    return "-" if loss is None else f"{loss:.4f}"


def spread_text(spread: dict[str, Any], shown: Any) -> str:
    """'median [min, max]' over seeds ('never' for not reached), or a single seed's one value."""
    if spread["runs"] == 1 or spread["median"] is None and spread["min"] is None:
        return shown(spread["median"])
    return f"{shown(spread['median'])} [{shown(spread['min'])}, {shown(spread['max'])}]"


def run_line(k: int, count: int, run: dict[str, Any]) -> str:
    """The line printed as a run ends (k of count)."""
    from lab.bench_report import fmt  # (bench.py's library loads torch: not for the arithmetic)

    c = run["curve"]
    how = "reused" if run["reused"] else f"{run['wall_s']:,.0f} s wall"
    final = f"final val {loss_text(c['final_val_loss'])}"
    end = "diverged (non-finite steps): never" if c["diverged"] else final
    return (f"[{k}/{count}] {run['config']}, seed {run['seed']}: {end}, "
            f"{c['training_seconds']:,.1f} s training, {fmt(c['ms_per_iter'], ',.1f')} ms/iter "
            f"({how})")  # fmt: skip


def summary_table(summary: dict[str, Any]) -> str:
    """One row per configuration: seeds that reached the target, tokens and training seconds to it
    (median [min, max]) and their ratios to the baseline, ms per iteration and its ratio, the val
    loss at the baseline's final tokens and the final val loss."""
    from lab.bench_report import fmt, markdown_table

    rows, x = [], lambda ratio: fmt(ratio, ".2f", suffix="x")
    for name, r in summary["rows"].items():
        t, s = r["tokens_to_target"], r["seconds_to_target"]
        rows.append([
            name, f"{t['reached']}/{t['runs']}",
            spread_text(t, tokens_text), x(r["tokens_ratio"]),
            spread_text(s, seconds_text), x(r["seconds_ratio"]),
            fmt(r["ms_per_iter"], ",.1f"), x(r["ms_ratio"]),
            spread_text(r["val_loss_at_equal_tokens"], loss_text),
            spread_text(r["final_val_loss"], loss_text),
        ])  # fmt: skip
    equal = tokens_text(summary["equal_tokens"])
    headers = ["configuration", "reached", "tokens to target", "x base", "train s to target",
               "x base", "ms/iter", "x base", f"val at {equal} tokens", "final val"]  # fmt: skip
    return markdown_table(headers, rows)


def sweep_table(sweep: dict[str, Any]) -> str:
    """A sweep's values, configuration by configuration: the median final val loss [min, max] over
    seeds ('-': a seed that diverged), the best (lowest median) marked, how many seeds diverged."""
    from lab.bench_report import markdown_table

    rows = []
    for config, entry in sweep["table"].items():
        for value, spread in entry["values"].items():
            notes = ["best"] if value == entry["best"] else []
            if diverged := spread["runs"] - spread["reached"]:
                notes.append(f"{diverged}/{spread['runs']} diverged")
            loss = spread_text(spread, loss_text)
            rows.append([config, f"{sweep['key']}={value}", loss, ", ".join(notes)])
    return markdown_table(["configuration", "value", "final val loss", ""], rows, left=(0, 1, 3))


CSV_COLUMNS = (
    "tokens_to_target",
    "seconds_to_target",
    "val_loss_at_equal_tokens",
    "final_val_loss",
)
PARTS = ("median", "min", "max", "reached")
RATIOS = ("tokens_ratio", "seconds_ratio", "ms_per_iter", "ms_ratio")


def summary_csv(summary: dict[str, Any]) -> str:
    """The summary table as CSV: a row per configuration, each spread as its PARTS."""
    out = io.StringIO(newline="")
    writer = csv.writer(out)
    spreads = [f"{key}_{part}" for key in CSV_COLUMNS for part in PARTS]
    writer.writerow(["configuration", "target", *spreads, *RATIOS])
    for name, r in summary["rows"].items():
        values = [r[key][part] for key in CSV_COLUMNS for part in PARTS]
        writer.writerow([name, summary["target"], *values, *(r[key] for key in RATIOS)])
    return out.getvalue()


def sweep_summary(key: str, curves: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """A sweep over key's table: each configuration's values and their final val losses over seeds,
    the best marked; curves: 'CONFIGURATION KEY=VALUE' -> its seeds' curves."""
    finals: dict[str, dict[str, list[float]]] = {}
    for name in curves:
        config, value = name.rsplit(f" {key}=", 1)
        finals.setdefault(config, {})[value] = [c["final_val_loss"] for c in curves[name]]
    return {"key": key, "table": best_values(finals)}


def print_report(
    summary: dict[str, Any], given: bool, sweep: dict | None, runs: list[dict]
) -> None:
    """The tables and notes printed at the end; given: the target was given, not the baseline's."""
    if summary["target"] is None:
        print(f"\nno target: most seeds of the baseline {summary['baseline']!r} diverged, so every "
              "run is 'never' (give --target)")  # fmt: skip
    else:
        said = "given" if given else f"the final val loss of {summary['baseline']}, median"
        print(f"\ntarget val loss {summary['target']:.4f} ({said}); seconds are training seconds, "
              "evals left out; medians over seeds [min, max]")  # fmt: skip
    print(summary_table(summary))
    if sweep:
        print()
        print(sweep_table(sweep))
    if diverged := [f"{r['config']} seed {r['seed']}" for r in runs if r["outcome"] == "diverged"]:
        never = "diverged (non-finite steps; 'never', with no final val loss)"
        print(f"{never}: {', '.join(diverged)}")
    per_iter = {tuple(r["tokens_per_iter"]) for r in summary["rows"].values()}
    if len(per_iter) > 1:
        print(f"note: the configurations differ in tokens per iteration ({sorted(per_iter)}): "
              "compare tokens")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(
        "error: ttl_curves.py is a module of lab/time_to_loss.py: run that one (--help)"
    )
