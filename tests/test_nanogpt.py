"""nanoGPT's users' habits: the calls its bench.py, train.py and sample.py make on model.py, in
their order and with their arguments, against ours; its checkpoints (plain, or with torch.compile's
_orig_mod. prefix) sampled, resumed and exported; ours in the form its sample.py reads."""

import shutil
import time

import pytest
import torch

from conftest import ROOT, TINY_MODEL, run_script, tiny_hf_folder
from model import GPT, GPTConfig

# its GPTConfig
NANOGPT_MODEL_ARGS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size", "dropout")


def batch(vocab: int, B: int = 4, T: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    data = torch.randint(vocab, (B, T + 1), generator=torch.Generator().manual_seed(0))
    return data[:, :-1], data[:, 1:]


def test_the_calls_of_nanogpts_bench_py():
    gptconf = GPTConfig(block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0, bias=False)
    model = GPT(gptconf)
    model.to("cpu")
    optimizer = model.configure_optimizers(
        weight_decay=1e-2, learning_rate=1e-4, betas=(0.9, 0.95), device_type="cpu"
    )
    X, Y = batch(gptconf.vocab_size)
    t0 = time.time()
    for _ in range(3):
        logits, loss = model(X, Y)
        X, Y = batch(gptconf.vocab_size)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        lossf = loss.item()
    dt = time.time() - t0
    mfu = model.estimate_mfu(4 * 1 * 3, dt)
    assert logits.shape == (4, 16, gptconf.vocab_size) and lossf > 0
    # an A100's bf16 peak, as nanoGPT
    assert mfu == pytest.approx(model.flops_per_token() * 16 * 12 / dt / 312e12)


def test_the_calls_of_nanogpts_train_py(tmp_path):
    model_args = dict(
        n_layer=2, n_head=2, n_embd=32, block_size=32, bias=False, vocab_size=None, dropout=0.0
    )
    model_args["vocab_size"] = 65  # meta.pkl's
    model = GPT(GPTConfig(**model_args))
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
    X, Y = batch(65)
    _, loss = model(X, Y)
    loss.backward()
    optimizer.step()
    checkpoint = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "model_args": model_args,
        "iter_num": 1,
        "best_val_loss": torch.tensor(4.1),
        "config": {},
    }
    # resume: the checkpoint's model_args over the script's, its weights, its optimizer state
    for k in NANOGPT_MODEL_ARGS:
        model_args[k] = checkpoint["model_args"][k]
    resumed = GPT(GPTConfig(**model_args))
    resumed.load_state_dict(checkpoint["model"])
    resumed_optimizer = resumed.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
    resumed_optimizer.load_state_dict(checkpoint["optimizer"])
    assert resumed_optimizer.state_dict()["state"].keys() == optimizer.state_dict()["state"].keys()
    # GPT-2 weights: from_pretrained with dropout overridden, its config read back, the context
    # cropped
    _, folder = tiny_hf_folder(tmp_path)
    gpt2 = GPT.from_pretrained(str(folder), dict(dropout=0.1))
    for k in NANOGPT_MODEL_ARGS:
        model_args[k] = getattr(gpt2.config, k)
    assert (
        model_args["dropout"] == 0.1
        and model_args["block_size"] == 32
        and model_args["vocab_size"] == 100
    )
    gpt2.crop_block_size(16)
    assert gpt2.config.block_size == 16 and gpt2.transformer.wpe.weight.shape[0] == 16
    assert gpt2.estimate_mfu(4 * 5, 0.5) > 0


def test_the_calls_of_nanogpts_sample_py_on_a_checkpoint_of_ours(tiny_data, tmp_path):
    out = tmp_path / "out"
    flags = ("--pad_vocab=1", "--max_iters=2", "--eval_interval=2", "--eval_iters=1")
    result = run_script(
        "train.py",
        *TINY_MODEL,
        f"--data_dir={tiny_data}",
        "--dataset=tiny",
        f"--out_dir={out}",
        *flags,
    )
    assert result.returncode == 0, result.stderr
    checkpoint = torch.load(out / "ckpt.pt", map_location="cpu")  # torch's default: weights only
    # all its GPTConfig takes, and no more
    assert set(checkpoint["model_args"]) == set(NANOGPT_MODEL_ARGS)
    gptconf = GPTConfig(**checkpoint["model_args"])
    model = GPT(gptconf)
    state_dict = checkpoint["model"]
    unwanted_prefix = "_orig_mod."
    for k in list(state_dict):
        if k.startswith(unwanted_prefix):
            state_dict[k[len(unwanted_prefix) :]] = state_dict.pop(k)
    model.load_state_dict(state_dict)
    model.eval()
    assert checkpoint["config"]["dataset"] == "tiny"  # where its sample.py looks for meta.pkl
    x = torch.tensor([[1, 2, 3]], dtype=torch.long)
    with torch.no_grad():
        y = model.generate(x, 10, temperature=0.8, top_k=200)
    # unpadded: every token decodes
    assert y.shape == (1, 13) and y.max() < gptconf.vocab_size == 31


def nanogpt_checkpoint(tiny_data, path, compiled: bool) -> dict:
    """A checkpoint as nanoGPT's train.py writes one after 5 iterations on the tiny dataset: its
    keys, its settings (its config dict, with a setting of a modified nanoGPT unknown here),
    best_val_loss a tensor; with compile, the weights' names behind torch.compile's _orig_mod.
    prefix."""
    torch.manual_seed(0)
    model_args = dict(
        n_layer=2, n_head=2, n_embd=32, block_size=32, bias=False, vocab_size=31, dropout=0.0
    )
    model = GPT(GPTConfig(**model_args))
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
    X, Y = batch(31, T=32)
    _, loss = model(X, Y)
    loss.backward()
    optimizer.step()
    prefix = "_orig_mod." if compiled else ""
    config = dict(
        out_dir="out", eval_interval=5, eval_iters=2, dataset="tiny", batch_size=8, block_size=32
    )
    config |= dict(
        gradient_accumulation_steps=1,
        learning_rate=1e-3,
        max_iters=5,
        lr_decay_iters=5,
        warmup_iters=1,
    )
    config |= dict(
        device="cuda", dtype="float16", compile=compiled, backend="nccl", min_lr=1e-4, my_own_knob=3
    )
    checkpoint = {
        "model": {prefix + k: v for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "model_args": model_args,
        "iter_num": 5,
        "best_val_loss": torch.tensor(3.25),
        "config": config,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, path)
    return checkpoint


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_a_nanogpt_checkpoint_samples_resumes_and_exports(tiny_data, tmp_path, compiled):
    # nanoGPT's data/<dataset>, relative to where it runs
    shutil.copytree(tiny_data, tmp_path / "data")
    out = tmp_path / "out"
    nanogpt_checkpoint(tiny_data, out / "ckpt.pt", compiled)
    sample = run_script(str(ROOT / "sample.py"), "--device=cpu", "--start=the ", "--num_samples=1",
                        "--max_new_tokens=20", cwd=tmp_path)  # fmt: skip
    assert sample.returncode == 0, sample.stderr
    # its dataset's meta.pkl, found as nanoGPT's sample.py finds it
    assert "characters (31)" in sample.stdout
    resume = run_script(
        str(ROOT / "train.py"),
        "--init_from=resume",
        "--device=cpu",
        "--dtype=float32",
        "--compile=False",
        "--max_iters=7",
        "--eval_interval=7",
        "--log_interval=1",
        cwd=tmp_path,
    )
    assert resume.returncode == 0, resume.stderr
    assert "my_own_knob=3 not applied (not a setting here)" in resume.stdout
    assert "backend='nccl' not applied (this command's 'auto')" in resume.stdout
    assert "iter 6:" in resume.stdout and "iter 5:" not in resume.stdout  # the iteration carried on
    after = torch.load(out / "ckpt.pt", weights_only=True)
    assert after["iter_num"] == 7 and after["best_val_loss"] <= 3.25  # the best loss carried on
    # AdamW's state carried on: 1 step, then 2 more
    assert after["optimizer"]["state"][0]["step"] == 3
    pytest.importorskip("transformers")
    export = run_script(str(ROOT / "export.py"), "--export_dir=hf", cwd=tmp_path)
    assert export.returncode == 0, export.stderr
    assert (tmp_path / "hf" / "model.safetensors").is_file()


def test_a_resumed_dtype_this_device_has_not_falls_back_to_auto(tiny_data, tmp_path):
    """nanoGPT saves dtype float16 from a machine without bf16; resumed on the CPU without --dtype,
    the run says it did not apply it and trains in the CPU's auto precision instead of refusing."""
    shutil.copytree(tiny_data, tmp_path / "data")
    nanogpt_checkpoint(tiny_data, tmp_path / "out" / "ckpt.pt", compiled=False)
    resume = run_script(
        str(ROOT / "train.py"),
        "--init_from=resume",
        "--device=cpu",
        "--compile=False",
        "--max_iters=6",
        "--eval_interval=6",
        cwd=tmp_path,
    )
    assert resume.returncode == 0, resume.stderr
    assert "resumed settings: dtype='float16' not applied (not on cpu): auto" in resume.stdout
    assert "dtype auto -> float32" in resume.stdout
