"""Section 1: training throughput, MFU and peak memory on one device.

GPT-NeoX 1.3b (16,384 tokens a step), a Llama-2-7B-width model (8,192 tokens a step,
as many of its 32 layers as the planner's memory model fits in JAX's memory pool) and
BLOOM 1b7 (8,192 tokens a step, layers fitted alike; ALiBi, so jaxsmp's Pallas
FlashAttention where the others run cuDNN's; no PyTorch contender), bf16
with float32 master weights, AdamW, gradient clipping at 1.0, no recomputation; seq 2048
and 4096. Contenders: jaxsmp (``jaxsmp.step``), the same model in a hand-written
``jax.jit`` step (cuDNN attention; jaxsmp's XLA flags off, ``JAXSMP_XLA_FLAGS=0``), and
PyTorch (``bench/gpucheck/torch_model.py``, ``torch.compile`` per layer,
``scaled_dot_product_attention``; eager on CPU)."""
from __future__ import annotations

from dataclasses import asdict

TITLE = "1. Training throughput, one device"
ISOLATE = True
COLUMNS = [("model", "model", ""), ("layers", "layers", ""), ("seq", "seq", ""),
           ("batch", "batch", ""), ("contender", "contender", ""),
           ("step_s", "step s", ".4f"), ("tokens_per_s", "tokens/s", ",.0f"),
           ("mfu", "MFU", ".3f"), ("peak_gib", "peak GiB", ".2f"),
           ("first_call_s", "compile+1st s", ".1f")]
NOTES = """Median of timed steps after one warm-up step. MFU: model FLOPs (6N + 12·layers·
width·seq per token, no recomputation, causal attention counted in full as in PaLM) over
the environment's `peak_flops`. Peak: `peak_bytes_in_use` of JAX's device (each row in
its own process) or `torch.cuda.max_memory_allocated`; parameters, gradients and AdamW
state included. jaxsmp and the hand-written step use the same Flax model and loss."""

CONTENDERS = ("jaxsmp", "jax.jit", "torch")
GPU_SHAPES = {"seqs": (2048, 4096), "neox": ("gpt_neox", "1.3b", 16384),
              "llama": ("llama", "7b", 8192), "bloom": ("bloom", "1b7", 8192)}
SMOKE_SHAPES = {"seqs": (64,), "neox": ("gpt_neox", "tiny", 128),
                "llama": ("llama", "tiny", 128), "bloom": ("bloom", "tiny", 128)}
GPU_ATTENTION = {"bloom": "pallas"}   # cuDNN's kernel takes no ALiBi slopes
SMOKE_MEMORY = 2 * 2**30   # the layer fit's memory with --smoke (no device statistics)


def fit_layers(family: str, preset: str, seq: int, batch: int, memory: float) -> int:
    """The most layers (at most the preset's) whose step the planner's memory model
    (``jaxsmp.plan.estimate_memory``, remat none, bf16) fits in ``memory`` bytes."""
    import jaxsmp
    from jaxsmp.plan import Candidate, Workload, estimate_memory
    base = jaxsmp.models.preset(family, preset)
    candidate = Candidate(1, 1, 1, 1, batch, 1, "none", "bf16")

    def need(n: int) -> float:
        config = shaped(base, n, seq)
        return estimate_memory(Workload(config, seq), candidate).total
    one, two = need(1), need(2)
    n = int((memory - one) // max(two - one, 1.0)) + 1
    n = max(0, min(n, base.num_hidden_layers))
    while n > 1 and need(n) > memory:
        n -= 1
    return n if n > 1 or one <= memory else 0


def shaped(config, layers: int, seq: int):
    """``config`` with ``layers`` layers and a position table long enough for ``seq``
    (BLOOM names its layer count ``n_layer`` and, with ALiBi, has no position table)."""
    from jaxsmp.plan.compiled import layer_field
    table = getattr(config, "max_position_embeddings", None)
    return config.replace(**{layer_field(config): layers},
                          **({} if table is None else {"max_position_embeddings": max(seq, table)}))


def model_row(family: str, preset: str, seq: int, batch: int, layers: int, smoke: bool,
              **extra) -> dict:
    """A row's model: enough for a worker to rebuild it (``config_of``), and its FLOPs."""
    import jaxsmp
    from jaxsmp.metrics.flops import train_flops_per_token
    base = jaxsmp.models.preset(family, preset)
    config = shaped(base, layers, seq)
    fields = {k: v for k, v in asdict(config).items() if k != "attention_impl"}
    return {"family": family, "preset": preset, "model": f"{family} {preset}",
            "layers": layers, "seq": seq, "batch": batch, "config": fields,
            "attention": "reference" if smoke else GPU_ATTENTION.get(family, "cudnn"),
            "flops_per_token": train_flops_per_token(config, seq), **extra}


def rows(ctx: dict, results: dict) -> list[dict]:
    shapes = SMOKE_SHAPES if ctx["smoke"] else GPU_SHAPES
    memory = SMOKE_MEMORY if ctx["smoke"] else ctx["env"]["jax_bytes_limit_gib"] * 2**30
    out = []
    for seq in shapes["seqs"]:
        for key in ("neox", "llama", "bloom"):
            family, preset, tokens = shapes[key]
            batch = max(1, tokens // seq)
            layers = (jaxsmp_layers(family, preset) if key == "neox"
                      else fit_layers(family, preset, seq, batch, memory))
            model = model_row(family, preset, seq, batch, layers, ctx["smoke"])
            if key != "neox":
                whole = jaxsmp_layers(family, preset)
                model["model"] = (f"llama 7b-width ({layers} of {whole} layers)" if key == "llama"
                                  else f"{family} {preset} ({layers} of {whole} layers)")
            for contender in CONTENDERS[:2] if key == "bloom" else CONTENDERS:
                env = ({"JAXSMP_XLA_FLAGS": "0"} if contender == "jax.jit" and not ctx["smoke"]
                       else {})  # XLA:CPU ignores jaxsmp's GPU flags: one worker serves
                out.append({**model, "contender": contender, "env": env,
                            "label": f"{model['model']} seq {seq} {contender}"})
    return out


def jaxsmp_layers(family: str, preset: str) -> int:
    import jaxsmp
    return jaxsmp.models.preset(family, preset).num_hidden_layers


def run(row: dict, ctx: dict, deadline: float) -> dict:
    from bench.gpucheck.common import Skip
    if row["layers"] < 1:
        raise Skip("not one layer fits the memory (planner's estimate)")
    if row["contender"] == "torch":
        from bench.gpucheck.torch_model import run_torch
        out = run_torch(row, deadline, ctx["target_s"])
    else:
        from bench.gpucheck import jax_steps
        runner = jax_steps.run_jaxsmp if row["contender"] == "jaxsmp" else jax_steps.run_jit
        out = runner(row, deadline, ctx["target_s"])
    out["tokens_per_s"] = row["batch"] * row["seq"] / out["step_s"]
    out["mfu"] = out["tokens_per_s"] * row["flops_per_token"] / ctx["env"]["peak_flops"]
    return out
