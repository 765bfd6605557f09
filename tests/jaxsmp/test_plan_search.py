"""The search: every configuration dividing cluster, batch and model, ranked."""
import json

import pytest

import jaxsmp
from jaxsmp.hf import to_hf_config
from jaxsmp.plan import Workload, candidates, cluster, load_model, plan

TINY = jaxsmp.models.preset("gpt_neox", "tiny")


def test_candidates_divide_the_cluster_the_batch_and_the_layers():
    w = Workload(TINY, 64)
    found = list(candidates(w, cluster("p4d.24xlarge", 2), global_batch=32))
    assert found
    for c in found:
        assert c.world == 16 and c.global_batch == 32 and w.layers % c.pp == 0
        assert c.tp <= 8 and (c.pp == 1 or c.schedule == "simple" or c.microbatches >= c.pp)
    assert {c.tp for c in found} == {1, 2, 4}    # 4 heads: tp=8 does not divide
    assert {c.remat for c in found} == {"none", "full", "save_qkv", "save_matmuls", "offload"}


def test_plans_fit_and_come_fastest_first():
    plans = plan("gpt_neox:13b", cluster("p4d.24xlarge", 4), seq_len=2048, global_batch=64,
                 top=None)
    assert plans and all(p.fits for p in plans)
    times = [p.throughput.step_seconds for p in plans]
    assert times == sorted(times)
    record = plans[0].as_dict()
    for key in ("dp", "sdp", "tp", "pp", "microbatch_size", "grad_accum", "remat", "offload",
                "memory_gib_per_gpu", "tflops_per_gpu", "mfu", "fits"):
        assert key in record
    assert json.dumps(record)


def test_a_model_too_large_for_the_cluster_has_no_fitting_plan():
    assert plan("bloom:176b", cluster("p4d.24xlarge", 1), seq_len=2048, global_batch=8) == []
    unfit = plan("bloom:176b", cluster("p4d.24xlarge", 1), seq_len=2048, global_batch=8,
                 include_unfit=True, top=3)
    assert unfit and not any(p.fits for p in unfit)


def test_models_load_from_presets_configs_and_hugging_face_config_files(tmp_path):
    assert load_model("llama:7b") == jaxsmp.models.preset("llama", "7b")
    assert load_model(TINY) is TINY
    (tmp_path / "config.json").write_text(json.dumps(to_hf_config(TINY)))
    assert load_model(tmp_path / "config.json") == TINY.replace(attention_impl="auto")
    assert load_model(str(tmp_path)) == load_model(tmp_path / "config.json")
    with pytest.raises(ValueError, match="family:preset"):
        load_model("gpt_neox")
    with pytest.raises(ValueError, match="unknown gpt_neox preset"):
        load_model("gpt_neox:3t")


def test_batches_that_split_over_nothing_are_clear_errors():
    with pytest.raises(ValueError, match="global_batch must be a positive integer"):
        plan(TINY, cluster("p4d.24xlarge", 1), seq_len=64, global_batch=0)


def test_the_4_node_example_config_is_the_planners_first_choice():
    """examples/configs/llama2_7b_4x8gpu.toml says it is the planner's first choice for
    its model, cluster and batch: its mesh, microbatches and remat are that plan's."""
    import tomllib
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "examples/configs/llama2_7b_4x8gpu.toml"
    cfg = tomllib.loads(path.read_text())
    best = plan("llama:7b", cluster("p4de.24xlarge", 4), seq_len=cfg["train"]["seq_len"],
                global_batch=cfg["train"]["batch_size"], top=1)[0].candidate
    mesh = {axis: cfg["mesh"].get(axis, 1) for axis in ("dp", "sdp", "tp", "pp")}
    assert mesh == {"dp": best.dp, "sdp": best.sdp, "tp": best.tp, "pp": best.pp}
    assert cfg["step"]["microbatches"] == best.microbatches
    assert cfg["step"]["remat"] == best.remat and cfg["step"]["precision"] == best.precision
