"""An out_dir belongs to one run: its lock (nanogpt_perf/guard/lock.py) and the checks around it.

A scratch run (init_from=scratch, GPT-2's weights or a transformers folder, eval_only alike) into an
out_dir that holds checkpoints is refused unless overwrite=True, which deletes the earlier run's
checkpoints and log first: kept, they would mix with the new run's (keep_last keeps the highest
iterations, whichever run wrote them, and ckpt.pt and ckpt-best.pt would point at either).

admit_out_dir writes nothing but a probe it removes at once (the one sure test that a folder can be
written: /proc, a read-only mount or a full quota pass os.access); claim_out_dir
(train/checkpoint.py) checks again under the lock, where a run admitted beside another that has
since used the out_dir is refused.

An out_dir that is a link to a folder elsewhere is taken as that folder (a link to a larger disk is
common); the checkpoints in it are files of its own, never written through a link
(train/checkpoint.py).

Where a run reads or writes a file (its checkpoints, records and lock), anything else (a folder, a
FIFO, a link to nothing) is refused, naming it: read, a FIFO would block the run for ever; written
over, it would be lost, or fail once the run has trained."""

import errno
import os
import tempfile
from pathlib import Path

from nanogpt_perf.errors import UserError
from nanogpt_perf.files import REASONS, file_kind
from nanogpt_perf.guard.checkpoint import saved_iterations
from nanogpt_perf.guard.lock import LOCK_NAME, check_lock, read_holder

# what a run leaves in out_dir besides its checkpoints, deleted with them by overwrite=True
# (manifest.json is rewritten at the start of every run)
RUN_RECORDS = ("log.jsonl", "trace.json")
RUN_NAMES = ("ckpt.pt", "ckpt-best.pt", *RUN_RECORDS, "manifest.json")  # with the ckpt-NNNNNNN.pt


def run_checkpoints(out_dir: Path) -> list[Path]:
    """The checkpoints in out_dir: ckpt.pt (nanoGPT's only one), ckpt-best.pt and the
    ckpt-NNNNNNN.pt."""
    links = [out_dir / name for name in ("ckpt.pt", "ckpt-best.pt") if (out_dir / name).is_file()]
    return links + saved_iterations(out_dir)


def run_paths(out_dir: Path) -> list[Path]:
    """What out_dir holds of a run: its checkpoints and RUN_RECORDS."""
    return run_checkpoints(out_dir) + [
        out_dir / name for name in RUN_RECORDS if (out_dir / name).is_file()
    ]


def run_files(out_dir: Path) -> tuple[tuple[str, int, int, int], ...]:
    """run_paths(out_dir), each file by name, size, mtime and inode."""
    stats = ((p.name, p.stat()) for p in run_paths(out_dir))
    return tuple((name, s.st_size, s.st_mtime_ns, s.st_ino) for name, s in stats)


def check_unchanged(out_dir: Path, seen: tuple) -> None:
    """A UserError when out_dir's run files are not seen, run_files(out_dir) as train.py's start saw
    them."""
    if (now := run_files(out_dir)) != seen:
        changed = sorted({f[0] for f in set(now) ^ set(seen)})
        raise UserError(
            f"out_dir {out_dir} changed while this run was starting (another run wrote or removed "
            f"{', '.join(changed[:3])}): nothing was written; start it again"
        )


def admit_out_dir(out_dir: Path, scratch: bool, overwrite: bool, eval_only: bool) -> tuple:
    """What out_dir holds of a run (run_files) as this run is admitted, for check_unchanged under
    the lock; a UserError, before any work, where this run cannot use it: a file in its place, a
    folder it cannot write, a live run's lock, or (scratch) an earlier run's checkpoints without
    overwrite=True."""
    here = out_dir.absolute()
    existing = next(p for p in (here, *here.parents) if os.path.lexists(p))  # a link to nothing too
    if not existing.is_dir():
        kind = file_kind(existing)
        raise UserError(f"out_dir {out_dir} cannot be made: {existing} is {kind}, not a folder")
    try:  # a probe, removed at once
        os.rmdir(tempfile.mkdtemp(prefix=f".{LOCK_NAME}.probe-", dir=existing))
    except OSError as e:
        denied = e.errno in (errno.EACCES, errno.EPERM)
        reason = "is not writable" if denied else f"refuses it: {REASONS.get(e.errno, e.strerror)}"
        raise UserError(
            f"out_dir {out_dir} cannot be written ({existing} {reason}): choose another out_dir"
        ) from None
    check_run_names(out_dir)
    if os.path.lexists(out_dir / LOCK_NAME):
        check_lock(out_dir, read_holder(out_dir / LOCK_NAME)[1])
    if scratch and not overwrite:
        check_no_earlier_run(out_dir, eval_only)
    return run_files(out_dir)


def check_run_names(out_dir: Path) -> None:
    """A UserError naming the first of the names a run reads or writes that is there but no file."""
    names = [out_dir / name for name in RUN_NAMES] + saved_iterations(out_dir)
    for path in filter(os.path.lexists, names):
        if (kind := file_kind(path)) != "a file":
            raise UserError(
                f"{path} is {kind}, not a file: train.py reads and writes a file of that name in "
                "its out_dir; move it away, or choose another out_dir"
            )


def check_no_earlier_run(out_dir: Path, eval_only: bool) -> None:
    """A UserError when out_dir holds an earlier run's checkpoints, which a new run would mix with
    its own."""
    if not (found := run_checkpoints(out_dir)):
        return
    names = ", ".join(p.name for p in found[:3]) + (
        f" and {len(found) - 3} more" if len(found) > 3 else ""
    )
    # its records would join that run's; overwrite=True would delete that run to evaluate others
    if eval_only:
        raise UserError(
            f"out_dir {out_dir} holds an earlier run's checkpoints ({names}): evaluate other "
            "weights in another "
            "out_dir, or that run's with init_from=resume (overwrite=True would delete them)"
        )
    raise UserError(
        f"out_dir {out_dir} holds an earlier run's checkpoints ({names}): init_from=resume "
        "continues that run, "
        "overwrite=True replaces it (deleting its checkpoints and log), or choose another out_dir"
    )
