"""The performance lab: the memory savers against the plain paths, the ladder and sweeps end to end,
the regression check, and the settings train.py gained with them."""

import csv
import json
from dataclasses import replace

import pytest
import torch

from configurator import sweep_values
from conftest import (
    ROOT,
    SMALL,
    TINY_MODEL,
    assert_one_line_error,
    declarations,
    run_in_process,
    run_script,
)
from lab.bench_cases import NOT_MEASURED, Case, ladder_cases, largest_fitting, most_tries
from lab.bench_measure import FIGURES, run_case
from lab.bench_regression import compare_results, verdict
from model import GPT, GPTConfig
from nanogpt_perf.data.loader import SyntheticBatches
from nanogpt_perf.errors import UserError
from nanogpt_perf.manifest import git_state, gpu_driver_version
from nanogpt_perf.timing import PHASES

TINY_BENCH = [
    "--n_layer=2",
    "--n_head=2",
    "--n_embd=32",
    "--block_size=32",
    "--batch_size=2",
    "--device=cpu",
    "--compile=false",
]


def loss_and_grads(
    config: GPTConfig, ignore: bool = True, dtype=torch.float32, autocast: bool = False
) -> tuple:
    """The loss, every parameter's gradient, the shapes autograd saved for backward and the logits,
    from a fixed model and batch (the model in dtype, run under CPU bf16 autocast when asked)."""
    torch.manual_seed(0)
    model = GPT(config).to(dtype)
    g = torch.Generator().manual_seed(1)
    x, y = (torch.randint(config.vocab_size, (4, config.block_size), generator=g) for _ in range(2))
    if ignore:
        y[0, :5] = -1  # ignored targets count in neither the sum nor the mean
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: saved.append(t.shape) or t, lambda t: t
    ):
        with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            logits, loss = model(x, y)
    loss.backward()
    return loss, {name: p.grad for name, p in model.named_parameters()}, saved, logits


# 7 does not divide B*T = 64; 1000 is one chunk
@pytest.mark.parametrize("chunk", [1, 7, 16, 64, 1000])
def test_chunked_loss_equals_the_plain_loss_and_gradients(chunk):
    loss, grads, saved, logits = loss_and_grads(SMALL)
    loss_c, grads_c, saved_c, logits_c = loss_and_grads(replace(SMALL, loss_chunk=chunk))
    torch.testing.assert_close(loss_c, loss, rtol=1e-6, atol=1e-6)
    for name, grad in grads.items():
        torch.testing.assert_close(grads_c[name], grad, rtol=1e-5, atol=1e-7, msg=name)
    assert logits is not None and logits_c is None
    kept_logits = lambda shapes: [s for s in shapes if len(s) and s[-1] == SMALL.vocab_size]
    # the plain path keeps all the logits
    assert sum(s.numel() for s in kept_logits(saved)) >= 4 * 16 * 80
    assert kept_logits(saved_c) == []  # the chunked one keeps none


# 0 picks one; 7 does not divide B*T = 64; 1000 is one chunk
@pytest.mark.parametrize("chunk", [0, 7, 1000])
def test_fused_loss_equals_the_plain_loss_and_gradients_in_float64(chunk):
    loss, grads, saved, _ = loss_and_grads(SMALL, dtype=torch.float64)
    loss_f, grads_f, saved_f, logits_f = loss_and_grads(
        replace(SMALL, loss_impl="fused", loss_chunk=chunk), dtype=torch.float64
    )
    assert loss.dtype == loss_f.dtype == torch.float64
    assert abs(loss_f.item() - loss.item()) <= 1e-10
    for name, grad in grads.items():
        assert (grads_f[name] - grad).abs().max().item() <= 1e-10, name
    # no logits kept
    assert logits_f is None and [s for s in saved_f if s[-1:] == (SMALL.vocab_size,)] == []


def test_fused_loss_under_bf16_autocast_is_within_bf16_tolerance_of_the_plain_one():
    loss, grads, _, _ = loss_and_grads(SMALL, autocast=True)
    loss_f, grads_f, _, _ = loss_and_grads(replace(SMALL, loss_impl="fused"), autocast=True)
    assert abs(loss_f.item() - loss.item()) <= 1e-3 * loss.item()
    for name, grad in grads.items():
        assert grads_f[name].dtype == grad.dtype == torch.float32
        assert (grads_f[name] - grad).norm() <= 2e-2 * grad.norm(), name


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_activation_checkpointing_gives_the_same_gradients(dropout):
    config = replace(SMALL, dropout=dropout)
    loss, grads, saved, _ = loss_and_grads(config)
    loss_c, grads_c, saved_c, _ = loss_and_grads(replace(config, activation_checkpointing=True))
    torch.testing.assert_close(loss_c, loss)
    for name, grad in grads.items():
        torch.testing.assert_close(grads_c[name], grad, rtol=1e-5, atol=1e-7, msg=name)
    # the blocks' activations are recomputed in backward, not kept
    assert sum(s.numel() for s in saved_c) < sum(s.numel() for s in saved) / 2


def test_both_memory_savers_together_still_learn():
    torch.manual_seed(0)
    model = GPT(replace(SMALL, loss_chunk=10, activation_checkpointing=True))
    optimizer = model.configure_optimizers(0.0, 1e-2, (0.9, 0.95))
    x = torch.randint(80, (4, 16), generator=torch.Generator().manual_seed(2))
    losses = []
    for _ in range(20):
        _, loss = model(x, x)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 1.0


def test_negative_loss_chunk_is_refused():
    with pytest.raises(ValueError, match="loss_chunk"):
        replace(SMALL, loss_chunk=-1)


def test_configure_optimizers_fused_switch():
    model = GPT(SMALL)
    assert model.configure_optimizers(0.1, 1e-3, (0.9, 0.95)).defaults["fused"]
    assert not model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), fused=False).defaults["fused"]


def bench_case(name: str = "as set", **changes) -> Case:
    """A Case of SMALL's shape with bench.py's defaults otherwise (compile off), as bench.py makes
    one."""
    model = dict(
        block_size=16, vocab_size=80, n_layer=2, n_head=4, n_embd=32, dropout=0.0, bias=True
    )
    work = dict(batch_size=2, gradient_accumulation_steps=1, compile=False)
    return Case(name, declarations("bench.py").config(**(model | work | changes)))


def test_ladder_rungs_are_cumulative_and_skip_what_cannot_run():
    base = bench_case(vocab_size=50257, compile=True, dtype="bfloat16")
    cases = ladder_cases(base, torch.device("cpu"))
    first, last = cases[0][0].settings, cases[-1][0].settings
    assert (first.dtype, first.tf32, first.compile, first.fused_adamw, first.attention) == (
        "float32",
        False,
        False,
        False,
        "manual",
    )
    assert (
        cases[0][0].measured()["vocab_size"] == 50257
        and cases[-1][0].measured()["vocab_size"] == 50304
    )
    assert (last.dtype, last.compile, last.fused_adamw, last.attention) == (
        "bfloat16",
        True,
        True,
        "sdpa",
    )
    reasons = {c.name: why for c, why in cases}
    assert reasons["+TF32"] == "TF32 is CUDA only" and not last.tf32
    assert sum(why is None for why in reasons.values()) == 6

    skipped = ladder_cases(base, torch.device("cpu"), skip=["compile"])
    assert dict((c.name, why) for c, why in skipped)["+torch.compile"] == "left out by skip_rungs"
    assert not any(c.settings.compile for c, _ in skipped)
    # 80 is a multiple of 16
    padded = ladder_cases(base.but(vocab_size=80, pad_vocab=16), torch.device("cpu"))
    assert padded[5][1] == "vocab_size 80 is a multiple of 16 already"
    with pytest.raises(UserError, match="no rung turbo"):
        ladder_cases(base, torch.device("cpu"), skip=["turbo"])


def test_any_setting_sweeps_its_values_read_and_checked_as_flags():
    """bench.py's --sweep=KEY=V1,V2 takes any setting of the timed configuration (the model's shape
    and learning rate too), each value converted and checked as --KEY=V would be; bench.py's own
    settings are not swept."""
    case = bench_case()
    assert sweep_values(case.settings, "batch_size=1, 2,4", NOT_MEASURED) == (
        "batch_size",
        [1, 2, 4],
    )
    assert sweep_values(case.settings, "attention=manual,flash", NOT_MEASURED)[1] == [
        "manual",
        "flash",
    ]
    assert sweep_values(case.settings, "n_layer=1,2", NOT_MEASURED)[1] == [1, 2]
    assert sweep_values(case.settings, "learning_rate=1e-3,3e-4", NOT_MEASURED)[1] == [1e-3, 3e-4]
    for text, message in [
        ("out_json=a.json,b.json", "cannot sweep out_json"),
        ("batch_size=1,0", "batch_size must be >= 1, not 0"),
        ("block_size=", "sweep must be KEY=V1,V2"),
        ("compile_mode=default,fastest", "compile_mode must be one of"),
        ("n_head=3", "n_embd=32 is not divisible by n_head=3"),
        ("batch_sise=1", "did you mean 'batch_size'"),
    ]:
        with pytest.raises(UserError, match=message):
            sweep_values(case.settings, text, NOT_MEASURED)


@pytest.mark.parametrize(
    "largest, limit", [(37, 1000), (64, 1000), (1, 1000), (0, 1000), (1000, 100), (5, 5)]
)
def test_largest_fitting_doubles_then_bisects(largest, limit):
    tried = []
    fits = lambda n: tried.append(n) or n <= largest
    assert largest_fitting(fits, limit) == min(largest, limit)
    assert len(tried) <= 2 * limit.bit_length() + 1 and max(tried) <= limit


def test_most_tries_bounds_the_search_and_is_reached():
    """largest_fitting's calls, for every limit to 256 and every answer: never more than
    most_tries(limit), each within [1, limit]; the bound is met at limits of 2^k - 1."""
    for limit in range(257):
        counts = []
        for largest in range(limit + 2):
            tried = []
            largest_fitting(lambda n: tried.append(n) or n <= largest, limit)  # noqa: B023
            assert len(tried) <= most_tries(limit), (limit, largest)
            assert all(1 <= n <= limit for n in tried), (limit, largest)
            counts.append(len(tried))
        assert max(counts) == most_tries(limit) or limit & (limit + 1), limit
    assert [most_tries(n) for n in (0, 1, 3, 7, 255)] == [0, 1, 3, 5, 15]


def tiny_case(**changes) -> Case:
    return bench_case("tiny", block_size=32, **changes)


def synthetic(B: int, T: int, device: torch.device) -> SyntheticBatches:
    return SyntheticBatches(B, T, 80, device, seed=0)


def test_measure_reports_the_sdpa_kernel_that_ran_and_failures():
    args = dict(device="cpu", batches=synthetic, steps=2, burn_in=1)
    flash = run_case(tiny_case(), **args)
    assert flash["status"] == "ok" and flash["sdpa_kernel"] == "flash (CPU)"
    assert flash["ms_median"] > 0 and flash["peak_mem_bytes"] > 0 and flash["fused_adamw"]
    assert set(flash["phases_ms"]) == set(PHASES) and flash["phases_ms"]["forward"] > 0
    held = lambda attention: tiny_case(attention=attention)
    assert run_case(held("math"), **args)["sdpa_kernel"] == "math"
    manual = run_case(tiny_case(attention="manual"), **args)
    assert manual["sdpa_kernel"].startswith("manual")
    efficient = run_case(held("efficient"), **args)  # no memory-efficient kernel on a CPU
    assert efficient["status"] == "failed" and "RuntimeError" in efficient["reason"]
    assert efficient["ms_median"] is None
    skipped = run_case(tiny_case(), "not here", **args)
    assert (skipped["status"], skipped["reason"]) == ("skipped", "not here")


@pytest.fixture(scope="module")
def ladder(tmp_path_factory):
    """The ladder end to end on a tiny model. torch.compile is left out: its four compiled rungs
    take a minute or more on a 2-core CPU (bench.py runs them by default; the ladder test above
    checks the compile rung's Case)."""
    out = tmp_path_factory.mktemp("bench") / "ladder.json"
    result = run_script(
        "bench.py",
        *TINY_BENCH,
        "--ladder=True",
        "--skip_rungs=compile",
        "--steps=2",
        "--burn_in=1",
        f"--out_json={out}",
    )
    assert result.returncode == 0, result.stderr
    return out, result.stdout


def test_ladder_output_schema(ladder):
    out, stdout = ladder
    doc = json.loads(out.read_text())
    assert doc["kind"] == "ladder"
    manifest = doc["manifest"]
    assert len(manifest["git_commit"]) == 40 and isinstance(manifest["git_dirty"], bool)
    assert manifest["torch"] == torch.__version__ and manifest["device"] == "cpu"
    # None without an NVIDIA GPU, its version with one
    assert manifest["driver"] == gpu_driver_version()
    assert manifest["settings"]["ladder"] is True and manifest["settings"]["n_embd"] == 32
    names = [r["name"] for r in doc["results"]]
    assert names[0] == "fp32 eager" and names[-1] == "+fused AdamW" and len(names) == 7
    status = {r["name"]: (r["status"], r["reason"]) for r in doc["results"]}
    assert status["+TF32"] == ("skipped", "TF32 is CUDA only")
    assert status["+torch.compile"] == ("skipped", "left out by skip_rungs")
    measured = [r for r in doc["results"] if r["status"] == "ok"]
    assert len(measured) == 5
    for r in measured:
        assert set(r) == {"name", "status", "reason", "settings", *FIGURES}
        assert 0 < r["ms_min"] <= r["ms_median"] <= r["ms_p90"] <= r["ms_max"]
        assert r["tokens_per_s"] == pytest.approx(2 * 32 / r["ms_median"] * 1000)
        assert r["mfu"] is None and r["peak_reserved_bytes"] is None and r["peak_mem_bytes"] > 0
        assert set(r["phases_ms"]) == set(PHASES) and r["speedup_first"] > 0
    assert measured[0]["speedup_first"] == 1.0 and measured[0]["speedup_prev"] is None
    assert [r["settings"]["vocab_size"] for r in measured] == [50257, 50257, 50257, 50304, 50304]
    assert [r["precision"] for r in measured] == ["fp32", "bf16", "bf16", "bf16", "bf16"]
    assert [r["fused_adamw"] for r in measured] == [False] * 4 + [True]
    assert (
        measured[1]["sdpa_kernel"].startswith("manual")
        and measured[2]["sdpa_kernel"] == "flash (CPU)"
    )

    with open(out.with_suffix(".csv")) as f:
        rows = list(csv.DictReader(f))
    assert [r["name"] for r in rows] == names and rows[0]["git_commit"] == manifest["git_commit"]
    assert float(rows[0]["forward_ms"]) > 0 and rows[1]["ms_median"] == ""
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| fp32 eager" in stdout and "skipped" in stdout and "where the time goes" in stdout
    assert "all-reduce: not measured" in stdout


def test_regression_check_logic(ladder):
    doc = json.loads(ladder[0].read_text())
    slower = json.loads(json.dumps(doc))
    first = slower["results"][0]
    first["ms_median"] *= 1.10  # 10% slower
    first["tokens_per_s"] *= 0.97  # 3% less throughput
    first["peak_mem_bytes"] *= 0.80  # 20% less memory
    rows = {(r["name"], r["metric"]): r for r in compare_results(slower, doc, tolerance_pct=5)}
    assert rows["fp32 eager", "ms_median"]["verdict"] == "worse"
    assert rows["fp32 eager", "ms_median"]["change_pct"] == pytest.approx(10)
    assert rows["fp32 eager", "tokens_per_s"]["verdict"] == "within"
    assert rows["fp32 eager", "peak_mem_bytes"]["verdict"] == "better"
    assert rows["+fused AdamW", "ms_median"]["verdict"] == "within"
    # skipped rungs, no MFU on CPU
    assert ("+TF32", "ms_median") not in rows and ("fp32 eager", "mfu") not in rows
    assert all(r["verdict"] != "worse" for r in compare_results(slower, doc, tolerance_pct=15))
    slower["results"][-1]["status"] = "failed"
    missing = [
        r for r in compare_results(slower, doc, tolerance_pct=50) if r["verdict"] == "missing"
    ]
    assert {r["name"] for r in missing} == {"+fused AdamW"}
    assert verdict(compare_results(slower, doc, tolerance_pct=50), 50)[0] == 1


def test_rows_measured_with_other_settings_are_not_compared(ladder):
    doc = json.loads(ladder[0].read_text())
    other = json.loads(json.dumps(doc))
    other["results"][0]["settings"]["batch_size"] = 4  # the same name, another configuration
    other["results"][0]["ms_median"] *= 3  # would be "worse" if it were compared
    rows = compare_results(other, doc, tolerance_pct=5)
    apart = [r for r in rows if r["verdict"] == "not comparable"]
    assert [(r["name"], r["reason"]) for r in apart] == [("fp32 eager", "batch_size 2 -> 4")]
    assert not any(r["verdict"] == "worse" for r in rows)
    status, line = verdict(rows, 5)
    assert status == 2 and line.startswith("not comparable: 1 of")
    assert verdict(compare_results({"results": []}, doc, 5), 5)[0] == 1  # everything missing
    assert verdict([], 5)[0] == 2  # nothing measured in the baseline: nothing vouched for


def test_regression_check_exit_codes(ladder, tmp_path):
    out = ladder[0]
    doc = json.loads(out.read_text())
    doc["results"][2]["tokens_per_s"] *= 0.5
    worse = tmp_path / "worse.json"
    worse.write_text(json.dumps(doc))
    same = run_script("bench.py", f"--compare={out}", f"--baseline={out}")
    assert same.returncode == 0 and "no regression" in same.stdout and "| fp32 eager" in same.stdout
    result = run_script("bench.py", f"--compare={worse}", f"--baseline={out}", "--tolerance_pct=5")
    assert result.returncode == 1 and "-50.0%" in result.stdout and "worse" in result.stdout
    assert result.stderr.strip().startswith("regression: 1 of")
    elsewhere = json.loads(out.read_text())
    elsewhere["manifest"]["device_name"] = "NVIDIA H100 80GB HBM3"
    (tmp_path / "gpu.json").write_text(json.dumps(elsewhere))
    result = run_script("bench.py", f"--compare={tmp_path / 'gpu.json'}", f"--baseline={out}")
    assert result.returncode == 2 and "not comparable" in result.stderr and "H100" in result.stderr
    no_baseline, missing_baseline = (
        [f"--compare={worse}"],
        [f"--compare={worse}", f"--baseline={tmp_path}/no.json"],
    )
    for args, says in ((no_baseline, "needs both"), (missing_baseline, "no bench")):
        # nothing compared: 2, as another machine, not a regression's 1
        result = run_in_process("bench.py", *args)
        assert_one_line_error(result, says)
        assert result.returncode == 2


@pytest.mark.slow
def test_sweep_and_profile_end_to_end(tmp_path):
    out = tmp_path / "sweep.json"
    sweep = ["--sweep=batch_size=1,3"]
    result = run_script(
        "bench.py", *TINY_BENCH, *sweep, "--steps=1", "--burn_in=1", f"--out_json={out}"
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    assert doc["kind"] == "sweep of batch_size"
    assert [r["name"] for r in doc["results"]] == ["batch_size=1", "batch_size=3"]
    assert [r["settings"]["tokens_per_iter"] for r in doc["results"]] == [32, 96]

    out = tmp_path / "one.json"
    result = run_script(
        "bench.py", *TINY_BENCH, "--profile=True", "--steps=1", "--burn_in=1", f"--out_json={out}"
    )
    assert result.returncode == 0, result.stderr
    assert "Self CPU" in result.stdout and "aten::" in result.stdout
    trace = json.loads(out.with_suffix(".trace.json").read_text())
    assert any("scaled_dot_product" in e.get("name", "") for e in trace["traceEvents"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--ladder=True", "--skip_rungs=turbo"], "no rung turbo"),
        (["--ladder=True", "--sweep=batch_size=1"], "not ladder and sweep"),
        (["--sweep=steps=1,2"], "cannot sweep steps"),
        (["--burn_in=0"], "burn_in"),
        (["--ladder=True", "--profile=True"], "drop --ladder"),
    ],
)
def test_bad_bench_settings_are_one_line(args, message):
    assert_one_line_error(run_in_process("bench.py", *TINY_BENCH, *args), message)


def test_find_max_batch_on_cpu_says_it_is_not_meaningful():
    result = run_script("bench.py", *TINY_BENCH, "--find_max_batch=True")
    assert result.returncode == 0 and "not meaningful on cpu" in result.stdout


def test_git_state_outside_a_checkout(tmp_path):
    assert git_state(tmp_path) == ("unknown", None)
    commit, dirty = git_state(ROOT)
    assert len(commit) == 40 and isinstance(dirty, bool)


def test_train_with_memory_savers_profile_and_manifest(tiny_data, tmp_path):
    result = run_script(
        "train.py",
        *TINY_MODEL,
        f"--data_dir={tiny_data}",
        "--dataset=tiny",
        f"--out_dir={tmp_path}",
        "--loss_chunk=100",
        "--activation_checkpointing=True",
        "--profile=True",
        "--max_iters=6",
        "--eval_interval=6",
        "--eval_iters=2",
        "--log_interval=1",
    )
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["iter"] for r in records if "step_loss" in r] == [1, 2, 3, 4, 5, 6]
    assert (
        all(0 < r["step_loss"] < 10 for r in records if "step_loss" in r)
        and records[-1]["val_loss"] > 0
    )
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert (
        manifest["settings"]["loss_chunk"] == 100
        and manifest["model_args"]["activation_checkpointing"] is True
    )
    assert (
        manifest["device"] == "cpu"
        and manifest["world_size"] == 1
        and len(manifest["git_commit"]) == 40
    )
    assert (tmp_path / "trace.json").is_file() and "Self CPU" in result.stdout
    checkpoint = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    # a setting: model_args holds what nanoGPT's GPTConfig takes
    assert checkpoint["config"]["loss_chunk"] == 100
    assert set(checkpoint["model_args"]) == {
        "n_layer",
        "n_head",
        "n_embd",
        "block_size",
        "bias",
        "vocab_size",
        "dropout",
    }
