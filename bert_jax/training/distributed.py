"""Multi-host start-up through `jax.distributed`.

`initialize` connects the processes when flags name a coordinator, or when the
environment is a multi-process job that JAX detects itself: SLURM with more
than one task, GKE TPU slices (`TPU_WORKER_HOSTNAMES`), or any job started with
`BERT_JAX_DISTRIBUTED=1` (set by `launch/tpu_vm.py train`: on gcloud-created
TPU VMs nothing else says so, and Orbax's cross-host barriers need it). A
single process on one machine needs nothing.
"""

from __future__ import annotations

import glob
import os

import jax
from absl import logging


def present_platforms() -> str:
    """The JAX platforms this machine has hardware for: 'cuda' with an NVIDIA
    driver, 'tpu' with TPU device files (/dev/accel*, /dev/vfio/N), and 'cpu'."""
    present = []
    if os.path.exists("/proc/driver/nvidia/version"):
        present.append("cuda")
    if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
        present.append("tpu")
    return ",".join(present + ["cpu"])


def select_platforms() -> None:
    """Starts JAX on the platforms this machine has, unless JAX_PLATFORMS says
    otherwise: a CUDA plugin or libtpu installed without that hardware (for
    `launch/compile.py`) would print its failed start-up at every run. Call it
    before anything touches a JAX backend."""
    if os.environ.get("JAX_PLATFORMS") is None:
        jax.config.update("jax_platforms", present_platforms())


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> None:
    """Connects this process to the others, if there are others (the three flags
    together: `launch/common_flags.py` checks them as it parses them)."""
    if coordinator_address:
        jax.distributed.initialize(coordinator_address=coordinator_address,
                                   num_processes=num_processes, process_id=process_id)
    elif (os.environ.get("BERT_JAX_DISTRIBUTED") == "1"
          or int(os.environ.get("SLURM_NTASKS", "1")) > 1
          or os.environ.get("TPU_WORKER_HOSTNAMES", "").count(",") > 0):
        jax.distributed.initialize()  # JAX reads the cluster from the environment
    else:
        return
    logging.info("process %d of %d, %d local / %d global devices", jax.process_index(),
                 jax.process_count(), jax.local_device_count(), jax.device_count())
