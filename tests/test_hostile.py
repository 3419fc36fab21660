"""Hostile workdirs and inputs (issue 38): every way into a workdir ends in one `error:`
line naming the flag, file, step or input line (exit 2), and nothing computed or saved is
lost: a refused command leaves the workdir's files byte-identical.

One tiny training serves the file (tiny_translate on the built-in synthetic_translation
corpus, with a SentencePiece vocabulary: the vocabulary cases need one); each case damages
a copy. The launch scripts run as subprocesses for one case of each kind; the variants
call the functions they call, in this process. Every test of the trained workdir is
`slow` (its training takes about 30 s)."""

import errno
import json
import os
import pathlib
import shutil
import subprocess
import sys

import ml_collections
import pytest

from bert_jax.data import vocabulary, wordpiece
from bert_jax.data.input_lines import screen_lines
from bert_jax.errors import (
    DamagedFileError, DataError, MissingFileError, UserError, WorkdirError)
from bert_jax.file_io import write_atomically
from bert_jax.tasks import build_task
from bert_jax.training import evaluation, trainer
from bert_jax.training.averaging import average_workdir
from bert_jax.training.checkpoints import STEP_RECORD, CheckpointError
from helpers import REPO, RUN_AS_SCRIPT, finish, launch, tiny_config

RUN = {"train.num_steps": 2, "train.checkpoint_every": 1, "train.eval_every": 2,
       "train.log_every": 1, "optimizer.warmup_steps": 1, "train.keep_best": 0,
       "train.keep_last": 3, "data.bleu_examples": 0}


@pytest.fixture(scope="session")
def trained(tmp_path_factory, data_dir) -> pathlib.Path:
    """A workdir with checkpoints 1 and 2 and vocab/spm.model, spm.json."""
    config = tiny_config(data_dir, **RUN)
    config.data.update(dict(builder="synthetic_translation", source_key="source",
                            target_key="target", vocab_size=256, max_length=32))
    config.data.builder_kwargs = ml_collections.ConfigDict(dict(
        max_clauses=1, num_train=512, num_validation=32, num_test=32))
    config.model.max_len = config.decode.max_length = 32
    workdir = tmp_path_factory.mktemp("hostile") / "run"
    trainer.train_and_evaluate(config, str(workdir))
    return workdir


@pytest.fixture
def workdir(trained, tmp_path) -> pathlib.Path:
    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    return copy


def _contents(root: pathlib.Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and folder (None) under `root`, by relative path."""
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes()
            for p in sorted(root.rglob("*"))}


def _refused(script: str, workdir, *named: str, extra=(), **launch_kwargs) -> str:
    """Runs `launch/<script> --workdir=WORKDIR` (its config.json): exit 2, one `error:`
    line naming each of `named`, no traceback. Returns the whole output."""
    code, out = finish(launch(script, workdir, {}, config=None, extra=extra,
                              **launch_kwargs), timeout=600)
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in out, out[-5000:]
    assert all(name in errors[0] for name in named), errors[0]
    return out


def _resume_flags(workdir) -> list[str]:
    """train.py's flags that rerun the workdir's own config: it resumes from the latest."""
    return [f"--config={REPO / 'launch' / 'workdir_config.py'}:{workdir}"]


# ----------------------------------------------------------------------------
# --save_average: a new folder outside the workdir, symbolic links followed.


@pytest.mark.slow
def test_the_average_is_never_written_into_the_workdir_through_a_link(workdir):
    (workdir.parent / "link").symlink_to(workdir)
    target = workdir.parent / "link" / "checkpoints" / "777"
    before = _contents(workdir)
    _refused("evaluate.py", workdir, f"--save_average={target} (it is {workdir}/checkpoints/"
             f"777) lies inside --workdir={workdir}",
             extra=["--average_last=2", f"--save_average={target}"])
    assert _contents(workdir) == before


@pytest.mark.slow
@pytest.mark.parametrize("where", ["run/avg", "run", "link/avg", "link"])
def test_save_average_refuses_any_folder_that_resolves_into_the_workdir(workdir, where):
    (workdir.parent / "link").symlink_to(workdir)
    config = evaluation.saved_config(str(workdir))
    before = _contents(workdir)
    with pytest.raises(WorkdirError, match=f"--save_average={workdir.parent / where}"):
        average_workdir(config, str(workdir), str(workdir.parent / where), last=2)
    assert _contents(workdir) == before


@pytest.mark.slow
@pytest.mark.parametrize("output, named", [
    ("run/config.json", "--output={path} lies inside --workdir="),
    ("run/metrics.jsonl", "--output={path} lies inside --workdir="),
    ("link/eval.json", "(it is {workdir}/eval.json) lies inside --workdir="),
    ("eval.json", "its files folder"),  # eval_files/ is a link into the workdir
])
def test_evaluate_never_writes_its_output_into_the_workdir(workdir, output, named):
    (workdir.parent / "link").symlink_to(workdir)
    (workdir.parent / "eval_files").symlink_to(workdir / "samples")
    path = workdir.parent / output
    before = _contents(workdir)
    _refused("evaluate.py", workdir, named.format(path=path, workdir=workdir),
             extra=[f"--output={path}"])
    assert _contents(workdir) == before


@pytest.mark.slow
@pytest.mark.parametrize("script, flag", [("ablate.py", "--output_dir"),
                                          ("visualize_attention.py", "--output_dir")])
def test_the_other_readers_of_a_workdir_never_write_into_it(workdir, script, flag):
    path = workdir / "checkpoints" / "maps"
    before = _contents(workdir)
    _refused(script, workdir, f"{flag}={path} lies inside --workdir=", extra=[f"{flag}={path}"])
    assert _contents(workdir) == before


@pytest.mark.slow
def test_extract_features_never_writes_into_the_model_it_reads(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    result = subprocess.run(
        [sys.executable, str(REPO / "launch" / "extract_features.py"), f"--pretrained={model}",
         f"--input_file={tmp_path / 'in.txt'}", f"--output_features={model / 'f.npz'}"],
        capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"--output_features={model / 'f.npz'} lies inside --pretrained=" in result.stderr
    assert list(model.iterdir()) == []


# ----------------------------------------------------------------------------
# --output on a full disk: the metrics are printed first; the failed write is one line.


def _full_disk(tmp_path) -> pathlib.Path:
    """A link to /dev/full (ENOSPC on write): code that replaces the file it writes
    replaces the link, never the device."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full (Linux)")
    (tmp_path / "full").symlink_to("/dev/full")
    return tmp_path / "full"


@pytest.mark.slow
def test_a_full_disk_under_output_loses_no_metrics(workdir, tmp_path):
    full = _full_disk(tmp_path)
    before = _contents(workdir)
    out = _refused("evaluate.py", workdir, f"--output={full}", os.strerror(errno.ENOSPC),
                   extra=[f"--output={full}"])
    printed = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(printed) == 1 and printed[0]["step"] == 2 and "eval/nll" in printed[0], out
    assert full.is_symlink() and os.listdir(tmp_path) == ["full", "run"]  # written in place
    assert _contents(workdir) == before


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary_one(tmp_path, monkeypatch):
    full = _full_disk(tmp_path)
    with pytest.raises(OSError) as error:
        write_atomically(str(full), "{}")  # a device is written in place
    assert error.value.errno == errno.ENOSPC and full.is_symlink()
    path = tmp_path / "eval.json"
    path.write_text("old")

    def no_room(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "replace", no_room)
    with pytest.raises(OSError):
        write_atomically(str(path), "new")
    assert sorted(os.listdir(tmp_path)) == ["eval.json", "full"] and path.read_text() == "old"


def test_evaluator_files_that_cannot_be_written_are_named(tmp_path):
    (tmp_path / "eval_files").write_text("a file where the folder goes")
    with pytest.raises(UserError, match=f"cannot write {tmp_path}/eval_files/samples/2.jsonl"):
        evaluation._write(str(tmp_path / "eval_files"), {"samples/2.jsonl": [{"a": 1}]})


# ----------------------------------------------------------------------------
# Checkpoints: integrity is checked whole, or the checkpoint is refused.


def _cut_short(path: pathlib.Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


DAMAGES = {  # what is done to checkpoints/2 -> what the error names
    "digest/metadata deleted": (lambda step: (step / "digest" / "metadata").unlink(),
                                "digest/"),
    "digest/metadata cut short": (lambda step: _cut_short(step / "digest" / "metadata"),
                                  "digest/"),
    "digest/ deleted": (lambda step: shutil.rmtree(step / "digest"), "digest/"),
    "the digest emptied": (lambda step: (step / "digest" / "metadata").write_text("{}"),
                           "has no checksum"),
    "_CHECKPOINT_METADATA deleted": (lambda step: (step / STEP_RECORD).unlink(),
                                     STEP_RECORD),
    "state/_METADATA cut short": (lambda step: _cut_short(step / "state" / "_METADATA"),
                                  "state cannot be read"),
    "state/manifest.ocdbt cut short": (
        lambda step: _cut_short(step / "state" / "manifest.ocdbt"), "checkpoints/2"),
}


@pytest.mark.slow
@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_checksum_record_or_metadata_is_refused_naming_the_good_step(
        workdir, damage):
    damage_fn, named = DAMAGES[damage]
    damage_fn(workdir / "checkpoints" / "2")
    before = _contents(workdir)
    with pytest.raises(CheckpointError) as error:
        evaluation.restore_for_inference(evaluation.saved_config(str(workdir)), str(workdir))
    assert error.value.damaged
    first, advice = str(error.value).splitlines()
    assert first.startswith(f"cannot restore {workdir}/checkpoints/2") and named in first, first
    assert "(available: [1, 2])" in advice and error.value.rerun_with == {"step": 1}
    assert _contents(workdir) == before


@pytest.mark.slow
def test_evaluate_refuses_a_checkpoint_whose_checksums_are_gone(workdir):
    shutil.rmtree(workdir / "checkpoints" / "2" / "digest")
    before = _contents(workdir)
    out = _refused("evaluate.py", workdir, f"{workdir}/checkpoints/2: ", "digest/")
    assert "--step=1" in out.split("error:")[1]  # the command that uses step 1
    assert _contents(workdir) == before


@pytest.mark.slow
def test_resuming_refuses_a_damaged_checksum_record(workdir):
    _cut_short(workdir / "checkpoints" / "2" / "digest" / "metadata")
    before = _contents(workdir)
    out = _refused("train.py", workdir, f"{workdir}/checkpoints/2: ", "digest/",
                   extra=_resume_flags(workdir))
    assert "--restore_step=1" in out.split("error:")[1]
    assert _contents(workdir) == before


@pytest.mark.slow
def test_a_checkpoint_saved_before_checksums_is_restored_unchecked(workdir, caplog):
    """Its writer's record lists no digest (bert_jax before 2026-11-25): by design."""
    step = workdir / "checkpoints" / "2"
    record = json.loads((step / STEP_RECORD).read_text())
    del record["item_handlers"]["digest"]
    (step / STEP_RECORD).write_text(json.dumps(record))
    shutil.rmtree(step / "digest")
    with caplog.at_level("WARNING"):
        *_, restored_step = evaluation.restore_for_inference(
            evaluation.saved_config(str(workdir)), str(workdir))
    assert restored_step == 2 and "saved without checksums" in caplog.text


@pytest.mark.slow
def test_an_average_is_saved_with_its_checksums(workdir, tmp_path):
    config = evaluation.saved_config(str(workdir))
    average_workdir(config, str(workdir), str(tmp_path / "avg"), last=2)
    (tmp_path / "avg" / "checkpoints" / "2" / "digest" / "metadata").write_text("{}")
    with pytest.raises(CheckpointError, match="avg/checkpoints/2: .*has no checksum") as error:
        evaluation.restore_for_inference(config, str(tmp_path / "avg"))
    assert error.value.damaged


VANISHING = """
import os, runpy, shutil, sys
from bert_jax.training import evaluation
listed = evaluation.checkpoint_steps
def list_then_lose_the_latest(directory):  # as a training run with keep_last=1 does
    steps = listed(directory)
    evaluation.checkpoint_steps = listed
    shutil.rmtree(os.path.join(directory, str(steps[-1])))
    return steps
evaluation.checkpoint_steps = list_then_lose_the_latest
""" + RUN_AS_SCRIPT


@pytest.mark.slow
def test_a_step_deleted_while_it_is_read_is_named_as_such(workdir):
    before = _contents(workdir)
    out = _refused("evaluate.py", workdir, f"checkpoint 2 vanished from {workdir}/checkpoints",
                   "It holds [1] now", python_code=VANISHING)
    assert "--step=1" in out.split("error:")[1] and "holds no checkpoint" not in out
    assert _contents(workdir) == {k: v for k, v in before.items()
                                  if not k.startswith("checkpoints/2")}


# ----------------------------------------------------------------------------
# The vocabulary: a missing or damaged file is named, never trained again.


VOCAB_DAMAGES = {
    "spm.model cut short": (lambda vocab: _cut_short(vocab / "spm.model"),
                            DamagedFileError, "vocab/spm.model is damaged"),
    "spm.model deleted": (lambda vocab: (vocab / "spm.model").unlink(),
                          MissingFileError, "vocab/spm.model is missing"),
    "spm.json deleted": (lambda vocab: (vocab / "spm.json").unlink(),
                         MissingFileError, "vocab/spm.json is missing"),
}


@pytest.mark.slow
@pytest.mark.parametrize("damage", VOCAB_DAMAGES)
def test_a_damaged_vocabulary_is_named_and_never_trained_again(workdir, damage):
    damage_fn, error_class, named = VOCAB_DAMAGES[damage]
    damage_fn(workdir / "vocab")
    before = _contents(workdir)
    config = evaluation.saved_config(str(workdir))
    with pytest.raises(error_class, match=named):
        evaluation.restore_for_inference(config, str(workdir))
    with pytest.raises(error_class, match=named):  # resuming
        trainer.train_and_evaluate(config, str(workdir))
    assert _contents(workdir) == before


@pytest.mark.slow
@pytest.mark.parametrize("script, damage", [("evaluate.py", "spm.model deleted"),
                                            ("translate.py", "spm.model cut short"),
                                            ("train.py", "spm.model cut short")])
def test_the_launch_scripts_name_a_damaged_vocabulary(workdir, tmp_path, script, damage):
    damage_fn, _, named = VOCAB_DAMAGES[damage]
    damage_fn(workdir / "vocab")
    (tmp_path / "in.txt").write_text("ta gak tor .\n")
    extra = {"evaluate.py": [], "translate.py": [f"--input={tmp_path / 'in.txt'}"],
             "train.py": _resume_flags(workdir)}[script]
    before = _contents(workdir)
    _refused(script, workdir, named, extra=extra)
    assert _contents(workdir) == before


def test_a_vocabulary_is_never_trained_under_checkpoints(tmp_path):
    for load_or_train in (
            lambda: vocabulary.load_or_train(str(tmp_path), ["a b"], 8, checkpointed=True),
            lambda: wordpiece.load_or_train(str(tmp_path), ["a b"], 8, lowercase=True,
                                            checkpointed=True)):
        with pytest.raises(MissingFileError, match=f"{tmp_path}/vocab/.* is missing"):
            load_or_train()
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------
# translate.py's input (ids written as numbers): one line per bad input line, cut short.


def test_bad_ids_are_named_by_line_and_cut_short(data_dir):
    task = build_task(tiny_config(data_dir), None, abstract=True)  # ids 0..31, as a workdir's
    lines = ["5 " + "7" * 200_000 + "\n", "5 \u00b2 7\n", "5 " + "x" * 200_000 + " 7\n",
             "5 6 7\n"]
    with pytest.raises(DataError) as error:
        screen_lines(lines, task.source_problems, "fail", "in.txt")
    reports = str(error.value).splitlines()
    assert error.value.path == "in.txt" and error.value.what.startswith("3 bad input line(s)")
    assert len(str(error.value)) < 1000, reports
    assert reports[1] == f"  in.txt:1: unknown ids {'7' * 40}... (ids are 0..31)"
    assert reports[2] == "  in.txt:2: unknown ids \u00b2 (ids are 0..31)"
    assert reports[3] == f"  in.txt:3: unknown ids {'x' * 40}... (ids are 0..31)"
    with pytest.raises(DataError, match=r"^'5 7{38}\.\.\.': not ids"):
        task.encode_sources([lines[0].strip()])  # --on_error=warn translates it as it is
