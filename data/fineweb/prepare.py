"""
FineWeb-Edu in GPT-2 BPE tokens, as llm.c's shards of 100M tokens: edu_fineweb_val_000000.bin (the first shard is
the validation split), then edu_fineweb_train_000001.bin, ... named as llm.c's dev/data/fineweb.py names them.
sample-10BT is about 10B tokens, 20 GB of shards, streamed from the hub (tokenising starts with the download).

    python data/fineweb/prepare.py --sample=10BT                              # the hub (needs a network)
    python data/fineweb/prepare.py --input='docs/*.jsonl,more.parquet' --out_dir=data/mine   # local files

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
from nanogpt_perf.rules import one_of  # noqa: E402

SAMPLES = ("10BT", "100BT", "350BT")

# -----------------------------------------------------------------------------
sample = "10BT"  # FineWeb-Edu's sample: 10BT, 100BT or 350BT (its billions of GPT-2 tokens)
input = ""  # comma-separated local files or globs (.txt: one document each; .jsonl, .json, .parquet: a `text` field)
out_dir = str(Path(__file__).resolve().parent)  # where the shards go
shard_size = 100_000_000  # tokens per shard, as llm.c
processes = default_processes()  # tokenising processes; 1 tokenises in this one
val_tokens = 0  # tokens of the validation split: 0 = the first shard, or a tenth of a corpus that fits in one
block_size = 1024  # the context it will train with: each split must hold block_size + 1 tokens
# -----------------------------------------------------------------------------

if __name__ == "__main__":  # the worker processes import this file too: only the parent prepares
    settings = configure(globals(), rules=RULES | {"sample": one_of(*SAMPLES)})
    hub = Source(repo="HuggingFaceFW/fineweb-edu", config=f"sample-{sample}")
    source = local_source(input) if input else hub
    prepare(source, Path(out_dir), "edu_fineweb", shard_size, processes, val_tokens, block_size)
