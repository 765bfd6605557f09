"""Multi-process start-up from the environment of common launchers.

Recognised, in order: jaxsmp's own launcher (``JAXSMP_COORDINATOR``,
``JAXSMP_NUM_PROCESSES``, ``JAXSMP_PROCESS_ID``), torchrun-style (``MASTER_ADDR``,
``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``), SageMaker (``SM_HOSTS``,
``SM_CURRENT_HOST``) and SLURM (``SLURM_NTASKS`` > 1, detected by JAX itself).
A process that stops sending heartbeats fails the others after
``heartbeat_timeout`` seconds instead of hanging them.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Mapping

import jax

DEFAULT_PORT = 12355


@dataclass(frozen=True)
class ClusterSpec:
    """Where the coordinator is, how many processes there are, which one this is.
    ``coordinator=None`` lets JAX detect the cluster (SLURM)."""
    source: str
    coordinator: str | None
    num_processes: int | None
    process_id: int | None


def _int(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except ValueError:
        raise ValueError(f"environment variable {key}={env[key]!r} is not an integer") from None


def _sagemaker(env: Mapping[str, str]) -> ClusterSpec:
    hosts = json.loads(env["SM_HOSTS"])
    current = env["SM_CURRENT_HOST"]
    if current not in hosts:
        raise ValueError(f"SM_CURRENT_HOST={current!r} is not in SM_HOSTS={hosts}")
    port = env.get("MASTER_PORT", str(DEFAULT_PORT))
    return ClusterSpec("sagemaker", f"{sorted(hosts)[0]}:{port}", len(hosts),
                       sorted(hosts).index(current))


def cluster_from_env(env: Mapping[str, str] | None = None) -> ClusterSpec | None:
    """The cluster this process belongs to, or ``None`` for a single process."""
    env = os.environ if env is None else env
    if "JAXSMP_COORDINATOR" in env:
        return ClusterSpec("jaxsmp.launch", env["JAXSMP_COORDINATOR"],
                           _int(env, "JAXSMP_NUM_PROCESSES"), _int(env, "JAXSMP_PROCESS_ID"))
    if "WORLD_SIZE" in env and "RANK" in env:
        if _int(env, "WORLD_SIZE") == 1:
            return None
        address = f"{env.get('MASTER_ADDR', '127.0.0.1')}:{env.get('MASTER_PORT', DEFAULT_PORT)}"
        return ClusterSpec("torchrun", address, _int(env, "WORLD_SIZE"), _int(env, "RANK"))
    if "SM_HOSTS" in env and "SM_CURRENT_HOST" in env:
        spec = _sagemaker(env)
        return spec if spec.num_processes > 1 else None
    if "SLURM_NTASKS" in env and _int(env, "SLURM_NTASKS") > 1:
        return ClusterSpec("slurm", None, None, None)
    return None


def initialize(env: Mapping[str, str] | None = None, *, heartbeat_timeout: int = 30,
               initialization_timeout: int = 120) -> ClusterSpec | None:
    """Starts JAX's distributed runtime if the environment describes several processes.

    On CPU the gloo collectives carry cross-process traffic. Returns the spec used.
    """
    spec = cluster_from_env(env)
    if spec is None:
        return None
    if os.environ.get("JAX_PLATFORMS", "") == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        spec.coordinator, spec.num_processes, spec.process_id,
        initialization_timeout=initialization_timeout,
        heartbeat_timeout_seconds=heartbeat_timeout)
    return spec
