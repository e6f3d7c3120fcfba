"""torch.profiler over a few training steps: a Chrome trace and the most expensive ops."""

from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from nanogpt_perf.files import write_through_path


def step_profiler(
    device: torch.device, trace_path: Path, wait: int = 1, warmup: int = 1, active: int = 3
) -> torch.profiler.profile:
    """A torch.profiler that skips `wait` steps, warms up for `warmup`, records `active` (one call
    to its step() per training step), then writes a Chrome trace to trace_path and prints the 20
    most expensive ops."""
    cuda = device.type == "cuda"

    def on_trace_ready(prof: profile) -> None:
        write_through_path(trace_path, lambda tmp: prof.export_chrome_trace(str(tmp)))
        sort_by = "self_device_time_total" if cuda else "self_cpu_time_total"
        print(prof.key_averages().table(sort_by=sort_by, row_limit=20))
        print(
            f"profile: Chrome trace written to {trace_path} (open it in https://ui.perfetto.dev)",
            flush=True,
        )

    return profile(
        activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []),
        schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
        on_trace_ready=on_trace_ready,
    )
