"""Test set-up: 8 fake CPU devices (set before JAX is imported), compilers for
accelerators that are not here, and shared paths."""

import os

from bert_jax.planning.topologies import COMPILE_ONLY_ENVIRONMENT  # imports no JAX

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
# JAX on the CPU; compilers for the GPUs and TPUs that are not here (test_compile.py).
for name, value in COMPILE_ONLY_ENVIRONMENT.items():
    os.environ.setdefault(name, value)

import pathlib  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402

SHARED_DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"
# A launch script imports its neighbours (`import cli`) from its own folder, first on
# sys.path when it runs as `python launch/X.py`; the tests import them the same way.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "launch"))


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """One tfds data_dir for the session: each dataset is built once."""
    return str(tmp_path_factory.mktemp("tfds"))


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
    """`../shared/data`, or a skip when this checkout has none beside it."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} is absent (the real datasets live beside the repo)")
    return SHARED_DATA
