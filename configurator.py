"""
Overrides a script's module-level settings from config files and --key=value flags, in the order given:

    python train.py config/train_shakespeare_char.py --batch_size=32 --compile=false

A setting is any module-level name of type bool, int, float or str defined before `configure(globals())`.
A config file is Python: its top-level assignments are overrides (imports and helpers in it are ignored).
Unknown keys are errors that suggest the closest known key; values convert to the setting's type only where
that loses nothing (1e5 -> 100000 for an int, 1 -> 1.0 for a float, false -> False for a bool). The final values
are then checked against the rules the script gives (nanogpt_perf/rules.py): every float finite (inf only where a
rule takes it: --tolerance_pct=inf), every int within 64 bits, then each setting's own range. Every mistake is one
error line, a config file that raises or exits included.
"""

import ast
import difflib
import importlib.util
import io
import os
import sys
import tokenize
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from nanogpt_perf.errors import UserError, report_errors
from nanogpt_perf.rules import CrossRule, Rule, settings_problem, shown, unruled

SETTING_TYPES = (bool, int, float, str)


def settings_of(namespace: dict[str, Any]) -> dict[str, Any]:
    """The settings in a module namespace: public names bound to a bool, int, float or str (UPPER_CASE names are
    constants, not settings)."""
    return {
        k: v for k, v in namespace.items() if not k.startswith("_") and not k.isupper() and type(v) in SETTING_TYPES
    }


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


BOOL_WORDS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


def parse_flag(raw: str, default: Any) -> Any:
    """The typed value of a flag's text: as is for a str setting, else a Python literal or a boolean word."""
    if isinstance(default, str):
        return raw
    if isinstance(default, bool) and raw.lower() in BOOL_WORDS:
        return BOOL_WORDS[raw.lower()]
    if isinstance(default, float) and raw.strip().lower().lstrip("+-") in ("inf", "infinity", "nan"):
        return float(raw)  # Python's literals have no name for these; the rules say where they are valid
    try:
        return ast.literal_eval(raw)
    except Exception:  # not a literal (or one too long or too deep to read): the text, refused by convert
        return raw


def unknown_key(key: str, known: dict[str, Any], where: str) -> UserError:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else "; --help lists the settings"
    return UserError(f"unknown setting {key!r} in {where}{hint}")


def read_config_file(path: str) -> dict[str, Any]:
    """The top-level assignments of a Python config file. Whatever it raises, SystemExit and KeyboardInterrupt
    included, is a UserError naming the file and the line of it that raised."""
    if not Path(path).is_file():
        raise UserError(f"config file {path} not found")
    try:
        code = compile(Path(path).read_bytes(), path, "exec")
    except SyntaxError as e:
        where = f"config file {path}" + (f", line {e.lineno}" if e.lineno else "")
        raise UserError(f"{where}: {type(e).__name__}: {e.msg}") from None
    except (OSError, ValueError) as e:  # unreadable; NUL bytes in it
        raise UserError(f"config file {path} cannot be read as Python: {type(e).__name__}: {e}") from None
    namespace: dict[str, Any] = {}
    try:
        exec(code, namespace)
    except BaseException as e:  # a broken config file is the user's to fix: say where, not a traceback
        raise UserError(config_file_failure(path, e)) from None
    return {
        k: v
        for k, v in namespace.items()
        if not k.startswith("_")
        and not isinstance(v, (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type))
    }


def config_file_failure(path: str, error: BaseException) -> str:
    """The error line for what a config file raised: where in the file (the last of its lines the traceback
    passes through) and what."""
    line, tb = None, error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == path:
            line = tb.tb_lineno
        tb = tb.tb_next
    where = f"config file {path}" + (f", line {line}" if line else "")
    if isinstance(error, SystemExit):
        return f"{where}: it exits (sys.exit({shown(error.code)})); a config file only sets settings"
    if isinstance(error, KeyboardInterrupt):
        return f"{where}: interrupted (KeyboardInterrupt) while it ran"
    try:
        text = (str(error).strip().splitlines() or [""])[0]
    except Exception:  # an exception whose message itself fails
        text = "(its message cannot be shown)"
    return f"{where}: {type(error).__name__}" + (f": {text[:200]}" if text else "")


def read_overrides(
    defaults: dict[str, Any], argv: list[str], words: dict[str, tuple[str, ...]] | None = None
) -> dict[str, Any]:
    """What the config files and --key=value flags in argv set, in order (a later one wins), each value converted
    to its setting's type; words: the words a setting takes besides values of its type."""
    given: dict[str, Any] = {}
    words = words or {}
    for arg in argv:
        if arg.startswith("--"):
            key, sep, raw = arg[2:].partition("=")  # the value may itself contain '='
            if not sep:
                raise UserError(f"flag {arg!r} has no value; write --{key}=VALUE")
            if key not in defaults:
                raise unknown_key(key, defaults, "flags")
            given[key] = convert(key, parse_flag(raw, defaults[key]), defaults[key], words.get(key, ()))
        else:
            for key, value in read_config_file(arg).items():
                if key not in defaults:
                    raise unknown_key(key, defaults, arg)
                given[key] = convert(key, value, defaults[key], words.get(key, ()))
    return given


def apply_overrides(
    defaults: dict[str, Any], argv: list[str], words: dict[str, tuple[str, ...]] | None = None
) -> dict[str, Any]:
    """Settings after applying config files and --key=value flags in argv, in order."""
    return defaults | read_overrides(defaults, argv, words)


def described_assignments(path: Path) -> dict[str, str]:
    """Each top-level `name = value` of a Python file, with the comment at the end of its line (a setting's
    description; '' where there is none)."""
    source = path.read_text()
    comments = {
        tok.start[0]: tok.string.lstrip("#").strip()
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    }
    return {
        target.id: comments.get(node.end_lineno, "")
        for node in ast.parse(source).body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def imported_modules(script: Path) -> list[Path]:
    """The files of the modules a script imports names from (`from module import ...`) that can be found."""
    paths = []
    for node in ast.parse(script.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            spec = importlib.util.find_spec(node.module)
            if spec is not None and spec.origin and spec.origin.endswith(".py"):
                paths.append(Path(spec.origin))
    return paths


def help_text(script: Path, defaults: dict[str, Any]) -> str:
    """Every setting with its type, default and description: the script's own, then those it imports from a
    module of shared settings, listed the same way by every script that imports them."""
    own = described_assignments(script)
    sections = {f"settings of {script.name}:": {k: own[k] for k in defaults if k in own}}
    for module in imported_modules(script):
        shared = described_assignments(module)
        docs = {k: doc for k, doc in shared.items() if k in defaults and k not in own}
        if docs:
            sections[f"shared settings, defined in {module.parent.name}/{module.name}:"] = docs
    width = max(map(len, defaults))
    lines = [f"usage: python {script.name} [config_file.py ...] [--key=value ...]"]
    for title, docs in sections.items():
        lines += ["", title]
        for k, doc in docs.items():
            lines.append(f"  --{k:<{width}} {type(defaults[k]).__name__:<5} default {defaults[k]!r:<10} {doc}".rstrip())
    return "\n".join(lines)


def configure(
    namespace: dict[str, Any],
    argv: list[str] | None = None,
    rules: dict[str, Rule] | None = None,
    cross: Iterable[CrossRule] = (),
    words: dict[str, tuple[str, ...]] | None = None,
) -> dict[str, Any]:
    """Apply sys.argv's config files and flags to the settings in namespace (a script's globals()), check them
    against rules (each int or float setting must have one) and the rules between settings, cross, and return
    them all; words: the words a setting takes besides values of its type (e.g. {'batch_size': ('auto',)}).
    Prints --help or one error line and exits; prints the resolved settings once (on rank 0 under torchrun)."""
    return configure_command(namespace, argv, rules, cross, words)[0]


def configure_command(
    namespace: dict[str, Any],
    argv: list[str] | None = None,
    rules: dict[str, Rule] | None = None,
    cross: Iterable[CrossRule] = (),
    words: dict[str, tuple[str, ...]] | None = None,
) -> tuple[dict[str, Any], set[str]]:
    """configure, and the settings this command's config files and flags gave (whatever their values)."""
    report_errors()  # this script's one handler: a UserError is one line, 'error: ...', and exit status 1
    argv = sys.argv[1:] if argv is None else argv
    defaults, rules = settings_of(namespace), rules or {}
    if missing := unruled(defaults, defaults, rules):
        raise TypeError(f"no rule for the setting(s) {', '.join(missing)}: add one to configure()'s rules")
    if "-h" in argv or "--help" in argv:
        print(help_text(Path(namespace.get("__file__", sys.argv[0])), defaults))
        sys.exit(0)
    given = read_overrides(defaults, argv, words)
    settings = defaults | given
    # a resumed run's base is its checkpoint's settings, not these defaults: the script checks the rules between
    # settings once it has merged them
    problem = settings_problem(settings, rules, cross if settings.get("init_from") != "resume" else ())
    if problem:
        raise UserError(problem)
    namespace.update(settings)
    if os.environ.get("RANK", "0") == "0":
        print("settings: " + ", ".join(f"{k}={v!r}" for k, v in settings.items()))
        if changed := {k: v for k, v in settings.items() if v != defaults[k]}:
            print("overridden: " + ", ".join(f"{k}={v!r}" for k, v in changed.items()))
    return settings, set(given)
