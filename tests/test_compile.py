"""Ahead-of-time compilation of the real train and evaluation steps for TPU
slices and GPU nodes that are not here (libtpu and the CUDA plugin compile on
this CPU): layouts, slices, memory, FLOPs, collectives, attention kernels,
refusals, and the batch shapes the steps are lowered with."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import shlex
import subprocess
import sys
import types

import jax
import ml_collections
import numpy as np
import pytest

from bert_jax.errors import ConfigError, UserError
from bert_jax.tasks import build_task
from bert_jax.planning import aot, topologies

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "experiments"))
import pretrain_bert  # noqa: E402
import tiny_translate  # noqa: E402

# XLA's count over flops.py's: flops.py counts the matmuls only, XLA also the
# elementwise work (GELU, softmax, LayerNorm, dropout, the Adam update), which
# is a large share of a model 128 wide (about 30%; a few % for BERT-base).
FLOPS_RATIO = (1.0, 1.4)
GPU_SPEC = REPO.parent / "shared" / "gpu_specs" / "h100_sxm.txtpb"


def bert_config(**model) -> ml_collections.ConfigDict:
    """The default pretraining experiment, one layer, shorter sequences (fast
    compiles)."""
    config = pretrain_bert.get_config()
    config.data.max_seq_length, config.data.max_predictions_per_seq = 64, 10
    config.model.update(num_layers=1, **model)
    return config


def translation_config(**data) -> ml_collections.ConfigDict:
    config = tiny_translate.get_config()
    config.data.update(data)
    return config


def with_mesh(config, shape, dcn=(-1, 1, 1)):
    config = ml_collections.ConfigDict(config.to_dict())
    config.mesh.shape, config.mesh.dcn_shape = shape, dcn
    return config


COMPILERS = {"tpu": ("libtpu", "tpu"), "gpu": ("jax_plugins.xla_cuda12", "cuda12")}


def accelerator(name: str, num_slices: int = 1) -> topologies.Target:
    """`topologies.target`, or a skip naming the extra when this machine has
    no compiler for it (the test extra installs both)."""
    kind = re.split(r"[-:]", name)[0]
    module, extra = COMPILERS["gpu" if kind in topologies.GPUS else "tpu"]
    pytest.importorskip(module, reason=f'compiling for {name} needs pip install -e ".[{extra}]"')
    return topologies.target(name, num_slices)


@pytest.fixture(scope="module")
def v5e():
    return accelerator("v5e:2x2")


@pytest.fixture(scope="module")
def h100():
    return accelerator("h100-2")


# ----------------------------------------------------------------------------
# Names.


@pytest.mark.parametrize("name, chips, grid", [
    ("v4-32", 16, (2, 2, 4)), ("v5p-128", 64, (4, 4, 4)), ("v5e-256", 256, (16, 16)),
    ("v5e-8", 8, (2, 4)), ("v4-8", 4, (2, 2, 1)), ("v6e-64", 64, (8, 8))])
def test_tpu_names_give_the_cloud_slices(name, chips, grid):
    kind, cores = name.split("-")
    chip = topologies.TPUS[kind]
    assert int(cores) // chip.cores_per_chip == chips
    assert topologies.tpu_grid(chips, chip.dims) == grid


def test_targets_have_their_devices_and_slices():
    two = accelerator("v5e:2x2", num_slices=2)
    assert len(two.devices) == 8 and two.memory_bytes == 16 * topologies.GiB
    assert sorted({d.slice_index for d in two.devices}) == [0, 1]
    assert len(accelerator("v4-8").devices) == 4
    nodes = accelerator("h100-16")
    assert len(nodes.devices) == 16 and {d.process_index for d in nodes.devices} == {0, 1}
    assert nodes.devices[0].device_kind == "NVIDIA H100 80GB HBM3"
    for bad in ("v5e-3", "tpu-8", "h100-12", "v4:2x2"):
        with pytest.raises(UserError, match=bad.split("-")[0]):
            topologies.target(bad)


def test_h100_target_config_matches_the_measured_one():
    if not GPU_SPEC.is_file():
        pytest.skip(f"{GPU_SPEC} is absent (shared/ lives beside the repo)")
    fields = re.compile(r"^\s*(\w+): ([\d.]+)\s*$", re.M)
    measured = dict(fields.findall(GPU_SPEC.read_text()))
    rendered = dict(fields.findall(topologies.gpu_target_config(topologies.GPUS["h100"])))
    assert measured and {k: float(v) for k, v in measured.items()} == {
        k: float(v) for k, v in rendered.items() if k in measured}


# ----------------------------------------------------------------------------
# TPU.


@pytest.mark.slow
@pytest.mark.parametrize("layout, shape", [
    ("data", (4, 1, 1)), ("fsdp", (1, 4, 1)), ("tensor", (1, 1, 4))])
def test_bert_steps_compile_for_a_tpu_slice(v5e, layout, shape):
    config = with_mesh(bert_config(), shape)
    report = aot.compile_experiment(config, v5e, eval_step=layout == "data")
    memory = report.train.memory
    assert report.mesh == dict(zip(("data", "fsdp", "tensor"), shape))
    assert memory["arguments"] > 0 and memory["total"] > 0
    assert memory["total"] == (memory["arguments"] + memory["outputs"]
                               + memory["temporaries"] + memory["generated_code"]
                               - memory["aliased"])
    assert memory["aliased"] > 0  # the donated state is updated in place
    assert report.fits and report.train.compile_seconds > 0
    # Per-device FLOPs x devices: with parameters sharded, work XLA repeats on
    # every device (LayerNorm over a sharded width, heads that do not divide
    # the tensor axis) counts again, so the formula is checked data-parallel.
    assert report.train.xla_flops > report.model_flops
    kinds = report.train.collectives
    if layout == "data":   # replicated parameters: gradients are all-reduced
        assert FLOPS_RATIO[0] < report.train.xla_flops / report.model_flops < FLOPS_RATIO[1]
        assert "all-reduce" in kinds and "all-gather" not in kinds
        assert report.eval.memory["total"] > 0
        # The program's matmuls are the model's: the bound's compute is theirs.
        assert report.train.program.flops == pytest.approx(report.model_flops / 4, rel=0.02)
        bound = report.to_dict()
        assert bound["step_time_bound"]["bound_s"] == report.bound.bound_s > 0
        assert bound["bottleneck"] in ("compute", "memory", "communication")
        assert report.bound.communication_by_link.keys() == {"ICI"}
        assert 0 < bound["mfu_ceiling"] <= 1
    elif layout == "fsdp":  # sharded parameters are gathered before use
        assert kinds["all-gather"]["count"] > 0 and kinds["all-gather"]["bytes"] > 0
    else:
        assert kinds  # tensor parallelism communicates inside the layers
    # As executed: no loop here runs a collective less than once; each op's
    # replica groups (libtpu's mesh-axes form, expanded) partition the slice.
    executed = report.train.collectives_executed
    assert executed.keys() == kinds.keys()
    assert all(executed[kind]["count"] >= kinds[kind]["count"] for kind in kinds)
    for op in report.train.collective_ops:
        assert op["kind"] in kinds and op["executions"] >= 1 and op["bytes"] > 0
        if op["kind"] != "collective-permute":
            assert sorted(d for group in op["replica_groups"] for d in group) == list(range(4))
            assert all(len(group) == op["group_size"] for group in op["replica_groups"])
    assert "collectives as executed a step: all-reduce x" in report.summary()
    assert report.train.attention_kernels == {}  # einsum


@pytest.mark.slow
def test_two_slices_put_data_parallelism_across_them():
    target = accelerator("v5e:2x2", num_slices=2)
    config = with_mesh(translation_config(), (1, 2, 2))
    report = aot.compile_experiment(config, target, eval_step=False)
    assert report.num_devices == 8 and report.num_slices == 2
    assert report.mesh == {"data": 2, "fsdp": 2, "tensor": 2}
    assert report.per_device_batch == config.train.batch_size / 4


@pytest.mark.slow
def test_v4_megacore_slice_compiles_translation():
    report = aot.compile_experiment(translation_config(), accelerator("v4-8"),
                                    eval_step=False)
    assert report.chip == "TPU v4" and report.num_devices == 4 and report.fits


@pytest.mark.slow
def test_splash_kernels_in_the_tpu_train_step(v5e):
    config = with_mesh(bert_config(attention_impl="flash", attention_dropout_rate=0.0,
                                   dtype="bfloat16"), (2, 1, 2))
    config.data.max_seq_length = 128
    report = aot.compile_experiment(config, v5e)
    kernels = set(report.train.attention_kernels)
    names = {k.split(":")[1].rsplit("_", 2)[0] for k in kernels}
    assert {"splash_mha_fwd", "splash_mha_dq", "splash_mha_dkv"} <= {
        n.replace("_segmented", "") for n in names}, kernels
    assert all("dq" not in k and "dkv" not in k for k in report.eval.attention_kernels)


@pytest.mark.slow
def test_a_step_that_cannot_fit_is_refused_with_the_figures():
    """1G embedding rows x 128 wide cannot fit a v5e's 16 GiB with Adam: the
    TPU compiler refuses, and the tool says so in a few lines."""
    command = [sys.executable, str(REPO / "launch" / "compile.py"),
               "--config=" + str(REPO / "experiments" / "pretrain_bert.py"),
               "--topology=v5e:2x2", "--noeval", "--config.data.vocab_size=8000000"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert re.search(r"ran out of device memory.*\d+(\.\d+)?G", done.stderr), done.stderr
    assert "Traceback" not in done.stderr


# ----------------------------------------------------------------------------
# GPU.


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(2, 1, 1), (1, 2, 1)])
def test_bert_step_compiles_to_cudnn_flash_attention(h100, shape):
    config = with_mesh(bert_config(attention_impl="flash", attention_dropout_rate=0.0,
                                   dtype="bfloat16"), shape)
    report = aot.compile_experiment(config, h100)
    assert report.train.xla_flops is None  # the GPU compiler counts none
    # ... and cuDNN's attention is a custom call, costed by hlo_cost: with the
    # backward pass's recomputed Q Kᵀ the program's FLOPs pass the model's.
    assert report.bound.flops == report.train.program.flops > report.model_flops / 2
    assert report.bound.sources["flops"].startswith("the program's dots")
    attention = [i for i in report.train.program.instructions if i.opcode == "custom-call"]
    assert sorted(i.flops for i in attention) == [4 * 16 * 2 * 64 * 64 * 64,
                                                  10 * 16 * 2 * 64 * 64 * 64]
    # One layer: its self-attention forward, and backward in the train step.
    assert report.train.attention_kernels == {"__cudnn$fmhaSoftmax": 1,
                                              "__cudnn$fmhaSoftmaxBackward": 1}
    assert report.eval.attention_kernels == {"__cudnn$fmhaSoftmax": 1}
    assert report.train.memory["total"] > 0 and report.fits
    einsum = aot.compile_experiment(with_mesh(bert_config(dtype="bfloat16"), shape), h100,
                                    eval_step=False)
    assert einsum.train.attention_kernels == {}


@pytest.mark.slow
def test_translation_uses_cudnn_and_refuses_packed_rows(h100):
    flash = dict(attention_impl="flash", dtype="bfloat16")
    config = translation_config()
    config.model.update(flash)
    report = aot.compile_experiment(config, h100, eval_step=False)
    # Encoder self, decoder causal self and cross-attention: 3 kernels per layer.
    assert report.train.attention_kernels == {"__cudnn$fmhaSoftmax": 6,
                                              "__cudnn$fmhaSoftmaxBackward": 6}
    packed = translation_config(pack_length=16)
    packed.model.update(flash)
    with pytest.raises(ConfigError, match="packed segments"):
        aot.compile_experiment(packed, h100, eval_step=False)


@pytest.mark.slow
def test_gpu_memory_over_the_card_is_reported_as_not_fitting(h100):
    config = bert_config(dtype="bfloat16")
    config.data.vocab_size = 40_000_000   # 5.1e9 parameters: 82 GB with Adam
    report = aot.compile_experiment(config, h100, eval_step=False)
    assert not report.fits
    assert report.train.total_bytes > topologies.GPUS["h100"].memory_bytes


@pytest.mark.slow
def test_the_largest_batch_that_fits_is_found_by_compiling():
    """Two CPU devices with room for exactly the step at 16 rows each: doubling
    from 16 stops at 32, which does not fit; a search capped at 16 says its
    answer is a floor. (The search is the same for every platform; the CPU
    compiles fastest.)"""
    config = with_mesh(bert_config(), (2, 1, 1))
    cpus = topologies.Target("cpu-2", "cpu", tuple(jax.devices()[:2]), "CPU", 0, 0.0)
    need = aot.compile_experiment(aot.with_per_device_batch(config, 16, 2), cpus,
                                  eval_step=False).train.total_bytes
    room_for_16 = dataclasses.replace(cpus, memory_bytes=need)
    found = aot.find_max_batch(config, room_for_16, start=16, bisect=False)
    assert (found.per_device, found.reached_limit) == (16, False)
    assert found.report.train.total_bytes == need and found.report.global_batch == 32
    capped = aot.find_max_batch(config, room_for_16, start=16, limit=16)
    assert (capped.per_device, capped.reached_limit) == (16, True)


def test_the_configurations_that_fit_a_global_batch_are_ranked_by_their_bound(monkeypatch):
    """The search over micro-batches, layer forms and meshes, with each
    compile replaced by a made-up report: per device, rows x 3 GB (scanned 2,
    FSDP 1 less) must fit 8 GB; the bound falls with the micro-batch and
    rises 20 ms with FSDP's gathers. Every size compiled that fits is a
    candidate, the fastest first; without alternatives only the configured
    layers and mesh are searched."""
    compiled = []

    def compile_experiment(config, target, eval_step=True):
        fsdp = tuple(config.mesh.shape) == aot.FSDP_MESH
        scan = config.model.scan_layers
        rows = 8 // config.train.grad_accum_steps          # 16 rows a step on 2 devices
        compiled.append((rows, scan, fsdp))
        memory = rows * (2 if scan else 3) - fsdp
        bound = 0.1 / rows + 0.02 * fsdp + 0.001 * scan
        return types.SimpleNamespace(fits=memory <= 8, bound=types.SimpleNamespace(
            bound_s=bound, roofline=None))

    monkeypatch.setattr(aot, "compile_experiment", compile_experiment)
    config = with_mesh(bert_config(scan_layers=False), (2, 1, 1))
    config.train.batch_size = 16
    cpus = topologies.Target("cpu-2", "cpu", tuple(jax.devices()[:2]), "CPU", 0, 0.0)
    fits = aot.fit_global_batch(config, cpus)
    found = [(fit.micro_batch, fit.scan_layers, fit.mesh_shape == aot.FSDP_MESH)
             for fit in fits]
    # 4 rows: 12 GB unscanned (does not fit), 8 scanned, 11 unscanned FSDP, 7 scanned FSDP.
    assert found[0] == (4, True, False) and found[1] == (4, True, True)
    assert sorted(fits, key=lambda fit: fit.bound_s) == fits
    assert set(found) == {(rows, scan, fsdp) for rows, scan, fsdp in compiled
                          if rows * (2 if scan else 3) - fsdp <= 8}
    assert all(fit.micro_batch * fit.grad_accum_steps == 8 for fit in fits)
    compiled.clear()
    alone = aot.fit_global_batch(config, cpus, alternatives=False)
    assert {(scan, fsdp) for _, scan, fsdp in compiled} == {(False, False)}
    assert alone[0].micro_batch == 2 and not alone[0].scan_layers


def test_the_sizing_search_ranks_by_the_per_instruction_bound(monkeypatch):
    """Two micro-batches that fit, whose two bounds disagree: 2 rows has the
    lower step total (9 ms against 10) but the higher per-instruction bound
    (14 ms against 12). The search picks 1 row, by the per-instruction bound;
    where the instructions were not costed (no roofline) it falls back to the
    step total and picks 2 rows."""
    bounds = {2: (0.009, 0.014), 1: (0.010, 0.012)}   # rows: (step total, per instruction)
    with_roofline = True

    def compile_experiment(config, target, eval_step=True):
        rows = 2 // config.train.grad_accum_steps
        total, per_instruction = bounds[rows]
        roofline = types.SimpleNamespace(bound_s=per_instruction) if with_roofline else None
        return types.SimpleNamespace(fits=True, bound=types.SimpleNamespace(
            bound_s=total, roofline=roofline))

    monkeypatch.setattr(aot, "compile_experiment", compile_experiment)
    config = with_mesh(bert_config(scan_layers=False), (2, 1, 1))
    config.train.batch_size = 4
    cpus = topologies.Target("cpu-2", "cpu", tuple(jax.devices()[:2]), "CPU", 0, 0.0)
    fits = aot.fit_global_batch(config, cpus, alternatives=False)
    assert [(fit.micro_batch, fit.bound_s) for fit in fits] == [(1, 0.012), (2, 0.014)]
    with_roofline = False
    fits = aot.fit_global_batch(config, cpus, alternatives=False)
    assert [(fit.micro_batch, fit.bound_s) for fit in fits] == [(2, 0.009), (1, 0.010)]


@pytest.mark.slow
def test_a_global_batch_is_fitted_by_accumulation_and_the_printed_command_trains(
        v5e, tmp_path):
    """64 rows a step on 4 v5e chips (16 each), with one byte too few for 16 rows
    in one pass: the search answers a smaller micro-batch and the accumulation
    that makes up the 16 rows, and the `launch/train.py` command it prints trains
    on this CPU. (The micro-batch it finds is not pinned: with data-parallel
    accumulation the step's memory is not monotone in the micro-batch at this
    size, e.g. 4 rows 17.2 MB and 8 rows 11.5 MB on libtpu.)"""
    overrides = ["--config.train.batch_size=64", "--config.model.num_layers=1",
                 "--config.data.max_seq_length=64", "--config.data.max_predictions_per_seq=10",
                 "--config.data.synthetic_documents=300", "--config.data.eval_examples=64"]
    config = bert_config()
    config.train.batch_size, config.train.grad_accum_steps = 64, 1
    whole = aot.compile_experiment(config, v5e, eval_step=False).train.total_bytes
    command = [sys.executable, str(REPO / "launch" / "compile.py"), "--topology=v5e:2x2",
               "--config=experiments/pretrain_bert.py", *overrides, "--fit_global_batch",
               f"--memory_gib={(whole - 1) / aot.GiB!r}", "--nofit_alternatives"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    rows, accum = map(int, re.search(r"best: (\d+) rows per device a micro-batch, "
                                     r"grad_accum_steps=(\d+)", done.stdout).groups())
    assert rows * accum == 16 and accum > 1
    assert re.search(r"projected from FLOPs at 50% MFU.*chip-hours", done.stdout)
    # The search ranks by the per-instruction roofline, and the projection uses it.
    assert re.search(r"projected at the per-instruction bound .*: [\d.]+ h", done.stdout)
    run = next(line for line in done.stdout.splitlines() if line.startswith("run: "))
    train = [sys.executable if arg == "python" else arg for arg in shlex.split(run[5:])]
    assert f"--config.train.grad_accum_steps={accum}" in train
    assert train[-1] == "--workdir=WORKDIR"
    train[-1] = f"--workdir={tmp_path / 'run'}"
    train += ["--config.train.num_steps=2", "--config.train.log_every=1",
              "--config.train.eval_every=2", "--config.train.checkpoint_every=2",
              "--config.optimizer.warmup_steps=1"]
    trained = subprocess.run(train, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert trained.returncode == 0, trained.stderr
    assert (tmp_path / "run" / "checkpoints" / "2").is_dir()


def test_a_gpu_step_may_use_the_share_of_memory_jax_takes(monkeypatch):
    """JAX's allocator takes 75% of a GPU unless XLA_CLIENT_MEM_FRACTION (or its
    older name) says otherwise; a step is judged against that share."""
    card = topologies.GPUS["h100"].memory_bytes
    for variable in topologies.MEMORY_FRACTION_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    assert accelerator("h100-2").memory_bytes == int(0.75 * card)
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")
    assert accelerator("h100-2").memory_bytes == int(0.9 * card)
    monkeypatch.setenv("XLA_CLIENT_MEM_FRACTION", "1.5")
    with pytest.raises(UserError, match="XLA_CLIENT_MEM_FRACTION='1.5'"):
        accelerator("h100-2")


# ----------------------------------------------------------------------------
# The shapes the steps are lowered with are those of the real batches.


def test_batch_spec_is_the_shape_of_real_batches(tmp_path):
    config = translation_config(data_dir=str(tmp_path / "tfds"))
    real = build_task(config, str(tmp_path / "w"))
    abstract = build_task(config, None, abstract=True)
    batch = next(iter(real.train_iterator(0, 1)))
    spec = abstract.batch_spec(train=True)
    assert {k: (v.shape, v.dtype) for k, v in spec.items()} == {
        k: (np.shape(v), np.asarray(v).dtype) for k, v in batch.items()}
    evaluation = next(iter(real.eval_batches(0, 1)))
    assert {k: v.shape for k, v in abstract.batch_spec(train=False).items()} == {
        k: np.shape(v) for k, v in evaluation.items()}
    assert jax.tree.structure(abstract.model_config) == jax.tree.structure(
        real.model_config) and abstract.model_config == real.model_config


@pytest.mark.slow
def test_a_cpu_machine_with_the_accelerator_plugins_starts_quietly():
    """Both plugins are installed here, without their hardware: the launchers'
    start-up keeps JAX to the CPU, so neither prints its failed start (in a
    user's environment: none of the compile-only variables the tests set)."""
    script = ("from bert_jax.training import distributed; distributed.select_platforms(); "
              "import jax; print(jax.devices()[0].platform)")
    env = {k: v for k, v in os.environ.items()
           if k not in topologies.COMPILE_ONLY_ENVIRONMENT}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "cpu", done.stderr
    assert "cuInit" not in done.stderr and "TPU" not in done.stderr, done.stderr
