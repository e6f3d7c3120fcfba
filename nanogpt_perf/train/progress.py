"""How a run reports its progress: the timing of each logging window, the ETA, and the records that
go to stdout, out_dir/log.jsonl and wandb (rank 0 only).

A window is timed between device synchronisations and leaves out evals and checkpoint writes
(restart() after them); within it a clock on the device's timeline times the training steps alone,
so that what the loop adds around them (logging, the schedule, Python) is a figure of its own. The
first step, which compiles, is reported alone and left out of the run's closing median and of the
ETA."""

import errno
import json
import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO

from nanogpt_perf.errors import UserError
from nanogpt_perf.files import REASONS, ReadFailed, regular_fd
from nanogpt_perf.runtime import Runtime
from nanogpt_perf.timing import DeviceClock


def hms(seconds: float) -> str:
    minutes, s = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{s:02d}" if minutes >= 60 else f"{minutes}:{s:02d}"


class Progress:
    def __init__(self, runtime: Runtime, start_iter: int, max_iters: int, tokens_per_iter: int):
        self.runtime, self.clock = runtime, DeviceClock(runtime)
        self.start_iter, self.max_iters, self.tokens_per_iter = (
            start_iter,
            max_iters,
            tokens_per_iter,
        )
        # (time, iter) after the first step
        self.run_start, self.steady_since = time.perf_counter(), None
        # (ms/iter, step ms, data wait ms), first step aside
        self.windows: list[tuple[float, float, float]] = []
        self.restart()

    def elapsed(self) -> float:
        """Seconds since the run started."""
        return time.perf_counter() - self.run_start

    def restart(self) -> None:
        """A new window from now: what happened since the last one closed (an eval, a checkpoint) is
        left out."""
        self.window_start, self.steps, self.spans = time.perf_counter(), 0, []

    @contextmanager
    def step(self) -> Iterator[None]:
        """Time one training step on the device's clock."""
        t0 = self.clock.now()
        yield
        self.spans.append((t0, self.clock.now()))
        self.steps += 1

    def window(self, iter_num: int, wait_seconds: float) -> dict[str, float]:
        """Close the window that ends at iter_num (waiting for the device first): its figures per
        iteration, with wait_seconds the steps spent waiting for data, the time since the run
        started and the ETA."""
        self.runtime.synchronize()
        now = time.perf_counter()
        dt = (now - self.window_start) / self.steps
        step_ms = sum(self.clock.ms(a, b) for a, b in self.spans) / self.steps
        wait_ms = wait_seconds * 1000 / self.steps
        if iter_num > self.start_iter + 1:
            self.windows.append((dt * 1000, step_ms, wait_ms))
        self.steady_since = self.steady_since or (now, iter_num)
        since, at = self.steady_since
        rate = (now - since) / (iter_num - at) if iter_num > at else dt
        # this window's logging counts in the next
        self.window_start, self.steps, self.spans = now, 0, []
        return {
            "ms_per_iter": dt * 1000,
            "step_ms": step_ms,
            "data_wait_ms": wait_ms,
            "tokens_per_s": self.tokens_per_iter / dt,
            "elapsed_s": now - self.run_start,
            "eta_s": rate * (self.max_iters - iter_num),
        }

    def summary(self) -> str | None:
        """The run's closing line: the median window, the step's share, the data wait's and the
        loop's."""
        if not self.windows:
            return None
        ms, in_step, wait = (statistics.median(w[i] for w in self.windows) for i in range(3))
        around = statistics.median(t - s for t, s, _ in self.windows)
        return (
            f"timing: median {ms:.2f} ms/iter over {len(self.windows)} logging windows (the first "
            "step left out, "
            f"{self.tokens_per_iter / ms * 1000:,.0f} tok/s): the training step {in_step:.2f} ms "
            "(of which waiting "
            f"for data {wait:.3f} ms, {wait / in_step:.1%}), the loop around it {around:.2f} ms "
            "(logging, the "
            "schedule, Python)"
        )


def import_wandb(wandb_log: bool, master: bool) -> ModuleType | None:
    """wandb, where wandb_log asks for it (rank 0): imported before the run writes anything (the
    last check)."""
    if not (wandb_log and master):
        return None
    try:
        import wandb
    except ImportError:
        raise UserError(
            "wandb_log=True needs wandb: pip install wandb (WANDB_MODE=offline works with no "
            "network)"
        ) from None
    return wandb


class RunLog:
    """The records of a run: printed, appended to out_dir/log.jsonl and sent to wandb
    (import_wandb's) when asked; on rank 0 only (master=False: nothing at all).

    Each record is appended whole or not at all: one write of its line, and where the disk will not
    take it the file is cut back to its last whole line and the error is one line (naming the last
    checkpoint). A torn line that a killed run left at the end is cut away when the log is opened
    again."""

    def __init__(
        self, out_dir: Path, master: bool, wandb: ModuleType | None, wandb_run: dict[str, Any]
    ):
        self.out_dir, self.path, self.file = out_dir, out_dir / "log.jsonl", None
        if master:
            try:
                self.file = open_log(self.path)
                cut_torn_line(self.file.fileno())
            except OSError as e:
                raise UserError(
                    f"cannot append to {self.path}: {REASONS.get(e.errno, e.strerror or e)}"
                ) from None
        self.wandb = wandb
        if wandb is not None:
            wandb.init(**wandb_run)

    def write(self, record: dict[str, Any]) -> None:
        if self.file is None:
            return
        line = (json.dumps(record) + "\n").encode()
        fd = self.file.fileno()
        end = os.fstat(fd).st_size
        try:
            if self.file.write(line) != len(line):  # a short write: the disk filled up within it
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as e:
            try:
                os.ftruncate(fd, end)
            except OSError:
                pass
            raise UserError(
                f"cannot append to {self.path}: {REASONS.get(e.errno, e.strerror or e)}; the log "
                "ends at its last "
                f"whole record; {newest_checkpoint(self.out_dir)}"
            ) from None
        if self.wandb:
            self.wandb.log(record, step=record["iter"])

    def eval(self, iter_num: int, losses: dict[str, float], lr: float, elapsed_s: float) -> None:
        if self.file is not None:
            print(
                f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}",
                flush=True,
            )
        record = {
            "train_loss": losses["train"],
            "val_loss": losses["val"],
            "lr": lr,
            "elapsed_s": elapsed_s,
        }
        self.write({"iter": iter_num, **record})

    def step(self, iter_num: int, figures: dict[str, Any], first: bool) -> None:
        """A logging window's line: figures has step_loss, lr, grad_norm, mfu, peak_mem_bytes and
        Progress's."""
        self.write({"iter": iter_num, **figures})
        if self.file is None:
            return
        f, mfu = figures, figures["mfu"]
        print(
            f"iter {iter_num}: step loss {f['step_loss']:.4f}, {f['ms_per_iter']:.2f} ms/iter, "
            f"{f['tokens_per_s']:,.0f} tok/s, MFU {'n/a' if mfu is None else f'{mfu * 100:.2f}%'}, "
            f"peak mem {(f['peak_mem_bytes'] or 0) / 2**20:.0f} MiB, grad norm "
            f"{f['grad_norm']:.3f}, "
            f"data wait {f['data_wait_ms']:.2f} ms, elapsed {hms(f['elapsed_s'])}, ETA "
            f"{hms(f['eta_s'])}"
            + (" (first step: includes compilation and warm-up)" if first else ""),
            flush=True,
        )

    def hellaswag(self, iter_num: int, result: dict[str, Any]) -> None:
        if self.file is not None:
            print(
                f"step {iter_num}: HellaSwag acc {result['acc']:.4f}, acc_norm "
                f"{result['acc_norm']:.4f} "
                f"({result['examples']:,} examples)",
                flush=True,
            )
        figures = {f"hellaswag_{k}": result[k] for k in ("acc", "acc_norm", "examples")}
        self.write({"iter": iter_num, **figures})

    def skipped(self, iter_num: int, loss: float, grad_norm: float, in_a_row: int) -> None:
        if self.file is not None:
            print(
                f"iter {iter_num}: non-finite loss or gradient norm, update skipped ({in_a_row} in "
                "a row)"
            )
        self.write({"iter": iter_num, "skipped": True, "loss": loss, "grad_norm": grad_norm})

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def open_log(path: Path) -> BinaryIO:
    """path opened to append to, unbuffered (a record is one write(2)); a UserError where it is no
    regular file: a FIFO is opened without waiting, then refused (its writes would block once its
    buffer is full), as is a device or a socket."""
    try:
        fd = regular_fd(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
    except ReadFailed as e:
        raise UserError(f"cannot append to {path}: it {e.why}") from None
    return os.fdopen(fd, "a+b", buffering=0)


def cut_torn_line(fd: int) -> None:
    """Cut a file back to its last whole line (one ending in a newline), where a killed writer left
    half of one."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return
    start = max(size - 2**20, 0)  # a record is far shorter than a MiB
    tail = os.pread(fd, size - start, start)
    os.ftruncate(fd, start + tail.rfind(b"\n") + 1 if b"\n" in tail else start)


def newest_checkpoint(out_dir: Path) -> str:
    """Where a run that stops on a full disk can resume from."""
    if (out_dir / "ckpt.pt").is_file():
        return f"the last checkpoint is {out_dir / 'ckpt.pt'}"
    return f"no checkpoint was saved in {out_dir} yet"


def nonfinite_end(
    bad_steps: int, iter_num: int, out_dir: Path, max_bad_steps: int | None = None
) -> str:
    """The line of a run that stops on max_bad_steps non-finite steps in a row (or, max_bad_steps
    None, that ends on some), with where it left its last good state: the newest checkpoint, or
    none."""
    if max_bad_steps is None:
        why = f"the run ended at iter {iter_num} on {bad_steps} non-finite steps, unsaved"
    else:
        why = f"{bad_steps} steps in a row with a non-finite loss or gradient norm "
        why += f"(max_bad_steps={max_bad_steps})"
        why += f": stopped at iter {iter_num}"
    if (out_dir / "ckpt.pt").is_file():
        return f"{why}; the last checkpoint, {out_dir / 'ckpt.pt'}, is from before them"
    return f"{why}; no checkpoint was saved in {out_dir}"
