"""Speculative decoding, lossless: a draft proposes k tokens, the model checks them all in one
forward pass (a decode step reads every weight once whether it runs one token or five) and keeps the
drafted tokens it would have drawn itself, then one of its own. Greedy, those are the model's own
greedy tokens; sampled, the standard rule (accept a drafted x with probability min(1, p(x) / q(x)),
else draw from max(0, p - q) renormalised; Leviathan et al. 2023, Chen et al. 2023) keeps the
model's distribution p exactly, whatever the draft's q. Two drafts: a smaller model of the same
vocabulary (ModelDraft), or the n-grams of the text so far (NgramDraft: no second model)."""

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from model import GPT
from nanogpt_perf.config import setting
from nanogpt_perf.generate import Engine, Sampling, cached_forward, candidates, kv_cache
from nanogpt_perf.guard.paths import check_path, path_rule

NGRAM_MAX = 4  # the longest suffix NgramDraft looks up, then shorter ones down to a single token


@path_rule
def a_draft(value: str) -> None:
    if value not in ("", "ngram"):
        try:
            check_path(value)
        except ValueError as e:
            raise ValueError(f"'', 'ngram' or {e}") from None


@dataclass
class DraftConfig:
    """Speculative decoding (one sequence at a time)"""

    draft: str = setting("", "'ngram' (drafts from the text so far) or the out_dir of a smaller "
                         "model of the same vocabulary; '' = none", check=a_draft)  # fmt: skip
    draft_tokens: int = setting(4, "tokens drafted for each pass of the model", min=1, max=64)


@dataclass
class DraftStats:
    """What a speculative generation did: target_steps forward passes of the model gave tokens new
    tokens."""

    target_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    tokens: int = 0

    @property
    def acceptance(self) -> float:
        return self.accepted / max(self.drafted, 1)

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / max(self.target_steps, 1)

    def describe(self) -> str:
        return (
            f"speculative: {self.accepted:,} of {self.drafted:,} drafted tokens accepted "
            f"({self.acceptance:.0%}), {self.tokens_per_step:.2f} tokens per target step"
        )


def probabilities(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """The distribution sampling draws from after logits (..., V), over the first
    sampling.vocab_size tokens (float32; temperature > 0): softmax over the candidates that top_k
    and top_p keep, 0 elsewhere."""
    logits = logits[..., : sampling.vocab_size].float() / sampling.temperature
    values, ids = candidates(logits, sampling.top_k, sampling.top_p)
    probs = values.softmax(dim=-1)
    return probs if ids is None else torch.zeros_like(logits).scatter_(-1, ids, probs)


def accept(
    p: torch.Tensor, drafted: list[int], q: torch.Tensor | None, generator: torch.Generator | None
) -> tuple[int, int]:
    """The standard acceptance rule over p (k + 1, V), the model's distributions after each drafted
    token's context, and q (k, V), the draft's (None: each drafted token certain, as an n-gram
    proposes it): how many of the k drafted tokens are kept, and the token drawn after them (from
    the residual at the first refused one, else from p's last row)."""
    for i, x in enumerate(drafted):
        qx = 1.0 if q is None else q[i, x].item()
        if torch.rand((), generator=generator).item() * qx < p[i, x].item():
            continue
        residual = p[i].clone()
        if q is None:
            residual[x] = 0
        else:
            residual = (residual - q[i]).clamp_(min=0)
        if residual.sum() <= 0:  # p == q in floating point: nothing left to correct
            residual = p[i]
        return i, torch.multinomial(residual, 1, generator=generator).item()
    return len(drafted), torch.multinomial(p[-1], 1, generator=generator).item()


def greedy_accept(logits: torch.Tensor, drafted: list[int]) -> tuple[int, int]:
    """accept at temperature 0: the drafted tokens that equal the model's argmax, then its argmax
    after them."""
    best = logits.max(dim=-1).indices.tolist()  # argmax, faster: model.sample
    n = next((i for i, x in enumerate(drafted) if x != best[i]), len(drafted))
    return n, best[n]


class NgramDraft:
    """Drafts the tokens that followed the latest earlier occurrence of the context's last n tokens
    (n from NGRAM_MAX down to 1): text repeats itself, in a prompt and in what a model writes.
    Certain drafts (q None)."""

    def __init__(self):
        # an n-gram -> where the tokens after its latest occurrence start
        self.after: dict[tuple, int] = {}
        self.indexed = 0  # n-grams ending before this position are in after

    def propose(self, context: list[int], k: int) -> tuple[list[int], None]:
        for end in range(self.indexed + 1, len(context)):  # every n-gram with a token after it
            for n in range(1, min(NGRAM_MAX, end) + 1):
                self.after[tuple(context[end - n : end])] = end
        self.indexed = max(self.indexed, len(context) - 1)
        for n in range(min(NGRAM_MAX, len(context)), 0, -1):
            start = self.after.get(tuple(context[-n:]))
            if start is not None:
                return context[start : start + k], None
        return [], None

    def rewind(self, kept: int) -> None:
        pass


class ModelDraft:
    """Drafts with a smaller model of the same vocabulary, keeping its own KV cache of the context:
    each proposal first runs the tokens its cache lacks, then k tokens drawn from its own
    distribution (greedy at temperature 0)."""

    def __init__(
        self, model: GPT, sampling: Sampling, cache_len: int, generator: torch.Generator | None
    ):
        """cache_len: the model's (the draft proposes nothing past it, nor past its own
        block_size)."""
        self.k, self.v = kv_cache(model, 1, min(cache_len, model.config.block_size))
        self.model, self.sampling, self.generator = model, sampling, generator
        self.device = model.transformer.wte.weight.device
        # positions of the cache that hold the context; its length at the proposal
        self.filled = self.base = 0

    def propose(self, context: list[int], k: int) -> tuple[list[int], torch.Tensor | None]:
        if len(context) + k - 1 > self.k[0].size(2):  # past the draft's window: no proposal
            return [], None
        drafted, qs = [], []
        new = torch.tensor([context[self.filled :]], device=self.device)
        with torch.no_grad():
            logits = cached_forward(self.model, new, self.k, self.v, self.filled)
            self.filled = self.base = len(context)
            for i in range(k):
                # the model's greedy choice: never a padded token
                if self.sampling.temperature == 0:
                    drafted.append(logits[0, : self.sampling.vocab_size].argmax().item())
                else:
                    qs.append(probabilities(logits[0], self.sampling))
                    drafted.append(torch.multinomial(qs[-1], 1, generator=self.generator).item())
                if i < k - 1:
                    token = torch.tensor([[drafted[-1]]], device=self.device)
                    logits = cached_forward(self.model, token, self.k, self.v, self.filled)
                    self.filled += 1
        return drafted, torch.stack(qs) if qs else None

    def rewind(self, kept: int) -> None:
        """Of the drafted tokens in the cache, keep the first kept (those the model accepted)."""
        self.filled = min(self.filled, self.base + kept)


def speculative_tokens(
    engine: Engine,
    idx: torch.Tensor,
    max_new_tokens: int,
    sampling: Sampling,
    draft: "NgramDraft | ModelDraft",
    k: int,
    generator: torch.Generator | None = None,
    stats: DraftStats | None = None,
) -> Iterator[torch.Tensor]:
    """Engine.tokens for one prompt idx (1, T), k tokens drafted at a time and checked by one
    forward pass of the engine's model (eager, attending to the filled part of the cache): the same
    tokens greedy, the same distribution sampled. Past the cache's length the window slides as
    Engine.tokens slides it, a token a pass. stats, if given, counts the passes and the drafted and
    accepted tokens."""
    stats = stats if stats is not None else DraftStats()
    idx = idx[:, -engine.model.config.block_size :]
    decoder = engine.decoder(1, idx.size(1), max_new_tokens, sampling)
    decoder.prefill(idx, 1, generator)
    context, length = idx[0].tolist() + [decoder.token.item()], idx.size(1)
    stats.target_steps, stats.tokens = stats.target_steps + 1, stats.tokens + 1
    yield decoder.token.clone()
    while len(context) - idx.size(1) < max_new_tokens:
        left = max_new_tokens - (len(context) - idx.size(1))
        # the window slides: a prefill a token, as Engine.tokens does
        if length >= decoder.cache_len:
            decoder.prefill(
                torch.tensor([context[-decoder.cache_len :]], device=idx.device), 1, generator
            )
            new = [decoder.token.item()]
        else:
            room = min(k, left - 1, decoder.cache_len - length - 1)
            drafted, q = draft.propose(context, room) if room > 0 else ([], None)
            kept, token = check(decoder, context[-1:] + drafted, length, q, generator)
            draft.rewind(kept)
            new, length = drafted[:kept] + [token], length + kept + 1
            stats.drafted, stats.accepted = stats.drafted + len(drafted), stats.accepted + kept
        stats.target_steps, stats.tokens = (
            stats.target_steps + 1,
            stats.tokens + min(len(new), left),
        )
        for token in new[:left]:
            context.append(token)
            yield torch.tensor([[token]], device=idx.device)


def check(decoder, tokens: list[int], length: int, q, generator) -> tuple[int, int]:
    """One pass of decoder's model over tokens (the last accepted token, then the drafted ones) at
    position length of its cache: how many drafted tokens it keeps and the token after them."""
    sampling = decoder.sampling
    with torch.no_grad():
        logits = decoder.forward_at(
            torch.tensor([tokens], device=decoder.token.device), length, every=True
        )[0]
    if sampling.temperature == 0:
        return greedy_accept(logits[:, : sampling.vocab_size], tokens[1:])
    return accept(probabilities(logits, sampling), tokens[1:], q, generator)
