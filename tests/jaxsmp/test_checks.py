"""The API's argument checks: a positive integer is an int >= 1, never a bool; every
argument checked says so naming its value, before anything compiles."""
import jax.numpy as jnp
import optax
import pytest

import jaxsmp
from jaxsmp.checkpoint import CheckpointManager
from jaxsmp.checks import positive_int
from jaxsmp.losses import next_token_loss


@pytest.mark.parametrize("value", [0, -1, 1.0, "2", True, None])
def test_anything_but_an_int_of_at_least_one_is_refused(value):
    with pytest.raises(ValueError, match=rf"n must be a positive integer, got {value!r}"):
        positive_int("n", value)


def test_none_passes_only_where_it_is_allowed():
    positive_int("n", None, optional=True)
    positive_int("n", 3)
    with pytest.raises(ValueError, match="n must be a positive integer or None, got 0"):
        positive_int("n", 0, optional=True)


@pytest.mark.parametrize("make, message", [
    (lambda: jaxsmp.Mesh(sdp=True), "mesh degree sdp must be a positive integer or None, "
                                    "got True"),
    (lambda: jaxsmp.StepOptions(microbatches=True), "microbatches must be a positive integer"),
    (lambda: jaxsmp.StepOptions(bucket="yes"), "bucket must be True or False, got 'yes'"),
    (lambda: CheckpointManager("/tmp/x", keep=0), "keep must be a positive integer or None"),
    (lambda: CheckpointManager("/tmp/x", save_every=2.5), "save_every must be a positive"),
])
def test_the_api_refuses_a_bad_count_by_name(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_other_api_arguments_are_refused_by_name_before_compiling():
    with pytest.raises(ValueError, match="clip_norm must be a positive number or None"):
        jaxsmp.StepOptions(clip_norm=True)
    cfg = jaxsmp.models.preset("gpt_neox", "tiny")
    with pytest.raises(ValueError, match="seed must be an int, got 'x'"):
        jaxsmp.init(cfg.build, optax.adamw(1e-3), jaxsmp.Mesh(sdp=8), seed="x")
    with pytest.raises(ValueError, match=r"at least 2 tokens, got tokens of shape \(8, 1\)"):
        next_token_loss(jnp.zeros((8, 1, 16)), jnp.zeros((8, 1), jnp.int32))


@pytest.mark.parametrize("make", [
    lambda: __import__("jaxsmp.pipeline").pipeline.PipelinePlan(stages=True),
    lambda: __import__("jaxsmp.plan").plan.Candidate(1, 1, 1, 1, True, 1),
    lambda: __import__("jaxsmp.plan").plan.cluster("p4d.24xlarge", True),
])
def test_booleans_are_not_counts_anywhere(make):
    """The pipeline plan and the planner share the one check (they accepted True as 1)."""
    with pytest.raises(ValueError, match="must be a positive integer, got True"):
        make()
