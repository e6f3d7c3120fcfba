"""Clocks on the device's timeline: CUDA events on a GPU, which leave the work unsynchronised, else
perf_counter after a synchronisation (a no-op on a CPU, which runs each op to its end)."""

import time
from itertools import pairwise
from typing import Any

import torch

from nanogpt_perf.runtime import Runtime

PHASES = ("data", "h2d", "forward", "backward", "optimizer")


class DeviceClock:
    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        self.cuda = runtime.device_type == "cuda"

    def now(self) -> Any:
        """A timestamp: a recorded CUDA event, or perf_counter's seconds."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        self.runtime.synchronize()
        return time.perf_counter()

    def ms(self, t0: Any, t1: Any) -> float:
        """Milliseconds from t0 to t1; for CUDA events, only once the device has passed t1
        (synchronise first)."""
        return t0.elapsed_time(t1) if self.cuda else (t1 - t0) * 1000


class PhaseClock(DeviceClock):
    """Milliseconds per phase of a training step, from the marks the step calls as each phase
    ends."""

    def start(self) -> None:
        self.marks = [("", self.now())]

    def mark(self, phase: str) -> None:
        self.marks.append((phase, self.now()))

    def durations(self) -> dict[str, float]:
        """Each phase's total since start(), summed over its repeats (micro-batches); after a
        synchronisation."""
        totals = dict.fromkeys(PHASES, 0.0)
        for (_, t0), (phase, t1) in pairwise(self.marks):
            totals[phase] += self.ms(t0, t1)
        return totals
