"""The shared trainer fine-tunes from a local HF checkpoint (--init-from-hf) with the
checkpoint's own tokenizer."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from hf_models import hf_logits_and_loss, hf_model

from jaxsmp.cli import TrainConfig, run
from jaxsmp.cli.batches import run_tokenizer
from jaxsmp.data import TokenBatches, default_corpus, load_corpus, load_tokenizer, train_bpe

RUN = dict(steps=2, batch_size=8, seq_len=32, eval_every=0, progress=False, tp=2,
           attention="reference")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory, bpe_tokenizer_file):
    """An HF Llama checkpoint of vocabulary 512 with its own (BPE) tokenizer.json."""
    model = hf_model("llama", seed=6, vocab_size=512)
    path = tmp_path_factory.mktemp("llama512")
    model.save_pretrained(path)
    shutil.copy(bpe_tokenizer_file, path / "tokenizer.json")
    return model, path


def test_fine_tuning_uses_the_checkpoints_tokenizer_and_starts_at_its_loss(llama_dir):
    model, path = llama_dir
    cfg = TrainConfig(model="llama", init_from_hf=str(path), **RUN)
    tokenizer = run_tokenizer(cfg)
    assert tokenizer.identity == load_tokenizer(path / "tokenizer.json").identity
    history = run(cfg)
    data = TokenBatches(tokenizer.encode(load_corpus(cfg.data)), cfg.batch_size,
                        cfg.seq_len, cfg.seed)
    _, want = hf_logits_and_loss(model, data.split()[0].batch(0)["tokens"])
    assert abs(history.losses[0] - want) < 1e-4
    assert np.isfinite(history.losses).all()


def test_a_tokenizer_larger_than_the_checkpoints_vocabulary_is_refused(llama_dir, tmp_path):
    _, path = llama_dir
    big = train_bpe([default_corpus()], 600)
    big.save(tmp_path / "tokenizer.json")
    with pytest.raises(ValueError, match="tokenizer has 600 tokens but the checkpoint .* only 512"):
        run(TrainConfig(model="llama", init_from_hf=str(path), tokenizer=str(tmp_path), **RUN))


def test_family_mismatch_is_explained(llama_dir):
    _, path = llama_dir
    with pytest.raises(ValueError, match="holds a llama checkpoint.*--model llama"):
        run(TrainConfig(model="bloom", init_from_hf=str(path), **RUN))
