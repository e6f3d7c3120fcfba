"""The memory savers through the scripts: config/low_memory.py over finetune_shakespeare.py and
speedrun.py (configured, then a tiny run of each trained, saved and resumed bit for bit with its
low-bit state), a bfloat16 checkpoint read by sample.py, export.py, hellaswag.py and nanoGPT's
sample.py's calls, a corrupt low-bit state in a checkpoint refused in one line, and bench.py
measuring a saver.

torchao compiles its optimizers' step per parameter shape (tens of seconds each on a CPU): these
runs take it eagerly (TORCHDYNAMO_DISABLE, the same maths), as tests/test_lowmem.py does;
tests/test_lowmem_slow.py compiles."""

import json

import pytest
import torch
from test_hellaswag import EXAMPLES
from test_loader import llmc_folder
from test_resume import assert_same_run

from configurator import read_config_file
from conftest import (
    ROOT,
    TINY_MODEL,
    assert_one_line_error,
    declarations,
    run_in_process,
    run_script,
    run_train,
)
from model import GPT, GPTConfig
from nanogpt_perf.train.checkpoint import save_checkpoint

pytest.importorskip("torchao")
LOW_MEMORY = str(ROOT / "config" / "low_memory.py")
CONFIGS = {"finetune_shakespeare": ("--init_from=scratch",), "speedrun": ()}
FLAGS = (
    "--learning_rate=1e-2",
    "--warmup_iters=2",
    "--lr_decay_iters=8",
    "--eval_iters=1",
    "--eval_interval=100",
)
FLAGS += (
    "--gradient_accumulation_steps=2",
    "--batch_size=4",
    "--dataset=tiny",
    "--always_save_checkpoint=True",
)


@pytest.fixture(autouse=True)
def eager_torchao(monkeypatch):
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "1")


@pytest.mark.parametrize("config", CONFIGS)
def test_low_memory_over_a_config_is_the_config_with_the_savers(config):
    declared = declarations("train.py")
    values = {}
    for path in (ROOT / "config" / f"{config}.py", LOW_MEMORY):
        values |= read_config_file(str(path))
    cfg = declared.config(**values)
    assert (cfg.weights_dtype, cfg.state_bits, cfg.muon_momentum_dtype) == (
        "bfloat16",
        8,
        "bfloat16",
    )
    assert cfg.optimizer == read_config_file(str(ROOT / "config" / f"{config}.py")).get(
        "optimizer", "adamw"
    )
    # the config's training as it was, but for the formats
    assert cfg.grad_clip == 1.0 and not cfg.in_backward


@pytest.mark.parametrize(
    "config", ["finetune_shakespeare", pytest.param("speedrun", marks=pytest.mark.slow)]
)
def test_low_memory_trains_saves_and_resumes_bit_for_bit(tiny_data, tmp_path, config):
    """The config with low_memory.py on a tiny model: 6 iterations straight, and 3 then resumed to
    6, the same losses and bfloat16 weights bit for bit (stochastic rounding draws from the
    generators the checkpoint keeps); the checkpoint's weights bfloat16 and its 8-bit state plain
    tensors."""
    flags = (
        str(ROOT / "config" / f"{config}.py"),
        LOW_MEMORY,
        *CONFIGS[config],
        *FLAGS,
        "--pad_vocab=1",
    )
    for out, iters in (("straight", 6), ("resumed", 3), ("resumed", 6)):
        resume = ("--init_from=resume",) if (tmp_path / out / "ckpt.pt").exists() else ()
        again = f"--out_dir={tmp_path / out}"  # after the config file's own
        result = run_train(
            tiny_data, tmp_path / out, *flags, again, f"--max_iters={iters}", *resume
        )
        assert result.returncode == 0, result.stderr
    assert_same_run(tmp_path / "straight", tmp_path / "resumed", 3, 6)
    checkpoint = torch.load(tmp_path / "resumed" / "ckpt.pt", weights_only=True)
    assert {t.dtype for t in checkpoint["model"].values()} == {torch.bfloat16}
    states = [
        s
        for s in checkpoint["optimizer"]["state"].values()
        for s in s.values()
        if isinstance(s, dict)
    ]
    assert config == "speedrun" or states and all(type(s["codes"]) is torch.Tensor for s in states)


def test_a_corrupt_low_bit_state_in_a_checkpoint_is_one_error_line(tiny_data, tmp_path):
    out = tmp_path / "out"
    flags = (LOW_MEMORY, "--n_embd=64", "--max_iters=2", "--eval_interval=2", "--eval_iters=1")
    flags += ("--gradient_accumulation_steps=1",)
    assert (result := run_train(tiny_data, out, *flags)).returncode == 0, result.stderr
    checkpoint = torch.load(out / "ckpt.pt", weights_only=True)
    entry = next(
        s["exp_avg"]
        for s in checkpoint["optimizer"]["state"].values()
        if isinstance(s["exp_avg"], dict)
    )
    entry["scale"][0] = float("nan")
    save_checkpoint(checkpoint, out / "ckpt.pt")
    before = (out / "ckpt.pt").read_bytes()
    result = run_train(tiny_data, out, *flags, "--max_iters=4", "--init_from=resume")
    assert_one_line_error(result, "optimizer state", "not finite and >= 0 (corrupt)")
    assert (out / "ckpt.pt").read_bytes() == before


@pytest.fixture(scope="module")
def bf16_gpt2_checkpoint(tmp_path_factory):
    """A run of low_memory.py on GPT-2's tokens (an llm.c-format dataset): its out_dir."""
    root = tmp_path_factory.mktemp("lowmem")
    llmc_folder(root / "data" / "gpt2tokens", [3000, 3000])
    flags = (
        *TINY_MODEL,
        f"--data_dir={root / 'data'}",
        "--dataset=gpt2tokens",
        f"--out_dir={root / 'out'}",
    )
    flags += (
        LOW_MEMORY,
        "--max_iters=2",
        "--eval_interval=2",
        "--eval_iters=1",
        "--gradient_accumulation_steps=1",
    )
    result = run_script("train.py", *flags)
    assert result.returncode == 0, result.stderr
    return root


def test_sample_export_and_hellaswag_read_a_bfloat16_checkpoint(bf16_gpt2_checkpoint):
    transformers = pytest.importorskip("transformers")
    out, root = bf16_gpt2_checkpoint / "out", bf16_gpt2_checkpoint
    assert (
        torch.load(out / "ckpt.pt", weights_only=True)["model"]["lm_head.weight"].dtype
        == torch.bfloat16
    )
    sample = run_script(
        "sample.py", f"--out_dir={out}", "--num_samples=1", "--max_new_tokens=5", "--device=cpu"
    )
    assert sample.returncode == 0, sample.stderr
    export = run_script("export.py", f"--out_dir={out}", f"--export_dir={root / 'hf'}")
    assert export.returncode == 0, export.stderr
    hf = transformers.GPT2LMHeadModel.from_pretrained(root / "hf")
    ours = GPT.from_checkpoint(torch.load(out / "ckpt.pt", weights_only=True))
    assert torch.equal(hf.transformer.wte.weight.float(), ours.transformer.wte.weight[:50257])
    examples = root / "hellaswag.jsonl"
    lines = [{"ctx": ctx, "endings": endings, "label": label} for ctx, endings, label in EXAMPLES]
    examples.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    scored = run_script("hellaswag.py", f"--out_dir={out}", "--device=cpu", f"--file={examples}")
    assert scored.returncode == 0, scored.stderr
    assert f"{len(EXAMPLES)} examples" in scored.stdout


def test_nanogpts_sample_py_calls_load_a_bfloat16_checkpoint(bf16_gpt2_checkpoint):
    """nanoGPT's sample.py: GPTConfig(**model_args), GPT(gptconf), load_state_dict (a float32 model
    takes bfloat16 tensors as float32, exactly), generate."""
    checkpoint = torch.load(bf16_gpt2_checkpoint / "out" / "ckpt.pt", map_location="cpu")
    model = GPT(GPTConfig(**checkpoint["model_args"]))
    model.load_state_dict(checkpoint["model"])
    assert all(
        torch.equal(p, checkpoint["model"][n].float()) for n, p in model.state_dict().items()
    )
    model.eval()
    with torch.no_grad():
        y = model.generate(torch.tensor([[1, 2, 3]]), 5, temperature=0.8, top_k=200)
    assert y.shape == (1, 8)


@pytest.mark.slow
def test_ddp_trains_with_low_bit_state_and_refuses_bfloat16_weights(tiny_data, tmp_path):
    """Under two ranks, 8-bit AdamW state and 8-bit Muon momentum (deterministic: the replicas stay
    equal) train and save; low_memory.py's bfloat16 weights are refused in one line (each rank's
    stochastic rounding draws its own)."""
    for optimizer in ("adamw", "muon"):
        flags = (
            "--state_bits=8",
            "--muon_momentum_dtype=8bit",
            f"--optimizer={optimizer}",
            "--n_embd=64",
        )
        flags += (
            "--max_iters=2",
            "--eval_interval=2",
            "--eval_iters=1",
            "--gradient_accumulation_steps=2",
        )
        result = run_train(tiny_data, tmp_path / optimizer, *flags, ranks=2)
        assert result.returncode == 0, result.stderr
        assert (tmp_path / optimizer / "ckpt.pt").is_file()
    refused = run_train(tiny_data, tmp_path / "bf16", LOW_MEMORY, "--max_iters=2", ranks=2)
    assert refused.returncode != 0 and "DDP's replicas would drift apart" in refused.stderr
    assert not (tmp_path / "bf16" / "ckpt.pt").exists()


@pytest.mark.slow
def test_a_compiled_model_trains_with_the_savers(tiny_data, tmp_path, monkeypatch):
    """compile=True with low_memory.py and with the step inside backward: the compiled bfloat16
    model, torchao's compiled step (minutes on a CPU: -m slow), a checkpoint saved."""
    monkeypatch.delenv("TORCHDYNAMO_DISABLE")
    flags = (
        LOW_MEMORY,
        "--compile=True",
        "--n_embd=64",
        "--max_iters=2",
        "--eval_interval=2",
        "--eval_iters=1",
    )
    flags += ("--gradient_accumulation_steps=1",)
    for out, more in (("clipped", ()), ("in_backward", ("--in_backward=True", "--grad_clip=0.0"))):
        result = run_train(tiny_data, tmp_path / out, *flags, *more)
        assert result.returncode == 0, result.stderr
        assert (tmp_path / out / "ckpt.pt").is_file()


def test_bench_py_times_the_savers():
    flags = ("bench.py", *TINY_MODEL, "--device=cpu", "--steps=1", "--burn_in=1", "--vocab_size=64")
    result = run_script(*flags, "--sweep=state_bits=32,8", "--weights_dtype=bfloat16")
    assert result.returncode == 0, result.stderr
    assert "state_bits=32" in result.stdout and "state_bits=8" in result.stdout
    refused = run_in_process(*flags, "--in_backward=True")
    assert_one_line_error(refused, "in_backward=True", "grad_clip=1.0")
