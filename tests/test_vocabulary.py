"""SentencePiece vocabularies: ids, round trips, workdir reuse; BLEU/chrF."""

import os

import pytest
import sacrebleu

from bert_jax.data import vocabulary
from bert_jax.errors import DataError
from bert_jax.evaluation.translation_metrics import bleu_and_chrf

TEXTS = [f"the {adj} {noun} {verb} the {noun2} quickly today."
         for adj in ("small", "red", "old", "quiet") for noun in ("cat", "dog", "bird")
         for verb in ("sees", "chases", "likes") for noun2 in ("tree", "house", "river")]


@pytest.fixture(scope="module")
def vocab():
    return vocabulary.train(TEXTS * 3, vocab_size=60)


def test_special_ids_and_round_trip(vocab):
    assert vocab.size <= 70
    text = "the quiet bird likes the river quickly today."
    ids = vocab.encode(text)
    assert min(ids) > vocabulary.UNK_ID or vocabulary.UNK_ID not in ids
    assert vocab.decode(ids) == text
    # EOS ends decoding; pad and BOS are dropped.
    assert vocab.decode([vocabulary.BOS_ID, *ids, vocabulary.EOS_ID, 7, 8, 0, 0]) == text


def test_unseen_characters_do_not_break_round_trip_of_known_text(vocab):
    assert vocab.decode(vocab.encode("the cat sees the tree.")) == "the cat sees the tree."


def test_workdir_vocabulary_is_trained_once_and_reused(tmp_path):
    calls = []

    def texts():
        calls.append(1)
        return iter(TEXTS)

    first = vocabulary.load_or_train(str(tmp_path), texts(), 50)
    path = tmp_path / "vocab" / "spm.model"
    assert path.is_file() and first.path == str(path)
    mtime = os.path.getmtime(path)
    second = vocabulary.load_or_train(str(tmp_path), iter(["unused"]), 50)
    assert os.path.getmtime(path) == mtime and len(calls) == 1
    assert second.encode(TEXTS[5]) == first.encode(TEXTS[5])
    with pytest.raises(DataError, match="'vocab_size': 50.*'vocab_size': 500") as error:
        vocabulary.load_or_train(str(tmp_path), iter(TEXTS), 500)
    assert error.value.path == str(path)
    with pytest.raises(FileNotFoundError, match="spm.model"):
        vocabulary.load_or_train(str(tmp_path / "other"), iter(TEXTS), 50, is_writer=False)


def test_bad_model_type():
    with pytest.raises(ValueError, match="model_type='word'"):
        vocabulary.train(TEXTS, 50, model_type="word")


def test_bleu_matches_sacrebleu_and_perfect_is_100():
    refs = ["The cat sat on the mat.", "A dog barks loudly at night."]
    hyps = ["The cat sat on a mat.", "A dog barks at night."]
    scores = bleu_and_chrf(hyps, refs)
    assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert scores["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)
    assert bleu_and_chrf(refs, refs)["bleu"] == pytest.approx(100.0)
    assert 0 < scores["bleu"] < 100
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        bleu_and_chrf(hyps, refs[:1])
