"""How the ffi collectives map a mesh axis onto processes and MPI channels (no MPI needed)."""
import numpy as np
import pytest

from collectives.ffi.groups import axis_groups, split_rounds


class Dev:
    def __init__(self, process_index):
        self.process_index = process_index


def _devices(procs, shape):
    return np.array([Dev(p) for p in procs], dtype=object).reshape(shape)


def test_dp_by_sdp_one_device_per_process_gives_one_channel_per_dp_replica():
    g = axis_groups(_devices(range(4), (2, 2)), ("dp", "sdp"), ("sdp",))
    assert (g.ranks, g.per_process, g.processes) == (2, 1, 2)
    assert g.channels == ((0, 1), (2, 3))
    assert g.where == ((0, 0), (0, 1), (1, 0), (1, 1))


def test_two_devices_per_process_split_into_lanes_by_local_index():
    # sdp=8 on 4 processes x 2 devices: ranks 2b+j on process b; lane j is channel j
    g = axis_groups(_devices([0, 0, 1, 1, 2, 2, 3, 3], (8,)), ("sdp",), ("sdp",))
    assert (g.per_process, g.processes) == (2, 4)
    assert g.channels == ((0, 1, 2, 3), (0, 1, 2, 3))
    assert g.where[:4] == ((0, 0), (1, 0), (0, 1), (1, 1))


def test_tp_inside_a_process_makes_one_channel_per_tp_lane():
    # sdp=4 x tp=2 on 2 processes x 4 devices: each process holds 2 sdp ranks x 2 tp ranks
    g = axis_groups(_devices([0, 0, 0, 0, 1, 1, 1, 1], (4, 2)), ("sdp", "tp"), ("sdp",))
    assert (g.per_process, g.processes) == (2, 2)
    assert len(g.channels) == 4 and set(g.channels) == {(0, 1)}


def test_groups_inside_one_process_need_no_channel():
    g = axis_groups(_devices([0, 0, 0, 0, 1, 1, 1, 1], (2, 4)), ("dp", "sdp"), ("sdp",))
    assert (g.per_process, g.processes, g.channels) == (4, 1, ())
    assert set(g.where) == {(-1, -1)}


def test_any_order_of_single_device_processes_is_a_channel_in_axis_order():
    g = axis_groups(_devices([3, 1, 0, 2], (4,)), ("x",), ("x",))
    assert g.channels == ((3, 1, 0, 2),)


def test_interleaved_processes_are_rejected_with_the_layout():
    with pytest.raises(ValueError, match=r"consecutive blocks.*\[0, 1, 0, 1\]"):
        axis_groups(_devices([0, 1, 0, 1], (4,)), ("x",), ("x",))
    with pytest.raises(ValueError, match=r"axes \['y'\] are not in the mesh"):
        axis_groups(_devices([0, 1], (2,)), ("x",), ("y",))


def test_split_rounds_never_put_a_process_in_two_channels_of_one_round():
    channels = [(0, 1), (0, 1), (2, 3), (1, 2)]
    rounds = split_rounds(channels)
    assert rounds == [[0, 2], [1], [3]]
    for r in rounds:
        members = [p for c in r for p in channels[c]]
        assert len(members) == len(set(members))
