"""SQuAD v1.1 span question answering for BERT: the questions of a file, the
windows of context the model reads, and the answers read back from its logits.

`read_squad` gives one `QAExample` per question; `windows_for` cuts them into
model inputs, a list of dicts of numpy arrays, one per window, unpadded
(`input_ids` and `token_type_ids` `[n]` int32, `n <= max_seq_length`, the
target `start_position`/`end_position` as int32 scalars, and what maps the
window back to its question's text: see `make_windows`). `predict_answers`
takes the model's start and end logits, `[n_windows, padded_length]` each,
and returns `{question id: answer text}`. `bert_jax.tasks.finetune` runs
these for its SQuAD task.

    examples = read_squad("dev-v1.1.json", slice(0, 38))      # one QAExample a question
    windows = windows_for(examples, vocab, WindowConfig())     # model inputs, unpadded
    ... start_logits, end_logits = model(windows)             # [n_windows, padded_length] each
    predictions = predict_answers(examples, windows, start_logits, end_logits)
    bert_jax.evaluation.squad.evaluate(squad_json(examples), predictions)

Windows as google-research/bert `run_squad.py` cuts them: `[CLS] question
[SEP] context-window [SEP]`, the question cut to `max_query_length` tokens, a
window every `doc_stride` context tokens; a window's target is the token span
of the first answer, or `(0, 0)` (`[CLS]`) when it is not wholly inside.

Tokens are placed by the tokenizer's character offsets (as Hugging Face's
`run_qa.py`), not by `run_squad.py`'s whitespace words: an answer's tokens are
those covering any of its characters, and a predicted span is read back from
the original context (case, accents, punctuation kept), so an answer ending
inside a word piece ("30" in "1930s") comes back as the whole piece ("1930").
A window proposes only spans starting where it has the most context
(`_check_is_max_context`), so an overlap is proposed by one window.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

import numpy as np

from bert_jax.errors import DataError
from bert_jax.evaluation.squad import best_spans, load_dataset


@dataclasses.dataclass(frozen=True)
class QAExample:
    """One question of a SQuAD file; `answers` and their character offsets
    `answer_starts` pair up, the first the training target (none: no target)."""
    id: str
    question: str
    context: str
    answers: tuple[str, ...]
    answer_starts: tuple[int, ...]
    title: str

    def __post_init__(self):
        if len(self.answers) != len(self.answer_starts):
            raise ValueError(f"question {self.id!r}: {len(self.answers)} answers, "
                             f"{len(self.answer_starts)} answer_starts; give one each")


def _require(mapping: Any, key: str, kind: type, path: str, where: str) -> Any:
    """`mapping[key]`, checked to be a `kind`; a `DataError` naming `where` in the
    file, the key and the value found otherwise."""
    if not isinstance(mapping, dict):
        found = f"{where} is a JSON {type(mapping).__name__} ({_shown(mapping)}), not an object"
    elif key not in mapping:
        found = f"{where} has no key {key!r}"
    else:
        value = mapping[key]
        if isinstance(value, kind) and not isinstance(value, bool):
            return value
        found = (f"{where}: {key!r} is a JSON {type(value).__name__} ({_shown(value)}), "
                 f"not a {kind.__name__}")
    raise DataError(path, found, "is it a SQuAD v1.1 file?")


def _shown(value: Any) -> str:
    """`value`'s repr, cut to 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def read_squad(path: str, articles: slice | None = None, *,
               check_answers: bool = True) -> list[QAExample]:
    """The questions of the `articles` (entries of `data`, e.g. `slice(0, 38)`;
    None: all) of a SQuAD v1.1 JSON file, in file order; with `check_answers`,
    every answer must be at its `answer_start`."""
    if articles is not None and not isinstance(articles, slice):
        raise TypeError(f"articles: a {type(articles).__name__}; give a slice or None")
    data = load_dataset(path)
    if not isinstance(data, list):
        raise DataError(path, f"'data' is a JSON {type(data).__name__} ({_shown(data)}), "
                        "not a list of articles", "is it a SQuAD v1.1 file?")
    examples: list[QAExample] = []
    seen: set[str] = set()
    selected = range(len(data))[articles] if articles is not None else range(len(data))
    for a in selected:
        article = data[a]
        where = f"article {a}"
        title = _require(article, "title", str, path, where)
        where = f"article {a} ({title!r})"
        for p, paragraph in enumerate(_require(article, "paragraphs", list, path, where)):
            where = f"article {a} ({title!r}) paragraph {p}"
            context = _require(paragraph, "context", str, path, where)
            for qa in _require(paragraph, "qas", list, path, where):
                qid = _require(qa, "id", str, path, f"a question of {where}")
                q_where = f"question {qid!r} ({where})"
                if qid in seen:
                    raise DataError(path, f"question id {qid!r} twice (again in {where})",
                                    "make the ids unique")
                seen.add(qid)
                question = _require(qa, "question", str, path, q_where)
                texts, starts = [], []
                for i, answer in enumerate(_require(qa, "answers", list, path, q_where)):
                    a_where = f"answer {i} of {q_where}"
                    text = _require(answer, "text", str, path, a_where)
                    start = _require(answer, "answer_start", int, path, a_where)
                    if check_answers:
                        found = context[start:start + len(text)] if start >= 0 else ""
                        if found != text:
                            raise DataError(
                                path, f"question {qid!r}: answer {i} {text!r} is not at "
                                f"answer_start={start} (the context has {found!r})", "fix it")
                    texts.append(text)
                    starts.append(start)
                examples.append(QAExample(id=qid, question=question, context=context,
                                          answers=tuple(texts), answer_starts=tuple(starts),
                                          title=title))
    return examples


def squad_json(examples: Iterable[QAExample]) -> list[dict[str, Any]]:
    """The `data` list of a SQuAD file holding `examples` (for `evaluate`):
    consecutive examples of one title are an article, of one context a
    paragraph, so `squad_json(read_squad(path))` has the file's layout."""
    data: list[dict[str, Any]] = []
    for example in examples:
        if not data or data[-1]["title"] != example.title:
            data.append({"title": example.title, "paragraphs": []})
        paragraphs = data[-1]["paragraphs"]
        if not paragraphs or paragraphs[-1]["context"] != example.context:
            paragraphs.append({"context": example.context, "qas": []})
        paragraphs[-1]["qas"].append({
            "id": example.id, "question": example.question,
            "answers": [{"text": text, "answer_start": start}
                        for text, start in zip(example.answers, example.answer_starts)]})
    return data


@dataclasses.dataclass(frozen=True)
class WindowConfig:
    """How questions and contexts are cut (google-research/bert's defaults)."""
    max_seq_length: int = 384    # tokens of a window, specials included
    doc_stride: int = 128        # context tokens between consecutive window starts
    max_query_length: int = 64   # the question is cut to this many tokens

    def __post_init__(self):
        if self.doc_stride < 1 or self.max_query_length < 1:
            raise ValueError(f"doc_stride={self.doc_stride}, max_query_length="
                             f"{self.max_query_length}; use at least 1")
        if self.max_seq_length < self.max_query_length + 4:
            raise ValueError(f"max_seq_length={self.max_seq_length} leaves no room for "
                             f"context; use at least max_query_length + 4 = "
                             f"{self.max_query_length + 4}")


def _answer_tokens(example: QAExample,
                   offsets: Sequence[tuple[int, int]]) -> tuple[int, int] | None:
    """Context-token indices `(first, last)` of the tokens covering any
    character of the first answer; None when there is no answer or no token
    covers it (an answer of only spaces or removed control characters)."""
    if not example.answers:
        return None
    begin = example.answer_starts[0]
    end = begin + len(example.answers[0])
    if not 0 <= begin <= end <= len(example.context):
        raise ValueError(f"question {example.id!r}: answer_start={begin} puts the answer "
                         f"outside its context of {len(example.context)} characters")
    covering = [i for i, (s, e) in enumerate(offsets) if s < end and e > begin]
    return (covering[0], covering[-1]) if covering else None


def _doc_spans(n_tokens: int, max_tokens: int, stride: int) -> list[tuple[int, int]]:
    """`(start, length)` of each window over `n_tokens` context tokens
    (`run_squad.py`); one empty window for an empty context."""
    spans, start = [], 0
    while True:
        length = min(n_tokens - start, max_tokens)
        spans.append((start, length))
        if start + length >= n_tokens:
            return spans
        start += min(length, stride)


def _is_max_context(spans: Sequence[tuple[int, int]], span_index: int, position: int) -> bool:
    """`run_squad.py` `_check_is_max_context`: whether window `span_index` is
    the one where context token `position` has the largest
    min(left, right) context + 0.01 * window length (the first on ties)."""
    best_score, best_index = None, None
    for index, (start, length) in enumerate(spans):
        end = start + length - 1
        if not start <= position <= end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if best_score is None or score > best_score:
            best_score, best_index = score, index
    return best_index == span_index


def make_windows(example: QAExample, vocab, config: WindowConfig, *, example_index: int,
                 context: tuple[list[int], list[tuple[int, int]]] | None = None
                 ) -> list[dict[str, np.ndarray]]:
    """The model inputs of one question, `[CLS] question [SEP] window [SEP]`
    (`vocab`: a `WordPiece`). Windows start at context token 0, then each
    `min(doc_stride, window length)` after the previous, until one reaches
    the end (an empty context: one window). Each, `n <= max_seq_length` long:

      input_ids        [n] int32
      token_type_ids   [n] int32: 0 on `[CLS] question [SEP]`, 1 on the
                       context tokens and the last `[SEP]`
      start_position,  int32 scalars: indices in the window of the first and
      end_position     last token of the first answer; both 0 (`[CLS]`) when
                       it is not entirely inside this window (or there is none)
      example_index    int32 scalar: `example_index` (its place in the list)
      window_index     int32 scalar: 0, 1, ... over this example's windows
      context_offsets  [n, 2] int32: `(start, end)` character offsets into
                       `example.context` of the context tokens; (-1, -1) on the
                       question and special tokens
      max_context      [n] bool: True on the context tokens for which this is
                       the window with the most context (`run_squad.py`
                       `_check_is_max_context`); each context token has it in
                       exactly one window

    `context`: `vocab.encode_with_offsets(example.context)`, if already made.
    """
    context_ids, context_offsets = context or vocab.encode_with_offsets(example.context)
    question_ids = vocab.encode(example.question)[:config.max_query_length]
    max_tokens = config.max_seq_length - len(question_ids) - 3
    answer = _answer_tokens(example, context_offsets)
    spans = _doc_spans(len(context_ids), max_tokens, config.doc_stride)
    prefix = [vocab.cls_id, *question_ids, vocab.sep_id]
    windows = []
    for window_index, (start, length) in enumerate(spans):
        n = len(prefix) + length + 1
        input_ids = np.array([*prefix, *context_ids[start:start + length], vocab.sep_id],
                             dtype=np.int32)
        token_type_ids = np.zeros(n, np.int32)
        token_type_ids[len(prefix):] = 1
        offsets = np.full((n, 2), -1, np.int32)
        max_context = np.zeros(n, bool)
        for j in range(length):
            offsets[len(prefix) + j] = context_offsets[start + j]
            max_context[len(prefix) + j] = _is_max_context(spans, window_index, start + j)
        start_position = end_position = 0
        if answer is not None and start <= answer[0] and answer[1] < start + length:
            start_position = answer[0] - start + len(prefix)
            end_position = answer[1] - start + len(prefix)
        windows.append({
            "input_ids": input_ids,
            "token_type_ids": token_type_ids,
            "start_position": np.int32(start_position),
            "end_position": np.int32(end_position),
            "example_index": np.int32(example_index),
            "window_index": np.int32(window_index),
            "context_offsets": offsets,
            "max_context": max_context,
        })
    return windows


def windows_for(examples: Sequence[QAExample], vocab,
                config: WindowConfig) -> list[dict[str, np.ndarray]]:
    """`make_windows` of every example (`example_index`: its place), in one
    list; each distinct context is tokenized once."""
    contexts: dict[str, tuple[list[int], list[tuple[int, int]]]] = {}
    windows: list[dict[str, np.ndarray]] = []
    for index, example in enumerate(examples):
        if example.context not in contexts:
            contexts[example.context] = vocab.encode_with_offsets(example.context)
        windows += make_windows(example, vocab, config, example_index=index,
                                context=contexts[example.context])
    return windows


class Candidate(NamedTuple):
    """A proposed answer of one question."""
    text: str          # context[char_start:char_end]
    score: float       # start_logit + end_logit
    window: int        # index into `windows`
    start: int         # token indices in that window, inclusive
    end: int
    char_start: int
    char_end: int


def _logit_rows(logits: Any, name: str,
                windows: Sequence[Mapping[str, np.ndarray]]) -> list[np.ndarray]:
    """The per-window rows of `[n_windows, padded_length]` logits (a list of
    rows of different lengths is accepted too), cut to each window's length."""
    if len(logits) != len(windows):
        raise ValueError(f"{name}: {len(logits)} rows for {len(windows)} windows; give "
                         "one row per window, in order")
    rows = []
    for w, (row, window) in enumerate(zip(logits, windows)):
        row = np.asarray(row, dtype=np.float32)
        n = len(window["input_ids"])
        if row.ndim != 1 or row.shape[0] < n:
            raise ValueError(f"{name}[{w}]: shape {row.shape}, for a window of {n} tokens; "
                             "give [padded_length >= window length]")
        rows.append(row[:n])
    return rows


def nbest_answers(examples: Sequence[QAExample], windows: Sequence[Mapping[str, np.ndarray]],
                  start_logits: Any, end_logits: Any, *, n_best: int = 20,
                  max_answer_length: int = 30) -> dict[str, list[Candidate]]:
    """`{question id: its best candidate spans, best first}` over all its
    windows, at most `n_best`. `start_logits`, `end_logits`: `[n_windows,
    padded_length]`, row `w` of `windows[w]`. A start must be a `max_context`
    token, the end any context token; ties keep window order.
    """
    starts = _logit_rows(start_logits, "start_logits", windows)
    ends = _logit_rows(end_logits, "end_logits", windows)
    by_example: dict[int, list[int]] = collections.defaultdict(list)
    for w, window in enumerate(windows):
        index = int(window["example_index"])
        if not 0 <= index < len(examples):
            raise ValueError(f"window {w}: example_index {index}, of {len(examples)} "
                             "examples; pass the examples the windows were made from")
        by_example[index].append(w)
    results: dict[str, list[Candidate]] = {}
    for index, example in enumerate(examples):
        candidates = []
        for w in by_example.get(index, ()):
            window = windows[w]
            offsets = np.asarray(window["context_offsets"])
            is_context = offsets[:, 0] >= 0
            max_context = np.asarray(window["max_context"], dtype=bool) & is_context
            # Starts outside max_context sort last among the valid tokens, so
            # they take no top-n_best slot while a max-context start remains.
            start_row = np.where(max_context, starts[w], -np.inf)
            for span in best_spans(start_row, ends[w], n_best=n_best,
                                   max_answer_length=max_answer_length, valid=is_context):
                if not max_context[span.start]:
                    continue
                char_start, char_end = int(offsets[span.start, 0]), int(offsets[span.end, 1])
                candidates.append(Candidate(example.context[char_start:char_end], span.score,
                                            w, span.start, span.end, char_start, char_end))
        candidates.sort(key=lambda c: -c.score)  # stable: window order on ties
        results[example.id] = candidates[:n_best]
    return results


def predict_answers(examples: Sequence[QAExample], windows: Sequence[Mapping[str, np.ndarray]],
                    start_logits: Any, end_logits: Any, *, n_best: int = 20,
                    max_answer_length: int = 30) -> dict[str, str]:
    """`{question id: answer text}`, the input of `evaluate`: the best span
    of `nbest_answers`, '' when no window has a valid one."""
    nbest = nbest_answers(examples, windows, start_logits, end_logits, n_best=n_best,
                          max_answer_length=max_answer_length)
    return {qid: candidates[0].text if candidates else "" for qid, candidates in nbest.items()}
