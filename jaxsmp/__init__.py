"""jaxsmp: sharded data, tensor and pipeline parallel LLM training in JAX.

    mesh = jaxsmp.Mesh(sdp=4, tp=2)
    state = jaxsmp.init(config.build, optax.adamw(3e-4), mesh)

    @jaxsmp.step(microbatches=4, precision="bf16", remat="full")
    def train_step(model, batch):
        return jaxsmp.losses.causal_lm_loss(model, batch)

    state, metrics = train_step(state, batch)
    jaxsmp.save("ckpt", state)                      # jaxsmp.checkpoint for more
    state = jaxsmp.restore("ckpt", state)           # latest, onto state's mesh

    plans = jaxsmp.plan("gpt_neox:13b", jaxsmp.plan.cluster("p4d.24xlarge", 16),
                        seq_len=2048, global_batch=1024)   # ranked configurations

On a GPU, importing jaxsmp switches on XLA's collective/compute overlap flags for the
installed jaxlib (``jaxsmp.xla_flags``; ``JAXSMP_XLA_FLAGS=0`` turns that off).
"""
from jaxsmp import xla_flags

xla_flags.apply()  # before anything starts JAX's backend
from jaxsmp import checkpoint, hf, losses, models, nn, pipeline, plan, sharding
from jaxsmp.checkpoint import restore, save
from jaxsmp.mesh import Mesh
from jaxsmp.plan import preflight
from jaxsmp.sharding.rules import DEFAULT_RULES
from jaxsmp.train.state import TrainState, init
from jaxsmp.train.step import StepOptions, eval_step, step

__all__ = ["DEFAULT_RULES", "Mesh", "StepOptions", "TrainState", "checkpoint", "eval_step",
           "hf", "init", "losses", "models", "nn", "pipeline", "plan", "preflight", "restore",
           "save", "sharding", "step", "xla_flags"]
