"""The rules settings are checked by: a rule gives None for a valid value, else what would be valid ('>= 1'), and
settings_problem turns the first broken one into the error line, e.g. "batch_size must be >= 1, not 0".

Each rule sits beside the setting it checks: a script passes the rules of its own settings to configure(), and the
settings it shares with other scripts bring theirs from where they are defined (nanogpt_perf/settings.py). A rule
that needs a name of another module is written there (runtime.a_device, for one). This module imports no torch:
the data preparation scripts' worker processes import the configurator, and so this."""

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

Rule = Callable[[Any], str | None]  # None for a valid value, else what would be valid, e.g. '>= 1'
CrossRule = Callable[[dict[str, Any]], str | None]  # a rule between settings: the whole error line, or None


def at_least(low: float, note: str = "") -> Rule:
    return lambda v: None if v >= low else f">= {low}{note}"


def above(low: float, note: str = "") -> Rule:
    return lambda v: None if v > low else f"> {low}{note}"


def interval(low: float, high: float, low_open: bool = False, high_open: bool = False) -> Rule:
    """[low, high], an end open where asked: interval(0, 1, high_open=True) is [0, 1)."""
    text = f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    inside = lambda v: (v > low if low_open else v >= low) and (v < high if high_open else v <= high)
    return lambda v: None if inside(v) else text


def one_of(*choices: str) -> Rule:
    return lambda v: None if v in choices else f"one of {', '.join(choices)}"


def or_word(word: str, rule: Rule) -> Rule:
    """rule, or the word itself (e.g. 'auto')."""
    return lambda v: None if v == word else (rule(v) and f"{word!r} or {rule(v)}")


def list_of(*choices: str) -> Rule:
    """Comma-separated names, each one of choices."""
    valid = lambda v: all(name.strip() in choices for name in v.split(","))
    return lambda v: None if valid(v) else f"a comma-separated list of {', '.join(choices)}"


def a_path(value: str) -> str | None:
    return None if value else "a path"


def anything(value: Any) -> None:
    """For a setting whose every value of its type is valid: free text, a switch."""
    return None


def not_above(name: str, limit: str, when: str | None = None) -> CrossRule:
    """settings[name] <= settings[limit], where settings[when] is true (always when None)."""

    def rule(s: dict[str, Any]) -> str | None:
        if (when is not None and not s[when]) or s[name] <= s[limit]:
            return None
        return f"{name} must be <= {limit} ({s[limit]}){f' when {when}=True' if when else ''}, not {s[name]}"

    return rule


def above_setting(name: str, low: str) -> CrossRule:
    """settings[name] > settings[low]."""
    return lambda s: None if s[name] > s[low] else f"{name} must be > {low} ({s[low]}), not {s[name]}"


def unruled(settings: Iterable[str], values: dict[str, Any], rules: dict[str, Rule]) -> list[str]:
    """The numeric settings that have no rule: each int or float setting must have one (a developer's mistake)."""
    return [k for k in settings if k not in rules and type(values[k]) in (int, float)]


def settings_problem(settings: dict[str, Any], rules: dict[str, Rule], cross: Iterable[CrossRule] = ()) -> str | None:
    """The first setting (in the script's order) outside its valid range or set, as an error message, then the
    first rule between settings broken; None when every setting is valid."""
    for name, value in settings.items():
        valid = rules[name](value) if name in rules else None
        if valid is not None:
            return f"{name} must be {valid}, not {value!r}"
    return next((problem for rule in cross if (problem := rule(settings))), None)


def init_from_one_of(*choices: str) -> Rule:
    """choices (e.g. 'scratch', 'resume' and GPT-2's hub names) or an existing folder in transformers' format."""
    return lambda v: None if v in choices or Path(v).is_dir() else f"{', '.join(choices)} or a transformers folder"
