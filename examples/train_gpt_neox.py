"""Train GPT-NeoX with jaxsmp (the trainer of ``python -m jaxsmp.train``, which takes
the same flags and ``--config``; examples/configs/ holds ready configs).

Default: the tiny preset on 8 simulated CPU devices (sdp=8), byte-level tokens
of the Python documentation bundled with every CPython. On a GPU cluster:

    python examples/train_gpt_neox.py --preset 20b --sdp 64 --tp 2 \
        --precision bf16 --remat full --microbatches 4 --batch-size 256 --seq-len 2048
"""
import sys

from jaxsmp.cli.entry import main

if __name__ == "__main__":
    main(sys.argv[1:], model="gpt_neox")
