"""Character-level Shakespeare: train.bin and val.bin (uint16 character ids) and meta.pkl (vocab,
source).

python data/shakespeare_char/prepare.py [FOLDER]    # FOLDER defaults to this script's own

FOLDER may be new or empty, or hold the text to prepare (input.txt) or an earlier preparation of the
same kind; one that holds anything else (files of yours, another dataset) is refused, nothing
written there.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for `data.*`
from nanogpt_perf.errors import report_errors  # noqa: E402

if __name__ == "__main__":
    report_errors()  # a UserError, and Ctrl-C while the imports below load, is one line
from data.tiny_shakespeare import (  # noqa: E402
    check_folder,
    folder_argument,
    load_text,
    save_dataset,
    split,
)


def prepare(folder: Path) -> dict:
    check_folder(folder, "characters")  # another kind of dataset there is never overwritten
    text, source = load_text(folder)
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    train, val = split([stoi[ch] for ch in text])
    meta = {
        "vocab_size": len(chars),
        "kind": "characters",
        "itos": dict(enumerate(chars)),
        "stoi": stoi,
        "source": source,
    }
    save_dataset(folder, train, val, meta)
    return meta


if __name__ == "__main__":
    folder = folder_argument(sys.argv[1:], Path(__file__).resolve().parent)
    if folder is None:
        print(__doc__.strip())
    else:
        prepare(folder)
