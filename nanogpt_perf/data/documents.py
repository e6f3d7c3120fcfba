"""The documents a web-scale preparation reads, and their tokens: a hub dataset or local
.txt/.jsonl/.json/.parquet files (globs allowed), streamed through `datasets` as one `text` column,
and tokenised with GPT-2's BPE in worker processes, <|endoftext|> before each document (as llm.c
does). See preparation.py for the shards they become."""

import glob
import itertools
import multiprocessing
import os
import shlex
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nanogpt_perf.data.tokenizer import gpt2_encoding
from nanogpt_perf.errors import UserError, first_line
from nanogpt_perf.files import MISSING, file_kind

EOT = 50256  # GPT-2's <|endoftext|>
CHUNK = 128  # documents per task sent to a worker
INPUT_KINDS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}


class CorpusError(UserError):
    """Bad input found while reading the documents (in the pool's feeder thread too): one line for
    the user."""


@dataclass(frozen=True)
class Source:
    """Where the documents come from: a hub dataset (repo, config, revision) or local files."""

    repo: str | None = None
    config: str | None = None
    revision: str | None = None
    files: tuple[Path, ...] = ()
    documents: int | None = None  # the document count when the hub does not say

    def describe(self) -> str:
        if self.repo is None:
            return f"{len(self.files)} local file(s): " + ", ".join(str(p) for p in self.files)
        config, revision = (
            f" ({self.config})" if self.config else "",
            f" at {self.revision}" if self.revision else "",
        )
        return self.repo + config + revision


def local_source(paths: str) -> Source:
    """The comma-separated local files of an --input setting (a glob: its files in name order),
    checked: each must be a file of a known kind with something in it."""
    files: list[Path] = []
    for item in (p.strip() for p in paths.split(",")):
        if item and glob.has_magic(item):
            matches = sorted(
                Path(m)
                for m in glob.glob(os.path.expanduser(item), recursive=True)
                if Path(m).is_file()
            )
            if not matches:
                raise UserError(
                    f"--input {item!r} matches no file: give files or globs that match some"
                )
            files += matches
        elif item:
            files.append(Path(os.path.expanduser(item)))
    if not files:
        raise UserError(
            "--input names no file: give comma-separated .txt, .jsonl, .json or .parquet files (or "
            "globs)"
        )
    for path in files:
        check_input(path)
    return Source(files=tuple(p.resolve() for p in files))


def check_input(path: Path) -> None:
    if path.is_dir():
        example = shlex.quote(f"--input={path / '*.jsonl'}")
        raise UserError(
            f"input {path} is a folder: give its files (.txt, .jsonl, .json, .parquet), e.g. "
            f"{example}"
        )
    if path.suffix.lower() not in INPUT_KINDS:
        raise UserError(
            f"{path}: unknown kind of input {path.suffix or '(no extension)'!r}; use "
            f"{', '.join(INPUT_KINDS)}"
        )
    if (kind := file_kind(path)) != "a file":
        why = "not found" if kind == MISSING else f"is {kind}, not a file"
        raise UserError(f"input file {path} {why}")
    if not os.access(path, os.R_OK):
        raise UserError(f"input file {path} is not readable (permission denied)")
    # an empty text file is one empty document
    if path.stat().st_size == 0 and path.suffix.lower() != ".txt":
        raise UserError(f"input file {path} is empty: no documents")


def default_processes() -> int:
    """Tokenising processes: the CPUs this process may use, at most 16 (the one parent reading the
    documents and writing the shards keeps up with about that many)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cpus, 16))


def hub_revision_sha(source: Source) -> str | None:
    """The commit the hub's revision points to now, to pin it for a resume; None offline or where
    unknown."""
    try:
        from huggingface_hub import HfApi

        return HfApi().dataset_info(source.repo, revision=source.revision).sha
    except Exception:  # no network, no access: stream the revision as named
        return None


# ----------------------------------------------------------------------------- reading documents


def count_documents(source: Source, dataset) -> int | None:
    """The number of documents when it can be known cheaply (for the progress bar): lines of JSONL
    (an estimate: blank lines count), Parquet row counts, one per text file; for the hub, the
    split's size in the dataset info."""
    if source.repo is not None:
        split = (dataset.info.splits or {}).get("train")
        return split.num_examples if split is not None and split.num_examples else source.documents
    import pyarrow.parquet as pq

    total = 0
    for path in source.files:
        kind = path.suffix.lower()
        if kind == ".json":
            return None  # one array or JSON lines: no cheap way to tell
        try:
            total += (
                1
                if kind == ".txt"
                else pq.read_metadata(path).num_rows
                if kind == ".parquet"
                else count_lines(path)
            )
        except Exception:  # not Parquet after all: reading the documents says so, in one line
            return None
    return total


def count_lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 24), b""))


def named(error: Exception) -> str:
    return f"{type(error).__name__}: {first_line(error)}"


def open_documents(source: Source, revision: str | None):
    """The documents as one streaming `datasets.IterableDataset` with a `text` column (local files:
    each run of files of one kind is one `load_dataset`, in the order given)."""
    import logging

    import datasets

    datasets.disable_progress_bars()
    # errors reach the user as one line of ours, not a log
    datasets.logging.set_verbosity(logging.CRITICAL)
    stream = dict(split="train", streaming=True)
    try:
        if source.repo is not None:
            hub = datasets.load_dataset(
                source.repo, name=source.config, revision=revision, **stream
            )
            return text_column(hub, source.repo)
        parts = []
        for kind, group in itertools.groupby(
            source.files, key=lambda p: INPUT_KINDS[p.suffix.lower()]
        ):
            files = [str(p) for p in group]
            # a text file is one document
            options = {"sample_by": "document"} if kind == "text" else {}
            parts.append(
                text_column(
                    datasets.load_dataset(kind, data_files=files, **stream, **options), files[0]
                )
            )
        return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    except CorpusError:
        raise
    except Exception as e:
        raise CorpusError(f"cannot open {source.describe()}: {named(e)}") from e


def text_column(dataset, where: str):
    """Only the `text` column, so that no other column is ever converted to Python."""
    if dataset.features is not None and "text" not in dataset.features:
        raise CorpusError(f"{where}: no 'text' column (columns: {', '.join(dataset.features)})")
    return dataset.select_columns(["text"]) if dataset.features is not None else dataset


def document_chunks(dataset, skip: int, where: str) -> Iterator[list[str]]:
    """Lists of CHUNK documents' texts, after the first `skip` documents; where: the source, for the
    errors."""
    seen = skip
    try:
        for batch in (dataset.skip(skip) if skip else dataset).iter(batch_size=CHUNK):
            if "text" not in batch:
                raise CorpusError(
                    f"the documents have no 'text' field (fields: {', '.join(batch)})"
                )
            texts = batch["text"]
            if (
                bad := next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
            ) is not None:
                text = texts[bad]
                raise CorpusError(
                    f"document {seen + bad + 1:,}'s text is {type(text).__name__} {text!r:.40}, "
                    "not a string "
                    f"(in {where}): each document's 'text' must be a string"
                )
            seen += len(texts)
            yield texts
    except CorpusError:
        raise
    # a malformed file, a lost connection: one line (the hub's: a rerun resumes)
    except Exception as e:
        raise CorpusError(
            f"reading {where} failed after {seen:,} documents: {named(e)}{hint(e)}"
        ) from e


def hint(error: Exception) -> str:
    """What a valid input would be, for the errors that say little of it."""
    if isinstance(error, UnicodeDecodeError):
        return " (a .txt file must be UTF-8 text)"
    if "JSON" in str(error):
        return (
            " (.jsonl: one JSON object with a 'text' string per line; .json: an array of such "
            "objects)"
        )
    return ""


# ----------------------------------------------------------------------------- tokenising

_encoding = None  # each process's own tiktoken encoding, built once


def init_tokenizer() -> None:
    global _encoding
    _encoding = gpt2_encoding()


def init_worker() -> None:
    # Ctrl-C is the parent's to handle: no traceback from each worker
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    init_tokenizer()


def encode_one(text: str) -> np.ndarray:
    try:
        return _encoding.encode_to_numpy(text, disallowed_special=())  # no list of ints on the way
    except UnicodeEncodeError:  # lone surrogates: encode_ordinary replaces them
        return np.asarray(_encoding.encode_ordinary(text), dtype=np.uint32)


def encode_documents(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(the documents' tokens, each after <|endoftext|>, as one uint16 array; each document's token
    count)."""
    eot = np.array([EOT], dtype=np.uint32)
    pieces = [piece for text in texts for piece in (eot, encode_one(text))]
    lengths = np.array([pieces[i].size + 1 for i in range(1, len(pieces), 2)], dtype=np.int64)
    return np.concatenate(pieces).astype(np.uint16), lengths


@contextmanager
def ordered_map(processes: int):
    """A `map` that keeps the order, each process with its own tokenizer: `processes` workers, or
    this process when
    1. The workers are spawned, as on every platform (forking a process that runs threads, as
       pyarrow's, is unsafe, and no longer Python's default from 3.14): the main module must start
       its work under `if __name__ == "__main__":`, as the prepare scripts do."""
    if processes == 1:
        init_tokenizer()
        yield map
        return
    with multiprocessing.get_context("spawn").Pool(processes, initializer=init_worker) as pool:
        yield pool.imap
