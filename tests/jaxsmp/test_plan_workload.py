"""Per-device shards and saved activations of a model, from abstract shapes."""
import math

import pytest

import jaxsmp
from jaxsmp.plan import Workload

NEOX = jaxsmp.models.preset("gpt_neox", "tiny")   # d=128, 4 heads, MLP 512, 4 layers


def test_sdp_shards_every_parameter_dp_replicates_and_pp_splits_only_the_layers():
    w = Workload(NEOX, 64)
    mesh = {"dp": 1, "pp": 1, "sdp": 8, "tp": 1}
    one = w.shards({**mesh, "sdp": 1})
    assert one.local == w.total_params == w.layer_params * w.layers + one.top_local
    assert w.shards(mesh).local * 8 == w.total_params
    assert w.shards({**mesh, "sdp": 4, "dp": 2}) == w.shards({**mesh, "sdp": 4})
    staged = w.shards({**mesh, "sdp": 4, "pp": 2})
    assert staged.stacked_local * 8 == one.stacked_local
    assert staged.top_local * 4 == one.top_local


def test_a_gathered_layer_is_one_layer_split_only_over_tp():
    w = Workload(NEOX, 64)
    assert w.shards({"dp": 1, "pp": 1, "sdp": 8, "tp": 1}).layer_gathered == w.layer_params
    half = w.shards({"dp": 1, "pp": 1, "sdp": 4, "tp": 2}).layer_gathered
    assert w.layer_params / 2 <= half < w.layer_params   # norms are not split over tp


def test_the_untied_input_embedding_is_looked_up_not_gathered():
    w = Workload(NEOX, 64)
    top = w.shards({"dp": 1, "pp": 1, "sdp": 8, "tp": 1}).top_gathered
    assert top == NEOX.hidden_size * NEOX.vocab_size + 2 * NEOX.hidden_size   # head + final norm


def test_shards_that_do_not_divide_are_value_errors():
    # (layers over pp may not divide: such a stack is stored whole on every stage)
    with pytest.raises(ValueError, match="not divisible"):
        Workload(NEOX, 64).shards({"dp": 1, "pp": 1, "sdp": 1, "tp": 3})


def test_saved_activations_follow_the_layer_and_the_remat_policy():
    w, d, f = Workload(NEOX, 64), NEOX.hidden_size, NEOX.intermediate_size
    none = w.activations("none", "fp32")
    # a parallel-residual layer's two LayerNorms read the layer input (d), kept with
    # their per-token statistics: the backward computes the norms again from them
    # (jaxsmp.nn.norm), so no normalised value is kept; each keeps its own output (d);
    # the merged attention output 1 d (replicated over tp); q, k, v and the attention
    # output 4 d, exact GeLU 2 MLP-wide tensors (x and Phi(x), for its hand-written
    # derivative); per-token norm and softmax statistics are the rest. The rotary tables
    # are constants of the loss: nothing is kept for their gradient (a vjp in them would
    # keep q and k twice more)
    assert none.replicated == pytest.approx(4 * 4 * d, rel=0.01)
    assert none.replicated + none.split == pytest.approx(4 * (8 * d + 2 * f), rel=0.01)
    full = w.activations("full", "fp32")
    assert full.replicated == 4 * d                      # the layer input only
    matmuls = w.activations("save_matmuls", "fp32")
    assert matmuls.split == pytest.approx(4 * (3 * d + f), rel=0.02)   # QKV and MLP-in
    offload = w.activations("offload", "fp32")
    assert offload.replicated == 4 * d and offload.host > 0
    # bfloat16 halves them, but for float32 softmax statistics and GeLU's derivative terms
    assert w.activations("none", "bf16").split == pytest.approx(none.split / 2, rel=0.1)


def test_tensor_parallelism_splits_head_and_mlp_activations_and_sequence_parallelism_the_rest():
    a = Workload(NEOX, 64).activations("none", "bf16")
    assert a.per_device(2) == pytest.approx(a.replicated + a.split / 2)
    assert a.per_device(2, sequence_parallel=True) == pytest.approx(
        (a.replicated + a.split) / 2)


def test_every_family_is_traced_through_its_own_layer():
    for family in ("bloom", "llama"):
        w = Workload(jaxsmp.models.preset(family, "tiny"), 64)
        assert w.activations("none", "bf16").split > w.activations("save_matmuls", "bf16").split
        assert math.isclose(w.activations("full", "bf16").replicated, 2 * w.hidden)


def test_unknown_remat_policies_are_rejected():
    with pytest.raises(ValueError, match="unknown remat policy 'some'"):
        Workload(NEOX, 64).activations("some", "bf16")


def test_the_attention_backward_is_priced_in_the_kernel_the_family_runs():
    """Bloom's ALiBi runs pallas_kernels' FlashAttention on GPUs (cuDNN refuses ALiBi):
    7 score-sized matmuls in its backward to cuDNN's 5."""
    from jaxsmp.plan.workload import backward_ratio
    bloom = Workload(jaxsmp.models.preset("bloom", "tiny"), 128)
    llama = Workload(jaxsmp.models.preset("llama", "tiny"), 128)
    assert (bloom.attention_kernel, backward_ratio(bloom.attention_kernel)) == ("pallas", 3.5)
    assert (llama.attention_kernel, backward_ratio(llama.attention_kernel)) == ("cudnn", 2.5)
    forced = Workload(jaxsmp.models.preset("llama", "tiny", attention_impl="pallas"), 128)
    assert backward_ratio(forced.attention_kernel) == 3.5


def test_the_attention_kernel_follows_the_steps_own_choice_of_it_per_precision():
    """The planner asks pallas_kernels what ``impl="auto"`` runs on CUDA: cuDNN takes
    bf16 and fp16 (and fp8's bf16 attention), not float32, whose attention runs Pallas
    (and pays its 7-matmul backward)."""
    from jaxsmp.plan.workload import backward_ratio
    llama = Workload(jaxsmp.models.preset("llama", "tiny"), 128)
    kernels = {p: llama.attention_kernel_at(p) for p in ("bf16", "fp16", "fp8", "fp32")}
    assert kernels == {"bf16": "cudnn", "fp16": "cudnn", "fp8": "cudnn", "fp32": "pallas"}
    assert (backward_ratio("pallas"), backward_ratio("cudnn"), backward_ratio("flash2")) == \
        (3.5, 2.5, 2.5)
    priced = Workload(llama.config, 128, "flash2")    # what a published run used
    assert priced.attention_kernel_at("fp32") == priced.attention_kernel == "flash2"


@pytest.mark.parametrize("family", ["llama", "gpt_neox", "bloom"])
def test_save_qkv_keeps_the_q_k_v_projections_beside_the_layer_input(family):
    """Each family names its q, k, v projections' outputs (jaxsmp.nn.remat.name_qkv), so
    ``save_qkv`` keeps exactly them beyond what ``full`` keeps, and the planner knows
    their kernels' share of the layer's GEMMs."""
    w = Workload(jaxsmp.models.preset(family, "tiny"), 128)
    full, kept = w.activations("full", "bf16"), w.activations("save_qkv", "bf16")
    widths = (w.heads + 2 * w.kv_heads) * (w.hidden // w.heads)
    assert kept.replicated + kept.split - full.replicated - full.split == 2 * widths
    assert w.layer_qkv_params == w.hidden * widths
