r"""Compiles an experiment's train and evaluation steps for a TPU slice or GPU
nodes that are not here, and says whether they fit.

  python launch/compile.py --config=experiments/NAME.py[:ARG] --topology=v5p-128 \
      [--num_slices=2] [--config.mesh.shape=...] [--find_max_batch=1] [--output=F.json]
  python launch/compile.py --config=experiments/pretrain_bert.py:large_lamb_phase1 \
      --topology=v5e-256 --fit_global_batch [--mfu=0.5] [--memory_gib=15]

Topologies: bert_jax/training/topologies.py (TPUs need `pip install -e ".[tpu]"`,
GPUs `".[cuda12]"`); runs on a CPU machine. Prints compile seconds, per-device
memory against the chip's, FLOPs, collectives and attention kernels; exits non-zero
when a step does not fit. --fit_global_batch also prints the train.py command and
the hours at `--mfu` of the chips' peak: a projection, not a measurement.
"""

import dataclasses
import json
import os
import shlex
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bert_jax.training import topologies  # noqa: E402  (imports no JAX)

# Compile on the CPU for accelerators that are not here: before JAX starts.
for _name, _value in topologies.COMPILE_ONLY_ENVIRONMENT.items():
    os.environ.setdefault(_name, _value)

from absl import app, flags  # noqa: E402

import common_flags as launch_flags  # noqa: E402
from bert_jax.training import aot  # noqa: E402

_CONFIG = launch_flags.CONFIG
_TOPOLOGY = flags.DEFINE_string("topology", None, "TPU slice or GPU nodes, e.g. "
                                "v5p-128, v5e:16x16, h100-8.")
_NUM_SLICES = flags.DEFINE_integer("num_slices", 1, "TPU slices joined over the "
                                   "data-centre network (config.mesh.dcn_shape).")
_FIND_MAX_BATCH = flags.DEFINE_integer(
    "find_max_batch", 0, "N > 0: also search the largest per-device training batch "
    "that fits, doubling from N, then bisecting (each try is one compile).")
_BISECT = flags.DEFINE_bool("bisect", True, "With --find_max_batch: bisect between the "
                            "last doubling that fits and the first that does not "
                            "(else report the doubling).")
_MAX_BATCH_LIMIT = flags.DEFINE_integer("max_batch_limit", 4096, "With --find_max_batch: "
                                        "the largest per-device batch tried.")
_FIT = flags.DEFINE_bool("fit_global_batch", False, "Keep config.train.batch_size and "
                         "find the per-device micro-batch and grad_accum_steps that fit; "
                         "print the train.py command and the projected time.")
_MFU = flags.DEFINE_float("mfu", 0.5, "With --fit_global_batch: the model FLOPs utilization "
                          "the projected time assumes (MaxText reports about 0.5 on TPU).")
_MEMORY_GIB = flags.DEFINE_float("memory_gib", 0.0, "Judge steps against this many GiB "
                                 "per device instead of the chip's (leave headroom).")
_EVAL = flags.DEFINE_bool("eval", True, "Also compile the evaluation step.")
_OUTPUT = flags.DEFINE_string("output", None, "Write the report as JSON here.")
flags.mark_flags_as_required(["config", "topology"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config = _CONFIG.value
    target = topologies.target(_TOPOLOGY.value, _NUM_SLICES.value)
    if _MEMORY_GIB.value:
        target = dataclasses.replace(target, memory_bytes=int(_MEMORY_GIB.value * aot.GiB),
                                     memory_note="--memory_gib")
    if _FIT.value:
        return fit(config, target)
    report = aot.compile_experiment(config, target, eval_step=_EVAL.value)
    print(report.summary())
    result = report.to_dict()
    if _FIND_MAX_BATCH.value:
        found = aot.find_max_batch(config, target, start=_FIND_MAX_BATCH.value,
                                   limit=_MAX_BATCH_LIMIT.value, bisect=_BISECT.value)
        result["max_per_device_batch"] = found.per_device
        result["max_batch_reached_limit"] = found.reached_limit
        result["max_batch_report"] = found.report.to_dict() if found.report else None
        print("largest per-device batch that fits: "
              + ("at least " if found.reached_limit else "") + str(found.per_device)
              + (f" ({found.report.train.total_bytes / aot.GiB:.2f} GiB)" if found.report
                 else "")
              + (" (the search's limit, --max_batch_limit)" if found.reached_limit else ""))
    if _OUTPUT.value:
        with open(_OUTPUT.value, "w") as f:
            json.dump(result, f, indent=2)
    if not report.fits:
        needs = max(step.total_bytes for step in (report.train, report.eval) if step)
        gives = f"{report.memory_per_device / aot.GiB:.1f} GiB" + (
            f" ({report.memory_note})" if report.memory_note else "")
        sys.exit(f"compile: does not fit: a step needs {needs / aot.GiB:.2f} GiB per device "
                 f"but a {report.chip} gives it {gives}. Lower config.train.batch_size, "
                 "shard more (config.mesh.shape: fsdp, tensor), or set config.model.remat.")


def fit(config, target) -> None:
    """--fit_global_batch: the micro-batch, the command, the projected cost."""
    found = aot.fit_global_batch(config, target)
    report = found.report
    print(report.summary())
    hours = aot.projected_hours(report, config.train.num_steps, _MFU.value, target.peak_flops)
    print(f"fits: {found.micro_batch} rows per device a micro-batch, "
          f"grad_accum_steps={found.grad_accum_steps}, mesh {found.mesh_shape}\n"
          f"projected from FLOPs at {_MFU.value:.0%} MFU (not a measurement): "
          f"{config.train.num_steps} steps of {report.model_flops:.3e} FLOPs = "
          f"{hours:.2f} h, {hours * report.num_devices:,.0f} chip-hours")
    changed = ("--config.train.grad_accum_steps", "--config.mesh.shape")
    kept = [arg for arg in sys.argv[1:] if arg.startswith("--config")
            and not arg.startswith(changed)]
    new = [f"--config.train.grad_accum_steps={found.grad_accum_steps}"]
    if tuple(found.mesh_shape) != tuple(config.mesh.shape):
        new.append("--config.mesh.shape='(%d,%d,%d)'" % tuple(found.mesh_shape))
    print("run: python launch/train.py " + " ".join(map(shlex.quote, kept))
          + " " + " ".join(new) + " --workdir=WORKDIR")
    if _OUTPUT.value:
        with open(_OUTPUT.value, "w") as f:
            json.dump({**dataclasses.asdict(found), "projected_hours": hours,
                       "mfu": _MFU.value}, f, indent=2)


if __name__ == "__main__":
    launch_flags.run(main)
