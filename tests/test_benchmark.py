"""launch/benchmark.py: the trainer's task and batch it times; end to end at
toy size (slow: each runs launch/benchmark.py in a subprocess), it times the
project's train step, reports MFU, compile time and memory, and times the
PyTorch peer on the same batch."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.modeling import bert_preset, transformer_preset
from bert_jax.planning import topologies
from helpers import REPO

import benchmark


@pytest.mark.parametrize("spec, bert, inputs", [("bert-tiny:32", True, ("input_ids",)),
                                                 ("transformer-base:16", False,
                                                  ("inputs", "targets"))])
def test_the_batch_is_the_training_batch_of_the_experiments_task(spec, bert, inputs):
    overrides = {"dtype": "bfloat16", "remat": "full", "scan_layers": True}
    task, batch = benchmark.workload(spec, 4, overrides)
    assert task.config.task == ("bert_pretraining" if bert else "translation")
    assert task.model_config == (bert_preset("tiny", max_len=512, **overrides) if bert
                                 else transformer_preset("base", max_len=256, **overrides))
    # The step is compiled for the task's training batch: the synthetic one matches it.
    assert {key: (value.shape, value.dtype) for key, value in batch.items()} == {
        key: (want.shape, want.dtype) for key, want in task.batch_spec(train=True).items()}
    # No padding: the task's attention mask (ids != pad id) keeps every position.
    pad = task.pad_id if bert else task.model_config.pad_id
    assert all((batch[key] != pad).all() for key in inputs)
    if bert:
        assert batch["masked_lm_positions"].shape == (4, 5)   # 20 per 128 tokens
        np.testing.assert_array_equal(batch["masked_lm_ids"], np.take_along_axis(
            batch["input_ids"], batch["masked_lm_positions"], 1))


def _benchmark(*flags, tmp_path, env=None):
    output = tmp_path / "bench.json"
    env = env or {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
                  "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, str(REPO / "launch" / "benchmark.py"), *flags,
         f"--output={output}"], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=600)
    return result, output


@pytest.mark.slow
def test_benchmark_times_bert_jax_and_pytorch(tmp_path):
    result, output = _benchmark("--models=bert-tiny:32", "--batch=4",
                                "--dtypes=float32,bfloat16", "--steps=3", "--warmup=1",
                                "--compare", tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(output.read_text())
    rows = report["results"][0]["rows"]
    peaks = report["peak_flops_per_device"]
    for dtype in ("float32", "bfloat16"):
        row = rows[f"bert_jax {dtype}"]
        assert row["step_seconds"] > 0 and row["compile_seconds"] > 0
        # The CPU's peak is a measured matmul of the row's own dtype.
        assert row["peak_flops_per_device"] == peaks[dtype] > 0
        assert 0 < row["mfu"] < 1
        assert row["tokens_per_second"] == 4 * 32 / row["step_seconds"]
        assert row["planned_gib"] > 0
        # The step-time bound is at most the time measured.
        bound = row["step_time_bound"]
        assert bound["bound_s"] == max(bound["compute_s"], bound["memory_s"],
                                       bound["communication_s"]) > 0
        assert row["measured_over_bound"] == row["step_seconds"] / bound["bound_s"] >= 1
        assert row["bound_inputs"]["peak_flops"] == peaks[dtype]
    assert rows["pytorch float32"]["step_seconds"] > 0
    assert "bert_jax float32 vs pytorch float32:" in result.stdout
    assert report["memory_bandwidth"] == max(report["memory_bandwidth_per_megabytes"].values())
    assert "memory bandwidth (a measured copy" in result.stdout


@pytest.mark.slow
def test_benchmark_rejects_a_bad_model_spec(tmp_path):
    result, _ = _benchmark("--models=bert-base", tmp_path=tmp_path)
    assert result.returncode != 0
    assert "--models entry 'bert-base'" in result.stdout + result.stderr


@pytest.mark.slow
def test_a_user_error_is_one_line_in_a_plain_shell(tmp_path):
    """Without the tests' JAX_PLATFORMS=cpu, the script itself keeps the start-up
    errors of installed GPU/TPU plugins without hardware off stderr."""
    from bert_jax.planning.topologies import COMPILE_ONLY_ENVIRONMENT
    env = {k: v for k, v in os.environ.items() if k not in COMPILE_ONLY_ENVIRONMENT}
    result, _ = _benchmark("--steps=6", "--profile_steps=5,9", tmp_path=tmp_path, env=env)
    assert result.returncode == 2 and result.stderr.splitlines() == [
        "error: --profile_steps=5,9: only 6 steps are timed (--steps)."], result.stderr


@pytest.mark.slow
def test_benchmark_writes_a_profile_of_the_steps_asked_for(tmp_path):
    result, _ = _benchmark("--models=bert-tiny:32", "--batch=2", "--steps=2", "--warmup=0",
                           "--profile_steps=2,2", f"--profile_dir={tmp_path / 'profile'}",
                           tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    traces = list(tmp_path.glob("profile/bert-tiny_32_float32/plugins/profile/*/*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0


def test_chips_in_the_table_bound_a_step_timed_on_them():
    """A GPU (or TPU) timed by benchmark.py is bounded with its table's figures,
    one node; a kind not in the table has none."""
    h100 = type("Device", (), {"device_kind": "NVIDIA H100 80GB HBM3"})()
    machine = topologies.local_machine([h100])
    spec = topologies.GPUS["h100"]
    assert (machine.peak_flops, machine.memory_bandwidth, machine.vector_flops) == (
        spec.peak_flops, spec.memory_bandwidth, spec.vector_flops)
    assert machine.interconnect.local == "NVLink" and len(machine.places) == 1
    assert topologies.local_machine([type("Device", (), {"device_kind": "cpu"})()]) is None


@pytest.mark.slow
def test_entries_give_their_own_batch_and_the_dropout_generator(tmp_path):
    """The pod's per-device steps at two shapes in one run (`MODEL:LENGTH:BATCH`),
    each with measured beside the step-total and per-instruction bounds."""
    result, output = _benchmark("--models=bert-tiny:32:4,bert-tiny:64:2", "--batch=8",
                                "--dtypes=bfloat16", "--steps=2", "--warmup=1",
                                "--dropout_prng=rbg", tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(output.read_text())
    assert report["flags"]["dropout_prng"] == "rbg"
    assert [(r["model"], r["batch"]) for r in report["results"]] == [
        ("bert-tiny:32", 4), ("bert-tiny:64", 2)]
    for entry in report["results"]:
        row = entry["rows"]["bert_jax bfloat16"]
        roofline = row["per_instruction_bound"]["bound_s"]
        assert row["measured_over_per_instruction_bound"] == row["step_seconds"] / roofline
        assert row["sequences_per_second"] == entry["batch"] / row["step_seconds"]
