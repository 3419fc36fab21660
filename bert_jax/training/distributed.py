"""Multi-host start-up through `jax.distributed`.

`initialize` connects the processes when flags name a coordinator, or when the
environment is a multi-process job that JAX detects itself: SLURM with more
than one task, GKE TPU slices (`TPU_WORKER_HOSTNAMES`), or any job started with
`BERT_JAX_DISTRIBUTED=1` (set by `launch/tpu_vm.py train`: on gcloud-created
TPU VMs nothing else says so, and Orbax's cross-host barriers need it). A
single process on one machine needs nothing.
"""

from __future__ import annotations

import os

import jax
from absl import logging


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> None:
    """Connects this process to the others, if there are others."""
    if coordinator_address:
        if num_processes is None or process_id is None:
            raise ValueError("--coordinator_address needs --num_processes and --process_id.")
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
