"""A prepared dataset folder, data_dir/dataset: its tokens (train.bin and val.bin, or shards: see shards.py) and
meta.pkl (its vocabulary, when not GPT-2's), made by the folder's prepare.py on first use."""

import json
import pickle
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from nanogpt_perf.data.shards import has_tokens
from nanogpt_perf.errors import UserError
from nanogpt_perf.rules import shown

STATE_FILE = "prepare_state.json"  # an unfinished preparation's progress (nanogpt_perf/data/preparation.py)

# Datasets too large to prepare unasked on first use: what preparing them takes
WEB_SCALE = {
    "openwebtext": "about 9B tokens, 18 GB of shards, and the download",
    "fineweb": "FineWeb-Edu sample-10BT: about 10B tokens, 20 GB of shards, and the download",
}


def prepare_if_missing(data_path: Path) -> None:
    """Run data_path/prepare.py when the dataset has no tokens yet (train.bin or *_train_*.bin shards); a
    web-scale dataset is never prepared unasked: the error says how."""
    if (data_path / STATE_FILE).is_file():  # shards of a preparation that was stopped part way
        again = resume_command(data_path) or shlex.join([sys.executable, str(data_path / "prepare.py")])
        raise UserError(f"dataset {data_path.name} is only partly prepared: finish it with: {again}")
    if has_tokens(data_path):
        return
    if (data_path / "prepare.json").is_file():  # prepared, but every token went to the validation split
        raise UserError(
            f"dataset {data_path.name} is prepared but has no training shards ({data_path / 'prepare.json'}): its "
            f"corpus fit in the validation split; prepare it again with a smaller --val_tokens, or more text"
        )
    script = data_path / "prepare.py"
    if not script.is_file():
        raise UserError(
            f"dataset {data_path.name!r} not found: no train.bin or *_train_*.bin shards in {data_path}, no {script}"
        )
    if data_path.name in WEB_SCALE:
        raise UserError(f"dataset {data_path.name} is not prepared: run python {script} ({WEB_SCALE[data_path.name]})")
    print(f"preparing dataset {data_path.name} with {script}", flush=True)
    if subprocess.run([sys.executable, str(script)]).returncode != 0:
        raise UserError(f"{script} failed; see its message above")


def resume_command(out_dir: Path) -> str | None:
    """The command that resumes the unfinished preparation in out_dir, as its state recorded it; None when there is
    none (or it was started before commands were recorded)."""
    try:
        command = json.loads((out_dir / STATE_FILE).read_text()).get("command")
    except (OSError, ValueError, AttributeError):
        return None
    return command if isinstance(command, str) else None


class _PlainDataUnpickler(pickle.Unpickler):
    """Unpickles dicts, lists, strings and numbers only: a meta.pkl that names any class or function (which
    unpickling would import and call) is refused instead of run."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"it refers to {module}.{name}; a meta.pkl holds plain data only")


def read_meta(path: Path) -> dict[str, Any]:
    """A dataset's meta.pkl (nanoGPT's format: vocab_size, and itos/stoi for a character vocabulary), read as
    plain data and checked consistent with itself; {} when there is none."""
    if not path.is_file():
        return {}
    try:
        with open(path, "rb") as f:
            meta = _PlainDataUnpickler(f).load()
    except Exception as e:  # no code runs (see above): whatever fails is a damaged file
        raise UserError(f"{path} is not a valid meta.pkl: {type(e).__name__}: {e}") from None
    if problem := meta_problem(meta):
        raise UserError(f"{path} is not a valid meta.pkl: {problem}")
    return meta


def meta_problem(meta: Any) -> str | None:
    """What makes meta inconsistent: vocab_size a positive int; a character vocabulary's itos mapping every id
    below vocab_size to its own string (a dict or a list), stoi (if any) its inverse. None when it is consistent."""
    if not isinstance(meta, dict) or "vocab_size" not in meta:
        return "no vocab_size"
    vocab_size, itos, stoi = meta["vocab_size"], meta.get("itos"), meta.get("stoi")
    if type(vocab_size) is not int or vocab_size < 1:
        return f"vocab_size must be a positive int, not {shown(vocab_size)}"
    if itos is None:
        return "stoi without itos (the id of each string, not the string of each id)" if stoi is not None else None
    strings = id_strings(itos)
    if strings is None:
        return "itos must give the string of each token id 0, 1, ... (a dict or a list of str)"
    if len(strings) != vocab_size:
        return f"vocab_size is {vocab_size} but itos has {len(strings)} tokens"
    if len(set(strings)) != len(strings):
        return "itos gives two token ids the same string"
    if stoi is not None and stoi != {s: i for i, s in enumerate(strings)}:
        return "stoi is not the inverse of itos"
    return None


def id_strings(itos: Any) -> list[str] | None:
    """itos as the list of each id's string, or None when it is not one: a list of str, or a dict from the ints
    0..n-1 to str."""
    if isinstance(itos, dict) and all(type(k) is int for k in itos) and set(itos) == set(range(len(itos))):
        itos = [itos[i] for i in range(len(itos))]
    if isinstance(itos, list) and all(type(s) is str for s in itos):
        return itos
    return None


def dataset_vocab_size(data_path: Path) -> int | None:
    """The dataset's vocabulary size from its meta.pkl; None when it has none (GPT-2 BPE is then assumed)."""
    return read_meta(data_path / "meta.pkl").get("vocab_size")
