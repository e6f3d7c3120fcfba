"""Hostile checkpoints and weights: files that are not ours or nanoGPT's (pickled classes, foreign
zips, truncated), model_args that do not fit their weights, training states that cannot be resumed,
resumed settings that cannot apply, transformers folders that are not the GPT-2 they say, tokenizers
that outgrow their model. Each is refused in one 'error: ' line with every file as it was, and
nothing in a hostile file runs. Then issue 31's: a resume trains with the optimizer settings it
gives (read back from the optimizer's saved groups), a flag that the weights a run starts from do
not have is refused, resume_fallback finds ckpt-best.pt, checkpoints are never written through a
link."""

import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save as safetensors_bytes

from conftest import (
    DATA,
    HELLASWAG,
    HELLASWAG_LINE,
    HF_OK,
    RESUME,
    VOCABULARY,
    Case,
    Ckpt,
    E,
    H,
    RunCase,
    S,
    ScriptCase,
    T,
    assert_one_line_error,
    contents,
    hf,
    hf_weights,
    refuse_case,
    refuse_run_case,
    refuse_script_case,
    refuse_train,
    resumable_checkpoint,
    run_in_process,
    run_script,
    run_train,
    train_case,
    variant,
    write_files,
)
from nanogpt_perf.errors import UserError

INIT = {
    T: "--init_from={dir}/hf",
    S: "--init_from={dir}/hf",
    H: "--init_from={dir}/hf --file={dir}/hs.jsonl",
}
BROKEN_FOLDERS = {
    "config.json_missing": (hf(), "no readable config.json"),
    "config.json_not_json": (
        hf('{"model_type": "gpt2",'),
        "no readable config.json (JSONDecodeError)",
    ),
    "config.json_not_gpt2": (hf({"model_type": "llama"}), "does not describe a GPT-2"),
    "config.json_n_layer_text": (
        hf({"n_layer": "two"}),
        "n_layer must be a positive int, not 'two'",
    ),
    "config.json_heads": (hf({"n_head": 3}), "n_embd=8 is not divisible by n_head=3"),
    "config.json_activation": (
        hf({"activation_function": "relu"}),
        "activation_function is 'relu'",
    ),
    "config.json_huge": (hf({"n_layer": 10**9}), "n_layer=1000000000", "more than this machine's"),
    "safetensors_missing": (
        {"hf/config.json": HF_OK},
        "neither model.safetensors nor pytorch_model.bin",
    ),
    "safetensors_truncated": (
        hf({}, safetensors_bytes(hf_weights())[:3000]),
        "model.safetensors cannot be read",
    ),
    "safetensors_lacks_a_weight": (
        hf({}, safetensors_bytes(hf_weights(**{"h.0.mlp.c_fc.weight": None}))),
        "model.safetensors has no h.0.mlp.c_fc.weight",
    ),
    "safetensors_wrong_shape": (
        hf({}, safetensors_bytes(hf_weights(**{"wpe.weight": (16, 8)}))),
        "holds wpe.weight as [16, 8], config.json makes it [32, 8]",
    ),
    "pytorch_model.bin_garbage": (
        hf({}, b"not a checkpoint", "pytorch_model.bin"),
        "pytorch_model.bin cannot be read",
    ),
}


WEIGHTS = {}
for script, flags in INIT.items():
    present = DATA if script == T else HELLASWAG if script == H else {}
    for name, (files, *names) in BROKEN_FOLDERS.items():
        WEIGHTS[f"{script.removesuffix('.py')}-hf_{name}"] = Case(
            script, flags, ("is not a GPT-2 folder", *names), present | files
        )


CHECKPOINTS = {
    # a resume must have iterations left
    "resume_max_iters_below": train_case(
        RESUME + " --max_iters=3",
        "checkpoint in {dir}/out is at iter 5 and max_iters=3",
        "nothing to train",
        checkpoint="ours",
    ),
    "resume_max_iters_equal": train_case(
        RESUME + " --max_iters=5", "at iter 5 and max_iters=5", checkpoint="ours"
    ),
    "resume_saved_max_iters": train_case(
        RESUME, "at iter 5 and max_iters=5", "eval_only=True", checkpoint="ours"
    ),
    # checkpoints that are not ours or nanoGPT's
    "a_random_dict": train_case(
        RESUME, "not a nanogpt-perf checkpoint (missing model, model_args)", checkpoint="dict"
    ),
    "a_tensor": train_case(RESUME, "not a nanogpt-perf checkpoint", checkpoint="tensor"),
    "a_list": train_case(RESUME, "not a nanogpt-perf checkpoint", checkpoint="list"),
    "a_pickled_class": train_case(
        RESUME, "holds a Python object", "not loaded (it could run code)", checkpoint="class"
    ),
    "a_plain_pickle": train_case(RESUME, "truncated or not a checkpoint", checkpoint="pickle"),
    "a_zip_not_a_checkpoint": train_case(
        RESUME, "corrupt or not a torch checkpoint", checkpoint="zip"
    ),
    "an_empty_file": train_case(RESUME, "truncated or not a checkpoint", checkpoint="empty"),
    "model_args_missing_a_key": train_case(
        RESUME,
        "weights lack transformer.h.0.attn.c_attn.bias (its model_args lack bias: GPTConfig's "
        "defaults were taken)",
        checkpoint="no_bias",
    ),
    "model_args_missing_vocab_size": train_case(
        RESUME,
        "(16, 8), its model_args make it (50304, 8)",
        "lack vocab_size",
        checkpoint="no_vocab",
    ),
    "model_args_wrong_type": train_case(
        RESUME, "model_args' n_layer must be an int >= 1, not '2'", checkpoint="str_layers"
    ),
    "model_args_zero": train_case(
        RESUME, "model_args' n_head must be an int >= 1, not 0", checkpoint="zero_heads"
    ),
    "model_args_not_a_dict": train_case(
        RESUME, "model_args are a list, not a dict", checkpoint="args_list"
    ),
    "model_args_bad_dropout": train_case(
        RESUME, "dropout must be a number in [0, 1), not 'high'", checkpoint="dropout"
    ),
    "model_args_more_layers": train_case(
        RESUME, "n_layer=3, its weights hold 2 layers", checkpoint="three_layers"
    ),
    "model_args_other_shape": train_case(
        RESUME,
        "transformer.wte.weight is (16, 8), its model_args make it (32, 8)",
        checkpoint="vocab_32",
    ),
    "model_args_inconsistent": train_case(
        RESUME, "n_embd=8 is not divisible by n_head=3", checkpoint="three_heads"
    ),
    "model_not_a_state_dict": train_case(
        RESUME, "its model is not a state dict", checkpoint="model_list"
    ),
    "iter_num_a_string": train_case(
        RESUME, "iter_num must be an int >= 0, not '5'", checkpoint="iter_str"
    ),
    "iter_num_negative": train_case(
        RESUME, "iter_num must be an int >= 0, not -1", checkpoint="iter_neg"
    ),
    "best_val_loss_a_string": train_case(
        RESUME, "best_val_loss must be a number, not 'low'", checkpoint="best_str"
    ),
    "optimizer_missing": train_case(
        RESUME, "its optimizer is not an optimizer's state dict", checkpoint="no_optimizer"
    ),
    "config_not_a_dict": train_case(RESUME, "its config", "is not a dict", checkpoint="config_str"),
    "config_value_wrong_type": train_case(
        RESUME,
        "settings are not this train.py's",
        "max_iters must be int",
        checkpoint="config_type",
    ),
    "config_value_out_of_range": train_case(
        RESUME,
        "the checkpoint's eval_interval=0 is not valid here (>= 1)",
        "give eval_interval",
        checkpoint="config_range",
    ),
    "ranks_not_a_list": train_case(
        RESUME, "its ranks", "are not a list of dicts", checkpoint="ranks_str"
    ),
    "data_identity_a_string": train_case(RESUME, "its data_identity", checkpoint="identity_str"),
    "data_identity_no_folder": train_case(
        RESUME, "its data_identity", checkpoint="identity_no_folder"
    ),
    "model_args_an_unknown_option": train_case(
        RESUME,
        "its model_args name rotary_v2: an option this code does not know",
        checkpoint="unknown_option",
    ),
    # what a resumed run cannot change, and the data it resumes on
    "resume_with_another_optimizer": train_case(
        RESUME + " --max_iters=10 --optimizer=muon",
        "cannot resume with optimizer='muon' (checkpoint: 'adamw')",
        checkpoint="ours",
    ),
    "resume_with_rotary": train_case(
        RESUME + " --max_iters=10 --rotary=True",
        "rotary=True (checkpoint: False)",
        checkpoint="ours",
    ),
    "sample_model_args_missing_a_key": RunCase(
        Case("sample.py", "", ("lack bias",)), checkpoint="no_bias"
    ),
    "sample_model_args_bad_attention": RunCase(
        Case("sample.py", "", ("attention must be one of",)), checkpoint="attention"
    ),
    "sample_model_args_an_unknown_option": RunCase(
        Case("sample.py", "", ("an option this code does not know",)), checkpoint="unknown_option"
    ),
    "export_the_recipe_architecture": RunCase(
        Case("export.py", "", ("transformers' GPT-2 has no relu2",)), checkpoint="relu2"
    ),
    "export_other_shape": RunCase(
        Case("export.py", "", ("its model_args make it (32, 8)",)), checkpoint="vocab_32"
    ),
}


TOKENIZERS = {
    # vocabularies that do not fit their model (checkpoints: before the model is built)
    "sample-tokenizer-past-the-model": ScriptCase(
        S,
        "",
        ("the checkpoint's tokenizer (characters (100)) has 100 tokens", "vocabulary of 16"),
        {"out/ckpt.pt": Ckpt(100)},
    ),  # fmt: skip
    "export-tokenizer-past-the-model": ScriptCase(
        E,
        "",
        ("has 100 tokens, more than its model's vocabulary of 16",),
        {"out/ckpt.pt": Ckpt(100)},
    ),
    "hellaswag-tokenizer-past-the-model": ScriptCase(
        H, "", ("has 100 tokens",), {"out/ckpt.pt": Ckpt(100)} | HELLASWAG_LINE
    ),
    "sample-export-vocabulary-not-json": ScriptCase(
        S,
        "--init_from={dir}/hf",
        ("vocabulary.json is not a vocabulary",),
        hf({}) | {"hf/vocabulary.json": "{"},
    ),
    "sample-export-vocabulary-twice-a-character": ScriptCase(
        S,
        "--init_from={dir}/hf",
        ("itos gives two token ids the same string",),
        hf({}) | VOCABULARY(["a", "a"]),
    ),
    "sample-export-vocabulary-past-the-model": ScriptCase(
        S,
        "--init_from={dir}/hf",
        ("model folder's tokenizer", "100 tokens", "vocabulary of 64"),
        hf({}) | VOCABULARY(list("abc") + [chr(200 + i) for i in range(97)]),
    ),  # fmt: skip
    "hellaswag-export-of-characters": ScriptCase(
        H,
        "--init_from={dir}/hf",
        ("scored in GPT-2's tokens", "characters (3)"),
        hf({}) | VOCABULARY(list("abc")),
    ),
    "hellaswag-model-folder-smaller-than-gpt2": ScriptCase(
        H,
        "--init_from={dir}/hf",
        ("GPT-2 BPE) has 50257 tokens, more than its model's vocabulary of 64",),
        hf({}) | HELLASWAG_LINE,
    ),  # fmt: skip
}


@pytest.mark.parametrize("name", WEIGHTS)
def test_a_transformers_folder_refused_with_one_line_and_nothing_written(
    name: str, checkpoint: bytes, tmp_path
):
    refuse_case(WEIGHTS[name], tmp_path, checkpoint)


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_a_checkpoint_refused_with_one_line_and_nothing_written(
    name, variants, tmp_path, monkeypatch
):
    refuse_run_case(CHECKPOINTS[name], variants, tmp_path, monkeypatch)


@pytest.mark.parametrize("name", TOKENIZERS)
def test_a_tokenizer_refused_with_one_line_and_nothing_written(
    name, checkpoints, tmp_path, monkeypatch
):
    refuse_script_case(TOKENIZERS[name], checkpoints, tmp_path, monkeypatch)


def test_a_transformers_folder_that_is_whole_loads_quietly(tmp_path, capfd):
    """The cases' folder unspoilt loads, and transformers says nothing on stderr (no progress bar,
    no notes)."""
    from nanogpt_perf.gpt2_weights import load_gpt2

    for path, data in hf({}).items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(data if isinstance(data, bytes) else data.encode())
    capfd.readouterr()
    model = load_gpt2(str(tmp_path / "hf"))
    assert model.config.n_layer == 1 and model.config.vocab_size == 64
    assert capfd.readouterr().err == ""


def test_a_model_folders_vocabulary_against_a_datasets():
    from nanogpt_perf.guard.vocabulary import check_same_vocabulary

    chars = lambda s: {"kind": "characters", "itos": list(s)}  # noqa: E731
    check_same_vocabulary(chars("abc"), chars("abc"), "tiny")
    check_same_vocabulary({"kind": "gpt2"}, chars("abc"), "tiny")  # GPT-2's weights, any data
    with pytest.raises(UserError) as refused:
        check_same_vocabulary(chars("abc"), chars("abd"), "tiny")
    assert str(refused.value) == (
        "the model folder's vocabulary (3 characters, its vocabulary.json) is not dataset tiny's "
        "(3 characters): "
        "its token ids would mean other characters"
    )
    with pytest.raises(UserError, match=r"\(GPT-2's BPE\)"):
        check_same_vocabulary(chars("ab"), {"kind": "gpt2"}, "owt")


# -- issue 31
# --------------------------------------------------------------------------------------------------


SHORT = ("--eval_interval=2", "--eval_iters=1", "--log_interval=1")


@pytest.fixture(scope="module")
def two_iterations(tiny_data, tmp_path_factory) -> Path:
    """The out_dir of a run of 2 iterations (SHORT, AdamW): each test resumes a copy of its own."""
    out = tmp_path_factory.mktemp("two_iterations") / "out"
    result = run_train(tiny_data, out, *SHORT, "--max_iters=2")
    assert result.returncode == 0, result.stderr
    return out


def copy_of(out: Path, tmp_path: Path) -> Path:
    """A copy of out_dir out in tmp_path (each checkpoint a file of its own, as it is where links
    are not had)."""
    shutil.copytree(out, tmp_path / "out", copy_function=shutil.copy2)
    return tmp_path / "out"


def optimizer_groups(out: Path) -> list[dict]:
    """The param_groups of the optimizer state out_dir/ckpt.pt holds: what the run trained with."""
    return torch.load(out / "ckpt.pt", weights_only=True)["optimizer"]["param_groups"]


def test_a_resume_trains_with_the_adamw_settings_it_gives(two_iterations, tiny_data, tmp_path):
    out = copy_of(two_iterations, tmp_path)
    before = optimizer_groups(out)
    assert {g["weight_decay"] for g in before} == {0.1, 0.0} and {
        tuple(g["betas"]) for g in before
    } == {(0.9, 0.95)}
    assert all(g["fused"] for g in before) and {g["eps"] for g in before} == {1e-8}
    changed = (
        "--weight_decay=0.05",
        "--beta1=0.8",
        "--beta2=0.9",
        "--fused_adamw=False",
        "--adam_eps=1e-6",
    )
    resumed = run_train(tiny_data, out, *SHORT, "--init_from=resume", "--max_iters=4", *changed)
    assert resumed.returncode == 0, resumed.stderr
    groups = optimizer_groups(out)
    assert torch.load(out / "ckpt.pt", weights_only=True)["iter_num"] == 4
    # the decayed group's, the other's none
    assert {g["weight_decay"] for g in groups} == {0.05, 0.0}
    assert {tuple(g["betas"]) for g in groups} == {(0.8, 0.9)} and {g["eps"] for g in groups} == {
        1e-6
    }
    assert not any(g["fused"] for g in groups)


def test_a_resume_trains_with_the_muon_settings_it_gives(tiny_data, tmp_path):
    out, muon = tmp_path / "out", ("--optimizer=muon", "--learning_rate=1e-3")
    first = run_train(tiny_data, out, *SHORT, *muon, "--max_iters=2")
    assert first.returncode == 0, first.stderr
    (muon_group,) = [g for g in optimizer_groups(out) if g["muon"]]
    assert (muon_group["momentum"], muon_group["ns_steps"], muon_group["weight_decay"]) == (
        0.95,
        5,
        0.0,
    )
    assert muon_group["base_lr"] == 0.02
    changed = (
        "--muon_momentum=0.8",
        "--muon_ns_steps=3",
        "--muon_weight_decay=0.01",
        "--muon_lr=0.01",
    )
    changed += (
        "--learning_rate=2e-3",
        "--weight_decay=0.05",
        "--beta1=0.8",
        "--beta2=0.9",
        "--adam_eps=1e-6",
    )
    resumed = run_train(
        tiny_data, out, *SHORT, *muon, "--init_from=resume", "--max_iters=4", *changed
    )
    assert resumed.returncode == 0, resumed.stderr
    groups = optimizer_groups(out)
    (muon_group,) = [g for g in groups if g["muon"]]
    assert (muon_group["momentum"], muon_group["ns_steps"], muon_group["weight_decay"]) == (
        0.8,
        3,
        0.01,
    )
    # Newton-Schulz's, not adam_eps
    assert muon_group["base_lr"] == 0.01 and muon_group["eps"] == 1e-7
    assert {g["eps"] for g in groups if not g["muon"]} == {1e-6}
    adamw = [g for g in groups if not g["muon"]]
    assert {g["base_lr"] for g in adamw} == {2e-3} and {tuple(g["betas"]) for g in adamw} == {
        (0.8, 0.9)
    }
    assert {g["weight_decay"] for g in adamw} == {0.05, 0.0}


def test_muon_without_a_learning_rate_to_scale_by_is_refused(tiny_data, tmp_path):
    result = refuse_train(
        tiny_data, tmp_path / "out", "--optimizer=muon", "--learning_rate=0", "--min_lr=0"
    )
    assert_one_line_error(result, "learning_rate must be > 0", "optimizer='adamw'")
    assert not (tmp_path / "out").exists()


FROM_FOLDER = (
    "--out_dir={dir}/out --data_dir={dir}/data --dataset=tiny --device=cpu --compile=false"
)
FROM_FOLDER += " --init_from={dir}/hf --block_size=16"

# the flag, what the line says (the folder's GPT-2: n_layer 1, n_head 2, n_embd 8, biases)
AGAINST_THE_WEIGHTS = {
    "n_layer": ("--n_layer=4", "the weights fix n_layer=1, not n_layer=4"),
    "n_head": ("--n_head=4", "the weights fix n_head=2, not n_head=4"),
    "n_embd": ("--n_embd=16 --n_head=2", "the weights fix n_embd=8, not n_embd=16"),
    "bias": ("--bias=False", "the weights fix bias=True, not bias=False"),
    "two_at_once": (
        "--n_layer=3 --n_embd=16 --n_head=2",
        "n_layer=1, n_embd=8, not n_layer=3, n_embd=16",
    ),
    "an_init": ("--zero_init_proj=True", "zero_init_proj not applied, not zero_init_proj=True"),
    "a_recipe_field": ("--rotary=True", "GPT-2's weights fix its architecture; drop rotary"),
}


@pytest.mark.parametrize("name", AGAINST_THE_WEIGHTS)
def test_a_flag_that_the_weights_do_not_have_is_refused(name, tmp_path):
    flag, line = AGAINST_THE_WEIGHTS[name]
    write_files(tmp_path, DATA | hf({}))
    before = contents(tmp_path)
    result = run_in_process(
        "train.py", *f"{FROM_FOLDER} {flag}".replace("{dir}", str(tmp_path)).split()
    )
    assert_one_line_error(result, f"init_from={tmp_path}/hf", line)
    assert contents(tmp_path) == before


def test_a_flag_that_agrees_with_the_weights_trains_and_is_recorded(tmp_path):
    write_files(tmp_path, DATA | hf({}))
    flags = f"{FROM_FOLDER} --n_layer=1 --n_head=2 --bias=True --max_iters=1 --eval_interval=1"
    flags += " --eval_iters=1"
    result = run_in_process("train.py", *flags.replace("{dir}", str(tmp_path)).split())
    assert result.returncode == 0, result.stderr
    model_args = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["model_args"]
    assert (model_args["n_layer"], model_args["n_head"], model_args["n_embd"]) == (1, 2, 8)


@pytest.mark.parametrize(
    "flag", ["--n_layer=3", "--bias=True", "--zero_init_proj=True", "--block_size=16"]
)
def test_a_resume_refuses_a_change_to_what_its_weights_fix(
    two_iterations, tiny_data, tmp_path, flag
):
    out = copy_of(two_iterations, tmp_path)
    before = contents(out)
    result = refuse_train(tiny_data, out, "--init_from=resume", "--max_iters=4", *SHORT, flag)
    assert_one_line_error(result, f"cannot resume with {flag[2:].split('=')[0]}=", "are fixed")
    assert contents(out) == before


def test_every_architecture_and_init_field_is_fixed_on_resume():
    from model import ARCHITECTURE, fields_of_kind
    from nanogpt_perf.train.resume import FIXED_ON_RESUME

    # vocab_size: the data's, through pad_vocab
    assert set(ARCHITECTURE) - {"vocab_size"} <= set(FIXED_ON_RESUME)
    assert set(fields_of_kind("init")) <= set(FIXED_ON_RESUME) and "pad_vocab" in FIXED_ON_RESUME


def test_a_checkpoint_replaced_by_a_link_is_not_written_through(
    two_iterations, tiny_data, tmp_path
):
    out, users = copy_of(two_iterations, tmp_path), tmp_path / "users_file.pt"
    users.write_bytes((out / "ckpt.pt").read_bytes())
    # one that exists and one that the resume writes
    for name in ("ckpt.pt", "ckpt-best.pt", "ckpt-0000004.pt"):
        (out / name).unlink(missing_ok=True)
        (out / name).symlink_to(users)
    kept = users.read_bytes()
    resumed = run_train(tiny_data, out, *SHORT, "--init_from=resume", "--max_iters=4")
    assert resumed.returncode == 0, resumed.stderr
    assert users.read_bytes() == kept  # the link's target untouched
    for name in ("ckpt.pt", "ckpt-0000004.pt"):
        assert not (out / name).is_symlink() and (out / name).is_file()
    assert torch.load(out / "ckpt.pt", weights_only=True)["iter_num"] == 4


def test_resume_fallback_takes_ckpt_best_when_it_is_the_only_whole_one(
    two_iterations, tiny_data, tmp_path
):
    out = copy_of(two_iterations, tmp_path)
    best = out / "ckpt-best.pt"
    copy = best.read_bytes()
    best.unlink()
    best.write_bytes(copy)  # a file of its own (as where the file system has no links)
    for path in [out / "ckpt.pt", *out.glob("ckpt-0*.pt")]:
        path.write_bytes(path.read_bytes()[:100])  # truncated
    refused = refuse_train(tiny_data, out, "--init_from=resume", "--max_iters=4", *SHORT)
    assert_one_line_error(
        refused, "the newest whole one is", "ckpt-best.pt", "resume_fallback=True"
    )
    resumed = run_train(
        tiny_data, out, *SHORT, "--init_from=resume", "--max_iters=4", "--resume_fallback=True"
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from" in resumed.stdout and "ckpt-best.pt" in resumed.stdout


def test_resume_fallback_prefers_a_newer_iteration_to_ckpt_best(tmp_path):
    from nanogpt_perf.guard.checkpoint import newest_whole

    for name in ("ckpt-best.pt", "ckpt-0000002.pt", "ckpt-0000004.pt"):
        torch.save({"x": 1}, tmp_path / name)
    os.utime(tmp_path / "ckpt-best.pt", ns=(1, 1))  # saved before the iterations
    assert newest_whole(tmp_path) == tmp_path / "ckpt-0000004.pt"
    (tmp_path / "ckpt-0000004.pt").write_bytes(b"torn")
    assert newest_whole(tmp_path) == tmp_path / "ckpt-0000002.pt"
    (tmp_path / "ckpt-0000002.pt").write_bytes(b"torn")
    assert newest_whole(tmp_path) == tmp_path / "ckpt-best.pt"


SHORT_VOCABULARY = {  # issue 44's: each path to a checkpoint's tokenizer
    "sample": (S, "--out_dir={dir}/out --device=cpu --start=ab"),
    "export-hf": (E, "--out_dir={dir}/out --export_dir={dir}/hf"),
    "export-gguf": (E, "--out_dir={dir}/out --format=gguf"),
    "generate": ("lab/generate.py", "--out_dir={dir}/out --device=cpu"),
}


@pytest.mark.parametrize("stored", ["in the checkpoint", "in the dataset's meta.pkl"])
@pytest.mark.parametrize("name", SHORT_VOCABULARY)
def test_a_vocabulary_shorter_than_its_models_padding_is_refused(name, stored, tmp_path):
    """A model of 128 tokens (75 characters padded to a multiple of 64) whose stored vocabulary
    has 2: sampled, it drew from those 2 alone with no word."""
    import pickle

    from model import GPT, GPTConfig
    from nanogpt_perf.train.checkpoint import save_checkpoint

    model_args = dict(block_size=16, vocab_size=128, n_layer=1, n_head=2, n_embd=8, dropout=0.0)
    checkpoint = {"model": GPT(GPTConfig(**model_args)).state_dict(), "model_args": model_args}
    checkpoint["config"] = {"pad_vocab": 64, "data_dir": str(tmp_path / "data"), "dataset": "d"}
    (tmp_path / "out").mkdir()
    if stored == "in the checkpoint":
        checkpoint["tokenizer"] = {"kind": "characters", "itos": ["a", "b"]}
    else:
        (tmp_path / "data" / "d").mkdir(parents=True)
        meta = {"vocab_size": 2, "itos": {0: "a", 1: "b"}, "stoi": {"a": 0, "b": 1}}
        (tmp_path / "data" / "d" / "meta.pkl").write_bytes(pickle.dumps(meta))
    save_checkpoint(checkpoint, tmp_path / "out" / "ckpt.pt")
    before = contents(tmp_path)
    script, flags = SHORT_VOCABULARY[name]
    result = run_in_process(script, *flags.format(dir=tmp_path).split())
    said = ("(characters (2)) has 2 tokens", "vocabulary of 128", "pad_vocab=64: 65 at least")
    assert_one_line_error(result, *said)
    assert contents(tmp_path) == before


def test_a_model_folders_vocabulary_shorter_than_its_model_is_refused(tmp_path):
    """An export cuts the padding (export.py): its vocabulary.json is its model's whole."""
    write_files(tmp_path, hf({}) | VOCABULARY(list("abc")))  # a model of 64 tokens
    before = contents(tmp_path)
    result = run_in_process(S, f"--init_from={tmp_path / 'hf'}", "--device=cpu", "--start=ab")
    said = ("model folder's tokenizer (characters (3)) has 3 tokens", "vocabulary of 64")
    assert_one_line_error(result, *said)
    assert contents(tmp_path) == before


# -- issue 44's siblings: numbers out of range in a checkpoint ------------------------------------


def model_arg(key, value):
    return lambda c: c["model_args"].__setitem__(key, value)


def top_level(key, value):
    return lambda c: c.__setitem__(key, value)


MORE = "--max_iters=10"  # past the checkpoint's 5: a run that would train
NAN = torch.tensor(float("nan"))
NUMBERS = {  # a change to a resumable checkpoint, more flags, what the line says
    "n_embd=2**40": (model_arg("n_embd", 2**40), "", "Storage size calculation overflowed"),
    "n_embd=2**63": (model_arg("n_embd", 2**63), "", "n_embd must be a number within 64 bits"),
    "best=10**400": (top_level("best_val_loss", 10**400), MORE, "must be a number, not an"),
    "best=nan": (top_level("best_val_loss", NAN), MORE, "must be a number, not nan"),
    "iter_num=2**63": (top_level("iter_num", 2**63), "--eval_only=True", "within 64 bits"),
}


@pytest.mark.parametrize("name", NUMBERS)
def test_a_number_out_of_range_in_a_checkpoint_is_one_line(name, tmp_path):
    """A RuntimeError and an OverflowError (tracebacks), torch's C++ stack in the line, a loss no
    later one is lower than (never a best), an iteration past an int64: each refused as read."""
    change, flags, said = NUMBERS[name]
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "ckpt.pt").write_bytes(variant(resumable_checkpoint(), change))
    refuse_case(Case(T, f"{RESUME} {flags}", (said,)), tmp_path, b"")


def test_a_checkpoint_of_a_huge_n_layer_is_refused_at_once(tmp_path):
    """Its layers were compared with set(range(n_layer)): memory without end. In a process of its
    own, so that a regression fails the test instead of the suite."""
    huge = variant(resumable_checkpoint(), model_arg("n_layer", 2**40))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "ckpt.pt").write_bytes(huge)
    result = run_script(S, f"--out_dir={tmp_path / 'out'}", "--device=cpu", timeout=120)
    assert_one_line_error(result, f"model_args say n_layer={2**40}, its weights hold 2 layers")
