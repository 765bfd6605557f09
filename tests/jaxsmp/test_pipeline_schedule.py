"""Schedule tables and the simulator: validity, bubble formula, activation memory."""
import dataclasses

import pytest

from jaxsmp.pipeline.schedule import Op, bubble_formula, make_schedule
from jaxsmp.pipeline.simulator import simulate

CASES = [("simple", 4, 8, 1), ("simple", 2, 3, 1), ("simple", 4, 2, 1),
         ("interleaved", 4, 8, 1), ("interleaved", 2, 2, 1), ("interleaved", 4, 5, 1),
         ("virtual", 4, 8, 2), ("virtual", 2, 4, 3), ("virtual", 4, 4, 2)]


@pytest.mark.parametrize("name,p,m,v", CASES)
def test_bubble_matches_formula(name, p, m, v):
    report = simulate(make_schedule(name, p, m, v))
    assert report.bubble == pytest.approx(bubble_formula(p, m, v))
    assert report.ticks == 2 * (m * v + p - 1)
    assert all(b == 2 * m * v for b in report.busy)


def test_one_f_one_b_keeps_fewer_activations():
    simple = simulate(make_schedule("simple", 4, 8))
    onefoneb = simulate(make_schedule("interleaved", 4, 8))
    assert simple.peak_activations == (8, 8, 8, 8)
    assert onefoneb.peak_activations == (4, 3, 2, 1)


def test_virtual_has_smaller_bubble_than_simple():
    assert simulate(make_schedule("virtual", 4, 8, 2)).bubble < \
        simulate(make_schedule("simple", 4, 8)).bubble


def _swap(schedule, stage, t1, t2):
    rows = [list(r) for r in schedule.table]
    rows[stage][t1], rows[stage][t2] = rows[stage][t2], rows[stage][t1]
    return dataclasses.replace(schedule, table=tuple(tuple(r) for r in rows))


def test_simulator_rejects_broken_tables():
    good = make_schedule("simple", 2, 2)
    # stage 1 running F0 before stage 0 has produced it
    with pytest.raises(ValueError, match="before its input"):
        simulate(_swap(good, 1, 0, 1))
    # a backward before its own forward on the same stage
    row = good.table[0]
    f0, b0 = row.index(Op("F", 0)), row.index(Op("B", 0))
    with pytest.raises(ValueError, match="before its input"):
        simulate(_swap(good, 0, f0, b0))
    dropped = dataclasses.replace(good, table=(good.table[0][:-1] + (None,), good.table[1]))
    with pytest.raises(ValueError, match="missing"):
        simulate(dropped)


def test_print_and_draw(tmp_path):
    schedule = make_schedule("interleaved", 2, 3)
    text = str(schedule)
    assert "stage 1: .  F0 B0 F1 B1 F2 B2" in text
    pytest.importorskip("matplotlib")
    schedule.draw(str(tmp_path / "timeline.png"))
    assert (tmp_path / "timeline.png").stat().st_size > 1000


@pytest.mark.parametrize("name", ["interleaved", "virtual"])
def test_too_few_microbatches(name):
    with pytest.raises(ValueError, match="microbatches >= stages"):
        make_schedule(name, 4, 2, 2 if name == "virtual" else 1)


def test_unknown_schedule():
    with pytest.raises(ValueError, match="unknown pipeline schedule"):
        make_schedule("zigzag", 2, 2)
