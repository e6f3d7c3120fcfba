"""Soak test of resumption (not in CI: about two minutes): train a tiny model, SIGKILL it at random
moments (some during checkpoint writes: it saves every step), resume it each time, and check that no
checkpoint was ever unreadable and that the final weights equal those of a run never interrupted.

    python lab/soak.py                  # 20 kills
    python lab/soak.py --kills=50 --seed=3
"""

import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from configurator import configure  # noqa: E402
from nanogpt_perf.config import setting  # noqa: E402
from nanogpt_perf.guard.checkpoint import NotWhole, check_whole  # noqa: E402


# -----------------------------------------------------------------------------
@dataclass
class SoakConfig:
    """Settings of lab/soak.py: the kills and the run they interrupt"""

    kills: int = setting(
        20, "SIGKILLs, each followed by a resume; at most 10,000", min=1, max=10_000
    )
    max_iters: int = setting(3000, "the run's length (it saves every step)", min=1)
    longest: float = setting(4.0, "seconds: each run is killed at a uniform random moment between "
                             "1 s (starting up) and this", above=1.0)  # fmt: skip
    seed: int = setting(
        0, "of the kill times (the runs themselves train with train.py's seed)", min=0
    )
    dataset: str = setting("shakespeare_char", "the run's dataset")


cfg = configure(soak=SoakConfig)
# -----------------------------------------------------------------------------

TRAIN = [
    sys.executable,
    "train.py",
    f"--dataset={cfg.dataset}",
    "--device=cpu",
    "--compile=False",
    "--n_layer=2",
    "--n_head=2",
    "--n_embd=64",
    "--block_size=32",
    "--batch_size=8",
    "--gradient_accumulation_steps=2",
    "--dropout=0.1",
    f"--max_iters={cfg.max_iters}",
    f"--lr_decay_iters={cfg.max_iters}",
    "--warmup_iters=10",
    "--eval_interval=100",
    "--eval_iters=2",
    "--log_interval=50",
    "--save_interval=1",
    "--keep_last=2",
]


def unreadable(out: Path) -> list[str]:
    """The checkpoints in out that could not be loaded now (temporary files of an interrupted write
    aside)."""
    found = []
    for path in sorted(out.glob("ckpt*.pt")):
        try:
            check_whole(path)
        except NotWhole as e:
            found.append(f"{path.name}: {e.reason}")
    return found


def run_killed(out: Path, delay: float) -> bool:
    """Start or resume the run and SIGKILL it after delay seconds; False if it finished first."""
    resume = ["--init_from=resume"] if (out / "ckpt.pt").exists() else []
    proc = subprocess.Popen(
        [*TRAIN, f"--out_dir={out}", *resume],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return True
    if proc.returncode != 0:
        sys.exit(f"the run failed on its own: {proc.stderr.read().strip().splitlines()[-1]}")
    return False


def main() -> None:
    rng = random.Random(cfg.seed)
    with tempfile.TemporaryDirectory() as tmp:
        straight, soaked = Path(tmp) / "straight", Path(tmp) / "soaked"
        t0 = time.perf_counter()
        subprocess.run([*TRAIN, f"--out_dir={straight}"], cwd=ROOT, check=True, capture_output=True)
        print(f"uninterrupted run: {time.perf_counter() - t0:.0f} s")
        survived, bad, mid_write = 0, [], 0
        while survived < cfg.kills:
            if not run_killed(soaked, rng.uniform(1.0, cfg.longest)):
                break  # finished before the kill: nothing left to interrupt
            survived += 1
            problems = unreadable(soaked)
            bad += problems
            # a write was cut short (the next save replaces the file)
            mid_write += any(soaked.glob("*.tmp"))
            for tmp_file in soaked.glob("*.tmp"):
                tmp_file.unlink()
            latest = soaked / "ckpt.pt"
            at = (
                torch.load(latest, weights_only=True)["iter_num"]
                if latest.exists() and not problems
                else None
            )
            print(
                f"kill {survived}: checkpoint at iter {at}, "
                f"{'unreadable: ' + str(problems) if problems else 'ok'}"
            )
        while run_killed(soaked, 600):
            pass  # to the end
        a, b = (torch.load(d / "ckpt.pt", weights_only=True)["model"] for d in (straight, soaked))
        equal = all(torch.equal(a[k], b[k]) for k in a)
        print(
            f"survived {survived} kills ({mid_write} during a checkpoint write); unreadable "
            f"checkpoints: {len(bad)};"
            f" final weights equal: {equal}"
        )
        sys.exit(0 if equal and not bad else 1)


if __name__ == "__main__":
    main()
