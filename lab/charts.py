"""The lab's one chart helper: PNG files drawn off screen by matplotlib (a Figure made without
pyplot: no display, and nothing keeps it once dropped). matplotlib is optional (the dev extra),
imported only when asked: without it figure() is None and a writer returns NO_MATPLOTLIB, one
line, instead of drawing. Every writer saves atomically (a reader never sees half a chart; a full
disk is one line, files.WriteFailed, the previous file kept) and returns the line to print:
bench_bars (bench.py), run_curves (lab/plot.py), loss_curves (lab/time_to_loss.py).
"""

if __name__ == "__main__":  # run as a script, it would fail at its imports
    raise SystemExit("error: charts.py is a module of the lab's scripts: run one of those (--help)")

from collections.abc import Callable
from pathlib import Path
from typing import Any

from nanogpt_perf.files import write_atomically

NO_MATPLOTLIB = "no chart: matplotlib is not installed (pip install matplotlib)"


def figure(*args: Any, figsize: Any = None, layout: str | None = None, **kwargs: Any) -> Any:
    """A figure of figsize inches and its axes, fig.subplots(*args, **kwargs): (fig, axes), or
    None without matplotlib."""
    try:
        import matplotlib.figure
    except ImportError:
        return None
    fig = matplotlib.figure.Figure(figsize=figsize, layout=layout)
    return fig, fig.subplots(*args, **kwargs)


def save(fig: Any, path: Path, dpi: int) -> str:
    """fig written to path as a PNG atomically; 'wrote PATH'."""
    write_atomically(path, lambda f: fig.savefig(f, dpi=dpi, format="png"))
    return f"wrote {path}"


def bench_bars(path: Path, doc: dict[str, Any]) -> str:
    """bench.py's chart: a horizontal bar per result, median ms/iter with a whisker to p90,
    labelled with the speed-up over the first."""
    results, m = doc["results"], doc["manifest"]
    if (made := figure(figsize=(9, 1.5 + 0.45 * len(results)))) is None:
        return NO_MATPLOTLIB
    fig, ax = made
    median = [r["ms_median"] or 0.0 for r in results]
    p90 = [(r["ms_p90"] or 0.0) - m for r, m in zip(results, median, strict=True)]
    ax.barh(range(len(p90)), median, xerr=[[0] * len(p90), p90], color="tab:blue", capsize=3)
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


# lab/plot.py's curves: each panel's title and y label; each series' panel, the label of its style
# in the panel's legend, and its style
FIGSIZE, DPI = (12, 8), 100  # inches, at DPI: 1200 x 800 pixels
PANELS = [
    ("loss", "loss"),
    ("learning rate", "learning rate"),
    ("tokens/s (first step left out: compilation, warm-up)", "tokens/s"),
    ("time per iteration (first step left out)", "ms"),
    ("HellaSwag (GPT-2 124M: acc_norm 0.2955)", "accuracy"),
]
SERIES = {
    "step_loss": (0, "step loss", dict(ls="-", lw=1, alpha=0.7)),
    "train_loss": (0, "train loss (eval)", dict(ls="--", marker="s", lw=1, ms=3, alpha=0.8)),
    "val_loss": (0, "val loss (eval)", dict(ls="-", marker="o", lw=1.5, ms=5)),
    "lr": (1, "", dict(ls="-", lw=1.2)),
    "tokens_per_s": (2, "", dict(ls="-", marker=".", lw=1, ms=3)),
    "ms_per_iter": (3, "ms/iter (the whole loop)", dict(ls="-", marker=".", lw=1, ms=3)),
    "step_ms": (3, "step_ms (the training step)", dict(ls=":", lw=1.2)),
    "hellaswag_acc_norm": (4, "acc_norm", dict(ls="-", marker="o", lw=1.5, ms=5)),
    "hellaswag_acc": (4, "acc", dict(ls="--", marker="s", lw=1, ms=3, alpha=0.8)),
}


def draw_run(axes: list[Any], runs: list[dict[str, Any]], colour: str) -> None:
    """One run's lines, one per run appended to its log, in each panel."""
    for c in runs:
        for key, (panel, _, style) in SERIES.items():
            # an empty series would still count as data and hide the panel's "no records" note
            if c[key][0] and panel < len(axes):
                lone = {"marker": style.get("marker") or "."} if len(c[key][0]) == 1 else {}
                axes[panel].plot(*c[key], color=colour, **(style | lone))


def run_curves(runs: dict[str, list[dict[str, Any]]], path: Path) -> str:
    """lab/plot.py's chart: four panels (a fifth, HellaSwag, when a run scored it), one colour per
    run; runs: name -> the curves (key -> (iters, values)) of each run appended to its log."""
    hellaswag = any(c["hellaswag_acc_norm"][0] for run in runs.values() for c in run)
    made = figure(2, 3 if hellaswag else 2, figsize=FIGSIZE, sharex=True, layout="constrained")
    if made is None:
        return NO_MATPLOTLIB
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter

    fig, grid = made
    axes = list(grid[:, :2].flat)  # loss, learning rate; tokens/s, ms
    if hellaswag:
        axes.append(grid[0, 2])
        grid[1, 2].set_visible(False)
    for i, run in enumerate(runs.values()):
        draw_run(axes, run, f"C{i}")
    for panel, (ax, (title, ylabel)) in enumerate(zip(axes, PANELS, strict=False)):
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if not ax.has_data():
            grey = dict(transform=ax.transAxes, ha="center", va="center", color="grey")
            ax.text(0.5, 0.5, "no records", **grey)
            ax.set_yticks([])
        # a legend of the panel's line styles, in grey: the colours are the runs', in the figure's
        if styles := {label: s for p, label, s in SERIES.values() if p == panel and label}:
            lines = [Line2D([], [], color="grey", **s) for s in styles.values()]
            ax.legend(lines, list(styles), fontsize=8)
    _, lr, speed, ms = axes[:4]
    for ax in (speed, ms):
        ax.set_xlabel("iter")
        ax.set_ylim(bottom=0)
    speed.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    lr.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    colours = [Line2D([], [], color=f"C{i}", lw=2) for i in range(len(runs))]
    fig.legend(colours, list(runs), loc="outside lower center", ncols=min(len(runs), 5), fontsize=9)
    fig.suptitle(", ".join(runs))
    return save(fig, path, dpi=DPI)


def loss_curves(
    path: Path, curves: dict[str, Any], summary: dict[str, Any], title: str, median_curve: Callable
) -> str:
    """lab/time_to_loss.py's chart: val loss against tokens and against training seconds, per
    configuration the median over seeds as a line and the seeds' range as a band, the target
    dashed. curves: name -> its seeds' curves; median_curve(runs, axis): lab/ttl_curves.py's."""
    if (made := figure(1, 2, figsize=(13, 5), sharey=True, layout="constrained")) is None:
        return NO_MATPLOTLIB
    fig, axes = made
    target, lowest, highest = summary["target"], [], []
    most = max((c["tokens"][-1] for run in curves.values() for c in run if c["tokens"]), default=0)
    per, unit = (1e6, "millions") if most >= 1e6 else (1e3, "thousands")
    for i, (name, runs) in enumerate(curves.items()):
        for ax, axis in zip(axes, ("tokens", "seconds"), strict=True):
            xs, median, low, high = median_curve(runs, axis)
            xs = [x / per for x in xs] if axis == "tokens" else xs
            ax.plot(xs, median, color=f"C{i}", lw=1.5, label=name)
            ax.fill_between(xs, low, high, color=f"C{i}", alpha=0.2, lw=0)
            if low:  # a configuration every seed of which diverged at once has none
                lowest.append(min(low))
                highest.append(max(high))
    if not lowest:
        return "no chart: no run has a finite val loss"
    labels = (f"tokens ({unit})", "training seconds (evals left out)")
    for ax, label in zip(axes, labels, strict=True):
        if target is not None:
            ax.axhline(target, color="grey", ls="--", lw=1)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    # the last stretch, where the configurations part and cross the target, not the first evals
    bottom = min(lowest)
    ends = [target, *(row["final_val_loss"]["median"] for row in summary["rows"].values())]
    worst_end = max((end for end in ends if end is not None), default=bottom)
    top = max(highest)
    top = min(top, bottom + 3 * (worst_end - bottom)) if worst_end > bottom else top
    if top > bottom:  # not a single point
        axes[0].set_ylim(bottom - 0.02 * (top - bottom), top)
    axes[0].set_ylabel("val loss (median over seeds; band: min to max)")
    axes[0].legend(fontsize=8)
    shown = "no target" if target is None else f"target val loss {target:.4f} (dashed)"
    fig.suptitle(f"{title}: {shown}", fontsize=10)
    return save(fig, path, dpi=110)
