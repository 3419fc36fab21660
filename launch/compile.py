r"""Compiles an experiment's train and evaluation steps for a TPU slice or GPU
nodes that are not here, and says whether they fit.

  python launch/compile.py --config=experiments/NAME.py[:ARG] --topology=v5p-128 \
      [--num_slices=2] [--config.mesh.shape=...] [--find_max_batch=1] [--output=F.json]

Topologies: v4-32, v5p-128, v5e-256, v6e-64, v5e:16x16 ... (needs `pip install
-e ".[tpu]"`), h100-8, h100-16, h200-8, a100-8, b200-8 (needs `pip install -e
".[cuda12]"`); see bert_jax/training/topologies.py. It runs on a CPU machine
(it sets JAX_PLATFORMS=cpu itself). Prints compile seconds, per-device memory
against the chip's, model and XLA FLOPs, collectives and attention kernels
(bert_jax/training/aot.py); exits non-zero, with the figures, when a step does
not fit. --find_max_batch=N searches the largest per-device batch that fits.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bert_jax.training import topologies  # noqa: E402  (imports no JAX)

# Compile on the CPU for accelerators that are not here: before JAX starts.
for _name, _value in topologies.COMPILE_ONLY_ENVIRONMENT.items():
    os.environ.setdefault(_name, _value)

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

import cli  # noqa: E402
from bert_jax.training import aot  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file: experiments/NAME.py[:ARG]; override any "
    "field with --config.section.key=value.", lock_config=True)
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
_EVAL = flags.DEFINE_bool("eval", True, "Also compile the evaluation step.")
_OUTPUT = flags.DEFINE_string("output", None, "Write the report as JSON here.")
flags.mark_flags_as_required(["config", "topology"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config = _CONFIG.value
    try:
        target = topologies.target(_TOPOLOGY.value, _NUM_SLICES.value)
        report = aot.compile_experiment(config, target, eval_step=_EVAL.value)
    except (topologies.TopologyError, aot.DoesNotFit, ValueError) as e:
        sys.exit(f"compile: {e}")
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


if __name__ == "__main__":
    cli.run(main)
