import pytest

import collectives
from collectives import CostModel
from collectives.context import Scope, current


def test_nested_scopes_keep_what_they_do_not_set_and_restore_on_exit():
    model = CostModel.p4d()
    assert current() == Scope()
    with collectives.scope(cost_model=model, timeout=5, one_program=True) as outer:
        with collectives.scope(timeout=1) as inner:
            assert inner == Scope(mesh=None, cost_model=model, timeout=1)
            assert inner.occurrences is outer.occurrences  # one count of ffi tags
        assert current().timeout == 5
    assert current() == Scope()


def test_scope_is_reset_when_the_block_raises():
    with pytest.raises(RuntimeError):
        with collectives.scope(timeout=3):
            raise RuntimeError
    assert current() == Scope()


@pytest.mark.parametrize("bad", [0, -1.0])
def test_timeout_must_be_positive(bad):
    with pytest.raises(ValueError, match=f"timeout={bad!r} must be a positive"):
        with collectives.scope(timeout=bad):
            pass
