"""The lab's one chart helper: PNG files drawn off screen by matplotlib (Agg: no display needed).
matplotlib is optional (the dev extra): without it figure() is None and a writer returns
NO_MATPLOTLIB, one line, instead of drawing; this module imports matplotlib only when asked. Every
writer saves atomically (a reader never sees half a chart; a full disk is one line,
files.WriteFailed, the previous file kept) and returns the line to print.

The API (stable; lab/*.py, bench.py and plot.py call it):
- NO_MATPLOTLIB: what a writer returns where matplotlib is not installed
- pyplot(): matplotlib.pyplot drawing to files, or None
- figure(*args, **kwargs): plt.subplots(*args, **kwargs) off screen, (fig, axes), or None
- save(fig, path, dpi): fig written to path as a PNG and closed; 'wrote PATH'
- close(fig): forget a figure without saving it
- bench_bars(path, doc): bench.py's chart of its results document (median ms/iter, whisker to p90)
"""

from pathlib import Path
from typing import Any

from nanogpt_perf.files import write_atomically

NO_MATPLOTLIB = "no chart: matplotlib is not installed (pip install matplotlib)"


def pyplot() -> Any | None:
    """matplotlib.pyplot drawing to files (Agg), or None where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def figure(*args: Any, **kwargs: Any) -> tuple[Any, Any] | None:
    """plt.subplots(*args, **kwargs) off screen: (fig, axes), or None without matplotlib."""
    plt = pyplot()
    return None if plt is None else plt.subplots(*args, **kwargs)


def save(fig: Any, path: Path, dpi: int) -> str:
    """fig written to path as a PNG atomically, then closed; 'wrote PATH'."""
    try:
        write_atomically(path, lambda f: fig.savefig(f, dpi=dpi, format="png"))
    finally:
        close(fig)
    return f"wrote {path}"


def close(fig: Any) -> None:
    """Forget a figure (pyplot keeps every figure it made until it is closed)."""
    import matplotlib.pyplot as plt

    plt.close(fig)


def bench_bars(path: Path, doc: dict[str, Any]) -> str:
    """bench.py's chart: a horizontal bar per result, median ms/iter with a whisker to p90,
    labelled with the speed-up over the first."""
    results, m = doc["results"], doc["manifest"]
    if (made := figure(figsize=(9, 1.5 + 0.45 * len(results)))) is None:
        return NO_MATPLOTLIB
    fig, ax = made
    median = [r["ms_median"] or 0.0 for r in results]
    p90 = [(r["ms_p90"] or 0.0) - (r["ms_median"] or 0.0) for r in results]
    whisker = [[0] * len(results), p90]
    ax.barh(range(len(results)), median, xerr=whisker, color="tab:blue", capsize=3)
    for i, r in enumerate(results):
        ms, speedup = r["ms_median"], r["speedup_first"]
        label = f" {ms:,.1f} ms ({speedup:.2f}x)" if r["status"] == "ok" else f" {r['status']}"
        ax.text(median[i] + p90[i], i, label, va="center", fontsize=8)
    ax.set_yticks(range(len(results)), [r["name"] for r in results], fontsize=8)
    ax.invert_yaxis()
    ax.margins(x=0.3)  # room for the labels right of the longest bar
    ax.set_xlabel("ms per iteration (median, whisker to p90; lower is better)")
    dirty = "+dirty" if m["git_dirty"] else ""
    where = f"{m['device_name']}, torch {m['torch']}, {m['git_commit'][:10]}{dirty}"
    ax.set_title(f"{doc['kind']}: {where}", fontsize=9)
    fig.tight_layout()
    return save(fig, path, dpi=120)
