import jax
import numpy as np
import pytest

from collectives import Topology


class FakeDevice:
    def __init__(self, process_index):
        self.process_index = process_index


def _mesh(procs, shape, names):
    devices = np.array([FakeDevice(p) for p in procs], dtype=object).reshape(shape)
    return type("M", (), {"devices": devices, "axis_names": names,
                          "shape": dict(zip(names, shape))})()


def test_from_devices_single_process():
    assert Topology.from_devices() == Topology(1, len(jax.devices()))


def test_from_devices_counts_processes():
    assert Topology.from_devices([FakeDevice(i // 4) for i in range(8)]) == Topology(2, 4)
    with pytest.raises(ValueError, match="unequal"):
        Topology.from_devices([FakeDevice(0), FakeDevice(0), FakeDevice(1)])


def test_for_mesh_axis_contiguous_hosts():
    mesh = _mesh([i // 4 for i in range(8)], (8,), ("x",))
    assert Topology.for_mesh_axis(mesh, "x") == Topology(2, 4)


def test_for_mesh_axis_inner_axis_and_tuple():
    # mesh (sdp=4, tp=2), hosts of 4 devices: along sdp, 2 consecutive ranks share a host
    mesh = _mesh([i // 4 for i in range(8)], (4, 2), ("sdp", "tp"))
    assert Topology.for_mesh_axis(mesh, "sdp") == Topology(2, 2)
    assert Topology.for_mesh_axis(mesh, "tp") == Topology(1, 2)
    assert Topology.for_mesh_axis(mesh, ("sdp", "tp")) == Topology(2, 4)


def test_for_mesh_axis_interleaved_hosts_count_each_rank_as_a_host():
    mesh = _mesh([i % 2 for i in range(8)], (8,), ("x",))
    assert Topology.for_mesh_axis(mesh, "x") == Topology(8, 1)


def test_group_size_and_validation():
    assert Topology(2, 4).group_size(8) == 4
    assert Topology(2, 4).group_size(2) == 2   # axis inside one host
    assert Topology(4, 8).group_size(12) == 4
    with pytest.raises(ValueError):
        Topology(0, 4)
