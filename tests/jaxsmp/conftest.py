"""Shared fixtures for jaxsmp tests: a tiny GPT-NeoX, random tokens, a training run."""
import contextlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
import optax
import pytest

import jaxsmp

BENCH = Path(__file__).resolve().parents[2] / "bench"


def bench_module(name: str):
    """``bench/<name>.py`` imported as the module ``name`` (its dataclasses look their
    module up in ``sys.modules``)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def tiny_config():
    return jaxsmp.models.preset("gpt_neox", "tiny", num_hidden_layers=2,
                                attention_impl="reference")


@pytest.fixture(scope="session")
def tokens():
    return np.random.default_rng(0).integers(0, 256, (16, 32)).astype(np.int32)


def single_device_mesh() -> jaxsmp.Mesh:
    return jaxsmp.Mesh(sdp=1, devices=jax.devices()[:1])


def train(config, mesh: jaxsmp.Mesh, tokens: np.ndarray, steps: int = 3,
          tx: Callable[[], optax.GradientTransformation] = lambda: optax.adamw(1e-3),
          **step_options):
    """(final state, losses) of ``steps`` steps on the same batch."""
    state = jaxsmp.init(config.build, tx(), mesh, seed=0)
    train_step = jaxsmp.step(jaxsmp.losses.causal_lm_loss, **step_options)
    losses = []
    for _ in range(steps):
        state, metrics = train_step(state, {"tokens": tokens})
        losses.append(float(metrics["loss"]))
    return state, losses


@contextlib.contextmanager
def compiled_programs():
    """The names of the programs XLA compiles inside the block (jax.monitoring's
    backend-compile event; a cache hit compiles nothing)."""
    names: list[str] = []

    def listen(event: str, seconds: float, **kwargs) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            names.append(kwargs.get("fun_name", "?"))
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield names
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


def gradients(config, mesh: jaxsmp.Mesh, tokens: np.ndarray,
              loss=jaxsmp.losses.causal_lm_loss, **step_options):
    """(every parameter's first-step gradient as a host array, metrics) on ``mesh``."""
    state = jaxsmp.init(config.build, optax.sgd(1.0), mesh, seed=0)
    grads, metrics = jaxsmp.step(loss, **step_options).gradients(state, {"tokens": tokens})
    return [np.asarray(g) for g in jax.tree.leaves(grads)], jax.tree.map(float, metrics)


def require_gpu_compiler() -> None:
    """The deviceless XLA:GPU compile needs ``jax-cuda12-plugin`` of jaxlib's own
    version (the test extra installs it). Without it a GPU-compile test skips, saying
    why; under CI (``CI`` set, as ``.ci/run`` runs) it fails instead, so that CI never
    passes with the GPU compiles skipped."""
    import importlib.metadata as metadata
    import os

    import jaxlib
    try:
        plugin = metadata.version("jax-cuda12-plugin")
    except metadata.PackageNotFoundError:
        plugin = None
    if plugin == jaxlib.__version__:
        return
    reason = (f"the deviceless GPU compile needs jax-cuda12-plugin=={jaxlib.__version__} "
              f"(jaxlib's version), found {plugin or 'none'}; pip install -e '.[test]'")
    if os.environ.get("CI"):
        pytest.fail(f"GPU-compile test not run under CI: {reason}", pytrace=False)
    pytest.skip(reason)


GRAD_RTOL = 1e-5  # float32: observed <= 1.1e-6 of each parameter's largest gradient


def assert_gradients_match(got, want, rtol: float = GRAD_RTOL) -> None:
    """Every gradient within ``rtol`` of its parameter's largest reference gradient,
    and ``grad_norm`` within ``rtol``: ``got``/``want`` as returned by :func:`gradients`."""
    (got_grads, got_metrics), (want_grads, want_metrics) = got, want
    assert len(got_grads) == len(want_grads)
    for i, (g, w) in enumerate(zip(got_grads, want_grads)):
        np.testing.assert_allclose(g, w, rtol=0, atol=rtol * np.abs(w).max(),
                                   err_msg=f"gradient of parameter {i} {w.shape}")
    np.testing.assert_allclose(got_metrics["grad_norm"], want_metrics["grad_norm"], rtol=rtol)


SGD_LR = 1000.0  # (before - after) / lr: at lr=1 float32 rounding of the update hides 1e-4


def sgd_update(config, mesh: jaxsmp.Mesh, tokens: np.ndarray,
               loss=jaxsmp.losses.causal_lm_loss, **step_options):
    """(every trainable parameter's ``(before - after) / SGD_LR`` after one full step,
    update applied, run as users run it: ``state, metrics = step(state, batch)``;
    metrics). With plain SGD and no clipping (the default clip_norm=1 would scale every
    error away with the gradient's norm) this is the step's gradient, as applied."""
    from jaxsmp.train.fp8_state import trainable
    state = jaxsmp.init(config.build, optax.sgd(SGD_LR), mesh, seed=0)
    before = [np.asarray(x) for x in jax.tree.leaves(trainable(state.params))]
    step = jaxsmp.step(loss, **{"clip_norm": None, **step_options})
    state, metrics = step(state, {"tokens": tokens})  # donated
    after = [np.asarray(x) for x in jax.tree.leaves(trainable(state.params))]
    assert int(state.step) == 1
    return ([(b - a) / SGD_LR for b, a in zip(before, after)],
            jax.tree.map(float, metrics))


def leaves(state) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(state.params)]


def assert_causal(logits_fn, vocab: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Changing token 10 leaves logits before it unchanged and changes those after;
    returns (tokens, logits) for further checks."""
    tokens = np.random.default_rng(0).integers(0, vocab, (2, 16)).astype(np.int32)
    changed = tokens.copy()
    changed[:, 10] = (changed[:, 10] + 1) % vocab
    a, b = np.asarray(logits_fn(tokens)), np.asarray(logits_fn(changed))
    assert a.shape == (2, 16, vocab) and a.dtype == np.float32
    np.testing.assert_array_equal(a[:, :10], b[:, :10])
    assert np.abs(a[:, 10:] - b[:, 10:]).max() > 1e-3
    return tokens, a


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory):
    """The bundled Python docs as a directory of text files, one topic each."""
    from pydoc_data.topics import topics
    directory = tmp_path_factory.mktemp("corpus")
    for i, name in enumerate(sorted(topics)):
        (directory / f"{i:03d}_{name}.txt").write_text(topics[name], encoding="utf-8")
    return directory


@pytest.fixture(scope="session")
def bpe_tokenizer_file(tmp_path_factory):
    """tokenizer.json of a 512-token byte-level BPE trained on the bundled docs."""
    from jaxsmp.data import default_corpus, train_bpe
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    train_bpe([default_corpus()], 512).save(path)
    return path


@pytest.fixture(scope="session")
def prepared_dir(tmp_path_factory, corpus_dir, bpe_tokenizer_file):
    """The docs tokenized with the BPE tokenizer into shards of 50,000 tokens."""
    from jaxsmp.data import load_tokenizer
    from jaxsmp.data.prepare import input_files, prepare
    out = tmp_path_factory.mktemp("prepared")
    prepare(load_tokenizer(bpe_tokenizer_file), input_files([str(corpus_dir)]), out,
            val_fraction=0.05, shard_tokens=50_000)
    return out
