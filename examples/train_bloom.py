"""Train Bloom with jaxsmp (the trainer of ``python -m jaxsmp.train --model bloom``).

Default: the tiny preset on 8 simulated CPU devices (sdp=8), byte-level tokens
of the Python documentation bundled with every CPython. Presets: tiny, 560m,
1b7, 7b1, 50b, 176b. On a GPU cluster (the ~50B configuration):

    python examples/train_bloom.py --preset 50b --sdp 64 --tp 8 \
        --precision bf16 --remat full --microbatches 8 --batch-size 512 --seq-len 2048

Fine-tune a local Hugging Face checkpoint (config.json + safetensors) instead:

    python examples/train_bloom.py --init-from-hf path/to/bloom-560m --lr 1e-5

Llama 2 trains through the same code: ``--model llama --preset 7b``.
"""
import sys

from jaxsmp.cli.entry import main

if __name__ == "__main__":
    main(sys.argv[1:], model="bloom")
