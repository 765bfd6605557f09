"""Pre-flight: compiling the step for a plan's mesh, scaled when too large."""
import pytest

import jaxsmp
from jaxsmp.plan import Candidate, preflight
from jaxsmp.plan.compiled import scale

CONFIG = jaxsmp.models.preset("gpt_neox", "tiny", hidden_size=256, num_attention_heads=4,
                              intermediate_size=1024, vocab_size=1024)


def test_large_meshes_scale_dp_first_then_stages_then_sdp():
    c = Candidate(dp=4, sdp=16, tp=2, pp=4, microbatch_size=1, microbatches=8, remat="full",
                  schedule="interleaved")
    cfg, small, note = scale(CONFIG.replace(num_hidden_layers=8), c, max_devices=64)
    assert (small.dp, small.pp, small.sdp, small.world) == (1, 2, 16, 64)
    assert cfg.num_hidden_layers == 4 and "dp 4 -> 1" in note and "pp 4 -> 2" in note
    cfg, small, note = scale(CONFIG.replace(num_hidden_layers=8), c, max_devices=8)
    assert (small.pp, small.sdp, small.world) == (1, 4, 8) and "sdp 16 -> 4" in note
    assert cfg.num_hidden_layers == 1    # 2 layers x 4/16, at least one
    untouched = Candidate(1, 8, 1, 1, 2, 1)
    assert scale(CONFIG, untouched, 8) == (CONFIG, untouched, "")
    with pytest.raises(ValueError, match="still needs 16 devices"):
        scale(CONFIG, Candidate(1, 1, 16, 1, 1, 1), 8)


def test_preflight_compiles_here_and_matches_the_model():
    result = preflight(CONFIG, Candidate(1, 8, 1, 1, 2, 1, "full", "fp32"), 128)
    assert result.compiled.arguments == pytest.approx(result.predicted.arguments, rel=1e-3)
    assert abs(result.error) < 0.15
    assert "pre-flight: dp=1 sdp=8 tp=1" in result.summary()


@pytest.mark.slow
def test_preflight_starts_a_process_with_enough_devices_for_a_larger_mesh():
    result = preflight(CONFIG, Candidate(2, 8, 1, 1, 2, 1, "full", "fp32"), 128)
    assert result.compiled_candidate.world == 16 and result.scaled == ""
    assert abs(result.error) < 0.15
