"""The step-time model: compute, collectives on the topology, overlap, bubble."""
import math

import pytest

import jaxsmp
from jaxsmp.plan import PLAIN_GSPMD, TARGET, Candidate, Workload, cluster, estimate_time
from jaxsmp.plan.comm import group_topology
from jaxsmp.plan.rates import throughput

W = Workload(jaxsmp.models.preset("gpt_neox", "13b"), 2048)
P4D = cluster("p4d.24xlarge", 16)


def test_mesh_axis_groups_fill_hosts_in_mesh_order():
    topo, sharing = group_topology(size=16, stride=1, per_host=8)   # sdp=16 with tp=1
    assert (topo.hosts, topo.devices_per_host, sharing) == (2, 8, 1)
    topo, sharing = group_topology(size=16, stride=2, per_host=8)   # sdp=16 with tp=2
    assert (topo.hosts, topo.devices_per_host, sharing) == (4, 4, 2)
    topo, sharing = group_topology(size=4, stride=32, per_host=8)   # dp across hosts
    assert (topo.hosts, topo.devices_per_host, sharing) == (4, 1, 8)


def test_large_microbatches_are_compute_bound_and_their_model_flops_add_up():
    c = Candidate(1, 128, 1, 1, 8, 1, "full")
    step = estimate_time(W, c, P4D)
    assert step.compute > 0.9 * step.total
    t = throughput(W, c, P4D, step)
    tokens = 1024 * 2048
    assert t.model_tflops_per_gpu == pytest.approx(
        W.model_flops_per_token * tokens / step.total / 128 / 1e12)
    assert t.mfu == pytest.approx(t.model_tflops_per_gpu * 1e12 / 312e12)
    assert t.hardware_tflops_per_gpu > t.model_tflops_per_gpu   # full remat recomputes


def test_prefetch_hides_sdp_collectives_that_otherwise_add_up():
    c = Candidate(1, 128, 1, 1, 8, 1, "full")
    hidden = estimate_time(W, c, P4D, TARGET).sdp
    exposed = estimate_time(W, c, P4D, PLAIN_GSPMD).sdp
    assert exposed > 10 * hidden


def test_smaller_microbatches_expose_more_of_the_sdp_collectives():
    big = estimate_time(W, Candidate(1, 128, 1, 1, 8, 1, "full"), P4D)
    small = estimate_time(W, Candidate(1, 128, 1, 1, 1, 8, "full"), P4D)
    assert small.sdp > big.sdp and small.total > big.total


def test_pipelines_pay_the_simulated_bubble_and_tp_its_all_reduces():
    simple = estimate_time(W, Candidate(1, 16, 1, 8, 1, 8, "full", schedule="simple"), P4D)
    staged = simple.compute + simple.tp + simple.pp + simple.sdp
    # (p - 1) / m = 7/8 of the stages' work; the loss head runs outside the pipeline
    assert 0.8 * 7 / 8 * staged < simple.bubble < 7 / 8 * staged
    virtual = estimate_time(W, Candidate(1, 16, 1, 8, 1, 8, "full", schedule="virtual",
                                         virtual_chunks=5), P4D)
    assert virtual.bubble < simple.bubble / 2 and virtual.pp > simple.pp   # more, smaller sends
    assert estimate_time(W, Candidate(1, 64, 2, 1, 16, 1, "full"), P4D).tp > 0
    assert estimate_time(W, Candidate(1, 128, 1, 1, 8, 1, "full"), P4D).tp == 0


def test_data_parallel_replicas_pay_one_gradient_all_reduce_per_step():
    assert estimate_time(W, Candidate(1, 128, 1, 1, 8, 1, "full"), P4D).dp == 0
    assert estimate_time(W, Candidate(4, 32, 1, 1, 8, 1, "full"), P4D).dp > 0


def test_a_bf16_reduction_moves_half_the_gradient_bytes_of_a_float32_one(monkeypatch):
    import jaxsmp.plan.throughput as throughput_module
    calls = {"gather": [], "all_reduce": []}
    gather, all_reduce = throughput_module.gather_seconds, throughput_module.all_reduce_seconds
    monkeypatch.setattr(throughput_module, "gather_seconds", lambda cl, size, stride, nbytes: (
        calls["gather"].append(nbytes) or gather(cl, size, stride, nbytes)))
    monkeypatch.setattr(throughput_module, "all_reduce_seconds", lambda cl, size, s, nbytes: (
        calls["all_reduce"].append(nbytes) or all_reduce(cl, size, s, nbytes)))

    def priced(reduce_dtype):
        calls["gather"].clear(), calls["all_reduce"].clear()
        t = estimate_time(W, Candidate(4, 32, 1, 1, 8, 1, "full", reduce_dtype=reduce_dtype),
                          P4D)
        # (layer gather, layer reduce-scatter, top gather, top reduce-scatter), dp all-reduce
        return t, calls["gather"][:], calls["all_reduce"][-1]

    bf16, (gather16, scatter16, top16, top_scatter16), dp16 = priced("bf16")
    fp32, (gather32, scatter32, top32, top_scatter32), dp32 = priced("fp32")
    assert scatter16 == scatter32 / 2 and top_scatter16 == top_scatter32 / 2
    assert dp16 == dp32 / 2
    assert (gather16, top16) == (gather32, top32)     # weights are gathered in bf16 either way
    assert bf16.dp < fp32.dp and bf16.sdp <= fp32.sdp and bf16.compute == fp32.compute
    # the step's default with bf16 compute is bf16 reduction
    assert priced(None)[0] == bf16


def test_a_candidate_must_use_the_whole_cluster():
    with pytest.raises(ValueError, match="uses 64 devices; the cluster has 128"):
        estimate_time(W, Candidate(1, 64, 1, 1, 16, 1, "full"), P4D)


def test_plain_gspmd_every_tp_rank_computes_the_whole_layer():
    c = Candidate(1, 64, 2, 1, 16, 1, "full")
    megatron = estimate_time(W, c, P4D, TARGET)
    whole = estimate_time(W, c, P4D, PLAIN_GSPMD)
    assert whole.compute > 1.8 * megatron.compute and whole.tp == 0


def test_less_overlap_exposes_more_of_the_prefetched_collectives():
    from jaxsmp.plan.calibration import Fitted
    c = Candidate(1, 128, 1, 1, 1, 8, "full")
    full = estimate_time(W, c, P4D, TARGET, Fitted(overlap=1.0))
    half = estimate_time(W, c, P4D, TARGET, Fitted(overlap=0.5))
    assert half.sdp > full.sdp and half.compute == full.compute


def test_the_first_gather_and_last_reduce_scatter_of_a_microbatch_stay_exposed():
    # one microbatch of 8 sequences: compute hides every per-layer collective
    c = Candidate(1, 128, 1, 1, 8, 1, "full")
    assert estimate_time(W, c, P4D).sdp > estimate_time(W, c, P4D).dp   # not zero


def test_the_families_memory_scale_multiplies_the_memory_bound_work(monkeypatch):
    from jaxsmp.plan import calibration
    from jaxsmp.plan.traffic import memory_bound
    c = Candidate(1, 128, 1, 1, 8, 1, "full")
    old = calibration.MEMORY_SCALE["gpt_neox"]
    base = estimate_time(W, c, P4D)
    layers, weights, outside = memory_bound(W, c, P4D)
    new = calibration.MemoryScale(2.0, 5.0, 3.0)
    monkeypatch.setitem(calibration.MEMORY_SCALE, "gpt_neox", new)
    scaled = estimate_time(W, c, P4D)
    extra = (scaled.compute + scaled.optimizer) - (base.compute + base.optimizer)
    assert extra == pytest.approx((new.layer - old.layer) * layers + (new.weights - old.weights)
                                  * weights + (new.outside - old.outside) * outside, rel=1e-6)


def test_a_fitted_constant_out_of_range_is_refused():
    from jaxsmp.plan.calibration import Fitted
    with pytest.raises(ValueError, match="matmul must be in"):
        Fitted(matmul=0.0)


def test_pipeline_stages_are_split_as_the_step_splits_them():
    """1F1B runs the head in the last stage's ticks: with a head as heavy as a 512k
    vocabulary on a narrow model, the planner takes the step's lock-step split (the last
    stage lighter) and it predicts less time than the equal split would take."""
    from jaxsmp.plan import throughput as tp
    heavy = Workload(jaxsmp.models.preset("gpt_neox", "1.3b", vocab_size=512000), 2048)
    c = Candidate(1, 32, 1, 4, 1, 16, "full", schedule="interleaved")
    step = estimate_time(heavy, c, P4D)
    assert sum(step.stages) == 24 and step.stages[-1] < max(step.stages)
    layer = tp._layer(heavy, c, P4D, TARGET, tp.FITTED)
    per_layer = tp._per_layer(layer, TARGET, tp.FITTED.overlap,
                              P4D.node.gpu.collective_sm_share)[0]
    head = tp._head(heavy, c, P4D, tp.FITTED)
    assert (tp._lockstep(c, step.stages, layer, per_layer, head)
            < tp._lockstep(c, (6, 6, 6, 6), layer, per_layer, head))
    simple = estimate_time(heavy, Candidate(1, 32, 1, 4, 1, 16, "full"), P4D)
    assert simple.stages == (6, 6, 6, 6)   # its head runs on every stage, outside the ticks


def test_the_report_names_an_unequal_split():
    from jaxsmp.plan.report import records, table
    from jaxsmp.plan.search import evaluate
    heavy = Workload(jaxsmp.models.preset("gpt_neox", "1.3b", vocab_size=512000), 2048)
    plan = evaluate(heavy, Candidate(1, 32, 1, 4, 1, 16, "full", schedule="interleaved"),
                    P4D)
    # (10,3,10,1 here; which unequal split wins moves with the collectives' prices)
    split = plan.time.stages
    assert len(set(split)) > 1 and sum(split) == heavy.layers
    assert f"layers {','.join(map(str, split))}" in table([plan])
    assert records([plan])[0]["pipeline_partition"] == list(split)


def test_a_heavy_head_is_spread_when_the_microbatch_divides_and_the_report_says_so():
    """With 4 sequences per microbatch on pp=4, the planner (as the step's
    pipeline_head="auto") spreads the 512k-vocabulary head over the stages: less time
    than the best split with the head on the last stage."""
    from jaxsmp.plan import throughput as tp
    from jaxsmp.plan.report import records, table
    from jaxsmp.plan.search import evaluate
    heavy = Workload(jaxsmp.models.preset("gpt_neox", "1.3b", vocab_size=512000), 2048)
    c, four = Candidate(1, 8, 1, 4, 4, 16, "full", schedule="interleaved"), cluster(
        "p4d.24xlarge", 4)
    plan = evaluate(heavy, c, four)
    assert plan.time.spread_head and "head spread" in table([plan])
    assert records([plan])[0]["pipeline_head"] == "spread"
    layer = tp._layer(heavy, c, four, TARGET, tp.FITTED)
    per_layer = tp._per_layer(layer, TARGET, tp.FITTED.overlap,
                              four.node.gpu.collective_sm_share)[0]
    forward, head = per_layer * tp._forward_share(layer), tp._head(heavy, c, four, tp.FITTED)
    last = tp.one_f_one_b_split(24, 4, 16, forward, per_layer - forward, head,
                                can_spread=False)
    assert (tp._lockstep(c, plan.time.stages, layer, per_layer, head, True)
            < tp._lockstep(c, last.counts, layer, per_layer, head))


def test_hidden_collectives_slow_the_compute_beside_them_by_nccls_sm_share():
    """While a hidden sdp collective runs, NCCL's thread blocks hold the GPU's
    ``collective_sm_share`` of the SMs: the step pays that share of the hidden time (not
    of the exposed time, nor of the microbatch's first gather and last reduce-scatter,
    which nothing hides), and nothing where no collective overlaps compute."""
    from dataclasses import replace

    from jaxsmp.plan import COMPILED, throughput as tp
    from jaxsmp.plan.hardware import Cluster
    c = Candidate(1, 128, 1, 1, 2, 4, "full")
    share = P4D.node.gpu.collective_sm_share
    assert share == pytest.approx(16 / 108)
    free = Cluster(replace(P4D.node, gpu=replace(P4D.node.gpu, collective_sm_share=0.0)), 16)
    step, without = estimate_time(W, c, P4D), estimate_time(W, c, free)
    assert without.contention == 0
    # the stragglers' wait scales with the whole step, the contention included
    wait = tp.straggler_wait(P4D.world)
    assert step.total - without.total == pytest.approx(step.contention * (1 + wait))
    layer = tp._layer(W, c, P4D, TARGET, tp.FITTED)
    compute, exposed, _ = tp._overlapped(layer, TARGET, tp.FITTED.overlap)
    hidden = layer.gather + layer.reduce_scatter - exposed
    assert 0 < hidden < compute
    edges = tp._edges(layer, tp.FITTED.overlap)
    assert step.contention == pytest.approx(
        share * c.microbatches * (W.layers * hidden - edges))
    assert estimate_time(W, c, P4D, COMPILED).contention == 0   # no prefetch: all exposed


def test_the_layer_prices_attention_at_the_rate_of_the_kernel_it_runs():
    """On H100 the step's cuDNN attention takes 0.34 / 0.51 of FlashAttention-2's time
    (what a published PyTorch run is priced with); everything else is the same."""
    from jaxsmp.plan.calibration import FITTED
    from jaxsmp.plan.throughput import _layer
    config, c, p5 = W.config, Candidate(1, 16, 1, 1, 2, 1, "full"), cluster("p5.48xlarge", 2)
    layers = {k: _layer(Workload(config, 2048, k), c, p5, TARGET, FITTED)
              for k in (None, "cudnn", "flash2")}
    assert layers[None] == layers["cudnn"]      # GPT-NeoX's step runs cuDNN's
    tokens, hidden = 2 * 2048, W.hidden
    fa2 = 2 * tokens * 2048 * hidden / (989e12 * 0.34 * FITTED.attention)
    saved = layers["flash2"].forward - layers["cudnn"].forward
    assert saved == pytest.approx(fa2 * (1 - 0.34 / 0.51), rel=1e-9)
    with pytest.raises(ValueError, match="unknown attention kernel 'sdpa'"):
        Workload(config, 2048, "sdpa")
    # float32 attention runs Pallas (cuDNN refuses it): its rate and its backward
    fp32 = Candidate(1, 16, 1, 1, 2, 1, "full", "fp32")
    assert _layer(W, fp32, p5, TARGET, FITTED) == _layer(
        Workload(config, 2048, "pallas"), fp32, p5, TARGET, FITTED)
    assert _layer(W, fp32, p5, TARGET, FITTED) != _layer(
        Workload(config, 2048, "cudnn"), fp32, p5, TARGET, FITTED)


def test_recompute_runs_the_gemms_the_backward_reads_and_save_qkv_not_q_k_v():
    """``full`` runs again the layer's forward but the GEMMs whose outputs only the
    residual sum reads (``Workload.recomputed_share``; the whole forward with
    ``whole_forward`` semantics), ``save_qkv`` that less its q, k, v projections."""
    from dataclasses import replace

    from jaxsmp.plan.calibration import FITTED
    from jaxsmp.plan.throughput import _layer
    from jaxsmp.plan.traffic import elementwise as _elementwise, stash as _stash
    full, kept = (_layer(W, Candidate(1, 128, 1, 1, 8, 1, r), P4D, TARGET, FITTED)
                  for r in ("full", "save_qkv"))
    c = Candidate(1, 128, 1, 1, 8, 1, "full")
    whole = _layer(W, c, P4D, replace(TARGET, whole_forward=True), FITTED)
    # the residuals kept are copied once, in the forward; XLA fuses recomputed
    # elementwise work into the backward's kernels, an eager whole forward runs it again
    stash, elementwise = _stash(W, c, P4D, 1), _elementwise(W, c, P4D, 1) * W.memory_scale.layer
    gpu = P4D.node.gpu
    rate = gpu.peak_flops * gpu.matmul_efficiency * FITTED.matmul
    qkv = 2 * 8 * 2048 * W.layer_qkv_params / rate
    gemms = 2 * 8 * 2048 * W.layer_matmul_params / rate
    assert whole.recompute == pytest.approx(whole.forward - stash, rel=1e-12)
    assert whole.forward == full.forward
    assert full.forward - stash - elementwise - full.recompute == pytest.approx(
        (1 - W.recomputed_share("full")) * gemms, rel=1e-9)
    assert W.recomputed_share("full") == pytest.approx(7 / 12)   # GPT-NeoX: q, k, v, MLP in
    assert full.recompute - kept.recompute == pytest.approx(qkv, rel=1e-9)
    kept_stash = _stash(W, Candidate(1, 128, 1, 1, 8, 1, "save_qkv"), P4D, 1)
    assert kept_stash > stash   # q, k and v kept besides the layer's input
    assert kept.forward - kept_stash == pytest.approx(full.forward - stash, rel=1e-12)
    assert kept.backward == full.backward
    # the hardware FLOPs it reports leave out one forward of those GEMMs (same step time;
    # the layers' forward GEMMs taken from 6N, whose N counts norms and biases too: 2e-4)
    step = estimate_time(W, Candidate(1, 128, 1, 1, 8, 1, "full"), P4D)
    rates = {r: throughput(W, Candidate(1, 128, 1, 1, 8, 1, r), P4D, step)
             for r in ("full", "save_qkv")}
    per_gpu = 1024 * 2048 / step.total / 128
    assert (rates["full"].hardware_tflops_per_gpu - rates["save_qkv"].hardware_tflops_per_gpu
            == pytest.approx(2 * W.layers * W.layer_qkv_params * per_gpu / 1e12, rel=1e-3))


@pytest.mark.parametrize("family, preset, remat", [
    ("gpt_neox", "1.3b", "none"), ("gpt_neox", "1.3b", "full"),
    ("gpt_neox", "1.3b", "save_matmuls"), ("bloom", "1b7", "full"), ("llama", "7b", "none")])
def test_the_gemm_and_attention_split_is_the_whole_step_when_nothing_else_costs(
        monkeypatch, family, preset, remat):
    """On one GPU a step is its GEMMs, attention and memory-bound work; priced with no
    memory-bound work, ``kernel_seconds`` must account for all of it (Bloom: Pallas'
    backward ratio; remat: the recomputed GEMM share and attention's rerun)."""
    from jaxsmp.plan import Cluster, generic_node, traffic
    from jaxsmp.plan.calibration import MemoryScale
    from jaxsmp.plan.throughput import kernel_seconds
    w = Workload(jaxsmp.models.preset(family, preset), 2048)
    c = Candidate(1, 1, 1, 1, 4, 2, remat)
    one = Cluster(generic_node("H100-SXM", gpus=1), 1)
    gemms, attention = kernel_seconds(w, c, one)
    with_memory = estimate_time(w, c, one).total
    monkeypatch.setattr(Workload, "memory_scale", property(lambda _: MemoryScale(0, 0, 0)))
    monkeypatch.setattr(traffic, "STASH_PASSES", 0)
    assert gemms + attention == pytest.approx(estimate_time(w, c, one).total, rel=1e-9)
    assert gemms + attention < 0.9 * with_memory
    assert gemms > attention > 0


def test_the_split_is_refused_for_a_pipeline():
    from jaxsmp.plan.throughput import kernel_seconds
    with pytest.raises(ValueError, match="pp=1.*pp=2"):
        kernel_seconds(W, Candidate(1, 64, 1, 2, 1, 8, "full"), P4D)


def test_a_step_waits_for_the_slowest_of_its_gpus():
    """A synchronous step on N GPUs waits for the slowest, about sqrt(2 ln N) spreads
    above the mean (calibration.STRAGGLER_SPREAD, Sinha et al. SC22): nothing on one
    GPU, a share of every other part of the step on more, growing with N."""
    from jaxsmp.plan import Cluster, generic_node
    from jaxsmp.plan.calibration import STRAGGLER_SPREAD
    from jaxsmp.plan.throughput import straggler_wait
    one = Cluster(generic_node("H100-SXM", gpus=1), 1)
    alone = estimate_time(W, Candidate(1, 1, 1, 1, 1, 4, "full"), one)
    assert alone.stragglers == 0 and straggler_wait(1) == 0
    step = estimate_time(W, Candidate(1, 128, 1, 1, 8, 1, "full"), P4D)
    others = step.total - step.stragglers
    assert step.stragglers == pytest.approx(
        others * STRAGGLER_SPREAD * math.sqrt(2 * math.log(128)))
    assert 0 < straggler_wait(8) < straggler_wait(128) < straggler_wait(4096) < 0.07
