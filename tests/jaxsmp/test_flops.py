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


def test_mixture_of_experts_counts_only_the_chosen_experts():
    cfg = preset("mixtral", "8x7b")  # 12.9B active of 46.7B
    active = count_params(cfg) - 6 * 3 * 4096 * 14336 * 32
    assert active == 12_879_925_248
    expected = 6 * (active - 32000 * 4096) + 12 * 32 * 4096 * 2048
    assert train_flops_per_token(cfg, 2048) == pytest.approx(expected)
