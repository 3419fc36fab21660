r"""Steady-state train-step throughput of bert_jax, optionally against its peers.

  python launch/benchmark.py --models=bert-base:128 --batch=8 \
      --dtypes=float32,bfloat16 --compare [--profile_steps=5,7 --profile_dir=DIR]
  python launch/benchmark.py --models=bert-large:128:128,bert-large:512:32 \
      --dtypes=bfloat16 --output=phases.json   # one GPU: a pod's per-device steps

For every `MODEL:LENGTH[:BATCH]` (BATCH: that entry's global batch, else
`--batch`) and dtype: the step `launch/train.py` runs, on all local devices,
compiled (timed), `--warmup` steps, then the median of `--steps`
steps timed one by one: step time, sequences/s, tokens/s, MFU
(`bert_jax.training.metrics`: on CPU relative to a measured matmul in the
row's dtype, as the model computes it) and memory. The step is the trainer's
(mesh, optimizer: AdamW, loss, init, FLOPs and tokens counts) for the task of
the family's experiment (`EXPERIMENTS`: experiments/pretrain_bert.py:base_2018,
experiments/translate.py:wmt_base), built without data (as launch/compile.py),
its model the size preset (`bert_preset`, `transformer_preset`) with the
dtype, `--attention_impl`, `--remat` and `--scan_layers`; `--dropout_prng` is
`train.dropout_prng`.

The step-time bound of the compiled step is checked against the time measured
(`bert_jax.planning.step_bound`): the bound (the largest of compute, memory
and communication), the per-instruction bound, and measured / each, at least
1 when the bound is one. On CPU: compute at the measured matmul peak of the
row's dtype, memory traffic at the fastest measured copy bandwidth (from
cache-sized to memory-sized arrays; all printed); on a GPU or TPU in the chip
table (`chips.DEVICE_KINDS`), its published figures, as
launch/compile.py bounds a pod: a per-device micro-batch of a pod's recipe on
one chip (`bert-large:128:128` and `bert-large:512:32`: `large_lamb_phase1/2`
at 256 devices and 2 and 4 micro-batches, with AdamW for LAMB) is the pod's
step but for its once-a-step all-reduce.

BERT steps are pretraining steps on a synthetic batch: 15% of the positions
masked (20 per 128 tokens, as google-research/bert), MLM + NSP, the MLM head at
the masked positions only (as the task). Transformer steps: source and target
of LENGTH tokens, unpacked, label smoothing 0.1 (the experiment's).

`--compare` times on the same batch Hugging Face `BertForPreTraining` in
PyTorch (float32, AdamW) and, with `transformers<5`, `FlaxBertForPreTraining`
with optax AdamW, and prints bert_jax's speed-up over each.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import app, flags

import cli

from bert_jax.analysis.sweeps.points import load_config
from bert_jax.config_schema import DROPOUT_PRNGS, profile_range
from bert_jax.modeling import bert_preset, transformer_preset
from bert_jax.modeling.configs import REMAT_POLICIES
from bert_jax.modeling.losses import bert_pretraining_sums
from bert_jax.tasks import Task, build_task
from bert_jax.planning.aot import bound_of, compiled_memory, step_report
from bert_jax.training.metrics import (
    memory_bandwidth_per_size, peak_flops_per_device, time_matmul_flops)
from bert_jax.planning.step_bound import Interconnect, Machine, Place
from bert_jax.training.profiling import StepProfiler
from bert_jax.training.sharding import global_batch, mesh_from_config
from bert_jax.planning.topologies import local_machine
from bert_jax.training.train_step import create_train_state, jit_train_step, make_train_step
from bert_jax.training.optimizer import optimizer_from_config

_MODELS = flags.DEFINE_list("models", ["bert-base:128"], "MODEL:LENGTH[:BATCH] entries; "
                            "MODEL: bert-{mini,small,base,large}, transformer-{base,big}; "
                            "BATCH: its global batch (default --batch).")
_BATCH = flags.DEFINE_integer("batch", 8, "Global batch (sequences).")
_DTYPES = flags.DEFINE_list("dtypes", ["float32"], "Compute dtypes (state stays float32).")
_STEPS = flags.DEFINE_integer("steps", 20, "Timed steps (the median is reported).")
_WARMUP = flags.DEFINE_integer("warmup", 3, "Untimed steps after compilation.")
_COMPARE = flags.DEFINE_bool("compare", False, "Also time the Hugging Face peers.")
_ATTENTION = flags.DEFINE_enum("attention_impl", "einsum", ["einsum", "xla", "flash"],
                               "Attention implementation.")
_REMAT = flags.DEFINE_enum("remat", "none", list(REMAT_POLICIES),
                           "Rematerialisation policy.")
_SCAN = flags.DEFINE_bool("scan_layers", False, "nn.scan over layers.")
_DROPOUT_PRNG = flags.DEFINE_enum("dropout_prng", None, list(DROPOUT_PRNGS), "The dropout "
                                  "bits' generator (train.dropout_prng; default: the experiment's).")
_PEAK = flags.DEFINE_float("peak_flops", 0.0, "Per-device peak FLOP/s (0: table or matmul).")
_OUTPUT = flags.DEFINE_string("output", "", "Also write the results as JSON here.")
_PROFILE_STEPS = flags.DEFINE_list(
    "profile_steps", [], "START,END: a trace of bert_jax's timed steps START..END "
    "(1-based) into --profile_dir/MODEL_LENGTH_DTYPE/.")
_PROFILE_DIR = flags.DEFINE_string("profile_dir", "profile", "Where traces go.")

# The experiment of each family whose step is timed (the paper's recipe), its
# model replaced by the --models size preset.
EXPERIMENTS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "experiments")
EXPERIMENTS = {"bert": "pretrain_bert.py:base_2018", "transformer": "translate.py:wmt_base"}


def model_and_batch(entry: str) -> tuple[str, int]:
    """`MODEL:LENGTH[:BATCH]` -> (`MODEL:LENGTH`, BATCH or --batch)."""
    spec, _, batch = entry.rpartition(":") if entry.count(":") == 2 else (entry, "", "")
    if batch and not batch.isdigit():
        raise app.UsageError(f"--models entry {entry!r}: BATCH must be a number, e.g. "
                             "bert-large:512:32.")
    return spec, int(batch) if batch else _BATCH.value


def max_predictions(length: int) -> int:
    """Masked-LM slots per sequence: 20 per 128 tokens (google-research/bert)."""
    return max(1, round(length * 20 / 128))


def bert_batch(vocab_size: int, batch: int, length: int, predictions: int,
               seed: int = 0) -> dict:
    """`[CLS] A [SEP] B [SEP]`, full length (no pad id 0: the task's attention mask
    is all ones), `predictions` masked positions a row."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, vocab_size, (batch, length)).astype(np.int32)
    split = length // 2
    ids[:, 0], ids[:, split - 1], ids[:, -1] = 101, 102, 102
    token_types = (np.arange(length) >= split).astype(np.int32)[None].repeat(batch, 0)
    positions = np.sort(np.stack([rng.choice(np.arange(1, length - 1), predictions,
                                             replace=False) for _ in range(batch)]), 1)
    return {"input_ids": ids, "token_type_ids": token_types,
            "masked_lm_positions": positions.astype(np.int32),
            "masked_lm_ids": np.take_along_axis(ids, positions, 1),
            "masked_lm_weights": np.ones(positions.shape, np.float32),
            "next_sentence_labels": rng.integers(0, 2, batch).astype(np.int32)}


def workload(spec: str, batch: int, model_overrides: dict,
             dropout_prng: str | None = None) -> tuple[Task, dict]:
    """(the task `launch/train.py` would build from `EXPERIMENTS[family]` with the
    model the size preset with `model_overrides`, sequences of LENGTH and `batch`
    rows; a synthetic batch of its `batch_spec`). BERT: `max_predictions(LENGTH)`
    masked; Transformer: source and target of LENGTH tokens, unpacked."""
    name, _, length = spec.partition(":")
    family, _, size = name.partition("-")
    if family not in EXPERIMENTS or not length.isdigit():
        raise app.UsageError(f"--models entry {spec!r}: give MODEL:LENGTH, e.g. "
                             "bert-base:128.")
    length, bert = int(length), family == "bert"
    config = load_config(os.path.join(EXPERIMENTS_DIR, EXPERIMENTS[family]))
    model = (bert_preset if bert else transformer_preset)(
        size, max_len=max(512 if bert else 256, length), **model_overrides)
    config.model = ml_collections.ConfigDict(dataclasses.asdict(model))
    config.train.batch_size, config.data.vocab_size = batch, model.vocab_size
    config.train.dropout_prng = dropout_prng or config.train.dropout_prng
    config.data.update(dict(max_seq_length=length, max_predictions_per_seq=max_predictions(
        length)) if bert else dict(max_length=length, pack_length=0, batch_tokens=0))
    task = build_task(config, None, abstract=True)
    if bert:
        return task, bert_batch(model.vocab_size, batch, length, task.train_predictions)
    rng = np.random.default_rng(0)
    return task, {key: rng.integers(3, model.vocab_size, s.shape).astype(s.dtype)
                  for key, s in task.batch_spec().items()}


def _median_step(step: Callable[[], Any], steps: int, warmup: int,
                 profiler: StepProfiler | None = None) -> float:
    for _ in range(warmup):
        step()
    times = []
    for index in range(1, steps + 1):
        if profiler:
            profiler.before(index)
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
        if profiler:
            profiler.after(index, None)
    if profiler:
        profiler.close()
    return statistics.median(times)


def cpu_machine(peak_flops: float, copy_bandwidth: float, num_devices: int) -> Machine:
    """This CPU as `step_bound` sees it: measured peak and copy bandwidth; its
    devices (XLA's host devices) share memory, so collectives are copies."""
    return Machine("cpu", peak_flops, copy_bandwidth, Interconnect("memory", copy_bandwidth),
                   (Place(0),) * num_devices)


def time_bert_jax(task: Task, batch: dict[str, np.ndarray], steps: int, warmup: int,
                  profiler: StepProfiler | None = None,
                  hardware: Callable[[], Machine] | None = None) -> dict[str, Any]:
    """The trainer's step of `task` (its mesh, optimizer, loss; compiled for its
    `batch_spec`, which `batch` must match): times and memory; with `hardware`
    (asked after the timed steps) its time bound and measured / bound."""
    config = task.config
    mesh = mesh_from_config(config.mesh)
    state, shardings = create_train_state(task.init_variables, task.model.apply,
                                          optimizer_from_config(config), mesh, jax.random.PRNGKey(0))
    step_fn = jit_train_step(make_train_step(task.loss_fn, config.train.grad_accum_steps,
                                             config.train.dropout_prng),
                             shardings, mesh)
    batch = global_batch(batch, mesh)
    rng = jax.random.PRNGKey(1)
    with jax.set_mesh(mesh):
        start = time.perf_counter()
        compiled = step_fn.lower(state, task.batch_spec(), rng).compile()
        compile_seconds = time.perf_counter() - start
        holder = [state]

        def step():
            holder[0], metrics = compiled(holder[0], batch, rng)
            jax.block_until_ready(metrics)

        seconds = _median_step(step, steps, warmup, profiler)
    result = {"step_seconds": seconds, "compile_seconds": compile_seconds,
              "planned_gib": compiled_memory(compiled)["total"] / 2**30}
    if hardware is not None:
        machine = hardware()
        devices = len(machine.places)
        bound = bound_of(step_report(compiled, compile_seconds, devices), machine,
                         task.flops_per_step() / devices)
        result.update(bound.to_dict(), measured_over_bound=seconds / bound.bound_s)
        if bound.roofline:
            result["measured_over_per_instruction_bound"] = seconds / bound.roofline.bound_s
    stats = jax.local_devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        result["device_peak_gib"] = stats["peak_bytes_in_use"] / 2**30
    return result


def _hf_bert_config(size: str):
    import transformers
    reference = bert_preset(size)
    return transformers.BertConfig(
        vocab_size=reference.vocab_size, hidden_size=reference.hidden_size,
        num_hidden_layers=reference.num_layers, num_attention_heads=reference.num_heads,
        intermediate_size=reference.mlp_dim, max_position_embeddings=512)


def time_torch_bert(size: str, batch: dict[str, np.ndarray], steps: int,
                    warmup: int) -> dict[str, float] | None:
    try:
        import torch
        import transformers
    except ImportError:
        return None
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(_hf_bert_config(size)).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    labels = np.full(batch["input_ids"].shape, -100, np.int64)
    np.put_along_axis(labels, batch["masked_lm_positions"], batch["masked_lm_ids"], 1)
    inputs = {"input_ids": torch.from_numpy(batch["input_ids"].astype(np.int64)),
              "attention_mask": torch.ones(batch["input_ids"].shape, dtype=torch.int64),
              "token_type_ids": torch.from_numpy(batch["token_type_ids"].astype(np.int64)),
              "labels": torch.from_numpy(labels),
              "next_sentence_label": torch.from_numpy(
                  batch["next_sentence_labels"].astype(np.int64))}

    def step():
        optimizer.zero_grad(set_to_none=True)
        model(**inputs).loss.backward()
        optimizer.step()

    return {"step_seconds": _median_step(step, steps, warmup),
            "threads": torch.get_num_threads()}


def time_flax_hf_bert(size: str, batch: dict[str, np.ndarray], steps: int,
                      warmup: int) -> dict[str, float] | None:
    try:
        from transformers import FlaxBertForPreTraining
    except ImportError:
        return None
    import optax
    model = FlaxBertForPreTraining(_hf_bert_config(size), seed=0)
    tx = optax.adamw(1e-4)
    params = model.params
    opt_state = tx.init(params)

    def loss(params, rng):
        out = model(batch["input_ids"], np.ones_like(batch["input_ids"]), batch["token_type_ids"],
                    params=params, dropout_rng=rng, train=True)
        logits = jnp.take_along_axis(out.prediction_logits,
                                     batch["masked_lm_positions"][..., None], axis=1)
        sums = bert_pretraining_sums(logits, out.seq_relationship_logits, batch)
        return sums["loss"] / sums["weight"]

    @jax.jit
    def train_step(params, opt_state, rng):
        grads = jax.grad(loss)(params, rng)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    state = [params, opt_state]
    rng = jax.random.PRNGKey(0)

    def step():
        state[0], state[1] = train_step(state[0], state[1], rng)
        jax.block_until_ready(state[0])

    step()  # compile
    return {"step_seconds": _median_step(step, steps, warmup)}


def main(argv):
    devices = jax.local_devices()
    cpu = devices[0].platform == "cpu"
    peaks = {dtype: peak_flops_per_device(_PEAK.value, dtype) for dtype in _DTYPES.value}
    source = ("given" if _PEAK.value else "a measured matmul of the dtype, float32 "
              "accumulation, measured again after each row's steps" if cpu else
              "the chip table")
    print(f"devices: {len(devices)} x {devices[0].device_kind}; peak per device ({source}; "
          "before): "
          + ", ".join(f"{dtype} {peak / 1e12:.3f} TFLOP/s" for dtype, peak in peaks.items())
          + f"; batch {_BATCH.value} (unless an entry gives its own); {_STEPS.value} timed "
          f"steps after {_WARMUP.value} warm-up")
    bandwidths = memory_bandwidth_per_size() if cpu else {}
    bandwidth = max(bandwidths.values()) if cpu else None
    if cpu:
        print("memory bandwidth (a measured copy, bytes read + written): " + ", ".join(
            f"{megabytes:g} MB {value / 1e9:.1f} GB/s" for megabytes, value in
            bandwidths.items()) + "; the step-time bound of CPU rows divides the step's "
            "traffic by the fastest (it may stay in the caches)")
    profile_steps = profile_range(_PROFILE_STEPS.value, "--profile_steps")
    if profile_steps and profile_steps[1] > _STEPS.value:
        raise app.UsageError(f"--profile_steps={profile_steps[0]},{profile_steps[1]}: "
                             f"only {_STEPS.value} steps are timed (--steps).")
    results = []
    for entry in _MODELS.value:
        spec, rows_per_step = model_and_batch(entry)
        rows = {}
        for dtype in _DTYPES.value:
            task, batch = workload(spec, rows_per_step, dict(
                dtype=dtype, attention_impl=_ATTENTION.value, remat=_REMAT.value,
                scan_layers=_SCAN.value), _DROPOUT_PRNG.value)
            trace_dir = os.path.join(_PROFILE_DIR.value, f"{spec.replace(':', '_')}_{dtype}")
            profiler = StepProfiler(profile_steps, trace_dir) if profile_steps else None

            def hardware(dtype=dtype) -> Machine:
                # On a shared CPU the load changes: the peak is the fastest
                # matmul seen before or after the row's steps.
                if not _PEAK.value:
                    peaks[dtype] = max(peaks[dtype], time_matmul_flops(dtype))
                return cpu_machine(peaks[dtype], bandwidth, len(devices))

            chips = None if cpu else local_machine(devices)
            timing = time_bert_jax(task, batch, _STEPS.value, _WARMUP.value, profiler,
                                   hardware if cpu else chips and (lambda: chips))
            peak, flops = peaks[dtype], task.flops_per_step()
            timing.update(
                sequences_per_second=rows_per_step / timing["step_seconds"],
                tokens_per_second=task.tokens_per_step() / timing["step_seconds"],
                mfu=flops / timing["step_seconds"] / (peak * len(devices)),
                model_tflops_per_step=flops / 1e12, peak_flops_per_device=peak)
            rows[f"bert_jax {dtype}"] = timing
        if _COMPARE.value and spec.startswith("bert-"):
            size = spec.split(":")[0].split("-")[1]
            for name, timer in (("pytorch float32", time_torch_bert),
                                ("hf-flax float32", time_flax_hf_bert)):
                timing = timer(size, batch, _STEPS.value, _WARMUP.value)
                rows[name] = timing if timing is not None else {"unavailable": True}
        results.append({"model": spec, "batch": rows_per_step, "rows": rows})
        print_table(spec, rows_per_step, rows)
    if _OUTPUT.value:
        with open(_OUTPUT.value, "w") as f:
            json.dump({"device": devices[0].device_kind, "num_devices": len(devices),
                       "peak_flops_per_device": peaks, "memory_bandwidth": bandwidth,
                       "memory_bandwidth_per_megabytes": bandwidths,
                       "flags": {
                           "attention_impl": _ATTENTION.value, "remat": _REMAT.value,
                           "scan_layers": _SCAN.value, "dropout_prng": _DROPOUT_PRNG.value},
                       "results": results}, f, indent=2)


def print_table(spec: str, batch: int, rows: dict[str, dict]) -> None:
    print(f"\n{spec}, batch {batch}")
    print(f"  {'':<18} {'step ms':>9} {'seq/s':>8} {'tokens/s':>9} {'MFU':>6} "
          f"{'compile s':>9} {'memory GiB':>10} {'bound ms':>9} {'measured/bound':>14}")
    for name, row in rows.items():
        if row.get("unavailable"):
            print(f"  {name:<18} not installed (transformers<5 needed for Flax BERT)"
                  if "flax" in name else f"  {name:<18} not installed")
            continue
        seconds = row["step_seconds"]
        memory = row.get("device_peak_gib", row.get("planned_gib"))
        print(f"  {name:<18} {seconds * 1e3:>9.1f} {batch / seconds:>8.2f} "
              f"{row.get('tokens_per_second', 0):>9.0f} "
              f"{row['mfu'] * 100 if 'mfu' in row else float('nan'):>5.1f}% "
              f"{row.get('compile_seconds', float('nan')):>9.1f} "
              f"{memory if memory is not None else float('nan'):>10.2f} "
              + (f"{row['step_time_bound']['bound_s'] * 1e3:>9.1f} "
                 f"{row['measured_over_bound']:>14.2f} ({row['bottleneck']}-bound; peak "
                 f"{row['peak_flops_per_device'] / 1e12:.3f} TFLOP/s"
                 + (f"; per instruction {row['per_instruction_bound']['bound_s'] * 1e3:.1f} ms"
                    f", measured / it {row['measured_over_per_instruction_bound']:.2f}"
                    if "per_instruction_bound" in row else "") + ")"
                 if "step_time_bound" in row else ""))
    baselines = {name: row["step_seconds"] for name, row in rows.items()
                 if not name.startswith("bert_jax") and "step_seconds" in row}
    for name, row in rows.items():
        if name.startswith("bert_jax"):
            for peer, seconds in baselines.items():
                print(f"  {name} vs {peer}: {seconds / row['step_seconds']:.2f}x faster")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    cli.run(main)
