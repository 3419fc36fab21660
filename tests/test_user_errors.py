"""What a user sees when something they gave is wrong, and the everyday tools:
one-line errors from the launch scripts, early config validation, recovery
from a damaged checkpoint, TensorBoard after a resume, profiler traces,
translate.py's input checks, dataset-build progress lines, model.dtype='auto'."""

import importlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
from absl import flags
from ml_collections import config_flags

from bert_jax.config_schema import check_config
from bert_jax.data import input_lines, sources
from bert_jax.errors import ConfigError, DamagedFileError, DataError, UserError
from bert_jax.tasks import build_task
from bert_jax import auto_dtype
from bert_jax.training import trainer
from bert_jax.training.checkpoints import (
    CheckpointError, check_integrity, digests)
from bert_jax.training.evaluation import evaluate_checkpoint
from bert_jax.training.workdir import read_metrics
from bert_jax.training.sharding import mesh_from_config
from bert_jax.training.validation import check_training_config
from helpers import REPO, finish, launch, tiny_config

import cli
import common_flags

# ----------------------------------------------------------------------------
# The launch scripts: `error: ...`, exit 2, no traceback; bugs keep theirs.


def _config_flags(argv) -> flags.FlagValues:
    """A --config flag as the launch scripts define it, reading `argv`."""
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=values,
                                    lock_config=True, sys_argv=argv)
    return values


def _flag_error(argv) -> str:
    """The error `common_flags.parse_flags` raises for `argv` (cli.run prints it as
    `error: ...`, exit 2: test_train_py_reports_a_bad_flag_in_one_line)."""
    with pytest.raises((flags.Error, UserError)) as error:
        common_flags.parse_flags(argv, _config_flags(argv))
    assert "Traceback" not in str(error.value), error.value
    return str(error.value)


@pytest.mark.parametrize("flag, named", [
    ("--config.no_such=1", ("--config.no_such=1", "'no_such'")),
    ("--config.train.num_stepz=5", ("--config.train.num_stepz=5", "'num_stepz'", "num_steps")),
    ("--config.train.num_steps=many", ("--config.train.num_steps=many",)),
    ("--config.train.batch_size=(1,", ("--config.train.batch_size=(1,",)),
])
@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")  # config_flags
def test_bad_config_flags_are_one_line(flag, named):
    argv = ["train.py", f"--config={REPO / 'experiments' / 'tiny_translate.py'}", flag]
    message = _flag_error(argv)
    assert all(name in message for name in named) and len(message.splitlines()) == 1, message


@pytest.mark.parametrize("overrides", [(), ("--config.train.num_steps=5",)])
@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")  # config_flags
def test_a_missing_config_file_is_named(overrides):
    message = _flag_error(["train.py", "--config=nope.py", *overrides])
    assert message.startswith("--config=nope.py: ") and "no such file" in message, message


@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")  # config_flags
def test_a_syntax_error_in_a_config_file_is_named(tmp_path):
    (tmp_path / "broken.py").write_text("import ml_collections\ndef get_config(:\n")
    argv = ["train.py", f"--config={tmp_path / 'broken.py'}"]
    assert _flag_error(argv).startswith(f"{argv[1]}: {tmp_path / 'broken.py'}:2: ")


@pytest.mark.parametrize("experiment", ["pretrain_bert.py", "tiny_translate.py"])
@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")  # config_flags
def test_an_unknown_experiment_variant_is_one_line(experiment):
    argv = ["train.py", f"--config={REPO / 'experiments' / experiment}:nosuch"]
    message = _flag_error(argv)
    assert message.startswith(f"flag {argv[1]}: ") and "'nosuch'" in message, message
    assert len(message.splitlines()) == 1, message


@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")  # config_flags
def test_a_workdir_without_a_run_is_named(tmp_path):
    """evaluate.py --workdir=DIR reads DIR/config.json while its flags are parsed."""
    argv = ["evaluate.py", f"--config={REPO / 'launch' / 'workdir_config.py'}:{tmp_path}"]
    message = _flag_error(argv)
    assert f"--workdir={tmp_path} " in message and "config.json" in message, message
    assert len(message.splitlines()) == 1, message


@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")  # config_flags
def test_a_damaged_config_json_is_named(tmp_path, data_dir):
    config_json = tmp_path / "config.json"
    config_json.write_text('{"task": "translation", "model": {"hidd')  # a write cut short
    with pytest.raises(DamagedFileError, match=re.escape(str(config_json))):
        trainer.train_and_evaluate(tiny_config(data_dir), str(tmp_path))
    argv = ["evaluate.py", f"--config={REPO / 'launch' / 'workdir_config.py'}:{tmp_path}"]
    message = _flag_error(argv)
    assert str(config_json) in message and len(message.splitlines()) == 1, message


def test_train_py_reports_a_bad_flag_in_one_line(tmp_path):
    code, out = finish(launch("train.py", tmp_path / "run", {}, extra=["--config.no_such=1"]))
    assert code == 2 and out.splitlines()[0].startswith(
        "error: --config.no_such=1: ") and "'no_such'" in out.splitlines()[0], out
    assert out.splitlines()[1:] == ["(--helpshort lists this script's flags)"], out
    assert "Traceback" not in out and not (tmp_path / "run").exists()


def test_train_py_applies_the_config_rules_before_anything_else(tmp_path):
    """The schema's rules (config_schema), every broken one named, at the start."""
    code, out = finish(launch("train.py", tmp_path / "run", {
        "train.dropout_prng": "philox", "optimizer.schedule": "bogus"}))
    assert code == 2 and out.splitlines()[:3] == [
        "error: the config cannot train:",
        "  config.train.dropout_prng='philox': unknown; choose one of ['threefry', 'rbg', "
        "'unsafe_rbg'].",
        "  config.optimizer.schedule='bogus': unknown; choose one of ['constant', 'linear', "
        "'cosine', 'rsqrt', 'poly']."], out
    assert "Traceback" not in out and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_build_pretraining_data_names_missing_files_before_anything_is_written(tmp_path):
    code, out = finish(launch(
        "build_pretraining_data.py", tmp_path / "run",
        {"data.corpus_files": (str(tmp_path / "wiki_000.txt"),),
         "data.vocab_file": str(tmp_path / "vocab.txt")}, config="pretrain_bert.py:base_2018"))
    assert code == 2 and out.splitlines()[-3:] == [
        "error: the config names files that do not exist:",
        f"  config.data.corpus_files={str(tmp_path / 'wiki_000.txt')!r}: no such file or "
        "folder; fix the path.",
        f"  config.data.vocab_file={str(tmp_path / 'vocab.txt')!r}: no such file or folder; "
        "fix the path."], out
    assert "Traceback" not in out and not (tmp_path / "run").exists()


def _run_script(tmp_path, body: str, *args, env=None):
    """Runs a launch-style script whose main is `body` through cli.run."""
    script = tmp_path / "script.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(REPO / 'launch')!r})\n"
        "import cli\n"
        "from absl import flags\n"
        "from bert_jax.errors import UserError\n"
        "flags.DEFINE_integer('restore_step', None, '')\n"
        f"def main(argv):\n    {body}\n"
        "cli.run(main)\n")
    return subprocess.run([sys.executable, str(script), *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, cwd=tmp_path)


def test_user_errors_print_one_line_and_bugs_a_traceback(tmp_path):
    user = _run_script(tmp_path, "raise UserError('step 20 is damaged', "
                       "rerun_with={'restore_step': 10})")
    assert user.returncode == 2 and "Traceback" not in user.stderr
    assert user.stderr.splitlines() == [
        "error: step 20 is damaged",
        f"  python {tmp_path / 'script.py'} --restore_step=10"]
    other = _run_script(tmp_path, "raise UserError('bad', rerun_with={'step': 10})")
    assert other.stderr.splitlines() == ["error: bad"]  # no --step flag: no command
    assert _run_script(tmp_path, "return 3").returncode == 3  # main's exit status
    stray = _run_script(tmp_path, "return 0", "stray")  # no entry point takes arguments
    assert (stray.returncode, stray.stderr) == (2, "error: unexpected arguments: ['stray']\n")
    bug = _run_script(tmp_path, "raise KeyError('oops')")
    assert bug.returncode == 1 and "Traceback" in bug.stderr and "KeyError: 'oops'" in bug.stderr
    for debug in ({"env": {cli.DEBUG_ENV: "1"}}, {"args": ("--debug",)}):
        shown = _run_script(tmp_path, "raise UserError('step 20 is damaged')",
                            *debug.get("args", ()), env=debug.get("env"))
        assert shown.returncode == 1 and "Traceback" in shown.stderr, shown.stderr


def test_a_coordinator_without_the_process_flags_is_a_user_error(tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "launch" / "train.py"), f"--workdir={tmp_path}",
         f"--config={REPO / 'experiments' / 'pretrain_bert.py'}", "--coordinator_address=127.0.0.1:1234", "--process_id=0"],
        capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "needs --num_processes and --process_id" in result.stderr


def test_a_failed_restore_leaves_no_traceback_noise(tmp_path):
    """Once a checkpoint failed, what its abandoned reads report as unraisable, raised
    in Orbax's (or asyncio's) modules, stays off stderr, at exit too; before, and from
    other code (even a file in a folder named orbax), unraisable errors are still
    reported."""
    unraisable = ("class Dying:\n"
                  "    def __init__(self, error):\n"
                  "        self.error = error\n"
                  "    def __del__(self):\n"
                  "        raise self.error\n"
                  "def report(error):\n"
                  "    Dying(error)  # deleted at once: its error goes to sys.unraisablehook\n")
    for module in ("orbax/__init__.py", "orbax/io.py", "lib/orbax/other_io.py"):
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).write_text(unraisable if module.endswith("io.py") else "")
    imports = ("sys.path.append('lib/orbax'); import atexit, other_io, orbax.io as orbax_io; "
               "from bert_jax import noise; ")
    failed = _run_script(
        tmp_path, imports + "orbax_io.report(ValueError('before')); "
        "noise.drop_reports_of_abandoned_io(); "
        "orbax_io.report(RuntimeError('closed loop')); other_io.report(KeyError('other')); "
        "atexit.register(orbax_io.report, ValueError('at exit')); raise UserError('damaged')")
    assert failed.returncode == 2 and failed.stderr.count("Exception ignored") == 2
    assert "ValueError: before" in failed.stderr and "KeyError: 'other'" in failed.stderr
    assert "closed loop" not in failed.stderr and "at exit" not in failed.stderr
    assert failed.stderr.splitlines()[-1] == "error: damaged"


def test_the_resume_command_replaces_the_old_flag():
    argv = ["launch/train.py", "--config=e.py", "--workdir=/tmp/a b", "--restore_step=20"]
    assert cli.command_with({"restore_step": 10}, argv) == (
        "python launch/train.py --config=e.py '--workdir=/tmp/a b' --restore_step=10")


@pytest.mark.parametrize("module, name", [
    ("bert_jax.errors", "ConfigError"),
    ("bert_jax.errors", "DataError"),
    ("bert_jax.errors", "CheckpointError"),
    ("bert_jax.errors", "WorkdirError"),
    ("bert_jax.errors", "MissingFileError"),
    ("bert_jax.errors", "DamagedFileError"),
    ("bert_jax.errors", "TrainingDiverged"),
    ("bert_jax.errors", "DoesNotFit"),
])
def test_the_project_errors_are_user_errors(module, name):
    assert issubclass(getattr(importlib.import_module(module), name), UserError)


def test_a_missing_file_the_user_named_is_a_user_error(tmp_path):
    from bert_jax.convert import load_hf_bert, load_pretrained
    from bert_jax.data import conllu, glue, parallel_text, pretraining_data, wordpiece
    from bert_jax.errors import MissingFileError
    from bert_jax.tasks.bert_backbone import checkpoint_kind
    missing = tmp_path / "none"
    for read in (load_hf_bert, load_pretrained, conllu.read_conllu, checkpoint_kind,
                 lambda path: glue.read_tsv(path, "sst2"),
                 lambda path: next(pretraining_data.iter_documents(path)),
                 lambda path: parallel_text.parallel_text_config(path, "de", "en"),
                 lambda path: wordpiece.WordPiece.from_vocab_file(path)):
        with pytest.raises(MissingFileError, match="none"):  # still a FileNotFoundError
            read(str(missing))


# ----------------------------------------------------------------------------
# Early validation: before anything is written or built.


@pytest.mark.parametrize("overrides, named", [  # the key and value, and the fix's numbers
    ({"train.batch_size": 60}, ("config.train.batch_size=60: ", "(56 or 64)")),
    ({"train.batch_size": 64, "train.grad_accum_steps": 16},
     ("config.train.batch_size=64: ", " 4 rows ", "128")),
    ({"train.batch_size": 64, "train.grad_accum_steps": 3},
     ("config.train.batch_size=64 ", "config.train.grad_accum_steps=3")),
    ({"train.num_steps": 10, "optimizer.warmup_steps": 50},
     ("config.optimizer.warmup_steps=50 ", "config.train.num_steps=10")),
    ({"mesh.shape": (3, -1, 1)}, ("config.mesh.shape=(3, -1, 1): ",)),
    ({"mesh.shape": (2, 2, 1)}, ("config.mesh.shape=(2, 2, 1): ", " 4 ", " 8 ")),
    ({"init_from": "/no/such/checkpoint"}, ("config.init_from='/no/such/checkpoint': ",)),
    ({"train.eval_every": 0}, ("config.train.eval_every=0: ",)),
    ({"train.batch_size": 0}, ("config.train.batch_size=0: ",)),
    ({"train.batch_size": -8}, ("config.train.batch_size=-8: ",)),
    ({"train.profile_steps": (5, 2)}, ("config.train.profile_steps=(5, 2): ",)),
    ({"train.profile_steps": (400, 402)},
     ("config.train.profile_steps=(400, 402): ", "config.train.num_steps=300")),
    ({"optimizer.schedule": "bogus"},
     ("config.optimizer.schedule='bogus': ", "['constant', 'linear', 'cosine', 'rsqrt', "
      "'poly']")),
    ({"optimizer.name": "sgd"}, ("config.optimizer.name='sgd': ", "['adamw', 'lamb']")),
    ({"train.dropout_prng": "philox"},
     ("config.train.dropout_prng='philox': ", "['threefry', 'rbg', 'unsafe_rbg']")),
    ({"optimizer.warmup_fraction": 1.0}, ("config.optimizer.warmup_fraction=1.0: ",)),
    ({"optimizer.learning_rate": -1e-3}, ("config.optimizer.learning_rate=-0.001: ",)),
    ({"evals": ("loss", "nosuch")}, ("config.evals: ", "['nosuch']")),
    ({"data.max_length": 0}, ("config.data.max_length=0: ",)),
    ({"model.num_heads": 3}, ("config.model.num_heads=3: ", "hidden_size=64")),
    ({"model.max_len": 8}, ("config.data.max_length ", "config.model.max_len=8")),
])
def test_config_problems_are_named_before_anything_is_written(tmp_path, data_dir, overrides,
                                                              named):
    """As launch/train.py runs: the schema's rules, then the trainer's checks."""
    config = tiny_config(data_dir)
    for key, value in overrides.items():
        section, _, name = key.rpartition(".")
        (config[section] if section else config)[name] = value
    with pytest.raises(ConfigError) as error:
        check_config(config)
        trainer.train_and_evaluate(config, str(tmp_path / "run"))
    assert all(name in str(error.value) for name in named), error.value
    assert not (tmp_path / "run").exists()


def test_the_task_checked_is_the_task_trained_and_read_nothing_before(tmp_path, data_dir,
                                                                     monkeypatch):
    """One task per run: the checks see it built, its data, vocabulary and model
    not made yet; the train loop then gets that very task."""
    tasks, check = [], trainer.check_training_config
    monkeypatch.setattr(trainer, "check_training_config", lambda task, mesh: (
        tasks.append((task, {"vocab", "model_config", "model"} & set(vars(task)))),
        check(task, mesh)))
    monkeypatch.setattr(trainer, "_train", lambda task, *_: tasks.append((task, None)) or {})
    trainer.train_and_evaluate(tiny_config(data_dir), str(tmp_path / "run"))
    assert len(tasks) == 2 and tasks[0][0] is tasks[1][0] and tasks[0][1] == set()


def test_warmup_fraction_replaces_warmup_steps(data_dir):
    config = tiny_config(data_dir, **{"train.num_steps": 20, "optimizer.warmup_steps": 50})
    config.optimizer.warmup_fraction = 0.3
    check_config(config)  # warmup_steps=50 > 20: not used


def test_a_config_that_fails_to_build_leaves_no_config_json(tmp_path, data_dir):
    """Else the corrected rerun in the same workdir is refused as incompatible."""
    config = tiny_config(data_dir)
    config.data.builder = "synthetic_revers"
    with pytest.raises(DataError, match="synthetic_revers"):
        trainer.train_and_evaluate(config, str(tmp_path / "run"))
    assert not (tmp_path / "run" / "config.json").exists()
    trainer.prepare_workdir(str(tmp_path / "run"), tiny_config(data_dir))  # accepted


def test_a_wrong_evaluation_split_fails_before_training(tmp_path, data_dir):
    config = tiny_config(data_dir)
    config.data.eval_split = "valid"
    with pytest.raises(DataError, match=r"'valid'.*\['train', 'validation'\]"):
        trainer.train_and_evaluate(config, str(tmp_path / "run"))
    assert os.listdir(tmp_path / "run") == []


def test_an_evaluation_error_keeps_the_training_before_it(tmp_path, data_dir):
    config = tiny_config(data_dir, **{"train.num_steps": 10, "train.eval_every": 5,
                                      "train.checkpoint_every": 100, "train.log_every": 5,
                                      "optimizer.warmup_steps": 2, "data.bleu_examples": 0})
    config.evals = ("loss", "classification")  # translation gives no class predictions
    with pytest.raises(UserError, match="config.evals: .*'classification'"):
        trainer.train_and_evaluate(config, str(tmp_path / "run"))
    assert os.listdir(tmp_path / "run" / "checkpoints") == ["5"]  # resume from there


def test_the_checks_hand_the_trainer_the_folder_init_from_names(tmp_path, data_dir,
                                                                monkeypatch):
    """`package:NAME` is resolved once, by the checks: the trainer restores from the
    folder they return ('' without init_from)."""
    from bert_jax.convert import pretrained
    code = tmp_path / "code"
    code.mkdir()
    (code / "counted_backbone.py").write_text(
        f"calls = []\ndef get_model_path():\n    calls.append(1)\n    return {str(tmp_path)!r}\n")
    monkeypatch.syspath_prepend(str(code))
    monkeypatch.setitem(pretrained.BACKBONE_PACKAGES, "counted_backbone",
                        "counted_backbone:get_model_path")
    config = tiny_config(data_dir)
    mesh = mesh_from_config(config.mesh)
    assert check_training_config(build_task(config, None), mesh) == ""
    config.init_from = "package:counted_backbone"
    assert check_training_config(build_task(config, None), mesh) == str(tmp_path)
    assert sys.modules["counted_backbone"].calls == [1]
    del sys.modules["counted_backbone"]


def test_several_problems_are_reported_together(data_dir):
    config = tiny_config(data_dir, **{"train.batch_size": 60, "train.num_steps": 10})
    config.data.builder_kwargs.path = "/no/such/corpus.txt:wikitext"
    with pytest.raises(UserError, match=r"\n  config.optimizer.warmup_steps=\d+ is outside"):
        check_config(config)  # the schema's rules: at the command's start
    with pytest.raises(UserError) as error:  # then the trainer's, all of them
        check_training_config(build_task(config, None), mesh_from_config(config.mesh))
    lines = str(error.value).splitlines()
    assert len(lines) == 3, lines
    assert any(line.startswith("  config.data.builder_kwargs.path=") for line in lines)


# ----------------------------------------------------------------------------
# A real tiny run: recovery, TensorBoard, profiles, translation input.

RUN = {"train.num_steps": 20, "train.checkpoint_every": 10, "train.log_every": 5,
       "train.eval_every": 20, "optimizer.warmup_steps": 5, "train.keep_best": 0,
       "train.keep_last": 3, "train.profile_steps": (3, 4), "data.bleu_examples": 0,
       "model.dtype": "auto"}


@pytest.fixture(scope="module")
def run(tmp_path_factory, data_dir):
    """The tiny experiment, 20 steps on the 8 test devices (dtype auto), checkpoints
    10 and 20, a profile of steps 3..4."""
    workdir = tmp_path_factory.mktemp("run")
    trainer.train_and_evaluate(tiny_config(data_dir, **RUN), str(workdir))
    return workdir


def test_profile_steps_write_a_trace(run):
    traces = list((run / trainer.PROFILE_DIR / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0


def _truncate_largest_data_file(step_dir: pathlib.Path) -> pathlib.Path:
    data_files = [p for p in step_dir.rglob("d/*") if p.is_file()]
    largest = max(data_files, key=lambda p: p.stat().st_size)
    largest.write_bytes(largest.read_bytes()[: largest.stat().st_size // 2])
    return largest


def _tensorboard_steps(workdir, tag: str) -> list[int]:
    """The steps TensorBoard shows for `tag` (its own reader, purges included)."""
    from tensorboard.backend.event_processing import event_accumulator
    events = event_accumulator.EventAccumulator(str(workdir / "tensorboard"))
    events.Reload()
    return [event.step for event in events.Scalars(tag)]


# The truncated file's reads that Orbax abandons in this process report at garbage
# collection: contained here (noise.drop_reports_of_abandoned_io in a launcher).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_damaged_checkpoint_names_the_step_to_resume_from(run, data_dir, tmp_path, caplog):
    workdir = tmp_path / "run"
    shutil.copytree(run, workdir)
    damaged = _truncate_largest_data_file(workdir / "checkpoints" / "20")
    size = damaged.stat().st_size
    longer = tiny_config(data_dir, **{**RUN, "train.num_steps": 30})
    with pytest.raises(CheckpointError) as error:
        trainer.train_and_evaluate(longer, str(workdir))
    assert error.value.damaged
    lines = str(error.value).splitlines()
    assert lines[0].startswith(f"cannot restore {workdir}/checkpoints/20: ")
    assert "(available: [10, 20])" in lines[1] and "--restore_step=10" in lines[1]
    assert error.value.rerun_with == {"restore_step": 10}  # launch/cli.py prints the command
    assert damaged.stat().st_size == size  # untouched

    with caplog.at_level("WARNING", logger="absl"):
        trainer.train_and_evaluate(longer, str(workdir), restore_step=10)
    assert ("config.train.profile_steps=(3, 4): this run resumes after step 10, so they "
            "are not profiled; choose later steps.") in caplog.text  # not silently
    set_aside = workdir / "checkpoints_set_aside" / "20"
    assert (set_aside / damaged.relative_to(workdir / "checkpoints" / "20")).stat().st_size \
        == size
    assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir()) == [10, 20, 30]
    steps = [m["step"] for m in read_metrics(workdir) if "train/loss" in m]
    assert steps == [5, 10, 15, 20, 25, 30]
    # Two event files; TensorBoard shows each step once (purge_step on resume).
    assert len(list((workdir / "tensorboard").iterdir())) == 2
    assert _tensorboard_steps(workdir, "train/loss") == steps


@pytest.mark.slow
def test_evaluate_checks_its_output_folder_before_evaluating(run, tmp_path):
    output = tmp_path / "none" / "eval.json"
    code, out = finish(launch("evaluate.py", run, {}, config=None,
                              extra=[f"--output={output}"]))
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in out, out
    assert f"--output={output}: " in errors[0] and f" {output.parent} " in errors[0]
    assert "restored" not in out  # before the checkpoint was read


@pytest.mark.slow
def test_a_torn_metrics_line_is_dropped_on_resume(run, data_dir, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(run, workdir)
    with open(workdir / "metrics.jsonl", "a") as f:
        f.write('{"step": 21, "train/lo')  # a crash while the line was written
    trainer.train_and_evaluate(tiny_config(data_dir, **{**RUN, "train.num_steps": 25}),
                               str(workdir))
    lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines if "train/loss" in m] == [5, 10, 15, 20, 25]


def test_evaluating_a_damaged_checkpoint_names_the_file(run, data_dir, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(run, workdir)
    step_dir = workdir / "checkpoints" / "20"
    for path in step_dir.glob("state/ocdbt.process_*/d/*"):  # the arrays' data files
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=f"cannot restore {step_dir}: ") as error:
        evaluate_checkpoint(tiny_config(data_dir, **RUN), str(workdir), 20)
    assert error.value.damaged
    advice = str(error.value).splitlines()[1]
    assert "(available: [10, 20])" in advice and "--step=10" in advice, advice
    assert error.value.rerun_with == {"step": 10}  # evaluate.py prints the command


def test_same_size_damage_is_refused_naming_the_good_step(tmp_path):
    """Damage that TensorStore reads without error (finite, wrong values) is
    caught by the checksum saved with each checkpoint: when resuming (the
    Checkpointer) and when evaluating (restore_params)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from bert_jax.training.checkpoints import Checkpointer, restore_params
    bits = np.random.default_rng(0).integers(0, 0x7F000000, (256, 1024), np.uint32)
    state = {"params": {"w": jnp.asarray(bits.view(np.float32))}, "step": jnp.array(3)}
    checkpointer = Checkpointer(str(tmp_path), async_saves=False)
    for step in (10, 20):
        checkpointer.save(step, state, None)
    checkpointer.close()
    # Orbax writes each array as a zstd frame; random floats go in raw blocks, the
    # array's own bytes between 3-byte block headers, at an offset that depends on
    # the order the values were written. Damage 4 KiB found verbatim in the file
    # (inside a block), never a header: the floats are reversed, finite and wrong.
    stretch = bits.view(np.uint8).ravel()[300_000:304_096].tobytes()
    data = next(p for p in (tmp_path / "checkpoints" / "20").rglob("d/*")
                if stretch in p.read_bytes())
    content = data.read_bytes()
    at = content.index(stretch)
    reversed_floats = np.frombuffer(stretch, np.uint32)[::-1].tobytes()
    data.write_bytes(content[:at] + reversed_floats + content[at + len(stretch):])
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    checkpointer = Checkpointer(str(tmp_path))
    with pytest.raises(CheckpointError, match=r"checkpoints/20: array params/w ") as error:
        checkpointer.restore(20, abstract, None)
    assert error.value.damaged and error.value.rerun_with == {"restore_step": 10}
    np.testing.assert_array_equal(checkpointer.restore(10, abstract, None)["params"]["w"],
                                  state["params"]["w"])
    with pytest.raises(CheckpointError, match=r"array params/w ") as error:
        restore_params(str(tmp_path / "checkpoints" / "20"), abstract["params"])
    assert error.value.damaged


def test_integrity_check_names_changed_and_non_finite_arrays():
    import jax.numpy as jnp
    tree = {"params": {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}}
    saved, _ = digests(tree)
    assert check_integrity(tree, saved) is None
    swapped = {"params": {"w": tree["params"]["w"][::-1], "b": tree["params"]["b"]}}
    assert check_integrity(swapped, saved).startswith("array params/w does not match")
    nan = {"params": {"w": tree["params"]["w"], "b": jnp.array([1.0, jnp.nan, 1.0])}}
    assert check_integrity(nan, None).startswith("array params/b holds NaN or Inf")


def test_restore_step_must_exist_and_moves_nothing(run, data_dir, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(run, workdir)
    with pytest.raises(CheckpointError, match=r"--restore_step=15: .* \(available: "
                                              r"\[10, 20\]\)"):
        trainer.train_and_evaluate(tiny_config(data_dir, **RUN), str(workdir),
                                   restore_step=15)
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["10", "20"]
    assert not (workdir / "checkpoints_set_aside").exists()


@pytest.fixture(scope="module")
def sources_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("input") / "sources.txt"
    path.write_text("5 6 7 8\n\n5 99 7\n" + " ".join(["9"] * 20) + "\n9 8 7 6\n")
    return path


def test_translate_refuses_bad_lines_naming_them(run, data_dir, sources_file):
    task = build_task(tiny_config(data_dir, **RUN), str(run))
    with pytest.raises(DataError) as error:
        input_lines.screen_lines(open(sources_file), task.source_problems, "fail",
                                 str(sources_file))
    assert error.value.path == str(sources_file) and error.value.what.startswith("3 bad ")
    assert str(error.value).splitlines()[1:4] == [
        f"  {sources_file}:2: empty line",
        f"  {sources_file}:3: unknown ids 99 (ids are 0..31)",
        f"  {sources_file}:4: 20 tokens, more than data.max_length=16: it would be cut"]


def test_translate_skips_bad_lines_keeping_the_line_numbers(run, data_dir, sources_file):
    result = subprocess.run(
        [sys.executable, str(REPO / "launch" / "translate.py"),
         "--config=" + str(REPO / "experiments" / "tiny_translate.py"), f"--workdir={run}",
         f"--config.data.data_dir={data_dir}", f"--input={sources_file}",
         "--on_error=skip"], cwd=REPO, capture_output=True, text=True,
        env={**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"})
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert len(lines) == 5 and lines[1:4] == ["", "", ""], lines
    assert (f"warning: {sources_file}:3: unknown ids 99 (ids are 0..31) (skipped)"
            in result.stderr)
    assert "Metadata file does not exist" not in result.stderr  # Orbax's, about nothing


def test_translate_names_a_missing_input_file(run, tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "launch" / "translate.py"), f"--workdir={run}",
         f"--input={tmp_path / 'none.txt'}"], cwd=REPO, capture_output=True, text=True,
        env={**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"})
    assert result.returncode == 2 and result.stderr.splitlines() == [
        f"error: --input={tmp_path / 'none.txt'}: cannot read it (No such file or "
        "directory); give a file of source sentences, one a line."], result.stderr


@pytest.mark.slow
def test_translate_names_bytes_that_are_not_utf8(run, tmp_path):
    sources = tmp_path / "sources.txt"
    sources.write_bytes(b"5 6 7\n5 \xff 7\n")
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict",  # as in a UTF-8 locale
           "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    for input_flag in ([f"--input={sources}"], []):
        result = subprocess.run(
            [sys.executable, str(REPO / "launch" / "translate.py"), f"--workdir={run}",
             *input_flag], cwd=REPO, capture_output=True, env=env,
            input=sources.read_bytes())
        err, name = result.stderr.decode(), str(sources) if input_flag else "stdin"
        assert result.returncode == 2 and "Traceback" not in err, err
        assert f"\n  {name}:2: byte 0xff at column 3 " in err, err


def test_screen_lines_warns_and_keeps(capsys):
    kept = input_lines.screen_lines(["a", "", "b"], lambda line: [] if line else ["empty"],
                                    "warn", "in.txt")
    assert kept == ["a", "", "b"]
    assert capsys.readouterr().err == "warning: in.txt:2: empty (processed as it is)\n"
    many = [""] * (input_lines.MAX_REPORTED + 2)
    with pytest.raises(DataError, match=r"(?s)12 bad input.*and 2 more"):
        input_lines.screen_lines(many, lambda line: ["empty"], "fail", "in.txt")


# ----------------------------------------------------------------------------
# Dataset builds: plain progress lines, no tqdm bars in a log.


def test_dataset_builds_log_progress_lines(tmp_path, monkeypatch, caplog):
    from tensorflow_datasets.core.utils import tqdm_utils
    monkeypatch.setattr(sources, "PROGRESS_EVERY_SECONDS", 0.01)
    monkeypatch.setattr(tqdm_utils, "_active", True)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for stem, n in (("train", 3000), ("val", 8)):
        for language in ("src", "tgt"):
            (corpus / f"{stem}.{language}").write_text("".join(f"{i}\n" for i in range(n)))
    with caplog.at_level("INFO", logger="absl"):
        sources.load_source("parallel_text", "train", tmp_path / "tfds", path=corpus,
                            source_language="src", target_language="tgt")
    messages = [r.getMessage() for r in caplog.records if "load_source" in r.getMessage()]
    assert any(" s, " in m and "MB written" in m for m in messages), messages
    assert any(m.startswith("load_source: prepared parallel_text") and
               m.endswith("train 3,000, validation 8 examples") for m in messages), messages
    assert tqdm_utils._active is False  # pytest's stderr is not a terminal


def test_a_parameter_a_built_in_corpus_lacks_is_named():
    """e.g. config.data.builder switched to synthetic_translation with the
    builder_kwargs of synthetic_reverse."""
    with pytest.raises(DataError, match=(
            r"^synthetic_translation: .*\['vocab_size'\] \(config.data.builder_kwargs\)")) as e:
        sources.load_source("synthetic_translation", "train", vocab_size=32)
    assert e.value.path == "synthetic_translation" and "num_train" in e.value.fix


def test_an_unknown_dataset_is_named(tmp_path):
    with pytest.raises(DataError, match=(
            r"^synthetic_revers: no such dataset \(config.data.builder\).* synthetic_reverse "
            r"or synthetic_translation")) as e:
        sources.load_source("synthetic_revers", "train", tmp_path)
    assert e.value.path == "synthetic_revers"


def test_build_progress_survives_files_moved_during_the_walk(tmp_path, monkeypatch):
    (tmp_path / "kept").write_bytes(b"x" * 1000)
    (tmp_path / "moved").write_bytes(b"x" * 5)
    size = os.path.getsize

    def moved_away(path):  # tfds renames its temporary files while the thread walks
        if path.endswith("moved"):
            raise FileNotFoundError(path)
        return size(path)
    monkeypatch.setattr(os.path, "getsize", moved_away)
    assert sources._megabytes(str(tmp_path)) == 0.001


# ----------------------------------------------------------------------------
# model.dtype='auto'.


@pytest.mark.parametrize("hardware, dtype", [
    (auto_dtype.Hardware("tpu", "TPU v5 lite"), "bfloat16"),
    (auto_dtype.Hardware("gpu", "NVIDIA H100 80GB HBM3", (9, 0)), "bfloat16"),
    (auto_dtype.Hardware("gpu", "NVIDIA A100-SXM4-80GB", (8, 0)), "bfloat16"),
    (auto_dtype.Hardware("gpu", "Tesla V100-SXM2-16GB", (7, 0)), "float32"),
    (auto_dtype.Hardware("cpu", "AMD EPYC 9B14", cpu_flags=frozenset({"avx512_bf16"})),
     "bfloat16"),
    (auto_dtype.Hardware("cpu", "Intel Xeon", cpu_flags=frozenset({"amx_bf16"})),
     "bfloat16"),
    (auto_dtype.Hardware("cpu", "AMD EPYC 7B13", cpu_flags=frozenset({"avx2", "fma"})),
     "float32"),
])
def test_auto_dtype_follows_the_hardware(hardware, dtype):
    chosen, reason = auto_dtype.choose_dtype(hardware)
    assert chosen == dtype and hardware.name in reason


def test_cpu_flags_come_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu avx2 fma\n"
                       "\nprocessor\t: 1\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu\n")
    assert auto_dtype.cpu_model_and_flags(str(cpuinfo)) == (
        "AMD EPYC 7B13", frozenset({"fpu", "avx2", "fma"}))


def test_auto_is_resolved_once_and_recorded(run, data_dir):
    dtype, _ = auto_dtype.choose_dtype(auto_dtype.local_hardware())
    assert json.loads((run / "config.json").read_text())["model"]["dtype"] == dtype
    config = tiny_config(data_dir, **{"model.dtype": "auto"})
    kept = auto_dtype.resolve_model_dtype(config, saved_dtype="float32")
    assert kept.model.dtype == "float32" and config.model.dtype == "auto"
    fixed = tiny_config(data_dir, **{"model.dtype": "float32"})
    assert auto_dtype.resolve_model_dtype(fixed) is fixed


def test_the_choice_and_its_reason_are_logged_once(data_dir, caplog, monkeypatch):
    zen3 = auto_dtype.Hardware("cpu", "AMD EPYC 7B13", cpu_flags=frozenset({"avx2"}))
    monkeypatch.setattr(auto_dtype, "local_hardware", lambda: zen3)
    config = tiny_config(data_dir, **{"model.dtype": "auto"})
    with caplog.at_level("INFO", logger="absl"):
        task = build_task(config, None)  # chooses the dtype
        check_training_config(task, mesh_from_config(config.mesh))  # no second choice
        assert task.config.model.dtype == "float32"
    chosen = [r.getMessage() for r in caplog.records if "model.dtype='auto'" in r.getMessage()]
    assert chosen == ["model.dtype='auto' -> float32 (AMD EPYC 7B13 has neither avx512_bf16 "
                      "nor amx_bf16: bfloat16 matmuls would run slower than float32 there)"]


def test_compile_resolves_auto_for_the_target_not_this_cpu():
    from bert_jax.planning import aot, topologies
    gpu = topologies.Target("h100-8", "gpu", (), topologies.GPUS["h100"].description, 0, 0)
    tpu = topologies.Target("v5e-8", "tpu", (), "TPU v5e", 0, 0)
    for target in (gpu, tpu):  # from this CPU, whatever its flags
        assert auto_dtype.choose_dtype(aot.target_hardware(target))[0] == "bfloat16"
