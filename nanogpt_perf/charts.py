"""Charts as PNG files, drawn off screen by matplotlib (Agg: no display needed): bench.py's, the time-to-loss
report's, the GPU suite's and plot.py's curves. matplotlib is optional (the dev extra): without it figure() is None
and a report says so in one line (NO_MATPLOTLIB) instead of drawing. This module imports matplotlib only when asked."""

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
    """plt.subplots(*args, **kwargs) off screen: (fig, axes), or None where matplotlib is not installed."""
    plt = pyplot()
    return None if plt is None else plt.subplots(*args, **kwargs)


def save(fig: Any, path: Path, dpi: int) -> str:
    """fig written to path as a PNG atomically (a reader never sees half a chart; a full disk is one line and the
    previous file kept), then closed; 'wrote PATH'."""
    try:
        write_atomically(path, lambda f: fig.savefig(f, dpi=dpi, format="png"))
    finally:
        close(fig)
    return f"wrote {path}"


def close(fig: Any) -> None:
    """Forget a figure (pyplot keeps every figure it made until it is closed)."""
    import matplotlib.pyplot as plt

    plt.close(fig)
