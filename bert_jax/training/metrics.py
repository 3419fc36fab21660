"""Metric writers (JSON lines + TensorBoard) and the training progress line.

Process 0 writes `WORKDIR/metrics.jsonl` (`{"step": N, "train/loss": ...}` a
line) and TensorBoard events to `WORKDIR/tensorboard/` (tensorboardX).

MFU = model FLOPs per second / (devices x peak FLOP/s per device). Model FLOPs
count the model's matmuls only (3x the forward pass for a training step),
without recomputation (`bert_jax.modeling.flops`). Peak: the config's, else the
chip table of `chips` (dense bfloat16), else (CPU) a timed matmul in the
dtype the model computes in, as the model computes it (`precision.contract`:
bfloat16 operands, float32 accumulation). A CPU with `amx_bf16` multiplies
bfloat16 several times faster than float32, so a float32 peak put a bfloat16
model above 100% there; on a CPU without native bfloat16 the bfloat16 peak is
the lower one. The CPU's memory bandwidth is a timed streaming op (read +
write) at sizes from a core's cache to main memory, for the step-time bound of
`bert_jax.planning.step_bound`.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import time
from typing import Any

import jax
import jax.numpy as jnp
from absl import logging

from bert_jax.file_io import write_atomically
from bert_jax.modeling.precision import contract
from bert_jax.training.chips import peak_flops
from bert_jax.training.workdir import METRICS_FILE, parse_metrics, report_metrics_damage


def time_matmul_flops(dtype: str = "float32", size: int = 2048, repeats: int = 10) -> float:
    """FLOP/s of a `size x size` matmul of `dtype` operands with float32
    accumulation (the model's `precision.contract`): the fastest of `repeats`
    (a peak, and steadier than the median on a shared CPU)."""
    x = jnp.ones((size, size), dtype)
    return 2 * size ** 3 / _fastest(jax.jit(lambda a: contract(a, a, 1)), x, repeats)


# Measured once per process and arguments.
measured_matmul_flops = functools.cache(time_matmul_flops)


@functools.cache
def measured_copy_bandwidth(megabytes: float = 256, repeats: int = 10) -> float:
    """Bytes/s of `x + 1` over a float32 array of `megabytes`, repeated in one
    program to move 512 MB a call: the bytes read plus the bytes written, over
    the fastest of `repeats` calls. Measured once per process and arguments."""
    x = jnp.zeros((int(megabytes * (1 << 18)),), jnp.float32)
    passes = max(1, round(256 / megabytes))
    add = jax.jit(lambda a: jax.lax.fori_loop(0, passes, lambda _, b: b + 1, a))
    return 2 * x.nbytes * passes / _fastest(add, x, repeats)


CACHE_AND_MEMORY_MB = (0.25, 4, 256)   # in a core's L2, in L3, far beyond the caches


def memory_bandwidth_per_size() -> dict[float, float]:
    """The copy bandwidth of this CPU at arrays of `CACHE_AND_MEMORY_MB`: a
    step's traffic between XLA's fusions may stay in the caches, so a lower
    bound on its time divides by the fastest of these."""
    return {megabytes: measured_copy_bandwidth(megabytes) for megabytes in CACHE_AND_MEMORY_MB}


def _fastest(fn, x: jax.Array, repeats: int) -> float:
    fn(x).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(x).block_until_ready()
        times.append(time.perf_counter() - start)
    return min(times)


def peak_flops_per_device(configured: float = 0.0, dtype: str = "float32") -> float:
    """`configured` if positive, else `chips.peak_flops` of the device
    (accelerators: dense bfloat16), else a measured matmul in `dtype`, the
    dtype the model computes in (`config.model.dtype` once resolved)."""
    if configured > 0:
        return configured
    return peak_flops(jax.devices()[0].device_kind) or measured_matmul_flops(str(dtype))


class MetricWriter:

    def __init__(self, workdir: str, *, resume_step: int = 0):
        self.enabled = jax.process_index() == 0
        self.path = os.path.join(workdir, METRICS_FILE)
        self._tensorboard = None
        if not self.enabled:
            return
        self._drop_lines_after(resume_step)
        from tensorboardX import SummaryWriter
        # On resume, TensorBoard hides the events of earlier files from step
        # resume_step + 1 on: the resumed run logs those steps again.
        self._tensorboard = SummaryWriter(os.path.join(workdir, "tensorboard"),
                                          purge_step=resume_step + 1 if resume_step else None)

    def _drop_lines_after(self, step: int) -> None:
        """On resume: the steps after `step` are logged again; a torn last line goes
        too. A file with damage (`parse_metrics`) is copied aside first, named in the
        warning: the rewrite keeps only the records."""
        if not os.path.exists(self.path):
            return
        records, problems = parse_metrics(self.path)
        kept = None
        if problems:
            kept = f"{self.path}.damaged-{time.strftime('%Y%m%d-%H%M%S')}"
            shutil.copyfile(self.path, kept)
        report_metrics_damage(self.path, problems, kept)
        write_atomically(self.path, "".join(json.dumps(m) + "\n" for m in records
                                            if m["step"] <= step))

    def write(self, step: int, scalars: dict[str, Any]) -> None:
        if not self.enabled:
            return
        values = {k: float(v) for k, v in scalars.items()}
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": int(step), **values}) + "\n")
        for key, value in values.items():
            self._tensorboard.add_scalar(key, value, step)
        self._tensorboard.flush()

    def close(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.close()


class Progress:

    def __init__(self, *, total_steps: int, first_step: int, flops_per_step: float,
                 tokens_per_step: float, peak_flops: float):
        self.total_steps = total_steps
        self.flops_per_step = flops_per_step
        self.tokens_per_step = tokens_per_step
        self.peak_flops = peak_flops * jax.device_count()
        self._step = first_step
        self._time = time.perf_counter()

    def restart(self, step: int) -> None:
        self._step, self._time = step, time.perf_counter()

    def measure(self, step: int) -> dict[str, float]:
        now = time.perf_counter()
        steps = max(step - self._step, 1)
        seconds = max(now - self._time, 1e-9)
        self._step, self._time = step, now
        steps_per_second = steps / seconds
        rates = {
            "perf/steps_per_second": steps_per_second,
            "perf/tokens_per_second": steps_per_second * self.tokens_per_step,
            "perf/mfu": steps_per_second * self.flops_per_step / self.peak_flops,
            "perf/eta_seconds": (self.total_steps - step) / steps_per_second,
        }
        stats = jax.local_devices()[0].memory_stats() or {}
        if "peak_bytes_in_use" in stats:
            rates["perf/peak_memory_gb"] = stats["peak_bytes_in_use"] / 1e9
        return rates

    @staticmethod
    def line(step: int, total: int, scalars: dict[str, float]) -> str:
        parts = [f"step {step}/{total}"]
        if "train/loss" in scalars:
            parts.append(f"loss {scalars['train/loss']:.4f}")
        parts.append(f"{scalars['perf/steps_per_second']:.2f} steps/s")
        parts.append(f"{scalars['perf/tokens_per_second']:,.0f} tokens/s")
        parts.append(f"MFU {100 * scalars['perf/mfu']:.2f}%")
        parts.append(f"ETA {scalars['perf/eta_seconds']:.0f}s")
        if "perf/peak_memory_gb" in scalars:
            parts.append(f"mem {scalars['perf/peak_memory_gb']:.2f} GB")
        return " | ".join(parts)


def log_progress(step: int, total: int, scalars: dict[str, float]) -> None:
    if jax.process_index() == 0:
        logging.info("%s", Progress.line(step, total, scalars))
