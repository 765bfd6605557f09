"""Export jaxsmp parameters as an HF checkpoint directory (safetensors + config.json).

Tensors are fetched from the mesh one HF tensor (one layer of a stack) at a time
and written in files of at most ``max_shard_size`` bytes, so the host holds at
most one file's worth of tensors.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from jaxsmp.hf.checkpoint import INDEX, SINGLE
from jaxsmp.hf.config import to_hf_config
from jaxsmp.hf.names import TensorMap, tensor_maps
from jaxsmp.models.config_base import ModelConfig
from jaxsmp.nn.param import is_var, variables_by_path

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
Entry = tuple[str, TensorMap, tuple[int, ...], tuple[int, ...]]


def _params_by_path(params: nnx.State | nnx.Module) -> dict[tuple[str, ...], jax.Array]:
    if isinstance(params, nnx.Module):
        params = nnx.state(params, nnx.Param)
    return {path: v[...] if is_var(v) else v for path, v in variables_by_path(params).items()}


def _entries(config: ModelConfig, arrays: dict) -> list[Entry]:
    """(HF name, map, leading index (layer, expert), HF shape) for every tensor to write."""
    out = []
    for m in tensor_maps(config):
        if m.path not in arrays:
            raise KeyError(f"parameter {'/'.join(m.path)} (HF {m.hf!r}) is missing")
        shape = tuple(arrays[m.path].shape)
        hf_shape = m.hf_shape(shape)
        for idx in m.indices(shape):
            out.append((m.hf_name(*idx), m, idx, hf_shape))
    return out


def _plan(entries: list[Entry], itemsize: int, max_shard_size: int) -> list[list[Entry]]:
    """Greedy grouping into files of at most ``max_shard_size`` bytes (a bigger
    tensor gets a file of its own)."""
    files: list[list[Entry]] = [[]]
    size = 0
    for e in entries:
        nbytes = math.prod(e[3]) * itemsize
        if files[-1] and size + nbytes > max_shard_size:
            files.append([])
            size = 0
        files[-1].append(e)
        size += nbytes
    return files


@jax.jit
def _layer(array: jax.Array, layer: jax.Array) -> jax.Array:
    """One layer of a stack (the layer index is traced: one compile per shape)."""
    return jax.lax.dynamic_index_in_dim(array, layer, keepdims=False)


def _fetch(array: jax.Array, m: TensorMap, index: tuple[int, ...], dtype) -> np.ndarray:
    for i in index:  # the layer, then the expert
        array = _layer(array, i)
    value = np.asarray(jax.device_get(array))
    return np.ascontiguousarray(value.T if m.transpose else value).astype(dtype)


def save_checkpoint(params: nnx.State | nnx.Module, config: ModelConfig, path: str | Path,
                    *, dtype: str = "float32", max_shard_size: int = 5 * 2**30) -> Path:
    """Writes ``config.json`` and ``model.safetensors`` (or numbered shards and
    ``model.safetensors.index.json``) that ``transformers`` loads."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown export dtype {dtype!r}; valid: {sorted(DTYPES)}")
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    arrays = _params_by_path(params)
    np_dtype = DTYPES[dtype]
    files = _plan(_entries(config, arrays), np.dtype(np_dtype).itemsize, max_shard_size)
    names = ([SINGLE] if len(files) == 1 else
             [f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i in range(len(files))])
    weight_map, total = {}, 0
    for name, entries in zip(names, files):
        tensors = {hf: _fetch(arrays[m.path], m, idx, np_dtype)
                   for hf, m, idx, _ in entries}
        total += sum(t.nbytes for t in tensors.values())
        save_file(tensors, root / name, metadata={"format": "pt"})
        weight_map.update({hf: name for hf in tensors})
    if len(files) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (root / INDEX).write_text(json.dumps(index, indent=2))
    (root / "config.json").write_text(json.dumps(to_hf_config(config, dtype), indent=2))
    return root
