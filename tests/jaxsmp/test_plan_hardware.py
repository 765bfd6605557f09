"""Accelerator and node tables, generic and user-registered nodes."""
import pytest

from jaxsmp.plan import GPU, GPUS, NODES, Cluster, Node, generic_node, node, register_node
from jaxsmp.plan.hardware import PCIE_GEN4, PCIE_GEN5, GiB


def test_data_sheet_entries_describe_the_aws_nodes():
    p4d = node("p4d.24xlarge")
    assert (p4d.gpus, p4d.gpu.name, p4d.network_gbps) == (8, "A100-40GB", 400)
    assert p4d.gpu.peak_flops == 312e12 and p4d.gpu.memory_bytes == 40 * GiB
    assert node("p4de.24xlarge").gpu.memory_bytes == 80 * GiB
    assert node("p5.48xlarge").network_gbps == 3200 and node("p5.48xlarge").gpu.peak_flops == 989e12
    assert {"A100-40GB", "A100-80GB", "H100-SXM", "H200"} <= set(GPUS)


def test_a_generic_node_is_named_by_gpus_gpu_and_network():
    n = node("8xH200+800Gbps")
    assert (n.gpus, n.gpu, n.network_gbps) == (8, GPUS["H200"], 800)
    assert generic_node("A100-80GB", 4, 100).gpus == 4


def test_unknown_names_are_clear_errors():
    with pytest.raises(ValueError, match="unknown node type 'p9'"):
        node("p9")
    with pytest.raises(ValueError, match="unknown GPU 'B300'"):
        node("8xB300+400Gbps")
    with pytest.raises(ValueError, match="nodes must be a positive integer"):
        Cluster(node("p4d.24xlarge"), 0)


def test_users_register_their_own_nodes():
    gpu = GPU("MyGPU", 100e12, 16 * GiB, 1e12, 100e9, 0.8, 0.5, 50e12,
              cudnn_attention_efficiency=0.5, pcie_bandwidth=20e9)
    try:
        register_node(Node("my.box", gpu, 4, 100))
        assert Cluster(node("my.box"), 2).world == 8
        assert node("my.box").pcie_bandwidth == 10e9    # two GPUs behind a PCIe switch
    finally:
        NODES.pop("my.box")


def test_the_cost_model_uses_nvlink_inside_and_the_network_across_hosts():
    model = node("p4d.24xlarge").cost_model(link_efficiency=1.0)
    assert model.bw_intra == 300e9 and model.bw_inter == 400e9 / 8
    assert node("p4d.24xlarge").cost_model().bw_inter == pytest.approx(0.8 * 50e9)


def test_attention_is_priced_at_the_rate_of_the_kernel_that_runs_it():
    """cuDNN's fused attention reaches 1.5x FlashAttention-2's rate on H100 (FA3 paper,
    figs. 5-6); pallas_kernels' FlashAttention and published PyTorch runs are priced at
    FlashAttention-2's; on A100 no comparison is published and both are FA2's."""
    h100, a100 = GPUS["H100-SXM"], GPUS["A100-80GB"]
    assert (h100.attention_share("cudnn"), h100.attention_share("flash2")) == (0.51, 0.34)
    assert h100.attention_share("pallas") == h100.attention_share("flash2")
    assert GPUS["H200"].attention_share("cudnn") == 0.51
    assert a100.attention_share("cudnn") == a100.attention_share("flash2") == 0.55
    with pytest.raises(ValueError, match="unknown attention kernel 'xformers'.*cudnn"):
        h100.attention_share("xformers")


def test_a_gpu_without_cudnn_s_attention_rate_is_refused():
    with pytest.raises(ValueError, match="'MyGPU': cudnn_attention_efficiency must be in"):
        GPU("MyGPU", 100e12, 16 * GiB, 1e12, 100e9, 0.8, 0.5, 50e12)


def test_offload_moves_at_the_measured_host_link_rate():
    """One H200 alone on its PCIe Gen5 link offloaded at 35.7 GB/s (the GPU check); an
    8-GPU node's GPUs share a switch's link two by two; A100's Gen4 has half the rate."""
    assert generic_node("H200", gpus=1).pcie_bandwidth == PCIE_GEN5 == 35.7e9
    assert generic_node("H100-SXM").pcie_bandwidth == PCIE_GEN5 / 2
    assert node("p5e.48xlarge").pcie_bandwidth == PCIE_GEN5 / 2
    assert node("p4d.24xlarge").pcie_bandwidth == PCIE_GEN4 / 2 == GPUS["A100-40GB"].pcie_bandwidth / 2


def test_a_gpu_without_its_host_link_rate_is_refused():
    with pytest.raises(ValueError, match="'MyGPU': pcie_bandwidth .* must be > 0"):
        GPU("MyGPU", 100e12, 16 * GiB, 1e12, 100e9, 0.8, 0.5, 50e12,
            cudnn_attention_efficiency=0.5)
