"""lab/plot.py: curves of several runs in one PNG, read from the log.jsonl that train.py writes, and
one clear line on bad input."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, assert_one_line_error, run_script
from lab import charts, plot
from nanogpt_perf.errors import UserError

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def elapsed(i: int) -> float:
    return 1.0 + 0.05 * i  # seconds since the run started, at iter i


def lr(i: int) -> float:
    return 1e-3 * min(1.0, i / 20)  # a warm-up over 20 iters


def step_record(i: int, scale: float, key: str = "step_loss") -> dict:
    """A step record as train.py logs it; the first step is slow (compilation) and has no MFU on
    CPU."""
    ms = 900.0 if i == 1 else 40.0 * scale
    return {
        "iter": i,
        key: 4.5 * scale - 0.01 * i,
        "lr": lr(i),
        "ms_per_iter": ms,
        "step_ms": ms * 0.9,
        "tokens_per_s": 1024 / ms * 1000,
        "mfu": None,
        "peak_mem_bytes": 2**20,
        "grad_norm": None if i == 1 else 1.0 / i,
        "elapsed_s": elapsed(i),
        "eta_s": 1.0,
    }


def eval_record(i: int, scale: float) -> dict:
    loss = 4.5 * scale - 0.01 * i
    return {
        "iter": i,
        "train_loss": loss - 0.1,
        "val_loss": loss,
        "lr": lr(i),
        "elapsed_s": elapsed(i),
    }


def write_log(out_dir: Path, records: list[dict]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return out_dir


def a_run(scale: float, key: str = "step_loss") -> list[dict]:
    """20 step records (iters 1, 10, 20, ... 190) and 3 evals (0, 100, 190), in the order train.py
    writes them."""
    iters = [1, *range(10, 200, 10)]
    records = [eval_record(0, scale)] + [step_record(i, scale, key) for i in iters]
    records.insert(records.index(step_record(100, scale, key)) + 1, eval_record(100, scale))
    return records + [eval_record(190, scale)]


def colour_pixels(image: np.ndarray, hex_colour: str) -> int:
    rgb = np.array([int(hex_colour[k : k + 2], 16) / 255 for k in (1, 3, 5)])
    return int((np.abs(image[..., :3] - rgb).max(axis=-1) < 0.02).sum())


def test_two_runs_in_one_png_with_a_colour_each(tmp_path):
    import matplotlib.image

    a, b = write_log(tmp_path / "a", a_run(1.0)), write_log(tmp_path / "b", a_run(0.8))
    out = tmp_path / "figs" / "ab.png"
    result = run_script("lab/plot.py", str(a), str(b), f"--out={out}")
    assert result.returncode == 0, result.stderr
    assert f"wrote {out}" in result.stdout
    assert out.read_bytes().startswith(PNG_SIGNATURE)
    image = matplotlib.image.imread(out)
    width, height = charts.FIGSIZE[0] * charts.DPI, charts.FIGSIZE[1] * charts.DPI
    assert image.shape == (height, width, 4)
    # matplotlib's first two colours, C0 and C1: both runs were drawn
    assert colour_pixels(image, "#1f77b4") > 500 and colour_pixels(image, "#ff7f0e") > 500


def test_default_output_beside_one_run_or_here_for_several(tmp_path):
    a, b = write_log(tmp_path / "a", a_run(1.0)), write_log(tmp_path / "b", a_run(0.8))
    result = run_script(str(ROOT / "lab" / "plot.py"), "a", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (a / "curves.png").read_bytes().startswith(PNG_SIGNATURE)
    result = run_script(str(ROOT / "lab" / "plot.py"), str(a), str(b), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "curves.png").read_bytes().startswith(PNG_SIGNATURE)


def test_series_leave_the_first_step_out_of_the_speed_only(tmp_path):
    (run,) = plot.load_curves(write_log(tmp_path / "a", a_run(1.0)))
    step_iters = [1, *range(10, 200, 10)]
    assert run["step_loss"][0] == step_iters
    assert run["step_loss"][1][0] == pytest.approx(4.49)
    for key in ("tokens_per_s", "ms_per_iter", "step_ms"):
        assert run[key][0] == step_iters[1:]
    assert max(run["ms_per_iter"][1]) == pytest.approx(40.0)  # not the first step's 900 ms
    assert run["val_loss"][0] == run["train_loss"][0] == [0, 100, 190]
    assert run["lr"][0] == sorted(step_iters + [0, 100, 190])


def test_old_loss_key_and_runs_appended_to_one_log(tmp_path):
    resumed = [r | {"elapsed_s": r["elapsed_s"] / 100} for r in a_run(0.5) if r["iter"] >= 100]
    runs = plot.load_curves(
        write_log(tmp_path / "a", a_run(1.0, key="loss") + a_run(0.9) + resumed)
    )
    # iter goes back down to 0, then the resumed run's clock starts again at 100
    assert len(runs) == 3
    assert runs[0]["step_loss"][1][:2] == pytest.approx([4.49, 4.4])  # read from "loss"
    assert runs[1]["step_loss"][1][0] == pytest.approx(4.05 - 0.01)
    assert runs[2]["step_loss"][0][0] == 100 and runs[2]["val_loss"][0] == [100, 190]
    for run in runs:  # each run's own first step record is left out of the speed
        assert len(run["tokens_per_s"][0]) == len(run["step_loss"][0]) - 1


def test_missing_log_and_bad_json_are_one_line_errors(tmp_path):
    result = run_script("lab/plot.py", str(tmp_path / "nowhere"))
    assert_one_line_error(
        result, "no log.jsonl in", f"train with out_dir={tmp_path / 'nowhere'} first"
    )
    lines = [json.dumps(r) for r in a_run(1.0)]
    lines[2] = '{"iter": 10, "step_loss": 4.4'  # cut off mid-write
    (tmp_path / "log.jsonl").write_text("\n".join(lines) + "\n")
    result = run_script("lab/plot.py", str(tmp_path), f"--out={tmp_path / 'x.png'}")
    assert_one_line_error(result, str(tmp_path / "log.jsonl"), "line 3 is not JSON")
    assert not (tmp_path / "x.png").exists()


def test_a_log_without_step_records_and_other_bad_input(tmp_path, monkeypatch, capsys):
    evals_only = write_log(tmp_path / "evals", [eval_record(0, 1.0)])
    with pytest.raises(UserError, match="^.*has no step records"):
        plot.main([str(evals_only)])
    for foreign in (
        {"iter": 1, "step_loss": "high"},
        {"step_loss": 2.5},
        {"iter": "one", "loss": 2.5},
    ):
        with pytest.raises(UserError, match="^.*has no step records"):
            plot.main([str(write_log(tmp_path / "foreign", [foreign, eval_record(0, 1.0)]))])
    with pytest.raises(UserError, match="^out must be .. or a .png file"):
        plot.main([str(evals_only), "--out=x.jpg"])
    with pytest.raises(UserError, match="^plot.py needs one or more OUT_DIRs"):
        plot.main([])
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(UserError, match="^.*pip install matplotlib"):
        plot.main([str(write_log(tmp_path / "a", a_run(1.0)))])
    assert capsys.readouterr().err == ""  # argparse printed no usage block
    with pytest.raises(SystemExit):
        plot.main(["--help"])
    usage = capsys.readouterr().out.splitlines()[0]  # what plot.py takes: folders, not config files
    assert usage.startswith("usage: python ") and usage.endswith(
        " OUT_DIR [OUT_DIR ...] [--key=value ...]"
    ), usage


def test_without_matplotlib_every_report_says_so_in_one_line_and_writes_nothing(
    tmp_path, monkeypatch
):
    """lab/charts.py behind bench.py's chart and the time-to-loss report's."""
    from lab.charts import NO_MATPLOTLIB
    from lab.charts import bench_bars as bench_chart
    from lab.charts import loss_curves as ttl_chart

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    result = {"name": "x", "status": "ok", "ms_median": 1.0, "ms_p90": 1.0, "speedup_first": 1.0}
    manifest = {"git_dirty": False, "device_name": "cpu", "torch": "2", "git_commit": "0" * 10}
    assert (
        bench_chart(
            tmp_path / "b.png", {"results": [result], "manifest": manifest, "kind": "single"}
        )
        == NO_MATPLOTLIB
    )
    from lab.ttl_curves import median_curve

    chart = ttl_chart(
        tmp_path / "t.png", {"x": []}, {"target": None, "rows": {}}, "t", median_curve
    )
    assert chart == NO_MATPLOTLIB
    assert list(tmp_path.iterdir()) == []
