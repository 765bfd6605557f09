"""1F1B against GPipe under tensor parallelism: step time and memory (issue 24, item 4).

Run through ``python bench/pipeline.py --only tp``. GPT-NeoX, 8 layers of width 256,
on ``pp=2, sdp=2, tp=2`` (8 simulated CPU devices), 4 and 8 microbatches. Under ``tp``
1F1B runs fused lock-step ticks (:mod:`jaxsmp.pipeline.fused_ticks`); the contenders'
steps alternate, medians reported. The CPU step costs the work of all stages on the
host's shared cores, so equal work reads as equal time; the temporaries come from the
compiled step's ``memory_analysis()``.
"""
from __future__ import annotations

import jax
import numpy as np
import optax
from pipeline_balance import _medians

import jaxsmp

MESH, BATCH, SEQ = dict(pp=2, sdp=2, tp=2), 32, 128
WIDTH = dict(num_hidden_layers=8, hidden_size=256, num_attention_heads=8,
             intermediate_size=1024, attention_impl="reference")


def _contender(config, schedule: str, microbatches: int, batch: dict):
    mesh = jaxsmp.Mesh(**MESH)
    step = jaxsmp.step(jaxsmp.losses.causal_lm_loss, microbatches=microbatches,
                       pipeline=schedule, pipeline_partition="equal", pipeline_head="last")
    state = jaxsmp.init(config.build, optax.sgd(1e-3), mesh)
    temp = step.lower(state, batch).compile().memory_analysis().temp_size_in_bytes
    holder = [state]

    def one():
        holder[0], metrics = step(holder[0], batch)
        return metrics["loss"]
    return one, temp


def tp_table(steps: int) -> None:
    config = jaxsmp.models.preset("gpt_neox", "tiny", **WIDTH)
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, (BATCH, SEQ), np.int32)
    batch = {"tokens": tokens}
    print(f"\n1F1B vs GPipe under tp: GPT-NeoX 8 layers d=256, {MESH}, batch {BATCH}x{SEQ}, "
          f"{jax.device_count()} simulated devices, {steps} alternating steps\n")
    print("| microbatches | GPipe step s | 1F1B step s | 1F1B / GPipe | GPipe temporaries MiB "
          "| 1F1B temporaries MiB |")
    print("|---|---|---|---|---|---|")
    for m in (4, 8):
        (gpipe, gpipe_temp), (ofob, ofob_temp) = (
            _contender(config, s, m, batch) for s in ("simple", "interleaved"))
        t_gpipe, t_ofob = _medians([gpipe, ofob], [(), ()], steps)
        print(f"| {m} | {t_gpipe:.3f} | {t_ofob:.3f} | {t_ofob / t_gpipe:.2f} | "
              f"{gpipe_temp / 2**20:.1f} | {ofob_temp / 2**20:.1f} |", flush=True)
