"""HellaSwag: a tiny model scored on a handmade file in the official format, against a slow
computation of every ending alone; bad files refused in one line; train.py's periodic scoring
logged, plotted, and the same from 2 ranks as from 1."""

import json

import pytest
import torch
from torch.nn import functional as F

from conftest import (
    TINY_MODEL,
    assert_one_line_error,
    llmc_folder,
    refuse_train,
    run_in_process,
    run_script,
)
from model import GPT, GPTConfig
from nanogpt_perf.data.tokenizer import gpt2_encoding
from nanogpt_perf.hellaswag import ending_scores, read_examples, render, score
from nanogpt_perf.train.checkpoint import save_checkpoint

EXAMPLES = [
    (
        "A man is sitting on a roof. He",
        [
            "is using wrap to wrap a pair of skis.",
            "is ripping level tiles off.",
            "is holding a rubik's cube.",
            "starts pulling up roofing on a roof.",
        ],
        3,
    ),
    (
        "A lady walks to a barbell. She bends down and grabs the pole. The lady",
        [
            "swings and lands in her arms.",
            "pulls the barbell forward.",
            "pulls a rope attached to the barbell.",
            "stands and lifts the weight.",
        ],
        3,
    ),
    (
        "Two women in a child are shown in a canoe while a man pulls the canoe while standing in "
        "the water. The",
        [
            "man is rowing.",
            "canoe hits the water.",
            "women are holding a rope.",
            "child gets out of the canoe.",
        ],
        1,
    ),
    (
        "The man in the center is demonstrating a hairstyle on the person wearing the blue shirt. "
        "The man in the blue "
        "shirt",
        [
            "sits on the chair next to the sink.",
            "rinses his hair.",
            "then combs it and blow dries the hair.",
            "styles the hair with a curling iron.",
        ],
        0,
    ),
    (
        "Kids are playing in the snow.",
        ["They throw snowballs.", "A dog runs.", "It melts.", "Everyone goes home."],
        2,
    ),
]


@pytest.fixture(scope="module")
def official_file(tmp_path_factory):
    """The examples in the official JSONL format, with its other fields."""
    path = tmp_path_factory.mktemp("hellaswag") / "hellaswag_val.jsonl"
    lines = [
        {"ind": i, "activity_label": "Test", "ctx_a": ctx, "ctx_b": "", "ctx": ctx, "split": "val",
         "split_type": "indomain", "label": label, "endings": endings, "source_id": f"test~{i}"}
        for i, (ctx, endings, label) in enumerate(EXAMPLES)
    ]  # fmt: skip
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def tiny_gpt2_model(seed: int = 0) -> GPT:
    """GPT-2's vocabulary, a tiny trunk, float64 (no rounding in the comparisons), weights scaled up
    so that the endings' scores differ."""
    torch.manual_seed(seed)
    model = (
        GPT(GPTConfig(vocab_size=50257, block_size=64, n_layer=1, n_head=2, n_embd=16))
        .double()
        .eval()
    )
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3)
    return model


def slow_scores(model: GPT, example: dict, encode) -> list[tuple[float, float]]:
    """(sum, mean) of each ending's log-probabilities, each ending run alone through the whole
    model."""
    ctx, out = encode(example["ctx"]), []
    for ending in example["endings"]:
        tokens = ctx + encode(" " + ending)
        seq = torch.tensor([tokens])
        logits, _ = model(seq[:, :-1], seq[:, 1:])
        logprobs = F.log_softmax(logits[0], dim=-1)
        picked = [logprobs[j - 1, tokens[j]].item() for j in range(len(ctx), len(tokens))]
        out.append((sum(picked), sum(picked) / len(picked)))
    return out


def test_the_batched_scores_equal_each_ending_alone(official_file):
    enc = gpt2_encoding()
    encode, model = enc.encode_ordinary, tiny_gpt2_model()
    examples = read_examples(official_file)
    right = right_norm = 0
    for example in examples:
        reference = slow_scores(model, example, encode)
        total, mean = ending_scores(model, *render(example, encode))
        torch.testing.assert_close(
            total, torch.tensor([r[0] for r in reference], dtype=total.dtype), atol=1e-9, rtol=0
        )
        torch.testing.assert_close(
            mean, torch.tensor([r[1] for r in reference], dtype=mean.dtype), atol=1e-9, rtol=0
        )
        right += max(range(4), key=lambda i: reference[i][0]) == example["label"]
        right_norm += max(range(4), key=lambda i: reference[i][1]) == example["label"]
    result = score(model, examples, encode, torch.device("cpu"), torch.no_grad)
    assert (result["examples"], result["correct"], result["correct_norm"]) == (5, right, right_norm)
    assert result["acc_norm"] == right_norm / 5


def test_the_script_scores_a_checkpoint_and_refuses_bad_files(official_file, tmp_path, monkeypatch):
    model = tiny_gpt2_model().float()
    model_args = {
        k: getattr(model.config, k)
        for k in ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size", "dropout")
    }
    save_checkpoint(
        {"model": model.state_dict(), "model_args": model_args, "tokenizer": {"kind": "gpt2"}},
        tmp_path / "ckpt.pt",
    )
    common = (f"--out_dir={tmp_path}", "--device=cpu")
    result = run_in_process(
        "hellaswag.py", *common, f"--file={official_file}", f"--out_json={tmp_path / 'hs.json'}"
    )
    assert result.returncode == 0, result.stderr
    assert "HellaSwag" in result.stdout and "5 examples" in result.stdout
    assert json.loads((tmp_path / "hs.json").read_text())["examples"] == 5
    bad = tmp_path / "bad.jsonl"
    for text, message in [("not json\n", "line 1 is not a HellaSwag example"),
                          ('{"ctx": "a", "endings": ["b", "c"], "label": 0}\n', "4 endings"),
                          ("\n", "holds no HellaSwag examples")]:  # fmt: skip
        bad.write_text(text)
        assert_one_line_error(
            run_in_process("hellaswag.py", *common, f"--file={bad}"), str(bad), message
        )
    # no network and no --file: the line names the flag of this script (train.py's is
    # hellaswag_file)
    monkeypatch.setattr("urllib.request.urlopen", no_network)
    assert_one_line_error(run_in_process("hellaswag.py", *common), "no network", "with --file=PATH")


def no_network(*args, **kwargs):
    raise OSError("no network")


@pytest.mark.slow
def test_train_py_scores_it_periodically_and_two_ranks_count_as_one(
    official_file, tiny_data, tmp_path
):
    data = tmp_path / "data"
    llmc_folder(data / "gpt2tokens", [3000, 5000])  # GPT-2's vocabulary: no meta.pkl
    flags = [
        *TINY_MODEL,
        f"--data_dir={data}",
        "--dataset=gpt2tokens",
        f"--hellaswag_file={official_file}",
    ]
    flags += ["--hellaswag_interval=2", "--max_iters=2", "--eval_interval=2", "--eval_iters=1"]
    torchrun = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2")
    runs = {}
    for ranks, launcher in ((1, ()), (2, torchrun)):
        out = tmp_path / f"out{ranks}"
        grads = "--gradient_accumulation_steps=2"  # one micro-batch a rank under 2 ranks
        result = run_script(*launcher, "train.py", *flags, grads, f"--out_dir={out}")
        assert result.returncode == 0, result.stderr
        assert "step 0: HellaSwag acc" in result.stdout
        records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
        runs[ranks] = [r for r in records if "hellaswag_acc" in r]
    assert [r["iter"] for r in runs[1]] == [0, 2] and all(
        r["hellaswag_examples"] == 5 for r in runs[1]
    )
    # the same weights at iter 0: 3 examples on one rank, 2 on the other, summed
    assert runs[2][0] == runs[1][0]
    plot = run_script("lab/plot.py", str(tmp_path / "out1"))
    assert plot.returncode == 0 and (tmp_path / "out1" / "curves.png").is_file()
    # a character vocabulary
    chars = refuse_train(tiny_data, tmp_path / "chars", "--hellaswag_interval=1")
    assert_one_line_error(chars, "hellaswag_interval needs GPT-2's tokens")


# endings that a cropped window would lose: a context of about 40 tokens, one short ending (the
# label) and three long ones of about 25 tokens, scored by a model that sees 16 tokens
CROPPED = [
    (
        "The chef places the pan on the stove, pours in a little oil and waits for it to shimmer "
        "before she adds the "
        "chopped onions. Then she",
        [
            "stirs.",
            "walks over to the window and looks out at the garden for a long while "
            "before going back to the counter",
            "picks up the phone and calls her sister to talk about the weekend plans "
            "they made last month",
            "takes off her apron, folds it neatly and puts it in the drawer next to the silver "
            "spoons",
        ],
        0,
    ),
    (
        "A young man climbs onto the stage with a guitar, adjusts the microphone stand to his "
        "height and looks out at "
        "the small crowd. He",
        [
            "strums.",
            "tells a long story about how he learned to play the instrument from his "
            "grandfather in a small town",
            "asks the sound engineer to turn up the monitors and then tunes every string "
            "twice more very slowly",
            "sits down on a wooden stool, closes his eyes and hums a melody that nobody in the "
            "room seems to know",
        ],
        0,
    ),
]


def cropped_scores(model: GPT, example: dict, encode) -> list[tuple[float, float]]:
    """(sum, mean) of each ending's log-probabilities, each context + ending run alone and cropped
    from the left to the block_size + 1 tokens a forward pass sees; the ending's tokens predicted
    inside it scored."""
    ctx, out, window = encode(example["ctx"]), [], model.config.block_size + 1
    for ending in example["endings"]:
        tokens = ctx + encode(" " + ending)
        cut = max(len(tokens) - window, 0)
        kept = tokens[cut:]
        logits, _ = model(torch.tensor([kept[:-1]]), torch.tensor([kept[1:]]))
        logprobs = F.log_softmax(logits[0], dim=-1)
        picked = [
            logprobs[j - 1, kept[j]].item() for j in range(1, len(kept)) if cut + j >= len(ctx)
        ]
        out.append((sum(picked), sum(picked) / len(picked)))
    return out


def test_cropped_rows_keep_every_ending_and_score_as_each_ending_alone():
    enc = gpt2_encoding()
    torch.manual_seed(0)
    model = (
        GPT(GPTConfig(vocab_size=50257, block_size=16, n_layer=1, n_head=2, n_embd=16))
        .double()
        .eval()
    )
    examples = [{"ctx": ctx, "endings": endings, "label": label} for ctx, endings, label in CROPPED]
    right = right_norm = 0
    for example in examples:
        reference = cropped_scores(model, example, enc.encode_ordinary)
        tokens, mask = render(example, enc.encode_ordinary, model.config.block_size)
        # every ending in the window
        assert tokens.size(1) == 17 and bool(mask[:, 1:].any(dim=1).all())
        total, mean = ending_scores(model, tokens, mask)
        torch.testing.assert_close(
            total, torch.tensor([r[0] for r in reference], dtype=total.dtype), atol=1e-9, rtol=0
        )
        torch.testing.assert_close(
            mean, torch.tensor([r[1] for r in reference], dtype=mean.dtype), atol=1e-9, rtol=0
        )
        right += max(range(4), key=lambda i: reference[i][0]) == example["label"]
        right_norm += max(range(4), key=lambda i: reference[i][1]) == example["label"]
        # the batch cropped as a whole, as before: the short ending's tokens fall out, its mean is
        # 0/0 and wins
        whole, whole_mask = render(example, enc.encode_ordinary)
        _, old_mean = ending_scores(model, whole[:, -17:], whole_mask[:, -17:])
        assert torch.isnan(old_mean[0]) and int(old_mean.argmax()) == example["label"]
    result = score(model, examples, enc.encode_ordinary, torch.device("cpu"), torch.no_grad)
    assert (result["correct"], result["correct_norm"]) == (right, right_norm)
    # an ending longer than the window
    long = {"ctx": "A", "endings": ["x " * 40, "y", "z", "w"], "label": 1}
    tokens, mask = render(long, enc.encode_ordinary, 16)
    assert (
        mask[0, 1:].sum() == 16
        and tokens[0].tolist() == enc.encode_ordinary("A" + " " + "x " * 40)[-17:]
    )
