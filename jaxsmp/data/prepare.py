"""Tokenize text once into flat token shards that training memory-maps.

    python -m jaxsmp.data.prepare --tokenizer tokenizer.json --input corpus/ --output data/

Each input file is one document; documents are concatenated in path order, each
followed by the tokenizer's end-of-text token if it has one. The stream is written
as raw ``uint16`` arrays (``uint32`` for vocabularies over 65,536 tokens) in shards
of ``--shard-tokens``; ``index.json`` lists the shards, the tokenizer's identity and
the split: the last ``--val-fraction`` of the tokens are the validation split.
``index.json`` is written last, so an interrupted run leaves no dataset.
"""
from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tqdm import tqdm

from jaxsmp.data.dataset import FORMAT, INDEX
from jaxsmp.data.tokenizer import Tokenizer, load_tokenizer


def input_files(inputs: list[str], pattern: str = "*.txt") -> list[Path]:
    """Files named in ``inputs``, and the ``pattern`` files under directories named there."""
    files = []
    for name in inputs:
        path = Path(name)
        if path.is_dir():
            found = sorted(p for p in path.rglob(pattern) if p.is_file())
            if not found:
                raise ValueError(f"input directory {name!r} has no {pattern} files")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise ValueError(f"input {name!r} is neither a file nor a directory")
    return files


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 2 ** 16 else np.uint32)


def _documents(tokenizer: Tokenizer, files: list[Path], group: int = 64) -> Iterator[np.ndarray]:
    """Each file's tokens (+ end-of-text), encoding ``group`` files per batch call."""
    eos = [] if tokenizer.eos_id is None else [tokenizer.eos_id]
    for i in tqdm(range(0, len(files), group), desc="tokenizing", unit="batch",
                  disable=len(files) <= group):
        texts = [f.read_text(encoding="utf-8", errors="replace") for f in files[i:i + group]]
        for ids in tokenizer.encode_batch(texts):
            yield np.concatenate([ids, np.asarray(eos, np.int32)])


class _ShardWriter:
    """Appends tokens to ``tokens_00000.bin``, ``tokens_00001.bin``, ... of ``shard_tokens``."""

    def __init__(self, directory: Path, dtype: np.dtype, shard_tokens: int):
        self.directory, self.dtype, self.shard_tokens = directory, dtype, shard_tokens
        self.shards: list[dict] = []
        self._file = None

    def write(self, ids: np.ndarray) -> None:
        while len(ids):
            if self._file is None or self.shards[-1]["tokens"] == self.shard_tokens:
                self._open_next()
            room = self.shard_tokens - self.shards[-1]["tokens"]
            chunk, ids = ids[:room], ids[room:]
            self._file.write(chunk.astype(self.dtype).tobytes())
            self.shards[-1]["tokens"] += len(chunk)

    def _open_next(self) -> None:
        self.close()
        name = f"tokens_{len(self.shards):05d}.bin"
        self._file = open(self.directory / name, "wb")
        self.shards.append({"file": name, "tokens": 0})

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def prepare(tokenizer: Tokenizer, files: list[Path], output: str | os.PathLike, *,
            val_fraction: float = 0.05, shard_tokens: int = 2 ** 28) -> dict:
    """Writes the token shards and ``index.json`` of ``files`` to ``output``; returns the index."""
    if not 0 <= val_fraction < 1:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if shard_tokens < 1:
        raise ValueError(f"shard_tokens must be positive, got {shard_tokens}")
    out = Path(output)
    if (out / INDEX).exists():
        raise FileExistsError(f"{out} already holds a prepared dataset ({INDEX}); "
                              f"choose another --output or delete it")
    out.mkdir(parents=True, exist_ok=True)
    dtype = token_dtype(tokenizer.vocab_size)
    writer, documents = _ShardWriter(out, dtype, shard_tokens), 0
    for ids in _documents(tokenizer, files):
        writer.write(ids)
        documents += 1
    writer.close()
    total = sum(s["tokens"] for s in writer.shards)
    cut = total - int(total * val_fraction)
    index = {"format": FORMAT, "dtype": dtype.name, "tokenizer": tokenizer.identity,
             "tokenizer_source": tokenizer.name, "eos_id": tokenizer.eos_id,
             "documents": documents, "tokens": total, "shards": writer.shards,
             "splits": {"train": [0, cut], "val": [cut, total]}}
    tmp = out / (INDEX + ".tmp")
    tmp.write_text(json.dumps(index, indent=1))
    tmp.rename(out / INDEX)
    return index


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", default="bytes",
                        help="tokenizer.json, an HF checkpoint directory, or 'bytes'")
    parser.add_argument("--input", nargs="+", required=True, help="text files or directories")
    parser.add_argument("--output", required=True, help="directory for the shards and index")
    parser.add_argument("--pattern", default="*.txt", help="files to read inside directories")
    parser.add_argument("--val-fraction", type=float, default=0.05)
    parser.add_argument("--shard-tokens", type=int, default=2 ** 28)
    args = parser.parse_args(argv)
    try:
        index = prepare(load_tokenizer(args.tokenizer), input_files(args.input, args.pattern),
                        args.output, val_fraction=args.val_fraction,
                        shard_tokens=args.shard_tokens)
    except (ValueError, FileExistsError) as err:
        parser.error(str(err))
    train, val = (b - a for a, b in index["splits"].values())
    print(f"{args.output}: {index['documents']} documents, {index['tokens']:,} tokens "
          f"({train:,} train, {val:,} val) in {len(index['shards'])} {index['dtype']} shards")


if __name__ == "__main__":
    main()
