"""Test-wide setup: four virtual CPU devices (for sharding tests), set before jax starts."""

import os

_flag = "--xla_force_host_platform_device_count=4"
if _flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
