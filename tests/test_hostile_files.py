"""Files written for a user under hostile conditions: bad inputs and bad output paths refused in one
line with every file as it was; writes that fail (a full disk, a folder in the way, an interruption)
leave the previous file whole and no temporary file; a kill mid-export leaves the old export whole;
a small file system fills up and the printed command resumes the preparation.

The refusals run inside the test process (conftest.run_in_process); the kills and the small file
system need processes of their own (the file system is a tmpfs mounted in a mount namespace of its
own: skipped where that is not allowed)."""

import errno
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

from conftest import (
    DATA,
    REGRESSION,
    ROOT,
    SHARDS,
    B,
    P,
    ScriptCase,
    assert_one_line_error,
    bench_output,
    compare,
    contents,
    hf,
    refuse_script_case,
    run_in_process,
    run_script,
    write_files,
)
from nanogpt_perf import files
from nanogpt_perf.data.dataset import resume_command
from nanogpt_perf.files import (
    WriteFailed,
    replace_folder,
    write_atomically,
    write_bytes,
    write_through_path,
)

OWT, FW, CHAR = (
    "data/openwebtext/prepare.py",
    "data/fineweb/prepare.py",
    "data/shakespeare_char/prepare.py",
)
CKPT = object()  # in Hostile.files: the small checkpoint's bytes
GPT2_CONFIG = json.dumps({"model_type": "gpt2"})
# ~9k tokens
DOCS = "".join(
    json.dumps({"text": f"document {i} " + "word " * (i % 40)}) + "\n" for i in range(300)
)


class Hostile(NamedTuple):
    script: str
    flags: str  # space-separated; {dir} is the case's own folder
    names: tuple[str, ...]  # what the error line must say
    files: dict = {}  # made in the folder first: path -> text, bytes, or CKPT


COMMON = {  # so that whatever a script would write lands in the case's folder
    "export.py": "--out_dir={dir}/out --export_dir={dir}/hf",
    "bench.py": "--device=cpu --compile=false",
    "lab/generate.py": "--device=cpu",
    "lab/plot.py": "{dir}/run",
    OWT: "--out_dir={dir}/out --processes=1 --block_size=8",
    FW: "--out_dir={dir}/out --processes=1 --block_size=8",
    CHAR: "",
}
RUN = {"run/log.jsonl": json.dumps({"iter": 1, "step_loss": 1.0, "lr": 1e-3, "ms": 1.0}) + "\n"}
EXPORTED = {"hf/config.json": GPT2_CONFIG, "hf/model.safetensors": "weights"}
STATE = {  # an unfinished preparation of another input: one shard written
    "identity": {
        "val_tokens": 0,
        "name": "openwebtext",
        "source": "local",
        "dataset": None,
        "config": None,
    },
    "revision_sha": None,
    "documents": 10,
    "partial_tokens": 0,
    "shards": 0,
    "tokens": 0,
    "elapsed_s": 1.0,
    "command": "cd /somewhere && python data/openwebtext/prepare.py --input=old.jsonl",
}

CASES = {
    # export.py: a folder that is not an earlier export is never replaced
    "export-into-a-users-folder": Hostile(
        "export.py",
        "",
        ("export_dir must be a folder", "an earlier export", "notes.txt"),
        {"hf/notes.txt": "mine"},
    ),
    "export-into-its-out_dir": Hostile("export.py", "--export_dir={dir}/out", ("ckpt.pt",)),
    "export-into-another-models-folder": Hostile(
        "export.py",
        "",
        ("does not describe a GPT-2",),
        {"hf/config.json": '{"model_type": "llama"}'},
    ),
    "export-over-an-export-with-more": Hostile(
        "export.py", "", ("tokenizer.json",), EXPORTED | {"hf/tokenizer.json": "{}"}
    ),
    "export-over-an-export-with-a-subfolder": Hostile(
        "export.py", "", ("extra",), EXPORTED | {"hf/extra/a": "x"}
    ),
    # bench.py's and lab/generate.py's out_json, lab/plot.py's --out
    "bench-out_json-a-folder": Hostile(
        "bench.py",
        "--out_json={dir}/res.json",
        ("out_json must be '' or a .json file (a file, not a folder)",),
        {"res.json/a": ""},
    ),
    "bench-out_json-a-new-folder": Hostile(
        "bench.py", "--out_json={dir}/new.json/", ("not a folder",)
    ),
    "bench-out_json-a-csv": Hostile(
        "bench.py", "--out_json={dir}/res.csv", ("out_json must be '' or a .json file",)
    ),
    "bench-out_json-under-a-file": Hostile(
        "bench.py", "--out_json={dir}/f/res.json", ("is a file",), {"f": "x"}
    ),
    "generate-out_json-a-png": Hostile(
        "lab/generate.py", "--out_json={dir}/g.png", ("'' or a .json file",)
    ),
    "generate-out_json-a-folder": Hostile(
        "lab/generate.py", "--out_json={dir}/g.json", ("not a folder",), {"g.json/a": ""}
    ),
    "plot-out-a-folder": Hostile(
        "lab/plot.py",
        "--out={dir}/c.png",
        ("out must be '' or a .png file", "folder"),
        RUN | {"c.png/a": ""},
    ),
    "plot-out-under-a-file": Hostile(
        "lab/plot.py", "--out={dir}/f/c.png", ("is a file",), RUN | {"f": "x"}
    ),
    # the web-scale preparation: inputs refused before reading
    "prepare-missing-input": Hostile(OWT, "--input={dir}/none.jsonl", ("none.jsonl not found",)),
    "prepare-input-a-folder": Hostile(
        OWT, "--input={dir}/in", ("is a folder", "--input="), {"in/a.jsonl": DOCS}
    ),
    "prepare-glob-matching-nothing": Hostile(
        OWT, "--input={dir}/*.parquet", ("matches no file",), {"a.jsonl": DOCS}
    ),
    "prepare-empty-jsonl": Hostile(FW, "--input={dir}/a.jsonl", ("is empty",), {"a.jsonl": ""}),
    "prepare-no-extension": Hostile(
        OWT, "--input={dir}/docs", ("unknown kind of input",), {"docs": "text"}
    ),
    "prepare-out_dir-a-file": Hostile(
        OWT,
        "--input={dir}/a.jsonl --out_dir={dir}/f",
        ("out_dir must be a folder",),
        {"a.jsonl": DOCS, "f": ""},
    ),
    # ... and found bad while reading: whatever the run wrote is removed
    "prepare-binary-text": Hostile(
        OWT, "--input={dir}/a.txt", ("UTF-8",), {"a.txt": bytes(range(256)) * 8}
    ),
    "prepare-binary-jsonl": Hostile(
        OWT, "--input={dir}/a.jsonl", ("JSON",), {"a.jsonl": b"\x89PNG\x00\xff" * 99}
    ),
    "prepare-binary-parquet": Hostile(
        FW, "--input={dir}/a.parquet", ("cannot open", "Parquet"), {"a.parquet": b"\0" * 99}
    ),
    "prepare-null-text": Hostile(
        OWT,
        "--input={dir}/a.jsonl",
        ("document 2's text is NoneType",),
        {"a.jsonl": '{"text": "a"}\n{"text": null}\n'},
    ),
    "prepare-list-text": Hostile(
        OWT,
        "--input={dir}/a.json",
        ("text is list", "must be a string"),
        {"a.json": '[{"text": ["a"]}]'},
    ),
    "prepare-no-text-field": Hostile(
        OWT, "--input={dir}/a.jsonl", ("'text'",), {"a.jsonl": '{"body": "a"}\n'}
    ),
    # shards of 1,000 tokens written, then document 301: the folder as it was
    "prepare-bad-after-shards": Hostile(
        OWT,
        "--input={dir}/a.jsonl --shard_size=1000 --out_dir={dir}/keep",
        ("document 301's text is int",),
        {"a.jsonl": DOCS + '{"text": 5}\n', "keep/mine.txt": "the user's"},
    ),
    "prepare-over-another-unfinished": Hostile(
        OWT,
        "--input={dir}/a.jsonl",
        (
            "unfinished preparation (1 shards)",
            "input_files",
            "resume it with: cd /somewhere && python",
            "remove",
        ),
        {
            "a.jsonl": DOCS,
            "out/prepare_state.json": json.dumps(STATE | {"shards": 1}),
            "out/openwebtext_val_000000.bin": "x",
        },
    ),
    "prepare-over-another-finished": Hostile(
        OWT,
        "--input={dir}/a.jsonl",
        ("finished preparation of other settings", "shard_size 5 -> 100000000", "another out_dir"),
        {"a.jsonl": DOCS, "out/prepare.json": json.dumps({"name": "openwebtext", "shard_size": 5})},
    ),
    # Shakespeare's small preparations
    "char-binary-input": Hostile(
        CHAR, "{dir}/d", ("not UTF-8",), {"d/input.txt": b"\xff\xfe\x00abc"}
    ),
    "char-empty-input": Hostile(CHAR, "{dir}/d", ("is empty",), {"d/input.txt": ""}),
    "char-folder-a-file": Hostile(
        CHAR, "{dir}/d", ("must be a folder", "not the file"), {"d": "x"}
    ),
}


def make_files(folder: Path, made: dict, checkpoint: bytes) -> None:
    for path, data in made.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        data = checkpoint if data is CKPT else data
        (folder / path).write_bytes(data if isinstance(data, bytes) else data.encode())


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("ckpt") / "ckpt.pt"
    save_tiny_checkpoint(path, n_layer=1, n_embd=8, seed=0)
    return path.read_bytes()


def save_tiny_checkpoint(path: Path, n_layer: int, n_embd: int, seed: int) -> None:
    from model import GPT, GPTConfig
    from nanogpt_perf.train.checkpoint import save_checkpoint

    torch.manual_seed(seed)
    model_args = dict(
        block_size=16, vocab_size=16, n_layer=n_layer, n_head=2, n_embd=n_embd, dropout=0.0
    )
    tokenizer = {"kind": "characters", "itos": list("abcdefgh ")}
    model = GPT(GPTConfig(**model_args))
    save_checkpoint(
        {"model": model.state_dict(), "model_args": model_args, "tokenizer": tokenizer}, path
    )


@pytest.mark.parametrize("name", CASES)
def test_refused_with_one_line_and_nothing_written(name: str, checkpoint: bytes, tmp_path):
    case = CASES[name]
    make_files(
        tmp_path,
        ({"out/ckpt.pt": CKPT} if case.script == "export.py" else {}) | case.files,
        checkpoint,
    )
    before = contents(tmp_path)
    flags = [
        f.replace("{dir}", str(tmp_path)) for f in f"{COMMON[case.script]} {case.flags}".split()
    ]
    result = run_in_process(case.script, *flags)
    assert_one_line_error(result, *case.names)
    assert contents(tmp_path) == before


# ----------------------------------------------------------------------------- writes that fail


def enospc(*_):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def half_then_enospc(f):
    f.write(b"half of the new content")
    enospc()


# torch.save turns the OSError into a RuntimeError (the OSError its context)
def torch_save_on_a_full_disk(f):
    try:
        enospc()
    except OSError:
        raise RuntimeError("[enforce fail at inline_container.cc] unexpected pos") from None


def read_only(*_):
    raise OSError(errno.EROFS, os.strerror(errno.EROFS))


def quota(f):
    raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))


def interrupted(f):
    f.write(b"part")
    raise KeyboardInterrupt


WRITE_FAILURES = {  # name -> (what to do, the target relative to the folder, what the error says)
    "a-full-disk-midway": (
        lambda p: write_atomically(p, half_then_enospc),
        "a.json",
        "no space left on the device",
    ),
    "a-full-disk-in-torch.save": (
        lambda p: write_atomically(p, torch_save_on_a_full_disk),
        "a.json",
        "no space left",
    ),
    "a-full-disk-on-fsync": ("fsync", "a.json", "no space left on the device"),
    "a-disk-quota": (lambda p: write_atomically(p, quota), "a.json", "the disk quota is exceeded"),
    "a-read-only-file-system": ("rename", "a.json", "the file system is read-only"),
    "a-folder-in-the-way": (lambda p: write_bytes(p, b"new"), "sub", "it is a folder"),
    "a-file-for-a-folder": (
        lambda p: write_bytes(p, b"new"),
        "a.json/b.json",
        "is a file, not a folder",
    ),
    "a-writer-by-name-on-a-full-disk": (
        lambda p: write_through_path(p, enospc),
        "a.json",
        "no space left",
    ),
    "a-folder-swap-on-a-full-disk": (
        lambda p: replace_folder(p, enospc),
        "sub",
        "no space left on the device",
    ),
}


@pytest.mark.parametrize("name", WRITE_FAILURES)
def test_a_failed_write_leaves_the_previous_file_and_no_temporary_one(name, tmp_path, monkeypatch):
    what, target, reason = WRITE_FAILURES[name]
    (tmp_path / "a.json").write_text('{"previous": true}')
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "config.json").write_text("previous export")
    before = contents(tmp_path)
    if what == "fsync":
        monkeypatch.setattr(files.os, "fsync", enospc)
    elif what == "rename":
        monkeypatch.setattr(files.os, "replace", read_only)
    write = (lambda p: write_bytes(p, b"new")) if isinstance(what, str) else what
    with pytest.raises(WriteFailed) as failed:
        write(tmp_path / target)
    assert str(failed.value) == f"cannot write {tmp_path / target}: {failed.value.reason}; " + (
        "nothing was written"
        if not (tmp_path / target).exists()
        else f"the previous {Path(target).name} is as it was"
    )
    assert reason in str(failed.value) and "\n" not in str(failed.value)
    assert contents(tmp_path) == before


def test_an_interrupted_write_is_undone_and_interrupts(tmp_path):
    (tmp_path / "a.json").write_text("previous")
    with pytest.raises(KeyboardInterrupt):
        write_atomically(tmp_path / "a.json", interrupted)
    assert contents(tmp_path) == {"a.json": b"previous"}


def test_bench_and_plot_on_a_full_disk_say_so_in_one_line(tmp_path, monkeypatch):
    """matplotlib's savefig failing with ENOSPC: bench.py's chart and plot.py's curves, the previous
    PNG kept."""
    import matplotlib.figure

    from lab.charts import bench_bars as write_chart

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda *a, **k: enospc())
    (tmp_path / "b.png").write_bytes(b"previous chart")
    result = {"name": "x", "status": "ok", "ms_median": 1.0, "ms_p90": 1.0, "speedup_first": 1.0}
    manifest = {"git_dirty": False, "device_name": "cpu", "torch": "2", "git_commit": "0" * 10}
    with pytest.raises(
        WriteFailed, match="b.png: no space left on the device; the previous b.png is as it was"
    ):
        write_chart(
            tmp_path / "b.png", {"results": [result], "manifest": manifest, "kind": "single"}
        )
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "log.jsonl").write_text(RUN["run/log.jsonl"])
    (tmp_path / "run" / "curves.png").write_bytes(b"previous curves")
    before = contents(tmp_path)
    drawn = run_in_process("lab/plot.py", str(tmp_path / "run"))
    assert_one_line_error(drawn, "curves.png: no space left on the device")
    assert contents(tmp_path) == before


# -------------------------------------------------------------------- temporary names and leftovers


def a_dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_a_killed_writers_leftover_goes_with_the_next_write_but_a_living_ones_stays(tmp_path):
    host = files.temp_prefix(tmp_path / "a.json", files.TEMP).split(files.TEMP)[1].rsplit("-", 2)[0]
    dead = tmp_path / f".a.json.tmp-{host}-{a_dead_pid()}-abc123"
    alive = tmp_path / f".a.json.tmp-{host}-{os.getppid()}-abc123"
    elsewhere = tmp_path / f".a.json.tmp-otherhost-{a_dead_pid()}-abc123"
    for leftover in (dead, alive, elsewhere):
        leftover.write_text("half")
    write_bytes(tmp_path / "a.json", b"new")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["a.json", alive.name, elsewhere.name]
    )


def test_a_leftover_whose_pid_no_process_can_have_is_a_dead_writers(tmp_path):
    """A pid past a C int was an OverflowError; digits not ASCII's, a ValueError (issue 44)."""
    host = files.temp_prefix(tmp_path / "a.json", files.TEMP).split(files.TEMP)[1].rsplit("-", 2)[0]
    huge, foreign = (tmp_path / f".a.json.tmp-{host}-{pid}-abc123" for pid in (10**23, "\u00b2"))
    for leftover in (huge, foreign):
        leftover.write_text("half")
    write_bytes(tmp_path / "a.json", b"new")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["a.json", foreign.name])


def test_a_folder_set_aside_by_a_killed_swap_is_put_back(tmp_path, monkeypatch):
    """Where there is no atomic swap, the old folder goes aside for a moment: a kill then leaves it
    there, and the next write of the folder puts it back before anything else."""
    monkeypatch.setattr(files, "exchange", lambda a, b: False)
    replace_folder(tmp_path / "hf", lambda t: (t / "config.json").write_text("first"))
    replace_folder(tmp_path / "hf", lambda t: (t / "config.json").write_text("second"))
    assert contents(tmp_path) == {"hf": None, "hf/config.json": b"second"}
    prefix = files.temp_prefix(tmp_path / "hf", files.ASIDE).replace(
        str(os.getpid()), str(a_dead_pid())
    )
    (tmp_path / "hf").rename(tmp_path / f"{prefix}xyz")  # killed between the two renames
    # the new one, whole or not
    (tmp_path / f"{prefix.replace(files.ASIDE, files.TEMP)}xyz").mkdir()
    files.remove_leftovers(tmp_path / "hf")
    assert contents(tmp_path) == {"hf": None, "hf/config.json": b"second"}


def test_two_writers_of_one_file_never_share_a_temporary_file(tmp_path):
    target, seen, stop = tmp_path / "a.bin", set(), threading.Event()
    payloads = [bytes([i]) * 200_000 for i in range(2)]

    def writer(payload: bytes) -> None:
        for _ in range(20):
            write_bytes(target, payload)

    def reader() -> None:
        while not stop.is_set():
            if target.exists():
                seen.add(target.read_bytes())

    threads = [threading.Thread(target=writer, args=(p,)) for p in payloads]
    watcher = threading.Thread(target=reader)
    for t in [watcher, *threads]:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    watcher.join()
    # never half of one, never a mix
    assert seen <= set(payloads) and target.read_bytes() in payloads
    assert [p.name for p in tmp_path.iterdir()] == ["a.bin"]


def test_a_new_file_gets_the_usual_mode_and_a_replaced_one_keeps_its_own(tmp_path):
    write_bytes(tmp_path / "new", b"x")
    assert (tmp_path / "new").stat().st_mode & 0o777 == 0o666 & ~files.umask()
    (tmp_path / "mine").write_bytes(b"x")
    (tmp_path / "mine").chmod(0o640)
    write_bytes(tmp_path / "mine", b"y")
    assert (tmp_path / "mine").stat().st_mode & 0o777 == 0o640
    (tmp_path / "link").symlink_to(tmp_path / "mine")
    write_bytes(tmp_path / "link", b"through the link")
    assert (tmp_path / "link").is_symlink() and (
        tmp_path / "mine"
    ).read_bytes() == b"through the link"


def test_a_killed_writer_leaves_the_previous_file_whole(tmp_path):
    """A process killed (SIGKILL) while it writes: the file is the previous one; its hidden
    temporary file goes with the next write."""
    (tmp_path / "a.bin").write_bytes(b"previous")
    code = (
        "import sys, time; sys.path.insert(0, sys.argv[2]); from pathlib import Path; "
        "from nanogpt_perf.files import write_atomically; "
        "write_atomically(Path(sys.argv[1]), lambda f: [(f.write(b'x' * 1000), f.flush(), "
        "time.sleep(0.01)) "
        "for _ in range(10_000)])"
    )
    process = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "a.bin"), str(ROOT)])
    begun = lambda: [
        p for p in tmp_path.iterdir() if p.name.startswith(".a.bin.tmp-") and p.stat().st_size > 0
    ]
    wait_for(begun, process)
    process.kill()
    process.wait()
    assert (tmp_path / "a.bin").read_bytes() == b"previous" and begun()
    write_bytes(tmp_path / "a.bin", b"new")
    assert contents(tmp_path) == {"a.bin": b"new"}


def wait_for(found, process: subprocess.Popen, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := found():
            return result
        assert process.poll() is None, "the process ended before it could be caught"
        time.sleep(0.0005)
    process.kill()
    raise AssertionError("timed out")


# ----------------------------------------------------------------------------- exports


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> tuple[Path, Path]:
    """Two checkpoints of a model large enough to be caught while it is written (28 MB of
    weights)."""
    folder = tmp_path_factory.mktemp("two")
    for seed, name in ((1, "old"), (2, "new")):
        save_tiny_checkpoint(folder / name / "ckpt.pt", n_layer=4, n_embd=384, seed=seed)
    return folder / "old", folder / "new"


def export_in_process(out_dir: Path, export_dir: Path) -> None:
    result = run_in_process("export.py", f"--out_dir={out_dir}", f"--export_dir={export_dir}")
    assert result.returncode == 0, result.stderr


def test_export_killed_mid_write_leaves_the_old_export_whole(checkpoints, tmp_path):
    pytest.importorskip("transformers")
    old, new = checkpoints
    export_in_process(new, tmp_path / "reference")
    reference = contents(tmp_path / "reference")
    export_in_process(old, tmp_path / "hf")
    exported = contents(tmp_path / "hf")
    assert exported != reference
    command = [sys.executable, "export.py", f"--out_dir={new}", f"--export_dir={tmp_path / 'hf'}"]
    for pause in (None, 0.02):  # stopped as soon as it writes, then killed; killed a little later
        process = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_for(lambda: [p for p in tmp_path.iterdir() if p.name.startswith(".hf.tmp-")], process)
        if pause is None:
            # mid-write, held there: what a reader sees meanwhile
            process.send_signal(signal.SIGSTOP)
            assert contents(tmp_path / "hf") == exported
        else:
            time.sleep(pause)
        process.kill()
        process.wait()
        assert contents(tmp_path / "hf") in (exported, reference)  # whole, the old or the new
        if pause is None:
            assert contents(tmp_path / "hf") == exported
            # a leftover, recognisable
            assert any(p.name.startswith(".hf.tmp-") for p in tmp_path.iterdir())
    export_in_process(new, tmp_path / "hf")
    assert contents(tmp_path / "hf") == reference
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "reference"]  # the leftovers gone


def test_export_replaces_an_earlier_export_an_empty_folder_and_through_a_link(
    checkpoints, tmp_path
):
    pytest.importorskip("transformers")
    old, new = checkpoints
    (tmp_path / "empty").mkdir()
    export_in_process(old, tmp_path / "empty")
    export_in_process(new, tmp_path / "reference")
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    export_in_process(new, tmp_path / "link")
    assert (tmp_path / "link").is_symlink() and contents(tmp_path / "empty") == contents(
        tmp_path / "reference"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "link", "reference"]


# ----------------------------------------------------------------------------- the preparation


def test_a_corrected_rerun_after_a_failed_preparation_prepares(tmp_path):
    """The issue's example: a run refused on a bad document used to leave prepare_state.json,
    refusing the corrected run."""
    inputs, out = tmp_path / "a.jsonl", tmp_path / "out"
    inputs.write_text(DOCS + '{"text": 5}\n')
    flags = [
        f"--input={inputs}",
        f"--out_dir={out}",
        "--processes=1",
        "--block_size=8",
        "--shard_size=1000",
    ]
    assert_one_line_error(run_in_process(OWT, *flags), "not a string")
    assert not out.exists()
    inputs.write_text(DOCS + '{"text": "5"}\n')
    result = run_in_process(OWT, *flags)
    assert result.returncode == 0, result.stderr
    assert json.loads((out / "prepare.json").read_text())["documents"] == 301


def test_a_killed_start_of_another_preparation_does_not_block_and_globs_prepare_their_files(
    tmp_path,
):
    out = tmp_path / "out"
    for name in ("b.jsonl", "a.jsonl"):
        (tmp_path / name).write_text(DOCS)
    out.mkdir()
    (out / "prepare_state.json").write_text(json.dumps(STATE))  # killed before its first shard
    # what a partly prepared dataset's error can print
    assert resume_command(out) == STATE["command"]
    flags = ["--processes=1", "--block_size=8", "--shard_size=1000"]
    result = run_in_process(OWT, f"--input={tmp_path / '*.jsonl'}", f"--out_dir={out}", *flags)
    assert result.returncode == 0, result.stderr
    assert "starting over: the unfinished preparation" in result.stdout
    listed = run_in_process(
        OWT,
        f"--input={tmp_path / 'a.jsonl'},{tmp_path / 'b.jsonl'}",
        f"--out_dir={tmp_path / 'l'}",
        *flags,
    )
    assert listed.returncode == 0, listed.stderr
    shards = lambda folder: {k: v for k, v in contents(folder).items() if k.endswith(".bin")}
    assert shards(out) == shards(tmp_path / "l") and len(shards(out)) > 2


# ----------------------------------------------------------------------------- a small file system


@pytest.fixture(scope="module")
def small_disk(tmp_path_factory):
    """A function running a shell script in a mount namespace of its own, with a tmpfs of a few
    hundred KiB mounted on FOLDER/fs; skipped where mounting is not allowed."""
    probe = tmp_path_factory.mktemp("probe")
    for unshare in (["unshare", "-m"], ["unshare", "-rm"]):
        script = f"mount -t tmpfs -o size=64k tmpfs {probe}"
        if (
            shutil.which("unshare")
            and subprocess.run([*unshare, "sh", "-c", script], capture_output=True).returncode == 0
        ):
            break
    else:
        pytest.skip("cannot mount a small tmpfs here (unshare -m / -rm refused)")

    def run(folder: Path, size_kib: int, script: str) -> subprocess.CompletedProcess:
        (folder / "fs").mkdir(exist_ok=True)
        mount = f"mount -t tmpfs -o size={size_kib}k tmpfs {folder}/fs && cd {folder} && "
        return subprocess.run(
            [*unshare, "sh", "-c", mount + script], capture_output=True, text=True, cwd=ROOT
        )

    return run


def test_a_full_disk_stops_the_preparation_and_its_printed_command_resumes_it(small_disk, tmp_path):
    (tmp_path / "a.jsonl").write_text(DOCS * 4)  # ~36k tokens: 72 KB of shards on a disk of 48 KiB
    reference = run_in_process(
        OWT,
        f"--input={tmp_path / 'a.jsonl'}",
        f"--out_dir={tmp_path / 'ref'}",
        "--processes=1",
        "--shard_size=2000",
    )
    assert reference.returncode == 0, reference.stderr
    folder = "fs/out dir's"  # a space and a quote: the printed command must quote them
    prepare = [
        sys.executable,
        str(ROOT / OWT),
        "--input=a.jsonl",
        f"--out_dir={folder}",
        "--processes=1",
    ]
    script = (
        f"{shlex.join(prepare)} --shard_size=2000 > /dev/null 2> err.txt; ls -a "
        f"{shlex.quote(folder)} > full.txt; "
        "mount -o remount,size=4m fs; cd / && eval \"$(sed -n 's/.*to resume: //p' "
        f'{tmp_path}/err.txt)" > /dev/null && cp -r {shlex.quote(str(tmp_path / folder))} '
        f"{tmp_path}/copy"
    )
    result = small_disk(tmp_path, 48, script)
    assert result.returncode == 0, result.stderr
    error = (tmp_path / "err.txt").read_text()
    assert_one_line_error(
        subprocess.CompletedProcess([], 1, "", error),
        "no space left on the device",
        "to resume: cd ",
    )
    kept = (tmp_path / "full.txt").read_text().split()
    # no temporary file left
    assert "prepare_state.json" in kept and not [n for n in kept if ".tmp-" in n]
    shards = lambda folder: {k: v for k, v in contents(folder).items() if k.endswith(".bin")}
    # the resumed run ends as an uninterrupted one
    assert shards(tmp_path / "copy") == shards(tmp_path / "ref")


def test_an_export_onto_a_full_disk_keeps_the_previous_export(small_disk, checkpoint, tmp_path):
    pytest.importorskip("transformers")
    make_files(tmp_path, {"out/ckpt.pt": CKPT}, checkpoint)
    export_in_process(tmp_path / "out", tmp_path / "before")
    script = (
        "cp -r before fs/hf && (cat /dev/zero > fs/filler 2>/dev/null; true) && "
        f"{sys.executable} {ROOT / 'export.py'} --out_dir=out --export_dir=fs/hf > /dev/null 2> "
        "err.txt; "
        "echo $? > rc.txt; cp -r fs/hf after; ls -a fs > listing.txt"
    )
    result = small_disk(tmp_path, 256, script)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "rc.txt").read_text().strip() == "1"
    errors = [
        line
        for line in (tmp_path / "err.txt").read_text().splitlines()
        if not line.startswith("Writing")
    ]
    assert (
        len(errors) == 1 and errors[0].startswith("error: cannot write") and "fs/hf" in errors[0]
    ), errors
    assert "no space left on the device; the previous hf is as it was" in errors[0]
    assert contents(tmp_path / "after") == contents(tmp_path / "before")
    # no leftover
    assert sorted((tmp_path / "listing.txt").read_text().split()) == [".", "..", "filler", "hf"]


# ---------------------------------------------------------------- JSON that no script of ours wrote

REPORTS = {
    # JSON that bench.py's regression check and plot.py did not write
    "regression-nested-without-end": ScriptCase(
        B, REGRESSION, ("new.json", "nested too deeply"), compare("[" * 100_000)
    ),
    "regression-truncated": ScriptCase(
        B, REGRESSION, ("new.json is not JSON",), compare(bench_output()[:40])
    ),
    "regression-not-utf8": ScriptCase(
        B, REGRESSION, ("new.json is not JSON",), compare(b"\xff\xfe{}")
    ),
    "regression-results-a-dict": ScriptCase(
        B, REGRESSION, ("no results list and manifest",), compare('{"results": {}, "manifest": {}}')
    ),
    "regression-manifest-a-list": ScriptCase(
        B, REGRESSION, ("no results list and manifest",), compare('{"results": [], "manifest": []}')
    ),
    "regression-result-a-number": ScriptCase(
        B,
        REGRESSION,
        ("its result 0 has no name and status",),
        compare('{"results": [1], "manifest": {}}'),
    ),
    "regression-metric-a-string": ScriptCase(
        B,
        REGRESSION,
        ("ms_median 'fast', not a finite number",),
        compare(bench_output(ms_median="fast")),
    ),
    "regression-metric-infinite": ScriptCase(
        B,
        REGRESSION,
        ("old.json", "ms_median 'inf'"),
        compare(bench_output(), bench_output(ms_median=float("inf"))),
    ),
    "regression-metric-a-bool": ScriptCase(
        B, REGRESSION, ("tokens_per_s 'True'",), compare(bench_output(tokens_per_s=True))
    ),
    "regression-two-results-of-one-name": ScriptCase(
        B,
        REGRESSION,
        ("two results are named 'a'",),
        compare(
            json.dumps({"manifest": {}, "results": [json.loads(bench_output())["results"][0]] * 2})
        ),
    ),
    "regression-ok-without-settings": ScriptCase(
        B, REGRESSION, ("its result 'a' has no settings",), compare(bench_output(settings=None))
    ),
    "regression-not-a-file": ScriptCase(
        B, REGRESSION, ("new.json is a folder, not a file",), {"new.json/x": "", "old.json": "{}"}
    ),
    "plot-log-nested-without-end": ScriptCase(
        P, "", ("line 1", "nested too deeply"), {"run/log.jsonl": "[" * 100_000}
    ),
    "plot-log-of-lists": ScriptCase(
        P, "", ("line 1 is not a JSON object",), {"run/log.jsonl": "[1, 2]\n"}
    ),
    "plot-log-a-folder": ScriptCase(
        P, "", ("log.jsonl is a folder, not",), {"run/log.jsonl/x": ""}
    ),
}


@pytest.mark.parametrize("name", REPORTS)
def test_a_report_refused_with_one_line_and_nothing_written(
    name, checkpoints, tmp_path, monkeypatch
):
    refuse_script_case(REPORTS[name], checkpoints, tmp_path, monkeypatch)


# ------------------------------------------------------- files read that are no files (issue 44)

READ_EVERY_KIND = """
import os, socket, sys
from pathlib import Path
from nanogpt_perf.files import ReadFailed, read_file
folder = Path(sys.argv[1])
os.mkfifo(folder / "fifo")
(folder / "folder").mkdir()
(folder / "dangling").symlink_to("nowhere")
(folder / "to_fifo").symlink_to("fifo")
socket.socket(socket.AF_UNIX).bind(str(folder / "socket"))
(folder / "file").write_bytes(b"bytes")
for name in ("fifo", "folder", "dangling", "to_fifo", "socket", "missing", "file"):
    try:
        print(name, read_file(folder / name, "the input"))
    except ReadFailed as e:
        print(name, e, e.missing)
"""


def test_a_file_read_that_is_no_file_is_one_line_and_never_waited_on(tmp_path):
    """In a process of its own: a FIFO waited on would fail the test, not hang the suite."""
    result = run_script("-c", READ_EVERY_KIND, str(tmp_path), timeout=60)
    assert result.returncode == 0, result.stderr
    said = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    fifo = "a FIFO (a named pipe)"
    kinds = {"fifo": fifo, "to_fifo": fifo, "folder": "a folder", "socket": "a socket"}
    for name, kind in kinds.items():
        assert said[name] == f"the input {tmp_path / name} is {kind}, not a file False"
    assert said["dangling"] == f"the input {tmp_path / 'dangling'} is a link to nothing False"
    assert said["missing"] == f"the input {tmp_path / 'missing'} is missing True"
    assert said["file"] == "b'bytes'"


READ_DATASET = """
import sys
from pathlib import Path
from nanogpt_perf.errors import UserError
from nanogpt_perf.data.identity import check_token_ids, dataset_identity
folder = Path(sys.argv[1])
try:
    digests = check_token_ids(folder, 29, cache_from_bytes=0)
    print(sorted(dataset_identity(folder, digests)["files"]))
except UserError as e:
    print(f"error: {e}")
"""
DATASET_NOT_FILES = {  # name, what is made there, what the check says
    "cache-fifo": ("token_ids.json", os.mkfifo, "['meta.pkl', 'train.bin', 'val.bin']"),  # rebuilt
    "meta-fifo": ("meta.pkl", os.mkfifo, "error: {path} is a FIFO (a named pipe), not a file"),
    "meta-folder": ("meta.pkl", os.mkdir, "error: {path} is a folder, not a file"),  # was: none
}


@pytest.mark.parametrize("name", DATASET_NOT_FILES)
def test_a_datasets_file_that_is_no_file_is_one_line_and_never_waited_on(name, tmp_path):
    """A token_ids.json that is a FIFO blocked every run on the dataset; a meta.pkl that is one
    was no meta.pkl."""
    target, make, said = DATASET_NOT_FILES[name]
    write_files(tmp_path, {k.removeprefix("data/tiny/"): v for k, v in DATA.items()})
    (tmp_path / target).unlink(missing_ok=True)
    make(tmp_path / target)
    result = run_script("-c", READ_DATASET, str(tmp_path), timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == said.format(path=tmp_path / target)
    assert (tmp_path / "token_ids.json").is_file()  # the token files' cache, written anew


def test_a_cached_max_id_that_no_token_can_have_is_read_again(tmp_path):
    """A token_ids.json whose max_id is past uint16's ids (a hand-edited one) refused the data."""
    from nanogpt_perf.data.identity import CACHE_NAME, check_token_ids

    write_files(tmp_path, {k.removeprefix("data/tiny/"): v for k, v in DATA.items()})
    check_token_ids(tmp_path, 29, cache_from_bytes=0)
    cache = json.loads((tmp_path / CACHE_NAME).read_text())
    cache["files"]["train.bin"]["max_id"] = 2**40
    (tmp_path / CACHE_NAME).write_text(json.dumps(cache))
    check_token_ids(tmp_path, 29, cache_from_bytes=0)
    assert json.loads((tmp_path / CACHE_NAME).read_text())["files"]["train.bin"]["max_id"] == 28


READ_ONE = """
import sys
from pathlib import Path
from nanogpt_perf.errors import UserError
from {module} import *
folder = Path(sys.argv[1])
try:
    {call}
    print("read it")
except UserError as e:
    print(f"error: {{e}}")
"""
FIFO, FOLDER = "a FIFO (a named pipe)", "a folder"
MAKE = {FIFO: os.mkfifo, FOLDER: os.mkdir}
HF_READ = ("nanogpt_perf.guard.weights", "check_hf_folder(folder / 'hf', UserError)")
META_READ = ("nanogpt_perf.guard.vocabulary", "read_meta(folder / 'meta.pkl')")
SPEC_READ = ("nanogpt_perf.guard.vocabulary", "folder_tokenizer_spec(folder / 'hf')")
BIN_READ = ("nanogpt_perf.data.shards", "assert has_tokens(folder); split_files(folder, 'train')")
TEXT_READ = ("nanogpt_perf.files", "read_user_text(folder / 'p.txt', 'the prompt file')")
PLOT_READ = ("lab.plot", "load_curves(folder / 'run')")
RUN_LOG = ("nanogpt_perf.train.progress", "RunLog(folder / 'run', True, None, {})")
BENCH_OUTPUT = ("lab.bench_regression", "load_results(folder / 'b.json')")
AN_INPUT = ("nanogpt_perf.data.documents", "check_input(folder / 'in.jsonl')")
PLAIN, PLAIN_SHARDS = ({k.split("/")[-1]: v for k, v in d.items()} for d in (DATA, SHARDS))
NOT_A_FILE = "{path} is {kind}, not a file"
READERS = {  # name: (the files, the one made a FIFO or a folder, its reader, what the line says)
    "hf-config.json": (hf({}), "hf/config.json", HF_READ, "no readable config.json: it is {kind}"),
    "hf-weights": (hf({}), "hf/model.safetensors", HF_READ, "model.safetensors is {kind}, not a"),
    "meta.pkl": ({}, "meta.pkl", META_READ, NOT_A_FILE),
    "vocabulary.json": (hf({}), "hf/vocabulary.json", SPEC_READ, NOT_A_FILE),
    "train.bin": (PLAIN, "train.bin", BIN_READ, NOT_A_FILE),
    "a-shard": (PLAIN_SHARDS, "tiny_train_000001.bin", BIN_READ, NOT_A_FILE),
    "a-prompt-file": ({}, "p.txt", TEXT_READ, "the prompt file " + NOT_A_FILE),
    "plot-log.jsonl": ({}, "run/log.jsonl", PLOT_READ, NOT_A_FILE),
    "train-log.jsonl": ({}, "run/log.jsonl", RUN_LOG, "cannot append to {path}: it is {kind}"),
    "bench-output": ({}, "b.json", BENCH_OUTPUT, "bench output " + NOT_A_FILE),
    "an-input-file": ({}, "in.jsonl", AN_INPUT, "{path} is {kind}"),
}


@pytest.mark.parametrize("kind", MAKE)
@pytest.mark.parametrize("name", READERS)
def test_a_file_read_that_is_a_fifo_or_a_folder_is_named_never_waited_on(name, kind, tmp_path):
    """Each reader in a process of its own: config.json a FIFO hung sample.py; a FIFO or a folder
    was no meta.pkl (GPT-2's vocabulary), no vocabulary.json, no train.bin ('dataset not found'),
    a prompt file or a log 'not found'; a FIFO log.jsonl took a run's records until it blocked."""
    files, target, (module, call), said = READERS[name]
    write_files(tmp_path, files)
    (tmp_path / target).unlink(missing_ok=True)
    (tmp_path / target).parent.mkdir(exist_ok=True)
    MAKE[kind](tmp_path / target)
    result = run_script("-c", READ_ONE.format(module=module, call=call), str(tmp_path), timeout=60)
    assert result.returncode == 0, result.stderr
    line = result.stdout.splitlines()[-1]
    said = said.format(path=tmp_path / target, kind=kind)
    assert line.startswith("error: ") and said in line, line


def test_sampling_from_a_folder_whose_config_json_is_a_fifo_is_one_line(tmp_path):
    """sample.py --init_from=FOLDER waited for ever on a config.json that is a FIFO."""
    write_files(tmp_path, hf({}))
    (tmp_path / "hf/config.json").unlink()
    os.mkfifo(tmp_path / "hf/config.json")
    result = run_script("sample.py", f"--init_from={tmp_path / 'hf'}", "--device=cpu", timeout=120)
    assert_one_line_error(result, "no readable config.json: it is a FIFO (a named pipe)")


def test_training_on_a_fifo_train_bin_names_it(tmp_path):
    """A train.bin that is a FIFO was no train.bin: 'dataset not found'."""
    write_files(tmp_path, DATA)
    (tmp_path / "data/tiny/train.bin").unlink()
    os.mkfifo(tmp_path / "data/tiny/train.bin")
    result = run_script("train.py", f"--data_dir={tmp_path / 'data'}", "--dataset=tiny",
                        f"--out_dir={tmp_path / 'out'}", "--device=cpu", timeout=120)  # fmt: skip
    fifo = tmp_path / "data/tiny/train.bin"
    assert_one_line_error(result, f"{fifo} is a FIFO (a named pipe), not a file")


IN_THE_WAY = {"a FIFO (a named pipe)": os.mkfifo, "a link to nothing": lambda p: p.symlink_to("no")}


@pytest.mark.parametrize("kind", IN_THE_WAY)
def test_a_path_setting_names_what_is_in_the_way(kind, tmp_path):
    """A folder setting given a FIFO, or a path below a link to nothing, was 'this is a file'."""
    from nanogpt_perf.guard.paths import check_path, output_folder

    IN_THE_WAY[kind](tmp_path / "x")
    with pytest.raises(ValueError) as folder:
        output_folder(str(tmp_path / "x"))
    with pytest.raises(ValueError) as below:
        check_path(str(tmp_path / "x" / "y"))
    assert (str(folder.value), str(below.value)) == (
        f"a folder (this is {kind})",
        f"a path in folders ({tmp_path / 'x'} is {kind})",
    )


def test_a_torch_logs_that_torch_refuses_is_one_line():
    """torch reads TORCH_LOGS as it is imported and raises a ValueError of many lines on a name it
    does not know."""
    env = os.environ | {"TORCH_LOGS": "nonsense"}
    result = subprocess.run(
        [sys.executable, "train.py", "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_one_line_error(
        result, "TORCH_LOGS='nonsense' is not what torch takes", "TORCH_LOGS=help"
    )


# every path setting of the benchmarks and tools, pointing nowhere: one line naming it, before any
# work
NOWHERE = "/nowhere/at/all"
MISSING_INPUTS = [
    ("lab/loader.py", f"--data={NOWHERE}"),
    ("lab/generate.py", f"--nanogpt_dir={NOWHERE}"),
    ("lab/prepare.py", f"--input={NOWHERE}.jsonl"),
    ("lab/time_to_loss.py", f"--configs={NOWHERE}.py"),
    ("lab/ttl_data.py", f"--text={NOWHERE}.txt --name=x --data_dir={NOWHERE}"),
    ("hellaswag.py", f"--file={NOWHERE}.jsonl --init_from=gpt2"),
    ("lab/plot.py", NOWHERE),
    ("bench.py", f"--compare={NOWHERE}.json --baseline={NOWHERE}.json"),
]


@pytest.mark.parametrize("script, flags", MISSING_INPUTS, ids=[s for s, _ in MISSING_INPUTS])
def test_a_missing_input_file_is_one_line(script, flags):
    assert_one_line_error(run_in_process(script, *flags.split()), NOWHERE)
