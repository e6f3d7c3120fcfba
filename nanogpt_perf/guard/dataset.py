"""A dataset's checks: every token id inside its vocabulary (nanogpt_perf/data/identity.py reads the
ids), and what changed in its files since a checkpoint recorded them."""

from pathlib import Path
from typing import Any

from nanogpt_perf.errors import UserError

# how a refusal of data changed since a checkpoint ends
AS_IT_IS = "; resume on it as it is with --allow_changed_data=True"


def check_token_range(path: Path, largest: int, vocab_size: int, meta: Path) -> None:
    """One error line when a token file's largest id is outside the vocabulary: it would index past
    the model's embedding only once training had begun and written its first files."""
    if largest < vocab_size:
        return
    whose = f"{meta}'s vocab_size" if meta.is_file() else "GPT-2's: the dataset has no meta.pkl"
    raise UserError(
        f"{path} holds token id {largest}, outside the vocabulary of {vocab_size} tokens "
        f"({whose}): "
        "the tokens and the vocabulary do not belong together; prepare the dataset again"
    )


def identity_change(saved: dict[str, Any], now: dict[str, Any]) -> str | None:
    """What changed in a dataset's files from identity saved to identity now, in words naming the
    first few, or None (by every hash both record); not the folder: the same files elsewhere are the
    same data."""
    before, after = saved.get("files"), now["files"]
    recorded = lambda v: isinstance(v, dict) and type(v.get("bytes")) is int
    if not isinstance(before, dict) or not all(map(recorded, before.values())):
        return "the saved record of its files is not one (not written by this suite?)"
    changes = []
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name), after.get(name)
        if old is None:
            changes.append(f"{name} is new")
        elif new is None:
            changes.append(f"{name} is gone")
        elif old["bytes"] != new["bytes"]:
            changes.append(f"{name} has {new['bytes']:,} bytes, not {old['bytes']:,}")
        elif any(old[k] != new[k] for k in ("fingerprint", "sha256") if k in old and k in new):
            changes.append(f"{name} has other contents (the same {new['bytes']:,} bytes)")
    more = f" and {len(changes) - 3} more" if len(changes) > 3 else ""
    return "; ".join(changes[:3]) + more if changes else None


def check_same_data(
    saved: dict[str, Any], now: dict[str, Any], dataset: str, allow: bool
) -> str | None:
    """A UserError when a resumed run's dataset changed since its checkpoint (identity saved, now),
    unless allow (allow_changed_data): then the line that says it is taken as it is; None when the
    same."""
    if not (change := identity_change(saved, now)):
        return None
    changed = f"dataset {dataset} changed since the checkpoint was saved"
    if not allow:
        raise UserError(f"{changed}: {change}{AS_IT_IS}")
    return f"{changed} ({change}): resuming on it as it is, as allow_changed_data=True asks"
