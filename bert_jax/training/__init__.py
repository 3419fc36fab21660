"""The training machinery: everything between a task (`bert_jax.tasks`) and the
files of a run.

`trainer.train_and_evaluate(config, workdir)` is the one train loop: it builds
the task, shards its parameters (a pytree) over a device mesh, runs the jitted
train step on the task's batches (dicts of `[batch, ...]` arrays), evaluates,
and writes checkpoints and metrics to the workdir.

  trainer          the train loop (`launch/train.py`)
  train_step       the sharded train state and the one jit-compiled train step
  sharding         the device mesh and the logical-axis sharding rules
  device_prefetch  the training batches copied to the devices ahead of their step
  optimizer        AdamW or LAMB, learning-rate schedules, clipping
  evaluation       the evaluators over one pass of the evaluation split, during
                   training or from a workdir's checkpoint (`launch/evaluate.py`)
  checkpoints      Orbax checkpoints: async saves, exact resume, params-only restore
  averaging        the average of a run's last checkpoints
  workdir          the workdir's files, readable without JAX, and its lock
  validation       the checks of a config before anything is built
  preemption       SIGTERM and Ctrl-C turned into one checkpoint step
  distributed      multi-host start-up (`jax.distributed`)
  metrics          the metric writers (JSON lines, TensorBoard), MFU
  profiling        a `jax.profiler` trace of chosen steps
  chips            the chip table: peak FLOP/s for MFU (and, for
                   `bert_jax.planning`, memory and bandwidths)

Planning for accelerators that are not here (ahead-of-time compilation, step
bounds) is `bert_jax.planning`, above this package: nothing here imports it.
"""
