"""The docs cannot drift: their settings tables are the declarations, every file they name exists,
and every command of their sh blocks runs as written where it takes seconds, or else reads through
its script's declarations."""

import re
import runpy
import shlex
from pathlib import Path

import pytest

from configurator import read_overrides, sweep_values
from conftest import ROOT, declarations, run_script
from nanogpt_perf.config import declared

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_settings_tables_are_the_declarations():
    tables = runpy.run_path(str(ROOT / "scripts" / "docs_tables.py"))
    written: dict[str, str] = {}
    assert tables["stale"](written) == [], "run python scripts/docs_tables.py"
    assert {"train.py", "bench.py", "sample.py", "hellaswag.py", "export.py"} <= set(written)


# a file named by a path from the root (or from the package, as docs/architecture.md names its
# modules), or by its name alone; placeholders (data/NAME/...), globs and what runs write under
# data/ are not files of the checkout
FOLDERS = (
    "nanogpt_perf",
    "docs",
    "config",
    "data",
    "lab",
    "scripts",
    "tests",
    "train",
    "bench",
    "kernels",
)
PATH = re.compile(r"(?<![\w/.~$-])((?:" + "|".join(FOLDERS) + r")/[\w./*-]*[\w/])")
BARE = re.compile(r"(?<![\w/.~$*-])([a-z_]\w*\.(?:py|md|sh|toml))\b")
LINK = re.compile(r"\]\(([^)#\s]+)\)")


def named_files(text: str) -> set[str]:
    paths = {m[1] for m in PATH.finditer(text)}
    return {p for p in paths if "*" not in p and not re.search("[A-Z]{2,}", p)} - {
        p for p in paths if p.startswith("data/") and not p.endswith(".py")
    }


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_file_the_docs_name_exists(doc):
    text = doc.read_text(encoding="utf-8")
    # train/step.TrainStep: train/step.py
    modules = {p: p.split(".")[0] + ".py" for p in named_files(text)}
    where = [ROOT, ROOT / "nanogpt_perf"]
    missing = [
        p for p, m in modules.items() if not any((d / f).exists() for d in where for f in (p, m))
    ]
    missing += [
        n for n in {m[1] for m in BARE.finditer(text)} if next(ROOT.glob(f"**/{n}"), None) is None
    ]
    missing += [
        t
        for t in {m[1] for m in LINK.finditer(text)}
        if "://" not in t and not (doc.parent / t).exists()
    ]
    assert not missing, f"{doc.name} names files this checkout lacks: {sorted(missing)}"


def test_the_file_check_sees_a_missing_file():
    assert named_files("see `nanogpt_perf/settings.py` and data/NAME/x.txt, data/hellaswag/") == {
        "nanogpt_perf/settings.py"
    }


# the commands of the docs' sh blocks


def doc_commands() -> list[tuple[str, list[str]]]:
    """(doc, words) of every command line of the docs' sh blocks, continuation lines joined,
    comments dropped."""
    found = []
    for doc in DOCS:
        for block in re.findall(r"```sh\n(.*?)```", doc.read_text(encoding="utf-8"), re.DOTALL):
            for line in block.replace("\\\n", " ").splitlines():
                if words := shlex.split(line, comments=True):
                    found.append((doc.name, words))
    return found


def script_and_args(words: list[str]) -> tuple[str, list[str]] | None:
    """A python or torchrun command's script and its arguments; None for another program."""
    if words[0] not in ("python", "python3", "torchrun") or words[1] == "-m":
        return None
    at = next(i for i, w in enumerate(words) if w.endswith(".py") and not w.startswith("-"))
    return words[at], words[at + 1 :]


COMMANDS = doc_commands()
RUN = [(doc, w) for doc, w in COMMANDS if "--help" in w]  # what finishes in seconds as written
MAKE_TARGETS = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE))
DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


@pytest.mark.parametrize("doc, words", RUN, ids=[" ".join(w) for _, w in RUN])
def test_a_doc_command_that_takes_seconds_runs_as_written(doc, words):
    script, args = script_and_args(words)
    result = run_script(script, *args)
    assert result.returncode == 0, result.stderr
    assert "usage: python" in result.stdout


def nanogpt_beside(tmp_path: Path) -> Path:
    """A folder to parse commands in with a nanoGPT checkout beside it, at ../nanoGPT (as the docs
    have it)."""
    for name in ("train.py", "bench.py", "model.py", "configurator.py", "config/train_gpt2.py"):
        (tmp_path / "nanoGPT" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "nanoGPT" / name).write_text("")
    (tmp_path / "here").mkdir()
    return tmp_path / "here"


def parse(script: str, args: list[str], tmp_path: Path, monkeypatch) -> None:
    """Read a command's arguments as its script would, without running it: the configured scripts'
    config files and flags through their declarations (a device this machine lacks taken where it is
    a device's name)."""
    if script == "lab/gpu_suite.py":  # its --nanogpt=../nanoGPT checked where the docs have it
        monkeypatch.chdir(nanogpt_beside(tmp_path))
    if script == "lab/ttl_data.py":
        from lab.ttl_data import BUILT_IN

        assert set(args) <= set(BUILT_IN), args
        return
    found = declarations(script)
    words = {
        k: f.metadata.get("words", ()) for p in found.parts.values() for k, f in declared(p).items()
    }
    given = [
        a if a.startswith("--") else str(ROOT / a)
        for a in args
        if a.startswith("--") or a.endswith(".py")
    ]
    values = read_overrides(found.defaults, words, given)
    if "device" in values:
        assert DEVICE.fullmatch(values.pop("device")), args
    cfg = found.config(**values)
    # bench.py's over its own settings, the benchmark's train.py's
    if cfg.defaults.get("sweep") == "" and cfg.sweep:
        sweep_values(cfg if script == "bench.py" else declarations("train.py").config(), cfg.sweep)


PARSE = [(doc, w) for doc, w in COMMANDS if (doc, w) not in RUN and script_and_args(w) is not None]


@pytest.mark.parametrize("doc, words", PARSE, ids=[" ".join(w)[:120] for _, w in PARSE])
def test_a_doc_command_reads_through_its_scripts_declarations(doc, words, tmp_path, monkeypatch):
    script, args = script_and_args(words)
    assert (ROOT / script).is_file(), script
    parse(script, args, tmp_path, monkeypatch)


def test_the_other_doc_commands_are_make_targets_or_the_device_tools():
    others = [w for _, w in COMMANDS if script_and_args(w) is None]
    for words in others:
        if words[0] == "make":
            assert set(words[1:]) <= MAKE_TARGETS, words
        # docs/gpu.md's lines for the device tool: they install the wheels on a bare GPU machine
        else:
            assert words[:3] == ["python3", "-m", "pip"], words


def named_dataset(script: str, args: list[str]) -> bool:
    """Whether a command's config files or flags set its dataset."""
    found = declarations(script)
    parts = found.parts.values()
    words = {k: f.metadata.get("words", ()) for p in parts for k, f in declared(p).items()}
    kept = [a for a in args if a.startswith("--") or a.endswith(".py")]
    given = [a if a.startswith("--") else str(ROOT / a) for a in kept]  # config files from the root
    return "dataset" in read_overrides(found.defaults, words, given)


TRAIN = [(doc, w) for doc, w in PARSE if script_and_args(w)[0] == "train.py"]


@pytest.mark.parametrize("doc, words", TRAIN, ids=[" ".join(w)[:120] for _, w in TRAIN])
def test_a_doc_training_command_names_its_data(doc, words):
    """A config that changes a run (config/speedrun.py, config/low_memory.py) alone leaves
    train.py's default data, OpenWebText: 18 GB of shards no one prepares by accident. A command
    names its data in a config file or a flag."""
    assert named_dataset(*script_and_args(words)), f"{doc}: {' '.join(words)} names no dataset"
