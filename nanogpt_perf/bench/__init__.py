"""The performance lab: what bench.py times (cases), how (measure), its reports and the regression check. It builds
what it times with training's own builder (nanogpt_perf/train/build.py); training imports nothing from here."""
