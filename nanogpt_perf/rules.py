"""The rules settings are checked by: a rule gives None for a valid value, else what would be valid ('>= 1'), and
settings_problem turns the first broken one into the error line, e.g. "batch_size must be >= 1, not 0".

Each rule sits on the line of the setting it checks, as its annotation (`eval_iters: at_least(1) = 200`), in the
script or in the module of shared settings (nanogpt_perf/settings.py); configure() reads them there. A rule that
needs a name of another module is written there (runtime.device_problem, for one). This module imports no torch:
the data preparation scripts' worker processes import the configurator, and so this. convert() turns a value given
in a config file or a flag into its setting's type.

Every number is also checked before its rule, whatever the script: a float must be finite (NaN never passes; inf only
where a rule says it means something, with takes_infinity) and an int must fit in 64 bits, as torch, numpy and the
checkpoints hold it."""

import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from nanogpt_perf.errors import UserError

Rule = Callable[[Any], str | None]  # None for a valid value, else what would be valid, e.g. '>= 1'
CrossRule = Callable[[dict[str, Any]], str | None]  # a rule between settings: the whole error line, or None


def at_least(low: float, note: str = "", most: float | None = None) -> Rule:
    """>= low; and <= most where what consumes the value has a limit (a tensor's length, a process count)."""
    return lambda v: f">= {low}{note}" if v < low else (f"<= {most}" if most is not None and v > most else None)


def above(low: float, note: str = "") -> Rule:
    return lambda v: None if v > low else f"> {low}{note}"


def interval(low: float, high: float, low_open: bool = False, high_open: bool = False) -> Rule:
    """[low, high], an end open where asked: interval(0, 1, high_open=True) is [0, 1)."""
    text = f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    inside = lambda v: (v > low if low_open else v >= low) and (v < high if high_open else v <= high)
    return lambda v: None if inside(v) else text


def one_of(*choices: str) -> Rule:
    def among(value: Any) -> str | None:
        return None if value in choices else f"one of {', '.join(choices)}"

    among.choices = choices  # type: ignore[attr-defined] (--help lists them)
    return among


def or_word(word: str, rule: Rule) -> Rule:
    """rule, or the word itself (e.g. 'auto'), which the setting takes besides values of its type."""

    def rule_or_word(value: Any) -> str | None:
        return None if value == word else (rule(value) and f"{word!r} or {rule(value)}")

    rule_or_word.words = (word,)  # type: ignore[attr-defined]
    return rule_or_word


def list_of(*choices: str) -> Rule:
    """Comma-separated names, each one of choices."""
    valid = lambda v: all(name.strip() in choices for name in v.split(","))
    return lambda v: None if valid(v) else f"a comma-separated list of {', '.join(choices)}"


def takes_infinity(rule: Rule) -> Rule:
    """rule, for a float setting where inf means something (no limit): the finiteness check lets inf through."""

    def infinite_or(value: Any) -> str | None:
        return None if value == math.inf else rule(value)

    infinite_or.takes_infinity = True  # type: ignore[attr-defined]
    return infinite_or


INT64_MAX = 2**63 - 1


def number_problem(value: Any, rule: Rule | None) -> str | None:
    """What every number must be before its own rule: a float finite (or inf, where the rule takes it), an int within
    int64, where torch, numpy and the checkpoints hold it (seed + rank still fits torch's uint64 seed)."""
    if type(value) is float and not math.isfinite(value):
        infinity = getattr(rule, "takes_infinity", False)
        if not (infinity and value == math.inf):
            return "a finite number, or inf (no limit)" if infinity else "a finite number"
    if type(value) is int and not -INT64_MAX - 1 <= value <= INT64_MAX:
        return "an integer within 64 bits (-2**63 to 2**63 - 1)"
    return None


def shown(value: Any) -> str:
    """repr(value) for an error line: an integer too long to read by its size (Python refuses to print one of more
    than 4,300 digits), a long text cut, an object that is not a plain value by its type (its repr is its code's)."""
    if type(value) is int and value.bit_length() > 128:
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1:,} digits"
    if type(value) in (bool, int, float):
        return repr(value)
    if type(value) is str:
        return repr(value) if len(value) <= 80 else repr(value[:80]) + f"... ({len(value):,} characters)"
    kind = type(value)
    return f"a {kind.__qualname__ if kind.__module__ == 'builtins' else f'{kind.__module__}.{kind.__qualname__}'}"


NAME_MAX, PATH_MAX = 255, 4096  # bytes: a name in a path, a whole path (Linux's and most file systems' limits)


def path_rule(rule: Rule) -> Rule:
    """Mark rule as one of a setting that names a file or folder: expand_home expands a leading ~ in such a one."""
    rule.is_path = True  # type: ignore[attr-defined]
    return rule


def expand_home(settings: dict[str, Any], rules: dict[str, Rule]) -> dict[str, Any]:
    """settings with a leading ~ expanded (os.path.expanduser) in each path setting (its rule made by path_rule):
    the shell expands ~ only at the start of a word, so --out_dir=~/x reaches a script as the text '~/x'."""
    return {
        k: os.path.expanduser(v) if getattr(rules.get(k), "is_path", False) and type(v) is str else v
        for k, v in settings.items()
    }


def path_problem(value: str) -> str | None:
    """What keeps the OS from taking value as a path (what would be valid, for a rule), or None: empty, a NUL
    character, a ~ that no shell expanded, a name or the whole path too long, a part of its folders a file."""
    if problem := name_problem(value):
        return problem
    parent = next((p for p in Path(os.path.abspath(value)).parents if os.path.lexists(p)), None)
    if parent is not None and not os.path.isdir(parent):
        return f"a path in folders ({parent} is a file)"
    return None


def name_problem(value: str) -> str | None:
    """path_problem's checks of the text alone."""
    if not value:
        return "a path"
    if "\0" in value:
        return "a path without a NUL character"
    if value.startswith("~"):
        home = os.path.expanduser(value)
        instead = f": {home}" if home != value else ""
        return f"a path without a leading ~ (no shell expands it inside a flag; write it out{instead})"
    encoded = os.fsencode(value)
    if len(encoded) >= PATH_MAX:
        return f"a path of less than {PATH_MAX:,} bytes (this one has {len(encoded):,})"
    if long := next((name for name in encoded.split(b"/") if len(name) > NAME_MAX), None):
        return f"a path whose every name has at most {NAME_MAX} bytes (one has {len(long):,})"
    return None


@path_rule
def a_path(value: str) -> str | None:
    return path_problem(value)


@path_rule
def optional_path(value: str) -> str | None:
    """'' (none) or a path."""
    return None if value == "" else (problem := path_problem(value)) and f"'' or {problem}"


def writable(folder: str) -> bool:
    return os.access(folder, os.W_OK | os.X_OK)


@path_rule
def output_folder(value: str) -> str | None:
    """A folder to write into: a path that is no file, whose nearest existing folder this user may write."""
    if problem := path_problem(value):
        return problem
    if os.path.lexists(value) and not os.path.isdir(value):
        return "a folder (this is a file)"
    nearest = next(p for p in (value, *map(str, Path(os.path.abspath(value)).parents)) if os.path.exists(p))
    return None if writable(nearest) else f"a folder that you may write ({nearest} is not writable)"


def output_file(suffix: str, optional: bool = True) -> Rule:
    """For a setting that names a file to write: '' where optional (none), or a path
    ending in suffix that is no folder, in a folder that exists or can be made, and that this user may write."""
    what = ("'' or " if optional else "") + f"a {suffix} file"

    def rule(value: str) -> str | None:
        path = Path(value)
        if optional and value == "":
            return None
        if "\0" in value:
            return f"{what} (no NUL character)"
        if path.suffix.lower() != suffix:
            return what
        if os.path.isdir(value) or value.endswith(("/", os.sep)):
            return f"{what} (a file, not a folder)"
        if problem := name_problem(value):
            return f"{what}, {problem}"
        folder = next(p for p in path.absolute().parents if os.path.exists(p))  # "/" at least
        if not os.path.isdir(folder):
            return f"{what} in a folder ({folder} is a file)"
        if not writable(str(folder)) or (os.path.exists(value) and not os.access(value, os.W_OK)):
            return f"{what} that you may write ({path if os.path.exists(value) else folder} is not writable)"
        return None

    return path_rule(rule)


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
        rule = rules.get(name)
        valid = number_problem(value, rule) or (rule(value) if rule else None)
        if valid is not None:
            return f"{name} must be {valid}, not {shown(value)}"
    return next((problem for rule in cross if (problem := rule(settings))), None)


def init_from_one_of(*choices: str) -> Rule:
    """choices (e.g. 'scratch', 'resume' and GPT-2's hub names) or an existing folder in transformers' format."""
    folder = lambda v: path_problem(v) is None and os.path.isdir(v)  # Path('') is the current folder

    def choice_or_folder(value: str) -> str | None:
        return None if value in choices or folder(value) else f"{', '.join(choices)} or a transformers folder"

    choice_or_folder.choices = (*choices, "a transformers folder")  # type: ignore[attr-defined] (for --help)
    return path_rule(choice_or_folder)


def convert(key: str, value: Any, default: Any, words: tuple[str, ...] = ()) -> Any:
    """value as the type of default (or one of the words the setting also takes, e.g. 'auto'), or UserError if
    that would lose or invent information. Only plain bool, int, float and str values are taken: a config file's
    object of another type (a subclass too) is refused rather than asked what it is."""
    kind, given = type(default), type(value)
    if given is str and value in words:
        return value
    if kind is bool and given in (bool, int) and value in (0, 1):  # True, False, 1, 0
        return bool(value)
    if kind is int and given is int:
        return value
    if kind is int and given is float and value.is_integer():  # 1e5
        return int(value)
    if kind is float and given in (int, float):
        try:
            return float(value)
        except OverflowError:  # an int past float's range (about 1.8e308)
            raise UserError(f"{key} must be a float (at most about 1.8e308), got {shown(value)}") from None
    if kind is str and given is str:
        return value
    also = "".join(f" or {w!r}" for w in words)
    raise UserError(f"{key} must be {kind.__name__}{also} (default {default!r}), got {shown(value)}")
