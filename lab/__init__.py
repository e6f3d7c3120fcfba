"""The lab: what measures (bench.py's library, the benchmarks, the GPU suite, the charts). Each
runnable is run from the repository root as python lab/NAME.py --key=value."""
