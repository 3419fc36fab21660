r"""Trains an experiment: the one train loop over a config file.

  python launch/train.py --config=experiments/NAME.py[:ARG] --workdir=DIR \
      [--config.train.num_steps=1000 ...]

Resumes from DIR's checkpoints if it holds a run of the same config: from the
latest, or from --restore_step=N (later checkpoints are moved, not deleted, to
DIR/checkpoints_set_aside/). Profile steps START..END into DIR/profile/ with
--config.train.profile_steps="(START, END)". Ctrl-C saves a checkpoint and stops, as
SIGTERM does; a second Ctrl-C stops at once. One run per workdir (WORKDIR/train.lock);
a lock of another host that is not renewed for --lock_timeout seconds is taken over.
Multi-process: add --coordinator_address=HOST:PORT --num_processes=N
--process_id=I (TPU VMs and SLURM need none of these).
"""

from absl import flags

import common_flags as launch_flags
from bert_jax.config_schema import check_config
from bert_jax.training import trainer
from bert_jax.training.workdir_lock import DEFAULT_LOCK_TIMEOUT

flags.mark_flags_as_required(["config", "workdir"])
_RESTORE_STEP = flags.DEFINE_integer(
    "restore_step", None, "Resume from this checkpoint step instead of the latest (e.g. "
    "when the latest is damaged); later checkpoints are moved aside, not deleted.")
_LOCK_TIMEOUT = flags.DEFINE_integer(
    "lock_timeout", DEFAULT_LOCK_TIMEOUT, "Seconds after which a lock on --workdir held "
    "by another host and no longer renewed (its run renews it every minute) is taken "
    "over: a run restarted on a new VM waits at most this long.", lower_bound=1)


def main(argv):
    launch_flags.start()
    check_config(config := launch_flags.CONFIG.value)  # the rules of the config alone
    trainer.train_and_evaluate(config, launch_flags.WORKDIR.value,
                               restore_step=_RESTORE_STEP.value,
                               lock_timeout=_LOCK_TIMEOUT.value)


if __name__ == "__main__":
    launch_flags.run(main)
