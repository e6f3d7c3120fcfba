"""lab/gpu_suite.py's own settings: a budget or a folder that means nothing is refused in one
'error: ' line, exit status 2 (1 for an earlier results.json that is not the suite's), before
anything is written; and the folders it accepts. The steps themselves run in `make gpu-dry-run`."""

import json
from pathlib import Path
from typing import NamedTuple

import pytest

from conftest import ROOT, assert_one_line_error, contents, run_script
from lab import gpu_suite

SUITE = "lab/gpu_suite.py"
IN_REPO = "lab/suite-results"  # not ignored by git (out*/ would be)


class Case(NamedTuple):
    flags: str  # space-separated; {dir} is the case's own folder
    names: tuple[str, ...]  # what the error line must say
    files: dict[str, str] = {}  # made in the folder first
    status: int = 2


NANOGPT_PART = {"nanogpt/train.py": "", "nanogpt/model.py": ""}
RESULTS = "{dir}/out"  # a folder holding an earlier results.json

CASES = {
    "budget_s=-5": Case(
        "--out={dir}/out --part=bench --budget_s=-5",
        ("budget_s must be 0 (the part's default) or at", "not -5"),
    ),
    "budget_s=10": Case(
        "--out={dir}/out --part=bench --budget_s=10", ("at least 30 seconds", "not 10")
    ),
    "budget_s=nan": Case(
        "--out={dir}/out --part=bench --budget_s=nan", ("must be a finite number", "not nan")
    ),
    "budget_s=inf": Case(
        "--out={dir}/out --part=bench --budget_s=inf", ("must be a finite number", "not inf")
    ),
    "budget_s=text": Case(
        "--out={dir}/out --part=bench --budget_s=soon", ("budget_s must be float", "'soon'")
    ),
    "part_missing": Case(
        "--out={dir}/out",
        ("part=tests|bench|losses|lowmem|generate is required (or dry_run=True)",),
    ),
    "part_unknown": Case(
        "--out={dir}/out --part=ladder", ("part must be one of tests, bench,", "'ladder'")
    ),
    "out_missing": Case("--part=bench", ("out must be a path, not ''",)),
    "out_empty": Case("--out= --part=bench", ("out must be a path, not ''",)),
    "out_a_file": Case(
        "--out={dir}/notes.txt --part=bench",
        ("out must be a folder (this is a file)", "notes.txt"),
        {"notes.txt": "x"},
    ),
    "out_below_a_file": Case(
        "--out={dir}/notes.txt/out --part=bench",
        ("out must be a path in folders", "notes.txt"),
        {"notes.txt": "x"},
    ),
    "out_in_the_repository": Case(
        f"--out={IN_REPO} --part=bench", ("outside this repository, or one git ignores",)
    ),
    "out_the_repository": Case(
        "--out=. --part=bench", ("outside this repository, or one git ignores",)
    ),
    "nanogpt_not_a_checkout": Case(
        "--out={dir}/out --part=bench --nanogpt={dir}/nanogpt",
        ("must be a nanoGPT checkout", "has no bench.py, configurator.py"),
        NANOGPT_PART,
    ),
    "results_not_json": Case(
        f"--out={RESULTS} --part=bench --budget_s=30",
        ("results.json is not the suite's",),
        {"out/results.json": '{"rows": ['},
        1,
    ),
    "results_not_utf8": Case(
        f"--out={RESULTS} --part=bench --budget_s=30",
        ("not the suite's",),
        {"out/results.json": "\udcff"},
        1,
    ),
    "results_of_something_else": Case(
        f"--out={RESULTS} --part=bench --budget_s=30",
        ("not the suite's",),
        {"out/results.json": json.dumps({"kind": "ladder", "results": []})},
        1,
    ),
    "results_rows_of_another_part": Case(
        f"--out={RESULTS} --part=bench --budget_s=30",
        ("not the suite's",),
        {"out/results.json": json.dumps({"rows": [{"part": "ladder"}], "parts": {}})},
        1,
    ),
    "results_a_folder": Case(
        f"--out={RESULTS} --part=bench --budget_s=30",
        ("not the suite's",),
        {"out/results.json/x": "x"},
        1,
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_refused_in_one_line_before_anything_is_written(name: str, tmp_path: Path):
    case = CASES[name]
    for path, text in case.files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(text.encode(errors="surrogateescape"))
    before = contents(tmp_path)
    result = run_script(SUITE, *case.flags.replace("{dir}", str(tmp_path)).split(), timeout=120)
    assert_one_line_error(result, *case.names)
    assert result.returncode == case.status
    assert contents(tmp_path) == before
    assert not (ROOT / IN_REPO).exists()


@pytest.mark.parametrize("out", ["out-gpu", "out-gpu/part/deeper", "{tmp}/new", "{tmp}"])
def test_folders_the_suite_accepts(out: str, tmp_path: Path):
    gpu_suite.suite_folder(out.replace("{tmp}", str(tmp_path)))  # raises ValueError if refused
