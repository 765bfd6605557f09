"""Offline text, byte tokenizer, step-indexed batches."""
import numpy as np
import pytest

from jaxsmp.data import ByteTokenizer, TokenBatches, default_corpus, load_corpus


def test_default_corpus_is_real_text():
    text = default_corpus()
    assert len(text) > 100_000 and "statement" in text


def test_tokenizer_round_trip():
    tok = ByteTokenizer()
    ids = tok.encode("héllo, world")
    assert ids.max() < tok.vocab_size and tok.decode(ids) == "héllo, world"


def test_batches_depend_only_on_seed_and_index():
    ids = ByteTokenizer().encode(default_corpus()[:5000])
    a, b = TokenBatches(ids, 4, 32, seed=1), TokenBatches(ids, 4, 32, seed=1)
    np.testing.assert_array_equal(a.batch(7)["tokens"], b.batch(7)["tokens"])
    assert not np.array_equal(a.batch(7)["tokens"], a.batch(8)["tokens"])
    train, held_out = a.split()
    assert len(train.tokens) + len(held_out.tokens) == len(ids)


def test_bad_data_path(tmp_path):
    with pytest.raises(ValueError, match="neither a file nor a directory"):
        load_corpus(str(tmp_path / "missing.txt"))
    with pytest.raises(ValueError, match=r"no \*.txt files"):
        load_corpus(str(tmp_path))
