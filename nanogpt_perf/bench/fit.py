"""bench.py's fit_memory_gb: the largest GPT of a family (n_layer x n_embd at the configuration's aspect, its head
size kept) whose training step fits a memory budget, each size measured by one step (device memory on a GPU, the
process's resident set on a CPU, each size in a fresh process there). A size whose state alone (the formats'
arithmetic) exceeds the budget is not built: a CPU would swap or be killed rather than fail."""

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nanogpt_perf.bench.cases import Case, largest_fitting
from nanogpt_perf.bench.measure import result
from nanogpt_perf.train.build import model_config

Row = dict[str, Any]


def family(case: Case, n_layer: int) -> Case:
    """case at n_layer layers, n_embd scaled with it (n_embd / n_layer kept, a multiple of the head size)."""
    s = case.settings
    head = s.n_embd // s.n_head
    n_embd = max(head, round(s.n_embd * n_layer / s.n_layer / head) * head)
    return case.but(f"n_layer={n_layer} n_embd={n_embd}", n_layer=n_layer, n_embd=n_embd, n_head=n_embd // head)


def parameters(case: Case) -> int:
    """A GPT's parameters from its shape, without building it: the blocks' matrices and the embeddings."""
    s = case.settings
    vocab = model_config(s, s.vocab_size).vocab_size
    return 12 * s.n_layer * s.n_embd**2 + (vocab + s.block_size) * s.n_embd


def state_floor(case: Case) -> float:
    """Bytes per parameter the state takes at the least by its formats: weights, gradients, optimizer state."""
    s = case.settings
    weight = 2 if s.weights_dtype == "bfloat16" else 4
    grads = 0 if s.in_backward else weight
    if s.optimizer == "muon":
        optimizer = {"float32": 4, "bfloat16": 2, "8bit": 1}[s.muon_momentum_dtype]
    else:
        optimizer = 2 * weight if s.state_bits == 32 else s.state_bits / 4
    return weight + grads + optimizer


def largest_model(case: Case, budget: float, measure: Callable[[Case], Row], limit: int = 512) -> tuple[int, list]:
    """The most layers (at most limit) whose family member's step peaks within budget bytes, and every size's row
    (measured, or skipped by the arithmetic); 0 when not one layer fits."""
    rows: list[Row] = []

    def fits(n_layer: int) -> bool:
        member = family(case, n_layer)
        floor = parameters(member) * state_floor(member)
        if floor > budget:
            rows.append(result(member, "skipped", f"its state alone is about {floor / 1e9:,.1f} GB"))
            return False
        row = measure(member)
        rows.append(row)
        peak = (row.get("memory") or {}).get("step_peak_bytes")
        return row["status"] == "ok" and peak is not None and peak <= budget

    return largest_fitting(fits, limit), rows


def in_a_fresh_process(argv: list[str]) -> Callable[[Case], Row]:
    """A CPU's measurement of one size: bench.py again (argv: this run's command line) with the size and one step,
    in a fresh process. A process keeps the pages an earlier, larger size freed, so in one process a later size's
    peak over its baseline came out low, and its resident set's peak could not be reset everywhere."""

    def measure(member: Case) -> Row:
        s = member.settings
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "size.json"
            size = [f"--n_layer={s.n_layer}", f"--n_embd={s.n_embd}", f"--n_head={s.n_head}"]
            one = ["--fit_memory_gb=0", "--steps=1", "--burn_in=1", f"--out_json={out}"]
            done = subprocess.run([sys.executable, *argv, *size, *one], capture_output=True, text=True)
            if done.returncode != 0 or not out.is_file():
                lines = (done.stderr or done.stdout).strip().splitlines() or [f"exit code {done.returncode}"]
                return result(member, "failed", lines[-1])
            return json.loads(out.read_text())["results"][0] | {"name": member.name}

    return measure
