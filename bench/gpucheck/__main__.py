"""``python -m bench.gpucheck``: the same as ``python bench/gpu_check.py``."""
import sys

from bench.gpucheck.runner import main

sys.exit(main())
