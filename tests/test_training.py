"""The training engine end to end: the tiny experiment, exact resume after
kill -9, preemption (SIGTERM), two processes, evaluation-only, bad inputs."""

import contextlib
import errno
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time

from flax import traverse_util
import jax
import ml_collections
import numpy as np
import pytest

from bert_jax.errors import ConfigError
from bert_jax.training import evaluation, trainer
from bert_jax.training.checkpoints import CheckpointError, Checkpointer
from bert_jax.training.evaluation import evaluate_checkpoint
from bert_jax.training.workdir import LOCK_FILE, read_metrics
from bert_jax.training.workdir_lock import WorkdirLock

from helpers import REPO, RUN_AS_SCRIPT, finish, flags_for, free_port, launch, losses, tiny_config


def saved_params(workdir, step):
    """The parameters of a checkpoint, as numpy."""
    from bert_jax.training.checkpoints import _params_location
    import orbax.checkpoint as ocp
    directory, _ = _params_location(os.path.join(workdir, "checkpoints", str(step)))
    return ocp.PyTreeCheckpointer().restore(directory)["params"]


# ----------------------------------------------------------------------------
# End to end.


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir):
    """The tiny experiment trained in-process on the 8 test devices."""
    workdir = str(tmp_path_factory.mktemp("tiny"))
    config = tiny_config(data_dir)
    start = time.perf_counter()
    logged = trainer.train_and_evaluate(config, workdir)
    return workdir, config, logged, time.perf_counter() - start


@pytest.mark.slow
def test_tiny_experiment_trains_end_to_end(trained):
    workdir, config, logged, _ = trained
    metrics = read_metrics(workdir)
    evals = [m for m in metrics if "eval/nll" in m]
    assert [m["step"] for m in evals] == [100, 200, 300]
    assert evals[-1]["eval/nll"] < 0.5 * evals[0]["eval/nll"]
    assert logged["eval/accuracy"] > 0.8  # chance is 1/32
    # Beam-search translations of 64 validation examples, scored by sacreBLEU.
    assert evals[-1]["eval/bleu"] > 80 and evals[-1]["eval/bleu"] > evals[0]["eval/bleu"]
    samples = [json.loads(line) for line in open(os.path.join(workdir, "samples", "300.jsonl"))]
    assert len(samples) == 64 and set(samples[0]) == {"source", "reference", "hypothesis"}
    assert samples[0]["reference"] == " ".join(reversed(samples[0]["source"].split()))
    line = metrics[-1]
    for key in ("perf/steps_per_second", "perf/tokens_per_second", "perf/mfu",
                "perf/eta_seconds"):
        assert line[key] >= 0
    assert json.load(open(os.path.join(workdir, "config.json")))["model"]["hidden_size"] == 64
    assert any(p.startswith("events.out.tfevents")
               for p in os.listdir(os.path.join(workdir, "tensorboard")))
    # keep_last=2 plus the best (lowest eval/nll) checkpoint.
    assert Checkpointer(workdir, read_only=True).all_steps() == [200, 300]


def files_of(folder) -> dict[str, tuple[int, int]]:
    """relative path -> (size, mtime in ns) of every file and folder under `folder`."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in pathlib.Path(folder).rglob("*")}


@contextlib.contextmanager
def read_only(workdir, tmp_path):
    """`workdir` seen through a folder this process cannot write: for root (whom
    file permissions do not stop) a read-only bind mount, else a copy without
    write permission; `workdir` itself where root may not mount."""
    view, root = tmp_path / "read_only", os.geteuid() == 0
    if root:
        view.mkdir()
        if subprocess.run(["mount", "--bind", str(workdir), str(view)]).returncode:
            yield pathlib.Path(workdir)
            return
    else:
        subprocess.run(["cp", "-a", str(workdir), str(view)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(view)] if root else
                       ["chmod", "-R", "a-w", str(view)], check=True)
        yield view
    finally:
        subprocess.run(["umount", str(view)] if root else ["chmod", "-R", "u+w", str(view)],
                       check=True)


@pytest.mark.slow
def test_evaluate_with_only_the_workdir_reproduces_logged_metrics(trained, tmp_path):
    """...from a read-only workdir, writing only --output and the files beside it."""
    workdir, _, _, _ = trained
    output, before = tmp_path / "eval.json", files_of(workdir)
    with read_only(workdir, tmp_path) as view:
        assert view == pathlib.Path(workdir) or not os.access(view, os.W_OK)
        code, out = finish(launch("evaluate.py", view, {}, devices=8, config=None,
                                  extra=["--step=200", f"--output={output}"]))
    assert code == 0, out
    assert files_of(workdir) == before
    result = json.loads(output.read_text())
    logged = next(m for m in read_metrics(workdir) if m["step"] == 200)
    assert result["step"] == 200
    for key in ("eval/nll", "eval/accuracy", "eval/bleu", "eval/chrf"):
        assert result[key] == logged[key], key
    samples = tmp_path / "eval_files" / "samples" / "200.jsonl"
    assert samples.read_text() == (pathlib.Path(workdir) / "samples" / "200.jsonl").read_text()


@pytest.mark.slow
def test_evaluate_refuses_to_change_the_model(trained):
    workdir, _, _, _ = trained
    code, out = finish(launch("evaluate.py", workdir, {"model.num_layers": 1}, config=None))
    assert code != 0
    assert "config.model.num_layers (2 in " in out and "To evaluate another model" in out
    # The same check in-process, and what evaluation may change.
    changed = evaluation.saved_config(workdir)
    changed.decode.beam_size, changed.data.eval_split = 1, "test"
    assert evaluation.evaluation_config(workdir, changed).decode.beam_size == 1
    changed.data.eval_split, changed.evals = "validation", ("loss",)
    only_loss = evaluation.evaluate_checkpoint(
        evaluation.evaluation_config(workdir, changed), workdir, 300)
    assert sorted(only_loss) == ["eval/accuracy", "eval/nll", "eval/perplexity", "step"]
    changed.data.vocab_size = 64
    with pytest.raises(ConfigError, match=r"config.data.vocab_size \(0 in"):
        evaluation.evaluation_config(workdir, changed)
    changed = evaluation.saved_config(workdir)
    changed.train.batch_size = 0
    with pytest.raises(ConfigError, match=r"config.train.batch_size=0"):
        evaluation.evaluation_config(workdir, changed)


def _parallel_corpus(folder, stems: dict[str, int], seed: int) -> None:
    """`{stem}.src` / `{stem}.tgt` files: sentences of made-up words and their
    reversal in capitals."""
    words = ["ka", "lo", "mi", "nu", "pe", "ra", "si", "tu"]
    rng = np.random.default_rng(seed)
    folder.mkdir()
    for stem, count in stems.items():
        sources = [rng.choice(words, rng.integers(2, 6)) for _ in range(count)]
        (folder / f"{stem}.src").write_text("".join(" ".join(s) + "\n" for s in sources))
        (folder / f"{stem}.tgt").write_text(
            "".join(" ".join(s[::-1]).upper() + "\n" for s in sources))


@pytest.mark.slow
def test_translation_evaluated_on_an_extra_test_split_of_a_corpus_folder(tmp_path, data_dir):
    corpus, extra = tmp_path / "corpus", tmp_path / "extra"
    _parallel_corpus(corpus, {"train": 400, "val": 20}, seed=0)
    _parallel_corpus(extra, {"test_2017": 12}, seed=1)
    config = tiny_config(data_dir, **{"train.num_steps": 20, "train.eval_every": 20,
                                      "train.checkpoint_every": 20, "train.log_every": 10,
                                      "optimizer.warmup_steps": 5})
    config.data.update(dict(builder="parallel_text", source_key="source",
                            target_key="target", vocab_size=40, bleu_examples=8))
    config.data.builder_kwargs = ml_collections.ConfigDict(dict(
        path=str(corpus), source_language="src", target_language="tgt"))
    config.model.vocab_size = 40
    workdir = tmp_path / "run"
    trainer.train_and_evaluate(config, str(workdir))
    code, out = finish(launch(
        "evaluate.py", workdir, {"data.builder_kwargs.path": extra,
                                 "data.eval_split": "test_2017"},
        config=None, extra=[f"--output={tmp_path / 'eval.json'}"]))
    assert code == 0, out
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["step"] == 20 and np.isfinite(result["eval/nll"]) and "eval/bleu" in result
    samples = [json.loads(line) for line in open(tmp_path / "eval_files/samples/20.jsonl")]
    assert [s["source"] for s in samples] == (extra / "test_2017.src").read_text(
        ).splitlines()[:8]
    assert [s["reference"] for s in samples] == (extra / "test_2017.tgt").read_text(
        ).splitlines()[:8]


@pytest.mark.slow
def test_translate_command_matches_the_logged_samples(trained, tmp_path):
    workdir, _, _, _ = trained
    samples = [json.loads(line) for line in open(os.path.join(workdir, "samples",
                                                                "300.jsonl"))][:5]
    source_file = tmp_path / "sources.txt"
    source_file.write_text("".join(s["source"] + "\n" for s in samples))
    before = files_of(workdir)
    with read_only(workdir, tmp_path) as view:
        code, out = finish(launch("translate.py", view, {}, config=None,
                                  extra=["--step=300", f"--input={source_file}"]))
    assert code == 0, out
    assert files_of(workdir) == before
    printed = [line for line in out.splitlines() if not line[:1] in ("I", "W", "E")]
    assert printed == [s["hypothesis"] for s in samples]


# ----------------------------------------------------------------------------
# Exact resume.

RESUME = {"train.num_steps": 200, "train.checkpoint_every": 100, "train.log_every": 5,
          "train.eval_every": 100, "model.dropout_rate": 0.1}


# The tiny experiment with LAMB and the 'poly' schedule (tiny_translate.py has
# no optimizer.name: the trainer reads it with its default), or with the dropout
# bits of XLA's RngBitGenerator.
VARIANT_CONFIG = f"""import sys
sys.path.insert(0, {str(REPO / 'experiments')!r})
import tiny_translate
def get_config():
    config = tiny_translate.get_config()
    {{}}
    return config
"""
VARIANTS = {
    "lamb": "config.optimizer.name, config.optimizer.schedule = 'lamb', 'poly'\n"
            "    config.optimizer.warmup_fraction = 0.1",
    "rbg": "config.train.dropout_prng = 'rbg'"}


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["adamw", "lamb", "rbg"])
def test_kill_and_resume_is_exact(tmp_path, data_dir, variant):
    overrides = {**RESUME, "data.data_dir": data_dir}
    config = "tiny_translate.py"
    if variant in VARIANTS:
        config = tmp_path / f"tiny_{variant}.py"
        config.write_text(VARIANT_CONFIG.format(VARIANTS[variant]))
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    reference = launch("train.py", straight, overrides, config=config)
    # The same run, killed with SIGKILL once its step-100 checkpoint is complete.
    victim = launch("train.py", killed, overrides, config=config)
    deadline = time.time() + 180
    while not (killed / "checkpoints" / "100").is_dir():
        assert victim.poll() is None and time.time() < deadline, victim.communicate()[0]
        time.sleep(0.02)
    victim.send_signal(signal.SIGKILL)
    # A second run on the reference's workdir is refused; the reference goes on unharmed
    # (paused meanwhile, so that it cannot finish before the second run starts).
    while not (straight / LOCK_FILE).is_file() or not (straight / LOCK_FILE).read_text():
        assert reference.poll() is None, reference.communicate()[0]
        time.sleep(0.02)
    reference.send_signal(signal.SIGSTOP)
    try:
        code, out = finish(launch("train.py", straight, overrides, config=config))
    finally:
        reference.send_signal(signal.SIGCONT)
    assert code == 2 and "Traceback" not in out, out
    assert f"pid {reference.pid} on host {socket.gethostname()}" in out.splitlines()[-1]
    code, _ = finish(victim)
    assert code == -signal.SIGKILL, "the run finished before it could be killed"
    assert not (killed / "checkpoints" / "200").is_dir()
    code, out = finish(launch("train.py", killed, overrides, config=config))
    assert code == 0, out
    assert "resumed from" in out
    code, out = finish(reference)
    assert code == 0, out

    assert losses(killed) == losses(straight) and len(losses(straight)) == 40
    jax.tree.map(np.testing.assert_array_equal, saved_params(killed, 200),
                 saved_params(straight, 200))


@pytest.mark.slow
def test_sigterm_saves_and_exits_cleanly(tmp_path, data_dir):
    overrides = {"train.num_steps": 100000, "train.checkpoint_every": 100000,
                 "train.log_every": 10, "data.data_dir": data_dir}
    process = launch("train.py", tmp_path, overrides)
    deadline = time.time() + 180
    while not (tmp_path / "metrics.jsonl").exists() or not losses(tmp_path):
        assert process.poll() is None and time.time() < deadline, process.communicate()[0]
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    code, out = finish(process, timeout=120)
    assert code == 0, out
    steps = Checkpointer(str(tmp_path), read_only=True).all_steps()
    assert len(steps) == 1 and 10 <= steps[0] < 100000
    assert "SIGTERM" in out
    assert not (tmp_path / LOCK_FILE).exists()  # released


def test_a_stale_lock_is_taken_over_and_another_hosts_is_named(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    lock = tmp_path / LOCK_FILE
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid}))
    with WorkdirLock(str(tmp_path)):  # no process holds its flock: taken over
        assert json.loads(lock.read_text())["pid"] == os.getpid()
        with pytest.raises(trainer.WorkdirError, match=f"pid {os.getpid()} on host"):
            WorkdirLock(str(tmp_path))  # held (flock): refused
    assert not lock.exists()
    lock.write_text(json.dumps({"host": "elsewhere", "pid": 12}))  # a shared filesystem
    with pytest.raises(trainer.WorkdirError, match=f"pid 12 on host elsewhere.*delete {lock}"):
        WorkdirLock(str(tmp_path))


@pytest.mark.slow
def test_kill_during_async_save_resumes_from_last_complete(tmp_path):
    script = f"""
import os, signal, sys
import jax.numpy as jnp, numpy as np
sys.path.insert(0, {str(REPO)!r})
from bert_jax.training.checkpoints import Checkpointer
ckpt = Checkpointer({str(tmp_path)!r})
ckpt.save(1, {{"w": jnp.ones((4,))}}, None)
ckpt.wait()
big = {{"w": jnp.asarray(np.random.default_rng(0).normal(size=(64, 1024, 1024)), jnp.float32)}}
ckpt.save(2, big, None)   # asynchronous: returns while the bytes are written
os.kill(os.getpid(), signal.SIGKILL)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=120)
    assert result.returncode == -signal.SIGKILL, result.stderr
    leftovers = [p for p in os.listdir(tmp_path / "checkpoints") if "tmp" in p]
    assert leftovers, "the save finished before the kill; make the state bigger"
    checkpointer = Checkpointer(str(tmp_path))
    assert checkpointer.latest_step() == 1
    import jax.numpy as jnp
    restored = checkpointer.restore(1, {"w": jax.ShapeDtypeStruct((4,), jnp.float32)}, None)
    np.testing.assert_array_equal(restored["w"], np.ones(4))
    checkpointer.close()


# ----------------------------------------------------------------------------
# Two processes.


@pytest.mark.slow
def test_two_processes_match_one_process(tmp_path, data_dir):
    """The text translation experiment at toy size: both processes need the
    vocabulary that process 0 trains (a barrier), and the same numbers."""
    overrides = {"train.num_steps": 12, "optimizer.warmup_steps": 4, "train.log_every": 2,
                 "train.eval_every": 12, "train.checkpoint_every": 12,
                 "train.batch_size": 16, "data.data_dir": data_dir,
                 "data.builder_kwargs.num_train": 400, "data.builder_kwargs.num_validation": 32,
                 "data.builder_kwargs.num_test": 8, "data.bleu_examples": 8,
                 "model.hidden_size": 32, "model.mlp_dim": 64, "model.num_layers": 1,
                 "decode.batch_size": 8, "decode.beam_size": 2}
    single = launch("train.py", tmp_path / "one", overrides, devices=4, config="translate.py")
    port = free_port()
    multi = [launch("train.py", tmp_path / "two", overrides, devices=2, config="translate.py",
                    extra=[f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
                           f"--process_id={i}"]) for i in range(2)]
    for process in [single, *multi]:
        code, out = finish(process, timeout=180)
        assert code == 0, out
    one, two = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    assert [m["step"] for m in one] == [m["step"] for m in two]
    for a, b in zip(one, two):
        for key in ("train/loss", "train/grad_norm", "eval/nll", "eval/bleu"):
            if key in a:
                np.testing.assert_allclose(a[key], b[key], rtol=1e-5, err_msg=key)


# ----------------------------------------------------------------------------
# Bad inputs.


def test_unwritable_workdir(tmp_path, data_dir, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(trainer.WorkdirError, match=f"--workdir={blocker / 'run'}"):
        trainer.prepare_workdir(str(blocker / "run"), tiny_config(data_dir))
    with pytest.raises(trainer.WorkdirError, match="gs://bucket/run"):
        trainer.prepare_workdir("gs://bucket/run", tiny_config(data_dir))
    monkeypatch.setattr(os, "access", lambda *a, **k: False)
    with pytest.raises(trainer.WorkdirError, match=str(tmp_path / "run")):
        trainer.prepare_workdir(str(tmp_path / "run"), tiny_config(data_dir))


@pytest.mark.slow
def test_incompatible_config_in_workdir(trained):
    workdir, config, _, _ = trained
    changed = tiny_config(config.data.data_dir, **{"model.hidden_size": 32})
    with pytest.raises(trainer.WorkdirError, match=r"model.hidden_size: 64 in the workdir, 32"):
        trainer.train_and_evaluate(changed, workdir)
    # Nothing was touched: evaluation of the saved run still works.
    assert evaluate_checkpoint(config, workdir, 300)["step"] == 300


@pytest.mark.slow
def test_checkpoint_of_another_model_is_refused_naming_the_arrays(trained):
    workdir, config, _, _ = trained
    changed = tiny_config(config.data.data_dir, **{"model.mlp_dim": 96})
    with pytest.raises(CheckpointError, match=r"(?s)mis-shaped.*mlp/intermediate/kernel: "
                       r"checkpoint \(64, 128\) vs model \(64, 96\)"):
        evaluate_checkpoint(changed, workdir, 300)
    # Missing and unexpected arrays are refused too (inference restores strictly).
    fewer_layers = tiny_config(config.data.data_dir, **{"model.num_layers": 1})
    with pytest.raises(CheckpointError, match=r"(?s)parameters the model does not have "
                       r"\(42\): decoder/layer_1/"):
        evaluation.restore_for_inference(fewer_layers, workdir, 300)
    more_layers = tiny_config(config.data.data_dir, **{"model.num_layers": 3})
    with pytest.raises(CheckpointError, match=r"(?s)parameters the checkpoint lacks "
                       r"\(\d+\): decoder/layer_2/"):
        evaluation.restore_for_inference(more_layers, workdir, 300)


def _copy_with_checkpoint(workdir, folder, step, params) -> str:
    """A copy of `workdir` with one more checkpoint, `step`, of `params` alone."""
    shutil.copytree(workdir, folder)
    checkpointer = Checkpointer(str(folder), keep_last=100, async_saves=False)
    checkpointer.save(step, {"params": jax.tree.map(jax.numpy.asarray, params)}, None)
    checkpointer.close()
    return str(folder)


@pytest.mark.slow
def test_average_is_the_float32_mean_in_each_leafs_dtype_and_sharding(trained, tmp_path):
    from bert_jax.training.averaging import average_params, average_workdir
    from bert_jax.training.checkpoints import restore_params
    workdir, config, _, _ = trained
    saved = {step: saved_params(workdir, step) for step in (200, 300)}
    saved[400] = jax.tree.map(lambda x: x * np.float32(0.3) - np.float32(0.7), saved[300])
    run = _copy_with_checkpoint(workdir, tmp_path / "run", 400, saved[400])
    sharded = config.copy_and_resolve_references()
    sharded.mesh.shape = (2, 2, 2)  # fsdp and tensor axes shard the parameters
    averaged, steps = average_workdir(sharded, run, str(tmp_path / "avg"), last=3)
    expected = jax.tree.map(lambda a, b, c: (a + b + c) / np.float32(3), *saved.values())
    assert steps == [200, 300, 400] and os.listdir(tmp_path / "avg" / "checkpoints") == ["400"]
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(averaged), expected)
    _, _, abstract = evaluation.abstract_params(sharded, run)
    assert jax.tree.map(lambda x: x.sharding, averaged) == jax.tree.map(
        lambda s: s.sharding, abstract)
    assert any(x.sharding.shard_shape(x.shape) != x.shape for x in jax.tree.leaves(averaged))
    # What init_from restores from the folder is the average, every parameter.
    restored, _, missing = restore_params(str(tmp_path / "avg"), abstract)
    assert missing == []
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored), expected)
    # A bfloat16 leaf is averaged in float32 and rounded once, to bfloat16.
    kernel = ("encoder", "layer_0", "mlp", "intermediate", "kernel")
    abstract = traverse_util.flatten_dict(abstract)
    abstract[kernel] = abstract[kernel].update(dtype=jax.numpy.bfloat16)
    mixed = traverse_util.flatten_dict(average_params(
        [os.path.join(run, "checkpoints", str(s)) for s in (300, 400)],
        traverse_util.unflatten_dict(abstract)))
    assert mixed[kernel].dtype == jax.numpy.bfloat16
    mean = (traverse_util.flatten_dict(saved[300])[kernel]
            + traverse_util.flatten_dict(saved[400])[kernel]) / np.float32(2)
    np.testing.assert_array_equal(mixed[kernel], mean.astype(jax.numpy.bfloat16))


@pytest.mark.slow
def test_averaging_refuses_a_checkpoint_of_another_model_naming_the_array(trained, tmp_path):
    from bert_jax.training.averaging import average_workdir
    workdir, config, _, _ = trained
    params = traverse_util.flatten_dict(saved_params(workdir, 300))
    kernel = ("decoder", "layer_1", "mlp", "output", "kernel")
    params[kernel] = params[kernel][:-1]
    run = _copy_with_checkpoint(workdir, tmp_path / "run", 400,
                                traverse_util.unflatten_dict(params))
    output = tmp_path / "avg"
    with pytest.raises(CheckpointError, match=r"(?s)checkpoints/400/state.*mis-shaped.*"
                       r"decoder/layer_1/mlp/output/kernel: checkpoint \(127, 64\)"):
        average_workdir(config, run, str(output), steps=[300, 400])
    assert not output.exists()
    with pytest.raises(CheckpointError,
                       match=r"steps \[100, 300\] of .* holds steps \[200, 300, 400\]"):
        average_workdir(config, run, str(output), steps=[100, 300])
    with pytest.raises(CheckpointError, match="the last 4 checkpoints"):
        average_workdir(config, run, str(output), last=4)
    with pytest.raises(trainer.WorkdirError,
                       match="--save_average=.*/run lies inside --workdir="):
        average_workdir(config, run, run, last=2)


@pytest.mark.slow
def test_evaluate_averages_into_a_workdir_that_evaluate_and_translate_read(trained, tmp_path):
    workdir, _, _, _ = trained
    average, output = tmp_path / "avg", tmp_path / "eval.json"
    code, out = finish(launch("evaluate.py", workdir, {"evals": '("loss",)'}, config=None,
                              extra=["--average_last=2", f"--save_average={average}",
                                     f"--output={output}"]))
    assert code == 0, out
    result = json.loads(output.read_text())
    assert result["step"] == 300 and result["averaged_steps"] == [200, 300]
    assert result["eval/accuracy"] > 0.5  # chance: 1/32
    assert json.load(open(average / "average.json"))["steps"] == [200, 300]
    # What evaluate.py and translate.py --workdir=AVG restore: the mean.
    config = evaluation.saved_config(str(average))
    _, _, params, step = evaluation.restore_for_inference(config, str(average))
    assert step == 300
    jax.tree.map(lambda a, b, mean: np.testing.assert_array_equal((a + b) / 2, mean),
                 saved_params(workdir, 200), saved_params(workdir, 300), jax.device_get(params))


@pytest.mark.slow
def test_corrupted_checkpoint_is_reported_and_kept(tmp_path, data_dir):
    overrides = {"train.num_steps": 20, "train.checkpoint_every": 10, "train.log_every": 10,
                 "train.eval_every": 20, "optimizer.warmup_steps": 5}
    config = tiny_config(data_dir, **overrides)
    trainer.train_and_evaluate(config, str(tmp_path))
    state_dir = tmp_path / "checkpoints" / "20" / "state"
    for path in state_dir.rglob("*"):
        if path.is_file() and path.stat().st_size > 100:
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # truncate
    before = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    resumed = tiny_config(data_dir, **{**overrides, "train.num_steps": 30})
    with pytest.raises(CheckpointError, match=r"(?s)cannot restore .*checkpoints/20.*available: "
                                              r"\[10, 20\]"):
        trainer.train_and_evaluate(resumed, str(tmp_path))
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == before


FULL_DISK = """
import os, resource, runpy, signal, sys
from bert_jax.training.checkpoints import Checkpointer
save = Checkpointer.save
def save_on_a_full_disk(self, step, *args, **kwargs):  # writes after the first save fail
    if step > 10:
        self.wait()  # for step 10's files
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, resource.RLIM_INFINITY))
    return save(self, step, *args, **kwargs)
Checkpointer.save = save_on_a_full_disk
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
""" + RUN_AS_SCRIPT


@pytest.mark.slow
def test_a_failed_save_stops_the_run_with_one_line(tmp_path, data_dir):
    overrides = {"train.num_steps": 30, "train.checkpoint_every": 10, "train.log_every": 10,
                 "train.eval_every": 100, "optimizer.warmup_steps": 5,
                 "data.data_dir": data_dir}
    result = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(REPO / "launch" / "train.py"),
         f"--config={REPO / 'experiments' / 'tiny_translate.py'}", f"--workdir={tmp_path}",
         *flags_for(overrides)], capture_output=True, text=True, cwd=REPO, timeout=240,
        env={**os.environ, "JAX_PLATFORMS": "cpu",
             "XLA_FLAGS": "--xla_force_host_platform_device_count=1"})
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    error = [line for line in result.stderr.splitlines() if not line[:1] in ("I", "W")]
    assert len(error) == 1, error
    assert error[0].startswith(f"error: cannot save the checkpoint of step 20 in "
                               f"{tmp_path}/checkpoints") and " free of " in error[0]
    assert error[0].endswith("resume from step 10.")
    assert Checkpointer(str(tmp_path), read_only=True).all_steps() == [10]
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(saved_params(tmp_path, 10)))


TENSORSTORE_TEXT = ("INTERNAL: Error writing local file \"/x/d/0a1b\":\nFailed to write 215789 "
                    "bytes to file 8: File too large [os_error_code='27']\n<Future exception=...>")


@pytest.mark.parametrize("failure", [ValueError(TENSORSTORE_TEXT),
                                     OSError(errno.EFBIG, TENSORSTORE_TEXT)])
def test_a_failed_save_is_reported_by_its_os_error_in_one_line(tmp_path, failure):
    """TensorStore's error text runs over several lines and quotes Python reprs, whether
    it comes as a message or as an OSError's strerror: the report names only the OS
    error its code stands for."""
    def fail_to_commit():
        raise failure

    checkpointer = Checkpointer(str(tmp_path), fence=fail_to_commit)
    checkpointer.save(1, {"w": np.ones(3, np.float32)}, None)
    with pytest.raises(CheckpointError) as error:
        checkpointer.check(wait=True)
    message = str(error.value)
    assert "\n" not in message and f"({os.strerror(errno.EFBIG)})" in message
    assert "os_error_code" not in message and message.endswith("start again.")


@pytest.mark.slow
def test_empty_dataset(tmp_path, data_dir):
    config = tiny_config(data_dir)
    config.data.builder_kwargs.num_train = 64
    config.data.builder_kwargs.num_validation = 0
    with pytest.raises(ValueError, match=r"synthetic_reverse.*validation"):
        trainer.train_and_evaluate(config, str(tmp_path))
    assert not (tmp_path / "checkpoints").exists() or not os.listdir(tmp_path / "checkpoints")


@pytest.mark.slow
def test_nan_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, data_dir):
    config = tiny_config(data_dir, **{"train.num_steps": 60, "train.checkpoint_every": 1,
                                      "train.log_every": 1000, "train.eval_every": 1000,
                                      "optimizer.learning_rate": 1e30,
                                      "optimizer.max_grad_norm": 0.0})
    with pytest.raises(FloatingPointError, match=r"NaN/Inf at step (\d+)") as error:
        trainer.train_and_evaluate(config, str(tmp_path))
    bad = int(error.value.args[0].split("step ")[1].split(";")[0])
    last = Checkpointer(str(tmp_path), read_only=True).latest_step()
    assert last is not None and last < bad
    with WorkdirLock(str(tmp_path)):  # released by the NaN stop
        pass
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(saved_params(tmp_path, last)))


@pytest.mark.slow
def test_config_flags_reject_unknown_keys_and_bad_types(tmp_path):
    for flag, message in [("--config.train.num_stepz=5", "num_stepz"),
                          ("--config.train.num_steps=many", "num_steps")]:
        code, out = finish(launch("train.py", tmp_path, {}, extra=[flag]))
        assert code != 0 and message in out, out


# ----------------------------------------------------------------------------
# Restoring into another mesh; params-only restore.


@pytest.mark.slow
def test_restore_into_a_different_mesh(tmp_path):
    from bert_jax.modeling import BertForTokenClassification, bert_preset
    from bert_jax.training.train_step import abstract_like
    from bert_jax.training.optimizer import make_optimizer
    from bert_jax.training.sharding import make_mesh
    from bert_jax.training.train_step import create_train_state

    model = BertForTokenClassification(bert_preset(
        "tiny", hidden_size=32, num_heads=4, mlp_dim=64, vocab_size=96, max_len=16))
    ids = np.zeros((1, 8), np.int32)

    def state_on(shape, seed):
        return create_train_state(lambda r: model.init(r, ids), model.apply,
                                  make_optimizer("adamw", 1e-3), make_mesh(shape),
                                  jax.random.PRNGKey(seed))[0]

    saved = state_on((8, 1, 1), seed=0)
    checkpointer = Checkpointer(str(tmp_path))
    checkpointer.save(1, saved, None)
    checkpointer.wait()
    target = state_on((2, 2, 2), seed=1)  # other values, other layout
    restored = checkpointer.restore(1, abstract_like(target), None)
    checkpointer.close()
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored.params),
                 jax.device_get(saved.params))
    kernel = restored.params["bert"]["encoder"]["layer_0"]["mlp"]["intermediate"]["kernel"]
    assert kernel.sharding.shard_shape(kernel.shape) == (16, 32)  # fsdp=2, tensor=2


@pytest.mark.slow
def test_params_only_restore_tolerates_new_heads(tmp_path):
    from bert_jax.convert import save_pretrained
    from bert_jax.modeling import BertForSequenceClassification, BertModel, bert_preset
    from bert_jax.training.checkpoints import restore_params
    from bert_jax.training.train_step import abstract_like

    config = bert_preset("tiny", hidden_size=32, num_heads=4, mlp_dim=64, vocab_size=96,
                         max_len=16)
    ids = np.zeros((1, 8), np.int32)
    encoder = BertModel(config).init(jax.random.PRNGKey(0), ids)["params"]
    save_pretrained(str(tmp_path / "pretrained"), config, {"bert": encoder})
    import flax.linen as nn
    new = nn.meta.unbox(BertForSequenceClassification(config, num_labels=3).init(
        jax.random.PRNGKey(1), ids)["params"])
    restored, names, missing = restore_params(str(tmp_path / "pretrained"),
                                              abstract_like(new))
    assert sorted(missing) == ["classifier/bias", "classifier/kernel"]
    assert len(names) == len(jax.tree.leaves(encoder)) and "classifier" not in restored
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored["bert"]),
                 jax.device_get(nn.meta.unbox(encoder)))


@pytest.mark.slow
def test_init_from_a_trained_workdir(trained, tmp_path):
    workdir, config, _, _ = trained
    config = tiny_config(config.data.data_dir, **{
        "train.num_steps": 10, "train.log_every": 1, "train.eval_every": 10,
        "optimizer.warmup_steps": 5})
    config.init_from = workdir
    trainer.train_and_evaluate(config, str(tmp_path))
    report = json.load(open(tmp_path / "init_from.json"))
    assert report["initialised"] == [] and len(report["restored"]) > 10
    first_loss = read_metrics(str(tmp_path))[0]["train/loss"]
    assert first_loss < 0.5  # from scratch it is about ln(32) = 3.5
