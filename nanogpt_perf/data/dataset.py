"""A prepared dataset folder, data_dir/dataset: its tokens (train.bin and val.bin, or shards: see shards.py) and
meta.pkl (its vocabulary, when not GPT-2's), made by the folder's prepare.py on first use."""

import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

from nanogpt_perf.data.shards import has_tokens
from nanogpt_perf.errors import die

# Datasets too large to prepare unasked on first use: what preparing them takes
WEB_SCALE = {
    "openwebtext": "about 9B tokens, 18 GB of shards, and the download",
    "fineweb": "FineWeb-Edu sample-10BT: about 10B tokens, 20 GB of shards, and the download",
}


def prepare_if_missing(data_path: Path) -> None:
    """Run data_path/prepare.py when the dataset has no tokens yet (train.bin or *_train_*.bin shards); a
    web-scale dataset is never prepared unasked: the error says how."""
    if (data_path / "prepare_state.json").is_file():  # shards of a preparation that was stopped part way
        die(f"dataset {data_path.name} is only partly prepared: run python {data_path / 'prepare.py'} again to finish")
    if has_tokens(data_path):
        return
    if (data_path / "prepare.json").is_file():  # prepared, but every token went to the validation split
        die(
            f"dataset {data_path.name} is prepared but has no training shards ({data_path / 'prepare.json'}): its "
            f"corpus fit in the validation split; prepare it again with a smaller --val_tokens, or more text"
        )
    script = data_path / "prepare.py"
    if not script.is_file():
        die(f"dataset {data_path.name!r} not found: no train.bin or *_train_*.bin shards in {data_path}, no {script}")
    if data_path.name in WEB_SCALE:
        die(f"dataset {data_path.name} is not prepared: run python {script} ({WEB_SCALE[data_path.name]})")
    print(f"preparing dataset {data_path.name} with {script}", flush=True)
    if subprocess.run([sys.executable, str(script)]).returncode != 0:
        die(f"{script} failed; see its message above")


class _PlainDataUnpickler(pickle.Unpickler):
    """Unpickles dicts, lists, strings and numbers only: a meta.pkl that names any class or function (which
    unpickling would import and call) is refused instead of run."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"it refers to {module}.{name}; a meta.pkl holds plain data only")


def read_meta(path: Path) -> dict[str, Any]:
    """A dataset's meta.pkl (nanoGPT's format: vocab_size, and itos/stoi for a character vocabulary), read as
    plain data; {} when there is none."""
    if not path.is_file():
        return {}
    try:
        with open(path, "rb") as f:
            meta = _PlainDataUnpickler(f).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as e:
        die(f"{path} is not a valid meta.pkl: {e}")
    if not isinstance(meta, dict) or not isinstance(meta.get("vocab_size"), int):
        die(f"{path} is not a valid meta.pkl: no vocab_size")
    return meta


def dataset_vocab_size(data_path: Path) -> int | None:
    """The dataset's vocabulary size from its meta.pkl; None when it has none (GPT-2 BPE is then assumed)."""
    return read_meta(data_path / "meta.pkl").get("vocab_size")
