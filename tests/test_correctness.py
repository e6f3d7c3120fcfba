"""Fixes that must stay fixed: batched prompts with several samples each (the generation engine),
checkpoints that carry their tokenizer, special-token ids inside the exported vocabulary, meta.pkl
read as data only, a peak table whose every entry is reachable by the name a driver reports."""

import pickle
import shutil

import pytest
import torch

from conftest import (
    ROOT,
    assert_one_line_error,
    refuse_train,
    run_in_process,
    run_script,
    run_train,
)
from model import GPT, GPTConfig
from nanogpt_perf.generate import Engine, Sampling
from nanogpt_perf.peak_flops import PEAK_TFLOPS, peak_flops_for_name
from nanogpt_perf.runtime import resolve_runtime
from nanogpt_perf.train.checkpoint import save_checkpoint

CONFIG = dict(block_size=16, vocab_size=64, n_layer=2, n_head=4, n_embd=32, dropout=0.0)


def random_model(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**CONFIG, **overrides})).double().eval()


def generate(
    model: GPT, idx: torch.Tensor, n: int, num_samples: int = 1, seed: int = 0, **sampling
) -> torch.Tensor:
    """idx extended by n tokens of the generation engine, num_samples sequences per prompt."""
    engine = Engine(model, resolve_runtime("cpu", "float32"))
    tokens = engine.tokens(
        idx, n, Sampling(**sampling), torch.Generator().manual_seed(seed), num_samples
    )
    return torch.cat([idx.repeat_interleave(num_samples, dim=0), *tokens], dim=1)


def test_batch_of_prompts_with_several_samples_each_equals_repeated_prompts():
    model = random_model()
    idx = torch.randint(64, (2, 5), generator=torch.Generator().manual_seed(1))
    shared = generate(model, idx, 20, num_samples=3, seed=7)
    repeated = generate(model, idx.repeat_interleave(3, dim=0), 20, seed=7)
    assert shared.shape == (6, 25) and torch.equal(shared, repeated)
    assert torch.equal(shared[:3, :5], idx[:1].expand(3, 5)) and torch.equal(
        shared[3:, :5], idx[1:].expand(3, 5)
    )


def test_greedy_samples_of_a_batch_of_prompts_equal_each_prompt_alone():
    model = random_model(seed=2)
    idx = torch.randint(64, (3, 4), generator=torch.Generator().manual_seed(3))
    out = generate(model, idx, 15, num_samples=2, temperature=0)
    for b in range(3):
        alone = generate(model, idx[b : b + 1], 15, temperature=0)
        assert torch.equal(out[2 * b], alone[0]) and torch.equal(out[2 * b + 1], alone[0])


def test_zero_samples_is_refused():
    with pytest.raises(ValueError, match="num_samples"):
        generate(random_model(), torch.zeros(1, 3, dtype=torch.long), 4, num_samples=0)


def test_sample_decodes_after_the_data_folder_is_gone_from_another_directory(tiny_data, tmp_path):
    data_dir = tmp_path / "data"
    shutil.copytree(tiny_data, data_dir)
    out = tmp_path / "out"
    result = run_train(data_dir, out, "--max_iters=3", "--eval_interval=3", "--eval_iters=1")
    assert result.returncode == 0, result.stderr
    shutil.rmtree(data_dir)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    flags = [
        f"--out_dir={out}",
        "--start=the ",
        "--num_samples=1",
        "--max_new_tokens=20",
        "--device=cpu",
    ]
    result = run_script(str(ROOT / "sample.py"), *flags, cwd=elsewhere)
    assert result.returncode == 0, result.stderr
    assert "tokenizer: characters" in result.stdout
    sample = result.stdout.split("tokenizer: characters")[1].split("\n", 1)[1]
    assert sample.startswith("the ") and set(sample[:24]) <= set(
        (tiny_data / "tiny" / "input.txt").read_text()
    )


def save_tiny_checkpoint(path, tokenizer: dict, vocab_size: int) -> None:
    model_args = dict(CONFIG, vocab_size=vocab_size, n_embd=16)
    model = GPT(GPTConfig(**model_args))
    save_checkpoint(
        {"model": model.state_dict(), "model_args": model_args, "tokenizer": tokenizer}, path
    )


@pytest.mark.parametrize(
    "tokenizer, model_vocab, exported_vocab, eos",
    [
        ({"kind": "gpt2"}, 50304, 50257, 50256),
        ({"kind": "characters", "itos": list("abcdefgh")}, 64, 8, None),
    ],
)
def test_export_writes_special_tokens_only_inside_the_vocabulary(
    tmp_path, tokenizer, model_vocab, exported_vocab, eos
):
    transformers = pytest.importorskip("transformers")
    save_tiny_checkpoint(tmp_path / "out" / "ckpt.pt", tokenizer, model_vocab)
    result = run_script(
        "export.py", f"--out_dir={tmp_path / 'out'}", f"--export_dir={tmp_path / 'hf'}"
    )
    assert result.returncode == 0, result.stderr
    config = transformers.GPT2Config.from_pretrained(tmp_path / "hf")
    assert (
        config.vocab_size == exported_vocab
        and config.eos_token_id == eos
        and config.bos_token_id == eos
    )


def test_export_refuses_a_tokenizer_larger_than_the_model(tmp_path):
    pytest.importorskip("transformers")
    save_tiny_checkpoint(tmp_path / "out" / "ckpt.pt", {"kind": "gpt2"}, 64)
    result = run_in_process(
        "export.py", f"--out_dir={tmp_path / 'out'}", f"--export_dir={tmp_path / 'hf'}"
    )
    assert_one_line_error(result, "50257", "64")
    assert not (tmp_path / "hf").exists()


class _Payload:
    """Unpickling this calls Path.touch(marker): what a hostile meta.pkl could do with any
    callable."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (type(self.marker).touch, (self.marker,))


def test_a_meta_pkl_that_would_run_code_is_refused_unrun(tiny_data, tmp_path):
    data_dir = tmp_path / "data"
    shutil.copytree(tiny_data, data_dir)
    marker = tmp_path / "it-ran"
    meta = data_dir / "tiny" / "meta.pkl"
    meta.write_bytes(pickle.dumps({"vocab_size": 40, "itos": _Payload(marker)}))
    before = meta.read_bytes()
    result = refuse_train(data_dir, tmp_path / "out", "--max_iters=1")
    assert_one_line_error(result, "meta.pkl", "plain data")
    assert (
        not marker.exists()
        and meta.read_bytes() == before
        and not (tmp_path / "out" / "ckpt.pt").exists()
    )


# The names torch.cuda.get_device_name reports for these GPUs, and the dense bf16 TFLOP/s each
# should get.
DRIVER_NAMES = {
    "NVIDIA H100 80GB HBM3": 989.4,
    "NVIDIA H100 PCIe": 756.0,
    "NVIDIA H100 NVL": 835.5,
    "NVIDIA GH200 480GB": 989.4,
    "NVIDIA H200": 989.4,
    "NVIDIA H200 NVL": 835.5,
    "NVIDIA A100-SXM4-80GB": 312.0,
    "NVIDIA A100 80GB PCIe": 312.0,
    "NVIDIA A10": 125.0,
    "NVIDIA L40S": 362.05,
    "NVIDIA L40": 181.05,
    "NVIDIA L4": 121.0,
    "NVIDIA RTX 6000 Ada Generation": 364.2,
    "NVIDIA GeForce RTX 4090": 165.2,
    "NVIDIA RTX A6000": 154.8,
    "NVIDIA GeForce RTX 3090": 71.0,
}


@pytest.mark.parametrize("name, tflops", DRIVER_NAMES.items())
def test_driver_names_get_their_own_entry(name, tflops):
    assert peak_flops_for_name(name, "bf16") == pytest.approx(tflops * 1e12)


def test_no_entry_is_shadowed_by_an_earlier_one():
    for i, (key, _) in enumerate(PEAK_TFLOPS):
        earlier = [k for k, _ in PEAK_TFLOPS[:i] if k in key]
        assert not earlier, f"{key!r} can never match: {earlier} comes first"


def test_unknown_devices_and_missing_precisions_have_no_peak():
    assert peak_flops_for_name("Some Future Accelerator", "bf16") is None
    assert peak_flops_for_name("Tesla V100-SXM2-16GB", "bf16") is None  # no bf16 units
    assert peak_flops_for_name("Tesla V100-SXM2-16GB", "fp16") == pytest.approx(125e12)
