"""A `jax.profiler` trace of training steps START..END (1-based, inclusive).

    profiler = StepProfiler((10, 12), os.path.join(workdir, "profile"))
    for step in ...:
        profiler.before(step)
        state, metrics = step_fn(...)
        profiler.after(step, metrics)
    profiler.close()

The trace lands in DIR/plugins/profile/<run>/: TensorBoard's profile plugin
(`tensorboard --logdir DIR`), xprof or Perfetto read it. Skip the first steps:
they include compilation.
"""

from __future__ import annotations

from typing import Any

import jax
from absl import logging



class StepProfiler:

    def __init__(self, steps: tuple[int, int] | None, directory: str):
        self.start, self.end = steps or (0, -1)
        self.directory = directory
        self.active = False

    def before(self, step: int) -> None:
        if step == self.start and jax.process_index() == 0:
            jax.profiler.start_trace(self.directory)
            self.active = True
            logging.info("profiling steps %d..%d into %s", self.start, self.end,
                         self.directory)

    def after(self, step: int, outputs: Any) -> None:
        if step == self.end and self.active:
            jax.block_until_ready(outputs)
            self.close()
            logging.info("profile of steps %d..%d written to %s (open it with "
                         "TensorBoard's profile plugin or Perfetto)", self.start,
                         self.end, self.directory)

    def close(self) -> None:
        if self.active:
            jax.profiler.stop_trace()
            self.active = False
