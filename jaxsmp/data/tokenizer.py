"""Tokenizers: UTF-8 bytes (the default, nothing to load) or a Hugging Face
``tokenizer.json`` through the ``tokenizers`` library, and a small byte-level BPE
trainer for local corpora.

    tok = load_tokenizer("path/to/tokenizer.json")      # or an HF checkpoint directory
    ids = tok.encode("hello")                           # int32 numpy array
    tok.identity                                        # recorded with prepared datasets
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

TOKENIZER_FILE = "tokenizer.json"
# names of end-of-text tokens, looked up when tokenizer_config.json does not say
EOS_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255."""
    vocab_size = 256
    eos_id = None
    identity = {"kind": "bytes", "vocab_size": 256}
    name = "bytes"

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [self.encode(t) for t in texts]

    def decode(self, ids) -> str:
        return bytes(np.asarray(ids, dtype=np.uint8).tolist()).decode("utf-8", errors="replace")


class HFTokenizer:
    """A ``tokenizers.Tokenizer``; ``identity`` hashes its full definition, so two
    files with the same vocabulary and merges have the same identity."""

    def __init__(self, tokenizer, name: str, eos_id: int | None = None):
        self.tokenizer, self.name, self.eos_id = tokenizer, name, eos_id
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        digest = hashlib.sha256(tokenizer.to_str().encode()).hexdigest()
        self.identity = {"kind": "huggingface", "sha256": digest, "vocab_size": self.vocab_size}

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False).ids, np.int32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        encoded = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        return [np.asarray(e.ids, np.int32) for e in encoded]

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids])

    def save(self, path: str | os.PathLike) -> None:
        self.tokenizer.save(os.fspath(path))


Tokenizer = ByteTokenizer | HFTokenizer


def _eos_id(tokenizer, directory: Path) -> int | None:
    """The end-of-text id: tokenizer_config.json's ``eos_token``, else a known name."""
    config = directory / "tokenizer_config.json"
    names = list(EOS_NAMES)
    if config.is_file():
        eos = json.loads(config.read_text()).get("eos_token")
        eos = eos.get("content") if isinstance(eos, dict) else eos
        names = [eos] if eos else names
    ids = [tokenizer.token_to_id(n) for n in names]
    return next((i for i in ids if i is not None), None)


def has_tokenizer(directory: str | os.PathLike) -> bool:
    """Whether ``directory`` (e.g. an HF checkpoint) holds a ``tokenizer.json``."""
    return (Path(directory) / TOKENIZER_FILE).is_file()


def load_tokenizer(spec: str | os.PathLike) -> Tokenizer:
    """``"bytes"``, a ``tokenizer.json`` file, or a directory holding one (an HF
    checkpoint's). Other tokenizer formats are an error saying how to convert them."""
    if os.fspath(spec) == "bytes":
        return ByteTokenizer()
    from tokenizers import Tokenizer as RustTokenizer
    path = Path(spec)
    if path.is_dir():
        if not has_tokenizer(path):
            found = sorted(p.name for p in path.iterdir() if "token" in p.name or "vocab" in p.name)
            raise ValueError(
                f"{path} has no {TOKENIZER_FILE} (found: {found or 'no tokenizer files'}); "
                f"jaxsmp reads the fast-tokenizer format: write it with transformers' "
                f"AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)")
        path = path / TOKENIZER_FILE
    if not path.is_file():
        raise ValueError(f"tokenizer {os.fspath(spec)!r} is neither 'bytes', a "
                         f"{TOKENIZER_FILE} file, nor a directory holding one")
    try:
        tokenizer = RustTokenizer.from_file(str(path))
    except Exception as err:  # the library raises a bare Exception on bad JSON
        raise ValueError(f"{path} is not a Hugging Face tokenizer file: {err}") from None
    return HFTokenizer(tokenizer, str(path), _eos_id(tokenizer, path.parent))


def train_bpe(texts: Iterable[str], vocab_size: int, *,
              eos: str = "<|endoftext|>") -> HFTokenizer:
    """A byte-level BPE tokenizer (GPT-2 style) of ``vocab_size`` tokens trained on
    ``texts``, with ``eos`` as its one special token."""
    from tokenizers import Tokenizer as RustTokenizer, decoders, models, pre_tokenizers, trainers
    tokenizer = RustTokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[eos],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    return HFTokenizer(tokenizer, f"bpe-{vocab_size}", tokenizer.token_to_id(eos))
