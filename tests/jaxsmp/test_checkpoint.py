"""Checkpoints of a tiny GPT-NeoX: exact resume, resharding onto other meshes, keep-K,
and the error cases (other model, corrupt files, no checkpoint, no overwrite)."""
from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxsmp
from jaxsmp.checkpoint import (
    CheckpointCorruptError,
    CheckpointExistsError,
    CheckpointManager,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    abstract_state,
    describe_model,
    restore_latest,
)
from jaxsmp.data import ByteTokenizer, TokenBatches, load_corpus
from jaxsmp.losses import causal_lm_loss
from jaxsmp.models import preset

CFG = preset("gpt_neox", "tiny", num_hidden_layers=2)
MODEL = describe_model(CFG, family="gpt_neox", preset="tiny")
TX = optax.adamw(1e-3)
STEPS = 4


def host(state) -> list[np.ndarray]:
    return [np.array(x) for x in jax.tree.leaves(state)]


def assert_bitwise(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and np.array_equal(x, y)


def train(state, train_step, data, start: int, stop: int):
    losses = []
    for i in range(start, stop):
        state, metrics = train_step(state, data.batch(i))
        losses.append(float(metrics["loss"]))
    return state, losses


@pytest.fixture(scope="module")
def data() -> TokenBatches:
    return TokenBatches(ByteTokenizer().encode(load_corpus(None)), 8, 32, seed=0)


@pytest.fixture(scope="module")
def train_step():
    return jaxsmp.step(causal_lm_loss)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data, train_step) -> SimpleNamespace:
    """An uninterrupted run on sdp=8 that checkpoints asynchronously every 2 steps
    while training continues (the step donates the state being written)."""
    directory = tmp_path_factory.mktemp("ckpt")
    state = jaxsmp.init(CFG.build, TX, jaxsmp.Mesh(sdp=8))
    losses, snapshots = [], {}
    with CheckpointManager(directory, save_every=2, keep=3, model=MODEL) as ckpt:
        for i in range(STEPS):
            state, metrics = train_step(state, data.batch(i))
            losses.append(float(metrics["loss"]))
            if ckpt.save(state):
                snapshots[i + 1] = host(state)
    return SimpleNamespace(dir=directory, losses=losses, snapshots=snapshots,
                           final=host(state))


def test_resume_on_same_mesh_is_bitwise(reference, data, train_step):
    with CheckpointManager(reference.dir, model=MODEL) as ckpt:
        assert ckpt.all_steps() == [2, 4]
        meta = ckpt.metadata(2)
        state = ckpt.restore(abstract_state(CFG.build, TX, jaxsmp.Mesh(sdp=8)), step=2)
    assert meta["step"] == meta["data_position"] == 2
    assert meta["mesh"] == {"dp": 1, "pp": 1, "ep": 1, "sdp": 8, "cp": 1, "tp": 1}
    assert meta["model"]["preset"] == "tiny"
    assert int(state.step) == 2
    assert_bitwise(host(state), reference.snapshots[2])
    state, losses = train(state, train_step, data, 2, STEPS)
    assert losses == reference.losses[2:]
    assert_bitwise(host(state), reference.final)


def test_restore_latest(reference):
    template = abstract_state(CFG.build, TX, jaxsmp.Mesh(sdp=8))
    state = restore_latest(reference.dir, template, model=MODEL)
    assert int(state.step) == STEPS
    assert_bitwise(host(state), reference.final)


MESHES = {"sdp4_tp2": dict(sdp=4, tp=2), "dp2_sdp4": dict(dp=2, sdp=4),
          "4_devices_sdp2_tp2": dict(sdp=2, tp=2, devices=4)}


@pytest.mark.parametrize("degrees", MESHES.values(), ids=MESHES.keys())
def test_reshard_onto_another_mesh(reference, data, train_step, degrees):
    degrees = dict(degrees)
    if "devices" in degrees:
        degrees["devices"] = jax.devices()[:degrees["devices"]]
    mesh = jaxsmp.Mesh(**degrees)
    template = abstract_state(CFG.build, TX, mesh)
    with CheckpointManager(reference.dir, model=MODEL) as ckpt:
        state = ckpt.restore(template, step=2)
    # Values are exact; layouts are the new mesh's.
    assert_bitwise(host(state), reference.snapshots[2])
    for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(template)):
        assert got.sharding.is_equivalent_to(want.sharding, got.ndim)
        assert set(got.sharding.device_set) == set(mesh.jax_mesh.devices.flat)
    # Training on: other reduction orders, so equal within float32 round-off (Adam
    # turns round-off in near-zero gradients into parameter differences ~1e-6).
    state, losses = train(state, train_step, data, 2, STEPS)
    np.testing.assert_allclose(losses, reference.losses[2:], rtol=1e-5, atol=0)
    for got, want in zip(host(state), reference.final):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_keep_last_k(tmp_path):
    state = jaxsmp.init(CFG.build, TX, jaxsmp.Mesh(sdp=8))
    with CheckpointManager(tmp_path, save_every=2, keep=2) as ckpt:
        saved = [ckpt.save(state.replace(step=jnp.int32(s))) for s in range(1, 8)]
    assert saved == [False, True, False, True, False, True, False]
    assert sorted(int(p.name) for p in tmp_path.iterdir()) == [4, 6]


def test_no_checkpoint(tmp_path):
    template = abstract_state(CFG.build, TX, jaxsmp.Mesh(sdp=8))
    with pytest.raises(CheckpointNotFoundError, match=f"no complete checkpoint in {tmp_path}"):
        restore_latest(tmp_path, template)
    with CheckpointManager(tmp_path) as ckpt:
        with pytest.raises(CheckpointNotFoundError):
            ckpt.resume(template, "require")
        assert ckpt.resume(template, "auto") is template
        with pytest.raises(CheckpointNotFoundError, match="step 3"):
            ckpt.restore(template, step=3)


def test_other_model_config(reference):
    other = CFG.replace(num_hidden_layers=3)
    template = abstract_state(other.build, TX, jaxsmp.Mesh(sdp=8))
    expected = describe_model(other, family="gpt_neox", preset="tiny")
    with pytest.raises(CheckpointMismatchError,
                       match="config.num_hidden_layers: saved 2, expected 3"):
        restore_latest(reference.dir, template, model=expected)
    # Without a model description the array shapes still catch it.
    with pytest.raises(CheckpointMismatchError,
                       match=r"query_key_value/kernel/value: saved \[2, 128, 384\] float32, "
                             r"expected \[3, 128, 384\] float32"):
        restore_latest(reference.dir, template)


def test_other_preset(reference):
    template = abstract_state(CFG.build, TX, jaxsmp.Mesh(sdp=8))
    expected = describe_model(CFG, family="gpt_neox", preset="125m")
    with pytest.raises(CheckpointMismatchError,
                       match="preset 'tiny', but the run expects gpt_neox preset '125m'"):
        restore_latest(reference.dir, template, model=expected)


def test_other_optimizer(reference):
    template = abstract_state(CFG.build, optax.sgd(0.1, momentum=0.9), jaxsmp.Mesh(sdp=8))
    with pytest.raises(CheckpointMismatchError, match="opt_state/0/trace/embed_in/embedding/value: missing from the checkpoint"):
        restore_latest(reference.dir, template)


def _copy(reference, tmp_path) -> Path:
    directory = tmp_path / "ckpt"
    shutil.copytree(reference.dir, directory)
    return directory


def test_truncated_array_file(reference, tmp_path):
    directory = _copy(reference, tmp_path)
    files = [p for p in (directory / "4" / "state").rglob("*") if p.is_file()
             and "ocdbt.process_" in str(p) and p.parent.name == "d"]
    biggest = max(files, key=lambda p: p.stat().st_size)
    biggest.write_bytes(biggest.read_bytes()[: biggest.stat().st_size // 2])
    template = abstract_state(CFG.build, TX, jaxsmp.Mesh(sdp=8))
    with pytest.raises(CheckpointCorruptError,
                       match=r"step 4 .*arrays could not be read.*other complete "
                             r"checkpoints: steps \[2\]"):
        restore_latest(directory, template)
    state = CheckpointManager(directory).restore(template, step=2)  # the good one still loads
    assert_bitwise(host(state), reference.snapshots[2])


def test_corrupt_metadata(reference, tmp_path):
    directory = _copy(reference, tmp_path)
    (directory / "4" / "meta" / "metadata").write_text('{"format": "jaxsmp-chec')
    template = abstract_state(CFG.build, TX, jaxsmp.Mesh(sdp=8))
    with pytest.raises(CheckpointCorruptError, match="step 4 .*metadata could not be read"):
        restore_latest(directory, template)


def test_never_overwrites(reference, tmp_path):
    directory = _copy(reference, tmp_path)
    before = {p: p.read_bytes() for p in directory.rglob("*") if p.is_file()}
    template = abstract_state(CFG.build, TX, jaxsmp.Mesh(sdp=8))
    with CheckpointManager(directory, save_every=2, model=MODEL) as ckpt:
        with pytest.raises(CheckpointExistsError, match="already holds checkpoints"):
            ckpt.resume(template, "never")
        state = ckpt.restore(template, step=2)
        state = state.replace(step=jnp.int32(4))  # a different state claiming step 4
        with pytest.raises(CheckpointExistsError, match="step 4 already exists"):
            ckpt.save(state)
    after = {p: p.read_bytes() for p in directory.rglob("*") if p.is_file()}
    assert after == before


def test_top_level_save_and_restore(tmp_path):
    state = jaxsmp.init(CFG.build, TX, jaxsmp.Mesh(sdp=8), seed=3)
    jaxsmp.save(tmp_path, state)
    restored = jaxsmp.restore(tmp_path, abstract_state(CFG.build, TX, jaxsmp.Mesh(tp=2)))
    assert_bitwise(host(restored), host(state))
    with pytest.raises(CheckpointExistsError):
        jaxsmp.save(tmp_path, state)  # same step again: the good checkpoint stays
