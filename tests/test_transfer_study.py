"""Transfer studies (bert_jax/analysis/transfer.py, launch/transfer_study.py):
resuming without rerunning, the scratch backbone's copy of the architecture and
vocabulary, the aggregation, the dry run, the study file, and a tiny study end
to end (a pretraining of a few steps, then fine-tuning from it and from scratch)."""

from __future__ import annotations

import csv
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.analysis import sweeps, transfer
from bert_jax.data.wordpiece import SPECIAL_TOKENS
from bert_jax.errors import ConfigError, WorkdirError
from bert_jax.modeling import BertConfig
from bert_jax.tasks import build_task
from bert_jax.training import trainer
from test_finetune import WORDS, sentences

REPO = pathlib.Path(__file__).resolve().parents[1]
FINETUNE = str(REPO / "experiments" / "finetune.py")
TASK = "sst2,steps=4"
TRAIN_LINES = 40


@pytest.fixture(scope="module")
def sst2(tmp_path_factory) -> pathlib.Path:
    """A tiny SST-2 folder: label 1 when the sentence says good or great."""
    folder = tmp_path_factory.mktemp("glue") / "SST-2"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (("train", TRAIN_LINES), ("dev", 16)):
        texts = sentences(rng, n)
        (folder / f"{split}.tsv").write_text("sentence\tlabel\n" + "".join(
            f"{t}\t{int('good' in t or 'great' in t)}\n" for t in texts))
    return folder


def pretrained_folder(folder: pathlib.Path, **architecture) -> pathlib.Path:
    """A bert_jax pretrained folder without parameters: what fine-tuning reads
    to build its model (model_config.json, vocab.txt)."""
    folder.mkdir(parents=True)
    tokens = [*SPECIAL_TOKENS, *WORDS]
    (folder / "vocab.txt").write_text("".join(t + "\n" for t in tokens))
    config = BertConfig(**{**dict(hidden_size=32, num_heads=2, mlp_dim=64, num_layers=2,
                                  max_len=64, vocab_size=len(tokens)), **architecture})
    (folder / "model_config.json").write_text(json.dumps(
        {"kind": "bert", "config": config.to_dict()}))
    return folder


def base_overrides(data_path) -> dict:
    return {"data.path": str(data_path), "data.max_seq_length": 32,
            "data.length_buckets": (8, 16), "train.batch_size": 8, "train.log_every": 2,
            "model.dropout_rate": 0.0, "model.attention_dropout_rate": 0.0,
            "peak_flops": 1e12}   # no timed matmul


class FakeTrainer:
    """Counts calls; 'trains' by writing the final checkpoint folder and an
    evaluation line (pretrained 60 + seed, scratch 50 + seed), or stops at
    step 2 for the run named `interrupt`."""

    def __init__(self, interrupt: str | None = None):
        self.calls, self.interrupt = [], interrupt

    def __call__(self, config, workdir):
        name, steps = os.path.basename(workdir), int(config.train.num_steps)
        resumed = sweeps.run_checkpoint_steps(workdir)
        self.calls.append((name, resumed[-1] if resumed else 0))
        step = 2 if name == self.interrupt else steps
        os.makedirs(os.path.join(workdir, "checkpoints", str(step)))
        trainer.write_config(workdir, config)
        value = (60.0 if config.init_from else 50.0) + config.seed
        with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
            f.write(json.dumps({"step": step, "eval/accuracy": value, "eval/loss": 0.5}) + "\n")


def study(directory, backbones, train_fn=None, *, data, **group):
    return transfer.Study(str(directory), backbones, [{"tasks": (TASK,), "seeds": (0, 1),
                                                       **group}],
                          config_file=FINETUNE, base_overrides=base_overrides(data),
                          train_fn=train_fn, log=lambda line: None)


@pytest.fixture(scope="module")
def backbone(tmp_path_factory) -> str:
    return str(pretrained_folder(tmp_path_factory.mktemp("backbones") / "pre",
                                 norm_position="pre", activation="gelu_tanh",
                                 layer_norm_eps=1e-6))


@pytest.mark.slow
def test_a_finished_run_is_not_rerun_and_an_interrupted_one_resumes(sst2, backbone,
                                                                     tmp_path, monkeypatch):
    monkeypatch.setattr(sweeps.runner, "count_parameters", lambda config, workdir: 1000)
    backbones = {"pre": backbone, "scratch": ""}
    first = FakeTrainer(interrupt="backbone=scratch,n=0,seed=0")
    outcome = study(tmp_path, backbones, first, data=sst2).run()
    # Seed by seed: both backbones at seed 0 first; the interruption stops the study.
    assert outcome == {f"{TASK}/backbone=pre,n=0,seed=0": "done",
                       f"{TASK}/backbone=scratch,n=0,seed=0": "interrupted"}
    assert first.calls == [("backbone=pre,n=0,seed=0", 0), ("backbone=scratch,n=0,seed=0", 0)]
    assert (tmp_path / TASK / "backbone=pre,n=0,seed=0" / "DONE").exists()

    # The dry run now times the rest by the finished run of the same architecture.
    rows, sources = study(tmp_path, backbones, data=sst2).plan()
    assert [(r["backbone"], r["seed"], r["status"], r["step"]) for r in rows] == [
        ("pre", 0, "done", 4), ("scratch", 0, "interrupted", 2),
        ("pre", 1, "not started", 0), ("scratch", 1, "not started", 0)]
    assert len(sources) == 1 and "measured over 1 finished run" in sources[0]
    assert "from pre, scratch" in sources[0]   # one architecture
    rate = rows[0]["seconds"] / 4
    assert rows[1]["seconds"] == pytest.approx(2 * rate)
    assert rows[2]["seconds"] == pytest.approx(4 * rate) and rows[2]["estimated"]

    again = FakeTrainer()
    outcome = study(tmp_path, backbones, again, data=sst2).run()
    assert again.calls == [("backbone=scratch,n=0,seed=0", 2),   # resumed from its step 2
                           ("backbone=pre,n=0,seed=1", 0), ("backbone=scratch,n=0,seed=1", 0)]
    assert outcome[f"{TASK}/backbone=pre,n=0,seed=0"] == "skipped"
    third = FakeTrainer()
    assert set(study(tmp_path, backbones, third, data=sst2).run().values()) == {"skipped"}
    assert third.calls == []

    table, rows = transfer.report(str(tmp_path))
    assert [(r["backbone"], r["train_examples"], r["seeds"]) for r in rows] == [
        ("pre", TRAIN_LINES, 2), ("scratch", TRAIN_LINES, 2)]
    assert rows[0]["metric"] == "eval/accuracy"
    assert (rows[0]["mean"], rows[1]["mean"]) == (60.5, 50.5)
    assert rows[0]["sd"] == pytest.approx(np.std([60, 61], ddof=1))
    assert f"| pre | {TRAIN_LINES} (all) | 2 | 60.5 | 0.7071 | 60 | 61 |" in table
    # The split's size is kept for later reports.
    study_file = json.loads((tmp_path / "study.json").read_text())
    assert study_file["train_split_examples"] == {TASK: TRAIN_LINES}
    assert list(study_file["backbones"]) == ["pre", "scratch"]
    # A metric override, by the task's name.
    _, rows = transfer.report(str(tmp_path), transfer.parse_metric_flags(["sst2=eval/loss"]))
    assert rows[0]["metric"] == "eval/loss" and rows[0]["mean"] == 0.5
    with pytest.raises(ConfigError, match="'mrpc'"):
        transfer.report(str(tmp_path), {"mrpc": "eval/f1"})


def test_the_scratch_backbone_copies_the_architecture_and_vocabulary(sst2, backbone,
                                                                     tmp_path):
    config = sweeps.apply_overrides(sweeps.load_config(f"{FINETUNE}:{TASK}"),
                                    base_overrides(sst2))
    overrides = transfer.scratch_overrides(backbone, config)
    assert overrides["init_from"] == ""
    assert overrides["data.vocab_file"] == os.path.join(backbone, "vocab.txt")
    assert (overrides["model.norm_position"], overrides["model.activation"],
            overrides["model.layer_norm_eps"], overrides["model.num_layers"]) == (
        "pre", "gelu_tanh", 1e-6, 2)
    assert "model.vocab_size" not in overrides and "model.dropout_rate" not in overrides
    # Built, the two tasks have one model config and one vocabulary.
    scratch = build_task(sweeps.apply_overrides(config, overrides), str(tmp_path / "s"))
    pre = build_task(sweeps.apply_overrides(config, {"init_from": backbone}),
                     str(tmp_path / "p"))
    assert (scratch.backbone.kind, pre.backbone.kind) == ("scratch", "pretrained")
    assert scratch.model_config == pre.model_config
    assert scratch.vocab.path == pre.vocab.path and scratch.vocab.size == pre.vocab.size

    # A field the fine-tuning config cannot set is named, not dropped.
    del config.model["norm_position"]
    with pytest.raises(ConfigError, match="norm_position='pre'"):
        transfer.scratch_overrides(backbone, config)
    # Scratch needs a pretrained backbone to copy; groups name given backbones.
    with pytest.raises(ConfigError, match="first pretrained"):
        study(tmp_path / "x", {"scratch": ""}, data=sst2)
    with pytest.raises(ConfigError, match=r"\['minilm'\]"):
        transfer.Study(str(tmp_path), {"pre": backbone},
                       [{"tasks": [TASK], "backbones": ["minilm"]}], config_file=FINETUNE)


def test_in_task_pretraining_is_refused_for_a_task_without_its_text(backbone, tmp_path):
    """SQuAD gives no unlabelled texts: refused before anything is written."""
    with pytest.raises(ConfigError, match="^the transfer study cannot run:\n  squad: "
                       "in-task masked-LM pretraining reads the text of GLUE and tagging "
                       "tasks, not of task 'squad'$"):
        transfer.Study(str(tmp_path / "study"), {"itm": transfer.IN_TASK_PREFIX + backbone},
                       [{"tasks": ("squad",)}], config_file=FINETUNE, in_task_config=str(
                           REPO / "experiments" / "pretrain_bert.py:in_task_mlm"))
    assert not (tmp_path / "study").exists()


@pytest.mark.parametrize("prefix", ["", transfer.IN_TASK_PREFIX])
def test_a_study_is_never_written_into_a_backbone_it_reads(tmp_path, prefix):
    """Refused before anything reads the backbone or writes the study."""
    backbones = transfer.parse_backbones([f"pre={prefix}{tmp_path / 'pre'}"])
    with pytest.raises(WorkdirError, match=f"--backbone=pre={tmp_path / 'pre'}"):
        transfer.Study(str(tmp_path / "pre" / "study"), backbones, [{"tasks": (TASK,)}],
                       config_file=FINETUNE)
    assert not (tmp_path / "pre").exists()


def test_aggregation_gives_mean_and_sample_sd():
    records = [{"task": t, "metric": "eval/accuracy", "backbone": b, "examples": n,
                "seed": s, "value": v, "wall_seconds": w}
               for t, b, n, s, v, w in [
                   ("sst2", "pre", 500, 0, 80.0, 10.0), ("sst2", "pre", 500, 1, 82.0, 20.0),
                   ("sst2", "pre", 500, 2, 87.0, None), ("sst2", "scratch", 500, 0, 70.0, 5.0),
                   ("sst2", "pre", 100, 0, 60.0, None), ("sst2", "pre", 100, 1, float("nan"), 1),
                   ("mrpc", "pre", 3668, 0, 85.0, 3.0), ("mrpc", "pre", 3668, 1, None, 3.0)]]
    rows = transfer.aggregate(records)
    assert [(r["task"], r["backbone"], r["train_examples"], r["seeds"]) for r in rows] == [
        ("sst2", "pre", 100, 1), ("sst2", "pre", 500, 3), ("sst2", "scratch", 500, 1),
        ("mrpc", "pre", 3668, 1)]
    pre = rows[1]
    assert pre["mean"] == pytest.approx(83.0)
    assert pre["sd"] == pytest.approx(np.sqrt(((80 - 83) ** 2 + 1 + 16) / 2))   # ddof=1
    assert (pre["min"], pre["max"], pre["wall_seconds"]) == (80.0, 87.0, 15.0)
    assert rows[0]["sd"] is None and rows[0]["wall_seconds"] is None


def test_results_files_and_figure(tmp_path):
    rows = [{"task": task, "metric": "eval/accuracy", "backbone": b, "train_examples": n,
             "seeds": 3 if b == "pre" else 1, "mean": 80.0 + i, "sd": 1.5 if b == "pre" else None,
             "min": 79.0, "max": 82.0, "wall_seconds": 61.0}
            for task, sizes in (("sst2,steps=800", (500, 2000, 67349)), ("mrpc", (3668,)))
            for i, n in enumerate(sizes) for b in ("pre", "scratch")]
    text = transfer.write_results(rows, str(tmp_path), {"sst2,steps=800": 67349,
                                                         "mrpc": 3668})
    assert text == (tmp_path / "results.md").read_text()
    assert text.startswith("## sst2,steps=800: eval/accuracy\n")
    assert "## mrpc: eval/accuracy" in text
    assert "| pre | 67,349 (all) | 3 | 82 | 1.5 | 79 | 82 | 1m01s |" in text
    assert "| scratch | 500 | 1 | 80 |  | 79 | 82 | 1m01s |" in text
    with open(tmp_path / "results.csv") as f:
        records = list(csv.DictReader(f))
    assert list(records[0]) == list(transfer.CSV_COLUMNS) and len(records) == 8
    assert records[1]["backbone"] == "scratch" and records[1]["sd"] == ""
    path = transfer.plot_learning_curves(rows, str(tmp_path / "curves.png"))
    assert pathlib.Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_dry_run_lists_the_runs_and_writes_nothing(sst2, backbone, tmp_path):
    directory = tmp_path / "study"
    planned = study(directory, {"pre": backbone, "scratch": ""}, data=sst2,
                    train_examples=(0, 20), seeds=(3,))
    text = planned.dry_run()
    assert not directory.exists()
    lines = [line for line in text.splitlines() if line.startswith(f"| {TASK} |")]
    assert lines == [f"| {TASK} | pre | 20 | 3 | 4 | not started | ~{lines[0].split('~')[1]}",
                     *lines[1:]] and len(lines) == 4
    assert [line.split(" | ")[1:4] for line in lines] == [
        ["pre", "20", "3"], ["scratch", "20", "3"],
        ["pre", f"{TRAIN_LINES} (all)", "3"], ["scratch", f"{TRAIN_LINES} (all)", "3"]]
    assert "FLOPs a step at 8e+12 FLOP/s" in text        # peak_flops 1e12 x 8 devices
    assert "4 runs (4 not started); left: ~" in text


def test_the_study_file_and_flags_give_groups(tmp_path):
    groups = transfer.load_study(str(REPO / "experiments" / "transfer_study.py"))
    runs = {(task, b, n, s) for g in groups for task in g.tasks
            for b in g.backbones or ("bert_jax", "scratch", "minilm")
            for n in g.train_examples for s in g.seeds}
    assert len(runs) == 4 * 3 * 3 + 2 * 2 * 3 * 3 + 2 * 3   # 36 + 36 + 6
    assert ("upos,epochs=2", "minilm", 8000, 0) in runs
    assert ("upos,epochs=2", "minilm", 8000, 1) not in runs
    assert ("mrpc", "scratch", 500, 0) not in runs
    assert transfer.Group(tasks=["mrpc"], seeds=["0", "1"], train_examples="0") == \
        transfer.Group(tasks=("mrpc",), seeds=(0, 1), train_examples=(0,))
    for bad, match in ((dict(tasks=()), "tasks"), (dict(tasks=["a b"]), "tasks"),
                       (dict(tasks=["mrpc"], seeds=["x"]), "seeds"),
                       (dict(tasks=["mrpc"], train_examples=[-1]), "at least 0")):
        with pytest.raises(ConfigError, match=match):
            transfer.Group(**bad)
    with pytest.raises(ConfigError, match="'size'"):
        transfer.as_groups([{"tasks": ["mrpc"], "size": [1]}])
    assert transfer.parse_backbones(["a=rel/dir", "b=", "c=''", "d=package:x"]) == {
        "a": os.path.abspath("rel/dir"), "b": "", "c": "", "d": "package:x"}
    for bad in (["a"], ["a=x", "a=y"], ["a b=x"], []):
        with pytest.raises(ConfigError):
            transfer.parse_backbones(bad)


class RateTrainer(FakeTrainer):
    """Scores a run by its learning rate: the pretrained backbone does best at
    5e-5, scratch at 2e-4 (a tie at 1e-4 for the pretrained one: the smaller rate
    wins)."""

    def __call__(self, config, workdir):
        super().__call__(config, workdir)
        best = 5e-5 if config.init_from else 2e-4
        score = 90.0 - abs(np.log2(config.optimizer.learning_rate / best))
        with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
            f.write(json.dumps({"step": int(config.train.num_steps),
                                "eval/accuracy": score}) + "\n")


@pytest.mark.slow
def test_the_learning_rate_is_chosen_on_held_out_training_examples(sst2, backbone, tmp_path,
                                                                    monkeypatch):
    monkeypatch.setattr(sweeps.runner, "count_parameters", lambda config, workdir: 1000)
    fake = RateTrainer()
    grid = (2.5e-5, 1e-4, 2e-4)
    outcome = transfer.Study(
        str(tmp_path), {"pre": backbone, "scratch": ""},
        [{"tasks": (TASK,), "seeds": (0, 1), "train_examples": (20,)}], config_file=FINETUNE,
        base_overrides=base_overrides(sst2), train_fn=fake, log=lambda line: None,
        lr_grid=grid).run()
    selection = [name for name in outcome if name.startswith("lr_selection/")]
    assert len(selection) == 2 * len(grid) and len(outcome) == len(selection) + 4
    assert fake.calls[:6] == [(f"backbone={b},lr={lr!r},n=20", 0)
                              for b in ("pre", "scratch") for lr in grid]
    for name in selection:    # selection never reads dev: the held-out tenth, seed 0
        config = json.loads((tmp_path / name / "config.json").read_text())
        assert config["data"]["eval_split"] == "heldout" and config["seed"] == 0
    chosen = json.loads((tmp_path / transfer.LR_FILE).read_text())
    assert chosen["grid"] == list(grid)
    assert {(c["backbone"], c["learning_rate"]) for c in chosen["chosen"]} == {
        ("pre", 2.5e-5), ("scratch", 2e-4)}
    for b, lr in (("pre", 2.5e-5), ("scratch", 2e-4)):
        for seed in (0, 1):
            config = json.loads((tmp_path / TASK / f"backbone={b},n=20,seed={seed}" /
                                 "config.json").read_text())
            assert config["optimizer"]["learning_rate"] == lr
            assert config["data"]["eval_split"] == "validation"
    # A second launch reuses every run and the same choice.
    again = RateTrainer()
    transfer.Study(str(tmp_path), {"pre": backbone, "scratch": ""},
                   [{"tasks": (TASK,), "seeds": (0, 1), "train_examples": (20,)}],
                   config_file=FINETUNE, base_overrides=base_overrides(sst2), train_fn=again,
                   log=lambda line: None, lr_grid=grid).run()
    assert again.calls == []
    with pytest.raises(ConfigError, match="lr_grid"):
        transfer.Study(str(tmp_path), {"pre": backbone}, [{"tasks": (TASK,)}],
                       config_file=FINETUNE, base_overrides=base_overrides(sst2),
                       lr_grid=(1e-4, 1e-4))


# -- end to end ---------------------------------------------------------------------------


def pretrain_two_steps(tmp_path) -> None:
    """A tiny pretraining of 2 steps into tmp_path/pt: a backbone workdir."""
    from test_bert_pretraining import experiment_config

    pretraining = experiment_config(tmp_path / "tfds", synthetic_documents=24, eval_documents=4,
                                    dupe_factor=1)
    pretraining.update_from_flattened_dict({
        "train.num_steps": 2, "train.eval_every": 2, "train.checkpoint_every": 2,
        "train.log_every": 2, "optimizer.warmup_steps": 1, "peak_flops": 1e12})
    trainer.train_and_evaluate(pretraining, str(tmp_path / "pt"))


@pytest.mark.slow
def test_a_tiny_study_end_to_end(sst2, tmp_path):
    """A pretraining of 2 steps, then the launcher fine-tunes from it and from
    scratch (same architecture, same vocabulary) and writes the results."""
    pretrain_two_steps(tmp_path)

    directory = tmp_path / "study"
    # One length bucket: one compiled train step and one evaluation step a run.
    overrides = {**base_overrides(sst2), "train.log_every": 4, "data.length_buckets": ()}
    result = subprocess.run(
        [sys.executable, str(REPO / "launch" / "transfer_study.py"), f"--workdir={directory}",
         f"--backbone=pt={tmp_path / 'pt'}", "--backbone=scratch=", f"--task={TASK}",
         *(f"--config.{k}={sweeps.flag_text(v)}" for k, v in overrides.items())],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO),
             # The second run loads the steps the first compiled (same shapes).
             "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax_cache"),
             "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
             "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| pt | 40 (all) | 1 |" in result.stdout
    with open(directory / "results.csv") as f:
        records = list(csv.DictReader(f))
    assert [(r["task"], r["backbone"], r["train_examples"], r["seeds"], r["metric"])
            for r in records] == [(TASK, "pt", str(TRAIN_LINES), "1", "eval/accuracy"),
                                  (TASK, "scratch", str(TRAIN_LINES), "1", "eval/accuracy")]
    assert all(0 <= float(r["mean"]) <= 100 and r["sd"] == "" for r in records)
    assert (directory / "results.md").read_text() in result.stdout
    assert (directory / "learning_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    runs = directory / TASK
    configs = {b: json.loads((runs / f"backbone={b},n=0,seed=0" / "config.json").read_text())
               for b in ("pt", "scratch")}
    assert configs["scratch"]["init_from"] == "" and configs["pt"]["init_from"] == str(
        tmp_path / "pt")
    pretrained = json.loads((tmp_path / "pt" / "config.json").read_text())["model"]
    assert pretrained["hidden_size"] == 32 != configs["pt"]["model"]["hidden_size"]
    for field in transfer.ARCHITECTURE:
        if field in pretrained:
            assert configs["scratch"]["model"][field] == pretrained[field], field
    assert configs["scratch"]["data"]["vocab_file"] == str(tmp_path / "pt" / "vocab" /
                                                           "vocab.txt")
    restored = json.loads((runs / "backbone=pt,n=0,seed=0" / "init_from.json").read_text())
    assert len(restored["restored"]) > 10
    assert not (runs / "backbone=scratch,n=0,seed=0" / "init_from.json").exists()


@pytest.mark.slow
def test_in_task_masked_lm_reads_the_text_never_the_labels(sst2, tmp_path):
    """`in_task_mlm:PATH`: the masked LM continues from PATH on the whole
    training split's text, then fine-tuning starts from the result. While it
    runs, every training label is '?' (reading one is a DataError), so the
    in-task run would fail if it read a label; the labelled split comes back
    for fine-tuning, and the finished in-task run is reused, not rerun."""
    from test_bert_pretraining import IN_PROCESS

    pretrain_two_steps(tmp_path)

    glue = tmp_path / "SST-2"
    glue.mkdir()
    (glue / "dev.tsv").write_text((sst2 / "dev.tsv").read_text())
    labelled = (sst2 / "train.tsv").read_text()
    rows = [line.split("\t") for line in labelled.splitlines()[1:]]
    (glue / "train.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t?\n" for t, _ in rows))

    calls = []

    def train(config, workdir):
        calls.append(os.path.relpath(workdir, tmp_path))
        return trainer.train_and_evaluate(config, workdir)

    in_task = {"train.num_steps": 2, "train.eval_every": 2, "train.checkpoint_every": 2,
               "train.log_every": 2, "train.batch_size": 8, "optimizer.warmup_steps": 1,
               "data.max_seq_length": 32, "data.max_predictions_per_seq": 5,
               "data.eval_documents": 2, "data.beam_options": IN_PROCESS, "peak_flops": 1e12}

    def study_here():
        return transfer.Study(
            str(tmp_path / "study"), transfer.parse_backbones([f"itm=in_task_mlm:{tmp_path}/pt"]),
            [{"tasks": (TASK,)}], config_file=FINETUNE,
            base_overrides={**base_overrides(glue), "data.length_buckets": ()},
            train_fn=train, log=lambda line: None,
            in_task_config=str(REPO / "experiments" / "pretrain_bert.py:in_task_mlm"),
            in_task_overrides=in_task)

    run = f"{TASK}/backbone=itm,n=0,seed=0"
    assert study_here().run() == {run: "failed"}    # fine-tuning needs the labels
    mlm = tmp_path / "study" / "in_task_mlm" / TASK / "backbone=itm"
    assert calls == [os.path.relpath(mlm, tmp_path), f"study/{run}"]
    assert (mlm / "checkpoints" / "2").is_dir()
    text = (mlm.parent / transfer.IN_TASK_TEXT).read_text()
    assert text.split() == [w for t, _ in rows for w in t.split()]   # every example, no label
    assert text.count("\n\n") == -(-TRAIN_LINES // transfer.EXAMPLES_PER_DOCUMENT)
    saved = json.loads((mlm / "config.json").read_text())
    assert saved["init_from"] == str(tmp_path / "pt")
    assert saved["data"]["next_sentence_prediction"] is False

    (glue / "train.tsv").write_text(labelled)
    assert "in-task masked-LM runs" not in study_here().dry_run()   # made: not listed
    calls.clear()
    assert study_here().run() == {run: "done"}
    assert calls == [f"study/{run}"]          # the in-task run is reused
    finetuned = tmp_path / "study" / run
    assert json.loads((finetuned / "config.json").read_text())["init_from"] == str(mlm)
    restored = json.loads((finetuned / "init_from.json").read_text())["restored"]
    assert len(restored) > 10
