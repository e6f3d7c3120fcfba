"""Score a model on HellaSwag's validation set, as build-nanogpt and llm.c score GPT-2
(nanogpt_perf/hellaswag.py): acc by the sum of each ending's log-probabilities, acc_norm by their
mean per token.

    python hellaswag.py --init_from=gpt2   # GPT-2 (124M) from the hub: acc_norm 0.2955 published
    python hellaswag.py --out_dir=out-gpt2 --file=hellaswag_val.jsonl --limit=1000   # a local copy

Each row (context, ending) is cropped from the left to the model's block_size + 1 tokens: the
context gives way, never an ending (one longer than the window is scored on its last block_size
tokens).
"""

from nanogpt_perf.errors import report_errors

report_errors()  # from the first moment: Ctrl-C while torch loads is one line too

from dataclasses import dataclass
from pathlib import Path

import torch

from configurator import configure
from model import GPT
from nanogpt_perf.config import setting
from nanogpt_perf.data.tokenizer import Tokenizer
from nanogpt_perf.errors import UserError
from nanogpt_perf.files import write_json
from nanogpt_perf.gpt2_weights import HF_HUB_NAMES, load_gpt2
from nanogpt_perf.guard.checkpoint import load_checkpoint
from nanogpt_perf.guard.paths import a_path, init_from_one_of, optional_path, output_file
from nanogpt_perf.guard.vocabulary import check_vocabulary
from nanogpt_perf.hellaswag import GPT2_124M_ACC_NORM, download_val, read_examples, score
from nanogpt_perf.runtime import DeviceConfig, PrecisionConfig, resolve_runtime


# -----------------------------------------------------------------------------
@dataclass
class HellaSwagConfig:
    """Settings of hellaswag.py: the model, the examples and where the result goes"""

    init_from: str = setting("resume", "the model: 'resume' is out_dir/ckpt.pt",
                             check=init_from_one_of("resume", *HF_HUB_NAMES))  # fmt: skip
    out_dir: str = setting("out", "where ckpt.pt is (init_from='resume')", check=a_path)
    file: str = setting("", "a local hellaswag_val.jsonl; '' = download the official one to "
                        "data/hellaswag/ (once)", check=optional_path)  # fmt: skip
    limit: int = setting(
        0, "score the first this many examples; 0 = all 10,042", min=0, note=" (0 = all)"
    )
    out_json: str = setting("", "the result as JSON; '' = print only", check=output_file(".json"))


cfg = configure(hellaswag=HellaSwagConfig, hardware=DeviceConfig, precision=PrecisionConfig)
# -----------------------------------------------------------------------------

runtime = resolve_runtime(cfg.device, cfg.dtype, cfg.tf32)
print(runtime.describe())
checkpoint = load_checkpoint(Path(cfg.out_dir) / "ckpt.pt") if cfg.init_from == "resume" else None
tokenizer = Tokenizer.for_model(checkpoint, cfg.init_from)
if tokenizer.itos is not None:
    raise UserError(
        f"HellaSwag is scored in GPT-2's tokens; this model's tokenizer is {tokenizer.name}"
    )
path = (
    Path(cfg.file)
    if cfg.file
    else download_val(Path("data") / "hellaswag" / "hellaswag_val.jsonl", "file")
)
examples = read_examples(path, cfg.limit)
model = GPT.from_checkpoint(checkpoint) if checkpoint is not None else load_gpt2(cfg.init_from)
check_vocabulary(tokenizer.n_vocab, tokenizer.name, model.config.vocab_size, "model folder")
model.to(runtime.device)

with torch.no_grad():
    result = score(model, examples, tokenizer.encode, runtime.device, runtime.autocast_ctx)
print(
    f"HellaSwag ({path}, {result['examples']:,} examples): acc {result['acc']:.4f} "
    f"({result['correct']:,}), "
    f"acc_norm {result['acc_norm']:.4f} ({result['correct_norm']:,}); GPT-2 (124M) scores "
    f"{GPT2_124M_ACC_NORM} "
    "acc_norm on all 10,042"
)
if cfg.out_json:
    write_json(
        Path(cfg.out_json),
        result | {"file": str(path), "init_from": cfg.init_from, "settings": cfg.as_dict()},
    )
