import pytest

from collectives import CostModel, Topology, cross_host_bytes

TOPO = Topology(2, 4)


def test_cross_host_bytes_from_patterns():
    n = 1000
    assert cross_host_bytes("hierarchical", n, TOPO) == 8 * 1 * n   # each rank: 1 remote shard
    assert cross_host_bytes("a2a", n, TOPO) == 8 * 4 * n            # each rank: 4 remote shards
    assert cross_host_bytes("ring", n, TOPO) == 2 * 7 * n           # 2 boundary links, 7 steps
    assert cross_host_bytes("xla", n, TOPO) is None
    assert cross_host_bytes("a2a", n, Topology(1, 8)) == 0


def test_predictions_follow_alpha_beta():
    m = CostModel.p4d()
    one = Topology(1, 8)
    assert m.predict("ring", 1 << 20, one) == pytest.approx(7 * (m.alpha_intra + (1 << 20) / m.bw_intra))
    assert m.predict("a2a", 1 << 20, one) == pytest.approx(m.alpha_intra + 7 * (1 << 20) / m.bw_intra)
    # hierarchical sends g times fewer bytes across hosts than a2a: cheaper when large
    assert m.predict("hierarchical", 1 << 26, TOPO) < m.predict("a2a", 1 << 26, TOPO)
    assert m.predict("ring", 10, Topology(1, 1)) == 0.0
    with pytest.raises(ValueError):
        m.predict("nope", 10, TOPO)


def test_save_load_roundtrip(tmp_path):
    m = CostModel(1e-6, 2e9, 3e-6, 4e9, source="measured")
    m.save(tmp_path / "c.json")
    assert CostModel.load(tmp_path / "c.json") == m


def test_all_reduce_is_a_reduce_scatter_then_an_all_gather_of_the_shards():
    m = CostModel.p4d()
    topo = Topology(2, 8)
    buffer = 64 << 20
    assert m.all_reduce("ring", buffer, topo) == pytest.approx(
        2 * m.predict("ring", buffer / 16, topo))
    assert m.all_reduce("ring", buffer, Topology(1, 1)) == 0.0


def test_send_uses_the_link_it_crosses():
    m = CostModel.p4d()
    assert m.send(1e6, across_hosts=False) == pytest.approx(m.alpha_intra + 1e6 / m.bw_intra)
    assert m.send(1e6, across_hosts=True) == pytest.approx(m.alpha_inter + 1e6 / m.bw_inter)


def test_groups_sharing_a_host_divide_its_network_but_not_its_links():
    m = CostModel.p4d()
    shared = m.sharing_network(4)
    assert shared.bw_inter == m.bw_inter / 4 and shared.bw_intra == m.bw_intra
    assert shared.predict("ring", 1 << 20, TOPO) > m.predict("ring", 1 << 20, TOPO)
    with pytest.raises(ValueError, match="groups"):
        m.sharing_network(0)


def test_a_lone_win_between_two_losses_is_smoothed_away():
    xla = [(1 << 20, 1.0), (4 << 20, 4.0), (16 << 20, 16.0)]
    ring = [(1 << 20, 2.0), (4 << 20, 2.0), (16 << 20, 32.0)]  # 2x, 0.5x, 2x xla
    model = CostModel(1, 1, 1, 1, extrapolate=False,
                      measured={"all_gather": {"1x8": {"xla": xla, "ring": ring}}})
    one_host = Topology(1, 8)
    assert model.predict("ring", 4 << 20, one_host) == pytest.approx(8.0)  # median ratio 2x
    assert model.predict("ring", 16 << 20, one_host) == pytest.approx(32.0)  # ends as measured
    assert model.predict("xla", 4 << 20, one_host) == pytest.approx(4.0)
