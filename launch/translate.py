r"""Translates sentences with a trained checkpoint.

  echo "a source sentence" | python launch/translate.py --workdir=DIR [--step=N] \
      [--input=FILE] [--config.decode.beam_size=4 --config.decode.alpha=0.6]

Reads one sentence per line from --input (default: stdin) and prints one
translation per line, in order. Uses the workdir's vocabulary and config
(`DIR/config.json`; decoding settings may be overridden, as in evaluate.py).
Empty lines, bytes that are not UTF-8, unknown ids or pieces and lines longer
than data.max_length are errors naming the line (--on_error=fail, the default),
or warnings on stderr with the line skipped (an empty output line: skip) or
translated as it is (warn).
"""

import sys

from absl import app, flags

import common_flags as launch_flags
from bert_jax.data.input_lines import ON_ERROR, screen_lines
from bert_jax.training import evaluation

_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
_INPUT = flags.DEFINE_string("input", None, "File of source sentences (default: stdin).")
_ON_ERROR = flags.DEFINE_enum("on_error", "fail", ON_ERROR, "A bad input line (empty, "
                              "unknown ids or pieces, too long): fail, skip it (empty "
                              "output line) or warn and translate it as it is.")


def main(argv):
    launch_flags.start()
    sys.stdin.reconfigure(encoding="utf-8", errors="surrogateescape")  # screened below
    try:
        stream = (open(_INPUT.value, encoding="utf-8", errors="surrogateescape")
                  if _INPUT.value else sys.stdin)
    except OSError as e:
        raise app.UsageError(f"--input={_INPUT.value}: cannot read it ({e.strerror}); "
                             "give a file of source sentences, one a line.") from e
    config, workdir = launch_flags.workdir_experiment()
    task, mesh, params, _ = evaluation.restore_for_inference(config, workdir, _STEP.value)
    if not hasattr(task, "translate"):
        raise app.UsageError(f"config.task={config.task!r} does not translate.")
    lines = screen_lines(stream, task.source_problems, _ON_ERROR.value,
                         _INPUT.value or "stdin")
    sentences = [line for line in lines if line is not None]
    outputs = iter(task.translate(params, task.encode_sources(sentences), mesh)
                   if sentences else [])
    for line in lines:
        print("" if line is None else task.detokenize(next(outputs)), flush=True)


if __name__ == "__main__":
    launch_flags.run(main, argv=launch_flags.workdir_argv(sys.argv))
