"""Character-level Shakespeare: train.bin and val.bin (uint16 character ids) and meta.pkl (vocab, source).

python data/shakespeare_char/prepare.py [FOLDER]    # FOLDER defaults to this script's own
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for `data.*`
from data.tiny_shakespeare import load_text, save_dataset, split  # noqa: E402
from nanogpt_perf.errors import report_errors  # noqa: E402


def prepare(folder: Path) -> dict:
    text, source = load_text(folder)
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    train, val = split([stoi[ch] for ch in text])
    meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi, "source": source}
    save_dataset(folder, train, val, meta)
    return meta


if __name__ == "__main__":
    report_errors()  # a UserError is one line
    prepare(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent)
