"""Section 6, run first: the machine and the software, and the peak MFU divides by."""
from __future__ import annotations

import importlib.metadata
import os
import platform as _platform
import shutil
import subprocess

TITLE = "Environment"
COLUMNS = [("key", "what", ""), ("value", "value", "")]
NOTES = """MFU divides model FLOPs (6N + attention, `jaxsmp.metrics.train_flops_per_token`)
by `peak_flops` (`jaxsmp.metrics.peak`: the data sheet's dense bf16 peak for known GPUs,
989 TFLOP/s on H100 and H200; on CPU a measured float32 matmul)."""

PACKAGES = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt", "jax-cuda12-plugin",
            "jax-cuda12-pjrt", "flax", "optax", "orbax-checkpoint", "torch", "triton",
            "nvidia-cudnn-cu13", "nvidia-cudnn-cu12")
SMI_FIELDS = ("name", "driver_version", "memory.total", "clocks.sm", "clocks.max.sm",
              "clocks.mem", "clocks.max.mem", "power.limit", "temperature.gpu",
              "clocks_throttle_reasons.active")


def rows(ctx: dict, results: dict) -> list[dict]:
    return [{"label": "environment"}]


def nvidia_smi() -> dict:
    """The first GPU's fields from ``nvidia-smi`` ({} where there is none); a field the
    driver does not know is reported as nvidia-smi reports it."""
    if not shutil.which("nvidia-smi"):
        return {"nvidia-smi": "not found"}
    out = {}
    for field in SMI_FIELDS:
        done = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20)
        value = (done.stdout or done.stderr).strip().splitlines()
        out[f"nvidia-smi {field}"] = value[0] if value else f"(exit {done.returncode})"
    return out


def versions() -> dict:
    out = {"python": _platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def run(row: dict, ctx: dict, deadline: float) -> dict:
    import jax

    from jaxsmp.metrics.peak import peak_flops_per_device
    device = jax.devices()[0]
    facts = {"platform": "gpu" if device.platform in ("gpu", "cuda") else device.platform,
             "device_kind": device.device_kind, "devices": jax.device_count(),
             "compute_capability": getattr(device, "compute_capability", None)}
    stats = device.memory_stats() or {}
    if "bytes_limit" in stats:
        facts["jax_bytes_limit_gib"] = round(stats["bytes_limit"] / 2**30, 2)
    peak, source = peak_flops_per_device(device)
    facts.update(peak_flops=peak, peak_flops_source=source)
    facts.update(versions())
    facts["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "")
    facts.update(nvidia_smi())
    return {"facts": facts}
