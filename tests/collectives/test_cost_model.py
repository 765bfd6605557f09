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


def test_predictions_price_each_algorithm_step_by_step():
    m = CostModel.p4d()
    one = Topology(1, 8)
    n = 1 << 20
    # collectives.ring: 7 collective-permutes, one after the other
    assert m.predict("ring", n, one) == pytest.approx(7 * (m.alpha_intra + n / m.bw_intra))
    # one round to 7 peers at once
    assert m.predict("a2a", n, one) == pytest.approx(m.alpha_intra + 7 * n / m.bw_intra)
    # across hosts: each host sends its 4 shards to the 4 remote ranks, 4x the ring's bytes
    assert m.predict("a2a", n, TOPO) == pytest.approx(m.alpha_inter + 16 * n / m.bw_inter)
    # NCCL's ring over 2 hosts x 4: 6 NVLink hops and 1 network hop, 7 shards through
    # each host's network
    assert m.predict("xla", n, TOPO) == pytest.approx(
        6 * m.alpha_intra + m.alpha_inter + 7 * n / m.bw_inter)
    # a ring over the hosts (4 rings share each host's network), then 3 NVLink steps of 2n
    assert m.predict("hierarchical", n, TOPO) == pytest.approx(
        m.alpha_inter + 4 * n / m.bw_inter + 3 * (m.alpha_intra + 2 * n / m.bw_intra))
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
        2 * m.predict("xla", buffer / 16, topo))
    assert m.all_reduce("ring", buffer, Topology(1, 1)) == 0.0
    with pytest.raises(ValueError, match="tree"):
        m.all_reduce("a2a", buffer, topo)


def test_a_ring_over_512_gpus_pays_every_step_and_a_tree_log_n():
    m = CostModel.p4d()
    big = Topology(64, 8)
    # NCCL's ring: 448 NVLink hops and 63 network hops, whatever the size
    latency = 448 * m.alpha_intra + 63 * m.alpha_inter
    assert m.predict("xla", 1, big) == pytest.approx(latency, rel=1e-3)
    # tree all-reduce: 2 x (7 NVLink + log2(64) = 6 network) latencies
    tree = 2 * (7 * m.alpha_intra + 6 * m.alpha_inter)
    assert m.all_reduce("tree", 8, big) == pytest.approx(tree, rel=1e-3)
    # small buffers: the tree; large ones: the ring (the tree runs at 92% of its bandwidth)
    assert m.all_reduce("tree", 1 << 20, big) < m.all_reduce("ring", 1 << 20, big)
    assert m.all_reduce("ring", 4 << 30, big) < m.all_reduce("tree", 4 << 30, big)
    assert m.all_reduce("best", 1 << 20, big) == m.all_reduce("tree", 1 << 20, big)


def bus_bandwidth(m: CostModel, total: float, topo: Topology) -> float:
    """nccl-tests' all-gather bus bandwidth: (p - 1) / p x total bytes / time."""
    p = topo.size
    return (p - 1) / p * total / m.predict("xla", total / p, topo)


def test_all_gather_bus_bandwidth_behaves_as_nccls_over_size_and_rank_count():
    m = CostModel.p4d()
    # large messages across hosts reach the host's network (shared by its 8 GPUs), not 8x it
    for hosts in (2, 16, 64):
        assert bus_bandwidth(m, 8 << 30, Topology(hosts, 8)) == pytest.approx(
            m.bw_inter, rel=0.05)
    # in one host: NVLink per GPU
    assert bus_bandwidth(m, 8 << 30, Topology(1, 8)) == pytest.approx(m.bw_intra, rel=0.01)
    # it rises with the message size and, at a fixed size, falls with the rank count
    sizes = [1 << k for k in range(16, 34, 2)]
    for hosts in (2, 16, 64):
        curve = [bus_bandwidth(m, s, Topology(hosts, 8)) for s in sizes]
        assert curve == sorted(curve)
    at_64_mib = [bus_bandwidth(m, 64 << 20, Topology(h, 8)) for h in (2, 4, 16, 64)]
    assert at_64_mib == sorted(at_64_mib, reverse=True)
    # small messages at scale are latency bound: 1 MiB over 512 GPUs gets under 5%
    assert bus_bandwidth(m, 1 << 20, Topology(64, 8)) < 0.05 * m.bw_inter


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
