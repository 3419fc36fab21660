"""The CPU's peak and bandwidth for MFU and the step-time bound: measured in
the dtype the model computes in, so that a real step's MFU stays below 100%
(a float32 peak put a bfloat16 model at 'MFU 101.35%' on a Xeon with
`amx_bf16`)."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import pytest

from bert_jax.modeling.precision import contract
from bert_jax.training import metrics


def test_the_cpu_peak_is_measured_in_the_models_dtype(monkeypatch):
    asked = []
    monkeypatch.setattr(metrics, "measured_matmul_flops",
                        lambda dtype="float32": asked.append(dtype) or 1e9)
    assert metrics.peak_flops_per_device(0.0, "bfloat16") == 1e9
    assert metrics.peak_flops_per_device(0.0) == 1e9
    assert metrics.peak_flops_per_device(5e11, "bfloat16") == 5e11   # configured
    assert asked == ["bfloat16", "float32"]


@pytest.mark.slow
def test_a_bfloat16_models_mfu_on_the_cpu_stays_below_100_percent():
    """A step of dense bfloat16 layers (float32 accumulation, as the model
    computes: `precision.contract`), timed for real: its MFU against the
    bfloat16 peak is below 1. It would not be on a CPU whose bfloat16 matmuls
    outrun its float32 ones (`amx_bf16`) were the peak the float32 matmul's:
    matmuls are most of this step's time (MFU above a third)."""
    size, layers = 2048, 4
    peak = metrics.peak_flops_per_device(0.0, "bfloat16")
    assert peak == metrics.measured_matmul_flops("bfloat16")

    @jax.jit
    def step(x, w):
        for _ in range(layers):
            x = jax.nn.gelu(contract(x, w, 1))
        return x

    x = jnp.ones((size, size), jnp.bfloat16) * 0.01
    w = jnp.ones((size, size), jnp.bfloat16) * 0.01
    step(x, w).block_until_ready()
    flops = layers * 2.0 * size ** 3
    mfus = []
    for _ in range(3):   # each step beside a peak timed just before it: the same load
        peak = metrics.time_matmul_flops("bfloat16", size, repeats=3)
        start = time.perf_counter()
        step(x, w).block_until_ready()
        mfus.append(flops / (time.perf_counter() - start) / peak)
    mfu = sorted(mfus)[1]
    assert 1 / 3 < mfu < 1.0, mfu


def test_the_copy_bandwidth_is_measured():
    bandwidth = metrics.measured_copy_bandwidth(megabytes=16, repeats=2)
    assert 1e6 < bandwidth < 1e13   # bytes/s (a loaded 2-core machine measured 1e8)
    assert metrics.measured_copy_bandwidth(megabytes=16, repeats=2) == bandwidth  # once
