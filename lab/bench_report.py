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

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(headers), rule, *map(line, rows)])


def fmt(value: Any, spec: str = ",.2f", scale: float = 1, suffix: str = "") -> str:
    return "-" if value is None else f"{value * scale:{spec}}{suffix}"


def report(results: list[dict[str, Any]], device_type: str) -> str:
    """The results table, the where-time-goes table, the bytes per parameter and the notes beneath
    them, as bench.py prints them."""
    cuda = device_type == "cuda"
    main, detail, memory = [], [], []
    mib = lambda b: fmt(b, ",.0f", 2**-20, " MiB")
    for r in results:
        name = r["name"]
        if r["status"] != "ok":
            main.append([name, r["status"], *["-"] * 7])
            continue
        mfu = fmt(r["mfu"], ".1f", 100, "%") if r["mfu"] is not None else "n/a"
        speed = [fmt(r["ms_median"]), fmt(r["ms_p90"]), fmt(r["tokens_per_s"], ",.0f"), mfu]
        peaks = [mib(r["peak_mem_bytes"]), mib(r["peak_reserved_bytes"]) if cuda else "n/a"]
        ratios = [fmt(r[k], ".2f", suffix="x") for k in ("speedup_prev", "speedup_first")]
        main.append([name, *speed, *peaks, *ratios])
        phases = [fmt(r["phases_ms"][p]) for p in PHASES]
        first = [fmt(r["first_iter_ms"], ",.0f"), fmt(r["compile_s"], ".1f")]
        detail.append([name, *phases, *first, fmt(r["recompiles"], "d"), r["sdpa_kernel"]])
        if measured := r.get("memory"):  # the formats' arithmetic beside the state's parts
            beside = {k: f" ({v:.2f})" for k, v in (r.get("memory_arithmetic") or {}).items()}
            memory.append([name, *(fmt(measured[k]) + beside.get(k, "") for k in MEMORY_PARTS)])
    headers = "config|ms/iter|p90 ms|tokens/s|MFU|peak mem|reserved|vs prev|vs first".split("|")
    out = [markdown_table(headers, main)]
    if detail:
        headers = ["config", *(f"{p} ms" for p in PHASES)]
        headers += ["first iter ms", "compile s", "recompiles", "SDPA kernel"]
        out += ["", "where the time goes (median ms per phase):", markdown_table(headers, detail)]
    if memory:
        table = markdown_table(["config", *MEMORY_PARTS.values()], memory)
        out += ["", "bytes per parameter, measured (arithmetic of the formats):", table]
    return "\n".join(out + ["", *(f"- {n}" for n in notes(results, cuda, bool(memory)))])


def notes(results: list[dict[str, Any]], cuda: bool, memory: bool) -> list[str]:
    """The notes beneath the tables: the rows not measured and why, warnings, and what the figures
    are (memory: with the bytes per parameter)."""
    said = []
    for r in results:
        name = r["name"]
        if r["status"] != "ok":
            said.append(f"{name}: {r['status']}: {r['reason']}")
            continue
        if r["recompiles"]:
            said.append(
                f"warning: {name}: {r['recompiles']} recompilation(s) after the first iteration, "
                "so timed iterations may include compiling; TORCH_LOGS=recompiles says why"
            )
        if r["graph_breaks"]:
            breaks = f"{r['graph_breaks']} graph break(s)"
            said.append(f"warning: {name}: {breaks}; TORCH_LOGS=graph_breaks says where")
    if memory:
        said.append(
            MEMORY_NOTE + ("CUDA's allocated bytes" if cuda else "the process's resident set")
        )
    peak = "peak allocated by CUDA tensors; reserved: held by the caching allocator"
    if not cuda:
        peak = "the process's peak resident set (reset before each config where Linux allows, else "
        peak += "its peak so far); reserved: n/a off CUDA"
    phases = "CUDA events on the device's timeline" if cuda else "perf_counter after synchronising"
    return said + [
        "ms/iter: median (and p90) over the timed iterations, each between device "
        "synchronisations; speed-ups are ratios of tokens/s",
        f"peak mem: {peak}",
        f"phases: {phases}; all-reduce: not measured (bench.py runs one process, without DDP)",
        "compile s: first iteration minus the median, i.e. compilation plus one-off warm-up",
    ]


MEMORY_PARTS = {"weights": "weights", "grads": "gradients", "optimizer": "optimizer state"}
MEMORY_PARTS |= {"state": "state", "activations": "activations + workspace", "peak": "peak rise"}
MEMORY_NOTE = (
    "bytes per parameter: the state's parts from its tensors' storages as backward ends "
    "(gradients at their fullest), the peak rise (the step's process peak less what the process "
    "held before the model was built), and its rest activations and workspace; measured by "
)


CSV_MANIFEST = ("git_commit", "git_dirty", "torch", "cuda", "device_name")


def write_outputs(out_json: Path, doc: dict[str, Any]) -> list[str]:
    """out_json, and a CSV (a row per result: its settings, figures, phases and the manifest's
    CSV_MANIFEST) and a PNG bar chart beside it; returns one line per file (or why there is no
    chart)."""
    write_json(out_json, doc)
    settings = list(doc["results"][0]["settings"])
    figures = [k for k in FIGURES if k != "phases_ms"]
    phases = [f"{p}_ms" for p in PHASES]
    table = [["name", "status", "reason", *settings, *figures, *phases, *CSV_MANIFEST]]
    for r in doc["results"]:
        flat = r | {f"{p}_ms": (r["phases_ms"] or {}).get(p) for p in PHASES}
        cells = [r["settings"][k] for k in settings] + [flat[k] for k in figures + phases]
        manifest = [doc["manifest"][k] for k in CSV_MANIFEST]
        table.append([r["name"], r["status"], r["reason"], *cells, *manifest])
    text = io.StringIO(newline="")
    csv.writer(text).writerows(table)
    csv_path = out_json.with_suffix(".csv")
    write_text(csv_path, text.getvalue())
    return [f"wrote {out_json}", f"wrote {csv_path}", bench_bars(out_json.with_suffix(".png"), doc)]
