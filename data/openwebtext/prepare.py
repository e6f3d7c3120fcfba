"""
OpenWebText in GPT-2 BPE tokens, as llm.c's shards of 100M tokens: openwebtext_val_000000.bin (the first shard is
the validation split, as in llm.c), then openwebtext_train_000001.bin, ... About 9B tokens from 8,013,769 documents,
18 GB of shards, streamed from the hub's Parquet copy (tokenising starts with the download).

    python data/openwebtext/prepare.py                                        # the hub (needs a network)
    python data/openwebtext/prepare.py --input='docs/*.jsonl,more.parquet' --out_dir=data/mine   # local files

Run again after a kill, it resumes where it stopped (prepare_state.json) and ends with the same shards;
prepare.json describes a finished preparation. See nanogpt_perf/data/preparation.py and documents.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for `nanogpt_perf`
from nanogpt_perf.errors import report_errors  # noqa: E402

if __name__ == "__main__":  # not in the worker processes, which import this file too
    report_errors()  # a UserError, and Ctrl-C while the imports below load, is one line
from configurator import configure  # noqa: E402
from nanogpt_perf.data.documents import Source, default_processes, local_source  # noqa: E402
from nanogpt_perf.data.preparation import RULES, prepare  # noqa: E402

# -----------------------------------------------------------------------------
input = ""  # comma-separated local files or globs (.txt: one document each; .jsonl, .json, .parquet: a `text` field)
out_dir = str(Path(__file__).resolve().parent)  # where the shards go
shard_size = 100_000_000  # tokens per shard, as llm.c
processes = default_processes()  # tokenising processes; 1 tokenises in this one
val_tokens = 0  # tokens of the validation split: 0 = the first shard, or a tenth of a corpus that fits in one
block_size = 1024  # the context it will train with: each split must hold block_size + 1 tokens
# -----------------------------------------------------------------------------

if __name__ == "__main__":  # the worker processes import this file too: only the parent prepares
    settings = configure(globals(), rules=RULES)
    # datasets >= 4 runs no loading scripts, the default revision's way in: the hub's own Parquet conversion instead
    hub = Source(repo="Skylion007/openwebtext", revision="refs/convert/parquet", documents=8_013_769)
    source = local_source(input) if input else hub
    prepare(source, Path(out_dir), "openwebtext", shard_size, processes, val_tokens, block_size)
