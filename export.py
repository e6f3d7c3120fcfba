"""
Write a checkpoint of ours as a transformers GPT-2 folder (config.json and model.safetensors), without the vocab
padding, that `GPT2LMHeadModel.from_pretrained(export_dir)` loads and that gives the same logits.

    python export.py --out_dir=out-shakespeare --export_dir=hf-shakespeare
"""

from pathlib import Path

from configurator import configure
from model import GPT
from nanogpt_perf.data.tokenizer import Tokenizer
from nanogpt_perf.errors import die
from nanogpt_perf.gpt2_weights import to_hf_state_dict
from nanogpt_perf.rules import a_path
from nanogpt_perf.train.checkpoint import load_checkpoint

# -----------------------------------------------------------------------------
out_dir = "out"  # where ckpt.pt is
export_dir = "out-hf"  # the transformers folder to write
settings = configure(globals(), rules={"out_dir": a_path, "export_dir": a_path})
# -----------------------------------------------------------------------------

if Path(export_dir).exists() and not Path(export_dir).is_dir():
    die(f"export_dir must be a folder to write (new or existing), not the file {export_dir}")

try:
    from transformers import GPT2Config, GPT2LMHeadModel
except ImportError:
    die("export needs transformers: pip install transformers")

checkpoint = load_checkpoint(Path(out_dir) / "ckpt.pt")
model = GPT.from_checkpoint(checkpoint)
tokenizer = Tokenizer.for_checkpoint(checkpoint)
if tokenizer.n_vocab > model.config.vocab_size:
    die(
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
    die(f"weights do not match transformers' GPT-2: missing {missing}, unexpected {unexpected}")
hf_model.save_pretrained(export_dir, safe_serialization=True)
print(f"wrote {export_dir} ({model.get_num_params() / 1e6:.2f}M parameters, vocab {vocab_size}, {tokenizer.name})")
