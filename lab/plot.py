"""Draw the curves of one or more training runs from their out_dir/log.jsonl into one PNG, to
compare them at a glance: loss (step loss, and the train and val estimates of the evals), learning
rate, tokens/s and ms per iteration.

    python lab/plot.py out-shakespeare-char     # writes out-shakespeare-char/curves.png
    python lab/plot.py out-a out-b out-c        # writes curves.png here, one colour per run
    python lab/plot.py out-a out-b --out=compare/ab.png

A log.jsonl that holds several runs appended (a resumed run, or one started again in the same
out_dir) is drawn as one line per run, in the same colour. Each run's first step record is left out
of the speed panels: it includes compilation and warm-up.
"""

import json
import os
import sys
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

from configurator import configure
from lab import charts
from nanogpt_perf.config import setting
from nanogpt_perf.errors import UserError, report_errors
from nanogpt_perf.files import read_file
from nanogpt_perf.guard.paths import check_path, output_file

Points = tuple[list[float], list[float]]  # iters, values
Curves = dict[str, Points]  # one run's series, by log key


def read_log(path: Path) -> list[dict[str, Any]]:
    """The records of a log.jsonl, in order; blank lines are skipped."""
    try:
        text = read_file(path).decode()  # a FIFO or a folder: files.ReadFailed, one line naming it
    except UnicodeDecodeError as e:
        raise UserError(f"cannot read {path}: {e}") from None
    records = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path} line {n} is not JSON ({e.msg}): {line[:60]!r}") from None
        except RecursionError:
            raise UserError(
                f"{path} line {n} is not a log record: its JSON is nested too deeply to read"
            ) from None
        if not isinstance(record, dict):
            raise UserError(f"{path} line {n} is not a JSON object: {line[:60]!r}")
        records.append(record)
    return records


def split_runs(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The records of each run appended to one log: a new run starts where iter or elapsed_s goes
    back down (a resumed run goes on from its checkpoint's iter, but its clock starts again)."""
    runs: list[list[dict[str, Any]]] = []
    previous: dict[str, Any] = {}
    for record in records:
        restarted = any(
            isinstance(record.get(k), (int, float))
            and isinstance(previous.get(k), (int, float))
            and record[k] < previous[k]
            for k in ("iter", "elapsed_s")
        )
        if restarted or not runs:
            runs.append([])
        runs[-1].append(record)
        previous = record
    return runs


def step_loss(record: dict[str, Any]) -> Any:
    return record.get("step_loss", record.get("loss"))  # logs of older runs say "loss"


def points(records: list[dict[str, Any]], value: Any) -> Points:
    """(iter, value(record)) of the records where both are numbers; value is a log key or a function
    of a record."""
    get = value if callable(value) else lambda r: r.get(value)
    pairs = [(r.get("iter"), get(r)) for r in records]
    number = lambda x: isinstance(x, (int, float))
    pairs = [(i, v) for i, v in pairs if number(i) and number(v)]
    return [i for i, _ in pairs], [v for _, v in pairs]


def curves(records: list[dict[str, Any]]) -> Curves:
    """The series of one run's records."""
    steps = [r for r in records if step_loss(r) is not None]
    evals = [r for r in records if "val_loss" in r]
    steady = steps[1:]  # the first step record is timed alone: compilation and warm-up
    return {
        "step_loss": points(steps, step_loss),
        "val_loss": points(evals, "val_loss"),
        "train_loss": points(evals, "train_loss"),
        "lr": points(records, "lr"),
        "tokens_per_s": points(steady, "tokens_per_s"),
        "ms_per_iter": points(steady, "ms_per_iter"),
        "step_ms": points(steady, "step_ms"),
        "hellaswag_acc_norm": points(records, "hellaswag_acc_norm"),
        "hellaswag_acc": points(records, "hellaswag_acc"),
    }


def load_curves(out_dir: Path) -> list[Curves]:
    """The curves of each run in out_dir/log.jsonl."""
    path = out_dir / "log.jsonl"
    try:
        check_path(str(out_dir))
    except ValueError as e:
        raise UserError(f"OUT_DIR must be {e}, got {out_dir}") from None
    if not os.path.lexists(path):
        raise UserError(f"no log.jsonl in {out_dir}: train with out_dir={out_dir} first")
    records = read_log(path)
    if not points(records, step_loss)[0]:
        raise UserError(
            f"{path} has no step records (a number for iter and for step_loss): the run logged no "
            "optimizer step"
        )
    return [curves(run) for run in split_runs(records)]


def run_names(out_dirs: list[Path]) -> list[str]:
    """Each run's directory name, or its path where two runs share a name."""
    names = [d.resolve().name or str(d) for d in out_dirs]
    return [str(d) if names.count(n) > 1 else n for d, n in zip(out_dirs, names, strict=True)]


@dataclass(frozen=True)
class PlotConfig:
    out: str = setting(
        "",
        "the PNG to write ('' = OUT_DIR/curves.png for one run, curves.png here for several)",
        check=output_file(".png"),
    )


def main(argv: list[str] | None = None) -> None:
    """plot.py OUT_DIR [OUT_DIR ...] [--out=FILE.png]: the OUT_DIRs are the arguments that are no
    flag."""
    argv = sys.argv[1:] if argv is None else argv
    flags = [a for a in argv if a.startswith("-")]
    out_dirs = [Path(a) for a in argv if not a.startswith("-")]
    cfg = configure(flags, usage="OUT_DIR [OUT_DIR ...] [--key=value ...]", plot=PlotConfig)
    if not out_dirs and "--help" not in flags:
        raise UserError(
            "plot.py needs one or more OUT_DIRs: folders of runs, each with a log.jsonl"
        )
    default = out_dirs[0] / "curves.png" if len(out_dirs) == 1 else Path("curves.png")
    out = Path(cfg.out) if cfg.out else default
    try:  # the default too: OUT_DIR/curves.png where OUT_DIR is a file, say
        output_file(".png", optional=False)(str(out))
    except ValueError as e:
        raise UserError(f"out must be {e}, not {out}") from None
    if find_spec("matplotlib") is None:  # before reading the logs: the first thing to know
        raise UserError("plot.py needs matplotlib: pip install matplotlib")
    runs = dict(zip(run_names(out_dirs), map(load_curves, out_dirs), strict=True))
    print(charts.run_curves(runs, out))  # a disk that will not take it: files.WriteFailed


if __name__ == "__main__":
    report_errors()
    main(sys.argv[1:])
