"""Shakespeare in GPT-2 BPE tokens (tiktoken): train.bin and val.bin (uint16) and meta.pkl (tokenizer, source).

python data/shakespeare/prepare.py [FOLDER]    # FOLDER defaults to this script's own
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for `nanogpt_perf` and `data.*`
from data.tiny_shakespeare import load_text, save_dataset, split  # noqa: E402
from nanogpt_perf.data.tokenizer import gpt2_encoding  # noqa: E402
from nanogpt_perf.errors import report_errors  # noqa: E402


def prepare(folder: Path) -> dict:
    text, source = load_text(folder)
    enc = gpt2_encoding()
    train_text, val_text = split(text)  # split the text, as nanoGPT does, then encode each part
    meta = {"vocab_size": enc.n_vocab, "tokenizer": "gpt2", "source": source}
    save_dataset(folder, enc.encode_ordinary(train_text), enc.encode_ordinary(val_text), meta)
    return meta


if __name__ == "__main__":
    report_errors()  # a UserError is one line
    prepare(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent)
