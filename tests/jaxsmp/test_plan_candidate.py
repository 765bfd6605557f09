"""Configurations and the step semantics they assume."""
import pytest

from jaxsmp.plan import COMPILED, PLAIN_GSPMD, TARGET, Candidate, schedule_report


def test_a_candidate_knows_its_world_batch_and_step_options():
    c = Candidate(dp=2, sdp=4, tp=2, pp=2, microbatch_size=3, microbatches=4, remat="full",
                  precision="bf16", schedule="interleaved")
    assert (c.world, c.data, c.local_batch, c.global_batch, c.grad_accum) == (32, 8, 12, 96, 1)
    assert c.step_options() == dict(microbatches=4, precision="bf16", remat="full",
                                    reduce_dtype="bf16", pipeline="interleaved")
    flat = Candidate(1, 8, 1, 1, 2, 4, "offload")
    assert flat.grad_accum == 4 and flat.offload and "pipeline" not in flat.step_options()
    assert flat.as_dict()["grad_accum"] == 4
    # a sequence-parallel plan runs with the step's sequence parallelism
    sp = Candidate(1, 4, 2, 1, 1, 1, sequence_parallel=True)
    assert sp.step_options()["sequence_parallel"] is True
    assert "sequence_parallel" not in flat.step_options()


def test_bad_candidates_are_rejected_by_name():
    with pytest.raises(ValueError, match="sdp must be a positive integer"):
        Candidate(1, 0, 1, 1, 1, 1)
    with pytest.raises(ValueError, match="unknown remat policy"):
        Candidate(1, 1, 1, 1, 1, 1, remat="most")
    with pytest.raises(ValueError, match="virtual_chunks=2 needs schedule='virtual'"):
        Candidate(1, 1, 1, 2, 1, 2, virtual_chunks=2)
    with pytest.raises(ValueError, match="unknown precision"):
        Candidate(1, 1, 1, 1, 1, 1, precision="fp4")
    with pytest.raises(ValueError, match=r"unknown reduce_dtype 'fp16'; valid: \('fp32', "
                                         r"'bf16'\) or None"):
        Candidate(1, 1, 1, 1, 1, 1, reduce_dtype="fp16")


def test_the_gradient_reduction_dtype_is_the_steps_default_unless_given():
    # reduce_dtype=None: bf16 reduction with bf16 compute, float32 otherwise, as the step
    bf16, fp32 = Candidate(1, 8, 1, 1, 1, 1), Candidate(1, 8, 1, 1, 1, 1, precision="fp32")
    assert (bf16.reduced, bf16.reduce_bytes, fp32.reduced, fp32.reduce_bytes) == (
        "bf16", 2, "fp32", 4)
    # the pre-flight compiles the step with the dtype the time model priced
    assert bf16.step_options()["reduce_dtype"] == "bf16"
    assert fp32.step_options()["reduce_dtype"] == "fp32"
    explicit = Candidate(1, 8, 1, 1, 1, 1, reduce_dtype="fp32")
    assert explicit.reduce_bytes == 4 and explicit.step_options()["reduce_dtype"] == "fp32"
    # a choice other than the default is in the label; the records always say it
    assert explicit.label().endswith("reduce=fp32") and "reduce" not in bf16.label()
    assert bf16.as_dict()["reduce_dtype"] == "bf16"


def test_semantics_say_when_gathered_weights_stay_alive():
    assert PLAIN_GSPMD.keeps_gathered("none") and not PLAIN_GSPMD.keeps_gathered("full")
    assert not TARGET.keeps_gathered("none") and TARGET.prefetch and TARGET.megatron_tp
    # the step compiles jaxsmp's ZeRO-3, prefetching by default only on GPUs
    assert not COMPILED.keeps_gathered("none") and not COMPILED.prefetch and TARGET.prefetch


def test_schedule_reports_come_from_the_simulator():
    assert schedule_report("simple", 4, 8).bubble == pytest.approx(3 / 8)
    assert schedule_report("virtual", 4, 8, 2).bubble == pytest.approx(3 / 16)
    assert max(schedule_report("interleaved", 4, 8).peak_activations) == 4
