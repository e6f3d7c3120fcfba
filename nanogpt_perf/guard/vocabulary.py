"""Forensics on the vocabulary files that come from elsewhere: a dataset's meta.pkl (nanoGPT's
format: vocab_size, and itos/stoi for a character vocabulary), read as plain data (no code in it
runs) and checked consistent with itself; an exported model's vocabulary.json; and whether a
tokenizer, a model and a dataset belong together. Each refusal is one UserError naming the file.
This module imports no torch and nothing of the data: the data's own readers (nanogpt_perf/data/)
call it where they open such a file."""

import json
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nanogpt_perf.errors import UserError, shown
from nanogpt_perf.files import open_file, read_file

# beside an exported model of a character vocabulary (export.py)
VOCABULARY_FILE = "vocabulary.json"


class _PlainDataUnpickler(pickle.Unpickler):
    """Unpickles dicts, lists, strings and numbers only: a meta.pkl that names any class or function
    (which unpickling would import and call) is refused instead of run."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(
            f"it refers to {module}.{name}; a meta.pkl holds plain data only"
        )


def read_meta(path: Path) -> dict[str, Any]:
    """A dataset's meta.pkl, read as plain data and checked consistent with itself; {} when there is
    none (a folder or a FIFO there is refused: it is no file, not no meta.pkl)."""
    if not os.path.lexists(path):
        return {}
    with open_file(path) as f:
        try:
            meta = _PlainDataUnpickler(f).load()
        except Exception as e:  # no code runs (see above): whatever fails is a damaged file
            raise UserError(f"{path} is not a valid meta.pkl: {type(e).__name__}: {e}") from None
    check_meta(meta, lambda why: UserError(f"{path} is not a valid meta.pkl: {why}"))
    return meta


def check_meta(meta: Any, fail: Callable[[str], UserError]) -> None:
    """Raise fail(why) unless meta is consistent: vocab_size a positive int; a character
    vocabulary's itos mapping every id below vocab_size to its own string (a dict or a list), stoi
    (if any) its inverse."""
    if not isinstance(meta, dict) or "vocab_size" not in meta:
        raise fail("no vocab_size")
    vocab_size, itos, stoi = meta["vocab_size"], meta.get("itos"), meta.get("stoi")
    if type(vocab_size) is not int or vocab_size < 1:
        raise fail(f"vocab_size must be a positive int, not {shown(vocab_size)}")
    if itos is None:
        if stoi is not None:
            raise fail("stoi without itos (the id of each string, not the string of each id)")
        return
    if (
        isinstance(itos, dict)
        and all(type(k) is int for k in itos)
        and set(itos) == set(range(len(itos)))
    ):
        itos = [itos[i] for i in range(len(itos))]  # the ints 0..n-1 to str: as the list it is
    if not isinstance(itos, list) or not all(type(s) is str for s in itos):
        raise fail("itos must give the string of each token id 0, 1, ... (a dict or a list of str)")
    if len(itos) != vocab_size:
        raise fail(f"vocab_size is {vocab_size} but itos has {len(itos)} tokens")
    if len(set(itos)) != len(itos):
        raise fail("itos gives two token ids the same string")
    if stoi is not None and stoi != {s: i for i, s in enumerate(itos)}:
        raise fail("stoi is not the inverse of itos")


def folder_tokenizer_spec(folder: Path) -> dict[str, Any]:
    """The tokenizer of a model folder in transformers' format, as a checkpoint stores it (see
    tokenizer.py's tokenizer_spec): the character vocabulary that export.py wrote beside the
    weights, else GPT-2's BPE."""
    path = folder / VOCABULARY_FILE
    if not os.path.lexists(path):
        return {"kind": "gpt2"}
    text = read_file(path)  # a folder or a FIFO there: one line, not GPT-2's vocabulary
    try:
        spec = json.loads(text.decode("utf-8"))
    except (ValueError, RecursionError) as e:
        raise UserError(
            f"{path} is not a vocabulary ({type(e).__name__}): export the model again"
        ) from None
    itos = spec.get("itos") if isinstance(spec, dict) and spec.get("kind") == "characters" else None
    fail = lambda why: UserError(
        f"{path} is not a character vocabulary ({why}): export the model again"
    )
    if not isinstance(itos, list):
        raise fail("no itos list")
    check_meta({"vocab_size": len(itos), "itos": itos}, fail)
    return {"kind": "characters", "itos": itos}


def check_vocabulary(
    tokens: int,
    tokenizer: str,
    model_tokens: int,
    source: str = "checkpoint",
    pad_vocab: int | None = None,
) -> None:
    """A UserError when a tokenizer of `tokens` ids cannot go with a model of a vocabulary of
    model_tokens: it would give ids past the embedding; or, given pad_vocab (the multiple the
    model's vocabulary was rounded up to), the model has more ids past the tokenizer's than that
    padding adds: ids it was trained on, which the tokenizer cannot decode and sampling would leave
    out with no word. source: where both come from, for the line."""
    if tokens > model_tokens:
        raise UserError(
            f"the {source}'s tokenizer ({tokenizer}) has {tokens} tokens, more than its model's "
            "vocabulary of "
            f"{model_tokens}: they do not belong together"
        )
    if pad_vocab is not None and model_tokens - tokens >= pad_vocab:
        least = model_tokens - pad_vocab + 1
        padded = f" (padded to a multiple of pad_vocab={pad_vocab}: {least} at least)"
        padded = padded if pad_vocab > 1 else ""
        raise UserError(
            f"the {source}'s tokenizer ({tokenizer}) has {tokens} tokens, fewer than its model's "
            f"vocabulary of {model_tokens}{padded}: the model's other tokens cannot be decoded; "
            "they do not belong together"
        )


def check_same_vocabulary(
    model_spec: dict[str, Any], data_spec: dict[str, Any], dataset: str
) -> None:
    """A UserError when a model folder that carries a character vocabulary (folder_tokenizer_spec)
    would go on training on a dataset of another vocabulary (tokenizer.tokenizer_spec): its token
    ids would mean other characters. GPT-2's weights (a folder that carries none) train on any data,
    as nanoGPT's do."""
    if model_spec.get("kind") != "characters" or model_spec == data_spec:
        return
    theirs = (
        f"{len(data_spec['itos'])} characters"
        if data_spec.get("kind") == "characters"
        else "GPT-2's BPE"
    )
    raise UserError(
        f"the model folder's vocabulary ({len(model_spec['itos'])} characters, its "
        f"{VOCABULARY_FILE}) is not dataset "
        f"{dataset}'s ({theirs}): its token ids would mean other characters"
    )


def check_hellaswag_tokens(
    tokenizer: str, characters: bool, parallelism: str, distributed: bool
) -> None:
    """HellaSwag is scored in GPT-2's tokens, on whole models (not FSDP's shards)."""
    if characters or parallelism == "fsdp" and distributed:
        raise UserError(
            f"hellaswag_interval needs GPT-2's tokens and no FSDP, not {tokenizer} with "
            f"{parallelism}"
        )
