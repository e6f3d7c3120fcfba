"""
Write a checkpoint of ours as a transformers GPT-2 folder (config.json and model.safetensors), without the vocab
padding, that `GPT2LMHeadModel.from_pretrained(export_dir)` loads and that gives the same logits.

A character-level model's vocabulary goes beside the weights, as vocabulary.json, which sample.py, hellaswag.py
and train.py (init_from=the folder) read back; a folder without one is in GPT-2's BPE.

The folder is written whole beside export_dir, then swapped in: a kill leaves the previous export or the new one,
never a mix. export_dir must be new, empty, or an earlier export (holding only what an export writes).

    python export.py --out_dir=out-shakespeare --export_dir=hf-shakespeare
"""

from nanogpt_perf.errors import report_errors

report_errors()  # from the first moment: Ctrl-C while torch loads is one line too

from dataclasses import dataclass
from pathlib import Path

from configurator import configure
from model import GPT, RECIPE_ARCHITECTURE, GPTConfig, to_hf_state_dict
from nanogpt_perf.config import setting
from nanogpt_perf.data.dataset import write_vocabulary
from nanogpt_perf.data.tokenizer import Tokenizer
from nanogpt_perf.errors import UserError, quiet_loggers
from nanogpt_perf.files import replace_folder
from nanogpt_perf.guard.checkpoint import load_checkpoint
from nanogpt_perf.guard.paths import a_path, output_folder
from nanogpt_perf.guard.vocabulary import VOCABULARY_FILE, check_vocabulary
from nanogpt_perf.guard.weights import check_export_target


# -----------------------------------------------------------------------------
@dataclass
class ExportConfig:
    """Settings of export.py: the checkpoint to export and the folder to write"""

    out_dir: str = setting("out", "where ckpt.pt is", check=a_path)
    export_dir: str = setting("out-hf", "the transformers folder to write", check=output_folder)


cfg = configure(export=ExportConfig)
# -----------------------------------------------------------------------------

check_export_target(Path(cfg.export_dir))

try:
    with quiet_loggers("torchao", "torch.utils._pytree"):  # transformers imports torchao where it is installed
        from transformers import GPT2Config, GPT2LMHeadModel
except ImportError:
    raise UserError("export needs transformers: pip install transformers") from None

checkpoint = load_checkpoint(Path(cfg.out_dir) / "ckpt.pt")
if recipe := [
    k for k in RECIPE_ARCHITECTURE if checkpoint["model_args"][k] != GPTConfig.__dataclass_fields__[k].default
]:
    raise UserError(f"transformers' GPT-2 has no {', '.join(recipe)}: only a model of GPT-2's architecture exports")
tokenizer = Tokenizer.for_checkpoint(checkpoint)
check_vocabulary(tokenizer.n_vocab, tokenizer.name, checkpoint["model_args"]["vocab_size"])
model = GPT.from_checkpoint(checkpoint)
vocab_size = tokenizer.n_vocab  # the real vocabulary, without the padding
eot = tokenizer.eot if tokenizer.eot is not None and tokenizer.eot < vocab_size else None  # never outside it

shape = model.config
hf_config = GPT2Config(
    vocab_size=vocab_size,
    n_positions=shape.block_size,
    n_embd=shape.n_embd,
    n_layer=shape.n_layer,
    n_head=shape.n_head,
    activation_function="gelu_new",
    resid_pdrop=shape.dropout,
    embd_pdrop=shape.dropout,
    attn_pdrop=shape.dropout,
    layer_norm_epsilon=1e-5,
    bos_token_id=eot,
    eos_token_id=eot,
)
hf_model = GPT2LMHeadModel(hf_config)
missing, unexpected = hf_model.load_state_dict(to_hf_state_dict(model, vocab_size), strict=False)
missing = [k for k in missing if not k.endswith((".attn.bias", ".attn.masked_bias"))]  # causal-mask buffers
if missing or unexpected:
    raise UserError(f"weights do not match transformers' GPT-2: missing {missing}, unexpected {unexpected}")


def write_export(folder: Path) -> None:
    hf_model.save_pretrained(folder, safe_serialization=True)
    write_vocabulary(folder, {"kind": "characters", "itos": tokenizer.itos} if tokenizer.itos else {"kind": "gpt2"})


replace_folder(Path(cfg.export_dir), write_export)
vocabulary = f", its vocabulary in {VOCABULARY_FILE}" if tokenizer.itos else ""
size = f"{model.get_num_params() / 1e6:.2f}M parameters"
print(f"wrote {cfg.export_dir} ({size}, vocab {vocab_size}, {tokenizer.name}{vocabulary})")
