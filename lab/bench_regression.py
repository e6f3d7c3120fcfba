"""The regression check: compare two bench.py outputs figure by figure, only where they measured the
same thing."""

if __name__ == "__main__":  # run as a script, it would fail at its imports
    raise SystemExit("error: bench_regression.py is a module of bench.py: run bench.py (--help)")

import json
import math
import os
from pathlib import Path
from typing import Any

from lab.bench_report import fmt, markdown_table
from nanogpt_perf.errors import UserError
from nanogpt_perf.files import read_file

# each compared figure, and whether a higher value is better
METRICS = {
    "ms_median": False,
    "ms_p90": False,
    "tokens_per_s": True,
    "mfu": True,
    "peak_mem_bytes": False,
    "peak_reserved_bytes": False,
}
# what must match between the two runs as a whole for any of their figures to be comparable
SAME_MACHINE = ("device_name", "torch")


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
    if (
        not isinstance(doc, dict)
        or not isinstance(doc.get("results"), list)
        or not isinstance(doc.get("manifest"), dict)
    ):
        return "no results list and manifest"
    names = set()
    for i, result in enumerate(doc["results"]):
        if not isinstance(result, dict) or not all(
            isinstance(result.get(k), str) for k in ("name", "status")
        ):
            return f"its result {i} has no name and status"
        if result["name"] in names:
            return f"two results are named {result['name']!r}"
        names.add(result["name"])
        if result["status"] != "ok":
            continue
        if not isinstance(result.get("settings"), dict):
            return f"its result {result['name']!r} has no settings"
        for metric in METRICS:
            value = result.get(metric)
            if value is not None and (type(value) not in (int, float) or not math.isfinite(value)):
                shown = str(value)[:40]
                return f"its result {result['name']!r} has {metric} {shown!r}, not a finite number"
    return None


def machine_difference(new: dict[str, Any], baseline: dict[str, Any]) -> str | None:
    """Why the two runs cannot be compared at all (another device or torch version), or None."""
    diffs = [
        f"{key} {baseline['manifest'].get(key)!r} -> {new['manifest'].get(key)!r}"
        for key in SAME_MACHINE
        if new["manifest"].get(key) != baseline["manifest"].get(key)
    ]
    return "; ".join(diffs) or None


def settings_difference(new: dict[str, Any], old: dict[str, Any]) -> str | None:
    """The settings in which two rows of the same name differ, or None when they measured the same
    thing."""
    keys = sorted(set(new["settings"]) | set(old["settings"]))
    diffs = [
        f"{k} {old['settings'].get(k)!r} -> {new['settings'].get(k)!r}"
        for k in keys
        if new["settings"].get(k) != old["settings"].get(k)
    ]
    return ", ".join(diffs) or None


def compare_results(
    new: dict[str, Any], baseline: dict[str, Any], tolerance_pct: float
) -> list[dict[str, Any]]:
    """Every figure of METRICS that the baseline measured, matched by result name, with its change
    in percent and a verdict: 'worse' or 'better' by more than tolerance_pct, else 'within';
    'missing' where the new output has no measured result of that name; 'not comparable' (one row,
    the differing settings as its reason) where the two rows were measured with other settings.
    Figures are compared only between runs on the same device with the same torch (see
    machine_difference, which the caller checks first)."""
    now = {r["name"]: r for r in new["results"] if r["status"] == "ok"}
    rows = []
    for old in baseline["results"]:
        if old["status"] != "ok":
            continue
        row = {
            "name": old["name"],
            "metric": "",
            "baseline": None,
            "new": None,
            "change_pct": None,
            "reason": "",
        }
        if old["name"] not in now:
            rows.append(row | {"verdict": "missing", "reason": "no measured result of this name"})
            continue
        differs = settings_difference(now[old["name"]], old)
        if differs:
            rows.append(row | {"verdict": "not comparable", "reason": differs})
            continue
        for metric, higher_is_better in METRICS.items():
            before, after = old.get(metric), now[old["name"]].get(metric)
            if not before or after is None:
                continue
            change = (after - before) / before * 100
            gain = change if higher_is_better else -change
            verdict = (
                "worse" if gain < -tolerance_pct else "better" if gain > tolerance_pct else "within"
            )
            rows.append(
                row
                | {
                    "metric": metric,
                    "baseline": before,
                    "new": after,
                    "change_pct": change,
                    "verdict": verdict,
                }
            )
    return rows


def verdict(rows: list[dict[str, Any]], tolerance_pct: float) -> tuple[int, str]:
    """(exit status, one line): 1 when a figure is worse or a result missing, else 2 when some
    result or every figure could not be compared, else 0."""
    worse = [r for r in rows if r["verdict"] in ("worse", "missing")]
    if worse:
        return (
            1,
            f"regression: {len(worse)} of {len(rows)} figures worse than the baseline by over "
            f"{tolerance_pct}%",
        )
    apart = [r for r in rows if r["verdict"] == "not comparable"]
    if apart or not rows:
        return (
            2,
            f"not comparable: {len(apart)} of {len(rows)} results were measured with other "
            "settings",
        )
    return 0, f"no regression: every figure within {tolerance_pct}% of the baseline or better"


def comparison_table(rows: list[dict[str, Any]]) -> str:
    cells = [
        [
            r["name"],
            r["metric"],
            fmt(r["baseline"], ",.4g"),
            fmt(r["new"], ",.4g"),
            fmt(r["change_pct"], "+.1f", suffix="%"),
            r["verdict"] + (f" ({r['reason']})" if r["reason"] else ""),
        ]
        for r in rows
    ]
    return markdown_table(["config", "figure", "baseline", "new", "change", "verdict"], cells)
