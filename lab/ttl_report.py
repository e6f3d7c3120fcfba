"""What lab/time_to_loss.py prints and writes from its results: the markdown tables (the summary, a
sweep's learning rates) and the CSV of the summary (its chart: lab/charts.py's loss_curves)."""

import csv
import io
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for its modules

from lab.bench_report import fmt, markdown_table


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
    """'median [min, max]' over seeds ('never' for not reached), or the one value of a single seed."""
    if spread["runs"] == 1 or spread["median"] is None and spread["min"] is None:
        return shown(spread["median"])
    return f"{shown(spread['median'])} [{shown(spread['min'])}, {shown(spread['max'])}]"


def run_line(k: int, count: int, run: dict[str, Any]) -> str:
    """The line printed as a run ends (k of count)."""
    c = run["curve"]
    how = "reused" if run["reused"] else f"{run['wall_s']:,.0f} s wall"
    end = "diverged (non-finite steps): never" if c["diverged"] else f"final val {loss_text(c['final_val_loss'])}"
    return (f"[{k}/{count}] {run['config']}, seed {run['seed']}: {end}, {c['training_seconds']:,.1f} s training, "
            f"{fmt(c['ms_per_iter'], ',.1f')} ms/iter ({how})")  # fmt: skip


def summary_table(summary: dict[str, Any]) -> str:
    """One row per configuration: seeds that reached the target, tokens and training seconds to it (median [min,
    max]) and their ratios to the baseline, ms per iteration and its ratio, the val loss at the baseline's final
    tokens and the final val loss."""
    rows = []
    for name, r in summary["rows"].items():
        t, s = r["tokens_to_target"], r["seconds_to_target"]
        rows.append([
            name, f"{t['reached']}/{t['runs']}",
            spread_text(t, tokens_text), fmt(r["tokens_ratio"], ".2f", suffix="x"),
            spread_text(s, seconds_text), fmt(r["seconds_ratio"], ".2f", suffix="x"),
            fmt(r["ms_per_iter"], ",.1f"), fmt(r["ms_ratio"], ".2f", suffix="x"),
            spread_text(r["val_loss_at_equal_tokens"], loss_text), spread_text(r["final_val_loss"], loss_text),
        ])  # fmt: skip
    equal = tokens_text(summary["equal_tokens"])
    headers = ["configuration", "reached", "tokens to target", "x base", "train s to target", "x base",
               "ms/iter", "x base", f"val at {equal} tokens", "final val"]  # fmt: skip
    return markdown_table(headers, rows)


def sweep_table(sweep: dict[str, Any]) -> str:
    """A sweep's values, configuration by configuration: the median final val loss [min, max] over seeds ('-': a
    seed that diverged), the best (lowest median) marked, and how many seeds diverged."""
    rows = []
    for config, entry in sweep["table"].items():
        for value, spread in entry["values"].items():
            notes = ["best"] if value == entry["best"] else []
            if diverged := spread["runs"] - spread["reached"]:
                notes.append(f"{diverged}/{spread['runs']} diverged")
            rows.append([config, f"{sweep['key']}={value}", spread_text(spread, loss_text), ", ".join(notes)])
    return markdown_table(["configuration", "value", "final val loss", ""], rows, left=(0, 1, 3))


CSV_COLUMNS = ("tokens_to_target", "seconds_to_target", "val_loss_at_equal_tokens", "final_val_loss")


def summary_csv(summary: dict[str, Any]) -> str:
    """The summary table as CSV: one row per configuration, each spread as its median, min, max and count reached."""
    out = io.StringIO(newline="")
    writer = csv.writer(out)
    spreads = [f"{key}_{part}" for key in CSV_COLUMNS for part in ("median", "min", "max", "reached")]
    writer.writerow(["configuration", "target", *spreads, "tokens_ratio", "seconds_ratio", "ms_per_iter", "ms_ratio"])
    for name, r in summary["rows"].items():
        values = [r[key][part] for key in CSV_COLUMNS for part in ("median", "min", "max", "reached")]
        figures = [r["tokens_ratio"], r["seconds_ratio"], r["ms_per_iter"], r["ms_ratio"]]
        writer.writerow([name, summary["target"], *values, *figures])
    return out.getvalue()


if __name__ == "__main__":
    raise SystemExit("error: ttl_report.py is a module of lab/time_to_loss.py: run that one (--help)")
