"""The regression check: compare two bench.py outputs figure by figure, only where they measured the
same thing."""

if __name__ == "__main__":  # run as a script, it would fail at its imports
    raise SystemExit("error: bench_regression.py is a module of bench.py: run bench.py (--help)")

import json
import math
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lab.bench_report import fmt, markdown_table
from nanogpt_perf.errors import UserError
from nanogpt_perf.files import read_file

# each compared figure: lower is better but for those of HIGHER_IS_BETTER
METRICS = "ms_median ms_p90 tokens_per_s mfu peak_mem_bytes peak_reserved_bytes".split()
HIGHER_IS_BETTER = {"tokens_per_s", "mfu"}
# what must match between the two runs as a whole for any of their figures to be comparable
SAME_MACHINE = ("device_name", "torch")
# a row of the comparison that compares no figure
NO_FIGURE = dict(metric="", baseline=None, new=None, change_pct=None, reason="")


def load_results(path: Path) -> dict[str, Any]:
    """A bench.py output, checked to be one (the figures compared are numbers, each result named),
    so that the comparison cannot fail on a file of another kind: one error line naming the file for
    anything else."""
    if not os.path.lexists(path):
        raise UserError(f"no bench output at {path}")
    text = read_file(Path(path), "bench output")  # a folder or a FIFO named, never waited on
    try:
        doc = json.loads(text.decode("utf-8"))
    except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise UserError(f"{path} is not JSON: {e}") from None
    except RecursionError:
        raise UserError(
            f"{path} is not a bench.py output: its JSON is nested too deeply to read"
        ) from None
    if problem := results_problem(doc):
        raise UserError(f"{path} is not a bench.py output: {problem}")
    return doc


def results_problem(doc: Any) -> str | None:
    """What keeps doc from being a bench.py output that compare_results can read, or None."""
    whole = isinstance(doc, dict) and isinstance(doc.get("manifest"), dict)
    if not whole or not isinstance(doc.get("results"), list):
        return "no results list and manifest"
    names = set()
    for i, r in enumerate(doc["results"]):
        named = isinstance(r, dict) and all(isinstance(r.get(k), str) for k in ("name", "status"))
        if not named:
            return f"its result {i} has no name and status"
        if r["name"] in names:
            return f"two results are named {r['name']!r}"
        names.add(r["name"])
        if r["status"] == "ok" and not isinstance(r.get("settings"), dict):
            return f"its result {r['name']!r} has no settings"
        for metric in METRICS if r["status"] == "ok" else ():
            value = r.get(metric)
            if value is not None and (type(value) not in (int, float) or not math.isfinite(value)):
                shown = str(value)[:40]
                return f"its result {r['name']!r} has {metric} {shown!r}, not a finite number"
    return None


def differences(old: dict[str, Any], new: dict[str, Any], keys: Iterable[str]) -> list[str]:
    return [f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in keys if new.get(k) != old.get(k)]


def compare_results(
    new: dict[str, Any], baseline: dict[str, Any], tolerance_pct: float
) -> list[dict[str, Any]]:
    """Every figure of METRICS that the baseline measured, matched by result name, with its change
    in percent and a verdict: 'worse' or 'better' by more than tolerance_pct, else 'within';
    'missing' where the new output has no measured result of that name; 'not comparable' (one row,
    the settings that differ as its reason) where the two rows were measured with other settings.
    Figures are compared only between runs on the same device with the same torch (SAME_MACHINE,
    which the caller checks first)."""
    now = {r["name"]: r for r in new["results"] if r["status"] == "ok"}
    rows = []
    for old in (r for r in baseline["results"] if r["status"] == "ok"):
        name, row = old["name"], {"name": old["name"]} | NO_FIGURE
        if name not in now:
            rows.append(row | {"verdict": "missing", "reason": "no measured result of this name"})
            continue
        keys = sorted(set(now[name]["settings"]) | set(old["settings"]))
        if differs := ", ".join(differences(old["settings"], now[name]["settings"], keys)):
            rows.append(row | {"verdict": "not comparable", "reason": differs})
            continue
        for metric in METRICS:
            before, after = old.get(metric), now[name].get(metric)
            if not before or after is None:
                continue
            change = (after - before) / before * 100
            gain = change if metric in HIGHER_IS_BETTER else -change
            verdict = "within" if abs(gain) <= tolerance_pct else "better" if gain > 0 else "worse"
            figure = dict(metric=metric, baseline=before, new=after, change_pct=change)
            rows.append(row | figure | {"verdict": verdict})
    return rows


def verdict(rows: list[dict[str, Any]], tolerance_pct: float) -> tuple[int, str]:
    """(exit status, one line): 1 when a figure is worse or a result missing, else 2 when some
    result or every figure could not be compared, else 0."""
    worse = sum(r["verdict"] in ("worse", "missing") for r in rows)
    apart, n = sum(r["verdict"] == "not comparable" for r in rows), len(rows)
    if worse:
        line = (
            f"regression: {worse} of {n} figures worse than the baseline by over {tolerance_pct}%"
        )
        return 1, line
    if apart or not rows:
        return 2, f"not comparable: {apart} of {n} results were measured with other settings"
    return 0, f"no regression: every figure within {tolerance_pct}% of the baseline or better"


def comparison_table(rows: list[dict[str, Any]]) -> str:
    cells = []
    for r in rows:
        before, after = fmt(r["baseline"], ",.4g"), fmt(r["new"], ",.4g")
        change = fmt(r["change_pct"], "+.1f", suffix="%")
        verdict = r["verdict"] + (f" ({r['reason']})" if r["reason"] else "")
        cells.append([r["name"], r["metric"], before, after, change, verdict])
    return markdown_table(["config", "figure", "baseline", "new", "change", "verdict"], cells)


def regression_check(compare: str, baseline: str, tolerance_pct: float) -> int:
    """bench.py's check of compare against baseline: the comparison printed, and the exit status, 0:
    no regression, 1: a regression, 2: nothing could be compared."""
    try:
        if not (compare and baseline):
            raise UserError(
                "a regression check needs both --compare=NEW.json and --baseline=OLD.json"
            )
        new, old = load_results(Path(compare)), load_results(Path(baseline))
    except UserError as e:  # not 1, which would read as a regression
        print(f"error: {e}", file=sys.stderr)
        return 2
    if apart := "; ".join(differences(old["manifest"], new["manifest"], SAME_MACHINE)):
        print(f"not comparable: measured on another machine or software ({apart})", file=sys.stderr)
        return 2
    rows = compare_results(new, old, tolerance_pct)
    print(comparison_table(rows))
    status, line = verdict(rows, tolerance_pct)
    print(line, file=sys.stderr if status else sys.stdout)
    return status
