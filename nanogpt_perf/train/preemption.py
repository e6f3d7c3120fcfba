"""Stopping when asked: SIGTERM (what schedulers and spot instances send before they kill) or a first Ctrl-C asks
the run to finish its step, save and exit; a second Ctrl-C exits at once."""

import os
import signal
import sys
from types import FrameType

import torch
import torch.distributed as dist


class StopRequest:
    """Installs the handlers; requested(ddp) says whether any rank has been asked to stop (under DDP every rank
    must agree before they save together, so it is an all-reduce: call it on every rank at the same step)."""

    def __init__(self) -> None:
        self.signal: str | None = None
        signal.signal(signal.SIGTERM, self.handle)
        signal.signal(signal.SIGINT, self.handle)

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and self.signal == "SIGINT":
            print("\nsecond Ctrl-C: exiting now, without saving", file=sys.stderr, flush=True)
            os._exit(130)
        self.signal = signal.Signals(signum).name
        more = " (Ctrl-C again to exit at once)" if signum == signal.SIGINT else ""
        print(f"\n{self.signal}: finishing this step, then saving and exiting{more}", file=sys.stderr, flush=True)

    def requested(self, ddp: bool, device: torch.device) -> bool:
        if not ddp:
            return self.signal is not None
        flag = torch.tensor([self.signal is not None], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
