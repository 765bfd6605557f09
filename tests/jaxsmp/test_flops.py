"""Model FLOPs per token and the device peak."""
import jax
import pytest

from jaxsmp.metrics import peak_flops_per_device, train_flops_per_token
from jaxsmp.models import count_params, preset


def test_flops_per_token_follows_6n_plus_attention():
    cfg = preset("gpt_neox", "20b")
    n = count_params(cfg) - cfg.vocab_size * cfg.hidden_size
    expected = 6 * n + 12 * 44 * 6144 * 2048
    assert train_flops_per_token(cfg, 2048) == pytest.approx(expected)
    assert train_flops_per_token(cfg, 2048) / 6 / 20.5e9 == pytest.approx(1.05, abs=0.05)


def test_measured_peak_is_positive():
    peak, source = peak_flops_per_device(jax.devices()[0])
    assert peak > 1e8 and "measured" in source
