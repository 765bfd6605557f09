"""``python -m jaxsmp.train --config run.toml [--flag value ...]``: the trainer the
examples share (``--help`` lists every flag; ``examples/configs/`` holds ready configs)."""
import sys

from jaxsmp.cli.entry import main

if __name__ == "__main__":
    sys.argv[0] = "python -m jaxsmp.train"  # what --help shows
    main(sys.argv[1:])
