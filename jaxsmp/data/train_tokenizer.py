"""Train a byte-level BPE tokenizer on local text and save it as ``tokenizer.json``.

    python -m jaxsmp.data.train_tokenizer --input corpus/ --vocab-size 8192 --output tok.json
"""
from __future__ import annotations

import argparse

from jaxsmp.data.prepare import input_files
from jaxsmp.data.tokenizer import train_bpe


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", nargs="+", required=True, help="text files or directories")
    parser.add_argument("--pattern", default="*.txt", help="files to read inside directories")
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--output", required=True, help="the tokenizer.json to write")
    args = parser.parse_args(argv)
    try:
        files = input_files(args.input, args.pattern)
    except ValueError as err:
        parser.error(str(err))
    texts = (f.read_text(encoding="utf-8", errors="replace") for f in files)
    tokenizer = train_bpe(texts, args.vocab_size)
    tokenizer.save(args.output)
    print(f"{args.output}: {tokenizer.vocab_size} tokens from {len(files)} files")


if __name__ == "__main__":
    main()
