import pickle

import numpy as np

from data.tiny_shakespeare import markdown_play_to_text

# Markdown ends a line inside a speech with two spaces
PLAY = "\n".join(
    [
        "# Hamlet",
        "",
        "## ACT I",
        "",
        "### SCENE I. Elsinore.",
        "",
        "_FRANCISCO at his post. Enter to him BERNARDO_",
        "",
        "**BERNARDO**  ",
        "Who's there?",
        "",
        "**FRANCISCO**  ",
        "Nay, answer me: stand,  ",
        "and unfold yourself\\*.",
        "",
        "_Exit_",
    ]
)


def test_markdown_play_becomes_speaker_lines():
    assert (
        markdown_play_to_text(PLAY)
        == "BERNARDO:\nWho's there?\n\nFRANCISCO:\nNay, answer me: stand,\nand unfold yourself*.\n\n"
    )


def test_char_prepare_on_local_input(tmp_path):
    from data.shakespeare_char.prepare import prepare

    text = "First Citizen:\nBefore we proceed any further, hear me speak.\n\n" * 20
    (tmp_path / "input.txt").write_text(text)
    meta = prepare(tmp_path)
    train = np.fromfile(tmp_path / "train.bin", dtype=np.uint16)
    val = np.fromfile(tmp_path / "val.bin", dtype=np.uint16)
    assert len(train) + len(val) == len(text) and len(train) == int(0.9 * len(text))
    assert "".join(meta["itos"][i] for i in np.concatenate([train, val]).tolist()) == text
    assert meta["source"].startswith("local file")
    assert pickle.loads((tmp_path / "meta.pkl").read_bytes())["vocab_size"] == len(set(text))


def test_bpe_prepare_on_local_input(tmp_path):
    from common import gpt2_encoding
    from data.shakespeare.prepare import prepare

    text = "Hello world, said the king.\n" * 50
    (tmp_path / "input.txt").write_text(text)
    prepare(tmp_path)
    ids = np.concatenate([np.fromfile(tmp_path / f"{s}.bin", dtype=np.uint16) for s in ("train", "val")])
    assert gpt2_encoding().decode(ids.tolist()) == text


def test_gpt2_encoding_matches_the_published_ids():
    from common import gpt2_encoding

    enc = gpt2_encoding()
    assert enc.encode_ordinary("Hello world,") == [15496, 995, 11]
    assert enc.n_vocab == 50257 and enc.eot_token == 50256
