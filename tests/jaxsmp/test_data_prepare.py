"""python -m jaxsmp.data.prepare: flat token shards, an index with the tokenizer's
identity and the validation split."""
import json

import numpy as np
import pytest

from jaxsmp.data import load_tokenizer
from jaxsmp.data.prepare import input_files, main, prepare, token_dtype


def test_shards_hold_every_documents_tokens_and_end_of_text(prepared_dir, corpus_dir,
                                                            bpe_tokenizer_file):
    tok = load_tokenizer(bpe_tokenizer_file)
    index = json.loads((prepared_dir / "index.json").read_text())
    files = input_files([str(corpus_dir)])
    want = np.concatenate([np.append(tok.encode(f.read_text()), tok.eos_id) for f in files])
    shards = [np.fromfile(prepared_dir / s["file"], np.uint16) for s in index["shards"]]
    assert [len(s) for s in shards[:-1]] == [50_000] * (len(shards) - 1)
    np.testing.assert_array_equal(np.concatenate(shards), want)
    assert index["tokenizer"] == tok.identity and index["documents"] == len(files)
    cut = len(want) - int(0.05 * len(want))
    assert index["splits"] == {"train": [0, cut], "val": [cut, len(want)]}


def test_large_vocabularies_use_uint32():
    assert token_dtype(65_536) == np.uint16 and token_dtype(65_537) == np.uint32


def test_the_command_line_prepares_and_refuses_to_overwrite(tmp_path, corpus_dir, capsys):
    files = sorted(corpus_dir.glob("*.txt"))[:3]
    main(["--input", *map(str, files), "--output", str(tmp_path / "d")])
    assert "3 documents" in capsys.readouterr().out
    assert json.loads((tmp_path / "d" / "index.json").read_text())["tokenizer"]["kind"] == "bytes"
    with pytest.raises(SystemExit):
        main(["--input", str(files[0]), "--output", str(tmp_path / "d")])
    assert "already holds a prepared dataset" in capsys.readouterr().err


def test_bad_inputs_are_named(tmp_path):
    with pytest.raises(ValueError, match="neither a file nor a directory"):
        input_files([str(tmp_path / "missing")])
    with pytest.raises(ValueError, match=r"has no \*.txt files"):
        input_files([str(tmp_path)])
    with pytest.raises(ValueError, match="val_fraction must be in"):
        prepare(load_tokenizer("bytes"), [], tmp_path / "x", val_fraction=1.0)
