"""Hugging Face interop: import ``config.json`` + safetensors checkpoints of GPT-NeoX,
Bloom and Llama onto a mesh, and export back.

    state, config = jaxsmp.hf.init_from_hf("path/to/hf_dir", optax.adamw(1e-5), mesh)
    jaxsmp.hf.save_checkpoint(state.params, config, "path/to/out")
"""
from jaxsmp.hf.config import family_of, from_hf_config, load_config, to_hf_config
from jaxsmp.hf.load import init_from_hf, load_params
from jaxsmp.hf.save import save_checkpoint

__all__ = ["family_of", "from_hf_config", "init_from_hf", "load_config", "load_params",
           "save_checkpoint", "to_hf_config"]
