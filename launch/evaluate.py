r"""Evaluates a checkpoint of a workdir in a fresh process.

  python launch/evaluate.py --workdir=DIR [--step=N] [--output=FILE.json] \
      [--config.data.eval_split=test --config.decode.beam_size=8 ...]

The experiment is the one the workdir was trained with (`DIR/config.json`).
Overrides may change only what evaluation may: the evaluation split, the data
folder of extra test sets, the number of examples scored, decoding, the batch
size, the mesh, the evaluators (`config.evals`); an override of the model, its
vocabulary or its task is refused, naming the key. Restores the parameters of
step N (default: the latest checkpoint; they must match the model exactly) and
writes `{"step": N, "eval/...": ...}` as one JSON object to FILE (and the log),
the evaluators' files (e.g. samples/N.jsonl) under FILE without its extension
+ `_files/`. Nothing else is written: the workdir may be read-only.
`--average_last=N` (or `--average_steps=A,B,...`) `--save_average=AVG`
evaluates the mean of those checkpoints' parameters, first written to the new
folder AVG as a workdir of its own (bert_jax/training/averaging.py).
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from absl import app, flags, logging  # noqa: E402

import common_flags as launch_flags  # noqa: E402
from bert_jax.file_io import write_json  # noqa: E402
from bert_jax.training import evaluation  # noqa: E402
from bert_jax.training.averaging import average_workdir  # noqa: E402

_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
_OUTPUT = flags.DEFINE_string("output", None, "Write the metrics as JSON to this file "
                              "(prediction files: to FILE without extension + _files/).")
_AVERAGE_LAST = flags.DEFINE_integer("average_last", 0, "Average the last N checkpoints.",
                                     lower_bound=0)
_AVERAGE_STEPS = flags.DEFINE_list("average_steps", [], "Average these steps.")
_SAVE_AVERAGE = flags.DEFINE_string("save_average", None, "New folder for the average.")


def main(argv):
    launch_flags.start(argv)
    averaging = _AVERAGE_LAST.value or _AVERAGE_STEPS.value or _SAVE_AVERAGE.value
    if averaging and (not _SAVE_AVERAGE.value or _STEP.value is not None or bool(
            _AVERAGE_LAST.value) == bool(_AVERAGE_STEPS.value) or not all(
            s.isdigit() for s in _AVERAGE_STEPS.value)):
        raise app.UsageError("averaging takes --save_average=NEW_FOLDER and either "
                             "--average_last=N or --average_steps=STEP,STEP,... (no --step).")
    output = _OUTPUT.value and os.path.abspath(_OUTPUT.value)
    folder = output and os.path.dirname(output)
    if output and not os.access(folder, os.W_OK):  # checked before the evaluation runs
        problem = "is not writable" if os.path.isdir(folder) else "does not exist"
        raise app.UsageError(f"--output={_OUTPUT.value}: the folder {folder} {problem}; "
                             "create it or choose another file.")
    config, workdir = launch_flags.workdir_experiment()
    if averaging:
        _, steps = average_workdir(config, workdir, _SAVE_AVERAGE.value,
                                   [int(s) for s in _AVERAGE_STEPS.value], _AVERAGE_LAST.value)
        workdir = _SAVE_AVERAGE.value
    result = evaluation.evaluate_checkpoint(
        config, workdir, _STEP.value, output and os.path.splitext(output)[0] + "_files")
    if averaging:
        result["averaged_steps"] = steps
    logging.info("%s", json.dumps(result))
    if output:
        write_json(output, result)


if __name__ == "__main__":
    launch_flags.run(main, argv=launch_flags.workdir_argv(sys.argv))
