"""Web-scale text -> GPT-2 token shards in llm.c's format: the pipeline behind data/openwebtext and data/fineweb.

Documents are streamed (from the Hugging Face hub, or local .txt/.jsonl/.json/.parquet files, both through
`datasets`), tokenised in worker processes with <|endoftext|> before each one (as llm.c does), and packed into
shards of exactly shard_size tokens, a document straddling two shards where it falls: NAME_val_000000.bin first,
then NAME_train_000001.bin, ... After each shard, prepare_state.json records how far into the documents the
written shards reach, so that a killed preparation resumes where it stopped and ends byte for byte as an
uninterrupted one would. A finished preparation is described by prepare.json.
"""

import itertools
import json
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nanogpt_perf.data.shards import ShardError, read_shard_header, shard_name, write_shard
from nanogpt_perf.data.tokenizer import gpt2_encoding
from nanogpt_perf.errors import die
from nanogpt_perf.files import write_json
from nanogpt_perf.rules import Rule, a_path, at_least

EOT = 50256  # GPT-2's <|endoftext|>
CHUNK = 128  # documents per task sent to a worker
STATE_FILE = "prepare_state.json"
RECORD_FILE = "prepare.json"
INPUT_KINDS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
MAX_SHARD_SIZE = 2**31 - 1  # the header holds the token count as an int32

# the valid values of the settings every preparation script has
RULES: dict[str, Rule] = {
    "out_dir": a_path,
    "shard_size": lambda v: at_least(1)(v) or (None if v <= MAX_SHARD_SIZE else f"<= {MAX_SHARD_SIZE:,} (an int32)"),
    "processes": at_least(1),
    "val_tokens": at_least(0, " (0 = the first shard, or a tenth of a corpus that fits in one)"),
    "block_size": at_least(1),
}
SMALL_VAL_SHARE = 10  # a corpus that fits in one shard: a tenth of it is the validation split


class CorpusError(ValueError):
    """Bad input found while reading the documents (in the pool's feeder thread too): one line for the user."""


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
        config, revision = f" ({self.config})" if self.config else "", f" at {self.revision}" if self.revision else ""
        return self.repo + config + revision


def local_source(paths: str) -> Source:
    """The comma-separated local files of an --input setting, checked: each must exist and have a known kind."""
    files = tuple(Path(p.strip()).resolve() for p in paths.split(",") if p.strip())
    if not files:
        die("--input names no file")
    for path in files:
        if path.suffix.lower() not in INPUT_KINDS:
            die(f"{path}: unknown kind of input {path.suffix or '(no extension)'!r}; use {', '.join(INPUT_KINDS)}")
        if not path.is_file():
            die(f"input file {path} not found")
        if path.stat().st_size == 0 and path.suffix.lower() != ".txt":  # an empty text file is one empty document
            die(f"input file {path} is empty: no documents")
    return Source(files=files)


def default_processes() -> int:
    """Tokenising processes: the CPUs this process may use, at most 16 (the one parent reading the documents and
    writing the shards keeps up with about that many)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cpus, 16))


def identity(source: Source, name: str, shard_size: int, val_tokens: int = 0) -> dict[str, Any]:
    """What a preparation is made of: a folder resumes or counts as done only for the same."""
    return {
        "val_tokens": val_tokens,
        "name": name,
        "source": "hub" if source.repo else "local",
        "dataset": source.repo,
        "config": source.config,
        "revision": source.revision,
        "input_files": [{"path": str(p), "bytes": p.stat().st_size} for p in source.files],
        "shard_size": shard_size,
        "tokenizer": "gpt2",
    }


def hub_revision_sha(source: Source) -> str | None:
    """The commit the hub's revision points to now, to pin it for a resume; None offline or where unknown."""
    try:
        from huggingface_hub import HfApi

        return HfApi().dataset_info(source.repo, revision=source.revision).sha
    except Exception:  # no network, no access: stream the revision as named
        return None


# ----------------------------------------------------------------------------- reading documents


def count_documents(source: Source, dataset) -> int | None:
    """The number of documents when it can be known cheaply (for the progress bar): lines of JSONL (an estimate:
    blank lines count), Parquet row counts, one per text file; for the hub, the split's size in the dataset info."""
    if source.repo is not None:
        split = (dataset.info.splits or {}).get("train")
        return split.num_examples if split is not None and split.num_examples else source.documents
    import pyarrow.parquet as pq

    total = 0
    for path in source.files:
        kind = path.suffix.lower()
        if kind == ".json":
            return None  # one array or JSON lines: no cheap way to tell
        total += 1 if kind == ".txt" else pq.read_metadata(path).num_rows if kind == ".parquet" else count_lines(path)
    return total


def count_lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 24), b""))


def first_line(error: Exception) -> str:
    return f"{type(error).__name__}: " + (str(error).strip().splitlines() or [""])[0]


def open_documents(source: Source, revision: str | None):
    """The documents as one streaming `datasets.IterableDataset` with a `text` column (local files: each run of
    files of one kind is one `load_dataset`, in the order given)."""
    import logging

    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(logging.CRITICAL)  # errors reach the user as one line of ours, not a log
    stream = dict(split="train", streaming=True)
    try:
        if source.repo is not None:
            hub = datasets.load_dataset(source.repo, name=source.config, revision=revision, **stream)
            return text_column(hub, source.repo)
        parts = []
        for kind, group in itertools.groupby(source.files, key=lambda p: INPUT_KINDS[p.suffix.lower()]):
            files = [str(p) for p in group]
            options = {"sample_by": "document"} if kind == "text" else {}  # a text file is one document
            parts.append(text_column(datasets.load_dataset(kind, data_files=files, **stream, **options), files[0]))
        return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    except CorpusError:
        raise
    except Exception as e:
        raise CorpusError(f"cannot open {source.describe()}: {first_line(e)}") from e


def text_column(dataset, where: str):
    """Only the `text` column, so that no other column is ever converted to Python."""
    if dataset.features is not None and "text" not in dataset.features:
        raise CorpusError(f"{where}: no 'text' column (columns: {', '.join(dataset.features)})")
    return dataset.select_columns(["text"]) if dataset.features is not None else dataset


def document_chunks(dataset, skip: int) -> Iterator[list[str]]:
    """Lists of CHUNK documents' texts, after the first `skip` documents."""
    try:
        for batch in (dataset.skip(skip) if skip else dataset).iter(batch_size=CHUNK):
            if "text" not in batch:
                raise CorpusError(f"the documents have no 'text' field (fields: {', '.join(batch)})")
            texts = batch["text"]
            if bad := [text for text in texts if not isinstance(text, str)]:
                raise CorpusError(f"a document's text is {type(bad[0]).__name__} {bad[0]!r:.40}, not a string")
            yield texts
    except CorpusError:
        raise
    except Exception as e:  # a malformed file, a lost connection: one line, and a rerun resumes
        raise CorpusError(f"reading the documents failed: {first_line(e)}") from e


# ----------------------------------------------------------------------------- tokenising

_encoding = None  # each process's own tiktoken encoding, built once


def init_tokenizer() -> None:
    global _encoding
    _encoding = gpt2_encoding()


def init_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: no traceback from each worker
    init_tokenizer()


def encode_one(text: str) -> np.ndarray:
    try:
        return _encoding.encode_to_numpy(text, disallowed_special=())  # no list of ints on the way
    except UnicodeEncodeError:  # lone surrogates: encode_ordinary replaces them
        return np.asarray(_encoding.encode_ordinary(text), dtype=np.uint32)


def encode_documents(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(the documents' tokens, each after <|endoftext|>, as one uint16 array; each document's token count)."""
    eot = np.array([EOT], dtype=np.uint32)
    pieces = [piece for text in texts for piece in (eot, encode_one(text))]
    lengths = np.array([pieces[i].size + 1 for i in range(1, len(pieces), 2)], dtype=np.int64)
    return np.concatenate(pieces).astype(np.uint16), lengths


@contextmanager
def ordered_map(processes: int):
    """A `map` that keeps the order, each process with its own tokenizer: `processes` workers, or this process when
    1. The workers are spawned, as on every platform (forking a process that runs threads, as pyarrow's, is unsafe,
    and no longer Python's default from 3.14): the main module must start its work under `if __name__ ==
    "__main__":`, as the prepare scripts do."""
    if processes == 1:
        init_tokenizer()
        yield map
        return
    with multiprocessing.get_context("spawn").Pool(processes, initializer=init_worker) as pool:
        yield pool.imap


# ----------------------------------------------------------------------------- shards and the state between runs


class ShardWriter:
    """Packs the token stream into shards: the first (validation) of val_tokens tokens, or shard_size, the others
    of exactly shard_size. After each shard it saves the state: the documents wholly in written shards, and how
    many tokens of the next one are (it may straddle two shards)."""

    def __init__(self, out_dir: Path, state: dict[str, Any], started: float):
        self.out_dir, self.state = out_dir, state
        ident = state["identity"]
        self.shard_size, self.val_tokens, self.name = ident["shard_size"], ident["val_tokens"], ident["name"]
        self.buffer = np.empty(max(self.shard_size, self.val_tokens), dtype=np.uint16)
        self.filled = 0
        self.documents = state["documents"]  # the documents before the next chunk
        self.drop = state["partial_tokens"]  # the next document's tokens already in a written shard, on a resume
        self.started, self.elapsed_before, self.tokens_before = started, state["elapsed_s"], self.tokens

    @property
    def tokens(self) -> int:
        return self.state["tokens"] + self.filled

    def progress(self) -> str:
        rate = (self.tokens - self.tokens_before) / (time.perf_counter() - self.started)  # this run's
        return f"{self.tokens / 1e6:,.1f}M tokens, {rate / 1e6:.2f}M tokens/s"

    @property
    def size(self) -> int:
        """The size of the shard being filled."""
        return (self.val_tokens or self.shard_size) if self.state["shards"] == 0 else self.shard_size

    def add(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """A chunk's tokens, `lengths` those of each of its documents."""
        ends = np.cumsum(lengths)
        pos, self.drop = self.drop, 0
        while pos < tokens.size:
            take = min(self.size - self.filled, tokens.size - pos)
            self.buffer[self.filled : self.filled + take] = tokens[pos : pos + take]
            self.filled, pos = self.filled + take, pos + take
            if self.filled == self.size:
                whole = int(np.searchsorted(ends, pos, side="right"))  # documents ending at or before pos
                self.write(self.documents + whole, pos - (int(ends[whole - 1]) if whole else 0))
        self.documents += lengths.size

    def finish(self) -> None:
        if self.state["shards"] == 0 and not self.val_tokens and self.filled:
            self.split_small()
        elif self.filled:
            self.write(self.documents, 0)

    def split_small(self) -> None:
        """A corpus that fits in the first shard: its first tenth the validation split, the rest the training one,
        both written before the state says so (a kill in between prepares again from the start)."""
        val = self.filled // SMALL_VAL_SHARE
        write_shard(self.out_dir / shard_file(self.name, 0), self.buffer[:val])
        write_shard(self.out_dir / shard_file(self.name, 1), self.buffer[val : self.filled])
        elapsed = round(self.elapsed_before + time.perf_counter() - self.started, 3)
        self.state.update(documents=self.documents, partial_tokens=0, shards=2, val_size=val, elapsed_s=elapsed)
        self.state["tokens"] += self.filled
        self.filled = 0
        write_json(self.out_dir / STATE_FILE, self.state)

    def write(self, documents: int, partial_tokens: int) -> None:
        index = self.state["shards"]
        write_shard(self.out_dir / shard_file(self.name, index), self.buffer[: self.filled])
        self.state.update(
            documents=documents,
            partial_tokens=partial_tokens,
            shards=index + 1,
            tokens=self.state["tokens"] + self.filled,
            elapsed_s=round(self.elapsed_before + time.perf_counter() - self.started, 3),
        )
        self.filled = 0
        write_json(self.out_dir / STATE_FILE, self.state)


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        die(f"{path} is unreadable ({first_line(e)}): remove {path.parent} to prepare again")


def shard_file(name: str, index: int) -> str:
    return shard_name(name, "val" if index == 0 else "train", index)  # the first shard is the validation split


def check_shards(out_dir: Path, names: list[str], shard_size: int, val_size: int) -> None:
    """Each shard whole, and full but the last (the preparation's end): val_size tokens the first, shard_size the
    others."""
    for i, file in enumerate(names):
        try:
            n_tokens = read_shard_header(out_dir / file).n_tokens
        except (OSError, ShardError) as e:
            die(f"{file} is missing or damaged ({first_line(e)}): remove {out_dir} to prepare again")
        size = val_size if i == 0 else shard_size
        if n_tokens != size and i < len(names) - 1:
            die(f"{out_dir / file} holds {n_tokens:,} tokens, not {size:,}: remove {out_dir} to prepare again")


def finished(out_dir: Path, ident: dict[str, Any]) -> dict[str, Any] | None:
    """The record of a finished preparation of the same in out_dir, its shards checked; None when there is none."""
    if not (out_dir / RECORD_FILE).is_file():
        return None
    record = read_json(out_dir / RECORD_FILE)
    record = {"val_tokens": 0, "val_size": record.get("shard_size")} | record  # prepared before val_tokens existed
    if {k: record.get(k) for k in ident} != ident:
        differ = ", ".join(k for k in ident if record.get(k) != ident[k])
        die(f"{out_dir} holds a finished preparation with another {differ}: remove it or choose another out_dir")
    check_shards(out_dir, record["shard_names"], ident["shard_size"], record["val_size"])
    (out_dir / STATE_FILE).unlink(missing_ok=True)  # killed between writing prepare.json and removing the state
    return record


def resumable(out_dir: Path, ident: dict[str, Any]) -> dict[str, Any] | None:
    """The state of an unfinished preparation of the same in out_dir, its shards checked and anything written
    after its last save removed; None when out_dir holds none (and no shards)."""
    mine = sorted(out_dir.glob(f"{ident['name']}_*.bin*"))
    if not (out_dir / STATE_FILE).is_file():
        if mine:
            die(f"{out_dir} holds shards ({mine[0].name}, ...) but no {STATE_FILE}: remove them first")
        return None
    state = read_json(out_dir / STATE_FILE)
    state = {"val_size": ident["shard_size"]} | state  # started before val_tokens existed
    state["identity"] = {"val_tokens": 0} | state.get("identity", {})
    if state.get("identity") != ident:
        differ = ", ".join(k for k in ident if state.get("identity", {}).get(k) != ident[k])
        die(f"{out_dir} holds an unfinished preparation with another {differ}: run it as it was, or remove the folder")
    written = [shard_file(ident["name"], i) for i in range(state["shards"])]
    check_shards(out_dir, written, ident["shard_size"], state["val_size"])
    for path in [*mine, *out_dir.glob(STATE_FILE + ".tmp")]:
        if path.name not in written:  # a shard after the last save (made again), a temporary file
            path.unlink()
    return state


# ----------------------------------------------------------------------------- the preparation


def prepare(
    source: Source, out_dir: Path, name: str, shard_size: int, processes: int, val_tokens: int = 0, block_size: int = 1
) -> dict[str, Any]:
    """Prepare (or resume preparing) source's documents as shards NAME_*.bin in out_dir; returns the record that
    prepare.json holds. A folder already prepared alike is left as it is. Each split must hold a window of
    block_size + 1 tokens, or the preparation is refused (and what it wrote removed)."""
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    ident = identity(source, name, shard_size, val_tokens)
    if (record := finished(out_dir, ident)) is not None:
        print(f"{out_dir} is already prepared ({record['shards']} shards, {record['tokens']:,} tokens): nothing to do")
        return record
    state = resumable(out_dir, ident)
    if state is not None:
        print(f"resuming after {state['shards']} shards ({state['tokens']:,} tokens, {state['documents']:,} documents)")
    else:
        sha = hub_revision_sha(source) if source.repo else None
        state = dict(identity=ident, revision_sha=sha, documents=0, partial_tokens=0, shards=0, tokens=0, elapsed_s=0)
        state["val_size"] = val_tokens or shard_size
        write_json(out_dir / STATE_FILE, state)
    print(f"preparing {source.describe()} -> {out_dir}, {processes} process(es)", flush=True)
    try:
        tokenize_into_shards(source, out_dir, state, processes)
    except CorpusError as e:
        die(str(e))
    except KeyboardInterrupt:
        die("interrupted: run the same command again to resume")
    if problem := splits_problem(state, block_size):
        abandon(out_dir, state, created)
        die(problem)
    return finish(out_dir, state)


def splits_problem(state: dict[str, Any], block_size: int) -> str | None:
    """Why the splits made cannot train a model of this block_size (each needs block_size + 1 tokens), or None."""
    val = min(state["val_size"], state["tokens"])
    train, need = state["tokens"] - val, block_size + 1
    if val >= need and train >= need:
        return None
    what = "the validation split takes all of it" if train == 0 else f"{val:,} for validation, {train:,} for training"
    return (
        f"the corpus has {state['tokens']:,} tokens ({what}): too few for a validation and a training split of "
        f"block_size={block_size} + 1 tokens each; give more text, a smaller --val_tokens or --block_size"
    )


def abandon(out_dir: Path, state: dict[str, Any], created: bool) -> None:
    """Remove what a refused preparation wrote: its shards, its state, and out_dir if it made it."""
    for path in out_dir.glob(f"{state['identity']['name']}_*.bin"):
        path.unlink()
    (out_dir / STATE_FILE).unlink(missing_ok=True)
    if created and not any(out_dir.iterdir()):
        out_dir.rmdir()


def tokenize_into_shards(source: Source, out_dir: Path, state: dict[str, Any], processes: int) -> None:
    from tqdm import tqdm

    started, bar = time.perf_counter(), None  # the time counted: the workers' start and the input's opening too
    with ordered_map(processes) as tokenize:  # first: the workers start while `datasets` is imported
        dataset = open_documents(source, state["revision_sha"] or source.revision)
        total = count_documents(source, dataset)
        writer = ShardWriter(out_dir, state, started)
        try:
            for tokens, lengths in tokenize(encode_documents, document_chunks(dataset, state["documents"])):
                if bar is None:  # only once documents flow: an error before that is one line alone
                    bar = tqdm(
                        total=total,
                        initial=state["documents"],
                        unit=" docs",
                        unit_scale=True,
                        smoothing=0.1,
                        file=sys.stdout,
                    )
                writer.add(tokens, lengths)
                bar.set_postfix_str(writer.progress(), refresh=False)
                bar.update(lengths.size)
            writer.finish()
        finally:
            if bar is not None:
                bar.close()
    if state["shards"] == 0:
        die(f"{source.describe()} holds no documents")


def finish(out_dir: Path, state: dict[str, Any]) -> dict[str, Any]:
    """Write prepare.json, drop the state, print what was made."""
    ident = state["identity"]
    names = [shard_file(ident["name"], i) for i in range(state["shards"])]
    results = {k: state[k] for k in ("revision_sha", "documents", "tokens", "shards", "val_size")}
    record = {**ident, **results, "shard_names": names, "elapsed_s": state["elapsed_s"]}
    write_json(out_dir / RECORD_FILE, record)
    (out_dir / STATE_FILE).unlink()
    rate = state["tokens"] / max(state["elapsed_s"], 1e-9)
    print(
        f"prepared {state['documents']:,} documents, {state['tokens']:,} tokens in {state['shards']} shards "
        f"(val: {names[0]}; train: {len(names) - 1}) in {state['elapsed_s']:.1f} s, {rate / 1e6:.2f}M tokens/s"
    )
    print(f"in {out_dir}, described by {RECORD_FILE}")
    return record
