"""The settings tables of README.md and docs/*.md, written from the scripts' declarations (what
`python SCRIPT --help --markdown` prints), between the markers

    <!-- settings of SCRIPT: written by scripts/docs_tables.py -->
    <!-- end of settings of SCRIPT -->

    python scripts/docs_tables.py           # rewrite each table that differs from its declarations
    python scripts/docs_tables.py --check   # exit 1, naming each doc and script that differs
"""

import contextlib
import io
import re
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from nanogpt_perf.errors import UserError, report_errors  # noqa: E402
from nanogpt_perf.files import write_text  # noqa: E402

BLOCK = re.compile(
    r"(<!-- settings of (?P<script>\S+): written by scripts/docs_tables.py -->\n)(?P<table>.*?)"
    r"(<!-- end of settings of (?P=script) -->)",
    re.DOTALL,
)


def docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def help_markdown(script: str) -> str:
    """What `python SCRIPT --help --markdown` prints, run in this process (torch imported once for
    every table)."""
    if not (ROOT / script).is_file():
        raise UserError(f"a settings table names {script}, which is not a script of this checkout")
    out, argv = io.StringIO(), sys.argv
    sys.argv = [str(ROOT / script), "--help", "--markdown"]
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            runpy.run_path(str(ROOT / script), run_name="__main__")
    finally:
        sys.argv = argv
    return out.getvalue().strip() + "\n"


def written(text: str, tables: dict[str, str]) -> str:
    """text with each marked table replaced by its script's (tables caches them by script)."""

    def table(block: re.Match) -> str:
        script = block["script"]
        if script not in tables:
            tables[script] = help_markdown(script)
        return f"{block[1]}\n{tables[script]}\n{block[4]}"

    return BLOCK.sub(table, text)


def stale(tables: dict[str, str] | None = None) -> list[str]:
    """'DOC (SCRIPT, ...)' for each doc whose tables differ from the declarations."""
    tables = {} if tables is None else tables
    found = []
    for doc in docs():
        text = doc.read_text(encoding="utf-8")
        if written(text, tables) != text:
            scripts = sorted({m["script"] for m in BLOCK.finditer(text)})
            found.append(f"{doc.relative_to(ROOT)} ({', '.join(scripts)})")
    return found


def main(argv: list[str]) -> None:
    if argv in (["-h"], ["--help"]):
        print(__doc__.strip())
        return
    if argv not in ([], ["--check"]):
        raise UserError(
            f"unknown arguments {' '.join(argv)!r}: none (rewrite the tables) or --check"
        )
    tables: dict[str, str] = {}
    if argv == ["--check"]:
        if found := stale(tables):
            raise UserError(f"settings tables differ from the declarations in {'; '.join(found)}: "
                            "run python scripts/docs_tables.py")  # fmt: skip
        print(f"every settings table is as declared ({len(tables)} scripts)")
        return
    for doc in docs():
        text = doc.read_text(encoding="utf-8")
        if (new := written(text, tables)) != text:
            write_text(doc, new)
            print(f"wrote {doc.relative_to(ROOT)}")


if __name__ == "__main__":
    report_errors()
    main(sys.argv[1:])
