"""The arithmetic and the report of lab/time_to_loss.py, on the records train.py writes (no
torch): a run's curve (its evals' val loss against iterations, tokens and training seconds, the sum
of train.py's logging windows, which leave out evals and checkpoint writes); the crossing of a
target, interpolated linearly (in iterations) from the eval before it; medians and spreads over
seeds where "not reached" counts as later than any reached; ratios to the baseline; the val loss at
equal tokens; the tables (the chart: lab/charts.py's loss_curves). A run that diverged (train.py
stopped it on non-finite steps) is "never" and has no final val loss.
"""

import bisect
import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any


def interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float | None:
    """y at x on the polyline through (xs, ys) (xs increasing); None outside [xs[0], xs[-1]]."""
    if not xs or x < xs[0] or x > xs[-1]:
        return None
    if (i := bisect.bisect_left(xs, x)) == 0:
        return ys[0]
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


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


def last_run(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of the last run in a log (a log appended to by several runs starts again at a
    lower iter)."""
    starts = [i for i in range(1, len(records)) if records[i]["iter"] < records[i - 1]["iter"]]
    return records[starts[-1] if starts else 0 :]


def run_curve(
    records: list[dict[str, Any]], tokens_per_iter: int, diverged: bool = False
) -> dict[str, Any]:
    """A run's evals on the three axes, its median ms per iteration (first window, which warms up,
    left out) and its final val loss (None for a run that diverged)."""
    records = last_run(records)
    windows = [r for r in records if "ms_per_iter" in r]
    evals = [r for r in records if "val_loss" in r]
    iters, ms = [r["iter"] for r in evals], [w["ms_per_iter"] for w in windows[1:]]
    w_iters, w_seconds = iters[:1] or [0], [0.0]  # the training seconds as each window closes
    for w in windows:
        w_seconds.append(w_seconds[-1] + w["ms_per_iter"] * (w["iter"] - w_iters[-1]) / 1000)
        w_iters.append(w["iter"])
    return {
        "iters": iters,
        "tokens": [i * tokens_per_iter for i in iters],
        "seconds": [interpolate(w_iters, w_seconds, i) for i in iters],
        "val_loss": [r["val_loss"] for r in evals],
        "train_loss": [r["train_loss"] for r in evals],
        "ms_per_iter": statistics.median(ms) if ms else None,
        "training_seconds": w_seconds[-1],
        "final_val_loss": evals[-1]["val_loss"] if evals and not diverged else None,
        "tokens_per_iter": tokens_per_iter,
        "diverged": diverged,
    }


def reach(curve: dict[str, Any], target: float | None) -> dict[str, float | None]:
    """The iteration, tokens and training seconds at which a run's val loss reaches target (None:
    not reached, no target, or a run that diverged)."""
    it = None if target is None else crossing(curve["iters"], curve["val_loss"], target)
    if it is None or curve["diverged"]:
        return {"iters": None, "tokens": None, "seconds": None}
    seconds = interpolate(curve["iters"], curve["seconds"], it)
    return {"iters": it, "tokens": it * curve["tokens_per_iter"], "seconds": seconds}


def median_spread(values: list[float | None]) -> dict[str, Any]:
    """Median, min and max over seeds (one at least), None standing for "not reached" (later than
    any value; a NaN or inf, a run that diverged, counts as None: worse than any). The median is the
    usual one where the middle values are reached; where only the lower of two middle values is (an
    even count), that one: by then half the seeds have reached the target. A median or max that
    falls on "not reached" is None; 'reached' counts the values that are not None."""
    ordered = sorted(math.inf if v is None or not math.isfinite(v) else v for v in values)
    n = len(ordered)
    middle = ordered[(n - 1) // 2 : n // 2 + 1]  # one value, or two
    median = middle[0] if middle[-1] == math.inf else sum(middle) / len(middle)
    shown = [None if v == math.inf else v for v in (median, ordered[0], ordered[-1])]
    reached = sum(v < math.inf for v in ordered)
    return dict(zip(("median", "min", "max"), shown, strict=True)) | {"reached": reached, "runs": n}


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
    base, ratio = rows[baseline], lambda a, b: None if a is None or not b else a / b
    for row in rows.values():
        for key in ("tokens_to_target", "seconds_to_target"):
            row[key.split("_")[0] + "_ratio"] = ratio(row[key]["median"], base[key]["median"])
        row["ms_ratio"] = ratio(row["ms_per_iter"], base["ms_per_iter"])
    return {"target": target, "baseline": baseline, "equal_tokens": equal_tokens, "rows": rows}


def median_curve(
    curves: list[dict[str, Any]], axis: str
) -> tuple[list[float], list[float], list[float], list[float]]:
    """Over a configuration's seeds, at each eval of its first seed's: the median x on axis
    ('tokens' or 'seconds'), the median val loss, and the lowest and highest val loss (the band)."""
    xs, median, low, high = [], [], [], []
    evals = [
        dict(zip(c["iters"], zip(c[axis], c["val_loss"], strict=True), strict=True)) for c in curves
    ]
    for it in curves[0]["iters"]:
        at = [e.get(it, (None, None)) for e in evals]
        points = [(x, v) for x, v in at if x is not None and v is not None and math.isfinite(v)]
        if points:
            losses = [v for _, v in points]
            xs.append(statistics.median(x for x, _ in points))
            median.append(statistics.median(losses))
            low.append(min(losses))
            high.append(max(losses))
    return xs, median, low, high


def shown(value: float | None, form: str, none: str = "-") -> str:
    return none if value is None else form.format(value)


def tokens_text(tokens: float | None) -> str:
    if tokens is None:
        return "never"
    per, unit = (1e9, "B") if tokens >= 1e9 else (1e6, "M") if tokens >= 1e6 else (1e3, "k")
    return f"{tokens / per:.3g}{unit}"  # 3 significant digits


def spread_text(spread: dict[str, Any], text: Callable[[float | None], str]) -> str:
    """'median [min, max]' over seeds ('never' for not reached), or a single seed's one value."""
    median, low, high = (text(spread[k]) for k in ("median", "min", "max"))
    return median if spread["runs"] == 1 or spread["min"] is None else f"{median} [{low}, {high}]"


def loss_text(loss: float | None) -> str:
    return shown(loss, "{:.4f}")


def run_line(k: int, count: int, run: dict[str, Any]) -> str:
    """The line printed as a run ends (k of count)."""
    c = run["curve"]
    how = "reused" if run["reused"] else f"{run['wall_s']:,.0f} s wall"
    final = f"final val {loss_text(c['final_val_loss'])}"
    end = "diverged (non-finite steps): never" if c["diverged"] else final
    spent = f"{c['training_seconds']:,.1f} s training, {shown(c['ms_per_iter'], '{:,.1f}')} ms/iter"
    return f"[{k}/{count}] {run['config']}, seed {run['seed']}: {end}, {spent} ({how})"


def summary_table(summary: dict[str, Any]) -> str:
    """One row per configuration: seeds that reached the target, tokens and training seconds to it
    (median [min, max]) and their ratios to the baseline, ms per iteration and its ratio, the val
    loss at the baseline's final tokens and the final val loss."""
    from lab.bench_report import markdown_table  # (it loads torch: not for the arithmetic)

    x, seconds = lambda ratio: shown(ratio, "{:.2f}x"), lambda s: shown(s, "{:,.1f}", "never")
    rows = []
    for name, r in summary["rows"].items():
        t, s = r["tokens_to_target"], r["seconds_to_target"]
        row = [name, f"{t['reached']}/{t['runs']}", spread_text(t, tokens_text)]
        row += [x(r["tokens_ratio"]), spread_text(s, seconds), x(r["seconds_ratio"])]
        row += [shown(r["ms_per_iter"], "{:,.1f}"), x(r["ms_ratio"])]
        at_equal, final = r["val_loss_at_equal_tokens"], r["final_val_loss"]
        rows.append(row + [spread_text(at_equal, loss_text), spread_text(final, loss_text)])
    cols = "configuration|reached|tokens to target|x base|train s to target|x base|ms/iter|x base"
    equal = tokens_text(summary["equal_tokens"])
    return markdown_table([*cols.split("|"), f"val at {equal} tokens", "final val"], rows)


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


def sweep_summary(key: str, curves: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """A sweep over key: per configuration, each value's final val loss over seeds (median [min,
    max]; None for a seed that diverged) and the value with the lowest median, the best (None where
    no value has a median). curves: 'CONFIGURATION KEY=VALUE' -> its seeds' curves."""
    table: dict[str, dict[str, Any]] = {}
    for name, runs in curves.items():
        config, value = name.rsplit(f" {key}=", 1)
        entry = table.setdefault(config, {"values": {}, "best": None})
        entry["values"][value] = median_spread([c["final_val_loss"] for c in runs])
    for entry in table.values():
        ranked = {v: s["median"] for v, s in entry["values"].items() if s["median"] is not None}
        entry["best"] = min(ranked, key=ranked.__getitem__, default=None)
    return {"key": key, "table": table}


def print_report(
    summary: dict[str, Any], given: bool, sweep: dict | None, runs: list[dict]
) -> None:
    """The tables and notes printed at the end; given: the target was given, not the baseline's."""
    base, target = summary["baseline"], summary["target"]
    said = "given" if given else f"the final val loss of {base}, median"
    if target is None:
        head = f"no target: most seeds of the baseline {base!r} diverged (give --target)"
    else:
        head = f"target val loss {target:.4f} ({said})"
    print(f"\n{head}; training seconds (evals left out); medians over seeds [min, max]")
    print(summary_table(summary))
    if sweep:
        print(f"\n{sweep_table(sweep)}")
    never = "diverged (non-finite steps; 'never', with no final val loss)"
    if diverged := [f"{r['config']} seed {r['seed']}" for r in runs if r["outcome"] == "diverged"]:
        print(f"{never}: {', '.join(diverged)}")
    if len(per_iter := {tuple(r["tokens_per_iter"]) for r in summary["rows"].values()}) > 1:
        print(f"note: tokens per iteration differ ({sorted(per_iter)}): compare tokens, not iters")


if __name__ == "__main__":
    raise SystemExit("error: ttl_curves.py is a module of lab/time_to_loss.py: run that one")
