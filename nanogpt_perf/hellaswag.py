"""HellaSwag (Zellers et al., 2019), scored as build-nanogpt and llm.c score GPT-2 on it: each
example's context is followed by each of its 4 endings, and the ending the model finds most likely
wins. acc compares the endings by the sum of their tokens' log-probabilities after the context,
acc_norm by the mean per token (which does not favour short endings). GPT-2 (124M) scores acc_norm
0.2955 on the 10,042 validation examples.

The examples are the official validation file (JSONL: ctx, endings, label, ...), downloaded once, or
a local file in the same format. Under torch.distributed each rank scores its share and the counts
are summed."""

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn import functional as F

from model import GPT
from nanogpt_perf.errors import UserError
from nanogpt_perf.files import read_user_text, write_bytes

VAL_URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
VAL_EXAMPLES = 10_042
GPT2_124M_ACC_NORM = 0.2955  # the published figure (llm.c, build-nanogpt)


def download_val(path: Path, flag: str = "hellaswag_file") -> Path:
    """The official validation file at path, downloaded when it is not there yet; flag: the setting
    that names a local copy instead, as the script that calls this spells it (train.py's
    hellaswag_file, hellaswag.py's file)."""
    if not path.is_file():
        try:
            with urllib.request.urlopen(VAL_URL, timeout=60) as response:
                data = response.read()
        except OSError as e:
            raise UserError(
                f"cannot download HellaSwag ({e}); give a local copy of hellaswag_val.jsonl with "
                f"--{flag}=PATH"
            ) from None
        # atomically: a killed download leaves no half file to be read next time
        write_bytes(path, data)
    return path


def read_examples(path: Path, limit: int = 0) -> list[dict[str, Any]]:
    """The examples of a HellaSwag JSONL file (the first limit of them; 0 = all), each checked: a
    context, 4 endings, the label of the right one. One line naming the file and the line for
    anything else."""
    examples = []
    for n, line in enumerate(read_user_text(path, "the HellaSwag file").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            example = json.loads(line)
            ctx, endings, label = example["ctx"], example["endings"], example["label"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise UserError(
                f"{path} line {n} is not a HellaSwag example ({type(e).__name__}: {e}): ctx, "
                "endings, label"
            ) from None
        valid = isinstance(ctx, str) and isinstance(endings, list) and len(endings) == 4
        if not valid or not all(isinstance(e, str) for e in endings) or label not in (0, 1, 2, 3):
            raise UserError(
                f"{path} line {n} is not a HellaSwag example: a ctx text, 4 endings, a label 0 to 3"
            )
        examples.append({"ctx": ctx, "endings": endings, "label": label})
        if limit and len(examples) == limit:
            break
    if not examples:
        raise UserError(f"{path} holds no HellaSwag examples")
    return examples


def examples_for_run(file: str, data_dir: str, limit: int, master: bool, distributed: bool) -> list:
    """train.py's HellaSwag examples: file, else the official ones (downloaded once by rank 0, into
    data_dir/hellaswag/, while the other ranks wait)."""
    path = Path(file) if file else Path(data_dir) / "hellaswag" / "hellaswag_val.jsonl"
    if master and not file:
        download_val(path)
    if distributed:
        dist.barrier()
    return read_examples(path, limit)


def render(
    example: dict[str, Any], encode, block_size: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The 4 rows of an example: context then ending (a space before it), padded with 0 to the
    longest; and the mask of the ending's tokens. With block_size, each row is cropped from the left
    to the block_size + 1 tokens a forward pass of block_size sees (its inputs, and the next token
    of the last): the context gives way, never an ending; an ending longer than that keeps its last
    block_size + 1 tokens, of which the last block_size are scored (the first stands for the
    context)."""
    ctx = encode(example["ctx"])
    rows = [ctx + encode(" " + ending) for ending in example["endings"]]
    starts = [len(ctx)] * 4  # where each row's ending begins
    if block_size is not None:
        cut = [max(len(row) - block_size - 1, 0) for row in rows]
        rows = [row[c:] for row, c in zip(rows, cut, strict=True)]
        starts = [max(start - c, 0) for start, c in zip(starts, cut, strict=True)]
    tokens = torch.zeros(4, max(map(len, rows)), dtype=torch.long)
    mask = torch.zeros_like(tokens, dtype=torch.bool)
    for i, (row, start) in enumerate(zip(rows, starts, strict=True)):
        tokens[i, : len(row)] = torch.tensor(row)
        mask[i, start : len(row)] = True
    return tokens, mask


@torch.no_grad()
def ending_scores(
    model: GPT, tokens: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum, mean) per row of the log-probabilities of the masked tokens, each given the tokens
    before it."""
    logits = model.head(model.hidden_states(tokens[:, :-1]))  # softcapped where the model is
    # float32 at least, float64 kept
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    logprobs = F.log_softmax(logits, dim=-1).gather(-1, tokens[:, 1:, None]).squeeze(-1)
    taken = mask[:, 1:]
    total = (logprobs * taken).sum(dim=1)
    return total, total / taken.sum(dim=1)


def score(
    model: GPT,
    examples: list[dict[str, Any]],
    encode: Callable,
    device: torch.device,
    autocast: Callable,
    stop: Callable[[], bool] | None = None,
) -> dict[str, Any] | None:
    """acc and acc_norm of model over the examples (this rank's share under torch.distributed, the
    counts summed over the ranks); encode: text to GPT-2 token ids; autocast(): the context of the
    forward passes.

    stop(), when given, is asked before each example, and a True ends the scoring there: None is
    returned. Under torch.distributed every rank asks it equally often (a rank whose share is
    shorter asks once more without an example), so that a stop that all-reduces its answer keeps the
    ranks together and they all return None."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    was_training = model.training
    model.eval()
    # examples, right by the sum, right by the mean
    counts = torch.zeros(3, dtype=torch.long, device=device)
    try:
        for first in range(0, len(examples), world):  # one example per rank each round
            if stop is not None and stop():
                return None
            if first + rank >= len(examples):
                continue
            example = examples[first + rank]
            tokens, mask = render(example, encode, model.config.block_size)
            with autocast():
                total, mean = ending_scores(model, tokens.to(device), mask.to(device))
            label = example["label"]
            counts += torch.tensor(
                [1, int(total.argmax() == label), int(mean.argmax() == label)], device=device
            )
    finally:
        model.train(was_training)
    if dist.is_initialized():
        dist.all_reduce(counts)
    n, right, right_norm = counts.tolist()
    return {
        "examples": n,
        "acc": right / n,
        "acc_norm": right_norm / n,
        "correct": right,
        "correct_norm": right_norm,
    }
