"""What scripts/gpu_suite.py's command line may be: its flags, each mistake one line ('error: ...', exit status 2)
before anything is written, and the results.json an earlier invocation left in --out (one that is not the suite's is
refused with exit status 1)."""

import argparse
import math
import subprocess
import sys
from pathlib import Path
from typing import Any, NoReturn

from gpu_suite_io import ROOT, load_results

RESERVE_S = 10  # of a part's budget, kept for writing its outputs
MIN_BUDGET_S = 30  # the least --budget_s that leaves a step time to run


class Parser(argparse.ArgumentParser):
    """argparse whose refusals are one line, 'error: ...', with exit status 2 (no usage block)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message}\n")


def parse_args(description: str, parts: list[str]) -> argparse.Namespace:
    """The suite's flags, each mistake one line and exit status 2 before anything is written."""
    parser = Parser(description=description)
    parser.add_argument("--out", required=True, help="the output folder (results.*, PART-logs.tar.gz)")
    parser.add_argument("--part", choices=[*parts, "all"], help="what to measure (the dry run: all by default)")
    parser.add_argument("--nanogpt", type=Path, help="a nanoGPT checkout: also time its train.py, bench.py, generate")
    parser.add_argument("--dry-run", action="store_true", help="every step on the CPU with a tiny model")
    parser.add_argument("--budget_s", type=float, help="seconds a part may take (default 525; dry run 600)")
    args = parser.parse_args()
    if args.part is None and not args.dry_run:
        parser.error(f"--part={'|'.join([*parts, 'all'])} is required (or --dry-run)")
    if args.budget_s is not None and not (math.isfinite(args.budget_s) and args.budget_s >= MIN_BUDGET_S):
        parser.error(
            f"--budget_s must be a finite number of seconds >= {MIN_BUDGET_S} (a part keeps {RESERVE_S} s for its "
            f"outputs), not {args.budget_s:g}"
        )
    if problem := out_problem(args.out):
        parser.error(problem)
    args.out = Path(args.out).resolve()
    if args.nanogpt is not None:
        args.nanogpt = args.nanogpt.resolve()
        files = ("train.py", "bench.py", "model.py", "configurator.py", "config/train_gpt2.py")
        if lacking := [f for f in files if not (args.nanogpt / f).is_file()]:
            parser.error(f"--nanogpt={args.nanogpt} is not a nanoGPT checkout: no {', '.join(lacking)}")
    return args


def out_problem(name: str) -> str | None:
    """What is wrong with --out as the suite's output folder: empty, a file or below one, or inside this repository
    where git would see what the suite writes (a folder .gitignore ignores, out-gpu say, is fine)."""
    if not name:
        return "--out must name a folder, not ''"
    out = Path(name).resolve()
    if out.exists() and not out.is_dir():
        return f"--out={out} is a file, not a folder"
    if file := next((a for a in out.parents if a.exists() and not a.is_dir()), None):
        return f"--out={out}: {file} is a file, not a folder"
    if not out.is_relative_to(ROOT):
        return None
    if ".git" in out.relative_to(ROOT).parts:
        return f"--out={out} is inside git's own folder"
    try:  # whether git ignores what the suite writes there; None outside a git checkout or without git
        check = ["git", "-C", str(ROOT), "check-ignore", "-q", str(out / "results.json")]
        ignored = subprocess.run(check, capture_output=True).returncode
    except OSError:
        return None
    if ignored == 1:
        return f"--out={out} is inside the repository and not ignored by git: use a folder outside it, or out-gpu"
    return None


def load_doc(path: Path, parts: list[str]) -> dict[str, Any]:
    """The rows an earlier invocation left in path (results.json), or none; one error line for a file that is not
    the suite's."""
    refuse = f"error: {path} is not the suite's results.json: move it away or choose another --out"
    if path.exists() and not path.is_file():
        sys.exit(refuse)
    try:
        doc = load_results(path)
    except (OSError, ValueError):  # unreadable, not UTF-8, not JSON
        sys.exit(refuse)
    if not (isinstance(doc, dict) and isinstance(doc.get("rows"), list) and isinstance(doc.get("parts"), dict)):
        sys.exit(refuse)
    if set(doc["parts"]) - set(parts) or any(
        not isinstance(r, dict) or r.get("part") not in parts for r in doc["rows"]
    ):
        sys.exit(refuse)
    return doc
