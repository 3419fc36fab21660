"""`config.model.dtype='auto'`: bfloat16 where the hardware computes it natively.

bfloat16 compute (with float32 accumulation, `bert_jax.modeling.precision`)
is faster only where the hardware has bfloat16 arithmetic:
  TPU                     always;
  NVIDIA GPU              compute capability >= 8.0 (A100, H100, ...: bfloat16
                          tensor cores);
  CPU                     `avx512_bf16` or `amx_bf16` among its flags
                          (/proc/cpuinfo). On an AVX2-only CPU (e.g. AMD Zen 3)
                          XLA converts bfloat16 to float32 around each matmul, and
                          a 2048x2048 matmul ran at 60 GFLOP/s against float32's
                          77: slower, not faster.
Everywhere else 'auto' means float32. The choice and its reason are logged.

'auto' is resolved once, when a run is set up, and the workdir's config.json
records the concrete dtype, so a resumed run, evaluation and translation keep
it on any machine. `build_task` resolves it (keeping the dtype of a run already
in its workdir, else for the local devices), `planning.aot` (`launch/compile.py`)
for its target topology.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import ml_collections
from absl import logging

AUTO = "auto"
CPU_BFLOAT16_FLAGS = ("avx512_bf16", "amx_bf16")
MIN_GPU_COMPUTE_CAPABILITY = (8, 0)


@dataclasses.dataclass(frozen=True)
class Hardware:
    """What decides the dtype: the platform and, per platform, one fact."""

    platform: str                              # 'tpu' | 'gpu' | 'cpu'
    name: str                                  # device kind or CPU model
    compute_capability: tuple[int, int] | None = None   # GPUs
    cpu_flags: frozenset[str] = frozenset()            # CPUs


def choose_dtype(hardware: Hardware) -> tuple[str, str]:
    """('bfloat16' | 'float32', the reason in words)."""
    if hardware.platform == "tpu":
        return "bfloat16", f"{hardware.name}: TPUs compute bfloat16 natively"
    if hardware.platform == "gpu":
        capability = hardware.compute_capability
        if capability is None:
            return "float32", f"{hardware.name}: compute capability unknown"
        text = f"{hardware.name}, compute capability {capability[0]}.{capability[1]}"
        if tuple(capability) >= MIN_GPU_COMPUTE_CAPABILITY:
            return "bfloat16", f"{text} >= 8.0: bfloat16 tensor cores"
        return "float32", f"{text} < 8.0: no bfloat16 tensor cores"
    native = [flag for flag in CPU_BFLOAT16_FLAGS if flag in hardware.cpu_flags]
    if native:
        return "bfloat16", f"{hardware.name} has {' and '.join(native)}"
    return "float32", (f"{hardware.name} has neither {' nor '.join(CPU_BFLOAT16_FLAGS)}: "
                       "bfloat16 matmuls would run slower than float32 there")


def local_hardware(devices: Sequence[jax.Device] | None = None) -> Hardware:
    device = (devices or jax.local_devices())[0]
    if device.platform == "tpu":
        return Hardware("tpu", device.device_kind)
    if device.platform in ("gpu", "cuda", "rocm"):
        capability = getattr(device, "compute_capability", None)
        parsed = tuple(int(part) for part in str(capability).split(".")[:2]) if (
            capability and device.platform != "rocm") else None
        return Hardware("gpu", device.device_kind, parsed)
    name, flags = cpu_model_and_flags()
    return Hardware("cpu", name, cpu_flags=flags)


@functools.cache
def cpu_model_and_flags(cpuinfo: str = "/proc/cpuinfo") -> tuple[str, frozenset[str]]:
    """This CPU's model name and feature flags (Linux; elsewhere 'CPU', none)."""
    name, flags = "CPU", frozenset()
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and name == "CPU":
                    name = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = frozenset(value.split())
    except OSError:
        pass
    return name, flags


def resolve_model_dtype(config: ml_collections.ConfigDict,
                        hardware: Hardware | None = None,
                        saved_dtype: str | None = None) -> ml_collections.ConfigDict:
    """`config` itself if `config.model.dtype` is not 'auto'; else a copy with
    the dtype for `hardware` (default: the local devices), or `saved_dtype` (the
    dtype a run in the workdir already uses) when given. Logs the choice."""
    if config.model.get("dtype") != AUTO:
        return config
    if saved_dtype and saved_dtype != AUTO:
        dtype, reason = saved_dtype, "the dtype of the run already in the workdir"
    else:
        dtype, reason = choose_dtype(hardware or local_hardware())
    logging.info("model.dtype='auto' -> %s (%s)", dtype, reason)
    resolved = config.copy_and_resolve_references()
    resolved.model.dtype = dtype
    return resolved
