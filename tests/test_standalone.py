"""model.py copied alone into an empty folder, as nanoGPT's users copy its model.py: in a fresh
interpreter that cannot import anything of the repository (no sys.path entry for it, no editable
install's finder), it builds a small GPT with torch only, trains it (configure_optimizers' AdamW)
and generates with temperature and top_k."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import ROOT

RECIPE = dict(
    rotary=True, rmsnorm=True, qk_norm=True, relu2=True, untied_head=True, logit_softcap=30.0
)
RECIPE |= dict(zero_init_proj=True, value_embeds=True, unet_skips=True)
CASES = {
    "default": {},
    **{k: {k: v} for k, v in RECIPE.items()},
    "all": RECIPE,
    "loss_chunk": dict(loss_chunk=7),
}

# run in the empty folder, which holds model.py and this script only: every case of argv[1] in one
# interpreter
SCRIPT = """
import importlib.util, json, sys
import torch

reachable = "the repository is reachable: " + repr(sys.path)
assert importlib.util.find_spec("nanogpt_perf") is None, reachable
import model
from model import GPT, GPTConfig

torch.set_num_threads(1)  # tiny tensors: one thread is fastest, and leaves the others other tests


def check(options):
    torch.manual_seed(0)
    shape = dict(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32, dropout=0.0)
    config = GPTConfig(**shape, **options)
    gpt = GPT(config)
    optimizer = gpt.configure_optimizers(0.1, 1e-2, (0.9, 0.95), "cpu")
    before = {n: p.detach().clone() for n, p in gpt.named_parameters()}
    x = torch.randint(64, (4, 17), generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(5):  # the same batch: its loss must fall
        logits, loss = gpt(x[:, :-1], x[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    moved = sorted(n for n, p in gpt.named_parameters() if not torch.equal(p, before[n]))
    gpt.eval()
    prompt = x[:, :3]
    draw = lambda: torch.Generator().manual_seed(2)
    seeded = [gpt.generate(prompt, 10, 0.8, top_k=10, generator=draw()) for _ in range(2)]
    top1 = gpt.generate(prompt, 10, temperature=0.8, top_k=1)
    return dict(
        losses=losses, logits=None if logits is None else list(logits.shape), moved=moved,
        params=sorted(n for n, _ in gpt.named_parameters()), same_seed=torch.equal(*seeded),
        sampled=seeded[0].tolist(),
        top1_is_greedy=torch.equal(top1, gpt.generate(prompt, 10, temperature=0)),
    )


results = {name: check(options) for name, options in json.loads(sys.argv[1]).items()}
project = sorted(m for m in sys.modules if m.split(".")[0] in ("nanogpt_perf", "configurator"))
print(json.dumps(dict(file=model.__file__, project=project, results=results)))
"""


def isolated(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """python -S (no site: the editable install's .pth and its finder are not loaded) in folder,
    with only torch's own site-packages on PYTHONPATH: the folder's files, the standard library and
    torch are all it can import."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = str(Path(torch.__file__).parents[1])
    return subprocess.run(
        [sys.executable, "-S", *args], cwd=folder, env=env, capture_output=True, text=True
    )


@pytest.fixture(scope="module")
def alone(tmp_path_factory) -> tuple[Path, dict]:
    """The folder with model.py alone (and check.py), and what check.py found for every case."""
    folder = tmp_path_factory.mktemp("alone")
    shutil.copy(ROOT / "model.py", folder / "model.py")
    (folder / "check.py").write_text(SCRIPT)
    result = isolated(folder, "check.py", json.dumps(CASES))
    assert result.returncode == 0, result.stderr
    return folder, json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize("case", CASES)
def test_model_py_alone_trains_and_generates_with_torch_only(alone, case):
    folder, found = alone
    assert Path(found["file"]) == folder / "model.py" and found["project"] == []
    out = found["results"][case]
    assert out["losses"][-1] < out["losses"][0] - 0.1  # it learns its batch
    assert out["moved"] == out["params"]  # every parameter took a step
    assert out["logits"] == (None if "loss_chunk" in CASES[case] else [4, 16, 64])
    assert out["same_seed"] and out["top1_is_greedy"]
    sampled = torch.tensor(out["sampled"])
    assert sampled.shape == (4, 13) and 0 <= sampled.min() and sampled.max() < 64
    assert len(set(sampled[:, 3:].flatten().tolist())) > 5  # drawn, not one token repeated


def test_the_folder_really_is_cut_off_from_the_repository(alone):
    """The isolation the test above relies on: there, the package and the configurator cannot be
    found even by name, though the probe finds them where they can be (the repository's root, or any
    folder through the editable install's finder)."""
    folder, _ = alone
    probe = "import importlib.util as u; "
    probe += "print([u.find_spec(n) is not None for n in ('nanogpt_perf', 'configurator')])"
    assert isolated(folder, "-c", probe).stdout.strip() == "[False, False]"
    here = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True)
    assert here.stdout.strip() == "[True, True]"
