r"""Head and layer ablation of a trained checkpoint, with head importance and pruning.

  python launch/ablate.py --workdir=DIR --metric=eval/accuracy [--step=N] \
      [--output_dir=DIR_ablation] [--tolerance=1]

Runs `bert_jax.analysis.ablation.run_ablations` (Michel, Levy and Neubig 2019)
on the workdir's experiment (`DIR/config.json`, as in evaluate.py) and its
evaluation split, with the evaluation loss for head importance, and writes
`write_report`'s files to --output_dir, outside the workdir (refused inside
it). `--metric` is an evaluation metric where higher is better (e.g.
`eval/accuracy`; BLEU needs decoding, which takes no masks). Translation ablates encoder self-, decoder self- and cross-attention
heads as separate groups.
"""

import json
import os
import sys

from absl import app, flags, logging

import common_flags as launch_flags
import jax

from bert_jax.analysis import ablation
from bert_jax.training.evaluation import make_evaluator, restore_for_inference
from bert_jax.training.sharding import global_batch
from bert_jax.training.workdir import refuse_writing_into

_METRIC = flags.DEFINE_string("metric", "eval/accuracy", "Metric to ablate (higher is better).")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Default: WORKDIR_ablation, beside "
                                  "the workdir.")
_TOLERANCE = flags.DEFINE_float("tolerance", 1.0, "Metric loss allowed when pruning.")
_FRACTION = flags.DEFINE_float("fraction_per_step", 0.1, "Heads pruned per step.")
_IMPORTANCE_BATCHES = flags.DEFINE_integer(
    "importance_batches", 0, "Evaluation batches for importance (0 = all).")


def main(argv):
    launch_flags.start()
    config, workdir = launch_flags.workdir_experiment()
    output_dir = _OUTPUT_DIR.value or os.path.normpath(workdir) + "_ablation"
    refuse_writing_into({f"--output_dir={output_dir}": output_dir}, {"--workdir": workdir})
    task, mesh, params, step = restore_for_inference(config, workdir, _STEP.value)
    shapes = ablation.model_shapes(task.model_config)
    evaluate = make_evaluator(task, mesh)
    predict = jax.jit(task.predict)

    with jax.set_mesh(mesh):
        batches = [global_batch(b, mesh)
                   for b in task.eval_batches(jax.process_index(), jax.process_count())]
        if _IMPORTANCE_BATCHES.value:
            batches = batches[:_IMPORTANCE_BATCHES.value]

        def metric_fn(masks):
            metrics = evaluate(params, step, ablation.model_kwargs(task.model_config, masks))
            if _METRIC.value not in metrics:
                raise app.UsageError(f"--metric={_METRIC.value}: use one of {sorted(metrics)}")
            return metrics[_METRIC.value]

        def loss_fn(masks):
            """Mean evaluation loss (`loss`, or `nll` where the loss is smoothed)."""
            total = weight = 0.0
            for batch in batches:
                kwargs = ablation.model_kwargs(task.model_config, masks)
                sums = predict(params, batch, kwargs)["sums"]
                total = total + sums.get("loss", sums.get("nll"))
                weight = weight + sums["weight"]
            return total / weight

        layers = shapes.get("head_mask", (None,))[0]
        results = ablation.run_ablations(
            metric_fn, loss_fn, shapes, num_layers=layers,
            fraction_per_step=_FRACTION.value, tolerance=_TOLERANCE.value)
    results.update(checkpoint=os.path.abspath(workdir), step=step, metric=_METRIC.value)
    if jax.process_index() == 0:
        paths = ablation.write_report(results, output_dir, metric_name=_METRIC.value)
        logging.info("ablation report: %s", json.dumps(paths, default=str))
        print(open(os.path.join(output_dir, "report.md")).read())


if __name__ == "__main__":
    launch_flags.run(main, argv=launch_flags.workdir_argv(sys.argv))
