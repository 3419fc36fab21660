r"""Evaluates a checkpoint of a workdir in a fresh process.

  python launch/evaluate.py --workdir=DIR [--step=N] [--output=FILE.json] \
      [--config.data.eval_split=test --config.decode.beam_size=8 ...]

The experiment is the one the workdir was trained with (`DIR/config.json`).
Overrides may change only what evaluation may: the evaluation split, the data
folder of extra test sets, the number of examples scored, decoding, the batch
size, the mesh, the evaluators (`config.evals`); an override of the model, its
vocabulary or its task is refused, naming the key. Restores the parameters of
step N (default: the latest checkpoint; they must match the model exactly) and
writes `{"step": N, "eval/...": ...}` as one JSON object to FILE (and the log).
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from absl import flags, logging  # noqa: E402

import common_flags as launch_flags  # noqa: E402
from bert_jax.training import evaluation  # noqa: E402

_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
_OUTPUT = flags.DEFINE_string("output", None, "Write the metrics as JSON to this file.")


def main(argv):
    launch_flags.start(argv)
    config, workdir = launch_flags.workdir_experiment()
    result = evaluation.evaluate_checkpoint(config, workdir, _STEP.value)
    logging.info("%s", json.dumps(result))
    if _OUTPUT.value:
        with open(_OUTPUT.value, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    launch_flags.run(main, argv=launch_flags.workdir_argv(sys.argv))
