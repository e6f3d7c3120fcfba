"""Stopping when asked: SIGTERM (what schedulers and spot instances send before they kill) or a
first Ctrl-C asks the run to finish its step, save and exit; a second Ctrl-C exits at once. The
command that resumes the run is printed, shell-quoted, to be run as printed."""

import os
import shlex
import signal
import sys
from collections.abc import Callable, Mapping
from types import FrameType

import torch
import torch.distributed as dist


class StopRequest:
    """Installs the handlers; requested(ddp) says whether any rank has been asked to stop (under DDP
    every rank must agree before they save together, so it is an all-reduce: call it on every rank
    at the same step). before_exit runs before a second Ctrl-C ends the process at once (os._exit
    runs no atexit handlers): the out_dir lock's release."""

    def __init__(self, before_exit: Callable[[], None] | None = None) -> None:
        self.signal: str | None = None
        self.before_exit = before_exit
        signal.signal(signal.SIGTERM, self.handle)
        signal.signal(signal.SIGINT, self.handle)

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and self.signal == "SIGINT":
            print("\nsecond Ctrl-C: exiting now, without saving", file=sys.stderr, flush=True)
            if self.before_exit:
                self.before_exit()
            os._exit(130)
        self.signal = signal.Signals(signum).name
        more = " (Ctrl-C again to exit at once)" if signum == signal.SIGINT else ""
        print(
            f"\n{self.signal}: finishing this step, then saving and exiting{more}",
            file=sys.stderr,
            flush=True,
        )

    def requested(self, ddp: bool, device: torch.device) -> bool:
        if not ddp:
            return self.signal is not None
        flag = torch.tensor([self.signal is not None], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def resume_command(argv: list[str], environ: Mapping[str, str]) -> str:
    """The command that resumes this run, shell-quoted (an out_dir with a space or a quote
    survives): the same script, config files and flags, without init_from and overwrite, and
    --init_from=resume last (flags apply in order: it overrides a config file's init_from).

    The interpreter is sys.executable, not 'python': that name may run another interpreter, without
    torch (a virtual environment not activated in the shell that resumes, a scheduler's job script),
    or none at all (where there is only python3). Under torchrun (its workers have
    LOCAL_WORLD_SIZE), torchrun itself, run as the module it is (torch.distributed.run) under that
    interpreter, with as many processes per node; on several nodes, the rendezvous flags are the
    user's to add on each node."""
    flags = [a for a in argv[1:] if not a.startswith(("--init_from=", "--overwrite="))]
    launcher = [sys.executable]
    if "LOCAL_WORLD_SIZE" in environ:
        nodes = int(environ["WORLD_SIZE"]) // int(environ["LOCAL_WORLD_SIZE"])
        where = "--standalone" if nodes == 1 else f"--nnodes={nodes}"
        launcher += [
            "-m",
            "torch.distributed.run",
            where,
            f"--nproc_per_node={environ['LOCAL_WORLD_SIZE']}",
        ]
    return shlex.join([*launcher, argv[0], *flags, "--init_from=resume"])


def stopped_line(
    signal_name: str | None, iter_num: int, saved: str | None, resumable: bool, command: str
) -> str:
    """What a stopped run prints last: what was saved, and the command that resumes it (when
    anything can)."""
    why = f"stopped by {signal_name or 'another rank'} after iter {iter_num}"
    if saved:
        return f"{why}, saved {saved}: resume with\n  {command}"
    if resumable:
        return f"{why}, not saved: resume from the last checkpoint with\n  {command}"
    return f"{why}, before any checkpoint: nothing to resume (start it again)"
