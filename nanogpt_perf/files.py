"""Files and folders written for a user, atomically: into a temporary name beside the target,
flushed to disk, then renamed over it (a folder is swapped in whole). A crash, a kill or a full disk
at any moment leaves the previous file whole (or none), never half of a new one.

A temporary name is hidden and says whose it is: .NAME.tmp-HOST-PID-RANDOM, unique to its writer. A
failed write removes its own; one that a killed writer left is removed by the next write of the same
target, once its writer is gone. A write that fails on the disk (full, read-only, a folder in the
way) raises WriteFailed, a UserError: one line naming the file.

A file a user controls is read through open_file (or read_file): what is no regular file (a folder,
a FIFO, a socket, a device, a link to nothing) raises ReadFailed, one line naming it, and is never
waited on (a FIFO's plain open waits for a writer forever)."""

import ctypes
import errno
import io
import json
import os
import re
import shutil
import socket
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, BinaryIO

from nanogpt_perf.errors import UserError

# a new file or folder being written; an old folder moved aside for a moment
TEMP, ASIDE = ".tmp-", ".old-"
REASONS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EISDIR: "it is a folder",
    errno.ENOTDIR: "a part of its path is a file, not a folder",
    errno.EEXIST: "a part of its path is a file, not a folder",
    errno.ENAMETOOLONG: "its name is too long",
    errno.ELOOP: "its links form a loop",
}
KINDS = {stat.S_IFREG: "a file", stat.S_IFDIR: "a folder", stat.S_IFIFO: "a FIFO (a named pipe)"}
KINDS |= {stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a device", stat.S_IFBLK: "a device"}
MISSING = "missing"


class WriteFailed(UserError):
    """A file or folder the disk would not take; what was there before is as it was: 'cannot write
    PATH: REASON; ...'."""

    def __init__(self, path: Path, error: OSError, existed: bool):
        self.path, self.error = path, error
        self.reason = REASONS.get(error.errno, error.strerror or str(error))
        kept = f"the previous {path.name} is as it was" if existed else "nothing was written"
        super().__init__(f"cannot write {path}: {self.reason}; {kept}")


class ReadFailed(UserError):
    """A file that cannot be read as one: '[what ]PATH WHY', WHY ('why') as 'is a FIFO (a named
    pipe), not a file', 'is missing' (missing: nothing at all is there) or 'cannot be read: ...'."""

    def __init__(self, path: Path, kind: str, what: str = "", error: Exception | None = None):
        if error is not None and kind == "a file":  # there, but the OS refuses it
            self.why = f"cannot be read: {REASONS.get(getattr(error, 'errno', None), error)}"
        else:
            self.why = f"is {kind}, not a file" if kind in KINDS.values() else f"is {kind}"
        self.missing = kind == MISSING
        super().__init__(f"{what} {path} {self.why}".lstrip())


def file_kind(path: Path | str) -> str:
    """What is at path, links followed: 'a file', 'a folder', 'a FIFO (a named pipe)', 'a socket',
    'a device', 'a link to nothing', 'missing', or why it cannot be seen. Nothing is opened."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a link to nothing" if os.path.islink(path) else MISSING
    except (OSError, ValueError) as e:  # a loop of links, a folder not to be looked in, a NUL
        return f"out of reach ({REASONS.get(getattr(e, 'errno', None), e)})"
    return KINDS.get(stat.S_IFMT(mode), "no file")


def regular_fd(path: Path, flags: int, what: str = "") -> int:
    """os.open(path, flags) where path is a regular file (links followed), else ReadFailed naming
    what is there; an OSError of the open itself is the caller's. Never blocks: opened without
    waiting for a FIFO's other end, then judged by what was opened (no race with the name)."""
    fd = os.open(path, flags | os.O_NONBLOCK, 0o666)
    kind = KINDS.get(stat.S_IFMT(os.fstat(fd).st_mode), "no file")
    if kind != "a file":
        os.close(fd)
        raise ReadFailed(path, kind, what)
    os.set_blocking(fd, True)
    return fd


def open_file(path: Path, what: str = "") -> BinaryIO:
    """path opened for reading where it is a regular file, else ReadFailed naming what is there
    (what: the file's role in the line, 'checkpoint'); never waits on a FIFO (regular_fd)."""
    try:
        fd = regular_fd(path, os.O_RDONLY, what)
    except (OSError, ValueError) as e:  # a socket refuses to open (ENXIO); a NUL in the name
        raise ReadFailed(path, file_kind(path), what, e) from None
    return os.fdopen(fd, "rb")


def read_file(path: Path, what: str = "") -> bytes:
    """The bytes of a regular file at path, or ReadFailed (open_file)."""
    with open_file(path, what) as f:
        return f.read()


def read_user_text(path: Path, what: str) -> str:
    """The UTF-8 text of a file the user named (what it is: 'the prompt file'), or a UserError
    saying why not: not found, no file (a folder; a FIFO, never waited on), not UTF-8."""
    try:
        with open_file(path, what) as f:
            return io.TextIOWrapper(f, encoding="utf-8").read()  # newlines as read_text reads them
    except ReadFailed as e:
        raise UserError(f"{what} {path} is not found" if e.missing else str(e)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{what} {path} cannot be read as UTF-8 text: {e}") from None


def write_atomically(
    path: Path, write: Callable[[IO[bytes]], None], follow_links: bool = True
) -> None:
    """write(f) into a temporary file beside path, then fsync and rename it to path. A link at path
    is written through (the file it names is replaced, the link kept), or with follow_links=False
    replaced by the file."""

    def fill(f: IO[bytes], tmp: Path) -> None:
        write(f)
        f.flush()
        os.fsync(f.fileno())

    _commit_file(path, fill, follow_links)


def write_through_path(
    path: Path, write: Callable[[Path], None], follow_links: bool = True
) -> None:
    """write_atomically for a writer that takes a file name (torch.profiler's trace, tarfile):
    write(tmp) makes the file at tmp, a temporary name beside path."""

    def fill(f: IO[bytes], tmp: Path) -> None:
        f.close()
        write(tmp)
        sync_file(tmp)

    _commit_file(path, fill, follow_links)


def write_bytes(path: Path, data: bytes) -> None:
    write_atomically(path, lambda f: f.write(data))


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: Path, data: Any, indent: int = 2) -> None:
    write_text(path, json.dumps(data, indent=indent) + "\n")


def _commit_file(
    path: Path, fill: Callable[[IO[bytes], Path], None], follow_links: bool = True
) -> None:
    shown, link = path, follow_links and os.path.islink(path)
    path = Path(os.path.realpath(path)) if link else Path(path)  # a link stays one
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_leftovers(path)
        mode = (
            path.stat().st_mode & 0o7777
            if path.is_file() and not path.is_symlink()
            else 0o666 & ~umask()
        )
        fd, name = tempfile.mkstemp(prefix=temp_prefix(path, TEMP), dir=path.parent)
    except OSError as e:
        raise WriteFailed(shown, e, existed) from None
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)  # mkstemp's 0600, else: the mode a plain open() would give
            fill(f, tmp)
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if (os_error := os_error_in(e)) is not None:
            raise WriteFailed(shown, os_error, existed) from e
        raise
    sync_folder(path.parent)


def replace_folder(path: Path, fill: Callable[[Path], None]) -> None:
    """fill(tmp) writes a whole new folder at tmp, a temporary name beside path; it is then flushed
    to disk and takes path's place at once, and the previous folder at path (if any) is deleted."""
    # a link to a folder: the folder is replaced, the link kept
    shown, path = path, Path(os.path.realpath(path))
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_leftovers(path)
        tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(path, TEMP), dir=path.parent))
        os.chmod(tmp, 0o777 & ~umask())  # mkdtemp's 0700, else
    except OSError as e:
        raise WriteFailed(shown, e, existed) from None
    try:
        fill(tmp)
        sync_tree(tmp)
        if not existed:
            os.rename(tmp, path)
        # where there is no atomic swap: aside, in; remove_leftovers undoes a kill
        elif not exchange(tmp, path):
            aside = tmp.with_name(tmp.name.replace(TEMP, ASIDE, 1))
            os.rename(path, aside)
            os.rename(tmp, path)
            tmp = aside
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if (os_error := os_error_in(e)) is not None:
            raise WriteFailed(shown, os_error, existed) from e
        raise
    sync_folder(path.parent)
    shutil.rmtree(tmp, ignore_errors=True)  # the previous folder, now under the temporary name


# ------------------------------------------------------------------ temporary names and leftovers


def this_host() -> str:
    return re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname()) or "host"


def temp_prefix(path: Path, kind: str) -> str:
    return f".{path.name}{kind}{this_host()}-{os.getpid()}-"


def remove_leftovers(path: Path) -> None:
    """Remove the temporary files and folders of path that writers on this machine, gone now, left
    behind; a previous folder left aside while path was swapped is put back if path is missing."""
    for kind in (TEMP, ASIDE):
        for leftover in path.parent.glob(f".{glob_escape(path.name)}{kind}*"):
            # HOST-PID(-RANDOM)
            host_pid = leftover.name[len(path.name) + 1 + len(kind) :].rpartition("-")[0]
            host, _, pid = host_pid.rpartition("-")
            ours = host == this_host() and pid.isascii() and pid.isdigit()
            if not ours or process_alive(int(pid)):
                continue  # another machine's (on a shared file system), or a writer still at work
            if kind == ASIDE and not path.exists():
                os.rename(leftover, path)
            elif leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # a pid beyond a C int's range is no process's
        return False
    except OSError:  # another user's: alive
        return True
    return True


def host_memory_bytes() -> int | None:
    """This machine's physical memory, where the OS tells it."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system
        return None


# ----------------------------------------------------------------------------- the disk


def os_error_in(error: BaseException) -> OSError | None:
    """The OSError that caused error, itself or in its chain (torch.save turns a failed write into a
    RuntimeError)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def sync_file(path: Path) -> None:
    """fsync a file written by name (by another writer than ours)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_folder(folder: Path) -> None:
    """fsync a folder, so that a rename in it survives a crash; best effort (some file systems
    refuse)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def sync_tree(folder: Path) -> None:
    """fsync every file and folder under folder, and folder itself."""
    for root, _, names in os.walk(folder):
        for name in names:
            sync_file(Path(root, name))
        sync_folder(Path(root))


def exchange(a: Path, b: Path) -> bool:
    """Swap the names a and b at once (Linux's renameat2 with RENAME_EXCHANGE); False where it
    cannot."""
    if sys.platform != "linux":
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # a C library without it
        return False
    renameat2.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):  # a kernel or file system without it
        return False
    raise OSError(code, os.strerror(code), str(b))


_umask: int | None = None


def umask() -> int:
    """This process's umask, read without changing it where Linux says it (changing it would race
    other threads)."""
    global _umask
    if _umask is None:
        try:
            line = next(
                s
                for s in Path("/proc/self/status").read_text().splitlines()
                if s.startswith("Umask:")
            )
            _umask = int(line.split()[1], 8)
        except (OSError, StopIteration, ValueError, IndexError):
            _umask = os.umask(0o022)
            os.umask(_umask)
    return _umask
