"""The library behind train.py, bench.py and sample.py: one module per job (the README has the
table)."""
