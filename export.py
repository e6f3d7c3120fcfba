"""
Write a checkpoint of ours as a transformers GPT-2 folder (config.json and model.safetensors),
without the vocab padding, that `GPT2LMHeadModel.from_pretrained(export_dir)` loads and that gives
the same logits; or, with --format=gguf, as one GGUF file that llama.cpp and Ollama load (the models
and vocabularies it holds, and those it refuses: nanogpt_perf/gguf_export.py).

A character-level model's vocabulary goes beside the weights, as vocabulary.json, which sample.py,
hellaswag.py and train.py (init_from=the folder) read back; a folder without one is in GPT-2's BPE.

The folder is written whole beside export_dir, then swapped in: a kill leaves the previous export or
the new one, never a mix. export_dir must be new, empty, or an earlier export (holding only what an
export writes). A .gguf file is written beside itself, then renamed.

    python export.py --out_dir=out-shakespeare --export_dir=hf-shakespeare
    python export.py --out_dir=out-shakespeare --format=gguf --gguf_type=q8_0  # its model-q8_0.gguf
"""

from nanogpt_perf.errors import report_errors

report_errors()  # from the first moment: Ctrl-C while torch loads is one line too

from dataclasses import dataclass
from pathlib import Path

from configurator import configure
from model import GPT, RECIPE_ARCHITECTURE, GPTConfig, to_hf_state_dict
from nanogpt_perf import gguf_export
from nanogpt_perf.config import Config, setting
from nanogpt_perf.data.dataset import write_vocabulary
from nanogpt_perf.data.tokenizer import Tokenizer
from nanogpt_perf.errors import UserError, quiet_loggers
from nanogpt_perf.files import replace_folder
from nanogpt_perf.gpt2_weights import gpt2_config
from nanogpt_perf.guard.checkpoint import load_checkpoint
from nanogpt_perf.guard.paths import a_path, output_file, output_folder
from nanogpt_perf.guard.vocabulary import VOCABULARY_FILE
from nanogpt_perf.guard.weights import check_export_target


# -----------------------------------------------------------------------------
@dataclass
class ExportConfig:
    """Settings of export.py: the checkpoint to export and what to write"""

    out_dir: str = setting("out", "where ckpt.pt is", check=a_path)
    export_dir: str = setting("out-hf", "the transformers folder to write", check=output_folder)
    format: str = setting("hf", "'hf': a transformers folder (export_dir); 'gguf': one file for "
                          "llama.cpp (gguf_file)", choices=("hf", "gguf"))  # fmt: skip
    gguf_file: str = setting("", "the .gguf file to write; '' = out_dir/model-GGUF_TYPE.gguf",
                             check=output_file(".gguf"))  # fmt: skip
    gguf_type: str = setting("float32", "the type of the GGUF's matrices (its norms and biases are "
                             "float32)", choices=tuple(gguf_export.FILE_TYPES))  # fmt: skip


def one_format(cfg: Config) -> None:
    """A setting of the other format is a mistake, not ignored."""
    of = {"export_dir": "hf", "gguf_file": "gguf", "gguf_type": "gguf"}
    if given := [k for k in of if k in cfg.given and of[k] != cfg.format]:
        name = given[0]
        raise ValueError(f"{name} is for format={of[name]!r} only, and format is {cfg.format!r}")


cfg = configure(export=ExportConfig, cross=(one_format,))
# -----------------------------------------------------------------------------

if cfg.format == "gguf":
    try:
        import gguf  # noqa: F401 (nanogpt_perf/gguf_export.py writes with it)
    except ImportError:
        raise UserError("export --format=gguf needs gguf: pip install gguf") from None
else:
    check_export_target(Path(cfg.export_dir))
    try:
        with quiet_loggers("torchao", "torch.utils._pytree"):  # transformers imports torchao
            from transformers import GPT2LMHeadModel
    except ImportError:
        raise UserError("export needs transformers: pip install transformers") from None

checkpoint = load_checkpoint(Path(cfg.out_dir) / "ckpt.pt")
model_args, fields = checkpoint["model_args"], GPTConfig.__dataclass_fields__
recipe = [k for k in RECIPE_ARCHITECTURE if model_args[k] != fields[k].default]
if cfg.format == "hf" and recipe:
    why = "only a model of GPT-2's architecture exports"
    raise UserError(f"transformers' GPT-2 has no {', '.join(recipe)}: {why}")
tokenizer = Tokenizer.for_checkpoint(checkpoint)  # refused where it does not fit the model
model = GPT.from_checkpoint(checkpoint)
vocab_size = tokenizer.n_vocab  # the real vocabulary, without the padding
size = f"{model.get_num_params() / 1e6:.2f}M parameters"

if cfg.format == "gguf":
    if why := gguf_export.architecture_problem(model.config):
        raise UserError(why)
    if why := gguf_export.vocabulary_problem(tokenizer):
        raise UserError(why)
    gguf_file = Path(cfg.gguf_file or Path(cfg.out_dir) / f"model-{cfg.gguf_type}.gguf")
    gguf_export.write_gguf(model, tokenizer, gguf_file, cfg.gguf_type)
    written = f"{cfg.gguf_type}, {gguf_file.stat().st_size / 1e6:.1f} MB, {size}"
    print(f"wrote {gguf_file} ({written}, vocab {vocab_size}, {tokenizer.name})")
else:
    eot = tokenizer.eot if tokenizer.eot is not None and tokenizer.eot < vocab_size else None
    shape = model.config
    hf_config = gpt2_config(
        shape,
        vocab_size,
        resid_pdrop=shape.dropout,
        embd_pdrop=shape.dropout,
        attn_pdrop=shape.dropout,
        layer_norm_epsilon=1e-5,
        bos_token_id=eot,
        eos_token_id=eot,
    )
    hf_model = GPT2LMHeadModel(hf_config)
    state = to_hf_state_dict(model, vocab_size)
    missing, unexpected = hf_model.load_state_dict(state, strict=False)
    masks = (".attn.bias", ".attn.masked_bias")  # transformers' causal-mask buffers, not weights
    missing = [k for k in missing if not k.endswith(masks)]
    if missing or unexpected:
        found = f"missing {missing}, unexpected {unexpected}"
        raise UserError(f"weights do not match transformers' GPT-2: {found}")

    def write_export(folder: Path) -> None:
        hf_model.save_pretrained(folder, safe_serialization=True)
        itos = tokenizer.itos
        write_vocabulary(folder, {"kind": "characters", "itos": itos} if itos else {"kind": "gpt2"})

    replace_folder(Path(cfg.export_dir), write_export)
    vocabulary = f", its vocabulary in {VOCABULARY_FILE}" if tokenizer.itos else ""
    print(f"wrote {cfg.export_dir} ({size}, vocab {vocab_size}, {tokenizer.name}{vocabulary})")
