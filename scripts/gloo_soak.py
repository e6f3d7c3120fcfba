"""
Soak test of how 2-rank runs end (not in CI: minutes to hours): every way a run on 2 gloo ranks on the CPU ends -
DDP and FSDP2 trained then resumed, the parity scripts of the tests, HellaSwag scored by both ranks, a SIGTERM stop,
the non-finite guard, refusals after init_process_group - run many times, two at a time; each run counted by how
it ended: as expected, an abort ('terminate called without an active exception', SIGABRT), a hang (3 minutes) or
another exit status.

    python scripts/gloo_soak.py                          # 5 rounds of every case
    python scripts/gloo_soak.py --rounds=50 --cases=ddp,fsdp
    python scripts/gloo_soak.py --starve=True            # make the race at the interpreter's end likely
    python scripts/gloo_soak.py --root=/path/to/another/checkout   # its train.py and tests/, this interpreter

starve=True (Linux) runs gloo's threads in every rank in the idle scheduling class (they run only when their core
has nothing else to run) and each run on one core of its own: a collective's last steps on gloo's thread lag behind
the main thread, as they do now and then on a loaded machine. A run whose process group outlives it then aborts
often at the interpreter's end (nanogpt_perf/train/parallel.py, close). Failed runs' outputs are kept, named.
"""

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from configurator import configure  # noqa: E402
from nanogpt_perf.config import setting  # noqa: E402
from nanogpt_perf.data.shards import write_shard  # noqa: E402
from nanogpt_perf.guard.paths import a_path, comma_separated, path_rule  # noqa: E402

CASES = ("ddp", "fsdp", "parity", "hellaswag", "sigterm", "nonfinite", "refused")


@path_rule
def a_checkout(value: str) -> None:
    a_path(value)
    if not (Path(value) / "train.py").is_file() or not (Path(value) / "tests").is_dir():
        raise ValueError("a checkout of this project (with train.py and tests/)")


# -----------------------------------------------------------------------------
@dataclass(frozen=True)
class GlooSoakConfig:
    """Settings of scripts/gloo_soak.py: the rounds, the cases, the starving of gloo's threads, the checkout"""

    rounds: int = setting(5, "rounds of every case", min=1, max=10_000)
    cases: str = setting(",".join(CASES), "the cases run, comma-separated", check=comma_separated(*CASES))
    starve: bool = setting(False, "gloo's threads in the idle scheduling class, each run on a core of its own")
    root: str = setting(str(ROOT), "the checkout whose runs are soaked (its train.py and tests/)", check=a_checkout)


cfg = configure(soak=GlooSoakConfig)
# -----------------------------------------------------------------------------

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=8", "--compile=false",
        "--device=cpu", "--dropout=0.1", "--learning_rate=1e-2", "--warmup_iters=2", "--lr_decay_iters=12",
        "--eval_iters=2", "--log_interval=1", "--eval_interval=100", "--gradient_accumulation_steps=4"]  # fmt: skip
# sitecustomize of every process under starve=True: a rank's gloo threads in SCHED_IDLE as soon as they exist
STARVE_HOOK = """
import os, threading, time

def starve():
    done = set()
    while True:
        for tid in set(os.listdir("/proc/self/task")) - done:
            try:
                name = open(f"/proc/self/task/{tid}/comm").read().strip()
            except OSError:
                continue
            if name in ("pt_gloo_runloop", "gloo_tcp_loop"):
                os.sched_setscheduler(int(tid), os.SCHED_IDLE, os.sched_param(0))
                done.add(tid)
        time.sleep(0.002)

if "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ:
    threading.Thread(target=starve, daemon=True).start()
"""
# what each run's outcome must be: trained (exit 0), refused on every rank (one error line, exit 1), SIGTERM'd
OK, REFUSED, STOPPED = "trained", "refused", "stopped"


def runs(case: str, tmp: Path, data: Path) -> list[tuple[str, list[str], str]]:
    """The runs of a case, in order: (name, command, expected outcome)."""
    train = [*TORCHRUN, f"{cfg.root}/train.py", *TINY, f"--data_dir={data}", "--dataset=tiny"]
    resume = ["--max_iters=6", "--init_from=resume"]
    if case in ("ddp", "fsdp"):
        more = [f"--parallelism={case}", f"--out_dir={tmp}/out"]
        return [
            (f"{case} train", [*train, *more, "--max_iters=3"], OK),
            (f"{case} resume", [*train, *more, *resume], OK),
        ]
    if case == "parity":
        return [
            ("ddp parity", [*TORCHRUN, f"{cfg.root}/tests/ddp_parity.py", f"{tmp}/two.pt", "2"], OK),
            ("fsdp parity", [*TORCHRUN, f"{cfg.root}/tests/fsdp_parity.py", str(tmp), "2"], OK),
        ]
    if case == "hellaswag":
        flags = [f"--data_dir={data}", "--dataset=gpt2tokens", f"--hellaswag_file={data}/hellaswag.jsonl"]
        flags += ["--hellaswag_interval=2", "--max_iters=2", "--eval_interval=2", "--gradient_accumulation_steps=2"]
        return [("hellaswag", [*TORCHRUN, f"{cfg.root}/train.py", *TINY, *flags, f"--out_dir={tmp}/out"], OK)]
    if case == "sigterm":
        return [("sigterm", [*train, "--max_iters=400", f"--out_dir={tmp}/out"], STOPPED)]
    if case == "nonfinite":
        bad = [*train, "--learning_rate=1e30", "--warmup_iters=0", "--gradient_accumulation_steps=2"]
        return [
            ("non-finite stop", [*bad, "--max_iters=20", "--max_bad_steps=2", f"--out_dir={tmp}/a"], REFUSED),
            ("non-finite end", [*bad, "--max_iters=4", f"--out_dir={tmp}/b"], REFUSED),
        ]
    one = [sys.executable, f"{cfg.root}/train.py", *TINY, f"--data_dir={data}", "--dataset=tiny", "--max_iters=2"]
    return [
        ("refused: uneven", [*train, "--gradient_accumulation_steps=3", f"--out_dir={tmp}/u"], REFUSED),
        ("1 rank, to resume on 2", [*one, "--gradient_accumulation_steps=2", f"--out_dir={tmp}/o"], OK),
        ("refused: ranks", [*train, *resume, f"--out_dir={tmp}/o"], REFUSED),
        ("refused: ranks, fsdp", [*train, *resume, "--parallelism=fsdp", f"--out_dir={tmp}/o"], REFUSED),
    ]


def run(command: list[str], env: dict[str, str], expect: str) -> tuple[str, str, str]:
    """Run one command (on this pool thread's core under starve); its verdict, stdout and stderr."""
    core = int(threading.current_thread().name.rsplit("_", 1)[-1]) % os.cpu_count()
    pin = (lambda: os.sched_setaffinity(0, {core})) if cfg.starve else None
    proc = subprocess.Popen(command, env=env, cwd=cfg.root, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=pin)  # fmt: skip
    if expect == STOPPED:
        for line in proc.stdout:
            if line.startswith("iter 3:"):
                proc.send_signal(signal.SIGTERM)  # torchrun passes it on to its ranks
                break
    try:
        out, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        proc.kill()
        return "hang", *proc.communicate()
    if "terminate called" in err or "SIGABRT" in err or "Signal 6" in err:
        return "abort", out, err
    if expect == OK:
        return ("as expected" if proc.returncode == 0 else f"exit {proc.returncode}"), out, err
    if expect == STOPPED:
        return ("as expected" if "stopped by SIGTERM" in out else f"exit {proc.returncode}"), out, err
    return ("as expected" if proc.returncode and "error: " in err else f"exit {proc.returncode}"), out, err


def soak(case: str, data: Path, env: dict[str, str], keep: Path) -> list[tuple[str, str]]:
    """One round of a case, in a folder of its own (kept when a run failed); [(run, verdict)]."""
    tmp = Path(tempfile.mkdtemp(prefix=f"{case}-", dir=keep))
    verdicts = []
    for name, command, expect in runs(case, tmp, data):
        verdict, out, err = run(command, env, expect)
        verdicts.append((name, verdict))
        if verdict != "as expected":
            (tmp / f"{name.replace(' ', '_').replace(':', '')}.log").write_text(f"{out}\n--- stderr\n{err}")
            print(f"{time.strftime('%H:%M:%S')} {name}: {verdict} (kept in {tmp})", flush=True)
    if all(v == "as expected" for _, v in verdicts):
        subprocess.run(["rm", "-rf", str(tmp)], check=True)
    return verdicts


def make_data(data: Path) -> None:
    """The character dataset 'tiny', and for HellaSwag a GPT-2-token one (llm.c shards) and three examples."""
    from data.shakespeare_char.prepare import prepare

    (data / "tiny").mkdir(parents=True)
    lines = ["the quick brown fox jumps over the lazy dog.", "to be, or not to be: that is the question."]
    (data / "tiny" / "input.txt").write_text("\n".join(lines * 300) + "\n")
    prepare(data / "tiny")
    (data / "gpt2tokens").mkdir()
    write_shard(data / "gpt2tokens" / "fineweb_val_000000.bin", np.arange(3000))
    write_shard(data / "gpt2tokens" / "fineweb_train_000001.bin", np.arange(5000))
    examples = [
        '{"ctx": "The cat sat on the", "endings": ["mat.", "sky.", "sea.", "moon."], "label": 0}',
        '{"ctx": "She poured the tea into the", "endings": ["cup.", "car.", "tree.", "shoe."], "label": 0}',
        '{"ctx": "He opened the door and", "endings": ["flew.", "walked in.", "melted.", "sang."], "label": 1}',
    ]
    (data / "hellaswag.jsonl").write_text("\n".join(examples) + "\n")


def main() -> None:
    keep = Path(tempfile.mkdtemp(prefix="gloo-soak-"))
    make_data(keep / "data")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    if cfg.starve:
        (keep / "hook").mkdir()
        (keep / "hook" / "sitecustomize.py").write_text(STARVE_HOOK)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(keep / "hook"), env.get("PYTHONPATH")]))
    jobs = [c.strip() for _ in range(cfg.rounds) for c in cfg.cases.split(",")]
    counts, t0 = Counter(), time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        for verdicts in pool.map(lambda case: soak(case, keep / "data", env, keep), jobs):
            counts.update(verdicts)
    for (name, verdict), n in sorted(counts.items()):
        print(f"{name:24s} {verdict:12s} {n}")
    failed = sum(n for (_, verdict), n in counts.items() if verdict != "as expected")
    print(f"{failed} failed of {sum(counts.values())} runs in {time.perf_counter() - t0:.0f} s (starve={cfg.starve})")
    if not failed:
        subprocess.run(["rm", "-rf", str(keep)], check=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
