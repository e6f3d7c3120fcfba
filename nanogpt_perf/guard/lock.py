"""An out_dir's lock: one run at a time.

While train.py runs, rank 0 holds out_dir/train.lock, created with O_EXCL (of two runs started
together, one gets it), which says whose it is: the process id, the host, the process's start time
and the command. A second run is refused while that process lives (check_lock, which
guard/out_dir.admit_out_dir asks too, before any work); the lock of a process that has died without
releasing it (SIGKILL, a crash of the machine) is taken over by the next run, with a line saying so.
A lock of another host cannot be checked from here: refused, with how to remove it. What is no lock
of ours (other contents, a pid no process can have, a folder or a FIFO in its place) is refused
alike, and never waited on (a FIFO's plain open waits for a writer for ever)."""

import atexit
import json
import os
import shlex
import socket
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from nanogpt_perf.errors import UserError
from nanogpt_perf.files import REASONS, ReadFailed, process_alive, read_file

LOCK_NAME = "train.lock"
PID_LIMIT = 2**31  # pid_t is a C int: no process has a pid at or beyond it


def process_stat(pid: int) -> list[str] | None:
    """/proc/pid/stat's fields after the command name (Linux): [0] the state, [19] the start time in
    clock ticks since boot; None where there is no such process or no /proc."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def process_start(pid: int) -> str | None:
    """When process pid started, which tells a live run from a new process that got a dead run's
    pid."""
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
    # a zombie has ended, and is not reaped
    return stat[0] != "Z" and (started is None or started == stat[19])


def read_holder(path: Path) -> tuple[bytes, dict[str, Any] | None]:
    """A lock's bytes and what they say (None: not a lock of ours, one still being written, or
    gone); a UserError where something else than a file is in its place."""
    try:
        raw = read_file(path)
        holder = json.loads(raw)
    except ReadFailed as e:
        if e.missing:
            return b"", None
        what = "not a lock of train.py's; delete it, or choose another out_dir"
        raise UserError(f"{e}: {what}") from None
    except (OSError, ValueError):
        return b"", None
    valid = isinstance(holder, dict) and isinstance(holder.get("host"), str)
    pid = holder.get("pid") if valid else None
    valid = valid and type(pid) is int and 0 < pid < PID_LIMIT  # 0 or -n: process groups
    valid = valid and isinstance(holder.get("process_start"), (str, type(None)))
    return raw, holder if valid else None


def held_by(holder: dict[str, Any]) -> str:
    return f"pid {holder['pid']} on {holder['host']}, since {holder.get('started', '?')}"


def check_lock(out_dir: Path, holder: dict[str, Any] | None) -> None:
    """A UserError when out_dir's lock (holder: what it says) stops this run; nothing when its
    process is dead."""
    path = out_dir / LOCK_NAME
    if holder is None:
        raise UserError(
            f"{path} is not a lock of train.py's, or a run is starting in {out_dir}: if none is, "
            "delete it"
        )
    if holder["host"] != socket.gethostname():
        raise UserError(
            f"out_dir {out_dir} is locked by a run on another host ({held_by(holder)}): if that "
            "run has ended, "
            f"delete {path}; else choose another out_dir"
        )
    if is_running(holder):
        raise UserError(
            f"out_dir {out_dir} is in use by another run ({held_by(holder)}): wait for it to end, "
            "or choose "
            f"another out_dir (if pid {holder['pid']} is not a train.py run, delete {path})"
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
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # a link to nothing, a file in the way (admit_out_dir says so first)
            why = REASONS.get(e.errno, e)
            raise UserError(f"out_dir {self.out_dir} cannot be made: {why}") from None
        for _ in range(3):  # a stale lock taken over, or a race lost to another run taking one over
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                raw, holder = read_holder(self.path)
                check_lock(self.out_dir, holder)
                if self.take_over(raw):
                    print(
                        f"out_dir {self.out_dir}: taking over the lock of a run that is no longer "
                        "running "
                        f"({held_by(holder)})",
                        flush=True,
                    )
                continue
            with os.fdopen(fd, "wb") as f:
                f.write(self.content)
                f.flush()
                os.fsync(f.fileno())
            self.held = True
            # on an exception too; the end of train.py releases it first
            atexit.register(self.release)
            return
        raise UserError(
            f"could not take {self.path}: other runs are starting in {self.out_dir} at the same "
            "time"
        )

    def take_over(self, stale: bytes) -> bool:
        """Move the stale lock aside, unless it is no longer the one judged stale (another run took
        it over in between: put that run's back). True when it was removed."""
        aside = self.path.with_name(f"{LOCK_NAME}.stale-{os.getpid()}")
        try:
            os.replace(self.path, aside)
        except FileNotFoundError:
            return False
        if read_or_none(aside) == stale:
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
            if read_or_none(self.path) == self.content:
                self.path.unlink()
        except OSError:
            pass


def read_or_none(path: Path) -> bytes | None:
    """The bytes of the file at path; None where none can be read (never waiting on a FIFO)."""
    try:
        return read_file(path)
    except (OSError, ReadFailed):
        return None
