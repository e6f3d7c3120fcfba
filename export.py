"""
Write a checkpoint of ours as a transformers GPT-2 folder (config.json and model.safetensors), without the vocab
padding, that `GPT2LMHeadModel.from_pretrained(export_dir)` loads and that gives the same logits.

The folder is written whole beside export_dir, then swapped in: a kill leaves the previous export or the new one,
never a mix. export_dir must be new, empty, or an earlier export (holding only what an export writes).

    python export.py --out_dir=out-shakespeare --export_dir=hf-shakespeare
"""

from fnmatch import fnmatch
from pathlib import Path

from configurator import configure
from model import GPT
from nanogpt_perf.data.tokenizer import Tokenizer
from nanogpt_perf.errors import UserError
from nanogpt_perf.files import replace_folder
from nanogpt_perf.gpt2_weights import hf_folder_problem, to_hf_state_dict
from nanogpt_perf.rules import a_path
from nanogpt_perf.train.checkpoint import load_checkpoint

# -----------------------------------------------------------------------------
out_dir = "out"  # where ckpt.pt is
export_dir = "out-hf"  # the transformers folder to write
settings = configure(globals(), rules={"out_dir": a_path, "export_dir": a_path})
# -----------------------------------------------------------------------------

# what save_pretrained writes (the weights in shards when they are large): an export replaces only these
EXPORT_FILES = ("config.json", "generation_config.json", "model*.safetensors*")


def not_an_export(folder: Path) -> str | None:
    """Why an existing folder is not one an export may replace (a user's files would go with it), or None."""
    if not folder.is_dir():
        return f"not the file {folder}"
    others = sorted(
        p.name for p in folder.iterdir() if not (p.is_file() and any(fnmatch(p.name, f) for f in EXPORT_FILES))
    )
    if others:
        return f"not {folder}, which holds {', '.join(others[:3])}{', ...' if len(others) > 3 else ''}"
    if any(folder.iterdir()) and (problem := hf_folder_problem(folder)):
        return f"not {folder}: {problem}"
    return None


if problem := not_an_export(Path(export_dir)) if Path(export_dir).exists() else None:
    what = f"an earlier export to replace (only {', '.join(EXPORT_FILES)})"
    raise UserError(f"export_dir must be a folder that is new, empty or {what}, {problem}")

try:
    from transformers import GPT2Config, GPT2LMHeadModel
except ImportError:
    raise UserError("export needs transformers: pip install transformers") from None

checkpoint = load_checkpoint(Path(out_dir) / "ckpt.pt")
model = GPT.from_checkpoint(checkpoint)
tokenizer = Tokenizer.for_checkpoint(checkpoint)
if tokenizer.n_vocab > model.config.vocab_size:
    raise UserError(
        f"the checkpoint's tokenizer ({tokenizer.name}) has {tokenizer.n_vocab} tokens, its model only "
        f"{model.config.vocab_size}: they do not belong together"
    )
vocab_size = tokenizer.n_vocab  # the real vocabulary, without the padding
eot = tokenizer.eot if tokenizer.eot is not None and tokenizer.eot < vocab_size else None  # never outside it

cfg = model.config
hf_config = GPT2Config(
    vocab_size=vocab_size,
    n_positions=cfg.block_size,
    n_embd=cfg.n_embd,
    n_layer=cfg.n_layer,
    n_head=cfg.n_head,
    activation_function="gelu_new",
    resid_pdrop=cfg.dropout,
    embd_pdrop=cfg.dropout,
    attn_pdrop=cfg.dropout,
    layer_norm_epsilon=1e-5,
    bos_token_id=eot,
    eos_token_id=eot,
)
hf_model = GPT2LMHeadModel(hf_config)
missing, unexpected = hf_model.load_state_dict(to_hf_state_dict(model, vocab_size), strict=False)
missing = [k for k in missing if not k.endswith((".attn.bias", ".attn.masked_bias"))]  # causal-mask buffers
if missing or unexpected:
    raise UserError(f"weights do not match transformers' GPT-2: missing {missing}, unexpected {unexpected}")
replace_folder(Path(export_dir), lambda folder: hf_model.save_pretrained(folder, safe_serialization=True))
print(f"wrote {export_dir} ({model.get_num_params() / 1e6:.2f}M parameters, vocab {vocab_size}, {tokenizer.name})")
