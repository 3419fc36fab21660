"""Helpers the test modules share: the repository, the tiny experiment, launching scripts."""

import os
import pathlib
import socket
import subprocess
import sys

import ml_collections

from bert_jax.training.workdir import read_metrics

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "experiments"))
import tiny_translate  # noqa: E402


def tiny_config(data_dir, **overrides) -> ml_collections.ConfigDict:
    """The tiny experiment, smaller still; overrides as {'train.num_steps': 10}."""
    config = tiny_translate.get_config()
    config.data.data_dir = data_dir
    for key, value in overrides.items():
        section, name = key.split(".")
        config[section][name] = value
    return config


# The end of a `python -c CODE SCRIPT FLAGS...` wrapper (after CODE patched something):
# runs SCRIPT as `python SCRIPT FLAGS...` would, its folder first on sys.path.
RUN_AS_SCRIPT = """
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def flags_for(config_overrides: dict) -> list[str]:
    return [f"--config.{k}={v}" for k, v in config_overrides.items()]


def launch(script: str, workdir, overrides: dict, devices: int = 1, extra=(),
           config: str | None = "tiny_translate.py", python_code: str | None = None,
           **popen):
    """Runs `launch/<script>`; `config=None` gives no --config (the workdir's).
    `python_code` runs in its place with the script's path and flags in `sys.argv[1:]`
    (it patches something, then runs the script)."""
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
           "JAX_PLATFORMS": "cpu"}
    config_flag = ["--config=" + str(REPO / "experiments" / config)] if config else []
    code = ["-c", python_code] if python_code else []
    command = [sys.executable, *code, str(REPO / "launch" / script), *config_flag,
               f"--workdir={workdir}", *flags_for(overrides), *extra]
    return subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **popen)


def finish(process, timeout=240):
    out, _ = process.communicate(timeout=timeout)
    return process.returncode, out


def losses(workdir):
    return {m["step"]: m["train/loss"] for m in read_metrics(workdir) if "train/loss" in m}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
