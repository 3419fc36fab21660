"""Hyperparameter sweeps (docs/SWEEPS.md): the points of a sweep, the training
of its runs and their results. Each module does one job and imports only from
those before it:

    points   `sweep`/`product`/`zip` for a config's `get_sweep()`, the one-line
             `--sweep` spec (`parse_sweep`), applying a point to a config,
             loading config files (`load_config`, `load_sweep`)
    runner   run names and files; `Sweep`: trains the points here, one after
             another (finished runs skipped, an interrupted one resumed), or
             writes launcher commands (print, tpu_vm, slurm); runs named by
             their overrides or by labels
    results  `collect` (partial sweeps included), `write_tables`
             (results.csv, results.md), `plot` (heatmap, metric against
             parameters, training curves)

`launch/sweep.py` runs a sweep; `bert_jax.analysis.transfer` builds transfer
studies on these (one sweep per task).
"""

from bert_jax.analysis.sweeps.points import (  # noqa: F401
    apply_overrides, as_points, load_config, load_module, load_sweep, parse_sweep,
    parse_value, product, sweep, validate, zip)
from bert_jax.analysis.sweeps.runner import (  # noqa: F401
    COMMANDS_FILE, DONE_FILE, LAUNCHERS, MAX_NAME_LENGTH, OVERRIDES_FILE, RUN_FILE,
    SWEEP_FILE, Run, Sweep, count_parameters, flag_text, format_value, is_finished,
    run_checkpoint_steps, run_name, short_keys)
from bert_jax.analysis.sweeps.results import (  # noqa: F401
    collect, human_seconds, markdown_table, number, plot, write_csv, write_tables)
from bert_jax.training.workdir import read_metrics  # noqa: F401
