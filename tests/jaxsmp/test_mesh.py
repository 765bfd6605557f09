"""jaxsmp.Mesh: degrees, defaults, errors and the host-local device layout."""
from types import SimpleNamespace

import jax
import numpy as np
import pytest

import jaxsmp
from jaxsmp.mesh import _device_grid


def test_sdp_takes_what_is_left():
    mesh = jaxsmp.Mesh(tp=2)
    assert mesh.shape == {"dp": 1, "pp": 1, "ep": 1, "sdp": 4, "cp": 1, "tp": 2}
    assert mesh.data_size == 4


def test_explicit_degrees():
    mesh = jaxsmp.Mesh(dp=2, sdp=2, tp=2)
    assert mesh.jax_mesh.shape == {"dp": 2, "pp": 1, "ep": 1, "sdp": 2, "cp": 1, "tp": 2}


def test_degrees_not_matching_devices_name_everything():
    with pytest.raises(ValueError, match=r"multiply to 12.*8 devices"):
        jaxsmp.Mesh(dp=3, sdp=2, tp=2)


def test_degrees_not_dividing_devices():
    with pytest.raises(ValueError, match=r"do not divide the 8 devices"):
        jaxsmp.Mesh(tp=3)


def test_bad_degree_value():
    with pytest.raises(ValueError, match=r"mesh degree tp must be a positive integer .*got 0"):
        jaxsmp.Mesh(tp=0)


def test_tp_then_sdp_groups_stay_inside_a_host():
    # 2 hosts x 4 devices, listed out of order: tp pairs and sdp groups must be
    # consecutive devices of one host; dp replicas go across hosts.
    devices = [SimpleNamespace(process_index=p, id=p * 4 + i) for p in (1, 0) for i in range(4)]
    grid = _device_grid(devices, (2, 1, 2, 2))  # dp, pp, sdp, tp
    for replica in range(2):
        hosts = {d.process_index for d in grid[replica].flat}
        assert hosts == {replica}
    assert [d.id for d in grid[0, 0, 0]] == [0, 1]


def test_mesh_uses_all_devices():
    mesh = jaxsmp.Mesh()
    assert sorted(d.id for d in mesh.jax_mesh.devices.flat) == sorted(d.id for d in jax.devices())
    assert np.prod(list(mesh.shape.values())) == 8


def test_cp_sits_between_sdp_and_tp():
    mesh = jaxsmp.Mesh(sdp=2, cp=2, tp=2)
    assert mesh.shape == {"dp": 1, "pp": 1, "ep": 1, "sdp": 2, "cp": 2, "tp": 2}
    ids = np.vectorize(lambda d: d.id)(mesh.jax_mesh.devices)[0, 0, 0]  # [sdp, cp, tp]
    assert ids[0].tolist() == [[0, 1], [2, 3]] and ids[1].tolist() == [[4, 5], [6, 7]]
    assert mesh.manual_axes == ("sdp",) and mesh.data_size == 2  # cp: automatic, not data


@pytest.mark.parametrize("shape, sdp", [(dict(ep=2, sdp=4), 4), (dict(ep=4, tp=2), 1),
                                        (dict(ep=8), 1), (dict(ep=2, pp=2, sdp=2), 2)])
def test_expert_parallelism_reuses_the_data_devices(shape, sdp):
    """ep is a data axis (the batch is split over dp x ep x sdp) between pp and sdp:
    ep=2, sdp=4 uses 8 devices."""
    mesh = jaxsmp.Mesh(**shape)
    assert mesh.ep == shape["ep"] and mesh.sdp == sdp
    assert mesh.data_size == shape["ep"] * sdp
    assert list(mesh.jax_mesh.axis_names) == ["dp", "pp", "ep", "sdp", "cp", "tp"]
    assert "ep" in mesh.data_axes


def test_expert_parallel_degree_one_is_the_plain_mesh():
    assert jaxsmp.Mesh(ep=1, sdp=8) == jaxsmp.Mesh(sdp=8)
    with pytest.raises(ValueError, match="mesh degree ep must be a positive integer"):
        jaxsmp.Mesh(ep=0)
