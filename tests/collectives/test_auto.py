from collectives import CostModel, Topology, choose, explain, set_cost_model
from collectives.cost_model import current

TWO_HOSTS = Topology(2, 8)


def test_choice_follows_message_size_and_topology():
    m = CostModel.p4d()
    assert choose(1024, TWO_HOSTS, m) == "a2a"              # latency bound: a single round
    assert choose(16 << 20, TWO_HOSTS, m) == "hierarchical"  # fewest cross-host bytes
    # many hosts, large messages: ring-like bandwidth optimum; XLA's (NCCL ring) wins the tie
    assert choose(64 << 20, Topology(16, 8), m) == "xla"
    assert choose(1 << 20, Topology(1, 8), m) == "a2a"


def test_explain_names_the_choice_and_all_candidates():
    text = explain(16 << 20, TWO_HOSTS, CostModel.p4d())
    assert "hierarchical" in text.split("<- chosen")[0].splitlines()[-1]
    for name in ["xla", "ring", "a2a", "hierarchical"]:
        assert name in text


def test_set_cost_model_changes_choice():
    slow_latency = CostModel(alpha_intra=1e-3, bw_intra=1e12, alpha_inter=1e-3, bw_inter=1e12)
    try:
        set_cost_model(slow_latency)
        assert current() is slow_latency
        assert choose(16 << 20, TWO_HOSTS) == "a2a"
    finally:
        set_cost_model(None)
    assert current() == CostModel.p4d()
