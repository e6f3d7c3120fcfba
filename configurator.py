"""
Overrides a script's module-level settings from config files and --key=value flags, in the order given:

    python train.py config/train_shakespeare_char.py --batch_size=32 --compile=false

A setting is any module-level name of type bool, int, float or str defined before `configure(globals())`, declared
with its rule as its annotation (`eval_iters: at_least(1) = 200  # batches per eval`: name, rule, default, help).
A config file is Python: its top-level assignments are overrides (imports and helpers in it are ignored).
Unknown keys are errors that suggest the closest known key; values convert to the setting's type only where
that loses nothing (1e5 -> 100000 for an int, 1 -> 1.0 for a float, false -> False for a bool). The final values
are then checked against their rules (nanogpt_perf/rules.py): every float finite (inf only where a
rule takes it: --tolerance_pct=inf), every int within 64 bits, then each setting's own range. Every mistake is one
error line, a config file that raises or exits included.
"""

import ast
import difflib
import io
import os
import sys
import tokenize
import types
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

from nanogpt_perf.errors import UserError, report_errors
from nanogpt_perf.rules import CrossRule, Rule, convert, expand_home, settings_problem, shown, unruled

SETTING_TYPES = (bool, int, float, str)


def settings_of(namespace: dict[str, Any]) -> dict[str, Any]:
    """The settings in a module namespace: public names bound to a bool, int, float or str (UPPER_CASE names are
    constants, not settings)."""
    return {
        k: v for k, v in namespace.items() if not k.startswith("_") and not k.isupper() and type(v) in SETTING_TYPES
    }


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
    targets = lambda node: node.targets if isinstance(node, ast.Assign) else [node.target]  # noqa: E731
    return {
        target.id: comments.get(node.end_lineno, "")
        for node in ast.parse(source).body
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None
        for target in targets(node)
        if isinstance(target, ast.Name)
    }


def help_text(script: Path, shared: Path | None, defaults: dict[str, Any], rules: dict[str, Rule]) -> str:
    """Every setting with its type, default and description (and its choices, where its rule has some): the
    script's own, then the shared ones, listed the same way by every script that takes them."""
    own = described_assignments(script)
    sections = {f"settings of {script.name}:": {k: own[k] for k in defaults if k in own}}
    if shared is not None:
        docs = {k: doc for k, doc in described_assignments(shared).items() if k in defaults and k not in own}
        sections[f"shared settings, defined in {shared.parent.name}/{shared.name}:"] = docs
    width = max(map(len, defaults))
    lines = [f"usage: python {script.name} [config_file.py ...] [--key=value ...]"]
    for title, docs in sections.items():
        lines += ["", title]
        for k, doc in docs.items():
            choices = getattr(rules.get(k), "choices", None)
            doc = f"{doc} (one of {', '.join(choices)})".strip() if choices else doc
            lines.append(f"  --{k:<{width}} {type(defaults[k]).__name__:<5} default {defaults[k]!r:<10} {doc}".rstrip())
    return "\n".join(lines)


def rules_of(namespace: dict[str, Any]) -> dict[str, Rule]:
    """The rules a module declares with its settings, as their annotations: `eval_iters: at_least(1) = 200`."""
    annotations = namespace.get("__annotations__", {})
    return {k: rule for k, rule in annotations.items() if callable(rule) and not isinstance(rule, type)}


def declared(
    namespace: dict[str, Any], shared: ModuleType | None = None, rules: dict[str, Rule] | None = None
) -> tuple[dict[str, Any], dict[str, Rule]]:
    """The settings of a script (namespace: its globals) and of the shared module it names, with their defaults,
    and their rules: declared as annotations, or given (rules)."""
    modules = [vars(shared)] if shared else []
    defaults = {k: v for module in (*modules, namespace) for k, v in settings_of(module).items()}
    declared_rules = {k: v for module in (*modules, namespace) for k, v in rules_of(module).items() if k in defaults}
    return defaults, declared_rules | (rules or {})


def configure(
    namespace: dict[str, Any],
    argv: list[str] | None = None,
    rules: dict[str, Rule] | None = None,
    cross: Iterable[CrossRule] = (),
    shared: ModuleType | None = None,
) -> dict[str, Any]:
    """Apply sys.argv's config files and flags to the settings in namespace (a script's globals()) and those of the
    module shared (settings several scripts take: nanogpt_perf/settings.py), check each against its rule (the
    annotation it is declared with, or rules[name]; every int or float setting must have one) and the rules between
    settings, cross, and return them all. A rule's `words` (or_word's 'auto') are taken besides values of the
    setting's type. Prints --help and exits; a mistake is a UserError; prints the resolved settings once (rank 0)."""
    return configure_command(namespace, argv, rules, cross, shared)[0]


def configure_command(
    namespace: dict[str, Any],
    argv: list[str] | None = None,
    rules: dict[str, Rule] | None = None,
    cross: Iterable[CrossRule] = (),
    shared: ModuleType | None = None,
) -> tuple[dict[str, Any], set[str], dict[str, Rule]]:
    """configure, the settings this command's config files and flags gave (whatever their values), and the rules."""
    report_errors()  # this script's one handler: a UserError is one line, 'error: ...', and exit status 1
    argv = sys.argv[1:] if argv is None else argv
    defaults, rules = declared(namespace, shared, rules)
    if missing := unruled(defaults, defaults, rules):
        raise TypeError(f"no rule for the setting(s) {', '.join(missing)}: declare one with each (name: rule = value)")
    if "-h" in argv or "--help" in argv:
        script = Path(namespace.get("__file__", sys.argv[0]))
        print(help_text(script, Path(shared.__file__) if shared else None, defaults, rules))
        sys.exit(0)
    words = {k: rule.words for k, rule in rules.items() if hasattr(rule, "words")}
    given = read_overrides(defaults, argv, words)
    settings = expand_home(defaults | given, rules)  # a path's leading ~, which no shell expands inside a flag
    if problem := settings_problem(settings, rules, cross):
        raise UserError(problem)
    namespace.update(settings)
    if os.environ.get("RANK", "0") == "0":
        print("settings: " + ", ".join(f"{k}={v!r}" for k, v in settings.items()))
        if changed := {k: v for k, v in settings.items() if v != defaults[k]}:
            print("overridden: " + ", ".join(f"{k}={v!r}" for k, v in changed.items()))
    return settings, set(given), rules
