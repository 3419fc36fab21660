"""The flags and start-up that the launch entry points share.

It defines the experiment config (`--config=experiments/NAME.py[:ARG]`, with
`--config.KEY=VALUE` overrides), the workdir and the multi-host flags
(`--coordinator_address`, `--num_processes`, `--process_id`). `run(main)`
runs an entry point through `cli.run`, parsing the flags so that a config file
that fails to load or an override of a field the config lacks is reported as
one user error naming the flag and the file. `start()` is the entry
points' common start-up (quiet library logs, `jax.distributed`). The entry
points that restore a workdir (evaluate, translate, ablate, ...) read their
experiment through `workdir_argv` and `workdir_experiment`; `print_table`
ends the sweeps' output.
"""

import difflib
import os
import sys

from absl import app, flags
from ml_collections import config_flags

import cli
from bert_jax import noise
from bert_jax.errors import UserError, chain, where
from bert_jax.training import distributed, evaluation

CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file: experiments/NAME.py[:ARG]; override any "
    "field with --config.section.key=value.", lock_config=True)
WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and "
                              "the resolved config (a local or mounted path).")
COORDINATOR = flags.DEFINE_string("coordinator_address", None,
                                  "host:port of process 0, for multi-process runs.")
NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in the job.")
PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index.")
flags.register_multi_flags_validator(
    ["coordinator_address", "num_processes", "process_id"],
    lambda given: not given["coordinator_address"] or None not in (
        given["num_processes"], given["process_id"]),
    "--coordinator_address needs --num_processes and --process_id (or none of the three: "
    "TPU VMs and SLURM need none).")


def run(main, argv: list[str] | None = None) -> None:
    cli.run(main, argv, flags_parser=parse_flags)


def parse_flags(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> list[str]:
    """absl's parsing, naming the flag and the file when ml_collections fails to load
    `--config` (a load error waits for the config's first use: forced here) or to apply an
    override. ml_collections and absl wrap a `UserError` of `get_config` in text: it is
    taken from the chain."""
    config = next((a for a in argv if a.startswith("--config=")), "--config")
    try:
        remaining = flag_values(argv)
        if "config" in flag_values and flag_values["config"].value is not None:
            flag_values["config"].value.keys()
    except (AttributeError, KeyError) as e:
        raise flags.Error(_unknown_field(argv, config)) from e
    except SyntaxError as e:
        raise flags.Error(f"{config}: {where(str(e.filename), e.lineno)}: {e.msg}") from e
    except (flags.Error, OSError) as e:
        causes = [c for c in chain(e) if isinstance(c, UserError)]
        if causes:
            raise flags.Error(f"flag {config}: {causes[-1]}") from e
        if isinstance(e, flags.Error):
            raise
        path = config.split("=", 1)[-1].split(":")[0]
        problem = "no such file" if not os.path.isfile(path) else type(e).__name__
        raise flags.Error(f"{config}: cannot load the config file ({problem})") from e
    return remaining


def _unknown_field(argv: list[str], config: str) -> str:
    """The first `--config.KEY=VALUE` naming a field the config lacks, with a close name."""
    parser = config_flags.config_flags.ConfigFileFlagParser("config")
    loaded = parser.parse(config.split("=", 1)[-1])
    for arg in (a for a in argv if a.startswith("--config.")):
        node = loaded
        for key in arg.split("=", 1)[0].split(".")[1:]:
            fields = list(node.keys()) if hasattr(node, "keys") else []
            if key not in fields:
                close = difflib.get_close_matches(key, fields, n=1)
                hint = f'did you mean "{close[0]}"?' if close else "config.json lists them."
                return f"{arg}: the config has no field {key!r}; {hint}"
            node = node[key]
    return f"{config}: an override names a field the config lacks"


WORKDIR_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workdir_config.py")


def _has_config(argv: list[str]) -> bool:
    return any(a == "--config" or a.startswith("--config=") for a in argv)


def default_config_argv(argv: list[str], config_file: str) -> list[str]:
    """`argv` with `--config=config_file` when it gives no `--config` (which
    `--config.KEY=VALUE` overrides need)."""
    return argv if _has_config(argv) else argv[:1] + [f"--config={config_file}"] + argv[1:]


def workdir_argv(argv: list[str]) -> list[str]:
    """`argv` for an entry point that restores a workdir: without `--config`,
    the experiment is the workdir's `config.json` (`workdir_config.py`), which
    `--config.KEY=VALUE` overrides."""
    if _has_config(argv):
        return argv
    for i, arg in enumerate(argv):
        workdir = (arg.split("=", 1)[1] if arg.startswith("--workdir=") else
                   argv[i + 1] if arg == "--workdir" and i + 1 < len(argv) else None)
        if workdir:
            return default_config_argv(argv, f"{WORKDIR_CONFIG}:{workdir}")
    return argv


def workdir_experiment():
    """(config, workdir) of an entry point that restores `--workdir`: its
    `config.json` with the command line's overrides, which may change only what
    evaluation may (`evaluation.EVALUATION_OVERRIDES` and the task's `evaluation_overrides`)."""
    if WORKDIR.value is None:
        raise app.UsageError("--workdir is required: the workdir of a training run.")
    return evaluation.evaluation_config(WORKDIR.value, CONFIG.value), WORKDIR.value


def print_table(table: str, failed: list[str]) -> int:
    """The end of a sweep's command: its table on stdout, the failed runs on
    stderr; the exit status (1 when a run failed)."""
    print(table, end="")
    if failed:
        print(f"failed runs (see their run.json): {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def start() -> None:
    """Common start-up (after `cli.run`'s): quiet library logs, multi-host."""
    noise.quiet_library_logs()
    distributed.initialize(COORDINATOR.value, NUM_PROCESSES.value, PROCESS_ID.value)
