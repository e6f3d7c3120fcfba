"""Speculative decoding: greedy, the model's own tokens whatever the draft; sampled, the model's
distribution (the acceptance rule tested against exact distributions, with a wrong rule shown to
fail the same test)."""

import itertools
import re

import pytest
import torch

from conftest import (
    GENERATE_CONFIG,
    assert_one_line_error,
    prompts,
    run_in_process,
    run_script,
    sharp_model,
)
from model import GPT, GPTConfig
from nanogpt_perf.generate import Engine, Sampling
from nanogpt_perf.runtime import resolve_runtime
from nanogpt_perf.speculative import (
    DraftStats,
    ModelDraft,
    NgramDraft,
    accept,
    probabilities,
    speculative_tokens,
)
from nanogpt_perf.train.checkpoint import save_checkpoint

CPU = resolve_runtime("cpu", "float32")
GREEDY = Sampling(temperature=0)
CHI2_999 = {7: 24.32, 35: 66.62}  # chi-square's 99.9th percentile by degrees of freedom


def drafts(target: GPT, sampling: Sampling = GREEDY, generator=None) -> dict:
    """Every kind of draft: n-grams, a smaller model, the model itself (each of its tokens
    accepted)."""
    return {
        "ngram": NgramDraft(),
        "smaller model": ModelDraft(sharp_model(seed=9, n_layer=1), sampling, 16, generator),
        "itself": ModelDraft(target, sampling, 16, generator),
    }


@pytest.mark.parametrize(
    ("prompt_len", "new_tokens", "k"), [(5, 8, 4), (3, 40, 3), (10, 30, 6), (1, 13, 1)]
)
def test_greedy_speculative_tokens_are_plain_decodings(prompt_len, new_tokens, k):
    """Whatever the draft proposes, the same tokens as plain decoding, within the cache and past
    block_size (16), where the window slides and nothing is drafted."""
    target = sharp_model(seed=0)
    idx = prompts(1, prompt_len)
    engine = Engine(target, CPU)
    plain = torch.cat(list(engine.tokens(idx, new_tokens, GREEDY)), dim=1)
    assert torch.equal(plain, target.generate(idx, new_tokens, temperature=0)[:, prompt_len:])
    for name, draft in drafts(target).items():
        stats = DraftStats()
        ours = torch.cat(
            list(speculative_tokens(engine, idx, new_tokens, GREEDY, draft, k, None, stats)), dim=1
        )
        assert torch.equal(ours, plain), name
        assert stats.tokens == new_tokens and stats.accepted <= stats.drafted
        if name == "itself":  # a draft that is the model: every drafted token kept
            assert stats.accepted == stats.drafted > 0


def test_a_model_drafting_for_itself_never_drafts_a_padded_token():
    """Greedy, a draft that is the model has every token accepted, whatever its padded vocabulary's
    tail says: here the padded tokens' logits are the highest, and neither the model nor the draft
    may draw them."""
    target = sharp_model(seed=0)
    with torch.no_grad():
        target.lm_head.weight[60:] = (
            100 * target.transformer.ln_f(target.transformer.wte.weight[:4]).sign()
        )
    sampling, idx = Sampling(temperature=0, vocab_size=60), prompts(1, 4)
    stats = DraftStats()
    draft = ModelDraft(target, sampling, 16, None)
    tokens = list(speculative_tokens(Engine(target, CPU), idx, 10, sampling, draft, 4, None, stats))
    assert max(t.item() for t in tokens) < 60 and stats.accepted == stats.drafted > 0


def test_ngram_drafts_continue_the_latest_earlier_occurrence():
    draft = NgramDraft()
    context = [1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3]
    assert draft.propose(context, 3) == ([7, 5, 1], None)  # after the latest "1 2 3", not the first
    assert draft.propose(context + [7], 2) == ([5, 1], None)  # "2 3 7" seen once
    assert NgramDraft().propose([4, 5, 6], 3) == ([], None)  # no earlier occurrence of any suffix


def chi_square(counts: torch.Tensor, p: torch.Tensor) -> float:
    expected = p * counts.sum()
    seen = expected > 0
    assert counts[~seen].sum() == 0  # nothing drawn where the distribution has no mass
    return (((counts - expected)[seen] ** 2) / expected[seen]).sum().item()


def first_tokens(rule, p, q, draw_q, n: int, seed: int = 0) -> torch.Tensor:
    """How often each token comes first out of rule over n draws, each from a draft drawn by
    draw_q."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(p.size(-1))
    for _ in range(n):
        drafted = draw_q(g)
        kept, after = rule(p, drafted, q, g)
        counts[drafted[0] if kept else after] += 1
    return counts


# a wrong rule: the draft's distribution, not the model's
def always_kept(p, drafted, q, generator):
    return len(drafted), 0


@pytest.mark.parametrize("draft", ["model", "ngram"])
def test_acceptance_rule_keeps_the_models_distribution(draft):
    """The first token out of the rule, over 20,000 draws, follows p (chi-square below its 99.9th
    percentile) whatever q; the wrong rule that keeps every drafted token follows q instead and
    fails the same test."""
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(2 * torch.randn(2, 8, generator=g), dim=-1)
    if draft == "model":
        q = torch.softmax(2 * torch.randn(1, 8, generator=g), dim=-1)
        draw_q = lambda g: [torch.multinomial(q[0], 1, generator=g).item()]  # noqa: E731
    else:  # a certain draft: always token 3, whatever its probability under p
        q, draw_q = None, lambda g: [3]  # noqa: E731
    counts = first_tokens(accept, p, q, draw_q, 20_000)
    assert chi_square(counts, p[0]) < CHI2_999[7]
    wrong = first_tokens(always_kept, p, q, draw_q, 20_000)
    assert chi_square(wrong, p[0]) > 10 * CHI2_999[7]


def test_sampled_speculative_sequences_follow_the_models_distribution():
    """Two tokens sampled after a prompt, 2,000 times, speculatively with a smaller model's drafts:
    their joint distribution is the model's (computed exactly from its logits), top_k and
    temperature applied."""
    target = sharp_model(seed=0, vocab_size=8, n_layer=1)
    target.lm_head.weight.data.mul_(0.25)  # softer logits: every pair of tokens has mass
    draft_model = sharp_model(seed=5, vocab_size=8, n_layer=1)
    sampling = Sampling(temperature=0.9, top_k=6)
    idx = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        first = probabilities(target(idx)[0][0, -1], sampling)
        pairs = torch.zeros(8, 8)
        for a in range(8):
            after = probabilities(
                target(torch.cat([idx, torch.tensor([[a]])], 1))[0][0, -1], sampling
            )
            pairs[a] = first[a] * after
    engine, g = Engine(target, CPU), torch.Generator().manual_seed(0)
    counts = torch.zeros(8, 8)
    for _ in range(2000):
        draft = ModelDraft(draft_model, sampling, 16, g)
        a, b = (t.item() for t in speculative_tokens(engine, idx, 2, sampling, draft, 2, g))
        counts[a, b] += 1
    assert (pairs > 0).sum() == 36  # top_k: 6 first tokens, 6 second ones after each
    assert chi_square(counts.flatten(), pairs.flatten()) < CHI2_999[35]


def test_draft_stats_say_what_was_accepted():
    stats = DraftStats(target_steps=4, drafted=12, accepted=9, tokens=13)
    assert stats.acceptance == 0.75 and stats.tokens_per_step == 3.25
    assert (
        stats.describe()
        == "speculative: 9 of 12 drafted tokens accepted (75%), 3.25 tokens per target step"
    )


@pytest.fixture(scope="module")
def char_checkpoints(tmp_path_factory):
    """A model and a smaller draft of the same characters, and a draft of other characters."""
    folder = tmp_path_factory.mktemp("speculative")
    itos = list("abcdefghijklmnopqrstuvwxyz ")
    for name, n_layer, vocab in [("model", 2, itos), ("draft", 1, itos), ("other", 1, itos[:-1])]:
        args = dict(GENERATE_CONFIG, n_layer=n_layer, vocab_size=len(vocab), block_size=64)
        torch.manual_seed(n_layer)
        model = GPT(GPTConfig(**args))
        state = {"model": model.state_dict(), "model_args": args,
                 "tokenizer": {"kind": "characters", "itos": vocab}}  # fmt: skip
        save_checkpoint(state, folder / name / "ckpt.pt")
    return folder


def sample_text(result) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout.split("tokenizer: ")[1].split("\n", 1)[1].split("---------------")[0]


def test_sample_py_drafts_give_the_plain_greedy_text(char_checkpoints):
    common = [
        f"--out_dir={char_checkpoints / 'model'}",
        "--device=cpu",
        "--start=to be or not to be ",
        "--max_new_tokens=40",
        "--temperature=0",
        "--num_samples=1",
    ]
    plain = run_script("sample.py", *common)
    assert sample_text(plain).endswith("q" * 30 + "\n")  # this random model repeats itself
    for draft in ("ngram", str(char_checkpoints / "draft")):
        drafted = run_script("sample.py", *common, f"--draft={draft}", "--draft_tokens=3")
        assert sample_text(drafted) == sample_text(plain)
        stats = re.search(r"accepted \((\d+)%\), ([\d.]+) tokens per target step", drafted.stdout)
        if draft == "ngram":  # text that repeats is drafted and accepted: several tokens a pass
            assert int(stats[1]) > 80 and float(stats[2]) > 1.5, drafted.stdout


@pytest.mark.parametrize(
    ("flags", "fragments"),
    [
        (["--draft=ngram", "--batched=True"], ["draft='ngram'", "batched=False"]),
        (["--draft=ngram", "--kv_cache=False"], ["one sequence at a time", "kv_cache=True"]),
        (
            ["--draft=OTHER"],
            ["tokenizer characters (26)", "characters (27)", "share the model's vocabulary"],
        ),
        (["--draft=NONE"], ["no checkpoint at"]),
    ],
)
def test_sample_py_refuses_a_draft_it_cannot_use(char_checkpoints, flags, fragments):
    flags = [
        f.replace("OTHER", str(char_checkpoints / "other")).replace(
            "NONE", str(char_checkpoints / "x")
        )
        for f in flags
    ]
    model = f"--out_dir={char_checkpoints / 'model'}"
    result = run_in_process(
        "sample.py", model, "--device=cpu", "--start=ab", "--max_new_tokens=5", *flags
    )
    assert_one_line_error(result, *fragments)


def test_every_draft_length_gives_the_same_greedy_tokens():
    target = sharp_model(seed=1)
    idx = prompts(1, 4)
    engine = Engine(target, CPU)
    plain = torch.cat(list(engine.tokens(idx, 20, GREEDY)), dim=1)
    for k, name in itertools.product((1, 2, 5, 11), ("ngram", "smaller model")):
        draft = drafts(target)[name]
        assert torch.equal(
            torch.cat(list(speculative_tokens(engine, idx, 20, GREEDY, draft, k)), dim=1), plain
        )
