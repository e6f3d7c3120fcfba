"""bench.py's fit_memory_gb: the largest GPT of a family (n_layer x n_embd at the configuration's
aspect, its head size kept) whose training step fits a memory budget, each size measured by one step
(device memory on a GPU, the process's resident set on a CPU, each size in a fresh process there). A
size whose state alone (the formats' arithmetic) exceeds the budget is not built: a CPU would swap
or be killed rather than fail. A budget over the device's memory is refused."""

if __name__ == "__main__":  # run as a script, it would fail at its imports
    raise SystemExit("error: bench_fit.py is a module of bench.py: run bench.py (--help)")

import json
import math
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lab.bench_cases import Case, largest_fitting, most_tries
from lab.bench_measure import result
from nanogpt_perf.errors import UserError
from nanogpt_perf.optim import OPTIMIZERS
from nanogpt_perf.train.build import model_config

Row = dict[str, Any]


def family(case: Case, n_layer: int) -> Case:
    """case at n_layer layers, n_embd scaled with it (n_embd / n_layer kept, a multiple of the head
    size)."""
    s = case.settings
    head = s.n_embd // s.n_head
    n_embd = max(head, round(s.n_embd * n_layer / s.n_layer / head) * head)
    return case.but(
        f"n_layer={n_layer} n_embd={n_embd}", n_layer=n_layer, n_embd=n_embd, n_head=n_embd // head
    )


def parameters(case: Case) -> int:
    """A GPT's parameters from its shape, without building it: the blocks' matrices and the
    embeddings."""
    s = case.settings
    vocab = model_config(s, s.vocab_size).vocab_size
    return 12 * s.n_layer * s.n_embd**2 + (vocab + s.block_size) * s.n_embd


def state_bytes(case: Case) -> float:
    """The least bytes a GPT's training state takes by its formats: weights, gradients, and the
    optimizer's state of the blocks' matrices (its row of optim.OPTIMIZERS), which hold most
    parameters."""
    spec = case.settings.lowmem.applied(case.settings.optimizer)
    optimizer = OPTIMIZERS[case.settings.optimizer].state_bytes(spec, True)
    return parameters(case) * (spec.weight_bytes + spec.grad_bytes + optimizer)


def most_layers(case: Case, budget: float, limit: int = 512) -> int:
    """The most layers (at most limit) whose family member's state alone fits budget bytes: the
    search's bound. A larger one is never built: a CPU would swap or be killed rather than fail."""
    n = 0
    while n < limit and state_bytes(family(case, n + 1)) <= budget:
        n += 1
    return n


def largest_model(
    case: Case,
    budget: float,
    measure: Callable[[Case], Row],
    say: Callable[[str], None] = print,
    limit: int = 512,
) -> tuple[int, list[Row]]:
    """The most layers whose family member's process peak (memory['process_peak_bytes']) is within
    budget bytes (0 when none measured is), and every measured size's row. The sizes tried lie
    between 1 and most_layers, at most most_tries of them: say gets that bound as the search starts
    and a line for each size as it ends. A UserError where not even one layer's state fits."""
    bound = most_layers(case, budget, limit)
    if bound == 0:
        state = state_bytes(family(case, 1))
        raise UserError(f"not even n_layer=1 fits {budget / 1e9:g} GB: its state alone is about "
                        f"{state / 1e9:,.2g} GB by its formats")  # fmt: skip
    most, rows = most_tries(bound), []
    beyond = f"from n_layer={bound + 1} on, the state alone is over the budget"
    beyond = beyond if bound < limit else "the limit"
    say(f"searching n_layer=1 to {bound} ({beyond}): at most {most} sizes, one step each")

    def fits(n_layer: int) -> bool:
        rows.append(measure(family(case, n_layer)))
        say(f"[{len(rows)}/{most}] {row_line(rows[-1])}")
        peak = measured_peak(rows[-1])
        return peak is not None and peak <= budget

    return largest_fitting(fits, bound), rows


def measured_peak(row: Row) -> int | None:
    """What the process held at the peak of a measured step: what a budget must hold."""
    return (row.get("memory") or {}).get("process_peak_bytes") if row["status"] == "ok" else None


def row_line(row: Row) -> str:
    """A size's line: its process peak and peak rise (memory.memory_by_part), or why none."""
    peak = measured_peak(row)
    if peak is None:
        return f"{row['name']}: {row['status']}: {row['reason'] or 'no memory figure'}"
    rise = row["memory"].get("peak")
    rise = f" (peak rise {rise:.2f} B/param)" if rise is not None else ""
    return f"{row['name']}: process peak {peak / 1e9:,.2f} GB{rise}"


def check_budget(budget_gb: float, memory: int | None, device_type: str) -> None:
    """A UserError where a budget is over the device's memory (memory: its bytes, None where
    unknown): the search would build sizes the device cannot hold."""
    if memory is not None and budget_gb * 1e9 > memory:
        where = "this GPU" if device_type == "cuda" else "this machine"
        raise UserError(
            f"fit_memory_gb={budget_gb:g} is over {where}'s memory ({memory / 1e9:,.1f} GB): "
            f"give at most {math.floor(memory / 1e8) / 10:g}, less what else runs there"
        )


def bench_row(args: list[str], env: dict[str, str] | None = None) -> Row | str:
    """bench.py's first row of a run with args (its path first) in a fresh process, or the last
    line the run said where it failed."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "row.json"
        cmd = [sys.executable, *args, f"--out_json={out}"]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if done.returncode != 0 or not out.is_file():
            said = (done.stderr or done.stdout).strip().splitlines()
            return said[-1] if said else f"exit code {done.returncode}"
        return json.loads(out.read_text())["results"][0]


def in_a_fresh_process(argv: list[str]) -> Callable[[Case], Row]:
    """A CPU's measurement of one size: bench.py again (argv: this run's command line) with the size
    and one step, in a fresh process. A process keeps the pages an earlier, larger size freed, so in
    one process a later size's peak over its baseline came out low, and its resident set's peak
    could not be reset everywhere."""

    def measure(member: Case) -> Row:
        s = member.settings
        size = [f"--n_layer={s.n_layer}", f"--n_embd={s.n_embd}", f"--n_head={s.n_head}"]
        row = bench_row([*argv, *size, "--fit_memory_gb=0", "--steps=1", "--burn_in=1"])
        return (
            result(member, "failed", row) if isinstance(row, str) else row | {"name": member.name}
        )

    return measure
