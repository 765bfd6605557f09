"""Every test runs on 8 simulated CPU devices; set before JAX starts its backend.

YNNPACK fusions are turned off so that XLA:CPU's memory_analysis() counts every
buffer (they hide large ones otherwise). ``collectives="auto"`` reads no calibration a
developer cached on this machine (tests that want one pass it), so tests see the same
choices everywhere.
"""
import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_force_host_platform_device_count=8 --xla_cpu_experimental_ynn_fusion_type="
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["JAXSMP_COLLECTIVES_PROFILE_DIR"] = os.path.join(
    os.path.dirname(__file__), ".no-collectives-calibration")  # never created
