"""Import an HF checkpoint directory straight into sharded jaxsmp parameters.

Each device's shard of each parameter is read from the safetensors files on its
own (only that slice's bytes), converted to the parameter dtype and put on that
device before the next is read, so the host never holds more than one shard:
checkpoints larger than host memory load.
"""
from __future__ import annotations

import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx

from jaxsmp.hf.checkpoint import Checkpoint
from jaxsmp.hf.config import family_of, load_config
from jaxsmp.hf.names import BASE_PREFIX, TensorMap, ignorable, tensor_maps
from jaxsmp.mesh import Mesh
from jaxsmp.models.config_base import ModelConfig
from jaxsmp.nn.param import is_var, path_names, variables_by_path
from jaxsmp.train.precision import LossScale
from jaxsmp.train.state import TrainState, abstract_params, state_shardings


def check_tensors(ckpt: Checkpoint, config: ModelConfig, maps: Mapping[tuple, TensorMap],
                  shapes: Mapping[tuple, tuple[int, ...]]) -> None:
    """Every expected tensor exists with the expected shape; no unknown tensor is left."""
    expected: set[str] = set()
    for path, m in maps.items():
        want = m.hf_shape(shapes[path])
        for idx in m.indices(shapes[path]):
            name = m.hf_name(*idx)
            expected.add(name)
            if name not in ckpt:
                raise KeyError(f"tensor {name!r} (for jaxsmp parameter {'/'.join(path)}) "
                               f"is missing from the checkpoint in {ckpt.root}")
            if ckpt.shape(name) != want:
                raise ValueError(f"tensor {name!r} has shape {list(ckpt.shape(name))} in the "
                                 f"checkpoint, but the config needs {list(want)}")
    unknown = sorted(n for n in ckpt.names() - expected if not ignorable(config, n))
    if unknown:
        raise ValueError(f"checkpoint in {ckpt.root} has tensors jaxsmp's "
                         f"{family_of(config)} model does not use: {unknown[:8]}"
                         f"{' ...' if len(unknown) > 8 else ''}")


def read_shard(ckpt: Checkpoint, m: TensorMap, index: tuple[slice, ...],
               shape: tuple[int, ...], dtype) -> np.ndarray:
    """The part ``index`` of a jaxsmp parameter of global ``shape``, from the HF tensor(s)."""
    index = tuple(index) + (slice(None),) * (len(shape) - len(index))
    lead = len(m.keys)
    inner = index[lead:]
    hf_index = tuple(reversed(inner)) if m.transpose else inner

    def one(*idx: int) -> np.ndarray:
        part = ckpt.read(m.hf_name(*idx), hf_index)
        return (part.T if m.transpose else part).astype(dtype)

    if not lead:
        return one()
    ranges = [range(*s.indices(n)) for s, n in zip(index[:lead], shape[:lead])]
    out = np.empty(tuple(map(len, ranges)) + tuple(len(range(*s.indices(n)))
                                                  for s, n in zip(inner, shape[lead:])), dtype)
    for pos in itertools.product(*(list(enumerate(r)) for r in ranges)):
        out[tuple(p[0] for p in pos)] = one(*(p[1] for p in pos))
    return out


def _index_key(index: tuple[slice, ...], shape: tuple[int, ...]) -> tuple:
    return tuple(s.indices(n) for s, n in zip(index, shape))


def place(ckpt: Checkpoint, m: TensorMap, shape: tuple[int, ...], dtype,
          sharding: jax.sharding.Sharding) -> jax.Array:
    """A global array of ``shape`` laid out by ``sharding``, built one device shard at
    a time; replicas of a shard are copied device to device, not read again."""
    placed: dict[tuple, jax.Array] = {}
    arrays = []
    for device, index in sharding.addressable_devices_indices_map(shape).items():
        key = _index_key(index, shape)
        if key in placed:
            arrays.append(jax.device_put(placed[key], device))
        else:
            shard = jax.device_put(read_shard(ckpt, m, index, shape, dtype), device)
            placed[key] = shard.block_until_ready()  # frees the host copy before the next read
            arrays.append(shard)
    return jax.make_array_from_single_device_arrays(shape, sharding, arrays)


def load_params(path: str | Path, mesh: Mesh, *, config: ModelConfig | None = None,
                rules: Mapping | None = None):
    """(config, graphdef, params) with params sharded on ``mesh`` like ``jaxsmp.init``'s.

    ``config`` defaults to the one in ``config.json`` (pass one to change runtime
    fields such as ``attention_impl``)."""
    config = config or load_config(path)[1]
    graphdef, abstract = abstract_params(config.build, mesh, rules)
    by_path = variables_by_path(abstract)
    maps = {m.path: m for m in tensor_maps(config)}
    if set(maps) != set(by_path):
        raise RuntimeError(f"HF name table and model disagree: {set(maps) ^ set(by_path)}")
    ckpt = Checkpoint(path, BASE_PREFIX[family_of(config)])
    check_tensors(ckpt, config, maps, {p: tuple(v.shape) for p, v in by_path.items()})

    def load(key, var: nnx.Variable) -> nnx.Variable:
        array = place(ckpt, maps[path_names(key)], tuple(var.shape), var.dtype,
                      state_shardings(var, mesh))
        return var.replace(array)

    params = jax.tree_util.tree_map_with_path(load, abstract, is_leaf=is_var)
    return config, graphdef, params


def init_from_hf(path: str | Path, tx: optax.GradientTransformation, mesh: Mesh, *,
                 rules: Mapping | None = None,
                 loss_scale: LossScale | None = None,
                 **overrides: Any) -> tuple[TrainState, ModelConfig]:
    """Like ``jaxsmp.init``, but the parameters come from the HF checkpoint ``path``.
    ``overrides`` replace config fields (e.g. ``attention_impl="blockwise"``)."""
    config = load_config(path)[1]
    config = config.replace(**overrides) if overrides else config
    config, graphdef, params = load_params(path, mesh, config=config, rules=rules)
    state = TrainState.create(graphdef, params, tx, mesh, loss_scale=loss_scale)
    return state, config

