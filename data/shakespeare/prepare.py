"""Shakespeare in GPT-2 BPE tokens (tiktoken): train.bin and val.bin (uint16) and meta.pkl
(tokenizer, source).

python data/shakespeare/prepare.py [FOLDER]    # FOLDER defaults to this script's own

FOLDER may be new or empty, or hold the text to prepare (input.txt) or an earlier preparation of the
same kind; one that holds anything else (files of yours, another dataset) is refused, nothing
written there.
"""

import sys
from pathlib import Path

# the repository root, for `nanogpt_perf` and `data.*`
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
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
from nanogpt_perf.data.tokenizer import gpt2_encoding  # noqa: E402


def prepare(folder: Path) -> dict:
    check_folder(folder, "gpt2")  # another kind of dataset there is never overwritten
    text, source = load_text(folder)
    enc = gpt2_encoding()
    train_text, val_text = split(text)  # split the text, as nanoGPT does, then encode each part
    meta = {"vocab_size": enc.n_vocab, "kind": "gpt2", "tokenizer": "gpt2", "source": source}
    save_dataset(folder, enc.encode_ordinary(train_text), enc.encode_ordinary(val_text), meta)
    return meta


if __name__ == "__main__":
    folder = folder_argument(sys.argv[1:], Path(__file__).resolve().parent)
    if folder is None:
        print(__doc__.strip())
    else:
        prepare(folder)
