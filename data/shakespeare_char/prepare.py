"""Character-level Shakespeare: train.bin and val.bin (uint16 character ids) and meta.pkl (vocab, source).

python data/shakespeare_char/prepare.py [FOLDER]    # FOLDER defaults to this script's own
"""

import pickle
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for `data.*`
from data.tiny_shakespeare import load_text, split  # noqa: E402


def prepare(folder: Path) -> dict:
    text, source = load_text(folder)
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    ids = np.array([stoi[ch] for ch in text], dtype=np.uint16)
    train, val = split(ids)
    train.tofile(folder / "train.bin")
    val.tofile(folder / "val.bin")
    meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi, "source": source}
    with open(folder / "meta.pkl", "wb") as f:
        pickle.dump(meta, f)
    print(f"source: {source}")
    print(f"{len(text):,} characters, vocab {len(chars)}; train {len(train):,} tokens, val {len(val):,} tokens")
    return meta


if __name__ == "__main__":
    prepare(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent)
