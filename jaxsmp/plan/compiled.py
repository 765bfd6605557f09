"""Pre-flight: compile the real training step for a plan's mesh on this CPU host.

Nothing is allocated: the state is abstract (``jax.ShapeDtypeStruct`` with the shardings
``jaxsmp.init`` would give), the batch too, and ``jaxsmp.step`` is lowered and compiled
for as many simulated CPU devices as the mesh has; XLA's ``memory_analysis()`` then says
what each device needs. A mesh larger than ``max_devices`` is scaled first, keeping the
per-device shapes where it can (dp -> 1, then fewer pipeline stages with as many layers
each, then a smaller sdp with proportionally fewer layers) and saying so.

XLA:CPU is not XLA:GPU: it keeps bfloat16 work in float32 and runs attention blockwise,
so the prediction printed beside the compiled numbers is the memory model's for the CPU
backend; the GPU prediction is the plan's.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
import optax

from jaxsmp.plan.candidate import COMPILED, Candidate, Semantics
from jaxsmp.plan.memory import MemoryBreakdown, estimate_memory
from jaxsmp.plan.workload import Workload

GiB = 1 << 30
MAX_DEVICES = 64   # simulated CPU devices a pre-flight compiles for at most
_XLA_FLAGS = "--xla_force_host_platform_device_count={n} --xla_cpu_experimental_ynn_fusion_type="


@dataclass(frozen=True)
class CompiledMemory:
    """Per-device bytes from ``memory_analysis()`` of the compiled step."""
    arguments: int
    outputs: int
    alias: int
    temporaries: int
    host_temporaries: int = 0  # pinned host memory (remat="offload"), XLA:GPU only

    @property
    def peak(self) -> int:
        return self.arguments + self.outputs - self.alias + self.temporaries


@dataclass(frozen=True)
class Preflight:
    """The compiled memory of ``compiled_candidate`` (``candidate`` itself unless
    ``scaled`` says how it was made smaller) beside the model's CPU prediction."""
    candidate: Candidate
    compiled_candidate: Candidate
    compiled_layers: int
    scaled: str
    compiled: CompiledMemory
    predicted: MemoryBreakdown

    @property
    def error(self) -> float:
        """Predicted over compiled peak, minus one."""
        return self.predicted.peak / self.compiled.peak - 1

    def summary(self) -> str:
        c, p = self.compiled, self.predicted
        rows = [("arguments", c.arguments, p.arguments), ("outputs", c.outputs, p.state),
                ("temporaries", c.temporaries, p.temporaries), ("peak", c.peak, p.peak)]
        unit, size = ("GiB", GiB) if c.peak >= GiB else ("MiB", 1 << 20)
        lines = [f"pre-flight: {self.compiled_candidate.label()}, {self.compiled_layers} layers, "
                 f"{self.compiled_candidate.world} simulated CPU devices"
                 + (f" (scaled: {self.scaled})" if self.scaled else ""),
                 f"  {'per device':<12} {'compiled ' + unit:>12} {'model ' + unit:>10}"]
        lines += [f"  {name:<12} {a / size:>12.2f} {b / size:>10.2f}" for name, a, b in rows]
        lines.append(f"  model vs compiled peak: {self.error:+.1%} (XLA:CPU; outputs alias the "
                     f"donated state)")
        return "\n".join(lines)


def compile_memory(config: Any, candidate: Candidate, seq_len: int,
                   devices: list | None = None) -> CompiledMemory:
    """Compiles ``jaxsmp.step(causal_lm_loss, ...)`` for ``candidate`` on ``devices``
    (default: this process's CPU devices; abstract GPUs of
    :func:`jaxsmp.plan.gpu_target.topology` compile with XLA:GPU) and returns its
    per-device memory."""
    return memory_of(compile_candidate(config, candidate, seq_len, devices))


def memory_of(compiled: Any) -> CompiledMemory:
    """Per-device memory of a compiled step (``memory_analysis()``)."""
    stats = compiled.memory_analysis()
    return CompiledMemory(stats.argument_size_in_bytes, stats.output_size_in_bytes,
                          stats.alias_size_in_bytes, stats.temp_size_in_bytes,
                          getattr(stats, "host_temp_size_in_bytes", 0))


def compile_candidate(config: Any, candidate: Candidate, seq_len: int,
                      devices: list | None = None, stages: tuple[int, ...] = (),
                      spread_head: bool | None = None, compiler_options: dict | None = None):
    """The compiled ``jaxsmp.step(causal_lm_loss, ...)`` of ``candidate`` (as
    :func:`compile_memory`); ``stages``, ``spread_head``: the planner's layers per
    (virtual) pipeline stage and 1F1B head placement (:class:`jaxsmp.plan.StepTime`),
    which the step then runs; ``compiler_options``: XLA's, beside the step's own."""
    import jaxsmp
    from jaxsmp.checkpoint import abstract_state
    from jaxsmp.losses import causal_lm_loss
    devices = list(jax.devices("cpu") if devices is None else devices)
    if seq_len > getattr(config, "max_position_embeddings", seq_len):
        # rotary positions have no table: plan beyond the preset, as the trainer trains
        config = config.replace(max_position_embeddings=seq_len)
    if len(devices) < candidate.world:
        raise ValueError(f"{candidate.label()} needs {candidate.world} devices; this process "
                         f"has {len(devices)} (use jaxsmp.plan.preflight, which starts one)")
    c = candidate
    mesh = jaxsmp.Mesh(dp=c.dp, sdp=c.sdp, tp=c.tp, pp=c.pp, cp=c.cp, ep=c.ep,
                       devices=devices[:c.world], collectives="xla")
    state = abstract_state(config.build, optax.adamw(1e-4), mesh)  # as jaxsmp.init, abstract
    batch = {"tokens": jax.ShapeDtypeStruct((c.global_batch, seq_len), np.int32)}
    options = c.step_options()
    if stages:
        options["pipeline_partition"] = tuple(stages)
    if spread_head is not None and c.pp > 1 and c.schedule == "interleaved":
        options["pipeline_head"] = "spread" if spread_head else "last"
    step = jaxsmp.step(causal_lm_loss, **options)
    if devices[0].platform == "cpu":
        compiled = step.lower(state, batch).compile(compiler_options)
    else:
        from jaxsmp.plan import gpu_target
        compiled = gpu_target.compile_step(step, state, batch, mesh, compiler_options)
    return compiled


def layer_field(config: Any) -> str:
    """The name of a config's layer count (BLOOM's ``n_layer``, else ``num_hidden_layers``)."""
    return "n_layer" if hasattr(config, "n_layer") else "num_hidden_layers"


def _largest_divisor(n: int, limit: int) -> int:
    return max(d for d in range(1, n + 1) if n % d == 0 and d <= limit)


def scale(config: Any, candidate: Candidate, max_devices: int = MAX_DEVICES):
    """(config, candidate, note) small enough to compile here: dp -> 1, then fewer
    pipeline stages of as many layers, then a smaller sdp with proportionally fewer
    layers (per-device stacked bytes kept, top-level shards grow). ``note`` is empty
    when nothing changed."""
    c, notes = candidate, []
    layers = getattr(config, layer_field(config))
    if c.world > max_devices and c.dp > 1:
        notes.append(f"dp {c.dp} -> 1 (per-device shapes unchanged)")
        c = dataclasses.replace(c, dp=1)
    if c.world > max_devices and c.pp > 1:
        pp = _largest_divisor(c.pp, max(1, max_devices // (c.ep * c.sdp * c.tp)))
        notes.append(f"pp {c.pp} -> {pp}, layers {layers} -> {layers // c.pp * pp} "
                     f"(same layers per stage)")
        layers = layers // c.pp * pp
        c = dataclasses.replace(c, pp=pp, schedule=c.schedule if pp > 1 else "simple",
                                virtual_chunks=c.virtual_chunks if pp > 1 else 1)
    if c.world > max_devices and c.sdp > 1:
        sdp = _largest_divisor(c.sdp, max(1, max_devices // (c.ep * c.cp * c.tp * c.pp)))
        scaled = max(c.pp, layers * sdp // c.sdp // c.pp * c.pp)
        notes.append(f"sdp {c.sdp} -> {sdp}, layers {layers} -> {scaled} (stacked bytes per "
                     f"device kept; each layer's shard and the top-level shards grow)")
        layers, c = scaled, dataclasses.replace(c, sdp=sdp)
    if c.world > max_devices:
        raise ValueError(f"{candidate.label()} still needs {c.world} devices after scaling; "
                         f"raise max_devices above {max_devices}")
    return config.replace(**{layer_field(config): layers}), c, "; ".join(notes)


def preflight(model_config: Any, plan: Any, seq_len: int, *,
              max_devices: int = MAX_DEVICES, semantics: Semantics = COMPILED) -> Preflight:
    """Compiles the training step of ``plan`` (a :class:`~jaxsmp.plan.search.Plan` or a
    :class:`Candidate`) for ``model_config`` on simulated CPU devices, scaled to at most
    ``max_devices``, and returns its memory beside the model's CPU prediction. Runs in a
    fresh process when this one has too few CPU devices."""
    from jaxsmp.plan.search import load_model
    config = load_model(model_config)
    candidate = getattr(plan, "candidate", plan)
    small_config, small, note = scale(config, candidate, max_devices)
    if len(jax.devices("cpu")) >= small.world:
        compiled = compile_memory(small_config, small, seq_len)
    else:
        compiled = _compile_elsewhere(small_config, small, seq_len)
    predicted = estimate_memory(Workload(small_config, seq_len), small, semantics, backend="cpu")
    return Preflight(candidate, small, getattr(small_config, layer_field(small_config)),
                     note, compiled, predicted)


def _compile_elsewhere(config: Any, candidate: Candidate, seq_len: int) -> CompiledMemory:
    from jaxsmp.hf.config import family_of
    job = {"family": family_of(config), "config": dataclasses.asdict(config),
           "candidate": dataclasses.asdict(candidate), "seq_len": seq_len}
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": _XLA_FLAGS.format(n=candidate.world)}
    done = subprocess.run([sys.executable, "-m", "jaxsmp.plan.compiled", json.dumps(job)],
                          env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"pre-flight compile of {candidate.label()} failed "
                           f"(exit {done.returncode}):\n{done.stderr[-4000:]}")
    return CompiledMemory(**json.loads(done.stdout.strip().splitlines()[-1]))


def _main(argv: list[str]) -> None:
    """``python -m jaxsmp.plan.compiled JOB``: compile one job, print its memory as JSON."""
    from jaxsmp.models.registry import FAMILIES
    job = json.loads(argv[0])
    config_type = type(next(iter(FAMILIES[job["family"]].values())))
    memory = compile_memory(config_type(**job["config"]), Candidate(**job["candidate"]),
                            job["seq_len"])
    print(json.dumps(dataclasses.asdict(memory)))


if __name__ == "__main__":
    _main(sys.argv[1:])
