"""``python bench/gpu_check.py``: jaxsmp measured on one GPU in one command of at most 8
minutes, each section under its own time budget (``python -m bench.gpucheck`` is the same).

Sections, run in this order, each row in a worker process of its own on a GPU (so that
``device.memory_stats()``'s peak belongs to that row, and a crash or a hung compile costs
one row), each section's rows in one worker with ``--smoke`` (CPU, tiny shapes):

* ``environment``: GPU, driver, clocks, jax / jaxlib / plugin / torch versions, the peak
  FLOP/s MFU divides by (:mod:`~bench.gpucheck.environment`);
* ``training``: tokens/s, MFU and peak memory of GPT-NeoX 1.3b and a Llama-2-7B-width
  model and BLOOM 1b7 (as many layers as the planner's memory model fits), bf16, seq 2048
  and 4096: jaxsmp, a hand-written ``jax.jit`` step of the same model, PyTorch (not BLOOM)
  (:mod:`~bench.gpucheck.training`);
* ``attention``: forward + backward TFLOP/s of the Pallas (Triton), cuDNN, blockwise and
  reference kernels, causal, with and without ALiBi (:mod:`~bench.gpucheck.attention`);
* ``fp8``: ``precision="fp8"`` against bf16 on the 1.3b, with the cuBLASLt FP8 GEMMs in
  the compiled step (:mod:`~bench.gpucheck.fp8`);
* ``gemms``: single GEMMs at the measured models' Linear shapes, bf16 against float8,
  with the cuBLASLt FP8 calls in each compiled call (:mod:`~bench.gpucheck.gemms`);
* ``remat``: none, full, save_matmuls, offload (:mod:`~bench.gpucheck.remat`);
* ``kernels``: jaxsmp's step traced, its kernels' seconds as GEMMs, attention and
  memory-bound work, and the rates they reached (:mod:`~bench.gpucheck.kernels`);
* ``planner``: the planner's single-GPU step time against each measured jaxsmp row
  (:mod:`~bench.gpucheck.planner`).

A row that fails records its error's first line; a row the budget does not reach is
recorded as skipped; results are written after every row (``runner.py``).
"""
