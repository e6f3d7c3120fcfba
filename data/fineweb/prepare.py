"""FineWeb-Edu in GPT-2 BPE tokens, as llm.c's shards of 100M tokens: edu_fineweb_val_000000.bin
(the first shard is the validation split), then edu_fineweb_train_000001.bin, ... named as llm.c's
dev/data/fineweb.py names them. sample-10BT is about 10B tokens, 20 GB of shards, streamed from the
hub (tokenising starts with the download).

    python data/fineweb/prepare.py --sample=10BT   # the hub (needs a network)
    python data/fineweb/prepare.py --input='docs/*.jsonl,more.parquet' --out_dir=data/mine

Run again after a kill, it resumes where it stopped (prepare_state.json) and ends with the same
shards; prepare.json describes a finished preparation. See nanogpt_perf/data/preparation.py and
documents.py.
"""

import sys
from dataclasses import dataclass
from pathlib import Path

# the repository root, for `nanogpt_perf`
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from nanogpt_perf.errors import report_errors  # noqa: E402

if __name__ == "__main__":  # not in the worker processes, which import this file too
    report_errors()  # a UserError, and Ctrl-C while the imports below load, is one line
from configurator import configure  # noqa: E402
from nanogpt_perf.config import setting  # noqa: E402
from nanogpt_perf.data.documents import Source, local_source  # noqa: E402
from nanogpt_perf.data.preparation import PrepareConfig, prepare  # noqa: E402

SAMPLES = ("10BT", "100BT", "350BT")


@dataclass
class FineWebConfig:
    """Settings of data/fineweb/prepare.py: the hub's sample (see --input for local files)"""

    sample: str = setting(
        "10BT", "FineWeb-Edu's sample: its billions of GPT-2 tokens", choices=SAMPLES
    )


if __name__ == "__main__":  # the worker processes import this file too: only the parent prepares
    # the settings of every preparation (nanogpt_perf/data/preparation.py), the shards by default in
    # this folder
    cfg = configure(
        fineweb=FineWebConfig,
        prepare=PrepareConfig,
        defaults={"out_dir": str(Path(__file__).resolve().parent)},
    )
    hub = Source(repo="HuggingFaceFW/fineweb-edu", config=f"sample-{cfg.sample}")
    source = local_source(cfg.input) if cfg.input else hub
    prepare(
        source,
        Path(cfg.out_dir),
        "edu_fineweb",
        cfg.shard_size,
        cfg.processes,
        cfg.val_tokens,
        cfg.block_size,
    )
