"""Shakespeare in GPT-2 BPE tokens (tiktoken): train.bin and val.bin (uint16) and meta.pkl (tokenizer, source).

python data/shakespeare/prepare.py [FOLDER]    # FOLDER defaults to this script's own
"""

import pickle
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for `common` and `data.*`
from common import gpt2_encoding  # noqa: E402
from data.tiny_shakespeare import load_text, split  # noqa: E402


def prepare(folder: Path) -> dict:
    text, source = load_text(folder)
    enc = gpt2_encoding()
    train_text, val_text = split(text)  # split the text, as nanoGPT does, then encode each part
    train = np.array(enc.encode_ordinary(train_text), dtype=np.uint16)
    val = np.array(enc.encode_ordinary(val_text), dtype=np.uint16)
    train.tofile(folder / "train.bin")
    val.tofile(folder / "val.bin")
    meta = {"vocab_size": enc.n_vocab, "tokenizer": "gpt2", "source": source}
    with open(folder / "meta.pkl", "wb") as f:
        pickle.dump(meta, f)
    print(f"source: {source}")
    print(f"{len(text):,} characters; train {len(train):,} tokens, val {len(val):,} tokens")
    return meta


if __name__ == "__main__":
    prepare(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent)
