"""
Sample from a trained model.

    python sample.py --out_dir=out-shakespeare-char --start="ROMEO:" --num_samples=3 --max_new_tokens=300
    python sample.py --out_dir=out-shakespeare --start=FILE:prompt.txt --top_k=50
"""

import pickle
from collections.abc import Callable
from pathlib import Path

import torch

from common import die, gpt2_encoding, load_checkpoint, resolve_runtime
from configurator import configure
from model import GPT, GPTConfig

# -----------------------------------------------------------------------------
init_from = "resume"  # 'resume' (out_dir/ckpt.pt)
out_dir = "out"
start = "\n"  # the prompt: text, or FILE:path to read it from a file
num_samples = 10
max_new_tokens = 500
temperature = 0.8  # 1.0 samples the model's distribution as is, lower is more conservative, 0 is greedy
top_k = 200  # keep only the k most likely tokens at each step; 0 = all
seed = 1337
device = "auto"
dtype = "auto"
settings = configure(globals())
# -----------------------------------------------------------------------------

runtime = resolve_runtime(device, dtype)
print(runtime.describe())
torch.manual_seed(seed)
generator = torch.Generator(runtime.device).manual_seed(seed)

if init_from != "resume":
    die(f"init_from must be 'resume', not {init_from!r}")
checkpoint = load_checkpoint(Path(out_dir) / "ckpt.pt", runtime.device)
model = GPT(GPTConfig(**checkpoint["model_args"]))
model.load_state_dict(checkpoint["model"])
model.eval().to(runtime.device)


def load_codec(config: dict) -> tuple[Callable[[str], list[int]], Callable[[list[int]], str]]:
    """The dataset's character vocabulary (its meta.pkl), else GPT-2 BPE."""
    meta_path = Path(config.get("data_dir", "data")) / config.get("dataset", "") / "meta.pkl"
    meta = pickle.loads(meta_path.read_bytes()) if meta_path.is_file() else {}
    if "stoi" in meta:
        print(f"character vocabulary from {meta_path}")
        stoi, itos = meta["stoi"], meta["itos"]

        def encode(s: str) -> list[int]:
            unknown = sorted(set(s) - set(stoi))
            if unknown:
                die(f"the prompt has characters the model's vocabulary lacks: {''.join(unknown)!r}")
            return [stoi[c] for c in s]

        return encode, lambda ids: "".join(itos[i] for i in ids)
    if checkpoint["model_args"]["vocab_size"] < 50257:
        die(f"no character vocabulary at {meta_path} for this {checkpoint['model_args']['vocab_size']}-token model")
    enc = gpt2_encoding()
    return (lambda s: enc.encode(s, allowed_special={"<|endoftext|>"})), enc.decode


encode, decode = load_codec(checkpoint.get("config", {}))
if start.startswith("FILE:"):
    prompt_path = Path(start[5:])
    if not prompt_path.is_file():
        die(f"prompt file {prompt_path} not found")
    start = prompt_path.read_text(encoding="utf-8")
start_ids = encode(start)
if not start_ids:
    die("the prompt is empty; give at least one character or token with --start")
x = torch.tensor(start_ids, dtype=torch.long, device=runtime.device)[None, ...]

with torch.no_grad(), runtime.autocast_ctx():
    for _ in range(num_samples):
        y = model.generate(x, max_new_tokens, temperature=temperature, top_k=top_k or None, generator=generator)
        print(decode(y[0].tolist()))
        print("---------------")
