"""Settings from config files and --key=value flags, in the order given:

    python train.py config/train_shakespeare_char.py --batch_size=32 --compile=false

A value converts only where that loses nothing (1e5 -> 100000 for an int, false -> False); every
mistake is one error line. This module imports no torch: the data preparers' worker processes import
it.
"""

import ast
import contextlib
import decimal
import difflib
import os
import sys
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

from nanogpt_perf.config import Config, build, convert, declared, flat_defaults
from nanogpt_perf.errors import UserError, first_line, report_errors, shown

BOOL_WORDS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


def parse_flag(raw: str, default: Any) -> Any:
    """The value a flag's text stands for: the text itself for a str setting, else a boolean word, a
    number read exactly as the setting's type (1e5 and 9007199254740993.0 as an int, inf as a float)
    or a Python literal."""
    if isinstance(default, str):
        return raw
    if isinstance(default, bool) and raw.lower() in BOOL_WORDS:
        return BOOL_WORDS[raw.lower()]
    # no decimal number ('0x10'): a Python literal, below
    with contextlib.suppress(ValueError, ArithmeticError):
        if type(default) is float:
            return float(raw)
        # exactly or not at all: 0.99999999999999999 is no int; 1e999999999 is never built
        if type(default) is int:
            exact = decimal.Decimal(raw)
            whole = (
                exact.is_finite() and exact == exact.to_integral_value() and exact.adjusted() < 4300
            )
            return int(exact) if whole else raw
    try:
        return ast.literal_eval(raw)
    except Exception:  # not a literal: the text, which convert refuses with the setting's type
        return raw


def unknown_key(key: str, known: Iterable[str], where: str, file: bool = False) -> UserError:
    close = difflib.get_close_matches(key, list(known), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else "; --help lists the settings"
    hint += " (a config file's own names start with _)" if file and not close else ""
    return UserError(f"unknown setting {shown(key)} in {where}{hint}")


def read_config_file(path: str, settings: Iterable[str] = ()) -> dict[str, Any]:
    """What a Python config file leaves bound once it has run, as nanoGPT's exec of it: however it
    binds a name (=, +=, for, with, globals()[...], exec, a function's global). Not its helpers,
    unless they bind one of settings: names starting with _, modules, functions, classes and what
    its imports bind (from math import pi). Whatever it raises, SystemExit and KeyboardInterrupt
    included, is a UserError naming the file and the line."""
    file = Path(path)
    try:
        if not file.is_file():
            raise UserError(
                f"config file {path} {'is not a file' if file.exists() else 'not found'}"
            )
        tree = ast.parse(file.read_bytes(), path)
        code = compile(tree, path, "exec")
    except SyntaxError as e:
        raise UserError(
            f"config file {path}{f', line {e.lineno}' if e.lineno else ''}: SyntaxError: {e.msg}"
        ) from None
    # unreadable; NUL bytes; nested past the parser
    except (OSError, ValueError, RecursionError, MemoryError) as e:
        raise UserError(
            f"config file {path} cannot be read as Python: {type(e).__name__}: {e}"
        ) from None
    namespace: dict[Any, Any] = {}
    settings = set(settings)
    try:
        exec(code, namespace)
    # a broken config file is the user's to fix: say where, not a traceback
    except BaseException as e:
        raise UserError(config_file_failure(path, e, settings)) from None
    bound, imported = {}, imported_names(tree)
    for name, value in list(namespace.items()):
        if type(name) is not str:
            what = f"binds {shown(name)} in its globals(), which is no name"
            raise UserError(f"config file {path} {what}")
        module = issubclass(type(value), ModuleType)  # type(): an object's own __class__ may raise
        helper = name.startswith("_") or name in imported or module or callable(value)
        if name in settings or not helper:
            bound[name] = value
    return bound


def imported_names(tree: ast.AST) -> set[str]:
    """The names a config file's imports bind (a star's: every name its module holds)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names |= {alias.asname or alias.name.partition(".")[0] for alias in node.names}
            if node.names[0].name == "*":  # from a module (node.module) only
                module = sys.modules.get(node.module or "")
                names |= set(vars(module)) if issubclass(type(module), ModuleType) else set()
    return names


def config_file_failure(path: str, error: BaseException, settings: set[str]) -> str:
    """The error line for what a config file raised: the last of its lines the traceback passes
    through, and what."""
    lines = [
        n for frame, n in traceback.walk_tb(error.__traceback__) if frame.f_code.co_filename == path
    ]
    where = f"config file {path}" + (f", line {lines[-1]}" if lines else "")
    if isinstance(error, SystemExit):
        return (
            f"{where}: it exits (sys.exit({shown(error.code)})); a config file only sets settings"
        )
    if isinstance(error, KeyboardInterrupt):
        return f"{where}: interrupted (KeyboardInterrupt) while it ran"
    text = first_line(error)[:200]
    if isinstance(error, NameError) and getattr(error, "name", None) in settings:  # max_iters += 1
        text += "; a config file starts with no setting bound: assign it before it is read"
    return f"{where}: {type(error).__name__}" + (f": {text}" if text else "")


def read_overrides(
    known: dict[str, Any], words: dict[str, tuple], argv: list[str]
) -> dict[str, Any]:
    """What argv's config files and --key=value flags set, in order (a later one wins), each value
    converted."""
    given: dict[str, Any] = {}
    for arg in argv:
        if not arg.startswith("--"):
            pairs, where = read_config_file(arg, known), arg
        elif "=" in arg:
            key, _, raw = arg[2:].partition("=")  # the value may itself contain '='
            pairs, where = {key: parse_flag(raw, known.get(key))}, "flags"
        elif arg[2:] not in known:
            raise unknown_key(arg[2:], known, "flags")
        else:
            raise UserError(f"flag {arg!r} has no value; write --{arg[2:]}=VALUE")
        for key, value in pairs.items():
            if key not in known:
                raise unknown_key(key, known, where, file=where != "flags")
            given[key] = convert(key, value, known[key], words.get(key, ()))
    return given


def configure(
    argv: list[str] | None = None,
    cross: Iterable[Callable[[Config], None]] = (),
    defaults: dict[str, Any] | None = None,
    usage: str = "[config_file.py ...] [--key=value ...]",
    **parts: type,
) -> Config:
    """The Config of the parts (name=dataclass: train=TrainConfig, model=GPTConfig, ...; their
    settings by nanoGPT's flat names) after sys.argv's (or argv's) config files (read_config_file)
    and flags, each value checked against its declaration, then the rules between settings (cross).
    defaults: this script's own defaults for some settings. --help prints usage (what the script's
    name takes), every setting and exits (--help --markdown: as tables). Prints the settings once
    (rank 0)."""
    # this script's one handler: a UserError is one line, 'error: ...', and exit status 1
    report_errors()
    argv = sys.argv[1:] if argv is None else argv
    known = flat_defaults(parts, defaults)
    if "-h" in argv or "--help" in argv:
        print_help(parts, known, usage, markdown="--markdown" in argv)
    meta = {k: f.metadata for p in parts.values() for k, f in declared(p).items()}
    given = read_overrides(known, {k: m.get("words", ()) for k, m in meta.items()}, argv)
    values = known | given
    # a path's leading ~, which no shell expands inside a flag (--out_dir=~/x)
    for k, m in meta.items():
        if getattr(m.get("check"), "is_path", False) and type(values[k]) is str:
            with contextlib.suppress(ValueError):  # a NUL in it, which the path's check refuses
                values[k] = os.path.expanduser(values[k])
    cfg = build(parts, values, given, tuple(cross), known)
    if os.environ.get("RANK", "0") == "0":
        print("settings: " + ", ".join(f"{k}={v!r}" for k, v in cfg.as_dict().items()))
        if changed := {k: v for k, v in cfg.as_dict().items() if v != known[k]}:
            print("overridden: " + ", ".join(f"{k}={v!r}" for k, v in changed.items()))
    return cfg


def print_help(parts: dict[str, type], known: dict[str, Any], usage: str, markdown: bool) -> None:
    """Print every setting part by part, as Markdown tables for docs/ where asked, and exit 0:
    quietly where the reader stops early (python train.py --help | head -1)."""
    lines = [] if markdown else [f"usage: python {Path(sys.argv[0]).name} {usage}"]
    width = max(map(len, known))
    for part in parts.values():
        doc = part.__doc__ or ""
        doc = "" if doc.startswith(part.__name__ + "(") else " ".join(doc.split("\n\n")[0].split())
        where = "" if part.__module__ == "__main__" else f" ({part.__module__}.{part.__name__})"
        title = f"{doc or part.__name__}{where}"
        head = [
            f"### {title}",
            "",
            "| setting | type | default | meaning |",
            "| --- | --- | --- | --- |",
        ]
        lines += ["", *head] if markdown else ["", title + ":"]
        for key, f in declared(part).items():
            text, kind, default = f.metadata["help"], type(known[key]).__name__, repr(known[key])
            if choices := f.metadata.get("choices") or getattr(
                f.metadata.get("check"), "choices", ()
            ):
                text = f"{text} (one of {', '.join(choices)})".strip()
            text += bounds_text(f.metadata)
            plain = f"  --{key:<{width}} {kind:<5} default {default:<10} {text}".rstrip()
            lines.append(f"| `{key}` | {kind} | `{default}` | {text} |" if markdown else plain)
    try:
        print("\n".join(lines[1:] if markdown else lines), flush=True)
    except OSError as e:  # a closed pipe: quietly; a full disk: one line
        # the exit's flush must not fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        if not isinstance(e, BrokenPipeError):
            raise UserError(f"cannot print the help: {e.strerror}") from None
    sys.exit(0)


def bounds_text(meta: dict[str, Any]) -> str:
    """A setting's bounds as --help says them: ' [>= 1 (0 = off)]', or '' where it has none."""
    said = {
        k: f"{v:,}" if type(v) is int else repr(v)
        for k, v in meta.items()
        if k in ("min", "above", "max")
    }
    bounds = [
        f"{op} {said[k]}" for k, op in (("min", ">="), ("above", ">"), ("max", "<=")) if k in said
    ]
    bounds += [f"in {meta['interval']}"] if "interval" in meta else []
    return f" [{', '.join(bounds)}{meta.get('note', '')}]" if bounds else ""


def sweep_values(cfg: Config, text: str, fixed: Iterable[str] = ()) -> tuple[str, list[Any]]:
    """A sweep, 'KEY=V1,V2,...', over any setting of cfg but those fixed: the setting's name and its
    values, each read, converted and checked as --KEY=V would be."""
    key, sep, raw = text.partition("=")
    values = [v.strip() for v in raw.split(",") if v.strip()]
    if not sep or not values:
        raise UserError(f"sweep must be KEY=V1,V2,... (e.g. batch_size=1,2,4), not {shown(text)}")
    if key not in cfg:
        raise unknown_key(key, cfg.as_dict(), "sweep")
    if key in fixed:
        raise UserError(f"cannot sweep {key}: it says how this script runs, not what it measures")
    default, words = cfg.defaults[key], cfg.metadata(key).get("words", ())
    converted = [convert(key, parse_flag(v, default), default, words) for v in values]
    for value in converted:
        cfg.replace(**{key: value})  # each checked with the others as they are
    return key, converted
