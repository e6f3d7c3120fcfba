"""OpenWebText in GPT-2 BPE tokens, as llm.c's shards of 100M tokens: openwebtext_val_000000.bin
(the first shard is the validation split, as in llm.c), then openwebtext_train_000001.bin, ... About
9B tokens from 8,013,769 documents, 18 GB of shards, streamed from the hub's Parquet copy
(tokenising starts with the download).

    python data/openwebtext/prepare.py   # the hub (needs a network)
    python data/openwebtext/prepare.py --input='docs/*.jsonl,more.parquet' --out_dir=data/mine

Run again after a kill, it resumes where it stopped (prepare_state.json) and ends with the same
shards; prepare.json describes a finished preparation. See nanogpt_perf/data/preparation.py and
documents.py.
"""

import sys
from pathlib import Path

# the repository root, for `nanogpt_perf`
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from nanogpt_perf.errors import report_errors  # noqa: E402

if __name__ == "__main__":  # not in the worker processes, which import this file too
    report_errors()  # a UserError, and Ctrl-C while the imports below load, is one line
from configurator import configure  # noqa: E402
from nanogpt_perf.data.documents import Source, local_source  # noqa: E402
from nanogpt_perf.data.preparation import PrepareConfig, prepare  # noqa: E402

if __name__ == "__main__":  # the worker processes import this file too: only the parent prepares
    # the settings of every preparation (nanogpt_perf/data/preparation.py), the shards by default in
    # this folder
    cfg = configure(
        prepare=PrepareConfig, defaults={"out_dir": str(Path(__file__).resolve().parent)}
    )
    # datasets >= 4 runs no loading scripts, the default revision's way in: the hub's own Parquet
    # conversion instead
    hub = Source(
        repo="Skylion007/openwebtext", revision="refs/convert/parquet", documents=8_013_769
    )
    source = local_source(cfg.input) if cfg.input else hub
    prepare(
        source,
        Path(cfg.out_dir),
        "openwebtext",
        cfg.shard_size,
        cfg.processes,
        cfg.val_tokens,
        cfg.block_size,
    )
