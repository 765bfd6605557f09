"""MPI tags come from where a collective is traced, identically on every process."""
import contextlib

import jax
import jax.numpy as jnp

import collectives
from collectives.ffi import callsite

UB = (1 << 29) - 1


def _tags(fn, *args):
    seen = []

    def record(op, x):
        seen.append(callsite.tag(op, "x", x.shape, x.dtype, UB)[0])
        return x
    jax.make_jaxpr(lambda *a: fn(record, *a))(*args)
    return seen


def two_gathers(record, a, b):
    return record("ag", a) + record("ag", b)  # same line, same shape: told apart by occurrence


def other(record, a):
    return record("rs", a * 2)


def test_tags_do_not_depend_on_what_was_traced_before():
    x = jnp.ones(4)
    first = _tags(two_gathers, x, x)
    _tags(other, x)
    assert _tags(two_gathers, x, x) == first
    assert len(set(first)) == 2 and all(0 <= t <= UB for t in first)


def test_shape_and_operation_change_the_tag():
    assert _tags(other, jnp.ones(4)) != _tags(other, jnp.ones(8))
    assert _tags(two_gathers, jnp.ones(4), jnp.ones(4))[0] != _tags(other, jnp.ones(4))[0]


def test_the_call_site_is_the_first_frame_outside_the_library():
    def user_code():
        return callsite.caller()
    assert user_code().startswith(f"{__name__}:")


def _nested_tags(one_program: bool):
    """Tags of two equal calls, each traced in a nested map of its own (as jaxsmp's gathers
    are, manual over tp), in a one-program scope or in none."""
    seen = []

    def record(x):
        seen.append(callsite.tag("ag", "x", x.shape, x.dtype, UB)[0])
        return x

    def body(a, b):
        return jax.vmap(record)(a) + jax.vmap(record)(b)  # each vmap traces afresh
    with collectives.scope(one_program=True) if one_program else contextlib.nullcontext():
        jax.make_jaxpr(body)(jnp.ones((2, 4)), jnp.ones((2, 4)))
    return seen


def test_equal_calls_in_separate_nested_traces_of_one_program_get_distinct_tags():
    first = _nested_tags(one_program=True)
    assert len(set(first)) == 2
    assert _nested_tags(one_program=True) == first  # a new program counts afresh
    # counted per trace, each nested trace counts from 0: the tags collide
    assert len(set(_nested_tags(one_program=False))) == 1
