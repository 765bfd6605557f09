"""Pipelined training gives the gradients, losses and parameters of the single-device run.

Every schedule executes: ``simple`` (GPipe) and ``virtual`` by autodiff of the
runner, ``interleaved`` (1F1B, here "1f1b") driven by hand.

Tiny GPT-NeoX with 4 layers (so pp=4 puts one layer on each stage, and the virtual
schedule with pp=2 runs 2 chunks of 1 layer per stage). Tolerances as in
test_step_equivalence.py: first-step gradients within 1e-5 of each parameter's largest
gradient and grad_norm rtol 1e-5; losses rtol 1e-5, parameters after 3 AdamW steps
atol 2e-4. (The pp2-sdp4 schedules are in test_full_step_equivalence.py's matrix.)
"""
import numpy as np
import pytest

import jaxsmp
from conftest import assert_gradients_match, gradients, leaves, single_device_mesh, train


@pytest.fixture(scope="module")
def config(tiny_config):
    return tiny_config.replace(num_hidden_layers=4)


def _reference(config, tokens):
    return gradients(config, single_device_mesh(), tokens), train(config, single_device_mesh(),
                                                                  tokens)


@pytest.fixture(scope="module")
def reference(config, tokens):
    return _reference(config, tokens)


def _check(config, tokens, reference, degrees, **options):
    ref_gradients, (ref_state, ref_losses) = reference
    assert_gradients_match(gradients(config, jaxsmp.Mesh(**degrees), tokens, **options),
                           ref_gradients)
    state, losses = train(config, jaxsmp.Mesh(**degrees), tokens, **options)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    assert losses[-1] < losses[0]
    for a, b in zip(leaves(state), leaves(ref_state)):
        np.testing.assert_allclose(a, b, atol=2e-4)


SLOW = pytest.mark.slow


# pp2-sdp4 simple and 1F1B, pp4-sdp2 simple: test_full_step_equivalence.py's matrix
@pytest.mark.parametrize("degrees,options", [
    (dict(pp=4, sdp=2), dict(microbatches=4, pipeline="interleaved")),
    (dict(pp=2, sdp=2, tp=2), dict(microbatches=2, pipeline="virtual", virtual_chunks=2)),
    (dict(pp=2, sdp=2, tp=2), dict(microbatches=4, pipeline="interleaved")),
    pytest.param(dict(pp=2, tp=4), dict(microbatches=2, pipeline="simple"), marks=SLOW),
    pytest.param(dict(dp=4, pp=2), dict(microbatches=2, pipeline="interleaved"), marks=SLOW),
    pytest.param(dict(dp=2, pp=2, sdp=2), dict(microbatches=4, pipeline="virtual"),
                 marks=SLOW),
], ids=["pp4-sdp2-1f1b", "pp2-sdp2-tp2-virtual", "pp2-sdp2-tp2-1f1b", "pp2-tp4-simple",
        "dp4-pp2-1f1b", "dp2-pp2-sdp2-virtual"])
def test_pipeline_matches_single_device(config, tokens, reference, degrees, options):
    _check(config, tokens, reference, degrees, **options)


@pytest.mark.slow
def test_virtual_pp4_matches_single_device(tiny_config, tokens):
    config = tiny_config.replace(num_hidden_layers=8)
    _check(config, tokens, _reference(config, tokens), dict(pp=4, sdp=2),
           microbatches=4, pipeline="virtual", virtual_chunks=2)


def test_one_f_one_b_needs_less_activation_memory(config):
    """Same model, mesh and microbatch count: 1F1B keeps at most p stage inputs,
    GPipe every microbatch's activations (measured: ~11 MiB vs ~51 MiB temporaries)."""
    import optax

    from jaxsmp.losses import causal_lm_loss
    tokens = np.random.default_rng(0).integers(0, 256, (32, 128)).astype(np.int32)
    state = jaxsmp.init(config.build, optax.adamw(1e-3), jaxsmp.Mesh(pp=2, sdp=4))
    temp = {}
    for schedule in ("simple", "interleaved"):
        step = jaxsmp.step(causal_lm_loss, microbatches=8, pipeline=schedule)
        memory = step.lower(state, {"tokens": tokens}).compile().memory_analysis()
        temp[schedule] = memory.temp_size_in_bytes
    assert temp["interleaved"] < 0.5 * temp["simple"], temp


def test_fused_1f1b_under_tp_keeps_memory_bounded_as_microbatches_grow(config):
    """Under tp the 1F1B ticks are fused (jaxsmp.pipeline.fused_ticks): from 4 to 16
    microbatches of the same size its temporaries grow by the embedded inputs and
    their cotangents only, GPipe's by every microbatch's activations (measured:
    1F1B 14.3 -> 20.7 MiB, GPipe 49.7 -> 147.7 MiB)."""
    import optax

    from jaxsmp.losses import causal_lm_loss
    state = jaxsmp.init(config.build, optax.adamw(1e-3), jaxsmp.Mesh(pp=2, sdp=2, tp=2))
    temp = {}
    for m in (4, 16):
        tokens = np.random.default_rng(0).integers(0, 256, (8 * m, 128)).astype(np.int32)
        for schedule in ("simple", "interleaved"):
            step = jaxsmp.step(causal_lm_loss, microbatches=m, pipeline=schedule,
                               pipeline_partition="equal", pipeline_head="last")
            memory = step.lower(state, {"tokens": tokens}).compile().memory_analysis()
            temp[schedule, m] = memory.temp_size_in_bytes / 2 ** 20
    grew = {s: temp[s, 16] - temp[s, 4] for s in ("simple", "interleaved")}
    assert grew["interleaved"] < 0.15 * grew["simple"], temp


def test_virtual_keeps_no_copy_of_the_weights_per_tick(tiny_config):
    """A virtual chunk's weights are a per-tick slice of the stage's; the runner takes
    it again in the backward (jaxsmp.pipeline.chunk) instead of keeping it per tick.
    With small microbatches, weights dominate: virtual's temporaries at 16 microbatches
    stay within 10% of simple's (measured: 41.4 vs 42.6 MiB with sdp=1, 38.1 vs 40.5
    with sdp=2; keeping the slices, as before: 146.1 and 90.7 MiB)."""
    import jax
    import optax

    from jaxsmp.losses import causal_lm_loss
    config = tiny_config.replace(num_hidden_layers=8, hidden_size=256, intermediate_size=1024)
    temp = {}
    for sdp in (1, 2):
        mesh = jaxsmp.Mesh(pp=4, sdp=sdp, devices=jax.devices()[:4 * sdp])
        state = jaxsmp.init(config.build, optax.sgd(1e-3), mesh)
        tokens = np.zeros((16 * sdp, 32), np.int32)
        for schedule in ("simple", "virtual"):
            step = jaxsmp.step(causal_lm_loss, microbatches=16, pipeline=schedule,
                               virtual_chunks=2, pipeline_partition="equal")
            memory = step.lower(state, {"tokens": tokens}).compile().memory_analysis()
            temp[schedule, sdp] = memory.temp_size_in_bytes / 2 ** 20
    for sdp in (1, 2):
        assert temp["virtual", sdp] < 1.1 * temp["simple", sdp], temp


@pytest.fixture(scope="module")
def pp4_state(config):
    import optax
    return jaxsmp.init(config.build, optax.adamw(1e-3), jaxsmp.Mesh(pp=4, sdp=2))


@pytest.mark.parametrize("schedule", ["virtual", "interleaved"])
def test_schedule_needs_enough_microbatches(pp4_state, tokens, schedule):
    step = jaxsmp.step(lambda m, b: m(b["tokens"]).mean(), microbatches=2, pipeline=schedule)
    with pytest.raises(ValueError, match="needs microbatches >= stages"):
        step(pp4_state, {"tokens": tokens})


def test_virtual_chunks_need_a_layer_each(pp4_state, tokens):
    step = jaxsmp.step(lambda m, b: m(b["tokens"]).mean(), microbatches=4, pipeline="virtual",
                       virtual_chunks=2)  # 4 layers cannot make 4 stages x 2 chunks
    with pytest.raises(ValueError, match=r"at least pp x chunks = 4 x 2 = 8 stacked layers"):
        step(pp4_state, {"tokens": tokens})


def test_unknown_pipeline_option():
    with pytest.raises(ValueError, match="unknown pipeline schedule"):
        jaxsmp.step(lambda m, b: 0.0, pipeline="1f1b")


def test_eval_step_with_pipeline(config, tokens, pp4_state):
    import optax

    from jaxsmp.losses import causal_lm_loss
    single = jaxsmp.init(config.build, optax.adamw(1e-3), single_device_mesh())
    expected = float(jaxsmp.eval_step(causal_lm_loss)(single, {"tokens": tokens})["loss"])
    got = jaxsmp.eval_step(causal_lm_loss, microbatches=4)(pp4_state, {"tokens": tokens})
    np.testing.assert_allclose(float(got["loss"]), expected, rtol=1e-5)


_REMAT_BF16 = """
import json, sys
import numpy as np
import jaxsmp
from conftest import single_device_mesh, train
config = jaxsmp.models.preset("gpt_neox", "tiny", num_hidden_layers=4,
                              attention_impl="reference")
tokens = np.random.default_rng(0).integers(0, 256, (16, 32)).astype(np.int32)
ref = train(config, single_device_mesh(), tokens, precision="bf16", remat="full")[1]
_, losses = train(config, jaxsmp.Mesh(pp=2, sdp=4), tokens, microbatches=4,
                  pipeline=sys.argv[1], precision="bf16", remat="full")
print(json.dumps([ref, losses]))
"""

# device 0 alone enters an all-reduce over all 8: XLA:CPU's rendezvous waits for the
# rest (and warns after 1 s, not 20)
_HUNG_COLLECTIVE = """
import os
os.environ["XLA_FLAGS"] += " --xla_cpu_collective_call_warn_stuck_timeout_seconds=1"
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((8,), ("d",))
def body(x):
    return jax.lax.cond(jax.lax.axis_index("d") == 0, lambda v: jax.lax.psum(v, "d"),
                        lambda v: v, x)
f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("d"), out_specs=P("d"),
                          check_vma=False))
print(f(jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("d")))))
"""


def _bounded(script: str, *args: str, timeout: int) -> str:
    """The last line ``script`` prints, run in a fresh process with this worker's
    environment (8 simulated devices). A hang fails the test after ``timeout`` s, with
    XLA:CPU's stuck-rendezvous warnings (after 20 s) and every thread's Python stack,
    instead of holding the worker until XLA's 10-minute collective timeout."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    here = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), str(here.parents[1])])}
    watchdog = f"import faulthandler; faulthandler.dump_traceback_later({timeout - 5})\n"
    try:
        run = subprocess.run([sys.executable, "-c", watchdog + script, *args], cwd=here,
                             env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else e.stderr or ""
        stuck = [line for line in err.splitlines() if "may be stuck" in line]
        pytest.fail(f"no result in {timeout} s (hung): " + "\n".join(stuck[:8])
                    + "\n" + err[-3000:], pytrace=False)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.strip().splitlines()[-1]


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["simple", "interleaved"])
def test_pipeline_with_remat_and_bf16(config, tokens, schedule):
    """Remat and mixed precision compose with the pipeline: its bf16 losses stay within
    2e-2 of the single-device bf16 run and training still descends. Both run in one
    process, the single-device remat="full" steps first, as in a notebook. This step hung
    in CI now and then (2026-11-22 to 26): XLA:CPU's thread pool, one thread per device,
    filled with collectives waiting for participants queued behind them. Simulated
    devices now get 8 threads each; the test below runs this sequence for 60 steps. The
    bounded run turns any hang into a failure that shows XLA's stuck-rendezvous warnings
    and the Python stacks, rather than a worker lost for 10 minutes."""
    import json
    ref, losses = json.loads(_bounded(_REMAT_BF16, schedule, timeout=300))
    assert config.num_hidden_layers == 4 and tokens.shape == (16, 32)  # as the script's
    np.testing.assert_allclose(losses, ref, rtol=2e-2)
    assert losses[-1] < losses[0]


_MANY_STEPS = """
import json
import numpy as np
import jaxsmp
from conftest import single_device_mesh, train
config = jaxsmp.models.preset("gpt_neox", "tiny", num_hidden_layers=4,
                              attention_impl="reference")
tokens = np.random.default_rng(0).integers(0, 256, (16, 32)).astype(np.int32)
train(config, single_device_mesh(), tokens, precision="bf16", remat="full")
runs = [train(config, jaxsmp.Mesh(pp=2, sdp=4), tokens, steps=20, microbatches=4,
              pipeline="simple", precision="bf16", remat="full")[1] for _ in range(3)]
print(json.dumps(runs))
"""


@pytest.mark.slow
def test_sixty_pipeline_steps_do_not_starve_xla_cpu_thread_pool():
    """The sequence that hung above, run for 60 pipeline steps. With XLA:CPU's default
    pool (one thread per device: ``PJRT_NPROC=8``) 3 of 6 such runs hung on a 2-core
    host, all 8 threads blocked in collectives whose last participants were queued
    behind them; with 8 threads per device (``jaxsmp.simulated_devices``) none did in
    760 steps. ``PJRT_NPROC=8 pytest -m slow -k sixty`` runs it with the old pool."""
    import json
    runs = json.loads(_bounded(_MANY_STEPS, timeout=400))
    assert all(r == runs[0] and np.isfinite(r).all() for r in runs), runs  # deterministic


@pytest.mark.slow
def test_a_hung_collective_fails_the_bounded_run_instead_of_holding_the_worker():
    with pytest.raises(pytest.fail.Exception, match="may be stuck"):
        _bounded(_HUNG_COLLECTIVE, timeout=30)
