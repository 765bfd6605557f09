"""Unequal pipeline stages (``pipeline_partition``): the layout, padded slots, gradients.

Stages hold different numbers of layers by padding each to the largest count with
slots the layer scan skips. Checked here: the layout and its inverse are exact; a
padded slot passes its input on and gets exactly zero gradient (with ``lax.cond`` and
with the branchless select used under ``tp``); every schedule with an unequal split or
``auto`` gives the single-device gradients (tolerances of conftest.GRAD_RTOL); equal
counts compile to the same program as ``"equal"``; bad splits fail before compiling.
"""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxsmp
from conftest import assert_gradients_match, gradients, single_device_mesh
from jaxsmp.nn.layer_context import plain_scan
from jaxsmp.pipeline.layout import StageLayout, check_counts, equal_counts
from jaxsmp.pipeline.partition import balanced_counts
from jaxsmp.train.layer_scan import zero3_scan

SLOW = pytest.mark.slow


def test_layout_round_trip():
    layout = StageLayout((2, 3, 3, 2), stages=4)
    assert layout.slots == 3 and layout.padded
    np.testing.assert_array_equal(layout.slot_layers(), [0, 1, 0, 2, 3, 4, 5, 6, 7, 8, 9, 8])
    np.testing.assert_array_equal(layout.active(), [[2], [3], [3], [2]])
    np.testing.assert_array_equal(layout.slot_layers()[layout.positions()], np.arange(10))


def test_virtual_layout_puts_chunk_c_of_stage_s_at_virtual_stage_c_p_plus_s():
    layout = StageLayout((1, 2, 1, 1, 1, 1, 2, 1), stages=4, chunks=2)  # 10 layers, 2 slots
    slots = layout.slot_layers().reshape(4, 2, 2)
    assert slots[1, 0].tolist() == [1, 2]  # stage 1, chunk 0: virtual stage 1
    assert slots[1, 1].tolist() == [6, 6]  # stage 1, chunk 1: virtual stage 5 (padded)
    assert slots[2, 1].tolist() == [7, 8]  # stage 2, chunk 1: virtual stage 6
    np.testing.assert_array_equal(layout.slot_layers()[layout.positions()], np.arange(10))


def test_equal_single_chunk_layout_is_the_stored_one():
    assert StageLayout((2, 2, 2, 2), stages=4).identity()
    assert not StageLayout((1, 1, 1, 1), stages=2, chunks=2).identity()


@pytest.mark.parametrize("counts", [(2, 3, 3), (2, 3, 3, 3), (0, 4, 3, 3), (2.0, 3, 3, 2),
                                    [True, 3, 3, 3]])
def test_bad_counts_are_named(counts):
    with pytest.raises(ValueError, match=r"pipeline_partition=.* must give each of the .* "
                                         r"4 \(virtual\) stages at least one layer"):
        check_counts(counts, 10, 4, 1)


def test_equal_split_of_indivisible_layers_suggests_counts():
    with pytest.raises(ValueError, match=r"10 stacked layers divisible .* e\.g\. "
                                         r"\(2, 3, 3, 2\)"):
        equal_counts(10, 4, 1)


def test_balanced_counts_moves_layers_off_the_heavy_last_stage():
    assert balanced_counts([1.0] * 8, 4) == (2, 2, 2, 2)
    heavy = balanced_counts([1.0] * 8, 4, last=2.0)  # the head weighs two layers
    assert heavy[-1] == 1 and sum(heavy) == 8 and max(heavy) == 3
    assert balanced_counts([1.0] * 8, 4, last=0.01) == (2, 2, 2, 2)  # within 2%: equal
    assert balanced_counts([1.0] * 10, 4) in {(3, 3, 2, 2), (2, 3, 3, 2), (2, 2, 3, 3),
                                              (3, 2, 2, 3), (3, 2, 3, 2), (2, 3, 2, 3)}


def _layer(w, h, args):
    return jnp.tanh(h @ w["k"]) + h


@pytest.mark.parametrize("scan", ["plain", "zero3", "zero3-noprefetch", "zero3-branchless"])
def test_padded_slots_are_identity_with_zero_gradient(scan):
    rng = np.random.default_rng(1)
    ws = {"k": jnp.asarray(rng.normal(size=(4, 8, 8)) / 3, jnp.float32)}
    h = jnp.asarray(rng.normal(size=(2, 8)), jnp.float32)

    def run(ws, h, active):
        if scan == "plain":
            return plain_scan(_layer, h, ws, (), active=active)
        return zero3_scan(_layer, h, ws, (), gather=lambda s: s, scatter=lambda g, s: g,
                          prefetch=scan != "zero3-noprefetch",
                          branchless=scan == "zero3-branchless", active=active)

    def loss(ws, h, active):
        return (run(ws, h, active) ** 2).sum()
    want = jax.grad(loss, argnums=(0, 1))(jax.tree.map(lambda a: a[:2], ws), h, None)
    got = jax.jit(jax.grad(loss, argnums=(0, 1)))(ws, h, jnp.int32(2))
    np.testing.assert_allclose(run(ws, h, jnp.int32(2)), run({"k": ws["k"][:2]}, h, None),
                               rtol=1e-6)
    np.testing.assert_array_equal(got[0]["k"][2:], 0.0)
    np.testing.assert_allclose(got[0]["k"][:2], want[0]["k"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-7)


@pytest.fixture(scope="module")
def config(tiny_config):
    return tiny_config.replace(num_hidden_layers=10)


@pytest.fixture(scope="module")
def reference(config, tokens):
    return gradients(config, single_device_mesh(), tokens)


# the splits test_full_step_equivalence.py runs with the update applied (pp4-sdp2 simple
# 2332, virtual 12111121, simple and virtual auto; pp2-sdp2-tp2 1F1B 64) are not repeated
@pytest.mark.parametrize("degrees,options", [
    (dict(pp=4, sdp=2), dict(pipeline="interleaved", pipeline_partition=(2, 3, 3, 2))),
    pytest.param(dict(pp=4, sdp=2), dict(pipeline="interleaved"), marks=SLOW),
    pytest.param(dict(pp=2, sdp=2, tp=2), dict(pipeline="simple", pipeline_partition=(4, 6)),
                 marks=SLOW),
    pytest.param(dict(dp=2, pp=2, sdp=2), dict(pipeline="simple", pipeline_partition=(3, 7),
                                               remat="full"), marks=SLOW),
], ids=["pp4-sdp2-1f1b-2332", "pp4-sdp2-1f1b-auto", "pp2-sdp2-tp2-simple-46",
        "dp2-pp2-sdp2-simple-37-remat"])
def test_unequal_stages_match_single_device(config, tokens, reference, degrees, options):
    got = gradients(config, jaxsmp.Mesh(**degrees), tokens, microbatches=4, **options)
    assert_gradients_match(got, reference)


@pytest.fixture(scope="module")
def rows32():
    """Tokens whose microbatches pp divides: 32 rows, 4 microbatches, 4 or 2 examples
    per device and microbatch."""
    return np.random.default_rng(2).integers(0, 256, (32, 32)).astype(np.int32)


@pytest.fixture(scope="module")
def reference32(config, rows32):
    return gradients(config, single_device_mesh(), rows32)


@pytest.mark.parametrize("degrees,options", [
    (dict(pp=4, sdp=2), dict(pipeline_partition=(2, 3, 3, 2))),
    pytest.param(dict(pp=4, sdp=2), dict(pipeline_partition="auto", remat="full"),
                 marks=SLOW),
    (dict(pp=2, sdp=2, tp=2), dict(pipeline_partition=(6, 4))),
], ids=["pp4-sdp2-2332", "pp4-sdp2-auto-remat", "pp2-sdp2-tp2-64"])  # dp2-pp2-sdp2: the full step
def test_1f1b_with_the_head_spread_over_the_stages_matches_single_device(
        config, rows32, reference32, degrees, options):
    """Each stage runs the head on 1/pp of every microbatch."""
    got = gradients(config, jaxsmp.Mesh(**degrees), rows32, microbatches=4,
                    pipeline="interleaved", pipeline_head="spread", **options)
    assert_gradients_match(got, reference32)
    np.testing.assert_allclose(got[1]["loss"], reference32[1]["loss"], rtol=1e-6)


def test_1f1b_spreads_a_head_heavier_than_a_stage_and_keeps_a_light_one_last():
    from jaxsmp.pipeline.timing import one_f_one_b_seconds, one_f_one_b_split
    # bench/pipeline.py's pieces (ms) at vocab 50304 and 512: 4 microbatches, pp=4
    heavy = one_f_one_b_split(8, 4, 4, 9.8, 25.4, 187.7, can_spread=True)
    assert heavy.spread_head and heavy.seconds < one_f_one_b_seconds(
        (2, 2, 2, 2), 4, 9.8, 25.4, 187.7) / 1.5
    light = one_f_one_b_split(8, 4, 4, 6.5, 18.2, 2.9, can_spread=True)
    assert light.counts == (2, 2, 2, 2) and not light.spread_head
    assert not one_f_one_b_split(8, 4, 4, 9.8, 25.4, 187.7, can_spread=False).spread_head
    # the spread head: head / p after each of the last stage's forward ticks
    assert one_f_one_b_seconds((1, 1), 2, 1.0, 2.0, 4.0, spread_head=True) == pytest.approx(
        one_f_one_b_seconds((1, 1), 2, 1.0, 2.0, 0.0) + 2 * 4.0 / 2)


@pytest.mark.parametrize("options, message", [
    (dict(pipeline_head="first"), r"unknown pipeline_head 'first'; valid: \('auto', 'last', "
                                  r"'spread'\)"),
    (dict(pipeline_head="spread"), r"pipeline_head='spread' needs pipeline='interleaved'"),
])
def test_bad_pipeline_heads_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        jaxsmp.step(jaxsmp.losses.causal_lm_loss, **options)


def test_a_spread_head_needs_microbatches_pp_divides(config, tokens):
    state = jaxsmp.init(config.build, optax.sgd(1.0), jaxsmp.Mesh(pp=4, sdp=2))
    step = jaxsmp.step(jaxsmp.losses.causal_lm_loss, microbatches=4, pipeline="interleaved",
                       pipeline_head="spread", pipeline_partition=(2, 3, 3, 2))
    with pytest.raises(ValueError, match=r"pipeline_head='spread' splits each microbatch's "
                                         r"examples over the 4 stages; a microbatch has 2"):
        step.gradients(state, {"tokens": tokens})


def test_layers_pp_does_not_divide_are_stored_whole_on_every_stage(config):
    state = jaxsmp.init(config.build, optax.sgd(1.0), jaxsmp.Mesh(pp=4, sdp=2))
    stacked = [x for x in jax.tree.leaves(state.params) if x.ndim >= 2 and x.shape[0] == 10]
    assert stacked and all("pp" not in str(x.sharding.spec[0]) for x in stacked)


def test_equal_counts_compile_to_the_equal_program(tiny_config, tokens):
    """Equal counts (given, or chosen by ``auto``: 4 layers on 4 stages) are the equal
    split's program: no reordering, no padding branches. An unequal split is not."""
    config = tiny_config.replace(num_hidden_layers=4)
    state = jaxsmp.init(config.build, optax.sgd(1.0), jaxsmp.Mesh(pp=2, sdp=4))

    def text(partition):
        step = jaxsmp.step(jaxsmp.losses.causal_lm_loss, microbatches=2,
                           pipeline_partition=partition)
        return step.lower(state, {"tokens": tokens}).as_text()
    equal = text("equal")
    assert text((2, 2)) == equal and text("auto") == equal
    assert text((1, 3)) != equal


@pytest.mark.parametrize("partition,match", [
    ((2, 3, 3), r"must give each of the pp x chunks = 4"),
    ("equal", r"divisible into pp x chunks = 4 x 1 = 4 equal parts"),
])
def test_bad_partition_fails_before_compiling(config, tokens, partition, match):
    state = jaxsmp.init(config.build, optax.sgd(1.0), jaxsmp.Mesh(pp=4, sdp=2))
    step = jaxsmp.step(jaxsmp.losses.causal_lm_loss, microbatches=4, pipeline_partition=partition)
    with pytest.raises(ValueError, match=match):
        step(state, {"tokens": tokens})


@pytest.mark.parametrize("value", [[2, 2], (2, 0), "balanced", (2.5, 2)])
def test_partition_option_is_checked_when_declared(value):
    with pytest.raises(ValueError, match="pipeline_partition must be 'auto', 'equal' or a tuple"):
        jaxsmp.step(lambda m, b: 0.0, pipeline_partition=value)


def test_partition_needs_a_pipeline(tiny_config, tokens):
    state = jaxsmp.init(tiny_config.build, optax.sgd(1.0), jaxsmp.Mesh(sdp=8))
    step = jaxsmp.step(jaxsmp.losses.causal_lm_loss, pipeline_partition=(1, 1))
    with pytest.raises(ValueError, match=r"pipeline_partition=\(1, 1\) .* mesh has pp=1"):
        step(state, {"tokens": tokens})


def test_one_f_one_b_counts_lighten_the_last_stage_in_lock_step():
    from jaxsmp.pipeline import make_schedule
    from jaxsmp.pipeline.simulator import lockstep_time
    from jaxsmp.pipeline.timing import one_f_one_b_counts

    def seconds(counts, head):
        return lockstep_time(make_schedule("interleaved", 4, 8), lambda s, op: counts[s] * (
            2.0 if op.kind == "B" else 1.0) + (head if op.kind == "F" and s == 3 else 0)).step
    assert one_f_one_b_counts(8, 4, 8, 1.0, 2.0, head=0.01) == (2, 2, 2, 2)
    heavy = one_f_one_b_counts(12, 4, 8, 1.0, 2.0, head=4.0)  # the head weighs 4 forwards
    assert heavy[-1] < 3 and sum(heavy) == 12
    assert seconds(heavy, 4.0) < seconds((3, 3, 3, 3), 4.0)
    every = [c for c in itertools.product(range(1, 10), repeat=4) if sum(c) == 12]
    assert seconds(heavy, 4.0) == min(seconds(c, 4.0) for c in every)  # the best of all 165


def test_lockstep_and_async_times():
    """Unit ops: both give the tick count. Otherwise the lock-step run (every tick its
    slowest op) is never faster than the asynchronous one, and with a heavy last stage
    strictly slower (the reason unequal splits gain less in jaxsmp's SPMD runner)."""
    from jaxsmp.pipeline import make_schedule
    from jaxsmp.pipeline.simulator import async_time, lockstep_time
    schedule = make_schedule("interleaved", 4, 8)
    assert lockstep_time(schedule, lambda s, op: 1.0).step == schedule.ticks == 22
    assert async_time(schedule, lambda s, op: 1.0).step == 22
    rng = np.random.default_rng(0)
    for _ in range(5):
        cost = rng.uniform(0.5, 2.0, (4, 2))
        def duration(s, op):
            return cost[s, int(op.kind == "B")]
        assert async_time(schedule, duration).step <= lockstep_time(schedule, duration).step
    def heavy(s, op):
        return (2.0 if op.kind == "B" else 1.0) * (1, 2, 2, 1)[s] + (4.0 if s == 3 and op.kind == "F" else 0)
    timing = async_time(schedule, heavy)
    assert timing.step < lockstep_time(schedule, heavy).step
    assert timing.busy[3] == 8 * (1 + 4) + 8 * 2
