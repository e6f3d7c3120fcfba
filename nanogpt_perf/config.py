"""Settings declared as dataclass fields beside the code that uses them (setting()), checked once,
and held as a Config: each part's typed object and every setting by its flat name. configurator.py
reads a command line into one; this module imports no torch (the data preparers' worker processes
import it)."""

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

from nanogpt_perf.errors import UserError, shown

# above it, not every integer is a float: an int setting takes no float beyond it
EXACT_FLOAT = 2**53
RULES = ("min", "max", "above", "interval", "note", "choices", "words", "check", "inf")


def setting(default: Any, help: str, **valid: Any) -> Any:
    """A dataclass field declaring a setting: its default, its help and what is valid: min (>=), max
    (<=), above (>), interval ('[0, 1)'), note (said after the bound: ' (0 = off)'), choices, words
    it takes beside values of its type ('auto'), check (raises ValueError saying what is valid; a
    path's: nanogpt_perf/guard/paths.py), inf (takes float('inf'))."""
    if unknown := set(valid) - set(RULES):
        raise TypeError(f"setting() takes no {', '.join(sorted(unknown))}")
    meta = dict(help=help, note="", inf=False, choices=(), words=()) | valid
    return dataclasses.field(default=default, metadata=meta)


def declared(part: type) -> dict[str, dataclasses.Field]:
    """A part's settings: its dataclass fields that have a help (a field without one, GPTConfig's
    vocab_size, is set by the code, not by the user)."""
    return {f.name: f for f in dataclasses.fields(part) if f.metadata.get("help")}


def convert(key: str, value: Any, default: Any, words: tuple[str, ...] = ()) -> Any:
    """value as the type of default (or one of the setting's words), or a UserError where that would
    lose or invent information. Only plain bool, int, float and str are taken (a subclass of one is
    refused, not asked)."""
    kind, given = type(default), type(value)
    if given is kind or (given is str and value in words):
        return value
    if kind is bool and given is int and value in (0, 1):
        return bool(value)
    if kind is int and given is float and value.is_integer() and abs(value) < EXACT_FLOAT:  # 1e5
        return int(value)
    if kind is float and given is int:
        try:
            return float(value)
        except OverflowError:
            raise UserError(
                f"{key} must be a float (at most about 1.8e308), got {shown(value)}"
            ) from None
    also = "".join(f" or {w!r}" for w in words)
    raise UserError(
        f"{key} must be {kind.__name__}{also} (default {default!r}), got {shown(value)}"
    )


def check_value(value: Any, meta: dict[str, Any]) -> None:
    """Raises ValueError(what a setting's value must be: '>= 1', 'one of a, b') where value is not
    valid; the setting's words ('auto') are valid too, and said before its bounds."""
    words, inf, note = meta.get("words", ()), meta.get("inf", False), meta.get("note", "")

    def must(holds: bool, valid: str) -> None:
        if not holds:
            raise ValueError(" or ".join([*map(repr, words), valid]))

    if value in words:
        return
    if type(value) is float and not math.isfinite(value):
        must(
            inf and value == math.inf,
            "a finite number, or inf (no limit)" if inf else "a finite number",
        )
    if type(value) is int:
        must(-(2**63) <= value < 2**63, "an integer within 64 bits (-2**63 to 2**63 - 1)")
    if choices := meta.get("choices"):
        must(value in choices, f"one of {', '.join(choices)}")
    if value != math.inf:  # inf passes every bound where a setting takes it
        low, above, high = meta.get("min"), meta.get("above"), meta.get("max")
        must(low is None or value >= low, f">= {low}{note}")
        must(above is None or value > above, f"> {above}{note}")
        must(high is None or value <= high, f"<= {high}")
        if interval := meta.get("interval"):
            a, b = (float(x) for x in interval[1:-1].split(","))
            above_a = value > a if interval[0] == "(" else value >= a
            must(above_a and (value < b if interval[-1] == ")" else value <= b), f"in {interval}")
    if check := meta.get("check"):
        check(value)  # its ValueError says what is valid


class Config:
    """What configure() returns: each part's typed object by its name (cfg.model, a GPTConfig) and
    every setting by its flat name (cfg.learning_rate); given: the settings the command's config
    files and flags set; defaults: every setting's default as the script declares it; cross: the
    rules between settings it was checked with."""

    def __init__(
        self, parts: dict[str, Any], given: Iterable[str], cross: tuple, defaults: dict[str, Any]
    ):
        owner = {k: part for part in parts.values() for k in declared(type(part))}
        self.__dict__.update(
            _parts=parts,
            _owner=owner,
            given=frozenset(given),
            cross=tuple(cross),
            defaults=defaults,
        )

    def __getattr__(self, name: str) -> Any:
        # none yet: copy, pickle
        parts, owner = self.__dict__.get("_parts", {}), self.__dict__.get("_owner", {})
        if name in parts:
            return parts[name]
        if name in owner:
            return getattr(owner[name], name)
        raise AttributeError(f"no setting {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("settings are read-only: cfg.replace(name=value) makes a changed copy")

    def __contains__(self, name: str) -> bool:
        return name in self._owner

    def as_dict(self) -> dict[str, Any]:
        """Every setting by its flat name, as checkpoints, manifests and logs record them."""
        return {k: getattr(part, k) for k, part in self._owner.items()}

    def metadata(self, name: str) -> dict[str, Any]:
        """A setting's declaration: its help and what is valid."""
        return dict(declared(type(self._owner[name]))[name].metadata)

    def replace(self, cross: tuple | None = None, **changes: Any) -> "Config":
        """This config with some settings changed, checked as build checks them (cross: else this
        config's rules)."""
        if unknown := set(changes) - set(self._owner):
            raise TypeError(f"no setting {', '.join(sorted(unknown))}")
        types = {name: type(part) for name, part in self._parts.items()}
        cross = self.cross if cross is None else cross
        return build(types, self.as_dict() | changes, self.given, cross, self.defaults)


def build(
    parts: dict[str, type],
    values: dict[str, Any],
    given: Iterable[str] = (),
    cross: tuple = (),
    defaults: dict | None = None,
) -> Config:
    """The Config of values (every setting of the parts by its flat name), each checked against its
    declaration, each part's own checks run (its __post_init__'s ValueError), then the rules between
    settings (cross: each raises ValueError with the whole line): the first mistake is a
    UserError."""
    meta = {k: f.metadata for part in parts.values() for k, f in declared(part).items()}
    for name, value in values.items():
        try:
            check_value(value, meta[name])
        except ValueError as e:
            raise UserError(f"{name} must be {e}, not {shown(value)}") from None
    try:
        made = {k: part(**{f: values[f] for f in declared(part)}) for k, part in parts.items()}
        cfg = Config(made, given, cross, flat_defaults(parts, defaults))
        for rule in cross:
            rule(cfg)
    except ValueError as e:
        raise UserError(str(e)) from None
    return cfg


def flat_defaults(
    parts: dict[str, type], overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Every setting of the parts by its flat name and default (a script's overrides of a part's
    defaults win). A name declared by two parts, or one that would hide a part or Config's own, is a
    mistake of the code's."""
    found: dict[str, Any] = {}
    for part in parts.values():
        for name, f in declared(part).items():
            if name in found:
                raise TypeError(
                    f"the setting {name} is declared twice ({part.__name__} and another part)"
                )
            found[name] = f.default
    if clash := (set(found) | set(parts)) & {"given", "cross", "defaults", *dir(Config)} | set(
        found
    ) & set(parts):
        raise TypeError(
            f"a setting or part named {', '.join(sorted(clash))} would hide Config's or another's"
        )
    return found | (overrides or {})
