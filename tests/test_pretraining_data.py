"""Tests of `bert_jax.data.pretraining_data`: reading corpora, NSP pairs, masked LM.

Statistical checks use binomial bounds of 5 standard deviations, on fixed seeds
(so they are deterministic; the bounds only say the seeds are not special).
"""

from __future__ import annotations

import itertools
import math
import random
import zlib

import numpy as np
import pytest

from bert_jax.data.pretraining_data import (
    Instance,
    Masker,
    MaskingConfig,
    create_instances,
    create_instances_from_document,
    iter_documents,
    masking_rng,
    read_documents,
    split_sentences,
    tokenize_documents,
    truncate_seq_pair,
)
from bert_jax.data.wordpiece import WordPiece
from bert_jax.errors import DataError

# Ids of the hand-made vocabulary of the masking tests.
PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
SPECIAL = (PAD, UNK, CLS, SEP, MASK)
VOCAB_SIZE = 100
WORD_STARTS = range(5, 50)   # whole-word tests: 5..49 start words,
CONTINUATIONS = range(50, 100)  # 50..99 are '##' pieces


def _write(tmp_path, name: str, data: str | bytes) -> str:
    path = tmp_path / name
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.write_bytes(data)
    return str(path)


def _within(count: int, n: int, p: float, sigmas: float = 5.0) -> bool:
    """`count` successes of `n` are within `sigmas` standard deviations of Binomial(n, p)."""
    return abs(count - n * p) <= sigmas * math.sqrt(n * p * (1 - p))


# -- reading --------------------------------------------------------------------------


def test_read_documents_blank_lines(tmp_path):
    text = "\n  first line.  \nsecond line\n\n\n\nalone\n \t \nx\ny\r\nz\n"
    path = _write(tmp_path, "c.txt", text)
    assert read_documents(path) == [["first line.", "second line"], ["alone"], ["x", "y", "z"]]


@pytest.mark.parametrize("paragraph, sentences", [
    ("Johann S. Bach was born in 1685. He wrote music, e.g. the Mass in B minor.",
     ["Johann S. Bach was born in 1685.", "He wrote music, e.g. the Mass in B minor."]),
    ('Mr. Smith said "Hello!" Then he left. The U.S. Army won? Yes.',
     ['Mr. Smith said "Hello!"', "Then he left.", "The U.S. Army won?", "Yes."]),
    ("This film is great. (Really.) 10 out of 10... and more", [
        "This film is great.", "(Really.)", "10 out of 10... and more"]),
    ("no capital after the stop. so one sentence", ["no capital after the stop. so one sentence"]),
])
def test_split_sentences(paragraph, sentences):
    assert split_sentences(paragraph) == sentences


def test_paragraphs_are_documents_of_sentences(tmp_path):
    text = "First one. Second one.\nThird one.\n\nAlone. Really alone.\n"
    path = _write(tmp_path, "c.txt", text)
    assert read_documents(path, "paragraphs") == [
        ["First one.", "Second one.", "Third one."], ["Alone.", "Really alone."]]
    assert ([d.start for d in iter_documents(path, "paragraphs")]
            == [d.start for d in iter_documents(path)])


def test_read_documents_wikitext(tmp_path):
    text = ("\n = Alpha = \n\n Alpha is a letter . \n\n = = History = = \n\n It is old . \n"
            " = = = Early = = = \n Very old . \n\n = Beta = \n\n Beta follows alpha . \n"
            " = = = = Deep = = = = \n\n Second line of beta . \n")
    path = _write(tmp_path, "wiki.raw", text)
    assert read_documents(path, "wikitext") == [
        ["Alpha is a letter .", "It is old .", "Very old ."],
        ["Beta follows alpha .", "Second line of beta ."]]
    # The same file as blank-line documents keeps every non-blank line.
    assert read_documents(path)[0] == ["= Alpha ="]


def test_iter_documents_resumes_at_a_documents_start(tmp_path):
    """A worker reads one shard from its first document's (byte offset, line):
    the documents from there are those of the whole file from there on, and
    errors still name the file's line."""
    texts = {"blank_lines": "\ufeffone a\none b\n\n\nnaïve two\n\nthree\n\n\xff\n",
             "wikitext": (" = A = \n a1 \n = = H = = \n a2 \n = B = \n\n b1 \n = C = \n c1 \n"
                          " = D = \n\xff\n")}
    for fmt, text in texts.items():
        path = tmp_path / f"{fmt}.txt"
        path.write_bytes(text.encode().replace(b"\xc3\xbf", b"\xff"))  # a bad last line
        whole = list(itertools.islice(iter_documents(str(path), fmt), 3))
        assert len(whole) == 3
        for k, document in enumerate(whole):
            resumed = itertools.islice(iter_documents(str(path), fmt, document.start), 3 - k)
            assert list(resumed) == whole[k:]
        with pytest.raises(DataError, match=rf"{fmt}.txt:{text.count(chr(10))}:1"):
            list(iter_documents(str(path), fmt, whole[-1].start))


def test_read_documents_bom_and_empty(tmp_path):
    bom = b"\xef\xbb\xbf"
    path = _write(tmp_path, "bom.txt", bom + "héllo\nworld\n\nnext\n".encode())
    assert read_documents(path) == [["héllo", "world"], ["next"]]
    wiki = _write(tmp_path, "bom.raw", bom + b" = T = \n text \n")
    assert read_documents(wiki, "wikitext") == [["text"]]
    assert read_documents(_write(tmp_path, "empty.txt", b"")) == []
    assert read_documents(_write(tmp_path, "blank.txt", "\n \n\n")) == []


def test_invalid_utf8_names_file_and_line(tmp_path):
    path = _write(tmp_path, "bad.txt", b"good line\n\nstill good\nbad \xff byte\nlast\n")
    with pytest.raises(DataError) as info:
        read_documents(path)
    assert (info.value.path, info.value.line) == (str(path), 4)
    assert f"{path}:4:" in str(info.value)


def test_read_documents_errors(tmp_path):
    path = _write(tmp_path, "c.txt", "a\n")
    with pytest.raises(ValueError, match="document_format"):
        read_documents(path, "xml")
    missing = str(tmp_path / "missing.txt")
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        read_documents(missing)


# -- sentence pairs --------------------------------------------------------------------


def test_truncate_seq_pair():
    rng = random.Random(0)
    a, b = list(range(10)), [100, 101, 102, 103]
    truncate_seq_pair(a, b, 8, rng)
    assert len(a) == 4 and b == [100, 101, 102, 103]       # only the longer one is cut
    assert a == list(range(a[0], a[0] + 4))                 # a contiguous run remains
    a, b = [1, 2, 3], [4, 5, 6]
    truncate_seq_pair(a, b, 5, rng)
    assert a == [1, 2, 3] and len(b) == 2                   # ties cut B
    state = rng.getstate()
    truncate_seq_pair(a, b, 5, rng)
    assert rng.getstate() == state                          # within the limit: untouched
    firsts, lasts = set(), set()
    for seed in range(50):
        a = list(range(20))
        truncate_seq_pair(a, [], 10, random.Random(seed))
        assert len(a) == 10 and a == list(range(a[0], a[0] + 10))
        firsts.add(a[0])
        lasts.add(a[-1])
    assert len(firsts) > 3 and len(lasts) > 3               # both ends are cut


def _id_documents(num_documents: int, seed: int, min_segments=10, max_segments=30,
                  min_length=3, max_length=12) -> list[list[list[int]]]:
    """Documents of segments whose ids are unique over the corpus (1000, 1001, ...),
    so that a token tells its document and position."""
    rng = random.Random(seed)
    next_id, documents = 1000, []
    for _ in range(num_documents):
        document = []
        for _ in range(rng.randint(min_segments, max_segments)):
            length = rng.randint(min_length, max_length)
            document.append(list(range(next_id, next_id + length)))
            next_id += length
        documents.append(document)
    return documents


def _split(instance: Instance) -> tuple[list[int], list[int]]:
    """(A, B) of `[CLS] A [SEP] B [SEP]`, checking the framing and segment ids."""
    tokens, segment_ids = instance.tokens, instance.segment_ids
    assert tokens[0] == CLS and tokens[-1] == SEP and tokens.count(SEP) == 2
    first_sep = tokens.index(SEP)
    assert len(segment_ids) == len(tokens)
    assert segment_ids == [0] * (first_sep + 1) + [1] * (len(tokens) - first_sep - 1)
    return tokens[1:first_sep], tokens[first_sep + 1:-1]


def test_instances_structure():
    documents = _id_documents(30, seed=1)
    flat = [[t for segment in document for t in segment] for document in documents]
    where = {t: (d, i) for d, tokens in enumerate(flat) for i, t in enumerate(tokens)}
    instances = create_instances(documents, max_seq_length=48, short_seq_prob=0.1,
                                 dupe_factor=3, seed=0, cls_id=CLS, sep_id=SEP)
    assert len(instances) > 300
    for instance in instances:
        assert len(instance.tokens) <= 48
        a, b = _split(instance)
        assert a and b
        # A and B are contiguous runs of their documents' tokens.
        (doc_a, start_a), (doc_b, start_b) = where[a[0]], where[b[0]]
        assert a == flat[doc_a][start_a:start_a + len(a)]
        assert b == flat[doc_b][start_b:start_b + len(b)]
        assert (doc_a, doc_b) == (instance.document, instance.next_document)
        if instance.is_random_next:
            assert instance.next_document != instance.document
        else:
            assert instance.next_document == instance.document
            assert start_b >= start_a + len(a)              # the actual next follows A


def test_without_next_sentence_an_instance_is_one_contiguous_segment():
    """`next_sentence=False` (RoBERTa's DOC-SENTENCES): `[CLS] text [SEP]`, all
    segment 0, text a contiguous run of one document, never a random next; and
    one document is enough."""
    documents = _id_documents(30, seed=1)
    flat = [[t for segment in document for t in segment] for document in documents]
    where = {t: (d, i) for d, tokens in enumerate(flat) for i, t in enumerate(tokens)}
    kwargs = dict(max_seq_length=48, short_seq_prob=0.1, seed=0, cls_id=CLS, sep_id=SEP,
                  next_sentence=False)
    instances = create_instances(documents, dupe_factor=3, **kwargs)
    assert len(instances) > 100
    for instance in instances:
        tokens = instance.tokens
        assert len(tokens) <= 48 and (tokens[0], tokens[-1]) == (CLS, SEP)
        assert instance.segment_ids == [0] * len(tokens) and SEP not in tokens[1:-1]
        document, start = where[tokens[1]]
        assert tokens[1:-1] == flat[document][start:start + len(tokens) - 2]
        assert not instance.is_random_next
        assert instance.document == instance.next_document == document
    # Chunks are cut where pairs are: the one pass of a document covers all of
    # it but what truncation cut (a chunk's last segment may overrun the target).
    single = create_instances(documents[:1], dupe_factor=1, **kwargs)
    covered = {t for instance in single for t in instance.tokens[1:-1]}
    assert covered <= set(flat[0]) and len(covered) > 0.8 * len(flat[0])


def test_random_next_never_same_document():
    # With 2 documents, the original's 10 tries fail ~1/1024 of the time; here never.
    documents = _id_documents(2, seed=3, min_segments=40, max_segments=60)
    instances = create_instances(documents, max_seq_length=24, short_seq_prob=0.0,
                                 dupe_factor=20, seed=0, cls_id=CLS, sep_id=SEP)
    randoms = [i for i in instances if i.is_random_next]
    assert len(randoms) > 300
    assert all(i.next_document == 1 - i.document for i in randoms)


def test_nsp_labels_balanced():
    # One-token segments: chunks almost always have >= 2 segments, where the
    # label is a fair coin (a one-segment chunk is always a random next, as the
    # original; that happens at most at the end of a document).
    rng = random.Random(0)
    documents = [[[1000 + rng.randrange(5000)] for _ in range(rng.randint(400, 600))]
                 for _ in range(60)]
    instances = create_instances(documents, max_seq_length=64, short_seq_prob=0.0,
                                 dupe_factor=5, seed=0, cls_id=CLS, sep_id=SEP)
    n = len(instances)
    num_random = sum(i.is_random_next for i in instances)
    assert n > 3000
    assert abs(num_random / n - 0.5) <= 5 * math.sqrt(0.25 / n) + 0.01, num_random / n


def test_lengths_follow_short_seq_prob():
    documents = _id_documents(40, seed=2, min_segments=30, max_segments=60)
    kwargs = dict(max_seq_length=64, dupe_factor=2, seed=0, cls_id=CLS, sep_id=SEP)
    full = np.array([len(i.tokens) for i in create_instances(documents, short_seq_prob=0.0,
                                                             **kwargs)])
    assert full.max() <= 64
    assert np.median(full) == 64 and np.mean(full >= 0.9 * 64) > 0.7
    short = np.array([len(i.tokens) for i in create_instances(documents, short_seq_prob=1.0,
                                                              **kwargs)])
    assert short.max() <= 64 and np.median(short) < 45 and short.min() <= 10


def test_create_instances_deterministic():
    documents = _id_documents(20, seed=4)
    kwargs = dict(max_seq_length=40, short_seq_prob=0.1, dupe_factor=2, cls_id=CLS, sep_id=SEP)
    first = create_instances(documents, seed=7, **kwargs)
    assert first == create_instances(documents, seed=7, **kwargs)
    assert first != create_instances(documents, seed=8, **kwargs)


def test_create_instances_empty_documents_and_errors():
    documents = _id_documents(4, seed=5)
    with_empty = [[], documents[0], [[], []], documents[1], documents[2], documents[3]]
    instances = create_instances(with_empty, max_seq_length=32, short_seq_prob=0.0,
                                 dupe_factor=2, seed=0, cls_id=CLS, sep_id=SEP)
    used = {i.document for i in instances} | {i.next_document for i in instances}
    assert used == {1, 3, 4, 5}                     # indices of the list as given
    reference = create_instances(documents, max_seq_length=32, short_seq_prob=0.0,
                                 dupe_factor=2, seed=0, cls_id=CLS, sep_id=SEP)
    assert [i.tokens for i in instances] == [i.tokens for i in reference]
    with pytest.raises(ValueError, match="at least 2"):
        create_instances([documents[0], [], [[]]], max_seq_length=32, short_seq_prob=0.0,
                         dupe_factor=1, seed=0, cls_id=CLS, sep_id=SEP)
    with pytest.raises(ValueError, match="0 non-empty document"):
        create_instances([[], [[]]], max_seq_length=32, short_seq_prob=0.0, dupe_factor=1,
                         seed=0, cls_id=CLS, sep_id=SEP, next_sentence=False)
    with pytest.raises(ValueError, match="max_seq_length"):
        create_instances(documents, max_seq_length=4, short_seq_prob=0.0, dupe_factor=1,
                         seed=0, cls_id=CLS, sep_id=SEP)
    with pytest.raises(ValueError, match="at least 2"):
        create_instances_from_document(documents[:1], 0, max_seq_length=32, short_seq_prob=0.0,
                                       rng=random.Random(0), cls_id=CLS, sep_id=SEP)


def test_text_corpus_end_to_end(tmp_path):
    """Text files -> WordPiece ids -> pairs -> masks, with a line far longer than
    max_seq_length and a one-line document."""
    sentences = [f"the {w} market rose by {n} points on {d} trading" for w, n, d in
                 zip(["stock", "bond", "grain", "oil"] * 5, range(20), ["heavy", "light"] * 10)]
    long_line = " ".join(["commodities traders reported unusually volatile sessions"] * 40)
    text = ("\n".join(sentences[:8]) + "\n\n" + long_line + "\n" + "\n".join(sentences[8:14])
            + "\n\nlonely sentence here\n\n" + "\n".join(sentences[14:]) + "\n")
    path = _write(tmp_path, "corpus.txt", text)
    documents = read_documents(path)
    assert [len(d) for d in documents] == [8, 7, 1, 6]
    vocab = WordPiece.train([line for d in documents for line in d], vocab_size=200)
    ids = tokenize_documents(documents, vocab.encode)
    assert len(ids[1][0]) > 200                              # the long line
    instances = create_instances(ids, max_seq_length=32, short_seq_prob=0.1, dupe_factor=3,
                                 seed=0, cls_id=vocab.cls_id, sep_id=vocab.sep_id)
    assert instances and all(len(i.tokens) <= 32 for i in instances)
    assert any(i.document == 2 for i in instances)           # the short document is used
    continuation = [i for i, t in enumerate(vocab.convert_ids_to_tokens(range(vocab.size)))
                    if t.startswith("##")]
    masker = Masker(MaskingConfig(max_predictions_per_seq=5, whole_word=True),
                    vocab_size=vocab.size, mask_id=vocab.mask_id, special_ids=vocab.special_ids,
                    continuation_ids=continuation)
    batch = np.zeros([len(instances), 32], np.int32)
    for row, instance in enumerate(instances):
        batch[row, :len(instance.tokens)] = instance.tokens
    out = masker.mask_batch(batch, [masking_rng(0, row) for row in range(len(batch))])
    assert out["input_ids"].shape == batch.shape
    assert out["masked_lm_weights"].sum(axis=1).min() >= 1


# -- masked LM ---------------------------------------------------------------------------


def _rows(num_rows: int, length: int, seed: int, ids=range(5, VOCAB_SIZE)) -> np.ndarray:
    """[num_rows, length]: [CLS] a [SEP] b [SEP] then padding, real lengths 10..length."""
    rng = np.random.default_rng(seed)
    rows = np.zeros([num_rows, length], np.int32)
    ids = np.array(list(ids))
    for row in range(num_rows):
        n = rng.integers(10, length + 1)
        rows[row, :n] = rng.choice(ids, n)
        split = rng.integers(2, n - 2)
        rows[row, [0, split, n - 1]] = [CLS, SEP, SEP]
    return rows


def _masker(**config) -> Masker:
    return Masker(MaskingConfig(**config), vocab_size=VOCAB_SIZE, mask_id=MASK,
                  special_ids=SPECIAL, continuation_ids=CONTINUATIONS)


def _check_layout(rows: np.ndarray, out: dict[str, np.ndarray], max_predictions: int) -> None:
    """Shapes, dtypes, padding slots, labels, and that only chosen positions change."""
    batch, length = rows.shape
    assert out["input_ids"].shape == (batch, length) and out["input_ids"].dtype == np.int32
    for key, dtype in [("masked_lm_positions", np.int32), ("masked_lm_ids", np.int32),
                       ("masked_lm_weights", np.float32)]:
        assert out[key].shape == (batch, max_predictions) and out[key].dtype == dtype
    for row in range(batch):
        weights = out["masked_lm_weights"][row]
        n = int(weights.sum())
        assert set(np.unique(weights)) <= {0.0, 1.0} and np.all(weights[:n] == 1.0)
        positions = out["masked_lm_positions"][row]
        assert np.all(np.diff(positions[:n]) > 0)                       # ascending, distinct
        assert np.all(positions[n:] == 0) and np.all(out["masked_lm_ids"][row, n:] == 0)
        assert np.array_equal(out["masked_lm_ids"][row, :n], rows[row, positions[:n]])
        assert not np.isin(rows[row, positions[:n]], SPECIAL).any()     # never a special token
        unchosen = np.ones(length, bool)
        unchosen[positions[:n]] = False
        assert np.array_equal(out["input_ids"][row, unchosen], rows[row, unchosen])


@pytest.mark.slow
def test_masking_rates():
    rows = _rows(4000, 64, seed=0)
    out = _masker(max_predictions_per_seq=64).mask_batch(
        rows, [masking_rng(0, 1, row) for row in range(len(rows))])
    _check_layout(rows, out, 64)
    num_real = (rows != PAD).sum(axis=1)
    num_chosen = out["masked_lm_weights"].sum(axis=1).astype(int)
    expected = np.array([min(64, max(1, round(n * 0.15))) for n in num_real])
    assert np.array_equal(num_chosen, expected)         # not binding: exactly round(15%)
    assert abs(num_chosen.sum() / num_real.sum() - 0.15) < 0.01

    chosen = out["masked_lm_weights"] > 0
    original = out["masked_lm_ids"][chosen]
    new = np.take_along_axis(out["input_ids"], out["masked_lm_positions"], axis=1)[chosen]
    n = int(chosen.sum())
    num_mask = int((new == MASK).sum())
    num_same = int((new == original).sum())
    num_random = n - num_mask - num_same
    other = VOCAB_SIZE - len(SPECIAL)                   # a random id may equal the original
    assert _within(num_mask, n, 0.8)
    assert _within(num_random, n, 0.1 * (1 - 1 / other))
    assert _within(num_same, n, 0.1 + 0.1 / other)
    replaced = new[(new != MASK) & (new != original)]
    assert replaced.size and not np.isin(replaced, SPECIAL).any()
    assert len(np.unique(replaced)) > 80                # drawn from the whole vocabulary
    # Chosen positions are uniform over the candidates: the first content position
    # is chosen about 15% of the time.
    rows_long = num_real >= 40
    first = (out["masked_lm_positions"][rows_long] == 1).any(axis=1)
    expected_first = np.mean([round(n * 0.15) / (n - 3) for n in num_real[rows_long]])
    assert _within(int(first.sum()), int(rows_long.sum()), expected_first)


def test_max_predictions_and_specials():
    rows = _rows(300, 64, seed=1)
    out = _masker(max_predictions_per_seq=5).mask_batch(
        rows, [masking_rng(0, row) for row in range(len(rows))])
    _check_layout(rows, out, 5)
    num_real = (rows != PAD).sum(axis=1)
    expected = np.minimum(5, np.maximum(1, np.round(num_real * 0.15)))
    assert np.array_equal(out["masked_lm_weights"].sum(axis=1), expected)
    # Everything may be chosen: still never [CLS], [SEP], [PAD] (nor [UNK], [MASK]).
    rows[:, 5] = UNK
    rows[:, 6] = MASK
    out = _masker(masked_lm_prob=1.0, max_predictions_per_seq=64).mask_batch(
        rows, [masking_rng(1, row) for row in range(len(rows))])
    _check_layout(rows, out, 64)
    candidates = (~np.isin(rows, SPECIAL)).sum(axis=1)
    assert np.array_equal(out["masked_lm_weights"].sum(axis=1), candidates)
    # A row of padding only has nothing to predict.
    empty = _masker()(np.zeros(16, np.int32), masking_rng(0, 0))
    assert not empty["masked_lm_weights"].any() and not empty["input_ids"].any()


def _word_rows(num_rows: int, seed: int) -> tuple[np.ndarray, list[list[list[int]]]]:
    """Rows of whole words (a start id then 0-3 '##' ids) and each row's words as
    position lists; segment B may start with a stray '##' piece (B cut from the
    front), which is a word of its own."""
    rng = np.random.default_rng(seed)
    rows = np.zeros([num_rows, 64], np.int32)
    all_words = []
    for row in range(num_rows):
        tokens, words = [CLS], []
        for segment in range(2):
            if segment == 1 and rng.random() < 0.5:
                words.append([len(tokens)])
                tokens.append(int(rng.choice(CONTINUATIONS)))
            for _ in range(rng.integers(3, 7)):
                pieces = [int(rng.choice(WORD_STARTS))] + [
                    int(c) for c in rng.choice(CONTINUATIONS, rng.integers(0, 4))]
                words.append(list(range(len(tokens), len(tokens) + len(pieces))))
                tokens += pieces
            tokens.append(SEP)
        rows[row, :len(tokens)] = tokens
        all_words.append(words)
    return rows, all_words


@pytest.mark.slow
def test_whole_word_masking_never_splits_words():
    rows, words = _word_rows(2000, seed=2)
    masker = _masker(whole_word=True, max_predictions_per_seq=8)
    out = masker.mask_batch(rows, [masking_rng(3, 0, row) for row in range(len(rows))])
    _check_layout(rows, out, 8)
    num_real = (rows != PAD).sum(axis=1)
    targets = np.minimum(8, np.maximum(1, np.round(num_real * 0.15)))
    counts = out["masked_lm_weights"].sum(axis=1)
    assert np.all(counts <= targets) and counts.sum() >= 0.9 * targets.sum()
    multi_piece_chosen = 0
    for row in range(len(rows)):
        chosen = set(out["masked_lm_positions"][row, :int(counts[row])].tolist())
        for word in words[row]:
            picked = [p in chosen for p in word]
            assert all(picked) or not any(picked), (row, word, chosen)  # '##' iff its start
            multi_piece_chosen += len(word) > 1 and all(picked)
    assert multi_piece_chosen > 500
    # The words are taken as the original's loop takes them: in the order of their
    # first piece's key, each that still fits (a longer one is skipped).
    for row in range(300):
        keys, chosen = masking_rng(3, 0, row).random((3, rows.shape[1]))[0], []
        for word in sorted(words[row], key=lambda w: keys[w[0]]):
            chosen += word if len(chosen) + len(word) <= targets[row] else []
        assert sorted(chosen) == out["masked_lm_positions"][row, :int(counts[row])].tolist()
    # Without whole_word, pieces are chosen independently.
    out = _masker(max_predictions_per_seq=8).mask_batch(
        rows, [masking_rng(3, 0, row) for row in range(len(rows))])
    split = sum(0 < sum(p in set(out["masked_lm_positions"][r].tolist()) for p in w) < len(w)
                for r in range(200) for w in words[r])
    assert split > 0


def test_masking_rng_keys():
    rows = _rows(8, 64, seed=3)
    masker = _masker()
    def masks(seed, step):
        return masker.mask_batch(rows, [masking_rng(seed, step, row) for row in range(len(rows))])
    first = masks(0, 10)
    again = masks(0, 10)
    for key in first:
        assert np.array_equal(first[key], again[key])
    for other in (masks(0, 11), masks(1, 10)):          # another step, another seed
        assert not np.array_equal(first["masked_lm_positions"], other["masked_lm_positions"])
    # Rows differ from each other, and a row does not depend on its batch.
    alone = masker(rows[5], masking_rng(0, 10, 5))
    for key in first:
        assert np.array_equal(first[key][5], alone[key])
    with pytest.raises(ValueError, match="generators"):
        masker.mask_batch(rows, [masking_rng(0, 0)])
    with pytest.raises(ValueError, match=">= 0"):
        masking_rng(0, -1)


def test_masking_config_errors():
    with pytest.raises(ValueError, match="> 1"):
        MaskingConfig(mask_token_prob=0.8, random_token_prob=0.3)
    with pytest.raises(ValueError, match="masked_lm_prob"):
        MaskingConfig(masked_lm_prob=1.5)
    with pytest.raises(ValueError, match="max_predictions_per_seq"):
        MaskingConfig(max_predictions_per_seq=0)
    with pytest.raises(ValueError, match="outside"):
        _masker()(np.array([CLS, 500, SEP]), masking_rng(0, 0))


# -- the real corpora ----------------------------------------------------------------------


def test_real_pretraining_corpora(shared_data):
    pretrain = shared_data / "pretrain"
    reuters = read_documents(str(pretrain / "reuters21578_docs.txt"))
    assert len(reuters) == 19043                       # as the data README says
    assert all(d and all(line and line == line.strip() for line in d) for d in reuters[:500])
    articles = read_documents(str(pretrain / "wiki.valid.raw"), "wikitext")
    assert 10 < len(articles) < 200                    # WikiText-2 valid: 60 articles
    assert not any(line.startswith("=") for d in articles for line in d)
    # A slice through pairs, with a cheap stand-in tokenizer (hashed words).
    encode = lambda line: [5 + zlib.crc32(w.encode()) % 30000 for w in line.split()]  # noqa: E731
    ids = tokenize_documents(reuters[:300] + articles[:5], encode)
    instances = create_instances(ids, max_seq_length=128, short_seq_prob=0.1, dupe_factor=1,
                                 seed=0, cls_id=CLS, sep_id=SEP)
    assert len(instances) > 300 and all(len(i.tokens) <= 128 for i in instances)
    assert all(i.next_document != i.document for i in instances if i.is_random_next)
