r"""Hyperparameter sweeps: points, a runner, results tables and plots.

One job a module, each importing only from those listed before it:

    points      `sweep`/`product`/`zip` for a config's `get_sweep()`, the
                one-line `--sweep` spec (`parse_sweep`), applying a point
    names       run names (`run_name`) and short key/value texts
    files       a run directory's files (records, metrics, checkpoints, DONE)
    runner      `Sweep`: trains the points here or writes launcher commands
    results     `collect`, `write_tables` (results.csv, results.md)
    plots       `plot` (heatmap, metric against parameters, curves), `report`

A config's `get_sweep()` returns the points, e.g.
`product(sweep("model.num_heads", [1, 2, 4, 8]), sweep("model.num_layers", [1, 2]))`;
the one-line form `model.num_heads=1,2,4,8 x model.num_layers=1,2` (product: 8
runs; ` + ` zips axes of equal length) is described in `points`.

A sweep directory holds one workdir per point, named by `run_name` (e.g.
`num_heads=2,num_layers=1`)::

    DIR/sweep.json                   the sweep: config file, base overrides, points
    DIR/<run>/overrides.json         the point's overrides (written before it runs)
    DIR/<run>/run.json               runner's record: parameters, status, sessions
                                     (start/end times, steps), wall time
    DIR/<run>/DONE                   written when a local run finished its steps
    DIR/<run>/config.json, metrics.jsonl, checkpoints/ ...   the trainer's
    DIR/results.csv, results.md, *.png                        `write_tables`, `plot`
    DIR/commands.sh                  launcher commands (print/tpu_vm/slurm)

`Sweep.run()` trains the points one after another in this process; a run
whose DONE marker (or final-step checkpoint) exists is skipped, and an
interrupted one resumes from its last checkpoint (the trainer resumes). With
`launcher='print'|'tpu_vm'|'slurm'`, `Sweep.launch()` writes (and prints) one
shell-quoted command per run instead: `python launch/train.py ...`,
`python launch/tpu_vm.py train NAME ... -- ...` or
`sbatch ... launch/slurm_train.sbatch ...`.

`collect(DIR)` reads what exists (partial sweeps included), `write_tables`
writes results.csv / results.md and `plot` the heatmap, the metric against
the parameter count and the training curves.
"""

from bert_jax.analysis.sweeps.points import (
    SweepError, apply_overrides, as_points, load_sweep, parse_sweep, parse_value, product,
    sweep, validate, zip)
from bert_jax.analysis.sweeps.names import (
    MAX_NAME_LENGTH, format_value, run_name, short_keys)
from bert_jax.analysis.sweeps.files import (
    DONE_FILE, OVERRIDES_FILE, RUN_FILE, SWEEP_FILE, count_parameters, is_finished,
    run_checkpoint_steps)
from bert_jax.analysis.sweeps.runner import (
    COMMANDS_FILE, LAUNCHERS, Run, Sweep, flag_text, override_flags)
from bert_jax.analysis.sweeps.results import collect, markdown, table, write_tables
from bert_jax.analysis.sweeps.plots import metric_mode, plot, report
from bert_jax.training.workdir import read_metrics

__all__ = [
    "SweepError", "apply_overrides", "as_points", "load_sweep", "parse_sweep",
    "parse_value", "product", "sweep", "validate", "zip",
    "MAX_NAME_LENGTH", "format_value", "run_name", "short_keys",
    "DONE_FILE", "OVERRIDES_FILE", "RUN_FILE", "SWEEP_FILE", "count_parameters",
    "is_finished", "run_checkpoint_steps", "read_metrics",
    "COMMANDS_FILE", "LAUNCHERS", "Run", "Sweep", "flag_text", "override_flags",
    "collect", "markdown", "table", "write_tables",
    "metric_mode", "plot", "report",
]
