r"""Compiles an experiment's train and evaluation steps for a TPU slice or GPU
nodes that are not here, and says whether they fit.

  python launch/compile.py --config=experiments/NAME.py[:ARG] --topology=v5p-128 \
      [--num_slices=2] [--config.mesh.shape=...] [--find_max_batch=1] [--output=F.json]
  python launch/compile.py --config=experiments/pretrain_bert.py:large_lamb_phase1 \
      --topology=v5e-256 --fit_global_batch [--mfu=0.5] [--memory_gib=15]

Topologies: bert_jax/planning/topologies.py (TPUs need `pip install -e ".[tpu]"`,
GPUs `".[cuda12]"`); runs on a CPU machine. Prints compile seconds, per-device
memory against the chip's, FLOPs, collectives and attention kernels, and the
train step's time bound (`bert_jax/planning/step_bound.py`: compute, memory and
communication time at the chips' peak figures, the bottleneck, the MFU ceiling;
JSON keys `step_time_bound`, `bottleneck`, `mfu_ceiling`) and beside it the
per-instruction roofline with its costliest instructions (`per_instruction_bound`);
exits non-zero when a step does not fit. --fit_global_batch ranks the
configurations that fit the global batch (micro-batch and accumulation, layers
scanned or not, data-parallel or FSDP) by the per-instruction bound (the
step-total one where instructions were not costed), prints the best
and the runner-up, the best one's train.py command, and the hours at `--mfu` of
the chips' peak and at the bound: projections, not measurements.
"""

import dataclasses
import json
import os
import shlex
import sys

from bert_jax.planning import topologies  # imports no JAX

# Compile on the CPU for accelerators that are not here: before JAX starts.
for _name, _value in topologies.COMPILE_ONLY_ENVIRONMENT.items():
    os.environ.setdefault(_name, _value)

from absl import flags  # noqa: E402

import common_flags as launch_flags  # noqa: E402
from bert_jax.config_schema import check_config  # noqa: E402
from bert_jax.planning import aot  # noqa: E402

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
_FIT_ALTERNATIVES = flags.DEFINE_bool(
    "fit_alternatives", True, "With --fit_global_batch: also try the layers scanned the "
    "other way and FSDP over every device (4 searches), and keep the fastest bound.")
_MFU = flags.DEFINE_float("mfu", 0.5, "With --fit_global_batch: the model FLOPs utilization "
                          "the projected time assumes (MaxText reports about 0.5 on TPU).")
_MEMORY_GIB = flags.DEFINE_float("memory_gib", 0.0, "Judge steps against this many GiB "
                                 "per device instead of the chip's (leave headroom).")
_EVAL = flags.DEFINE_bool("eval", True, "Also compile the evaluation step.")
_OUTPUT = flags.DEFINE_string("output", None, "Write the report as JSON here.")
flags.mark_flags_as_required(["config", "topology"])


def main(argv):
    check_config(config := _CONFIG.value)
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
    """--fit_global_batch: the candidates that fit ranked by their step-time
    bound, the best one's command and its projected cost."""
    fits = aot.fit_global_batch(config, target, alternatives=_FIT_ALTERNATIVES.value)
    best = fits[0]
    report = best.report
    print(report.summary())
    steps = config.train.num_steps
    hours = aot.projected_hours(report, steps, _MFU.value, target.peak_flops)
    for label, candidate in (("best", best), ("runner-up", fits[1] if len(fits) > 1 else None)):
        print(f"{label}: " + (describe(candidate) if candidate else
                              "none (no other configuration compiled fits)"))
    lines = [f"projected from FLOPs at {_MFU.value:.0%} MFU (not a measurement): {steps} "
             f"steps of {report.model_flops:.3e} FLOPs = {hours:.2f} h, "
             f"{hours * report.num_devices:,.0f} chip-hours"]
    bound_hours = None
    if report.bound:
        bound_hours = steps * best.bound_s / 3600
        which = "per-instruction" if report.bound.roofline else "step-total"
        lines.append(f"projected at the {which} bound (the fastest the step can run, not a "
                     f"measurement): {bound_hours:.2f} h, "
                     f"{bound_hours * report.num_devices:,.0f} chip-hours")
    print("\n".join(lines))
    changed = ("--config.train.grad_accum_steps", "--config.mesh.shape",
               "--config.model.scan_layers")
    kept = [arg for arg in sys.argv[1:] if arg.startswith("--config")
            and not arg.startswith(changed)]
    new = [f"--config.train.grad_accum_steps={best.grad_accum_steps}"]
    if tuple(best.mesh_shape) != tuple(config.mesh.shape):
        new.append("--config.mesh.shape='(%d,%d,%d)'" % tuple(best.mesh_shape))
    if best.scan_layers != bool(config.model.get("scan_layers", False)) or any(
            arg.startswith("--config.model.scan_layers") for arg in sys.argv[1:]):
        new.append(f"--config.model.scan_layers={best.scan_layers}")
    print("run: python launch/train.py " + " ".join(map(shlex.quote, kept))
          + " " + " ".join(new) + " --workdir=WORKDIR")
    if _OUTPUT.value:
        with open(_OUTPUT.value, "w") as f:
            json.dump({"best": fit_dict(best), "candidates": [fit_dict(f) for f in fits],
                       "projected_hours": hours, "mfu": _MFU.value,
                       "projected_hours_at_bound": bound_hours}, f, indent=2)


def describe(found) -> str:
    bound = found.report.bound
    return (f"{found.micro_batch} rows per device a micro-batch, grad_accum_steps="
            f"{found.grad_accum_steps}, mesh {found.mesh_shape}, layers "
            f"{'scanned' if found.scan_layers else 'unscanned'}: "
            f"{found.report.train.total_bytes / aot.GiB:.2f} GiB; "
            + (f"bound {bound.bound_s * 1e3:.1f} ms ({bound.bottleneck}-bound, MFU at most "
               f"{bound.mfu_ceiling:.0%})" if bound else "no bound (no figures for the chip)")
            + (f", per instruction {bound.roofline.bound_s * 1e3:.1f} ms"
               if bound and bound.roofline else ""))


def fit_dict(found) -> dict:
    return {"micro_batch": found.micro_batch, "grad_accum_steps": found.grad_accum_steps,
            "mesh_shape": list(found.mesh_shape), "scan_layers": found.scan_layers,
            "report": found.report.to_dict()}


if __name__ == "__main__":
    launch_flags.run(main)
