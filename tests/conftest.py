"""Test-wide setup, before jax starts: four virtual CPU devices (for sharding tests), and XLA's CPU
backend unless JAXRW_TEST_GPU=1.

The suite checks jaxrw on the CPU backend: float32 matmuls exact, the CPU cost profile, nothing
timed when a signature is built. On a CUDA host float32 matmuls run as TF32 and schedule="auto"
times what it builds, so the CPU tests' tolerances and expected choices do not hold there (an
H100 run failed 38 of them). `JAXRW_TEST_GPU=1 pytest tests` runs only
the tests marked `gpu` instead, on the device, with float32 matmuls at full precision.
"""

import os

_flag = "--xla_force_host_platform_device_count=4"
if _flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

GPU_RUN = os.environ.get("JAXRW_TEST_GPU", "") == "1"
if not GPU_RUN:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def pytest_configure(config):
    if GPU_RUN:
        import jax

        jax.config.update("jax_default_matmul_precision", "highest")


def pytest_collection_modifyitems(config, items):
    """Under JAXRW_TEST_GPU=1, only the tests marked gpu."""
    if not GPU_RUN:
        return
    others = [item for item in items if item.get_closest_marker("gpu") is None]
    if others:
        config.hook.pytest_deselected(items=others)
        items[:] = [item for item in items if item.get_closest_marker("gpu") is not None]
