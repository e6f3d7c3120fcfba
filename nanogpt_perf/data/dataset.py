"""A prepared dataset folder, data_dir/dataset: its tokens (train.bin and val.bin, or shards: see shards.py) and
meta.pkl (its vocabulary, when not GPT-2's), made on first use by this repository's preparer of that name. A data
folder's own code (its prepare.py) runs only when it is that preparer, or when the user asks for it."""

import json
import os
import pickle
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from nanogpt_perf.config import shown
from nanogpt_perf.data.shards import has_tokens
from nanogpt_perf.errors import UserError
from nanogpt_perf.rules import path_problem

STATE_FILE = "prepare_state.json"  # an unfinished preparation's progress (nanogpt_perf/data/preparation.py)

# Datasets too large to prepare unasked on first use: what preparing them takes
WEB_SCALE = {
    "openwebtext": "about 9B tokens, 18 GB of shards, and the download",
    "fineweb": "FineWeb-Edu sample-10BT: about 10B tokens, 20 GB of shards, and the download",
}


REPOSITORY = Path(__file__).resolve().parents[2]
OWN_PREPARERS = ("shakespeare_char", "shakespeare")  # data/NAME/prepare.py [FOLDER]: small, prepared on first use


def own_preparer(data_path: Path) -> Path | None:
    """This repository's data/NAME/prepare.py where data_path/prepare.py is it: the same file (data_path is the
    repository's own data/NAME, by any name), or a copy of it byte for byte; None otherwise."""
    script, ours = data_path / "prepare.py", REPOSITORY / "data" / data_path.name / "prepare.py"
    if data_path.name not in OWN_PREPARERS or not ours.is_file():
        return None
    try:
        return ours if os.path.samefile(script, ours) or script.read_bytes() == ours.read_bytes() else None
    except OSError:
        return None


def prepare_if_missing(data_path: Path, allow_foreign: bool = False) -> None:
    """Prepare the dataset when it has no tokens yet (train.bin or *_train_*.bin shards), with this repository's
    preparer of its name (see own_preparer); data_path/prepare.py of any other kind runs only with allow_foreign
    (the setting run_data_preparer=True), else the error says how to run it. A web-scale dataset is never
    prepared unasked: the error says how."""
    if problem := path_problem(str(data_path)):
        raise UserError(f"the dataset folder must be {problem}, not {shown(str(data_path))}")
    if os.path.isfile(data_path / STATE_FILE):  # shards of a preparation that was stopped part way
        again = resume_command(data_path) or shlex.join([sys.executable, str(data_path / "prepare.py")])
        raise UserError(f"dataset {data_path.name} is only partly prepared: finish it with: {again}")
    if has_tokens(data_path):
        return
    if os.path.isfile(data_path / "prepare.json"):  # prepared, but every token went to the validation split
        raise UserError(
            f"dataset {data_path.name} is prepared but has no training shards ({data_path / 'prepare.json'}): its "
            f"corpus fit in the validation split; prepare it again with a smaller --val_tokens, or more text"
        )
    script = data_path / "prepare.py"
    if not os.path.isfile(script):
        raise UserError(
            f"dataset {data_path.name!r} not found: no train.bin or *_train_*.bin shards in {data_path}, no {script}"
        )
    if data_path.name in WEB_SCALE:
        raise UserError(f"dataset {data_path.name} is not prepared: run python {script} ({WEB_SCALE[data_path.name]})")
    ours = own_preparer(data_path)
    if ours is None and not allow_foreign:
        raise UserError(
            f"dataset {data_path.name} is not prepared, and {script} is not one of this repository's preparers: code "
            f"in a data folder never runs unasked; if you trust it, run it yourself "
            f"({shlex.join([sys.executable, str(script)])}) or set run_data_preparer=True"
        )
    command = [sys.executable, str(ours), str(data_path)] if ours else [sys.executable, str(script)]
    print(f"preparing dataset {data_path.name} with {shlex.join(command[1:])}", flush=True)
    if subprocess.run(command).returncode != 0:
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


VOCABULARY_FILE = "vocabulary.json"  # beside an exported model of a character vocabulary (export.py)


def folder_tokenizer_spec(folder: Path) -> dict[str, Any]:
    """The tokenizer of a model folder in transformers' format, as a checkpoint stores it (see tokenizer.py's
    tokenizer_spec): the character vocabulary that export.py wrote beside the weights, else GPT-2's BPE."""
    path = folder / VOCABULARY_FILE
    if not path.is_file():
        return {"kind": "gpt2"}
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise UserError(f"{path} is not a vocabulary ({type(e).__name__}): export the model again") from None
    itos = spec.get("itos") if isinstance(spec, dict) and spec.get("kind") == "characters" else None
    problem = meta_problem({"vocab_size": len(itos), "itos": itos}) if isinstance(itos, list) else "no itos list"
    if problem:
        raise UserError(f"{path} is not a character vocabulary ({problem}): export the model again")
    return {"kind": "characters", "itos": itos}


def write_vocabulary(folder: Path, spec: dict[str, Any]) -> None:
    """A checkpoint's character vocabulary (its tokenizer spec) into a model folder, for folder_tokenizer_spec;
    nothing for GPT-2's BPE, which a folder without one means."""
    if spec.get("kind") == "characters":
        text = json.dumps({"kind": "characters", "itos": list(spec["itos"])}, ensure_ascii=False)
        (folder / VOCABULARY_FILE).write_text(text + "\n", encoding="utf-8")


def vocabulary_problem(tokens: int, tokenizer: str, model_tokens: int, source: str = "checkpoint") -> str | None:
    """Why a tokenizer of `tokens` ids cannot go with a model of a vocabulary of model_tokens (it would give ids
    past the embedding), or None; source: where both come from, for the line."""
    if tokens <= model_tokens:
        return None
    return (
        f"the {source}'s tokenizer ({tokenizer}) has {tokens} tokens, more than its model's vocabulary of "
        f"{model_tokens}: they do not belong together"
    )


def vocabulary_mismatch(model_spec: dict[str, Any], data_spec: dict[str, Any], dataset: str) -> str | None:
    """Why a model folder that carries a character vocabulary (folder_tokenizer_spec) cannot go on training on a
    dataset of another vocabulary (tokenizer.tokenizer_spec): its token ids would mean other characters; None when
    they are the same, or when the folder carries none (GPT-2's weights train on any data, as nanoGPT's do)."""
    if model_spec.get("kind") != "characters" or model_spec == data_spec:
        return None
    theirs = f"{len(data_spec['itos'])} characters" if data_spec.get("kind") == "characters" else "GPT-2's BPE"
    return (
        f"the model folder's vocabulary ({len(model_spec['itos'])} characters, its {VOCABULARY_FILE}) is not dataset "
        f"{dataset}'s ({theirs}): its token ids would mean other characters"
    )
