"""examples/convert_hf.py: HF -> jaxsmp (orbax) -> HF gives back the same tensors."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from hf_models import hf_model
from safetensors.numpy import load_file

import jaxsmp

ROOT = Path(__file__).resolve().parents[2]


def _convert_module():
    spec = importlib.util.spec_from_file_location("convert_hf",
                                                  ROOT / "examples" / "convert_hf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("family", ["gpt_neox", "bloom", "llama"])
def test_hf_to_jaxsmp_to_hf_is_lossless(family, tmp_path):
    convert = _convert_module()
    hf_model(family, seed=5).save_pretrained(tmp_path / "hf")
    convert.to_jaxsmp(tmp_path / "hf", tmp_path / "jaxsmp", jaxsmp.Mesh(sdp=8))
    assert (tmp_path / "jaxsmp" / "params").is_dir()
    # Restored onto a different mesh: orbax reshards on read.
    convert.to_hf(tmp_path / "jaxsmp", tmp_path / "out", jaxsmp.Mesh(dp=2, sdp=2, tp=2),
                  "float32", 2**40)
    want = load_file(tmp_path / "hf" / "model.safetensors")
    got = load_file(tmp_path / "out" / "model.safetensors")
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == family
