"""Forensics on GPT-2's weights from elsewhere: a folder in transformers' format, checked before
anything is built (its config.json of GPT-2's shape and computation, its weights' names and shapes
read without loading them; nanogpt_perf/gpt2_weights.py loads it); a model's size against this
machine's memory; and the folder an export may replace."""

import json
from collections.abc import Callable
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import torch

from model import ARCHITECTURE, RECIPE_ARCHITECTURE, GPTConfig, fields_of_kind
from nanogpt_perf.errors import UserError, first_line, shown
from nanogpt_perf.files import MISSING, ReadFailed, file_kind, host_memory_bytes, read_file
from nanogpt_perf.guard.vocabulary import VOCABULARY_FILE

Fail = Callable[[str], UserError]
Shapes = dict[str, tuple[int, ...]]  # a weight's shape by its name
# what save_pretrained writes (large weights in shards) and the vocabulary: all that an export
# replaces
EXPORT_FILES = ("config.json", "generation_config.json", "model*.safetensors*", VOCABULARY_FILE)
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # the one read: the first there


def check_export_target(folder: Path) -> None:
    """A UserError unless folder is new, empty, or an earlier export that an export may replace (a
    user's files would go with it)."""
    what = f"an earlier export to replace (only {', '.join(EXPORT_FILES)})"
    fail = lambda why: UserError(f"export_dir must be a folder that is new, empty or {what}, {why}")
    if not folder.exists():
        return
    if not folder.is_dir():
        raise fail(f"not the file {folder}")
    exported = lambda p: p.is_file() and any(fnmatch(p.name, f) for f in EXPORT_FILES)
    if others := sorted(p.name for p in folder.iterdir() if not exported(p)):
        raise fail(
            f"not {folder}, which holds {', '.join(others[:3])}{', ...' if len(others) > 3 else ''}"
        )
    if any(folder.iterdir()):
        check_hf_folder(folder, lambda why: fail(f"not {folder}: {why}"))


def check_hf_folder(folder: Path, fail: Fail) -> None:
    """Raise fail(why) unless folder is a transformers GPT-2 this model loads as is (see the
    module)."""
    try:
        config = json.loads(read_file(folder / "config.json"))
    except ReadFailed as e:  # a FIFO is never waited on
        raise fail(f"no readable config.json: it {e.why}") from None
    except (ValueError, RecursionError) as e:
        raise fail(f"no readable config.json ({type(e).__name__})") from None
    if not isinstance(config, dict) or config.get("model_type") != "gpt2":
        raise fail("config.json does not describe a GPT-2 (model_type gpt2)")
    check_config(config, lambda why: fail(f"config.json: {why}"))
    weights = weights_file(folder, fail)
    try:
        found = {k.removeprefix("transformer."): v for k, v in weight_shapes(weights).items()}
    except Exception as e:  # truncated, not the format its name says
        raise fail(
            f"{weights.name} cannot be read ({type(e).__name__}: {first_line(e).split('. ')[0]})"
        ) from None
    expected = expected_shapes(config)
    if "lm_head.weight" in found:  # tied to wte: the same shape
        expected["lm_head.weight"] = expected["wte.weight"]
    if missing := [k for k in expected if k not in found]:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise fail(f"{weights.name} has no {missing[0]}{more}, a weight config.json asks for")
    if wrong := next((k for k in expected if found[k] != expected[k]), None):
        raise fail(
            f"{weights.name} holds {wrong} as {list(found[wrong])}, config.json makes it "
            f"{list(expected[wrong])}"
        )


def weights_file(folder: Path, fail: Fail) -> Path:
    """folder's model.safetensors, else its pytorch_model.bin; fail naming what is there instead of
    a file (a FIFO, a folder), or that neither is."""
    paths = [folder / name for name in WEIGHT_FILES]
    if weights := next((p for p in paths if p.is_file()), None):
        return weights
    if there := next((p for p in paths if file_kind(p) != MISSING), None):
        raise fail(f"{there.name} is {file_kind(there)}, not a file")
    raise fail(f"neither {' nor '.join(WEIGHT_FILES)}")


def check_config(config: dict[str, Any], fail: Fail) -> None:
    """Raise fail(why) where a GPT-2 config.json has sizes or a computation this model cannot
    take."""
    for key in ("n_layer", "n_head", "n_embd", "n_positions", "vocab_size"):
        if type(config.get(key)) is not int or config[key] < 1:
            raise fail(f"{key} must be a positive int, not {shown(config.get(key))}")
    try:  # GPTConfig's own checks of a shape (n_embd divisible by n_head)
        GPTConfig(n_layer=config["n_layer"], n_head=config["n_head"], n_embd=config["n_embd"])
    except ValueError as e:
        raise fail(str(e)) from None
    different = {
        "n_inner": (None, 4 * config["n_embd"]),  # the MLP's width: 4 x n_embd
        "activation_function": ("gelu_new", "gelu_pytorch_tanh"),
        "layer_norm_epsilon": (1e-5,),
        "scale_attn_weights": (True,),
        "scale_attn_by_inverse_layer_idx": (False,),
        "reorder_and_upcast_attn": (False,),
        "add_cross_attention": (False,),
        "tie_word_embeddings": (True,),
    }
    for key, valid in different.items():
        if key in config and config[key] not in valid:
            raise fail(
                f"{key} is {shown(config[key])}; this model computes GPT-2's "
                f"{' or '.join(map(repr, valid))}"
            )
    if size := model_size_problem(
        config["n_layer"], config["n_embd"], config["vocab_size"], config["n_positions"]
    ):
        raise fail(size)


def weight_shapes(path: Path) -> Shapes:
    """The name and shape of every tensor in a weights file, read without loading the weights
    (safetensors' header; a pytorch_model.bin mapped, not read)."""
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    # not the zip format that can be mapped: read it (or learn why it cannot be)
    except RuntimeError:
        state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise ValueError(f"it holds a {type(state).__name__}, not a dict of tensors")
    return {k: tuple(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)}


def expected_shapes(config: dict[str, Any]) -> Shapes:
    """Every weight of the GPT-2 config describes, by its transformers name (without
    'transformer.'), and its shape (Conv1D weights are (in, out))."""
    d, inner = config["n_embd"], 4 * config["n_embd"]
    block = {
        "ln_1.weight": (d,), "ln_1.bias": (d,), "ln_2.weight": (d,), "ln_2.bias": (d,),
        "attn.c_attn.weight": (d, 3 * d), "attn.c_attn.bias": (3 * d,),
        "attn.c_proj.weight": (d, d), "attn.c_proj.bias": (d,),
        "mlp.c_fc.weight": (d, inner), "mlp.c_fc.bias": (inner,),
        "mlp.c_proj.weight": (inner, d), "mlp.c_proj.bias": (d,),
    }  # fmt: skip
    shapes = {"wte.weight": (config["vocab_size"], d), "wpe.weight": (config["n_positions"], d)}
    shapes |= {
        f"h.{i}.{name}": shape for i in range(config["n_layer"]) for name, shape in block.items()
    }
    return shapes | {"ln_f.weight": (d,), "ln_f.bias": (d,)}


def model_size_problem(n_layer: int, n_embd: int, vocab_size: int, block_size: int) -> str | None:
    """Why a GPT of this shape cannot be built here (its float32 weights alone outweigh this
    machine's memory), or None: an absurd size is one error line, not an allocation failure or hours
    of building layers."""
    # the blocks, the embeddings
    params = n_layer * 12 * n_embd**2 + (vocab_size + block_size) * n_embd
    memory = host_memory_bytes()
    if memory is None or 4 * params <= memory:
        return None
    return (
        f"a GPT of n_layer={n_layer}, n_embd={n_embd}, vocab_size={vocab_size}, "
        f"block_size={block_size} has "
        f"about {params:.3g} parameters, {4 * params / 1e9:,.0f} GB in float32: more than this "
        "machine's "
        f"{memory / 1e9:,.0f} GB of memory"
    )


def check_pretrained_settings(settings: GPTConfig, name: str) -> None:
    """A UserError where the settings ask GPT-2's weights for an architecture of the recipe's."""
    default = lambda k: GPTConfig.__dataclass_fields__[k].default
    if recipe := [k for k in RECIPE_ARCHITECTURE if getattr(settings, k) != default(k)]:
        raise UserError(
            f"init_from={name}: GPT-2's weights fix its architecture; drop {', '.join(recipe)}"
        )


def check_fits_model(
    settings: GPTConfig,
    given: frozenset[str],
    weights: GPTConfig,
    source: str,
    dataset: str,
    vocab_size: int,
) -> None:
    """A UserError where the model loaded from source (a checkpoint, GPT-2's weights) cannot be the
    one the settings describe: block_size beyond its own (a smaller one crops it), a dataset of more
    tokens than its vocabulary; for GPT-2's weights a setting given that they lack (architecture) or
    loading skips (an initialisation): the run would train one model and record another."""
    if source != "checkpoint":
        differs = lambda k: k in given and getattr(settings, k) != getattr(weights, k)
        shape = [k for k in ARCHITECTURE if k != "block_size" and differs(k)]
        init = [k for k in fields_of_kind("init") if differs(k)]
        if shape or init:
            asked = ", ".join(f"{k}={getattr(settings, k)!r}" for k in shape + init)
            theirs = [f"{k}={getattr(weights, k)!r}" for k in shape] + [
                f"{k} not applied" for k in init
            ]
            raise UserError(
                f"init_from={source}: the weights fix {', '.join(theirs)}, not {asked}: drop them, "
                "or train "
                "from scratch"
            )
    if settings.block_size > weights.block_size:
        raise UserError(
            f"block_size={settings.block_size} is larger than the {source}'s {weights.block_size}"
        )
    if vocab_size > weights.vocab_size:
        raise UserError(
            f"dataset {dataset} has {vocab_size} tokens, more than the {source}'s vocabulary of "
            f"{weights.vocab_size}"
        )
