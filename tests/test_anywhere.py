"""Every entry script runs from any working directory: `cd /tmp && python /path/to/repo/X.py
--help`. One process runs them all, each as python would run it (its own folder first on sys.path,
none of the checkout's modules imported yet, the current folder elsewhere), so that torch is
imported once; tests/test_time_to_loss.py's slow test runs each in a process of its own, without the
editable install."""

import json
import subprocess
import sys

from conftest import ROOT

MODULES = (
    "model.py",
    "configurator.py",
    "ttl_configs.py",
    "__init__.py",
    "charts.py",
    "bench_cases.py",
    "bench_fit.py",
    "bench_measure.py",
    "bench_regression.py",
    "bench_report.py",
)  # no scripts
ENTRY = sorted(
    str(p.relative_to(ROOT))
    for pattern in ("*.py", "lab/*.py", "scripts/*.py", "data/*/prepare.py")
    for p in ROOT.glob(pattern)
    if p.name not in MODULES
)

RUN_EACH = """
import contextlib, io, json, os, runpy, sys, traceback
root, scripts = sys.argv[1], sys.argv[2:]
path, results = [p for p in sys.path if p not in ("", root)], {}
for script in scripts:
    # none of the checkout's modules imported yet (its .venv's kept)
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        file = file or next(iter(getattr(module, "__path__", None) or ()), "")
        if file.startswith(root + os.sep) and not file.startswith(sys.prefix + os.sep):
            del sys.modules[name]
    full = os.path.join(root, script)
    sys.argv, sys.path[:] = [full, "--help"], [os.path.dirname(full), *path]
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(full, run_name="__main__")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
            print(e.code if isinstance(e.code, str) else "", file=sys.stderr)
        except BaseException:
            code = 1
            traceback.print_exc()
    results[script] = [code, out.getvalue()[-300:], err.getvalue()[-2000:]]
print(json.dumps(results))
"""


def test_every_entry_script_says_its_usage_from_another_folder(tmp_path):
    run = subprocess.run(
        [sys.executable, "-c", RUN_EACH, str(ROOT), *ENTRY],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    results = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(ENTRY) >= 20 and set(results) == set(ENTRY)
    for script, (code, out, err) in results.items():
        assert "Traceback" not in err, f"{script}: {err}"
        # lab/ttl_*.py's modules
        module = err.strip().startswith("error: ") and "is a module of" in err
        assert (code == 0 and out.strip()) or module, f"{script} exits {code}: {err}"
    assert not list(tmp_path.iterdir()), "a script wrote into the folder it was run from"
