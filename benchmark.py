"""
The performance lab behind bench.py, importable for tests: time one configuration honestly, walk the ladder of
speed-ups from fp32 eager to every switch on, sweep a setting, break a step into phases, and write, chart and
compare the results.
"""

import csv
import gc
import json
import statistics
import time
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass, replace
from itertools import pairwise
from pathlib import Path
from typing import Any

import torch
from torch._dynamo.utils import counters
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from common import (
    Runtime,
    TokenBatches,
    die,
    peak_memory_bytes,
    peak_reserved_bytes,
    reset_peak_memory,
    resolve_runtime,
    round_up,
    step_profiler,
)
from model import GPT, GPTConfig

# -----------------------------------------------------------------------------
# configurations

SDPA_BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}
# the attention setting: the masked-softmax reference, SDPA choosing its kernel, or SDPA held to one kernel
ATTENTION = ("manual", "sdpa", *SDPA_BACKENDS)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass(frozen=True)
class Case:
    """One configuration to time: the model, the work per iteration and every performance switch."""

    name: str
    model: GPTConfig
    batch_size: int
    gradient_accumulation_steps: int = 1
    dtype: str = "float32"  # as common.resolve_runtime takes it, 'auto' included
    tf32: bool = False
    compile: bool = False
    compile_mode: str = "default"
    sdpa_backend: str = ""  # a key of SDPA_BACKENDS to hold SDPA to one kernel; '' lets PyTorch choose
    fused: bool = True  # fused AdamW, where the device has the kernel

    @property
    def attention(self) -> str:
        return self.sdpa_backend or self.model.attention

    @property
    def tokens_per_iter(self) -> int:
        return self.gradient_accumulation_steps * self.batch_size * self.model.block_size


def case_from_settings(s: dict[str, Any], name: str) -> Case:
    """The Case that bench.py's settings describe; ValueError says what is wrong with them."""
    for key in ("batch_size", "block_size", "gradient_accumulation_steps", "pad_vocab"):
        if s[key] < 1:
            raise ValueError(f"{key} must be >= 1, not {s[key]}")
    if s["attention"] not in ATTENTION:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION)}, not {s['attention']!r}")
    if s["compile_mode"] not in COMPILE_MODES:
        raise ValueError(f"compile_mode must be one of {', '.join(COMPILE_MODES)}, not {s['compile_mode']!r}")
    model = GPTConfig(
        block_size=s["block_size"],
        vocab_size=round_up(s["vocab_size"], s["pad_vocab"]),
        n_layer=s["n_layer"],
        n_head=s["n_head"],
        n_embd=s["n_embd"],
        dropout=s["dropout"],
        bias=s["bias"],
        attention="manual" if s["attention"] == "manual" else "sdpa",
        loss_chunk=s["loss_chunk"],
        activation_checkpointing=s["activation_checkpointing"],
    )
    return Case(
        name,
        model,
        batch_size=s["batch_size"],
        gradient_accumulation_steps=s["gradient_accumulation_steps"],
        dtype=s["dtype"],
        tf32=s["tf32"],
        compile=s["compile"],
        compile_mode=s["compile_mode"],
        sdpa_backend=s["attention"] if s["attention"] in SDPA_BACKENDS else "",
    )


def case_settings(case: Case) -> dict[str, Any]:
    m = case.model
    return {
        "batch_size": case.batch_size,
        "block_size": m.block_size,
        "gradient_accumulation_steps": case.gradient_accumulation_steps,
        "tokens_per_iter": case.tokens_per_iter,
        "n_layer": m.n_layer,
        "n_head": m.n_head,
        "n_embd": m.n_embd,
        "vocab_size": m.vocab_size,
        "dtype": case.dtype,
        "tf32": case.tf32,
        "compile": case.compile,
        "compile_mode": case.compile_mode if case.compile else None,
        "attention": case.attention,
        "fused": case.fused,
        "loss_chunk": m.loss_chunk,
        "activation_checkpointing": m.activation_checkpointing,
    }


# -----------------------------------------------------------------------------
# the ladder: each rung adds one switch to all the rungs before it


@dataclass(frozen=True)
class Rung:
    key: str  # its name in bench.py's skip_rungs
    name: str
    apply: Callable[[Case], Case]
    unavailable: Callable[[Case, torch.device], str | None] = lambda case, device: None  # why it cannot run here


def no_tf32(case: Case, device: torch.device) -> str | None:
    if device.type != "cuda":
        return "TF32 is CUDA only"
    if torch.cuda.get_device_capability(device)[0] < 8:
        return "TF32 needs an Ampere or newer GPU (compute capability 8.0)"
    return None


def no_bf16(case: Case, device: torch.device) -> str | None:
    return "this GPU has no bf16" if device.type == "cuda" and not torch.cuda.is_bf16_supported() else None


def no_compile(case: Case, device: torch.device) -> str | None:
    return None if torch._dynamo.is_dynamo_supported() else "torch.compile is not supported on this platform"


def no_fused_adamw(case: Case, device: torch.device) -> str | None:
    try:
        torch.optim.AdamW([torch.zeros(1, device=device, requires_grad=True)], fused=True)
    except RuntimeError:
        return f"no fused AdamW kernel on {device.type}"
    return None


def ladder_rungs(vocab_size: int, pad_vocab: int) -> list[Rung]:
    """From fp32 eager to every switch on, in the order of the story told for GPT-2 (124M) on an A100."""
    padded = round_up(vocab_size, pad_vocab)
    return [
        Rung("tf32", "+TF32", lambda c: replace(c, tf32=True), no_tf32),
        Rung("bf16", "+bf16 autocast", lambda c: replace(c, dtype="bfloat16"), no_bf16),
        Rung("compile", "+torch.compile", lambda c: replace(c, compile=True), no_compile),
        Rung("flash", "+flash attention", lambda c: replace(c, model=replace(c.model, attention="sdpa"))),
        Rung(
            "pad_vocab",
            f"+vocab padding ({vocab_size} -> {padded})",
            lambda c: replace(c, model=replace(c.model, vocab_size=padded)),
            lambda c, d: (
                f"vocab_size {vocab_size} is a multiple of {pad_vocab} already" if padded == vocab_size else None
            ),
        ),
        Rung("fused", "+fused AdamW", lambda c: replace(c, fused=True), no_fused_adamw),
    ]


def ladder_cases(
    case: Case, device: torch.device, pad_vocab: int, skip: Iterable[str] = ()
) -> list[tuple[Case, str | None]]:
    """Each rung's Case with the reason it is skipped (None to run it). The first rung is case with every switch
    off: fp32, eager, manual attention, case's vocab_size as it is, unfused AdamW. A skipped rung adds nothing to
    the rungs after it."""
    rungs, skip = ladder_rungs(case.model.vocab_size, pad_vocab), set(skip)
    unknown = set(skip) - {r.key for r in rungs}
    if unknown:
        raise ValueError(
            f"no rung {', '.join(sorted(unknown))} to skip; the rungs are {', '.join(r.key for r in rungs)}"
        )
    case = replace(
        case,
        name="fp32 eager",
        dtype="float32",
        tf32=False,
        compile=False,
        compile_mode="default",
        sdpa_backend="",
        fused=False,
        model=replace(case.model, attention="manual"),
    )
    cases: list[tuple[Case, str | None]] = [(case, None)]
    for rung in rungs:
        why_not = "left out by skip_rungs" if rung.key in skip else rung.unavailable(case, device)
        if why_not is None:
            case = rung.apply(case)
        cases.append((replace(case, name=rung.name), why_not))
    return cases


# -----------------------------------------------------------------------------
# sweeps

SWEEPS: dict[str, type | tuple[str, ...]] = {
    "batch_size": int,
    "block_size": int,
    "gradient_accumulation_steps": int,
    "compile_mode": COMPILE_MODES,
    "attention": ATTENTION,
}


def sweep_values(key: str, values: str) -> list[int | str]:
    """The comma-separated values of a sweep over the setting key, checked; ValueError says what is wrong."""
    if key not in SWEEPS:
        raise ValueError(f"cannot sweep {key!r}; sweep one of {', '.join(SWEEPS)}")
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not items:
        raise ValueError(
            f"sweep={key} needs values, e.g. --values={'1,2,4,8' if SWEEPS[key] is int else 'sdpa,manual'}"
        )
    if SWEEPS[key] is int:
        if not all(v.isdigit() and int(v) >= 1 for v in items):
            raise ValueError(f"{key} values must be whole numbers >= 1, not {values!r}")
        return [int(v) for v in items]
    bad = [v for v in items if v not in SWEEPS[key]]
    if bad:
        raise ValueError(f"{key} values must be among {', '.join(SWEEPS[key])}, not {', '.join(bad)}")
    return items


def largest_fitting(fits: Callable[[int], bool], limit: int) -> int:
    """The largest n <= limit for which fits(n), fits being true up to some n and false beyond: doubling from 1
    until it fails, then bisecting. 0 when not even 1 fits."""
    if not fits(1):
        return 0
    good = 1
    while good * 2 <= limit and fits(good * 2):
        good *= 2
    bad = min(good * 2, limit + 1)  # the smallest n known not to fit, or past the limit
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good


# -----------------------------------------------------------------------------
# measuring

PHASES = ("data", "h2d", "forward", "backward", "optimizer")


class SyntheticBatches(TokenBatches):
    """Random tokens made once, staged and copied to the device every step as TokenBatches does with real data."""

    def __init__(self, batch_size: int, block_size: int, vocab_size: int, device: torch.device, seed: int):
        self.device = device
        g = torch.Generator().manual_seed(seed)
        x, y = (torch.randint(vocab_size, (batch_size, block_size), generator=g) for _ in range(2))
        self.x, self.y = (x.pin_memory(), y.pin_memory()) if device.type == "cuda" else (x, y)

    def host_batch(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x, self.y


BatchSource = Callable[[int, int, torch.device], TokenBatches]  # (batch_size, block_size, device) -> batches


class PhaseClock:
    """Milliseconds between named marks on the device's timeline: CUDA events on a GPU, which leave the step
    unsynchronised, else perf_counter after a synchronisation (a no-op on the CPU, which runs each op to its end)."""

    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        self.cuda = runtime.device_type == "cuda"

    def now(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        self.runtime.synchronize()
        return time.perf_counter()

    def start(self) -> None:
        self.marks = [("", self.now())]

    def mark(self, phase: str) -> None:
        self.marks.append((phase, self.now()))

    def durations(self) -> dict[str, float]:
        """Each phase's total since start(), summed over its repeats (micro-batches); after a synchronisation."""
        totals = dict.fromkeys(PHASES, 0.0)
        for (_, t0), (phase, t1) in pairwise(self.marks):
            totals[phase] += t0.elapsed_time(t1) if self.cuda else (t1 - t0) * 1000
        return totals


def training_step(
    case: Case, model: GPT, optimizer: torch.optim.Optimizer, runtime: Runtime, batches: TokenBatches
) -> Callable[[Callable[[str], None]], None]:
    """step(mark): one optimizer step over the case's micro-batches, calling mark(phase) as each phase ends."""
    scaler = runtime.grad_scaler()
    train_model = torch.compile(model, mode=case.compile_mode) if case.compile else model
    backend = SDPA_BACKENDS.get(case.sdpa_backend)
    accum = case.gradient_accumulation_steps

    def step(mark: Callable[[str], None]) -> None:
        with sdpa_kernel(backend) if backend else nullcontext():
            for _ in range(accum):
                x, y = batches.host_batch("train")
                mark("data")
                x, y = batches.to_device(x, y)
                mark("h2d")
                with runtime.autocast_ctx():
                    _, loss = train_model(x, y)
                mark("forward")
                scaler.scale(loss / accum).backward()
                mark("backward")
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            mark("optimizer")

    return step


# the aten op that scaled_dot_product_attention dispatched to, as a profiler trace names it
SDPA_OPS = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "aten::_scaled_dot_product_efficient_attention": "memory-efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_attention_math_for_mps": "math (MPS)",
    "aten::_scaled_dot_product_fused_attention_overrideable": "fused (device backend)",
}


def sdpa_kernels(event_names: Iterable[str]) -> list[str]:
    """The SDPA kernels whose ops appear among a profiler trace's event names."""
    return sorted({SDPA_OPS[name] for name in event_names if name in SDPA_OPS})


def sdpa_kernel_that_ran(step: Callable, device: torch.device) -> str:
    """Run one step under torch.profiler and name the SDPA kernel its trace shows."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        step(lambda phase: None)
    return ", ".join(sdpa_kernels(e.name for e in prof.events())) or "none in the trace"


def dynamo_counts() -> dict[str, int]:
    return {
        "frames": counters["frames"]["total"],
        "graphs": counters["stats"]["unique_graphs"],
        "graph_breaks": sum(counters["graph_break"].values()),
    }


def percentile(values: list[float], pct: int) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[pct - 1]


FIGURES = (
    "precision",
    "ms_median",
    "ms_p90",
    "ms_min",
    "ms_max",
    "tokens_per_s",
    "mfu",
    "peak_mem_bytes",
    "peak_reserved_bytes",
    "first_iter_ms",
    "compile_s",
    "graphs",
    "recompiles",
    "graph_breaks",
    "phases_ms",
    "sdpa_kernel",
    "fused_adamw",
    "speedup_prev",
    "speedup_first",
)


def result(case: Case, status: str, reason: str = "", **figures: Any) -> dict[str, Any]:
    """One row of a bench output: 'ok' with every figure, or 'skipped'/'failed' with the reason and None figures."""
    return {"name": case.name, "status": status, "reason": reason, "settings": case_settings(case)} | {
        k: figures.get(k) for k in FIGURES
    }


def measure(
    case: Case,
    device: str,
    batches: BatchSource,
    steps: int,
    burn_in: int,
    peak_flops: float | None = None,
    seed: int = 1337,
    trace_path: Path | None = None,
    snapshot_path: Path | None = None,
) -> dict[str, Any]:
    """Time burn_in + steps training iterations of case, each between device synchronisations; the median and
    p90 are over the last `steps` only. The first iteration (compilation, allocator and kernel warm-up) is
    reported apart. trace_path: profile five more steps; snapshot_path: a CUDA memory snapshot of the timed ones."""
    runtime = resolve_runtime(device, case.dtype, case.tf32)
    reset_peak_memory(runtime.device)
    torch.manual_seed(seed)
    model = GPT(case.model).to(runtime.device)
    optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), runtime.device_type, fused=case.fused)
    data = batches(case.batch_size, case.model.block_size, runtime.device)
    step = training_step(case, model, optimizer, runtime, data)
    cuda = runtime.device_type == "cuda"
    if snapshot_path and cuda:
        torch.cuda.memory._record_memory_history(max_entries=100_000)

    clock, times, phases, before = PhaseClock(runtime), [], [], dynamo_counts()
    for i in range(burn_in + steps):
        runtime.synchronize()
        t0 = time.perf_counter()
        clock.start()
        step(clock.mark)
        runtime.synchronize()
        times.append((time.perf_counter() - t0) * 1000)
        phases.append(clock.durations())
        if i == 0:
            after_first = dynamo_counts()
    end = dynamo_counts()
    peak_mem, peak_reserved = peak_memory_bytes(runtime.device), peak_reserved_bytes(runtime.device)
    if snapshot_path and cuda:
        snapshot_path.parent.mkdir(parents=True, exist_ok=True)
        torch.cuda.memory._dump_snapshot(str(snapshot_path))
        torch.cuda.memory._record_memory_history(enabled=None)

    timed = times[burn_in:]
    median = statistics.median(timed)
    kernel = (
        "manual (matmul + softmax)" if case.model.attention == "manual" else sdpa_kernel_that_ran(step, runtime.device)
    )
    if trace_path:
        with step_profiler(runtime.device, trace_path) as prof:
            for _ in range(5):  # wait 1, warm up 1, record 3
                step(lambda phase: None)
                prof.step()
    return result(
        case,
        "ok",
        precision=runtime.precision,
        ms_median=median,
        ms_p90=percentile(timed, 90),
        ms_min=min(timed),
        ms_max=max(timed),
        tokens_per_s=case.tokens_per_iter / median * 1000,
        mfu=model.estimate_mfu(
            case.batch_size * case.gradient_accumulation_steps, median / 1000, runtime.precision, peak_flops
        ),
        peak_mem_bytes=peak_mem,
        peak_reserved_bytes=peak_reserved,
        first_iter_ms=times[0],
        compile_s=(times[0] - median) / 1000 if case.compile else None,
        graphs=after_first["graphs"] - before["graphs"] if case.compile else None,
        recompiles=end["frames"] - after_first["frames"] if case.compile else None,
        graph_breaks=end["graph_breaks"] - before["graph_breaks"] if case.compile else None,
        phases_ms={p: statistics.median(ph[p] for ph in phases[burn_in:]) for p in PHASES},
        sdpa_kernel=kernel,
        fused_adamw=bool(optimizer.defaults.get("fused")),
    )


def release_memory() -> None:
    """Free what the last case left: its compiled graphs, cycles, and CUDA's cached blocks."""
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_case(case: Case, skip_reason: str | None = None, **measure_args: Any) -> dict[str, Any]:
    """measure(case), or a row saying why it was skipped or failed (out of memory, a kernel or compiler error)."""
    if skip_reason:
        return result(case, "skipped", skip_reason)
    try:
        row = measure(case, **measure_args)
    except RuntimeError as e:  # so are running out of memory and torch.compile's and SDPA's errors
        oom = isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e)  # compile may wrap an OOM
        row = result(
            case, "failed", "out of memory" if oom else f"{type(e).__name__}: {str(e).strip().splitlines()[0]}"
        )
    release_memory()  # after the except block, which drops the traceback and the tensors its frames hold
    return row


def add_speedups(results: list[dict[str, Any]]) -> None:
    """speedup_prev and speedup_first: tokens/s over the previous and the first measured row's (the ms/iter ratio
    when every row does the same work)."""
    measured = [r for r in results if r["status"] == "ok"]
    for prev, r in zip([None, *measured], measured, strict=False):  # prev is None for the first
        r["speedup_prev"] = r["tokens_per_s"] / prev["tokens_per_s"] if prev else None
        r["speedup_first"] = r["tokens_per_s"] / measured[0]["tokens_per_s"]


# -----------------------------------------------------------------------------
# reports and outputs


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        aligned = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return "| " + " | ".join(aligned) + " |"

    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def fmt(value: Any, spec: str = ",.2f", scale: float = 1, suffix: str = "") -> str:
    return "-" if value is None else f"{value * scale:{spec}}{suffix}"


def report(results: list[dict[str, Any]], device_type: str) -> str:
    """The results table, the where-time-goes table and the notes beneath them, as bench.py prints them."""
    cuda = device_type == "cuda"
    main, detail, notes = [], [], []
    mib = lambda b: fmt(b, ",.0f", 2**-20, " MiB")
    for r in results:
        if r["status"] != "ok":
            main.append([r["name"], r["status"], *["-"] * 7])
            notes.append(f"{r['name']}: {r['status']}: {r['reason']}")
            continue
        main.append(
            [
                r["name"],
                fmt(r["ms_median"]),
                fmt(r["ms_p90"]),
                fmt(r["tokens_per_s"], ",.0f"),
                fmt(r["mfu"], ".1f", 100, "%") if r["mfu"] is not None else "n/a",
                mib(r["peak_mem_bytes"]),
                mib(r["peak_reserved_bytes"]) if cuda else "n/a",
                fmt(r["speedup_prev"], ".2f", suffix="x"),
                fmt(r["speedup_first"], ".2f", suffix="x"),
            ]
        )
        detail.append(
            [r["name"], *(fmt(r["phases_ms"][p]) for p in PHASES)]
            + [fmt(r["first_iter_ms"], ",.0f"), fmt(r["compile_s"], ".1f"), fmt(r["recompiles"], "d"), r["sdpa_kernel"]]
        )
        if r["recompiles"]:
            notes.append(
                f"warning: {r['name']}: {r['recompiles']} recompilation(s) after the first iteration, so timed "
                "iterations may include compiling; TORCH_LOGS=recompiles says why"
            )
        if r["graph_breaks"]:
            notes.append(
                f"warning: {r['name']}: {r['graph_breaks']} graph break(s); TORCH_LOGS=graph_breaks says where"
            )
    headers = ["config", "ms/iter", "p90 ms", "tokens/s", "MFU", "peak mem", "reserved", "vs prev", "vs first"]
    out = [markdown_table(headers, main)]
    if detail:
        headers = ["config", *(f"{p} ms" for p in PHASES), "first iter ms", "compile s", "recompiles", "SDPA kernel"]
        out += ["", "where the time goes (median ms per phase):", markdown_table(headers, detail)]
    notes += [
        "ms/iter: median (and p90) over the timed iterations, each between device synchronisations; "
        "speed-ups are ratios of tokens/s",
        "peak mem: "
        + (
            "peak allocated by CUDA tensors; reserved: held by the caching allocator"
            if cuda
            else "the process's peak resident set (reset before each config on Linux); reserved: n/a off CUDA"
        ),
        "phases: "
        + ("CUDA events on the device's timeline" if cuda else "perf_counter after synchronising")
        + "; all-reduce: not measured (bench.py runs one process, without DDP)",
        "compile s: first iteration minus the median, i.e. compilation plus one-off warm-up",
    ]
    return "\n".join(out + ["", *(f"- {n}" for n in notes)])


def beside(out_json: str, suffix: str, default: str) -> Path:
    """A path next to out_json with this suffix, or default in the working directory when there is no out_json."""
    return Path(out_json).with_suffix(suffix) if out_json else Path(default)


CSV_MANIFEST = ("git_commit", "git_dirty", "torch", "cuda", "device_name")


def write_outputs(out_json: Path, doc: dict[str, Any]) -> list[str]:
    """out_json, and a CSV and a PNG bar chart beside it; returns one line per file (or why there is no chart)."""
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(doc, indent=2) + "\n")
    csv_path = out_json.with_suffix(".csv")
    with open(csv_path, "w", newline="") as f:
        writer = csv.writer(f)
        settings, figures = list(doc["results"][0]["settings"]), [k for k in FIGURES if k != "phases_ms"]
        writer.writerow(["name", "status", "reason", *settings, *figures, *(f"{p}_ms" for p in PHASES), *CSV_MANIFEST])
        for r in doc["results"]:
            phases = r["phases_ms"] or {}
            writer.writerow(
                [r["name"], r["status"], r["reason"], *(r["settings"][k] for k in settings), *(r[k] for k in figures)]
                + [phases.get(p) for p in PHASES]
                + [doc["manifest"][k] for k in CSV_MANIFEST]
            )
    return [f"wrote {out_json}", f"wrote {csv_path}", write_chart(out_json.with_suffix(".png"), doc)]


def write_chart(path: Path, doc: dict[str, Any]) -> str:
    """A horizontal bar per result: median ms/iter with a whisker to p90, labelled with the speed-up."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no chart: matplotlib is not installed (pip install matplotlib)"
    results, m = doc["results"], doc["manifest"]
    median = [r["ms_median"] or 0.0 for r in results]
    p90 = [(r["ms_p90"] or 0.0) - (r["ms_median"] or 0.0) for r in results]
    fig, ax = plt.subplots(figsize=(9, 1.5 + 0.45 * len(results)))
    ax.barh(range(len(results)), median, xerr=[[0] * len(results), p90], color="tab:blue", capsize=3)
    for i, r in enumerate(results):
        label = f" {r['ms_median']:,.1f} ms ({r['speedup_first']:.2f}x)" if r["status"] == "ok" else f" {r['status']}"
        ax.text(median[i] + p90[i], i, label, va="center", fontsize=8)
    ax.set_yticks(range(len(results)), [r["name"] for r in results], fontsize=8)
    ax.invert_yaxis()
    ax.margins(x=0.3)  # room for the labels right of the longest bar
    ax.set_xlabel("ms per iteration (median, whisker to p90; lower is better)")
    dirty = "+dirty" if m["git_dirty"] else ""
    ax.set_title(f"{doc['kind']}: {m['device_name']}, torch {m['torch']}, {m['git_commit'][:10]}{dirty}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"wrote {path}"


# -----------------------------------------------------------------------------
# regression check

# each compared figure, and whether a higher value is better
METRICS = {
    "ms_median": False,
    "ms_p90": False,
    "tokens_per_s": True,
    "mfu": True,
    "peak_mem_bytes": False,
    "peak_reserved_bytes": False,
}


def load_results(path: Path) -> dict[str, Any]:
    if not path.is_file():
        die(f"no bench output at {path}")
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        die(f"{path} is not JSON: {e}")
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        die(f"{path} is not a bench.py output (no results list)")
    return doc


def compare_results(new: dict[str, Any], baseline: dict[str, Any], tolerance_pct: float) -> list[dict[str, Any]]:
    """Every figure of METRICS that the baseline measured, matched by result name, with its change in percent and
    a verdict: 'worse' or 'better' by more than tolerance_pct, else 'within'; 'missing' where the new output has no
    measured result of that name. ValueError when the two have no result in common."""
    now = {r["name"]: r for r in new["results"] if r["status"] == "ok"}
    rows = []
    for old in baseline["results"]:
        if old["status"] != "ok":
            continue
        for metric, higher_is_better in METRICS.items():
            before, after = old.get(metric), now.get(old["name"], {}).get(metric)
            if before is None or before == 0:
                continue
            row = {"name": old["name"], "metric": metric, "baseline": before, "new": after, "change_pct": None}
            if old["name"] not in now:
                rows.append(row | {"verdict": "missing"})
                continue
            if after is None:
                continue
            change = (after - before) / before * 100
            gain = change if higher_is_better else -change
            verdict = "worse" if gain < -tolerance_pct else "better" if gain > tolerance_pct else "within"
            rows.append(row | {"change_pct": change, "verdict": verdict})
    if not any(r["verdict"] != "missing" for r in rows):
        raise ValueError("the two outputs have no measured result in common (compare a ladder with a ladder)")
    return rows


def comparison_table(rows: list[dict[str, Any]]) -> str:
    cells = [
        [
            r["name"],
            r["metric"],
            fmt(r["baseline"], ",.4g"),
            fmt(r["new"], ",.4g"),
            fmt(r["change_pct"], "+.1f", suffix="%"),
            r["verdict"],
        ]
        for r in rows
    ]
    return markdown_table(["config", "figure", "baseline", "new", "change", "verdict"], cells)
