"""Web-scale text -> GPT-2 token shards in llm.c's format: the pipeline behind data/openwebtext and
data/fineweb.

The documents (documents.py: the hub or local files, tokenised in worker processes) are packed into
shards of exactly shard_size tokens, a document straddling two shards where it falls:
NAME_val_000000.bin first, then NAME_train_000001.bin, ... After each shard, prepare_state.json
records how far into the documents the written shards reach, so that a killed preparation (or one
stopped by a full disk) resumes where it stopped and ends byte for byte as an uninterrupted one
would. A finished preparation is described by prepare.json.

A preparation that fails on its input (a document that is not text, a malformed file, too small a
corpus) removes its shards and its state, and out_dir if it made it: the corrected command starts
afresh. An unfinished preparation with no shard yet is replaced by the next one; one with shards is
resumed by the command that started it (the error says which) and replaced only when the user
removes it.
"""

import json
import os
import shlex
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nanogpt_perf.config import setting
from nanogpt_perf.data.dataset import STATE_FILE
from nanogpt_perf.data.documents import (
    CorpusError,
    Source,
    count_documents,
    default_processes,
    document_chunks,
    encode_documents,
    hub_revision_sha,
    named,
    open_documents,
    ordered_map,
)
from nanogpt_perf.data.shards import ShardError, read_shard_header, shard_name, write_shard
from nanogpt_perf.errors import UserError
from nanogpt_perf.files import WriteFailed, write_json
from nanogpt_perf.guard.paths import a_path

RECORD_FILE = "prepare.json"
MAX_SHARD_SIZE = 2**31 - 1  # the header holds the token count as an int32


def fits_an_int32(shard_size: int) -> None:
    if shard_size > MAX_SHARD_SIZE:
        raise ValueError(f"<= {MAX_SHARD_SIZE:,} (an int32)")


@dataclass
class PrepareConfig:
    """The settings every web-scale preparation script has (data/openwebtext, data/fineweb)"""

    input: str = setting("", "comma-separated local files or globs (.txt: one document each; "
                         ".jsonl, .json, .parquet: a `text` field); '' = the hub")  # fmt: skip
    out_dir: str = setting(
        ".", "where the shards go (each script's default: its own folder)", check=a_path
    )
    shard_size: int = setting(100_000_000, "tokens per shard, as llm.c", min=1, check=fits_an_int32)
    processes: int = setting(
        default_processes(), "tokenising processes; 1 tokenises in this one", min=1, max=1024
    )
    val_tokens: int = setting(0, "tokens of the validation split: 0 = the first shard, or a tenth "
                              "of a corpus that fits in one", min=0,
                              note=" (0 = the first shard, or a tenth of a corpus that fits in "
                                   "one)")  # fmt: skip
    block_size: int = setting(1024, "the context it will train with: each split must hold "
                              "block_size + 1 tokens", min=1)  # fmt: skip


SMALL_VAL_SHARE = 10  # a corpus that fits in one shard: a tenth of it is the validation split


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


def this_command() -> str:
    """The command that runs this script again as it was run, shell-quoted, and from any folder."""
    on_path = shutil.which("python")
    same = on_path is not None and os.path.abspath(on_path) == os.path.abspath(sys.executable)
    command = shlex.join(["python" if same else sys.executable, *sys.argv])
    return f"cd {shlex.quote(os.getcwd())} && {command}"


def differences(old: dict[str, Any], new: dict[str, Any]) -> str:
    """What new changes of old, e.g. "shard_size 100 -> 200", for an error line."""

    def show(value: Any) -> str:
        if isinstance(value, list) and all(isinstance(v, dict) and "path" in v for v in value):
            return ", ".join(f"{v['path']} ({v.get('bytes')} bytes)" for v in value) or "none"
        return repr(value)

    return "; ".join(
        f"{k} {show(old.get(k))} -> {show(new[k])}" for k in new if old.get(k) != new[k]
    )


# ---------------------------------------------------------------- shards and the state between runs


class ShardWriter:
    """Packs the token stream into shards: the first (validation) of val_tokens tokens, or
    shard_size, the others of exactly shard_size. After each shard it saves the state: the documents
    wholly in written shards, and how many tokens of the next one are (it may straddle two
    shards)."""

    def __init__(self, out_dir: Path, state: dict[str, Any], started: float):
        self.out_dir, self.state = out_dir, state
        ident = state["identity"]
        self.shard_size, self.val_tokens, self.name = (
            ident["shard_size"],
            ident["val_tokens"],
            ident["name"],
        )
        self.buffer = np.empty(max(self.shard_size, self.val_tokens), dtype=np.uint16)
        self.filled = 0
        self.documents = state["documents"]  # the documents before the next chunk
        # the next document's tokens already in a written shard, on a resume
        self.drop = state["partial_tokens"]
        self.started, self.elapsed_before, self.tokens_before = (
            started,
            state["elapsed_s"],
            self.tokens,
        )

    @property
    def tokens(self) -> int:
        return self.state["tokens"] + self.filled

    def progress(self) -> str:
        # this run's
        rate = (self.tokens - self.tokens_before) / (time.perf_counter() - self.started)
        return f"{self.tokens / 1e6:,.1f}M tokens, {rate / 1e6:.2f}M tokens/s"

    @property
    def size(self) -> int:
        """The size of the shard being filled."""
        return (
            (self.val_tokens or self.shard_size) if self.state["shards"] == 0 else self.shard_size
        )

    def add(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """A chunk's tokens, `lengths` those of each of its documents."""
        ends = np.cumsum(lengths)
        pos, self.drop = self.drop, 0
        while pos < tokens.size:
            take = min(self.size - self.filled, tokens.size - pos)
            self.buffer[self.filled : self.filled + take] = tokens[pos : pos + take]
            self.filled, pos = self.filled + take, pos + take
            if self.filled == self.size:
                # documents ending at or before pos
                whole = int(np.searchsorted(ends, pos, side="right"))
                self.write(self.documents + whole, pos - (int(ends[whole - 1]) if whole else 0))
        self.documents += lengths.size

    def finish(self) -> None:
        if self.state["shards"] == 0 and not self.val_tokens and self.filled:
            self.split_small()
        elif self.filled:
            self.write(self.documents, 0)

    def split_small(self) -> None:
        """A corpus that fits in the first shard: its first tenth the validation split, the rest the
        training one, both written before the state says so (a kill in between prepares again from
        the start)."""
        val = self.filled // SMALL_VAL_SHARE
        write_shard(self.out_dir / shard_file(self.name, 0), self.buffer[:val])
        write_shard(self.out_dir / shard_file(self.name, 1), self.buffer[val : self.filled])
        elapsed = round(self.elapsed_before + time.perf_counter() - self.started, 3)
        self.state.update(
            documents=self.documents, partial_tokens=0, shards=2, val_size=val, elapsed_s=elapsed
        )
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
        raise UserError(
            f"{path} is unreadable ({named(e)}): remove {path.parent} to prepare again"
        ) from None


def shard_file(name: str, index: int) -> str:
    # the first shard is the validation split
    return shard_name(name, "val" if index == 0 else "train", index)


def check_shards(out_dir: Path, names: list[str], shard_size: int, val_size: int) -> None:
    """Each shard whole, and full but the last (the preparation's end): val_size tokens the first,
    shard_size the others."""
    for i, file in enumerate(names):
        try:
            n_tokens = read_shard_header(out_dir / file).n_tokens
        except (OSError, ShardError) as e:
            damaged = f"{file} is missing or damaged ({named(e)})"
            raise UserError(f"{damaged}: remove {out_dir} to prepare again") from None
        size = val_size if i == 0 else shard_size
        if n_tokens != size and i < len(names) - 1:
            short = f"{out_dir / file} holds {n_tokens:,} tokens, not {size:,}"
            raise UserError(f"{short}: remove {out_dir} to prepare again")


def finished(out_dir: Path, ident: dict[str, Any]) -> dict[str, Any] | None:
    """The record of a finished preparation of the same in out_dir, its shards checked; None when
    there is none."""
    if not (out_dir / RECORD_FILE).is_file():
        return None
    record = read_json(out_dir / RECORD_FILE)
    # prepared before val_tokens existed
    record = {"val_tokens": 0, "val_size": record.get("shard_size")} | record
    if {k: record.get(k) for k in ident} != ident:
        raise UserError(
            f"{out_dir} holds a finished preparation of other settings "
            f"({differences(record, ident)}): choose "
            f"another out_dir, or remove {out_dir} to prepare it again"
        )
    check_shards(out_dir, record["shard_names"], ident["shard_size"], record["val_size"])
    # killed between writing prepare.json and removing the state
    (out_dir / STATE_FILE).unlink(missing_ok=True)
    return record


def other_dataset(out_dir: Path, name: str) -> str | None:
    """Another dataset in out_dir, which shards of ours beside it would spoil, or None: nanoGPT's
    train.bin, val.bin and meta.pkl (the loader reads train.bin before any shard), or shards of
    another name."""
    if not out_dir.is_dir():
        return None
    theirs = [n for n in ("train.bin", "val.bin", "meta.pkl") if (out_dir / n).exists()]
    theirs += sorted(
        p.name
        for p in {*out_dir.glob("*_train*.bin"), *out_dir.glob("*_val*.bin")}
        if not p.name.startswith(name + "_")
    )
    return f"another dataset ({', '.join(theirs[:3])})" if theirs else None


def resumable(out_dir: Path, ident: dict[str, Any]) -> dict[str, Any] | None:
    """The state of an unfinished preparation of the same in out_dir, its shards checked and
    anything written after its last save removed; None when out_dir holds none (and no shards), or
    one that wrote no shard yet."""
    mine = sorted(out_dir.glob(f"{ident['name']}_*.bin*"))
    if not (out_dir / STATE_FILE).is_file():
        if mine:
            raise UserError(
                f"{out_dir} holds shards ({mine[0].name}, ...) but no {STATE_FILE}: remove them "
                "first"
            )
        return None
    state = read_json(out_dir / STATE_FILE)
    state = {"val_size": ident["shard_size"]} | state  # started before val_tokens existed
    state["identity"] = {"val_tokens": 0} | state.get("identity", {})
    if state["identity"] != ident and not state.get("shards"):  # a killed start: nothing to keep
        print(f"starting over: the unfinished preparation in {out_dir} had no shard yet")
        state = dict(state, identity=ident, shards=0)
    elif state["identity"] != ident:
        how = f"resume it with: {state['command']}" if state.get("command") else "run it as it was"
        raise UserError(
            f"{out_dir} holds an unfinished preparation ({state['shards']} shards) of other "
            "settings "
            f"({differences(state['identity'], ident)}): {how}; or remove {out_dir} to start over"
        )
    written = [shard_file(ident["name"], i) for i in range(state["shards"])]
    check_shards(out_dir, written, ident["shard_size"], state["val_size"])
    for path in [*mine, *out_dir.glob(STATE_FILE + ".tmp")]:
        # a shard after the last save (made again), a temporary file of old
        if path.name not in written:
            path.unlink()
    if not written:
        (out_dir / STATE_FILE).unlink()
        return None
    return state


# ----------------------------------------------------------------------------- the preparation


def prepare(
    source: Source,
    out_dir: Path,
    name: str,
    shard_size: int,
    processes: int,
    val_tokens: int = 0,
    block_size: int = 1,
) -> dict[str, Any]:
    """Prepare (or resume preparing) source's documents as shards NAME_*.bin in out_dir; returns the
    record that prepare.json holds. A folder already prepared alike is left as it is. Each split
    must hold a window of block_size + 1 tokens, or the preparation is refused (and what it wrote
    removed)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"out_dir must be a folder (new or existing), not the file {out_dir}")
    if problem := other_dataset(out_dir, name):
        raise UserError(
            f"out_dir {out_dir} holds {problem}: choose another out_dir (its files are left as "
            "they are)"
        )
    created = not out_dir.exists()
    ident = identity(source, name, shard_size, val_tokens)
    if not created and (record := finished(out_dir, ident)) is not None:
        print(
            f"{out_dir} is already prepared ({record['shards']} shards, {record['tokens']:,} "
            "tokens): nothing to do"
        )
        return record
    state = resumable(out_dir, ident) if not created else None
    if state is not None:
        print(
            f"resuming after {state['shards']} shards ({state['tokens']:,} tokens, "
            f"{state['documents']:,} documents)"
        )
    else:
        sha = hub_revision_sha(source) if source.repo else None
        state = dict(
            identity=ident,
            revision_sha=sha,
            documents=0,
            partial_tokens=0,
            shards=0,
            tokens=0,
            elapsed_s=0,
        )
        state |= dict(val_size=val_tokens or shard_size, command=this_command())
        # before any shard: a shard without a state would not be ours
        write_json(out_dir / STATE_FILE, state)
    print(f"preparing {source.describe()} -> {out_dir}, {processes} process(es)", flush=True)
    if problem := tokenize_or_stop(source, out_dir, state, processes) or splits_problem(
        state, block_size
    ):
        abandon(out_dir, state, created)
        raise UserError(problem)
    return finish(out_dir, state)


class Terminated(BaseException):
    """SIGTERM during a preparation: a BaseException, as KeyboardInterrupt, so that no `except
    Exception` on the way (reading the documents) takes it for bad input."""


def tokenize_or_stop(
    source: Source, out_dir: Path, state: dict[str, Any], processes: int
) -> str | None:
    """Tokenise into shards; what is wrong with the input, or None. An interruption (Ctrl-C,
    SIGTERM), a disk that is full and the hub's failures (a lost connection, most likely) end here,
    the shards so far kept to resume."""
    resume = f"run the same command again to resume: {state.get('command') or this_command()}"

    # the workers are ended on the way out, as for Ctrl-C
    def terminated(signum: int, frame: Any) -> None:
        raise Terminated

    main = threading.current_thread() is threading.main_thread()  # where signal handlers can be set
    previous = signal.signal(signal.SIGTERM, terminated) if main else None
    try:
        tokenize_into_shards(source, out_dir, state, processes)
    except CorpusError as e:
        if source.repo is None:
            return str(e)
        raise UserError(f"{e}; {resume}") from None
    except KeyboardInterrupt:
        raise KeyboardInterrupt(resume) from None
    except Terminated:
        raise UserError(f"stopped by SIGTERM; {state['shards']} shard(s) kept: {resume}") from None
    except WriteFailed as e:
        kept = f"{state['shards']} shard(s) kept: once it is fixed, {resume}"
        raise UserError(f"cannot write {e.path}: {e.reason}; {kept}") from None
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
    return None if state["shards"] else f"{source.describe()} holds no documents"


def splits_problem(state: dict[str, Any], block_size: int) -> str | None:
    """Why the splits made cannot train a model of this block_size (each needs block_size + 1
    tokens), or None."""
    val = min(state["val_size"], state["tokens"])
    train, need = state["tokens"] - val, block_size + 1
    if val >= need and train >= need:
        return None
    what = (
        "the validation split takes all of it"
        if train == 0
        else f"{val:,} for validation, {train:,} for training"
    )
    return (
        f"the corpus has {state['tokens']:,} tokens ({what}): too few for a validation and a "
        "training split of "
        f"block_size={block_size} + 1 tokens each; give more text, a smaller --val_tokens or "
        "--block_size"
    )


def abandon(out_dir: Path, state: dict[str, Any], created: bool) -> None:
    """Remove what a refused preparation wrote: its shards, its state, and out_dir if it made it."""
    for path in out_dir.glob(f"{state['identity']['name']}_*.bin"):
        path.unlink()
    (out_dir / STATE_FILE).unlink(missing_ok=True)
    if created and not any(out_dir.iterdir()):
        out_dir.rmdir()


def tokenize_into_shards(
    source: Source, out_dir: Path, state: dict[str, Any], processes: int
) -> None:
    from tqdm import tqdm

    # the time counted: the workers' start and the input's opening too
    started, bar = time.perf_counter(), None
    # first: the workers start while `datasets` is imported
    with ordered_map(processes) as tokenize:
        dataset = open_documents(source, state["revision_sha"] or source.revision)
        total = count_documents(source, dataset)
        writer = ShardWriter(out_dir, state, started)
        try:
            for tokens, lengths in tokenize(
                encode_documents, document_chunks(dataset, state["documents"], source.describe())
            ):
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
        f"prepared {state['documents']:,} documents, {state['tokens']:,} tokens in "
        f"{state['shards']} shards "
        f"(val: {names[0]}; train: {len(names) - 1}) in {state['elapsed_s']:.1f} s, "
        f"{rate / 1e6:.2f}M tokens/s"
    )
    print(f"in {out_dir}, described by {RECORD_FILE}")
    return record
