"""jaxsmp.xla_flags: the GPU overlap flags start XLA on the installed jaxlib; user flags win."""
import os
import subprocess
import sys

import pytest

from jaxsmp import xla_flags

START = "import jax; jax.numpy.zeros(1).block_until_ready(); print('started')"


def _start(flags: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, XLA_FLAGS=" ".join(flags), JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-c", START], env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_flags_for_the_installed_jaxlib_start_xla():
    # XLA registers its GPU flags on every platform, so a CPU start checks every name
    flags = xla_flags.overlap_flags(layer_bytes=3 * 2**20)
    assert flags and all(f.startswith("--xla_gpu_") for f in flags)
    run = _start(flags)
    assert run.returncode == 0 and "started" in run.stdout, run.stderr[-2000:]


def test_an_unknown_flag_name_aborts_the_start_so_the_check_above_can_fail():
    run = _start(xla_flags.overlap_flags() + ["--xla_gpu_enable_pipelined_everything=true"])
    assert run.returncode != 0
    assert "xla_gpu_enable_pipelined_everything" in run.stderr


def test_an_untested_jaxlib_gets_no_flags_and_a_warning():
    with pytest.warns(UserWarning, match=r"no XLA overlap flags for jaxlib \(0, 99\)"):
        assert xla_flags.overlap_flags(version=(0, 99)) == []


def test_apply_keeps_the_users_flags_and_resizes_its_own(monkeypatch):
    monkeypatch.setattr(xla_flags, "_backend_started", lambda: False)
    env = {"XLA_FLAGS": "--xla_gpu_enable_latency_hiding_scheduler=false"}
    xla_flags.apply(1024, env, gpu=True)
    assert "--xla_gpu_enable_latency_hiding_scheduler=false" in env["XLA_FLAGS"].split()
    assert "--xla_gpu_enable_latency_hiding_scheduler=true" not in env["XLA_FLAGS"]
    assert "--xla_gpu_all_gather_combine_threshold_bytes=1024" in env["XLA_FLAGS"].split()
    xla_flags.apply(4096, env, gpu=True)  # the CLI, sized to the model's layer
    flags = env["XLA_FLAGS"].split()
    assert "--xla_gpu_all_gather_combine_threshold_bytes=4096" in flags
    assert not any(f.endswith("=1024") for f in flags)
    assert len(flags) == len(set(flags))


def test_nothing_is_set_when_opted_out_off_gpu_or_after_the_backend_started(monkeypatch):
    monkeypatch.setattr(xla_flags, "_backend_started", lambda: False)
    env = {xla_flags.OPT_OUT: "0"}
    assert xla_flags.apply(env=env, gpu=True) == [] and "XLA_FLAGS" not in env
    assert xla_flags.apply(env={}, gpu=False) == []
    monkeypatch.setattr(xla_flags, "_backend_started", lambda: True)
    assert xla_flags.apply(env={}, gpu=True) == []
    with pytest.raises(ValueError, match=r"JAXSMP_XLA_FLAGS='yes': use 0 .* or 1"):
        xla_flags.wanted({xla_flags.OPT_OUT: "yes"}, gpu=True)


def test_prefetch_defaults_off_on_gpus_only_where_xla_pipelines_the_layer_collectives(
        monkeypatch):
    # jaxsmp's own prefetch on top of XLA's pipelined gathers held a second prefetched
    # layer: 3915 against 2435 MiB of temporaries (docs/benchmarks.md, 8 x H100)
    from jaxsmp.train.options import StepOptions
    monkeypatch.setenv("XLA_FLAGS", " ".join(xla_flags.overlap_flags()))
    assert xla_flags.pipelines_collectives()
    assert not StepOptions().prefetches("gpu") and StepOptions(prefetch=True).prefetches("gpu")
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_pipelined_all_gather=true "
                                    "--xla_gpu_enable_pipelined_reduce_scatter=false")
    assert StepOptions().prefetches("gpu") and not StepOptions().prefetches("cpu")
    monkeypatch.delenv("XLA_FLAGS")
    assert StepOptions().prefetches("cuda")


DOUBLE_BUFFERING_PROBE = """
import re
import jax, numpy as np, optax
import jaxsmp
from jaxsmp.checkpoint import abstract_state
from jaxsmp.losses import causal_lm_loss
from jaxsmp.plan import gpu_target
config = jaxsmp.models.preset("llama", "tiny", num_hidden_layers=4, attention_impl="cudnn")
for n in (1, 8):
    mesh = jaxsmp.Mesh(devices=gpu_target.topology("H100-SXM", gpus_per_host=n))
    state = abstract_state(config.build, optax.adamw(1e-4), mesh)
    batch = {"tokens": jax.ShapeDtypeStruct((8, 128), np.int32)}
    step = jaxsmp.step(causal_lm_loss, precision="bf16")
    text = gpu_target.compile_step(step, state, batch, mesh).as_text()
    print(n, sorted(set(re.findall(r'known_trip_count":\\{"n":"(\\d+)"', text))))
"""


def test_one_device_steps_compile_without_loop_double_buffering():
    """On one GPU (H200, GPU check) the loop double buffering jaxsmp's flags switch on
    made a Llama step 11% slower; the step's compile turns it off there: XLA:GPU
    compiles the 4-layer loops of a one-device step 4 times round, not twice round a
    doubled body, while on 8 devices the ZeRO-3 loop keeps it (with its pipelined
    collectives' peeled iterations, once round)."""
    from conftest import require_gpu_compiler
    require_gpu_compiler()
    flags = " ".join(xla_flags.overlap_flags())
    env = dict(os.environ, XLA_FLAGS=flags, _JAXSMP_XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    run = subprocess.run([sys.executable, "-c", DOUBLE_BUFFERING_PROBE], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split("\n")[:2] == ["1 ['4']", "8 ['1']"], run.stdout


def test_only_jaxsmp_s_own_double_buffering_is_turned_off():
    flag = f"{xla_flags.DOUBLE_BUFFERING}=true"
    ours = {"_JAXSMP_XLA_FLAGS": flag, "XLA_FLAGS": flag}
    off = {"xla_gpu_enable_while_loop_double_buffering": False}
    assert xla_flags.step_compiler_options(1, ours) == off
    assert xla_flags.step_compiler_options(8, ours) == {}
    assert xla_flags.step_compiler_options(1, {"XLA_FLAGS": flag}) == {}   # the user's


def test_overlap_flags_set_names_a_program_compiled_as_a_gpu_runs_it():
    every = xla_flags.merged("--xla_dump_to=/tmp/x", xla_flags.overlap_flags())
    assert xla_flags.overlap_flags_set({"XLA_FLAGS": every})
    assert not xla_flags.overlap_flags_set({"XLA_FLAGS": "--xla_dump_to=/tmp/x"})
    one_missing = " ".join(f for f in every.split() if "double_buffering" not in f)
    assert not xla_flags.overlap_flags_set({"XLA_FLAGS": one_missing})


def test_combine_threshold_reads_back_what_apply_set(monkeypatch):
    monkeypatch.setattr(xla_flags, "_backend_started", lambda: False)
    env = {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}
    assert xla_flags.combine_threshold(env) is None   # XLA's default
    xla_flags.apply(396_544, env, gpu=True)
    assert xla_flags.combine_threshold(env) == 396_544


def test_apply_gives_xla_the_memory_fraction_the_planner_plans_against(monkeypatch):
    monkeypatch.setattr(xla_flags, "_backend_started", lambda: False)
    env: dict = {}
    xla_flags.apply(env=env, gpu=True)
    assert env[xla_flags.MEM_FRACTION_VAR] == "0.95" and xla_flags.mem_fraction(env) == 0.95
    users = {xla_flags.MEM_FRACTION_VAR: "0.8"}
    xla_flags.apply(env=users, gpu=True)
    assert users[xla_flags.MEM_FRACTION_VAR] == "0.8" and xla_flags.mem_fraction(users) == 0.8
    opted_out = {xla_flags.OPT_OUT: "0"}
    xla_flags.apply(env=opted_out, gpu=True)
    assert xla_flags.MEM_FRACTION_VAR not in opted_out
    assert xla_flags.mem_fraction(opted_out) == 0.75   # JAX's default, which that run gets


@pytest.mark.parametrize("value", ["0", "1.5", "most"])
def test_a_memory_fraction_outside_0_to_1_is_refused(value):
    with pytest.raises(ValueError, match=rf"XLA_PYTHON_CLIENT_MEM_FRACTION='{value}': use a "
                                         r"fraction in \(0, 1\]"):
        xla_flags.mem_fraction({xla_flags.MEM_FRACTION_VAR: value})
