"""Simulated CPU devices get an XLA:CPU thread pool their collectives cannot starve."""
import os
import subprocess
import sys

from jaxsmp import launch
from jaxsmp.simulated_devices import POOL_SIZE_VAR, THREADS_PER_DEVICE, set_pool_size


def test_pool_size_is_set_per_device_unless_the_user_chose_one():
    env = {}
    set_pool_size(8, env)
    assert env == {POOL_SIZE_VAR: str(8 * THREADS_PER_DEVICE)}
    env = {POOL_SIZE_VAR: "3"}
    set_pool_size(8, env)
    assert env == {POOL_SIZE_VAR: "3"}


def test_local_launcher_sizes_each_process_pool(monkeypatch):
    monkeypatch.delenv(POOL_SIZE_VAR, raising=False)
    env = launch._env(process_id=1, hosts=2, devices=4, port=1234)
    assert env[POOL_SIZE_VAR] == str(4 * THREADS_PER_DEVICE)


_COUNT_THREADS = """
import os
from jaxsmp.simulated_devices import simulate_cpu_devices
simulate_cpu_devices(8)
import jax, jax.numpy as jnp
jax.jit(lambda a: a + 1)(jnp.ones(4)).block_until_ready()
names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
print(len(jax.devices()), sum(n.endswith("XLAEigen") for n in names))
"""


def test_the_cpu_backend_starts_with_the_sized_pool():
    """The pool XLA:CPU starts (its threads, named tf_XLAEigen) has 8 per device: one per
    device (XLA's default on a small host) let a pipeline step hang."""
    env = {k: v for k, v in os.environ.items() if k not in (POOL_SIZE_VAR, "XLA_FLAGS")}
    run = subprocess.run([sys.executable, "-c", _COUNT_THREADS], env=env, timeout=120,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    devices, threads = map(int, run.stdout.split()[-2:])
    assert devices == 8 and threads == 8 * THREADS_PER_DEVICE
