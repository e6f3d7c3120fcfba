"""An out_dir belongs to one run.

While train.py runs, rank 0 holds out_dir/train.lock, created with O_EXCL (of two runs started together, one gets
it), which says whose it is: the process id, the host, the process's start time and the command. A second run is
refused while that process lives; the lock of a process that has died without releasing it (SIGKILL, a crash of
the machine) is taken over by the next run, with a line saying so. A lock of another host cannot be checked from
here: refused, with how to remove it.

A scratch run (init_from=scratch, GPT-2's weights or a transformers folder, eval_only alike) into an out_dir that
holds checkpoints is refused unless overwrite=True, which deletes the earlier run's checkpoints and log first: kept,
they would mix with the new run's (keep_last keeps the highest iterations, whichever run wrote them, and ckpt.pt and
ckpt-best.pt would point at either).

check_out_dir runs before any work, and writes nothing but a probe it removes at once (the one sure test that a
folder can be written: /proc, a read-only mount or a full quota pass os.access). claim runs after every other check
has passed, so that a refused run writes nothing; it checks again under the lock, so that of two runs admitted
into the same empty out_dir the second, which takes the lock once the first has ended, is refused too.

An out_dir that is a link to a folder elsewhere is taken as that folder (a link to a larger disk is common); the
checkpoints in it are files of its own, never written through a link (train/checkpoint.py)."""

import atexit
import errno
import json
import os
import shlex
import socket
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from nanogpt_perf.errors import UserError
from nanogpt_perf.files import REASONS, process_alive
from nanogpt_perf.guard.checkpoint import saved_iterations

LOCK_NAME = "train.lock"
# what a run leaves in out_dir besides its checkpoints, deleted with them by overwrite=True (manifest.json is
# rewritten at the start of every run)
RUN_RECORDS = ("log.jsonl", "trace.json")


def run_checkpoints(out_dir: Path) -> list[Path]:
    """The checkpoints in out_dir: ckpt.pt (nanoGPT's only one), ckpt-best.pt and the ckpt-NNNNNNN.pt."""
    links = [out_dir / name for name in ("ckpt.pt", "ckpt-best.pt") if (out_dir / name).is_file()]
    return links + saved_iterations(out_dir)


def run_files(out_dir: Path) -> tuple[tuple[str, int, int, int], ...]:
    """What out_dir holds of a run, each file by name, size, modification time and inode."""
    paths = run_checkpoints(out_dir) + [out_dir / name for name in RUN_RECORDS if (out_dir / name).is_file()]
    stats = ((p.name, p.stat()) for p in paths)
    return tuple((name, s.st_size, s.st_mtime_ns, s.st_ino) for name, s in stats)


def check_unchanged(out_dir: Path, seen: tuple) -> None:
    """A UserError when out_dir's run files are not those that admission saw (seen: run_files then): another run
    wrote there while this one was starting."""
    if (now := run_files(out_dir)) != seen:
        changed = sorted({f[0] for f in set(now) ^ set(seen)})
        raise UserError(
            f"out_dir {out_dir} changed while this run was starting (another run wrote or removed "
            f"{', '.join(changed[:3])}): nothing was written; start it again"
        )


def nonfinite_end(bad_steps: int, iter_num: int, out_dir: Path, max_bad_steps: int | None = None) -> str:
    """The line of a run that stops on max_bad_steps non-finite steps in a row (or, max_bad_steps None, that ends on
    some), with where it left its last good state: the newest checkpoint, or none."""
    if max_bad_steps is None:
        why = f"the run ended at iter {iter_num} on {bad_steps} non-finite steps, unsaved"
    else:
        why = f"{bad_steps} steps in a row with a non-finite loss or gradient norm (max_bad_steps={max_bad_steps})"
        why += f": stopped at iter {iter_num}"
    if (out_dir / "ckpt.pt").is_file():
        return f"{why}; the last checkpoint, {out_dir / 'ckpt.pt'}, is from before them"
    return f"{why}; no checkpoint was saved in {out_dir}"


def process_stat(pid: int) -> list[str] | None:
    """/proc/pid/stat's fields after the command name (Linux): [0] the state, [19] the start time in clock ticks
    since boot; None where there is no such process or no /proc."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def process_start(pid: int) -> str | None:
    """When process pid started, which tells a live run from a new process that got a dead run's pid."""
    stat = process_stat(pid)
    return stat[19] if stat else None


def is_running(holder: dict[str, Any]) -> bool:
    """Whether the process that wrote a lock on this host still runs."""
    if not process_alive(holder["pid"]):
        return False
    stat = process_stat(holder["pid"])
    if stat is None:  # no /proc: the pid alone
        return True
    started = holder.get("process_start")
    return stat[0] != "Z" and (started is None or started == stat[19])  # a zombie has ended, and is not reaped


def read_holder(path: Path) -> tuple[bytes, dict[str, Any] | None]:
    """A lock's bytes and what they say (None: not a lock of ours, or one still being written)."""
    try:
        raw = path.read_bytes()
        holder = json.loads(raw)
    except (OSError, ValueError):
        return b"", None
    valid = isinstance(holder, dict) and isinstance(holder.get("host"), str)
    valid = valid and type(holder.get("pid")) is int and holder["pid"] > 0  # 0 or -n would name process groups
    return raw, holder if valid else None


def held_by(holder: dict[str, Any]) -> str:
    return f"pid {holder['pid']} on {holder['host']}, since {holder.get('started', '?')}"


def check_lock(out_dir: Path, holder: dict[str, Any] | None) -> None:
    """A UserError when out_dir's lock (holder: what it says) stops this run; nothing when its process is dead."""
    path = out_dir / LOCK_NAME
    if holder is None:
        raise UserError(f"{path} is not a lock of train.py's, or a run is starting in {out_dir}: if none is, delete it")
    if holder["host"] != socket.gethostname():
        raise UserError(
            f"out_dir {out_dir} is locked by a run on another host ({held_by(holder)}): if that run has ended, "
            f"delete {path}; else choose another out_dir"
        )
    if is_running(holder):
        raise UserError(
            f"out_dir {out_dir} is in use by another run ({held_by(holder)}): wait for it to end, or choose "
            f"another out_dir (if pid {holder['pid']} is not a train.py run, delete {path})"
        )


def check_out_dir(out_dir: Path, scratch: bool, overwrite: bool, eval_only: bool) -> None:
    """A UserError when this run cannot use out_dir, before any work: a file in its place, a folder it cannot
    write, a live run holding it, or (scratch: not init_from=resume) an earlier run's checkpoints without
    overwrite=True."""
    existing = next(p for p in (out_dir.absolute(), *out_dir.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise UserError(f"out_dir {out_dir} cannot be made: {existing} is a file, not a folder")
    try:  # a probe, removed at once
        os.rmdir(tempfile.mkdtemp(prefix=f".{LOCK_NAME}.probe-", dir=existing))
    except OSError as e:
        reason = (
            "is not writable"
            if e.errno in (errno.EACCES, errno.EPERM)
            else f"refuses it: {REASONS.get(e.errno, e.strerror)}"
        )
        raise UserError(f"out_dir {out_dir} cannot be written ({existing} {reason}): choose another out_dir") from None
    if (out_dir / LOCK_NAME).exists():
        check_lock(out_dir, read_holder(out_dir / LOCK_NAME)[1])
    if scratch and not overwrite:
        check_no_earlier_run(out_dir, eval_only)


def check_no_earlier_run(out_dir: Path, eval_only: bool) -> None:
    """A UserError when out_dir holds an earlier run's checkpoints, which a new run would mix with its own."""
    found = run_checkpoints(out_dir)
    if not found:
        return
    names = ", ".join(p.name for p in found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
    if eval_only:  # its records would join that run's; overwrite=True would delete that run to evaluate others
        raise UserError(
            f"out_dir {out_dir} holds an earlier run's checkpoints ({names}): evaluate other weights in another "
            "out_dir, or that run's with init_from=resume (overwrite=True would delete them)"
        )
    raise UserError(
        f"out_dir {out_dir} holds an earlier run's checkpoints ({names}): init_from=resume continues that run, "
        "overwrite=True replaces it (deleting its checkpoints and log), or choose another out_dir"
    )


class OutDirLock:
    """out_dir/train.lock, held by this process from claim() to release()."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir, self.path, self.held = out_dir, out_dir / LOCK_NAME, False
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "process_start": process_start(os.getpid()),
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": shlex.join(sys.argv),
        }
        self.content = (json.dumps(holder, indent=2) + "\n").encode()

    def claim(self) -> None:
        """Take the lock (a dead process's taken over, saying so), or a UserError saying why not."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(3):  # a stale lock taken over, or a race lost to another run taking one over
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                raw, holder = read_holder(self.path)
                check_lock(self.out_dir, holder)
                if self.take_over(raw):
                    print(f"out_dir {self.out_dir}: taking over the lock of a run that is no longer running "
                          f"({held_by(holder)})", flush=True)  # fmt: skip
                continue
            with os.fdopen(fd, "wb") as f:
                f.write(self.content)
                f.flush()
                os.fsync(f.fileno())
            self.held = True
            atexit.register(self.release)  # on an exception too; the end of train.py releases it first
            return
        raise UserError(f"could not take {self.path}: other runs are starting in {self.out_dir} at the same time")

    def take_over(self, stale: bytes) -> bool:
        """Move the stale lock aside, unless it is no longer the one judged stale (another run took it over in
        between: put that run's back). True when it was removed."""
        aside = self.path.with_name(f"{LOCK_NAME}.stale-{os.getpid()}")
        try:
            os.replace(self.path, aside)
        except FileNotFoundError:
            return False
        if aside.read_bytes() == stale:
            aside.unlink()
            return True
        try:
            os.link(aside, self.path)
        except OSError:
            pass
        aside.unlink()
        return False

    def release(self) -> None:
        """Delete the lock, if it is still this run's. Safe to call more than once."""
        if not self.held:
            return
        self.held = False
        try:
            if self.path.read_bytes() == self.content:
                self.path.unlink()
        except OSError:
            pass


def remove_earlier_run(out_dir: Path) -> list[str]:
    """overwrite=True: delete the earlier run's checkpoints and records; the names deleted."""
    found = run_checkpoints(out_dir) + [out_dir / name for name in RUN_RECORDS if (out_dir / name).is_file()]
    for path in found:
        path.unlink()
    return [p.name for p in found]
