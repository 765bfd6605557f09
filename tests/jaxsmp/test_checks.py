"""The API's shared argument checks: a positive integer is an int >= 1, never a bool,
and every argument checked with it says so naming the value."""
import pytest

import jaxsmp
from jaxsmp.checks import positive_int
from jaxsmp.checkpoint import CheckpointManager


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
