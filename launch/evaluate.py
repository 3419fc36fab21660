r"""Evaluates a checkpoint of a workdir in a fresh process.

  python launch/evaluate.py --workdir=DIR [--step=N] [--output=FILE.json] \
      [--config.data.eval_split=test --config.decode.beam_size=8 ...]

The experiment is the one the workdir was trained with (`DIR/config.json`).
Overrides may change only what evaluation may: the evaluation split ('heldout'
only for a run that held it out of training), the data folder of extra test
sets, the number of examples scored, decoding, the batch size, the mesh, the
evaluators (`config.evals`), BERT pretraining's held-out pairs or single
segments (`data.next_sentence_prediction`); an override of the model, its
vocabulary or its task is refused, naming the key. Restores the parameters of
step N (default: the latest checkpoint; they must match the model exactly),
prints `{"step": N, "eval/...": ...}` as one JSON line on stdout as soon as it
is computed (a failed write loses nothing), then writes the evaluators' files
(e.g. samples/N.jsonl) under FILE without its extension + `_files/` (none
when FILE is a device or pipe, e.g. /dev/stdout) and the same object to FILE.
Nothing else is written, and nothing into the workdir: an output that resolves
into it is refused (the workdir may be read-only, and a damaged or missing file
of it is refused, never recreated).
`--average_last=N` (or `--average_steps=A,B,...`) `--save_average=AVG`
evaluates the mean of those checkpoints' parameters, first written to the new
folder AVG, outside the workdir, as a workdir of its own
(bert_jax/training/averaging.py).
"""

import json
import os
import sys

from absl import app, flags

import common_flags as launch_flags
from bert_jax.errors import UserError
from bert_jax.file_io import write_json
from bert_jax.training import evaluation
from bert_jax.training.averaging import average_workdir
from bert_jax.training.workdir import refuse_writing_into
from bert_jax.workdir_layout import is_step_name

_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
_OUTPUT = flags.DEFINE_string("output", None, "Write the metrics as JSON to this file "
                              "(prediction files: to FILE without extension + _files/).")
_AVERAGE_LAST = flags.DEFINE_integer("average_last", 0, "Average the last N checkpoints.",
                                     lower_bound=0)
_AVERAGE_STEPS = flags.DEFINE_list("average_steps", [], "Average these steps.")
_SAVE_AVERAGE = flags.DEFINE_string("save_average", None, "New folder for the average.")


def main(argv):
    launch_flags.start()
    averaging = _AVERAGE_LAST.value or _AVERAGE_STEPS.value or _SAVE_AVERAGE.value
    if averaging and (not _SAVE_AVERAGE.value or _STEP.value is not None or bool(
            _AVERAGE_LAST.value) == bool(_AVERAGE_STEPS.value) or not all(
            is_step_name(s) for s in _AVERAGE_STEPS.value)):
        raise app.UsageError("averaging takes --save_average=NEW_FOLDER and either "
                             "--average_last=N or --average_steps=STEP,STEP,... (no --step).")
    config, workdir = launch_flags.workdir_experiment()
    output = _OUTPUT.value and os.path.abspath(_OUTPUT.value)
    files_dir = None
    if output:  # checked before the evaluation runs
        in_place = os.path.exists(output) and not os.path.isfile(output)  # /dev/stdout, a pipe
        files_dir = None if in_place else os.path.splitext(output)[0] + "_files"
        refuse_writing_into({f"--output={_OUTPUT.value}": output,
                             f"--output={_OUTPUT.value}: its files folder {files_dir}": files_dir},
                            {"--workdir": workdir})
        folder = output if in_place else os.path.dirname(output)
        if not os.access(folder, os.W_OK):
            problem = "is not writable" if os.path.exists(folder) else "does not exist"
            raise app.UsageError(f"--output={_OUTPUT.value}: {'' if in_place else 'the folder '}"
                                 f"{folder} {problem}; create it or choose another file.")
    extra = {}
    if averaging:
        _, steps = average_workdir(config, workdir, _SAVE_AVERAGE.value,
                                   [int(s) for s in _AVERAGE_STEPS.value], _AVERAGE_LAST.value)
        workdir, extra = _SAVE_AVERAGE.value, {"averaged_steps": steps}

    def report(result: dict) -> None:  # before any file is written: a failed write loses
        print(json.dumps({**result, **extra}), flush=True)  # nothing computed

    result = evaluation.evaluate_checkpoint(config, workdir, _STEP.value, files_dir,
                                            report=report)
    if output:
        try:
            write_json(output, {**result, **extra})
        except OSError as e:
            raise UserError(f"--output={_OUTPUT.value}: cannot write it ({e.strerror}); "
                            "the metrics are printed above.") from e


if __name__ == "__main__":
    launch_flags.run(main, argv=launch_flags.workdir_argv(sys.argv))
