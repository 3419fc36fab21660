"""BERT pretraining: the tfds builder, the task's masking pipeline, the loss."""

import gzip
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.analysis.encoders import load_encoder
from bert_jax.auto_dtype import resolve_model_dtype
from bert_jax.data import bert_pretraining, pretraining_data
from bert_jax.data.bert_pretraining import BertPretraining
from bert_jax.config_schema import config_problems
from bert_jax.errors import ConfigError, DataError
from bert_jax.data.sources import load_source
from bert_jax.data.wordpiece import WordPiece
from bert_jax.modeling.bert import BertForPreTraining
from bert_jax.tasks import build_task
from bert_jax.training import evaluation, trainer
from bert_jax.modeling.losses import bert_pretraining_sums, sums_to_means
from bert_jax.training.workdir import read_metrics
from tiny_models import BERT, random_variables
from helpers import finish, launch

REPO = pathlib.Path(__file__).resolve().parents[1]
EXPERIMENT = REPO / "experiments" / "pretrain_bert.py"
IN_PROCESS = "--direct_num_workers=1 --direct_running_mode=in_memory"  # fast Beam start
TWO_WORKERS = "--direct_num_workers=2 --direct_running_mode=multi_processing"


def experiment_config(data_dir, **data):
    spec = importlib.util.spec_from_file_location("pretrain_bert", EXPERIMENT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(None)
    config.data.update({**dict(synthetic_documents=80, eval_documents=12, vocab_size=120,
                               max_seq_length=48, max_predictions_per_seq=8, dupe_factor=2,
                               beam_options=IN_PROCESS, data_dir=str(data_dir)), **data})
    config.model.update(dict(hidden_size=32, num_heads=2, mlp_dim=64, num_layers=1,
                             max_len=48))
    config.train.batch_size = 8
    return config


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    root = tmp_path_factory.mktemp("pretrain")
    return build_task(experiment_config(root / "tfds"), str(root / "work"))


def initial_params(task):
    """The task's freshly initialised parameters, unboxed."""
    return nn.meta.unbox(jax.jit(task.init_variables)(jax.random.PRNGKey(0))["params"])


def take(iterator, n):
    return [next(iterator) for _ in range(n)]


def assert_batches_equal(a, b):
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_batches_are_bert_inputs(task):
    it = task.train_iterator(0, 1)
    batch = next(it)
    it.close()
    vocab = task.vocab
    ids, types = batch["input_ids"], batch["token_type_ids"]
    assert ids.shape == types.shape == (8, 48)
    assert batch["masked_lm_positions"].shape == (8, 8)
    assert (ids[:, 0] == vocab.cls_id).all()
    for row in range(8):
        real = ids[row] != 0
        assert ((ids[row] == vocab.sep_id) & real).sum() == 2
        length = int(real.sum())
        assert types[row, :length].min() == 0 and types[row, length:].max(initial=0) == 0
        weights = batch["masked_lm_weights"][row] > 0
        positions = batch["masked_lm_positions"][row][weights]
        assert (positions > 0).all() and (positions < length).all()
        # Masked positions hold [MASK], a random token or the original one.
        labels = batch["masked_lm_ids"][row][weights]
        assert not set(labels) & {vocab.cls_id, vocab.sep_id, vocab.pad_id}


def shapes(batch) -> dict:
    return {k: (tuple(v.shape), np.dtype(v.dtype)) for k, v in batch.items()}


def test_batch_spec_of_the_data_free_task_is_the_real_batches(task):
    """`build_task(abstract=True)` (ahead-of-time compilation) reads no data,
    yet gives the shapes of the batches the real task produces."""
    abstract = build_task(task.config, None, abstract=True)
    it = task.train_iterator(0, 1)
    batch = next(it)
    it.close()
    assert shapes(abstract.batch_spec(train=True)) == shapes(batch)
    assert shapes(abstract.batch_spec(train=False)) == shapes(next(iter(
        task.eval_batches(0, 1))))
    assert abstract.model_config.replace(vocab_size=task.vocab.size) == task.model_config


def unmasked_batch(task, n=8):
    """The first `n` training instances as an unmasked batch `[n, max_length]`."""
    source = task._source("train")
    rows = [task._row(source[i]) for i in range(n)]
    pad = lambda x: np.pad(x, (0, task.max_length - len(x)))  # noqa: E731
    return {"input_ids": np.stack([pad(r["input_ids"]) for r in rows]),
            "token_type_ids": np.stack([pad(r["token_type_ids"]) for r in rows]),
            "next_sentence_labels": np.stack([r["next_sentence_labels"] for r in rows])}


def test_same_seed_and_step_give_the_same_batch_and_new_steps_new_masks(task):
    first, second = task.train_iterator(0, 1), task.train_iterator(0, 1)
    try:
        for x, y in zip(take(first, 3), take(second, 3)):
            assert_batches_equal(x, y)
    finally:
        first.close()
        second.close()
    unmasked = unmasked_batch(task)
    step0 = task._mask_batch(dict(unmasked), 0, 0)
    assert_batches_equal(step0, task._mask_batch(dict(unmasked), 0, 0))
    step1 = task._mask_batch(dict(unmasked), 1, 0)
    assert not np.array_equal(step0["masked_lm_positions"], step1["masked_lm_positions"])
    # A process's rows are masked as the same global rows of a one-process run.
    rows_4_to_8 = task._mask_batch({k: v[4:] for k, v in unmasked.items()}, 0, 4)
    assert_batches_equal(rows_4_to_8, {k: v[4:] for k, v in step0.items()})


def test_resumed_iterator_continues_with_the_same_masks(task):
    run = task.train_iterator(0, 1)
    take(run, 2)
    state = run.get_state()
    expected = next(run)
    run.close()
    resumed = task.train_iterator(0, 1)
    resumed.set_state(state)
    assert_batches_equal(next(resumed), expected)
    resumed.close()


@pytest.mark.slow
def test_input_workers_give_the_same_batches_states_and_resume(task):
    plain = task.train_iterator(0, 1)
    expected = [(next(plain), plain.get_state()) for _ in range(3)]
    plain.close()
    config = experiment_config(task.config.data.data_dir)
    config.train.input_workers = 2                                    # rows 0-3, 4-7
    workers = build_task(config, task.workdir).train_iterator(0, 1)
    workers.set_state(expected[0][1])                                 # resumed at step 1
    try:
        for batch, state in expected[1:]:
            assert_batches_equal(next(workers), batch)
            assert workers.get_state() == state
        assert len({process.pid for process, _ in workers._running} - {os.getpid()}) == 2
        with pytest.raises(ValueError, match="other settings"):
            workers.set_state({**state, "seed": 1})
    finally:
        workers.close()


def test_evaluation_masks_are_fixed(task):
    first = list(task.eval_batches(0, 1))
    second = list(task.eval_batches(0, 1))
    assert len(first) == len(second) > 0
    for a, b in zip(first, second):
        assert_batches_equal(a, b)


def test_static_masking_masks_an_instance_the_same_way_every_time(tmp_path):
    config = experiment_config(tmp_path / "tfds", static_masking=True)
    static = build_task(config, str(tmp_path / "work"))
    source = static._source("train")
    a = static._masked_row(source[3], purpose=7, masker=static.train_masker)
    b = static._masked_row(source[3], purpose=7, masker=static.train_masker)
    assert_batches_equal(a, b)
    c = static._masked_row(source[4], purpose=7, masker=static.train_masker)
    assert not np.array_equal(a["input_ids"], c["input_ids"])


def _masked_fraction(batch):
    """Predicted tokens / maskable tokens (real, not [CLS] or [SEP]) of a batch."""
    maskable = (batch["input_ids"] != 0).sum() - 3 * len(batch["input_ids"])
    return (batch["masked_lm_weights"] > 0).sum() / maskable


def test_training_masking_rate_leaves_evaluation_at_the_original(tmp_path):
    task = build_task(experiment_config(tmp_path / "tfds", train_masked_lm_prob=0.4),
                      str(tmp_path / "work"))
    it = task.train_iterator(0, 1)
    train = take(it, 4)
    it.close()
    assert train[0]["masked_lm_positions"].shape == (8, 20)   # ceil(0.4 * 48)
    assert 0.35 < np.mean([_masked_fraction(b) for b in train]) < 0.45
    evaluation = list(task.eval_batches(0, 1))
    assert evaluation[0]["masked_lm_positions"].shape == (8, 8)
    assert 0.1 < np.mean([_masked_fraction(b) for b in evaluation]) < 0.2


def test_a_bad_training_masking_rate_is_named_before_the_data_is_built(tmp_path):
    """The maskers are made on first use, but the train iterator makes them at once:
    not at its first batch, after the trainer has written into the workdir."""
    task = build_task(experiment_config(tmp_path / "tfds", train_masked_lm_prob=1.5),
                      str(tmp_path / "work"))
    with pytest.raises(ValueError, match=r"masked_lm_prob=1.5"):
        task.train_iterator(0, 1)
    assert not (tmp_path / "tfds").exists()


@pytest.mark.slow
def test_random_position_offsets_shift_training_rows_only(tmp_path):
    config = experiment_config(tmp_path / "tfds", random_position_offsets=True)
    config.model.max_len = 64                       # offsets in [0, 64 - 48]
    task = build_task(config, str(tmp_path / "work"))
    unmasked = unmasked_batch(task)
    step0 = task._train_transform(dict(unmasked), 0, 0)
    # The masks are those of a run without offsets; only position_ids is added.
    assert_batches_equal({k: v for k, v in step0.items() if k != "position_ids"},
                         task._mask_batch(dict(unmasked), 0, 0))
    positions = step0["position_ids"]
    offsets = positions[:, 0]
    assert positions.shape == (8, 48) and positions.dtype == np.int32
    np.testing.assert_array_equal(positions, offsets[:, None] + np.arange(48))
    assert offsets.min() >= 0 and offsets.max() <= 16 and len(set(offsets)) > 1
    # Drawn from (seed, step, global row): a process's rows are a one-process run's.
    rows_4_to_8 = task._train_transform({k: v[4:] for k, v in unmasked.items()}, 0, 4)
    np.testing.assert_array_equal(rows_4_to_8["position_ids"], positions[4:])
    step1 = task._train_transform(dict(unmasked), 1, 0)
    assert not np.array_equal(step1["position_ids"], positions)
    it = task.train_iterator(0, 1)
    batch = next(it)
    it.close()
    assert shapes(build_task(config, None, abstract=True).batch_spec()) == shapes(batch)
    assert all("position_ids" not in b for b in task.eval_batches(0, 1))
    # The model reads them: positions 0..47 give the loss of no position_ids.
    params = initial_params(task)
    plain = {k: v for k, v in step0.items() if k != "position_ids"}
    loss = lambda b: float(task.loss_fn(params, b, None)[0])  # noqa: E731
    zero_offsets = {**plain, "position_ids": np.broadcast_to(np.arange(48), (8, 48))}
    assert loss(zero_offsets) == pytest.approx(loss(plain), rel=1e-6)
    assert abs(loss(step0) - loss(plain)) > 1e-4


@pytest.mark.slow
def test_phase_two_starts_its_positions_as_copies_of_phase_one(tmp_path):
    """cpu_wiki's phases in miniature: phase 1 at sequence 16 without offsets
    (rows 16-47 of the position table never trained), phase 2 at 48 from it
    with `init_tile_positions=16`: rows 16-47 start as rows 0-15 repeated
    (one step at learning rate 0 keeps them as they started)."""
    once = {"train.num_steps": 1, "train.eval_every": 1, "train.checkpoint_every": 1,
            "optimizer.warmup_steps": 1}
    phase1 = experiment_config(tmp_path / "tfds", max_seq_length=16, max_predictions_per_seq=3)
    phase1.update_from_flattened_dict(once)
    trainer.train_and_evaluate(phase1, str(tmp_path / "p1"))
    phase2 = experiment_config(tmp_path / "tfds")
    phase2.update_from_flattened_dict({**once, "optimizer.learning_rate": 0.0})
    phase2.init_from, phase2.init_tile_positions = str(tmp_path / "p1"), 16
    trainer.train_and_evaluate(phase2, str(tmp_path / "p2"))
    assert json.load(open(tmp_path / "p2" / "init_from.json"))["tiled_positions_from"] == 16
    table = lambda run: np.asarray(  # noqa: E731
        load_encoder(str(tmp_path / run)).params["embeddings"]["position_embeddings"]["embedding"])
    first, second = table("p1"), table("p2")
    assert not np.allclose(first[16:32], first[:16])
    np.testing.assert_array_equal(second, np.tile(first[:16], (3, 1)))


@pytest.mark.slow
def test_two_phases_short_with_offsets_then_full_length(tmp_path):
    """The README's recipe in miniature: phase 1 at sequence 16 with random
    position offsets, phase 2 at 48 from it (`init_from`), through the trainer."""
    steps = {"train.num_steps": 4, "train.eval_every": 4, "train.checkpoint_every": 4,
             "train.log_every": 2, "optimizer.warmup_steps": 1}
    phase1 = experiment_config(tmp_path / "tfds", max_seq_length=16, max_predictions_per_seq=3,
                               random_position_offsets=True)
    phase1.update_from_flattened_dict(steps)
    trainer.train_and_evaluate(phase1, str(tmp_path / "p1"))
    phase2 = experiment_config(tmp_path / "tfds")
    phase2.update_from_flattened_dict(steps)
    phase2.init_from = str(tmp_path / "p1")
    trainer.train_and_evaluate(phase2, str(tmp_path / "p2"))
    report = json.load(open(tmp_path / "p2" / "init_from.json"))
    assert report["initialised"] == [] and len(report["restored"]) > 10
    evaluations = [m for m in read_metrics(str(tmp_path / "p2")) if "eval/mlm_accuracy" in m]
    assert evaluations and np.isfinite(evaluations[-1]["eval/mlm_nll"])
    # Evaluated again from the workdir alone (its config.json): the same figures.
    workdir = str(tmp_path / "p2")
    again = evaluation.evaluate_checkpoint(evaluation.evaluation_config(workdir), workdir)
    for key in ("eval/mlm_accuracy", "eval/mlm_nll", "eval/nsp_accuracy", "eval/nsp_nll"):
        assert again[key] == evaluations[-1][key], key
    # Its masked LM scored on single segments instead of pairs: an evaluation override.
    requested = evaluation.saved_config(workdir)
    requested.data.next_sentence_prediction = False
    single = evaluation.evaluate_checkpoint(evaluation.evaluation_config(workdir, requested),
                                            workdir)
    assert "eval/mlm_accuracy" in single and "eval/nsp_accuracy" not in single
    # A workdir written before the keys existed reads as pairs, takes the override,
    # and resumes under the config that now names the keys.
    saved = json.load(open(tmp_path / "p2" / "config.json"))
    for key in ("next_sentence_prediction", "vocab_sample", "document_sample"):
        del saved["data"][key]
    json.dump(saved, open(tmp_path / "p2" / "config.json", "w"))
    assert evaluation.saved_config(workdir).data.next_sentence_prediction is True
    assert evaluation.evaluation_config(
        workdir, requested).data.next_sentence_prediction is False
    assert trainer.prepare_workdir(workdir, resolve_model_dtype(phase2)) == workdir
    # The same restore for analyses: the encoder and the run's vocabulary.
    encoder = load_encoder(workdir)
    assert encoder.vocab.path.startswith(str(tmp_path / "p1"))   # the run's: phase 1's
    assert encoder.vocab.size == encoder.config.vocab_size
    _, _, params, _ = evaluation.restore_for_inference(evaluation.saved_config(workdir),
                                                       workdir)
    jax.tree.map(np.testing.assert_array_equal, encoder.params, params["bert"])
    result = subprocess.run(
        [sys.executable, str(REPO / "launch" / "visualize_attention.py"),
         f"--workdir={workdir}", f"--output_dir={tmp_path / 'maps'}", "--layers=0",
         "--no_single_heads", "--token=", "--sentence=the cat sat"],
        capture_output=True, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"),
        timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert os.listdir(tmp_path / "maps") == ["layer0_heads.png"]


@pytest.mark.slow
def test_loss_and_evaluation_run(task):
    params = initial_params(task)
    batch = next(iter(task.eval_batches(0, 1)))
    sums = task.predict(params, batch)["sums"]
    means = sums_to_means({k: v for k, v in sums.items() if k != "weight"}, sums["weight"])
    assert 0 <= float(means["mlm_accuracy"]) <= 1 and 0 <= float(means["nsp_accuracy"]) <= 1
    # Chance level: the MLM nll is about log(vocab) for a random model.
    assert abs(float(means["mlm_nll"]) - np.log(task.vocab.size)) < 1.5


@pytest.mark.slow
def test_mlm_head_at_masked_positions_gives_the_loss_of_every_position():
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(5, 50, (2, 12)), jnp.int32)
    positions = jnp.array([[1, 3, 5, 0], [2, 4, 8, 9]], jnp.int32)
    batch = {"masked_lm_ids": jnp.asarray(rng.integers(5, 50, (2, 4)), jnp.int32),
             "masked_lm_weights": jnp.array([[1, 1, 1, 0], [1, 1, 1, 1]], jnp.float32),
             "next_sentence_labels": jnp.array([0, 1], jnp.int32)}
    model = BertForPreTraining(BERT)
    variables = random_variables(model, ids)
    gathered = model.apply(variables, ids, None, None, positions)
    everywhere = model.apply(variables, ids)
    selected = jnp.take_along_axis(everywhere.mlm_logits, positions[..., None], axis=1)
    a = bert_pretraining_sums(gathered.mlm_logits, gathered.nsp_logits, batch)
    b = bert_pretraining_sums(selected, everywhere.nsp_logits, batch)
    for key in a:
        np.testing.assert_allclose(float(a[key]), float(b[key]), rtol=1e-6, err_msg=key)


@pytest.mark.slow
def test_nsp_metrics_are_per_real_sequence():
    logits = jnp.zeros((3, 4, 10))
    nsp = jnp.array([[5.0, 0.0], [0.0, 5.0], [5.0, 0.0]])
    batch = {"masked_lm_ids": jnp.zeros((3, 4), jnp.int32),
             "masked_lm_weights": jnp.ones((3, 4)),
             "next_sentence_labels": jnp.array([0, 0, 0], jnp.int32)}
    sums = bert_pretraining_sums(logits, nsp, batch,
                                 sequence_weights=jnp.array([1.0, 1.0, 0.0]))
    means = sums_to_means({k: v for k, v in sums.items() if k != "weight"}, sums["weight"])
    assert float(means["nsp_accuracy"]) == pytest.approx(0.5)   # the padding row is ignored
    assert float(means["mlm_nll"]) == pytest.approx(np.log(10), rel=1e-6)


@pytest.mark.slow
def test_without_next_sentence_the_loss_is_the_masked_lm_one():
    rng = np.random.default_rng(0)
    mlm = jnp.asarray(rng.normal(size=(2, 4, 10)), jnp.float32)
    batch = {"masked_lm_ids": jnp.asarray(rng.integers(0, 10, (2, 4)), jnp.int32),
             "masked_lm_weights": jnp.ones((2, 4)),
             "next_sentence_labels": jnp.array([0, 1], jnp.int32)}
    pairs = bert_pretraining_sums(mlm, jnp.array([[3.0, 0.0], [3.0, 0.0]]), batch)
    single = bert_pretraining_sums(mlm, jnp.full((2, 2), jnp.nan), batch, next_sentence=False)
    assert set(single) == {"loss", "weight", "mlm_nll", "mlm_accuracy"}
    assert float(single["loss"]) == pytest.approx(float(pairs["mlm_nll"]), rel=1e-6)
    assert float(pairs["loss"]) > float(single["loss"]) + 1.0   # the NSP term: one wrong


@pytest.mark.slow
def test_task_without_next_sentence_builds_single_segments_and_drops_nsp(tmp_path):
    config = experiment_config(tmp_path / "tfds", next_sentence_prediction=False)
    task = build_task(config, str(tmp_path / "work"))
    with_pairs = build_task(experiment_config(tmp_path / "tfds"), str(tmp_path / "pairs"))
    names = [t.dataset_builder().builder_config.name for t in (task, with_pairs)]
    assert names[0] != names[1]   # built apart
    batch = next(iter(task.eval_batches(0, 1)))
    real = batch["input_ids"] != 0
    assert not batch["token_type_ids"].any() and not batch["next_sentence_labels"].any()
    assert ((batch["input_ids"] == task.vocab.sep_id).sum(axis=1) == real.any(axis=1)).all()
    params = initial_params(task)
    assert not any(key.startswith("nsp") for key in task.predict(params, batch)["sums"])
    loss, weight, metrics = task.loss_fn(params, batch, None)
    assert float(loss / weight) == pytest.approx(float(metrics["mlm_nll"] / weight), rel=1e-6)


def numbered_corpus(tmp_path, num_documents=30):
    """A corpus whose every line names its document ("document 7 line 2 ..."),
    and a vocabulary trained on it."""
    documents = [[f"document {d} line {i} " + " ".join(["word"] * (3 + i % 5))
                  for i in range(6)] for d in range(num_documents)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join("\n".join(d) for d in documents) + "\n")
    vocab = WordPiece.train([line for d in documents for line in d], vocab_size=100)
    return str(corpus), vocab, vocab.save(str(tmp_path / "vocab"))


def numbered_builder(tmp_path, folder, beam_options=IN_PROCESS, **options):
    corpus, vocab, vocab_file = numbered_corpus(tmp_path)
    options = {"max_seq_length": 32, "eval_documents": 5, "dupe_factor": 2, "seed": 1,
               "documents_per_shard": 8, **options}
    return vocab, BertPretraining(files=[corpus], vocab_file=vocab_file,
                                  beam_options=beam_options,
                                  data_dir=str(tmp_path / folder), **options)


def document_numbers(vocab, example):
    """The numbers of the documents of A and B ("document N" in their text)."""
    tokens, segments = example["tokens"], example["segment_ids"]
    return [int(text.split("document ")[1].split()[0]) if "document " in text else None
            for text in (vocab.decode(tokens[segments == s]) for s in (0, 1))]


def test_builder_holds_out_whole_documents_by_hash_and_pairs_within_shards(tmp_path):
    vocab, builder = numbered_builder(tmp_path, "tfds")
    train, validation = load_source(builder, "train"), load_source(builder, "validation")
    assert len(train) > len(validation) > 0
    # The rule: the eval_documents documents of smallest hash of (seed, file, position).
    held_out = set(sorted(range(30), key=lambda p: bert_pretraining._derived_int(
        1, "corpus.txt", p))[:5])
    pairs = {split: [document_numbers(vocab, source[i]) for i in range(len(source))]
             for split, source in (("train", train), ("validation", validation))}
    seen = {split: {d for pair in p for d in pair if d is not None}
            for split, p in pairs.items()}
    assert seen["validation"] == held_out and not seen["train"] & held_out
    # A random next "B" comes from another document of the same shard (8 documents).
    for i, (a, b) in enumerate(pairs["train"]):
        if a is not None and b is not None:
            assert a // 8 == b // 8 and (a != b) == bool(train[i]["next_sentence_label"])
    # Statistics of what was written.
    metadata = builder.info.metadata["corpus"]
    assert metadata["documents"] == 30 and metadata["lines"] == 180
    assert metadata["eval_documents"] == 5 and metadata["train_documents"] == 25
    assert metadata["shards"] == 4 and metadata["unpaired_documents"] == 0
    for split, source in (("train", train), ("validation", validation)):
        assert metadata["instances"][split] == len(source)
        labels = [int(source[i]["next_sentence_label"]) for i in range(len(source))]
        assert metadata["random_next"][split] == pytest.approx(np.mean(labels))
    indices = [int(train[i]["index"]) for i in range(len(train))]
    assert len(set(indices)) == len(indices) and min(indices) >= 0
    # Each shard of the corpus was written by its worker as one tfds shard of
    # train, in the corpus's order (nothing holds more than one shard).
    lengths = builder.info.splits["train"].shard_lengths
    assert len(lengths) == 4 and sum(lengths) == len(train)
    for k, end in enumerate(np.cumsum(lengths)):
        documents = {d for pair in pairs["train"][end - lengths[k]:end] for d in pair
                     if d is not None}
        assert documents and {d // 8 for d in documents} == {k}


def test_statistics_of_files_empty_files_and_unpaired_shards(tmp_path):
    """Documents never span files; an empty file is recorded; a shard left with
    one document cannot pair it and is counted."""
    texts = {"a.txt": "one two\nthree\n\nshort\n\nfour five\nsix\n",   # 3 documents
             "empty.txt": "", "b.txt": "seven\neight\nnine\n"}          # 1 document
    for name, text in texts.items():
        (tmp_path / name).write_text(text)
    vocab_file = WordPiece.train(list(texts.values()), vocab_size=60).save(str(tmp_path / "v"))
    builder = BertPretraining(files=[str(tmp_path / n) for n in texts], vocab_file=vocab_file,
                              max_seq_length=16, dupe_factor=1, documents_per_shard=2,
                              beam_options=IN_PROCESS, data_dir=str(tmp_path / "tfds"))
    train = load_source(builder, "train")
    metadata = builder.info.metadata["corpus"]
    assert metadata["empty_files"] == [str(tmp_path / "empty.txt")]
    assert (metadata["documents"], metadata["lines"], metadata["one_line_documents"]) == (4, 8, 1)
    # a.txt: one shard of 3 (a last shard of 1 joins the one before); b.txt: 1, unpaired.
    assert (metadata["shards"], metadata["unpaired_documents"]) == (2, 1)
    assert metadata["instances"] == {"train": len(train)}
    texts_seen = " ".join(WordPiece.from_vocab_file(vocab_file).decode(train[i]["tokens"])
                          for i in range(len(train)))
    assert "short" in texts_seen and "seven" not in texts_seen


def examples_of(builder):
    return {split: [{k: np.asarray(v).tolist() for k, v in source[i].items()}
                    for i in range(len(source))]
            for split in ("train", "validation") for source in [load_source(builder, split)]}


def test_a_document_sample_cuts_only_its_documents_and_keeps_the_held_out_ones(tmp_path):
    vocab, whole = numbered_builder(tmp_path, "whole")
    _, sampled = numbered_builder(tmp_path, "half", document_sample=0.5)
    train = load_source(sampled, "train")
    seen = {d for i in range(len(train)) for d in document_numbers(vocab, train[i])
            if d is not None}
    validation = load_source(whole, "validation")
    held_out = {d for i in range(len(validation))
                for d in document_numbers(vocab, validation[i]) if d is not None}
    corpus = str(tmp_path / "corpus.txt")
    chosen = {d for d in range(30) if d not in held_out and bert_pretraining.in_sample(
        0.5, 1, "train/32", corpus, d)}
    assert seen == chosen and 5 < len(chosen) < 20
    assert examples_of(sampled)["validation"] == examples_of(whole)["validation"]
    metadata = sampled.info.metadata["corpus"]
    assert metadata["document_sample"] == 0.5
    assert metadata["train_documents"] == len(chosen)
    # Another sequence length draws other documents (two phases read more text).
    assert chosen != {d for d in range(30) if d not in held_out and bert_pretraining.in_sample(
        0.5, 1, "train/128", corpus, d)}


def test_one_and_two_workers_build_the_same_dataset(tmp_path):
    _, one = numbered_builder(tmp_path, "one")
    _, two = numbered_builder(tmp_path, "two", beam_options=TWO_WORKERS)
    assert examples_of(one) == examples_of(two)
    assert one.info.metadata["corpus"] == two.info.metadata["corpus"]
    # The held-out documents do not depend on the shards.
    _, other_shards = numbered_builder(tmp_path, "other", documents_per_shard=12)
    validation = examples_of(other_shards)["validation"]
    assert validation == examples_of(one)["validation"]


def test_a_gzip_corpus_gives_the_instances_of_the_same_text(tmp_path):
    """Read as a stream everywhere: the vocabulary's text, the shard scan and
    each shard's resumption from its offset (4 shards of 8 documents)."""
    _, plain = numbered_builder(tmp_path, "plain")
    packed = tmp_path / "packed" / "corpus.txt.gz"
    packed.parent.mkdir()
    packed.write_bytes(gzip.compress((tmp_path / "corpus.txt").read_bytes()))
    compressed = BertPretraining(files=[str(packed)],
                                 vocab_file=plain.builder_config.vocab_file,
                                 max_seq_length=32, eval_documents=5, dupe_factor=2, seed=1,
                                 documents_per_shard=8, beam_options=IN_PROCESS,
                                 data_dir=str(tmp_path / "gz"))
    assert examples_of(compressed) == examples_of(plain)
    assert compressed.info.metadata["corpus"]["shards"] == 4
    lines = list(bert_pretraining.corpus_lines([str(tmp_path / "corpus.txt")], 0.5, seed=3))
    assert 0 < len(lines) < 180
    assert list(bert_pretraining.corpus_lines([str(packed)], 0.5, seed=3)) == lines


def test_a_truncated_or_damaged_gzip_is_one_line_naming_the_file(tmp_path):
    corpus, _, vocab_file = numbered_corpus(tmp_path)
    whole = gzip.compress(pathlib.Path(corpus).read_bytes())
    damaged = bytearray(whole)
    damaged[len(whole) // 2] ^= 0xFF
    bad = {"cut.txt.gz": whole[:len(whole) // 2], "flipped.txt.gz": bytes(damaged),
           "plain.txt.gz": pathlib.Path(corpus).read_bytes()}
    for name, content in bad.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(DataError, match="damaged or truncated gzip") as error:
            list(pretraining_data.iter_documents(str(tmp_path / name)))
        assert error.value.path == str(tmp_path / name)
    builder = BertPretraining(files=[str(tmp_path / "cut.txt.gz")], vocab_file=vocab_file,
                              beam_options=IN_PROCESS, data_dir=str(tmp_path / "tfds"))
    with pytest.raises(DataError, match="cut.txt.gz: damaged or truncated gzip"):
        load_source(builder, "train")
    # Through the command line, where the vocabulary is trained on it first.
    code, out = finish(launch("train.py", tmp_path / "run", {
        "data.synthetic_documents": 0, "data.corpus_files": (str(tmp_path / "cut.txt.gz"),),
        "data.data_dir": str(tmp_path / "tfds")}, config="pretrain_bert.py"))
    assert code == 2 and "Traceback" not in out, out
    assert out.splitlines()[-1].startswith(
        f"error: {tmp_path / 'cut.txt.gz'}: damaged or truncated gzip"), out


def test_builder_rejects_bad_parameters(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("a b\nc d\n\ne f\n")
    vocab_file = WordPiece.train(["a b c d e f"], vocab_size=40).save(str(tmp_path / "v"))
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        BertPretraining(files=[str(tmp_path / "missing.txt")], vocab_file=vocab_file)
    # A caller's bad option is a ValueError (a config's is refused before: below).
    for bad in (dict(files=[f"{corpus}:markdown"]), dict(max_seq_length=4),
                dict(eval_documents=1)):
        with pytest.raises(ValueError, match=("format 'markdown'" if "files" in bad else
                                              "^bert_pretraining: {}={}; use ".format(
                                                  *next(iter(bad.items()))))) as error:
            BertPretraining(**{"files": [str(corpus)], "vocab_file": vocab_file, **bad})
        assert not isinstance(error.value, ConfigError)
    builder = BertPretraining(files=[str(corpus)], vocab_file=vocab_file, eval_documents=2,
                              beam_options=IN_PROCESS, data_dir=str(tmp_path / "tfds"))
    with pytest.raises(DataError, match=r"eval_documents=2 leaves \d of \d documents") as error:
        load_source(builder, "train")  # a fact of the corpus: it names the file
    assert error.value.path == str(corpus.resolve()) and "lower it" in error.value.fix


def test_the_config_rules_name_bad_options_before_anything_is_built(tmp_path):
    """`config_schema`'s rule of the build options, as the trainer's checks and
    launch/build_pretraining_data.py apply it, names every bad one."""
    config = experiment_config(tmp_path, max_seq_length=4, dupe_factor=0, eval_documents=1,
                               short_seq_prob=1.5, documents_per_shard=1, vocab_sample=0.0,
                               document_sample=2.0, corpus_files=("c.txt:markdown", "d.txt"))
    assert [p for p in config_problems(config) if p.startswith("config.data.")] == [
        "config.data.max_seq_length=4; use at least 8",
        "config.data.short_seq_prob=1.5; use a probability",
        "config.data.dupe_factor=0; use at least 1",
        "config.data.eval_documents=1; use 0, or at least 2 for random-next pairs",
        "config.data.documents_per_shard=1; use at least 2",
        "config.data.document_sample=2.0; use a fraction in (0, 1]",
        "config.data.vocab_sample=0.0; use a fraction in (0, 1]",
        "config.data.corpus_files: 'c.txt:markdown' has format 'markdown'; use one of "
        "('blank_lines', 'paragraphs', 'wikitext')"]
    assert config_problems(experiment_config(tmp_path)) == []


@pytest.mark.parametrize("beam_options", [IN_PROCESS, TWO_WORKERS])
def test_invalid_utf8_is_reported_before_anything_is_written(tmp_path, beam_options):
    corpus = tmp_path / "bad.txt"
    corpus.write_bytes(b"fine line\nanother\n\nbad \xff byte\n")
    vocab_file = WordPiece.train(["fine line another bad byte"], vocab_size=60).save(
        str(tmp_path / "v"))
    builder = BertPretraining(files=[str(corpus)], vocab_file=vocab_file,
                              beam_options=beam_options, data_dir=str(tmp_path / "tfds"))
    with pytest.raises(DataError, match=r"bad.txt:4:5") as error:
        load_source(builder, "train")
    assert (error.value.path, error.value.line, error.value.column) == (str(corpus), 4, 5)
    assert not list((tmp_path / "tfds").rglob("dataset_info.json"))
