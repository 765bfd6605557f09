"""Every test runs on 8 simulated CPU devices; set before JAX starts its backend.

YNNPACK fusions are turned off so that XLA:CPU's memory_analysis() counts every
buffer (they hide large ones otherwise).
"""
import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_force_host_platform_device_count=8 --xla_cpu_experimental_ynn_fusion_type="
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
