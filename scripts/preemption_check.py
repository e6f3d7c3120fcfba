"""
What a scheduler's SIGTERM costs a run: send it to train.py mid-run (a tiny model on the CPU), then report the step
it stopped after, the time from the signal to the process's exit, and the resumed run's first step losses next to
those of a run never interrupted.

    python scripts/preemption_check.py
    python scripts/preemption_check.py --signal_at=200 --n_embd=256
"""

import json
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from configurator import configure  # noqa: E402
from nanogpt_perf.config import setting  # noqa: E402


# -----------------------------------------------------------------------------
@dataclass
class PreemptionConfig:
    """Settings of scripts/preemption_check.py: the run and when it is sent SIGTERM"""

    max_iters: int = setting(400, "the run's length", min=2)
    signal_at: int = setting(150, "send SIGTERM once this iteration has been logged", min=1)
    n_embd: int = setting(128, "the run's model width (its cost per step)", min=4)
    dataset: str = setting("shakespeare_char", "the run's dataset")


cfg = configure(preemption=PreemptionConfig)
# -----------------------------------------------------------------------------

TRAIN = [
    sys.executable, "train.py", f"--dataset={cfg.dataset}", "--device=cpu", "--compile=False", "--n_layer=4",
    "--n_head=4", f"--n_embd={cfg.n_embd}", "--block_size=64", "--batch_size=12", "--dropout=0.1",
    f"--max_iters={cfg.max_iters}", f"--lr_decay_iters={cfg.max_iters}", "--eval_interval=1000", "--eval_iters=2",
    "--log_interval=1", "--gradient_accumulation_steps=2", "--warmup_iters=20",
]  # fmt: skip


def losses(out: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return {r["iter"]: r["step_loss"] for r in records if "step_loss" in r}


with tempfile.TemporaryDirectory() as tmp:
    straight, stopped = Path(tmp) / "straight", Path(tmp) / "stopped"
    subprocess.run([*TRAIN, f"--out_dir={straight}"], cwd=ROOT, check=True, capture_output=True)
    run = subprocess.Popen([*TRAIN, f"--out_dir={stopped}"], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL)  # fmt: skip
    for line in run.stdout:
        if line.startswith(f"iter {cfg.signal_at}:"):
            sent = time.perf_counter()
            run.send_signal(signal.SIGTERM)
            break
    else:
        sys.exit(f"the run ended before iter {cfg.signal_at} (exit code {run.wait()})")
    tail = run.communicate()[0]
    seconds = time.perf_counter() - sent
    stopped_at = max(losses(stopped))
    print(f"SIGTERM after iter {cfg.signal_at} was logged: stopped after iter {stopped_at}, exit code "
          f"{run.returncode}, {seconds * 1000:.0f} ms from the signal to the exit (the step, a checkpoint, the "
          "shutdown)")  # fmt: skip
    print("its last line: " + tail.strip().splitlines()[-1])
    subprocess.run([*TRAIN, f"--out_dir={stopped}", "--init_from=resume"], cwd=ROOT, check=True, capture_output=True)
    a, b = losses(straight), losses(stopped)
    for i in range(stopped_at + 1, min(stopped_at + 6, cfg.max_iters + 1)):
        print(f"iter {i}: uninterrupted {a[i]!r}, resumed {b[i]!r}, {'equal' if a[i] == b[i] else 'DIFFERENT'}")
    same = all(a[i] == b[i] for i in a)
    print(f"all {len(a)} step losses equal: {same}")
