r"""Trains an experiment: the one train loop over a config file.

  python launch/train.py --config=experiments/NAME.py[:ARG] --workdir=DIR \
      [--config.train.num_steps=1000 ...]

Resumes from DIR's checkpoints if it holds a run of the same config.
Multi-process: add --coordinator_address=HOST:PORT --num_processes=N
--process_id=I (TPU VMs and SLURM need none of these).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


import common_flags as launch_flags  # noqa: E402
from bert_jax.training import trainer  # noqa: E402


def main(argv):
    launch_flags.start(argv)
    trainer.train_and_evaluate(launch_flags.CONFIG.value, launch_flags.WORKDIR.value)


if __name__ == "__main__":
    launch_flags.run(main)
