"""Tokenizers: bytes by default, Hugging Face tokenizer.json files and checkpoint
directories, and a BPE trained here on the bundled docs (no download)."""
import json
import shutil

import numpy as np
import pytest

from jaxsmp.data import ByteTokenizer, load_tokenizer

TEXT = "def f(x):\n    return x + 1  # héllo"


def test_bytes_round_trip():
    tok = load_tokenizer("bytes")
    ids = tok.encode(TEXT)
    assert isinstance(tok, ByteTokenizer) and ids.max() < 256 and tok.decode(ids) == TEXT


def test_a_trained_bpe_loads_from_its_file_and_compresses_text(bpe_tokenizer_file):
    tok = load_tokenizer(bpe_tokenizer_file)
    ids = tok.encode(TEXT)
    assert tok.vocab_size == 512 and ids.dtype == np.int32 and ids.max() < 512
    assert tok.decode(ids) == TEXT
    assert len(ids) < 0.7 * len(TEXT.encode())  # merges learnt from the docs
    assert tok.eos_id == tok.tokenizer.token_to_id("<|endoftext|>")


def test_an_hf_checkpoint_directory_gives_its_tokenizer(tmp_path, bpe_tokenizer_file):
    shutil.copy(bpe_tokenizer_file, tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    from_dir, from_file = load_tokenizer(tmp_path), load_tokenizer(bpe_tokenizer_file)
    assert from_dir.identity == from_file.identity
    np.testing.assert_array_equal(from_dir.encode(TEXT), from_file.encode(TEXT))


def test_identity_tells_tokenizers_apart(tmp_path, bpe_tokenizer_file):
    from jaxsmp.data import default_corpus, train_bpe
    other = train_bpe([default_corpus()[:50_000]], 300)
    assert other.identity != load_tokenizer(bpe_tokenizer_file).identity
    assert other.identity["vocab_size"] == 300


def test_missing_or_unsupported_tokenizers_are_explained(tmp_path):
    (tmp_path / "tokenizer.model").write_bytes(b"sentencepiece")
    with pytest.raises(ValueError, match=r"has no tokenizer.json \(found: \['tokenizer.model'\]\)"):
        load_tokenizer(tmp_path)
    with pytest.raises(ValueError, match="neither 'bytes', a tokenizer.json file"):
        load_tokenizer(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a Hugging Face tokenizer file"):
        load_tokenizer(tmp_path / "bad.json")


def test_the_command_line_trains_a_tokenizer_the_trainer_loads(tmp_path, corpus_dir, capsys):
    from jaxsmp.data.train_tokenizer import main
    main(["--input", str(corpus_dir), "--vocab-size", "400", "--output", str(tmp_path / "t.json")])
    files = len(list(corpus_dir.glob("*.txt")))
    assert f"400 tokens from {files} files" in capsys.readouterr().out
    assert load_tokenizer(tmp_path / "t.json").vocab_size == 400
