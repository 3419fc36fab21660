r"""Sweeps an experiment over a grid of config values, then tabulates and plots.

  python launch/sweep.py --config=experiments/NAME.py[:ARG] --workdir=DIR \
      --sweep='model.num_heads=1,2,4,8 x model.num_layers=1,2' \
      [--metric=eval/bleu] [--metrics=eval/bleu,eval/nll] \
      [--launcher=local|print|tpu_vm|slurm] [--report_only] \
      [--config.train.num_steps=1000 ...]

Without --sweep the config file's `get_sweep()` gives the points;
--config.KEY=VALUE applies to every run (a swept key wins). Each point trains
in DIR/<run name>/. Locally, re-running the command skips finished runs and
resumes an interrupted one, then writes DIR/results.csv, results.md and the
PNGs and prints the Markdown table. The other launchers print (and write to
DIR/commands.sh) one command per unfinished run; for tpu_vm the workdir must
be under /gcs/ unless --launcher_flags=--allow_local_workdir. `--report_only`
later tabulates whatever has finished (--command_workdir if the jobs see DIR
under another path). See docs/SWEEPS.md.
"""

import os
import shlex
import sys

from absl import app, flags
from ml_collections import config_flags

import common_flags as launch_flags
from bert_jax.analysis import sweeps

flags.mark_flags_as_required(["config", "workdir"])
SWEEP = flags.DEFINE_string("sweep", None, "Sweep spec (default: the config's get_sweep()).")
METRIC = flags.DEFINE_string("metric", None, "Metric of the plots (default: "
                             "train.best_metric if logged, else the first eval/* one).")
METRICS = flags.DEFINE_list("metrics", None, "Table columns (default: every eval/* metric).")
LAUNCHER = flags.DEFINE_enum("launcher", "local", list(sweeps.LAUNCHERS),
                             "Train here (local) or print/submit one command per run.")
REPORT_ONLY = flags.DEFINE_bool("report_only", False, "Train nothing: tabulate and plot DIR.")
X = flags.DEFINE_string("x", None, "Swept key of the heatmap's columns (default: the first).")
Y = flags.DEFINE_string("y", None, "Swept key of the heatmap's rows (default: the second).")
SUBMIT = flags.DEFINE_bool("submit", False, "tpu_vm or slurm: also run the commands.")
LAUNCHER_FLAGS = flags.DEFINE_string(
    "launcher_flags", "", "Extra arguments for `tpu_vm.py train` or `sbatch`, shell syntax.")
TPU_NAME = flags.DEFINE_string("tpu_name", "bert-jax-{index}",
                               "TPU VM per run: a format string of {index} and {name}.")
COMMAND_WORKDIR = flags.DEFINE_string("command_workdir", None,
                                      "DIR as the launched jobs see it (default: --workdir).")
STOP_ON_ERROR = flags.DEFINE_bool("stop_on_error", False,
                                  "Local: stop at the first failed run (default: record "
                                  "it in its run.json and go on).")


def main(argv):
    launch_flags.start()
    config = launch_flags.CONFIG.value
    workdir = launch_flags.WORKDIR.value
    config_flag = flags.FLAGS["config"]
    config_file = config_flags.get_config_filename(config_flag)
    base_overrides = dict(config_flags.get_override_values(config_flag))

    failed = []
    if not REPORT_ONLY.value:
        points = SWEEP.value or sweeps.load_sweep(config_file)
        sweep = sweeps.Sweep(
            config, workdir, points, config_file=config_file,
            base_overrides=base_overrides, launcher=LAUNCHER.value,
            command_directory=COMMAND_WORKDIR.value,
            launcher_flags=shlex.split(LAUNCHER_FLAGS.value), tpu_name=TPU_NAME.value)
        if LAUNCHER.value != "local":
            sweep.launch(submit=SUBMIT.value)
            return 0
        outcome = sweep.run(stop_on_error=STOP_ON_ERROR.value)
        failed = [name for name, status in outcome.items() if status == "failed"]

    rows = sweeps.collect(workdir)
    if not rows:
        raise app.UsageError(f"{workdir} holds no sweep runs (no */overrides.json).")
    metric = METRIC.value
    if not metric:  # train.best_metric if logged, else the first eval/* metric
        logged = {k for row in rows for k in row["metrics"]}
        best = config.train.get("best_metric") if "train" in config else None
        metric = best if best in logged else min(
            (k for k in logged if k.startswith("eval/")), default=None)
    table = sweeps.write_tables(rows, workdir, METRICS.value)
    if metric:
        best = metric == config.train.get("best_metric")
        mode = config.train.get("best_mode") if best else None
        paths = sweeps.plot(rows, workdir, metric, x=X.value, y=Y.value, mode=mode)
        print(f"wrote {os.path.join(workdir, 'results.csv')}, results.md, "
              + ", ".join(os.path.basename(p) for p in paths.values()), file=sys.stderr)
    return launch_flags.print_table(table, failed)


if __name__ == "__main__":
    launch_flags.run(main)
