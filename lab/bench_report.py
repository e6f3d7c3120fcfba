"""What bench.py prints and writes: the results and where-the-time-goes tables, JSON, CSV and a bar
chart."""

if __name__ == "__main__":  # run as a script, it would fail at its imports
    raise SystemExit("error: bench_report.py is a module of bench.py: run bench.py (--help)")

import csv
import io
from collections.abc import Collection
from pathlib import Path
from typing import Any

from lab.bench_measure import FIGURES
from lab.charts import bench_bars
from nanogpt_perf.files import write_json, write_text
from nanogpt_perf.timing import PHASES


def markdown_table(headers: list[str], rows: list[list[str]], left: Collection[int] = (0,)) -> str:
    """rows under headers, each column as wide as its widest cell: the columns numbered in left
    aligned left (names, notes), the others right (figures)."""
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        aligned = [
            c.ljust(w) if i in left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "| " + " | ".join(aligned) + " |"

    return "\n".join(
        [line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)]
    )


def fmt(value: Any, spec: str = ",.2f", scale: float = 1, suffix: str = "") -> str:
    return "-" if value is None else f"{value * scale:{spec}}{suffix}"


def report(results: list[dict[str, Any]], device_type: str) -> str:
    """The results table, the where-time-goes table and the notes beneath them, as bench.py prints
    them."""
    cuda = device_type == "cuda"
    main, detail, notes = [], [], []
    mib = lambda b: fmt(b, ",.0f", 2**-20, " MiB")
    for r in results:
        if r["status"] != "ok":
            main.append([r["name"], r["status"], *["-"] * 7])
            notes.append(f"{r['name']}: {r['status']}: {r['reason']}")
            continue
        main.append(
            [
                r["name"],
                fmt(r["ms_median"]),
                fmt(r["ms_p90"]),
                fmt(r["tokens_per_s"], ",.0f"),
                fmt(r["mfu"], ".1f", 100, "%") if r["mfu"] is not None else "n/a",
                mib(r["peak_mem_bytes"]),
                mib(r["peak_reserved_bytes"]) if cuda else "n/a",
                fmt(r["speedup_prev"], ".2f", suffix="x"),
                fmt(r["speedup_first"], ".2f", suffix="x"),
            ]
        )
        detail.append(
            [r["name"], *(fmt(r["phases_ms"][p]) for p in PHASES)]
            + [
                fmt(r["first_iter_ms"], ",.0f"),
                fmt(r["compile_s"], ".1f"),
                fmt(r["recompiles"], "d"),
                r["sdpa_kernel"],
            ]
        )
        if r["recompiles"]:
            notes.append(
                f"warning: {r['name']}: {r['recompiles']} recompilation(s) after the first "
                "iteration, so timed "
                "iterations may include compiling; TORCH_LOGS=recompiles says why"
            )
        if r["graph_breaks"]:
            notes.append(
                f"warning: {r['name']}: {r['graph_breaks']} graph break(s); "
                "TORCH_LOGS=graph_breaks says where"
            )
    headers = [
        "config",
        "ms/iter",
        "p90 ms",
        "tokens/s",
        "MFU",
        "peak mem",
        "reserved",
        "vs prev",
        "vs first",
    ]
    out = [markdown_table(headers, main)]
    if detail:
        headers = [
            "config",
            *(f"{p} ms" for p in PHASES),
            "first iter ms",
            "compile s",
            "recompiles",
            "SDPA kernel",
        ]
        out += ["", "where the time goes (median ms per phase):", markdown_table(headers, detail)]
    if memory := memory_rows(results):
        headers = ["config", *MEMORY_PARTS.values()]
        out += [
            "",
            "bytes per parameter, measured (arithmetic of the formats):",
            markdown_table(headers, memory),
        ]
        notes.append(
            MEMORY_NOTE + ("CUDA's allocated bytes" if cuda else "the process's resident set")
        )
    notes += [
        "ms/iter: median (and p90) over the timed iterations, each between device "
        "synchronisations; "
        "speed-ups are ratios of tokens/s",
        "peak mem: "
        + (
            "peak allocated by CUDA tensors; reserved: held by the caching allocator"
            if cuda
            else "the process's peak resident set (reset before each config where Linux allows, "
            "else its peak so far); reserved: n/a off CUDA"
        ),
        "phases: "
        + ("CUDA events on the device's timeline" if cuda else "perf_counter after synchronising")
        + "; all-reduce: not measured (bench.py runs one process, without DDP)",
        "compile s: first iteration minus the median, i.e. compilation plus one-off warm-up",
    ]
    return "\n".join(out + ["", *(f"- {n}" for n in notes)])


MEMORY_PARTS = {
    "weights": "weights",
    "grads": "gradients",
    "optimizer": "optimizer state",
    "state": "state",
}
MEMORY_PARTS |= {"activations": "activations + workspace", "peak": "peak rise"}
MEMORY_NOTE = (
    "bytes per parameter: the state's parts from its tensors' storages as backward ends "
    "(gradients at their fullest), the peak rise (the step's process peak less what the process "
    "held before the model was built), and its rest activations and workspace; measured by "
)


def memory_rows(results: list[dict[str, Any]]) -> list[list[str]]:
    """Each measured row's bytes per parameter by part, with the formats' arithmetic beside the
    state's parts."""
    rows = []
    for r in results:
        measured, arithmetic = r.get("memory"), r.get("memory_arithmetic") or {}
        if r["status"] == "ok" and measured:
            cells = [
                fmt(measured[k]) + (f" ({arithmetic[k]:.2f})" if k in arithmetic else "")
                for k in MEMORY_PARTS
            ]
            rows.append([r["name"], *cells])
    return rows


def beside(out_json: str, suffix: str, default: str) -> Path:
    """A path next to out_json with this suffix, or default in the working directory when there is
    no out_json."""
    return Path(out_json).with_suffix(suffix) if out_json else Path(default)


CSV_MANIFEST = ("git_commit", "git_dirty", "torch", "cuda", "device_name")


def write_outputs(out_json: Path, doc: dict[str, Any]) -> list[str]:
    """out_json, and a CSV and a PNG bar chart beside it; returns one line per file (or why there is
    no chart)."""
    write_json(out_json, doc)
    csv_path = out_json.with_suffix(".csv")
    rows = io.StringIO(newline="")
    writer = csv.writer(rows)
    settings, figures = (
        list(doc["results"][0]["settings"]),
        [k for k in FIGURES if k != "phases_ms"],
    )
    writer.writerow(
        [
            "name",
            "status",
            "reason",
            *settings,
            *figures,
            *(f"{p}_ms" for p in PHASES),
            *CSV_MANIFEST,
        ]
    )
    for r in doc["results"]:
        phases = r["phases_ms"] or {}
        writer.writerow(
            [
                r["name"],
                r["status"],
                r["reason"],
                *(r["settings"][k] for k in settings),
                *(r[k] for k in figures),
            ]
            + [phases.get(p) for p in PHASES]
            + [doc["manifest"][k] for k in CSV_MANIFEST]
        )
    write_text(csv_path, rows.getvalue())
    return [f"wrote {out_json}", f"wrote {csv_path}", bench_bars(out_json.with_suffix(".png"), doc)]
