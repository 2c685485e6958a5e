"""Test setup: 8 host CPU devices so sharding is tested without accelerators.

XLA reads the flag once, when the CPU backend starts, so it must be set before JAX is imported.
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
