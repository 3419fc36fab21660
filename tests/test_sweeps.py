"""Sweeps (bert_jax/analysis/sweeps/, launch/sweep.py): points (Python helpers
and the one-line spec) and their errors, key validation, run names, launcher
commands, and a real tiny sweep of experiments/tiny_translate.py (tables,
plots, skip of finished runs, resume of an interrupted one)."""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import io
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest
from absl import flags
from ml_collections import config_flags

from bert_jax.analysis import sweeps
from bert_jax.analysis.sweeps import parse_sweep, run_name
from bert_jax.errors import ConfigError

REPO = pathlib.Path(__file__).resolve().parents[1]
TINY = "experiments/tiny_translate.py"


def _load(path: pathlib.Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_config():
    return _load(REPO / TINY, "tiny_translate_for_sweeps").get_config()


# -- points --------------------------------------------------------------------


def test_product_varies_the_last_axis_fastest():
    points = parse_sweep("model.num_heads=1,2,4,8 x model.num_layers=1,2")
    assert len(points) == 8
    assert points[:3] == [{"model.num_heads": 1, "model.num_layers": 1},
                          {"model.num_heads": 1, "model.num_layers": 2},
                          {"model.num_heads": 2, "model.num_layers": 1}]
    assert parse_sweep("a=1,2 * b=3") == parse_sweep("a=1,2 x b=3") == [
        {"a": 1, "b": 3}, {"a": 2, "b": 3}]


def test_zip_pairs_values():
    assert parse_sweep("a=1,2 + b=3,4") == [{"a": 1, "b": 3}, {"a": 2, "b": 4}]
    assert parse_sweep("a = 1, 2 + b=3,4 + c=x,y")[1] == {"a": 2, "b": 4, "c": "y"}


def test_zip_binds_tighter_than_product():
    points = parse_sweep("a=1,2 + b=3,4 x c=5,6")
    assert points == [{"a": 1, "b": 3, "c": 5}, {"a": 1, "b": 3, "c": 6},
                      {"a": 2, "b": 4, "c": 5}, {"a": 2, "b": 4, "c": 6}]
    points = parse_sweep("c=5,6 x a=1,2 + b=3,4")
    assert points[1] == {"c": 5, "a": 2, "b": 4} and len(points) == 4


def test_values_are_literals_or_plain_strings():
    (point,) = parse_sweep("i=-3 x f=1e-3 x t=True x u=false x n=None x s=unigram x "
                           "q='a b, c' x d=\"x+y\" x tup=(1, 4,1) x p=/tmp/a-b.txt")
    assert point == {"i": -3, "f": 0.001, "t": True, "u": False, "n": None,
                     "s": "unigram", "q": "a b, c", "d": "x+y", "tup": (1, 4, 1),
                     "p": "/tmp/a-b.txt"}
    assert [type(p["v"]) for p in parse_sweep("v=1,1.0,'1'")] == [int, float, str]
    assert parse_sweep("m=(1,2),(3,4)") == [{"m": (1, 2)}, {"m": (3, 4)}]


def test_python_helpers_give_the_same_points_as_the_spec():
    heads = sweeps.sweep("model.num_heads", [1, 2, 4, 8])
    layers = sweeps.sweep("model.num_layers", [1, 2])
    assert sweeps.product(heads, layers) == \
        parse_sweep("model.num_heads=1,2,4,8 x model.num_layers=1,2")
    a, b, c = (sweeps.sweep(k, v) for k, v in (("a", [1, 2]), ("b", [3, 4]), ("c", [5])))
    assert sweeps.product(sweeps.zip(a, b), c) == parse_sweep("a=1,2 + b=3,4 x c=5")
    assert sweeps.load_sweep("experiments/translate.py") == \
        sweeps.product(heads, layers)   # the heads x layers sweep of docs/RESULTS.md


@pytest.mark.parametrize("spec, name", [
    ("", "empty"),
    ("   ", "empty"),
    ("model.num_heads", "'model.num_heads'"),
    ("a=1 x model.num_heads", "'model.num_heads'"),
    ("2a=1", "'2a=1'"),
    ("a=1,,2", "'' of a"),
    ("a=1 b=2", "'1 b=2' of a"),
    ("a=1,2 + b=3,4,5", "[2, 3] (a; b)"),
    ("a=1,2 x b=3 x a=4", "'a'"),
    ("x a=1", "'x a=1'"),
])
def test_errors_name_the_axis(spec, name):
    with pytest.raises(ConfigError) as info:
        parse_sweep(spec)
    assert name in str(info.value)


def test_unknown_keys_are_rejected_with_the_nearest_ones():
    config = tiny_config()
    points = parse_sweep("model.num_layers=1,2 x model.num_head=1,2")
    for points, key, nearest in (
            (points, "model.num_head", "model.num_heads"),
            (parse_sweep("modle.num_heads=1"), "modle.num_heads", "model.num_heads"),
            ([{"train.batch_size.x": 1}], "train.batch_size.x", "train.batch_size")):
        with pytest.raises(ConfigError) as info:
            sweeps.validate(points, config)
        assert repr(key) in str(info.value) and nearest in str(info.value).split(";")[1]
    with pytest.raises(ConfigError, match="num_heads"):
        sweeps.validate(parse_sweep("model.num_heads=two"), config)
    # Good keys pass, sections' children included; ints widen to float fields.
    sweeps.validate(parse_sweep("data.builder_kwargs.num_train=8 x "
                                "optimizer.learning_rate=1,2e-3 x mesh.shape=(1,1,1)"),
                    config)
    assert sweeps.apply_overrides(config, {"optimizer.learning_rate": 1}) \
        .optimizer.learning_rate == 1.0
    assert config.optimizer.learning_rate == 3e-3  # the base is left alone


def test_run_names_are_stable_readable_safe_and_unique():
    assert run_name({"model.num_heads": 2, "model.num_layers": 1}) == \
        "num_heads=2,num_layers=1"
    assert run_name({"model.num_layers": 1, "model.num_heads": 2}) == \
        "num_heads=2,num_layers=1"  # key order does not matter
    assert run_name({"model.dropout_rate": 0.1, "optimizer.learning_rate": 1e-3}) == \
        "dropout_rate=0.1,learning_rate=0.001"
    assert run_name({"a.rate": 1, "b.rate": 2}) == "a.rate=1,b.rate=2"
    assert run_name({}) == "base"
    spec = ("model.num_heads=1,2,4,8 x model.num_layers=1,2 x "
            "data.vocab_type='a b','a/b','a_b' x mesh.shape=(1,1,1),(2,1,1)")
    names = [run_name(p) for p in parse_sweep(spec)]
    assert len(set(names)) == len(names) == 48
    assert names == [run_name(dict(p)) for p in parse_sweep(spec)]  # stable
    for name in names:
        assert re.fullmatch(r"[A-Za-z0-9._=,+-]+", name) and len(name) <= 80
    assert run_name({"data.vocab_type": "a b"}) != run_name({"data.vocab_type": "a_b"})
    long = run_name({f"k{i}": "v" * 20 for i in range(8)})
    assert len(long) <= 80 and re.search(r"-[0-9a-f]{8}$", long)


def test_get_sweep_in_a_config_file(tmp_path):
    path = tmp_path / "swept.py"
    path.write_text(
        f"import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('t', {str(REPO / TINY)!r})\n"
        f"m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        f"get_config = m.get_config\n"
        f"def get_sweep(arg=None):\n"
        f"    if arg == 'list':\n"
        f"        return [{{'model.num_heads': 1}}, {{'model.num_heads': 2}}]\n"
        f"    return 'model.num_heads=1,2 x model.num_layers=1'\n")
    assert sweeps.load_sweep(str(path)) == [
        {"model.num_heads": 1, "model.num_layers": 1},
        {"model.num_heads": 2, "model.num_layers": 1}]
    assert sweeps.load_sweep(f"{path}:list") == [{"model.num_heads": 1},
                                                 {"model.num_heads": 2}]
    with pytest.raises(ConfigError, match="get_sweep"):
        sweeps.load_sweep(str(REPO / TINY))


# -- launcher commands ---------------------------------------------------------------

AWKWARD = "it's \"quoted\" $HOME ; a,b"


def _parse_train_flags(argv: list[str]):
    """launch/train.py's own parsing of its flags (config_flags), in a fresh registry."""
    values, argv = flags.FlagValues(), ["train.py", *argv]
    config_flags.DEFINE_config_file("config", None, "", flag_values=values,
                                    lock_config=True, sys_argv=argv)
    flags.DEFINE_string("workdir", None, "", flag_values=values)
    values(argv)
    return values.config, values.workdir


@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")  # config_flags
def test_launcher_commands_round_trip_through_shlex(tmp_path):
    base = {"train.num_steps": 7}
    config = sweeps.apply_overrides(tiny_config(), base)
    points = sweeps.product(sweeps.sweep("model.num_heads", [1, 2]),
                            sweeps.sweep("data.vocab_type", [AWKWARD]),
                            sweeps.sweep("mesh.shape", [(1, 1, 1)]))
    directory = str(tmp_path / "sweep dir")
    sweep = sweeps.Sweep(config, directory, points, config_file=TINY,
                         base_overrides=base, launcher="print")
    out = io.StringIO()
    lines = sweep.launch(out=out)
    assert out.getvalue().splitlines() == lines and len(lines) == 2
    assert (tmp_path / "sweep dir" / "commands.sh").read_text().endswith(lines[-1] + "\n")
    for line, run in zip(lines, sweep.runs):
        argv = shlex.split(line)
        assert argv[:2] == ["python", "launch/train.py"]
        assert f"--workdir={directory}/{run.name}" in argv
        assert "--config.train.num_steps=7" in argv
        assert f"--config.model.num_heads={run.overrides['model.num_heads']}" in argv
        parsed, workdir = _parse_train_flags(argv[2:])
        assert workdir == os.path.join(directory, run.name)
        assert parsed.train.num_steps == 7
        assert parsed.model.num_heads == run.overrides["model.num_heads"]
        assert parsed.data.vocab_type == AWKWARD
        assert tuple(parsed.mesh.shape) == (1, 1, 1)
        assert json.loads((tmp_path / "sweep dir" / run.name / "overrides.json")
                          .read_text())["overrides"]["model.num_heads"] == \
            run.overrides["model.num_heads"]

    tpu_vm = _load(REPO / "launch" / "tpu_vm.py", "tpu_vm_for_sweeps")
    sweep = sweeps.Sweep(config, "/gcs/bucket/sweep", points, config_file=TINY,
                         base_overrides=base, launcher="tpu_vm", tpu_name="tpu-{index}",
                         launcher_flags=["--zone=us-central2-b"])
    for run, argv in zip(sweep.runs, sweep.commands()):
        argv = shlex.split(shlex.join(argv))
        assert argv[:3] == ["python", "launch/tpu_vm.py", "train"]
        args = tpu_vm.parse(argv[2:])
        assert (args.name, args.zone) == (f"tpu-{run.index}", "us-central2-b")
        assert args.train_flags == sweep.train_flags(run)
        assert f"--workdir=/gcs/bucket/sweep/{run.name}" in args.train_flags

    sweep = sweeps.Sweep(config, directory, points, config_file=TINY,
                         base_overrides=base, launcher="slurm",
                         launcher_flags=["--nodes=1", "--gpus-per-node=1"])
    for run, argv in zip(sweep.runs, sweep.commands()):
        argv = shlex.split(shlex.join(argv))
        script = argv.index("launch/slurm_train.sbatch")
        assert argv[0] == "sbatch" and argv[1] == f"--job-name={run.name}"
        assert "--nodes=1" in argv[:script]
        parsed, workdir = _parse_train_flags(argv[script + 1:])
        assert workdir == os.path.join(directory, run.name)
        assert parsed.data.vocab_type == AWKWARD


@pytest.mark.slow
def test_cli_prints_commands_and_rejects_unknown_keys(tmp_path):
    def cli(*args):
        return subprocess.run(
            [sys.executable, "launch/sweep.py", f"--config={TINY}",
             f"--workdir={tmp_path / 'cli'}", *args], cwd=REPO, capture_output=True,
            text=True, timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})

    result = cli("--sweep=model.num_heads=1,2 x model.num_lyers=1",
                 "--launcher=print")
    assert result.returncode == 2, result.stderr
    assert "'model.num_lyers'" in result.stderr and "model.num_layers" in result.stderr
    result = cli("--sweep=model.num_heads=1,2 x model.num_layers=1", "--launcher=print",
                 "--config.train.num_steps=9")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [shlex.split(line)[:2] for line in lines] == [["python", "launch/train.py"]] * 2
    assert shlex.split(lines[1]) == [
        "python", "launch/train.py", f"--config={TINY}",
        f"--workdir={tmp_path / 'cli' / 'num_heads=2,num_layers=1'}",
        "--config.train.num_steps=9", "--config.model.num_heads=2",
        "--config.model.num_layers=1"]


# -- a real tiny sweep ------------------------------------------------------------------

SPEC = "model.num_heads=1,2 x model.num_layers=1"
BASE = {
    "train.num_steps": 20, "train.eval_every": 10, "train.checkpoint_every": 20,
    "train.log_every": 4, "train.batch_size": 16, "optimizer.warmup_steps": 5,
    "data.bleu_examples": 4, "decode.batch_size": 4, "decode.beam_size": 2,
    "data.builder_kwargs.num_train": 256, "data.builder_kwargs.num_validation": 32,
    "peak_flops": 1e12,   # no timed matmul for MFU
}


class CountingTrainer:
    def __init__(self):
        self.calls = []

    def __call__(self, config, workdir):
        from bert_jax.training import trainer
        self.calls.append((os.path.basename(workdir), int(config.train.num_steps)))
        return trainer.train_and_evaluate(config, workdir)


@contextlib.contextmanager
def persistent_compilation_cache(path: str):
    """JAX's persistent compilation cache in `path` for the block: a resumed run
    then loads the executables its first session compiled (same shapes)."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes")
    saved = {name: getattr(jax.config, name) for name in names}
    compilation_cache.reset_cache()
    for name, value in zip(names, (path, 0.0, 0)):
        jax.config.update(name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory):
    with persistent_compilation_cache(str(tmp_path_factory.mktemp("jax_cache"))):
        return _run_tiny_sweep(str(tmp_path_factory.mktemp("sweep")))


def _run_tiny_sweep(directory: str) -> dict:
    base_config = tiny_config()
    first = CountingTrainer()
    # An interrupted point: 10 of its steps (log_every 5: steps 5 and 10 logged).
    partial = {**BASE, "train.num_steps": 10, "train.log_every": 5}
    sweeps.Sweep(sweeps.apply_overrides(base_config, partial), directory,
                 "model.num_heads=1 x model.num_layers=1", config_file=TINY,
                 base_overrides=partial, train_fn=first).run(stop_on_error=True)
    counting = CountingTrainer()
    sweep = sweeps.Sweep(sweeps.apply_overrides(base_config, BASE), directory, SPEC,
                         config_file=TINY, base_overrides=BASE, train_fn=counting)
    outcome = sweep.run(stop_on_error=True)
    rows = sweeps.collect(directory)
    table = sweeps.write_tables(rows, directory)
    paths = sweeps.plot(rows, directory, "eval/bleu")
    return dict(directory=directory, sweep=sweep, first=first, counting=counting,
                outcome=outcome, rows=rows, table=table, paths=paths,
                base_config=base_config)


def _steps(workdir) -> list[int]:
    return [line["step"] for line in sweeps.read_metrics(workdir)]


@pytest.mark.slow
def test_interrupted_run_resumes_from_its_checkpoint(tiny_sweep):
    h1 = os.path.join(tiny_sweep["directory"], "num_heads=1,num_layers=1")
    h2 = os.path.join(tiny_sweep["directory"], "num_heads=2,num_layers=1")
    assert tiny_sweep["first"].calls == [("num_heads=1,num_layers=1", 10)]
    assert tiny_sweep["outcome"] == {"num_heads=1,num_layers=1": "done",
                                     "num_heads=2,num_layers=1": "done"}
    # Resumed: the first session's lines (log_every 5) are kept and the rest
    # continue after step 10 (log_every 4); a fresh start would have logged 4, 8.
    assert _steps(h1) == [5, 10, 12, 16, 20]
    assert _steps(h2) == [4, 8, 10, 12, 16, 20]
    info = json.loads(pathlib.Path(h1, "run.json").read_text())
    assert [(s["first_step"], s["last_step"]) for s in info["sessions"]] == \
        [(0, 10), (10, 20)]
    assert info["status"] == "done" and info["params"] > 0
    assert info["wall_seconds"] == pytest.approx(
        sum(s["seconds"] for s in info["sessions"]))


@pytest.mark.slow
def test_results_tables_and_plots(tiny_sweep):
    directory = pathlib.Path(tiny_sweep["directory"])
    rows = tiny_sweep["rows"]
    assert [r["name"] for r in rows] == ["num_heads=1,num_layers=1",
                                         "num_heads=2,num_layers=1"]
    for row in rows:
        assert row["status"] == "done" and row["step"] == row["num_steps"] == 20
        assert row["params"] == rows[0]["params"] > 0   # heads split the same width
        assert {"eval/bleu", "eval/nll", "eval/accuracy"} <= set(row["metrics"])
        assert row["wall_seconds"] > 0 and row["wall_source"] == "run.json"
        assert row["config"]["model"]["num_heads"] == row["overrides"]["model.num_heads"]
    with open(directory / "results.csv") as f:
        records = list(csv.DictReader(f))
    assert [r["model.num_heads"] for r in records] == ["1", "2"]
    assert {"run", "status", "model.num_layers", "params", "eval/bleu", "eval/nll",
            "step", "wall_seconds"} <= set(records[0])
    table = (directory / "results.md").read_text()
    assert table == tiny_sweep["table"]
    header = table.splitlines()[0]
    assert header.startswith("| run | status | num_heads | num_layers | params | eval/")
    assert "| num_heads=2,num_layers=1 | done | 2 | 1 |" in table
    assert "| 20/20 |" in table
    for kind in ("heatmap", "scatter", "curves"):
        path = pathlib.Path(tiny_sweep["paths"][kind])
        assert path.parent == directory and path.stat().st_size > 1000
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert tiny_sweep["paths"]["heatmap"].endswith("heatmap_eval_bleu.png")


@pytest.mark.slow
def test_relaunch_skips_finished_runs(tiny_sweep):
    directory = tiny_sweep["directory"]
    before = {name: os.path.getmtime(os.path.join(directory, name, "metrics.jsonl"))
              for name in ("num_heads=1,num_layers=1", "num_heads=2,num_layers=1")}
    counting = CountingTrainer()
    sweep = sweeps.Sweep(sweeps.apply_overrides(tiny_sweep["base_config"], BASE),
                         directory, SPEC, config_file=TINY, base_overrides=BASE,
                         train_fn=counting)
    assert sweep.run() == {name: "skipped" for name in before}
    assert counting.calls == []
    for name, mtime in before.items():
        assert os.path.getmtime(os.path.join(directory, name, "metrics.jsonl")) == mtime
    # Nothing left to launch either.
    printer = sweeps.Sweep(sweeps.apply_overrides(tiny_sweep["base_config"], BASE),
                           directory, SPEC, config_file=TINY, base_overrides=BASE,
                           launcher="print")
    assert printer.launch(out=io.StringIO()) == []


@pytest.mark.slow
def test_partial_sweeps_are_reported(tiny_sweep, tmp_path):
    # A wider sweep over the same directory: the new points have not started.
    wide = sweeps.Sweep(sweeps.apply_overrides(tiny_sweep["base_config"], BASE),
                        str(tmp_path), SPEC + ",2", config_file=TINY, base_overrides=BASE,
                        launcher="print")
    wide.launch(out=io.StringIO())
    done = pathlib.Path(tiny_sweep["directory"], "num_heads=1,num_layers=1")
    copied = tmp_path / "num_heads=1,num_layers=1"
    for name in ("run.json", "metrics.jsonl", "config.json", "DONE"):
        (copied / name).write_text((done / name).read_text())
    rows = sweeps.collect(str(tmp_path))
    assert [r["status"] for r in rows] == ["done", "not started", "not started",
                                           "not started"]
    table = sweeps.write_tables(rows, str(tmp_path), metrics=["eval/nll", "eval/missing"])
    assert "| num_heads=2,num_layers=2 | not started | 2 | 2 |  |  |  | 0/20 |  |" in table
    paths = sweeps.plot(rows, str(tmp_path), "eval/nll", x="model.num_layers",
                        y="model.num_heads")
    assert os.path.getsize(paths["heatmap"]) > 1000


def test_a_failing_point_is_recorded_and_the_sweep_goes_on(tmp_path):
    counting = CountingTrainer()
    config = sweeps.apply_overrides(tiny_config(), BASE)
    sweep = sweeps.Sweep(config, str(tmp_path), "model.num_heads=3", config_file=TINY,
                         train_fn=counting, log=lambda line: None)
    assert sweep.run() == {"num_heads=3": "failed"}   # 64 is not divisible by 3
    assert counting.calls == []
    (row,) = sweeps.collect(str(tmp_path))
    assert row["status"] == "failed" and "num_heads=3" in row["error"]
    with pytest.raises(ValueError, match="num_heads=3"):
        sweep.run(stop_on_error=True)
