"""The shared trainer fine-tunes from a local HF checkpoint (--init-from-hf)."""
from __future__ import annotations

import numpy as np
import pytest

from hf_models import hf_logits_and_loss, hf_model

from jaxsmp.data import ByteTokenizer, TokenBatches, load_corpus
from jaxsmp.cli import TrainConfig, run

RUN = dict(steps=2, batch_size=8, seq_len=32, eval_every=0, progress=False, tp=2,
           attention="reference")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    model = hf_model("llama", seed=6, vocab_size=256)
    path = tmp_path_factory.mktemp("llama256")
    model.save_pretrained(path)
    return model, path


def test_first_step_loss_is_the_hf_models_loss(llama_dir):
    model, path = llama_dir
    cfg = TrainConfig(model="llama", init_from_hf=str(path), **RUN)
    history = run(cfg)
    data = TokenBatches(ByteTokenizer().encode(load_corpus(cfg.data)), cfg.batch_size,
                        cfg.seq_len, cfg.seed)
    _, want = hf_logits_and_loss(model, data.split()[0].batch(0)["tokens"])
    assert abs(history.losses[0] - want) < 1e-4
    assert np.isfinite(history.losses).all()


def test_family_mismatch_is_explained(llama_dir):
    _, path = llama_dir
    with pytest.raises(ValueError, match="holds a llama checkpoint.*--model llama"):
        run(TrainConfig(model="bloom", init_from_hf=str(path), **RUN))
