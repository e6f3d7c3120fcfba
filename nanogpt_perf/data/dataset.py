"""A prepared dataset folder, data_dir/dataset: its tokens (train.bin and val.bin, or shards: see
shards.py) and meta.pkl (its vocabulary, when not GPT-2's), made on first use by this repository's
preparer of that name. A data folder's own code (its prepare.py) runs only when it is that preparer,
or when the user asks for it."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from nanogpt_perf.data.shards import has_tokens
from nanogpt_perf.errors import UserError, shown
from nanogpt_perf.guard.paths import check_path
from nanogpt_perf.guard.vocabulary import VOCABULARY_FILE, read_meta

# an unfinished preparation's progress (nanogpt_perf/data/preparation.py)
STATE_FILE = "prepare_state.json"

# Datasets too large to prepare unasked on first use: what preparing them takes
WEB_SCALE = {
    "openwebtext": "about 9B tokens, 18 GB of shards, and the download",
    "fineweb": "FineWeb-Edu sample-10BT: about 10B tokens, 20 GB of shards, and the download",
}


REPOSITORY = Path(__file__).resolve().parents[2]
# data/NAME/prepare.py [FOLDER]: small, prepared on first use
OWN_PREPARERS = ("shakespeare_char", "shakespeare")


def own_preparer(data_path: Path) -> Path | None:
    """This repository's data/NAME/prepare.py where data_path/prepare.py is it: the same file
    (data_path is the repository's own data/NAME, by any name), or a copy of it byte for byte; None
    otherwise."""
    script, ours = data_path / "prepare.py", REPOSITORY / "data" / data_path.name / "prepare.py"
    if data_path.name not in OWN_PREPARERS or not ours.is_file():
        return None
    try:
        return (
            ours
            if os.path.samefile(script, ours) or script.read_bytes() == ours.read_bytes()
            else None
        )
    except OSError:
        return None


def prepare_if_missing(data_path: Path, allow_foreign: bool = False) -> None:
    """Prepare the dataset when it has no tokens yet (train.bin or *_train_*.bin shards), with this
    repository's preparer of its name (see own_preparer); data_path/prepare.py of any other kind
    runs only with allow_foreign (the setting run_data_preparer=True), else the error says how to
    run it. A web-scale dataset is never prepared unasked: the error says how."""
    try:
        check_path(str(data_path))
    except ValueError as e:
        raise UserError(f"the dataset folder must be {e}, not {shown(str(data_path))}") from None
    if os.path.isfile(data_path / STATE_FILE):  # shards of a preparation that was stopped part way
        again = resume_command(data_path) or shlex.join(
            [sys.executable, str(data_path / "prepare.py")]
        )
        raise UserError(
            f"dataset {data_path.name} is only partly prepared: finish it with: {again}"
        )
    if has_tokens(data_path):
        return
    # prepared, but every token went to the validation split
    if os.path.isfile(data_path / "prepare.json"):
        raise UserError(
            f"dataset {data_path.name} is prepared but has no training shards "
            f"({data_path / 'prepare.json'}): its "
            "corpus fit in the validation split; prepare it again with a smaller --val_tokens, or "
            "more text"
        )
    script = data_path / "prepare.py"
    if not os.path.isfile(script):
        raise UserError(
            f"dataset {data_path.name!r} not found: no train.bin or *_train_*.bin shards in "
            f"{data_path}, no {script}"
        )
    if data_path.name in WEB_SCALE:
        raise UserError(
            f"dataset {data_path.name} is not prepared: run python {script} "
            f"({WEB_SCALE[data_path.name]})"
        )
    ours = own_preparer(data_path)
    if ours is None and not allow_foreign:
        raise UserError(
            f"dataset {data_path.name} is not prepared, and {script} is not one of this "
            "repository's preparers: code "
            f"in a data folder never runs unasked; if you trust it, run it yourself "
            f"({shlex.join([sys.executable, str(script)])}) or set run_data_preparer=True"
        )
    command = [sys.executable, str(ours), str(data_path)] if ours else [sys.executable, str(script)]
    print(f"preparing dataset {data_path.name} with {shlex.join(command[1:])}", flush=True)
    if subprocess.run(command).returncode != 0:
        raise UserError(f"{script} failed; see its message above")


def resume_command(out_dir: Path) -> str | None:
    """The command that resumes the unfinished preparation in out_dir, as its state recorded it;
    None when there is none (or it was started before commands were recorded)."""
    try:
        command = json.loads((out_dir / STATE_FILE).read_text()).get("command")
    except (OSError, ValueError, AttributeError):
        return None
    return command if isinstance(command, str) else None


def dataset_vocab_size(data_path: Path) -> int | None:
    """The dataset's vocabulary size from its meta.pkl; None when it has none (GPT-2 BPE is then
    assumed)."""
    return read_meta(data_path / "meta.pkl").get("vocab_size")


def write_vocabulary(folder: Path, spec: dict[str, Any]) -> None:
    """A checkpoint's character vocabulary (its tokenizer spec) into a model folder, for
    folder_tokenizer_spec; nothing for GPT-2's BPE, which a folder without one means."""
    if spec.get("kind") == "characters":
        text = json.dumps({"kind": "characters", "itos": list(spec["itos"])}, ensure_ascii=False)
        (folder / VOCABULARY_FILE).write_text(text + "\n", encoding="utf-8")
