"""Plans as a table, as JSON records, and the reasons the best one wins."""
import pytest

from jaxsmp.plan import cluster, plan
from jaxsmp.plan.memory import GiB
from jaxsmp.plan.report import records, table, why


def plans(**kw):
    return plan("gpt_neox:13b", cluster("p4d.24xlarge", 4), seq_len=2048, global_batch=64,
                top=None, include_unfit=True, **kw)


def test_the_table_shows_configuration_memory_parts_tflops_and_mfu():
    ranked = plans()
    text = table(ranked[:3])
    assert "GiB/GPU" in text and "TFLOP/s" in text and "MFU" in text
    assert ranked[0].candidate.label() in text.splitlines()[1]
    assert "does not fit" in table(ranked[-1:])


def test_why_compares_the_best_with_its_rivals_and_names_what_does_not_fit():
    ranked = plans()
    text = why(ranked)
    first = text.splitlines()[0]
    assert first.startswith("#1 " + ranked[0].candidate.label()) and "compute" in first
    assert "runner-up" in text and "best with another tp" in text and "slower" in text
    assert "remat" in text.splitlines()[1]


def test_the_report_names_the_gradient_reduction_dtype():
    default = why(plans())
    assert "gradients reduced in bf16 (the step's default for precision='bf16')" in default
    chosen = plans(reduce_dtype="fp32")
    assert "gradients reduced in fp32." in why(chosen).splitlines()[0]
    assert all(p.candidate.label().endswith("reduce=fp32") for p in chosen)
    assert records(chosen[:1])[0]["reduce_dtype"] == "fp32"
    with pytest.raises(ValueError, match="unknown reduce_dtype 'f32'"):
        plans(reduce_dtype="f32")


def test_why_says_when_nothing_fits():
    ranked = plan("bloom:176b", cluster("p4d.24xlarge", 1), seq_len=2048, global_batch=8,
                  top=None, include_unfit=True)
    assert why(ranked).startswith("No configuration fits")


def test_records_keep_the_plans_order():
    ranked = plans()[:4]
    assert [r["step_seconds"] for r in records(ranked)] == [
        p.throughput.step_seconds for p in ranked]


def test_a_plan_whose_temporaries_xla_would_recompute_does_not_fit():
    """On one p5 node, GPT-NeoX 1.3b plans whose total fits in the allocator but whose
    temporaries exceed XLA's limit (it would recompute them) are not counted as fitting,
    and the reason names the limit."""
    ranked = plan("gpt_neox:1.3b", cluster("p5.48xlarge", 1), seq_len=2048, global_batch=256,
                  top=None, include_unfit=True)
    over = [p for p in ranked if p.memory.total <= p.capacity and not p.within_xla_limit]
    assert over and not any(p.fits for p in over)
    assert "temporaries per GPU" in why(over[:1]) and "XLA plans them within" in why(over[:1])
    record = records(over[:1])[0]
    assert not record["fits"]
    assert record["xla_temporaries_limit_gib_per_gpu"] * GiB == pytest.approx(
        over[0].temporaries_limit) and over[0].temporaries_limit < over[0].memory.temporaries
