"""BERT pretraining data: documents -> [CLS] A [SEP] B [SEP] pairs -> masked LM.

The data algorithm of google-research/bert `create_pretraining_data.py`,
without TensorFlow and with the masking split off so that it can be applied
statically (once per example, as the original) or dynamically (fresh masks
every step, as RoBERTa), e.g. `Masker(...)(tokens, masking_rng(seed, step, row))`.

1. Reading (`iter_documents`): the original's format, one sentence (or
   paragraph) a line and a blank line between documents; 'paragraphs', the
   same with one paragraph a line, each cut into sentences (`split_sentences`:
   the original wants "one sentence per line ... not entire paragraphs",
   google-research/bert README, "Pre-training with BERT"; a paragraph taken
   whole is one segment, and at sequence 32 all but its first tokens are cut
   off); or WikiText raw, where ` = Title = ` starts an article and
   ` = = Heading = = ` lines are dropped. Documents never span files.

2. Sentence pairs (`create_instances_from_document`, `create_instances`).
   Per document a target length is drawn: `max_seq_length - 3`, or with
   probability `short_seq_prob` a uniform one in [2, max_seq_length - 3].
   Segments (lines) fill a chunk up to the target; a random split `a_end`
   makes segments [0, a_end) sentence A. With probability 1/2 (always for a
   one-segment chunk) B is a *random next*, segments from a random point of
   another document, and the chunk's unused segments go back for the next
   chunk; otherwise B is the rest of the chunk. `truncate_seq_pair` then cuts
   the longer side, front or back at random. Without next-sentence
   prediction (`next_sentence=False`: RoBERTa's DOC-SENTENCES, Liu et al.
   2019, arXiv 1907.11692, Table 2) a whole chunk is one segment,
   `[CLS] text [SEP]`, cut from the front or back to fit, and never a random
   next. `dupe_factor` passes, the
   instances shuffled; everything draws from one `random.Random(seed)`. The
   `bert_pretraining` builder runs this per shard of the corpus (as the
   original per input shard), so a random B comes from the same shard.

3. Masked LM (`Masker`, the original's `create_masked_lm_predictions`).
   Candidates are the non-special positions (whole-word masking: a `##`
   piece joins the word before it), shuffled and taken while they fit into
   `min(max_predictions_per_seq, max(1, round(n * masked_lm_prob)))`, `n` the
   non-padding tokens ([CLS] and [SEP] included, as the original counts).
   A chosen position becomes [MASK] (80%), a random non-special token (10%)
   or stays (10%); its original id is the label. The generator is keyed by
   `masking_rng(seed, ...)`, so a mask depends only on (seed, step, row).

Differences from the original, all deliberate:
- a random next is drawn until it comes from another document (the original
  gives up after 10 tries and may then use the same document);
- the documents are not shuffled before the passes: the instances are
  shuffled anyway, and each `Instance` records the index of its documents in
  the caller's list;
- random replacement tokens are never special tokens (the original draws from
  the whole vocabulary, [CLS], [SEP], [MASK] and [PAD] included);
- with whole-word masking a `##` piece only joins the word of the position
  right before it; one after [CLS]/[SEP] (B truncated from the front) starts
  a word of its own instead of joining the last word of A across the [SEP].
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from bert_jax.config_schema import DOCUMENT_FORMATS
from bert_jax.data.text_files import utf8_lines
from bert_jax.errors import MissingFileError

PAD_ID = 0  # padding id (always treated as special)
MASKING_PURPOSE = 0x6D61736B  # "mask": separates masking streams from other uses of `seed`


@dataclasses.dataclass(frozen=True)
class Document:
    """A document: its non-empty lines, stripped, and the (byte offset,
    1-based line) of its first line, where `iter_documents` can resume."""
    lines: list[str]
    start: tuple[int, int]


# A sentence ends at . ! or ? (closing quotes and brackets after it), before
# white space and an opening quote, bracket, capital or digit...
_SENTENCE_END = re.compile(r"[.!?]+[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")
# ...unless the word it ends is an abbreviation or an initial ("J. S. Bach").
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof st jr sr vs etc e.g i.e u.s u.k no nos fig inc ltd co corp gen col "
    "lt sgt capt rev mt ft approx ca jan feb mar apr jun jul aug sep sept oct nov dec".split())


def split_sentences(paragraph: str) -> list[str]:
    """The sentences of one paragraph, by the rule of `_SENTENCE_END` (a
    heuristic: about what a rule-based splitter does on encyclopedic and
    review text, at regex speed)."""
    sentences, start = [], 0
    for end in _SENTENCE_END.finditer(paragraph):
        word = paragraph[start:end.start() + 1].rsplit(None, 1)[-1].rstrip(".").lower()
        if paragraph[end.start()] == "." and (word in _ABBREVIATIONS or
                                              len(word) == 1 and word.isalpha()):
            continue
        sentences.append(paragraph[start:end.end()].strip())
        start = end.end()
    sentences.append(paragraph[start:].strip())
    return [sentence for sentence in sentences if sentence]


def iter_documents(path: str, document_format: str = "blank_lines",
                   start: tuple[int, int] = (0, 1)) -> Iterator[Document]:
    """The documents of one file, streamed, from its beginning or from the
    `start` of one of its documents. 'blank_lines': several blank lines count
    as one ('paragraphs' too, its lines cut into sentences); 'wikitext': the
    title line is not text, blank lines are ignored.
    A file without text gives no document (the caller records it)."""
    if document_format not in DOCUMENT_FORMATS:
        raise ValueError(f"document_format={document_format!r}; use one of {DOCUMENT_FORMATS}")
    if not os.path.isfile(path):
        raise MissingFileError(f"{path}: no such corpus file; check the path")
    wikitext = document_format == "wikitext"
    sentences = document_format == "paragraphs"
    lines: list[str] = []
    first = start
    for offset, lineno, text in utf8_lines(path, start):
        line = text.strip()
        deep = (line.startswith("= ="), line.endswith("= ="))   # `= = Heading = =`
        title = len(line) > 4 and line[:2] == "= " and line[-2:] == " =" and not any(deep)
        if title if wikitext else not line:  # a document boundary
            if lines:
                yield Document(lines, first)
                lines = []
        elif line and not (wikitext and all(deep)):
            if not lines:
                first = (offset, lineno)
            if sentences:
                lines.extend(split_sentences(line))
            else:
                lines.append(line)
    if lines:
        yield Document(lines, first)


def read_documents(path: str, document_format: str = "blank_lines") -> list[list[str]]:
    """The `lines` of each of `iter_documents`."""
    return [document.lines for document in iter_documents(path, document_format)]


def tokenize_documents(documents: Sequence[Sequence[str]], encode: Callable[[str], list[int]]
                       ) -> list[list[list[int]]]:
    """Documents of lines -> of segments (token id lists); lines without tokens
    are dropped, as the original does, but not documents (indices stay)."""
    return [[ids for ids in (list(encode(line)) for line in document) if ids]
            for document in documents]


@dataclasses.dataclass(frozen=True)
class Instance:
    """One next-sentence-prediction pair (before masking)."""
    tokens: list[int]          # [CLS] A [SEP] B [SEP], [length <= max_seq_length]
    segment_ids: list[int]     # [length]: 0 on [CLS] A [SEP], 1 on B [SEP]
    is_random_next: bool       # B is from another document: the NSP label 1
    document: int              # the index of A's document
    next_document: int         # the index of B's (== document unless random)


def truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int,
                      rng: random.Random) -> None:
    """Truncates the pair in place to `max_num_tokens` in all, as the original:
    a token at a time from the longer (B when equal), front or back at random."""
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del trunc_tokens[0]
        else:
            trunc_tokens.pop()


def _check_lengths(max_seq_length: int, short_seq_prob: float) -> None:
    if max_seq_length < 5:
        raise ValueError(f"max_seq_length={max_seq_length}; use at least 5 ([CLS], [SEP], "
                         "[SEP] and a token of each sentence)")
    if not 0.0 <= short_seq_prob <= 1.0:
        raise ValueError(f"short_seq_prob={short_seq_prob}; give a probability")


def create_instances_from_document(all_documents: Sequence[Sequence[Sequence[int]]],
                                   document_index: int, *, max_seq_length: int,
                                   short_seq_prob: float, rng: random.Random,
                                   cls_id: int, sep_id: int,
                                   next_sentence: bool = True) -> list[Instance]:
    """The NSP pairs of one document, the original's algorithm line for line;
    with `next_sentence=False` its chunks as single segments instead.

    `all_documents`: at least 2 for pairs (a random next needs another), each
    a list of non-empty segments (token id lists). `rng`: the one generator of
    the whole run. A and B of every pair are non-empty.
    """
    _check_lengths(max_seq_length, short_seq_prob)
    if next_sentence and len(all_documents) < 2:
        raise ValueError(f"{len(all_documents)} document(s): a random next sentence needs "
                         "at least 2 documents")
    document = all_documents[document_index]
    if any(len(segment) == 0 for segment in document):
        raise ValueError(f"document {document_index} has an empty segment; drop empty lines "
                         "(tokenize_documents does)")
    max_num_tokens = max_seq_length - 3  # room for [CLS], [SEP], [SEP]
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)

    instances: list[Instance] = []
    current_chunk: list[Sequence[int]] = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        chunk_done = i == len(document) - 1 or current_length >= target_seq_length
        if chunk_done and not next_sentence:
            tokens = [t for segment in current_chunk for t in segment]
            truncate_seq_pair(tokens, [], max_num_tokens + 1, rng)  # room for [CLS], [SEP]
            instances.append(Instance(
                tokens=[cls_id, *tokens, sep_id], segment_ids=[0] * (len(tokens) + 2),
                is_random_next=False, document=document_index, next_document=document_index))
            current_chunk = []
            current_length = 0
        elif chunk_done:
            # Segments [0, a_end) of the chunk are A.
            a_end = 1
            if len(current_chunk) >= 2:
                a_end = rng.randint(1, len(current_chunk) - 1)
            tokens_a = [t for segment_a in current_chunk[:a_end] for t in segment_a]

            if len(current_chunk) == 1 or rng.random() < 0.5:
                is_random_next = True
                next_document = document_index
                while next_document == document_index:   # the original stops at 10 tries
                    next_document = rng.randint(0, len(all_documents) - 1)
                random_document = all_documents[next_document]
                tokens_b = []   # segments from a random start, at least one
                for segment_b in random_document[rng.randint(0, len(random_document) - 1):]:
                    tokens_b.extend(segment_b)
                    if len(tokens_b) >= target_seq_length - len(tokens_a):
                        break
                # The chunk's segments after A go back, for the next chunk.
                i -= len(current_chunk) - a_end
            else:
                is_random_next = False
                next_document = document_index
                tokens_b = [t for segment_b in current_chunk[a_end:] for t in segment_b]
            truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)

            instances.append(Instance(
                tokens=[cls_id, *tokens_a, sep_id, *tokens_b, sep_id],
                segment_ids=[0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1),
                is_random_next=is_random_next, document=document_index,
                next_document=next_document))
            current_chunk = []
            current_length = 0
        i += 1
    return instances


def create_instances(all_documents: Sequence[Sequence[Sequence[int]]], *, max_seq_length: int,
                     short_seq_prob: float, dupe_factor: int, seed: int, cls_id: int,
                     sep_id: int, next_sentence: bool = True) -> list[Instance]:
    """All NSP pairs of a corpus, as the original's `create_training_instances`:
    empty segments and documents dropped, `dupe_factor` passes with one
    `random.Random(seed)`, then shuffled with it. `Instance.document` and
    `next_document` index `all_documents` as given (empty ones included).
    `next_sentence=False`: single segments (`create_instances_from_document`)."""
    _check_lengths(max_seq_length, short_seq_prob)
    if dupe_factor < 1:
        raise ValueError(f"dupe_factor={dupe_factor}: expected >= 1")
    kept_index: list[int] = []
    documents: list[list[Sequence[int]]] = []
    for index, document in enumerate(all_documents):
        segments = [segment for segment in document if len(segment) > 0]
        if segments:
            kept_index.append(index)
            documents.append(segments)
    if len(documents) < (2 if next_sentence else 1):
        raise ValueError(f"{len(documents)} non-empty document(s) of {len(all_documents)}: "
                         + ("next sentence prediction needs at least 2 (a random next "
                            "comes from another document)" if next_sentence
                            else "no text to make instances from; give a non-empty corpus"))
    rng = random.Random(seed)
    instances: list[Instance] = []
    for _ in range(dupe_factor):
        for document_index in range(len(documents)):
            for instance in create_instances_from_document(
                    documents, document_index, max_seq_length=max_seq_length,
                    short_seq_prob=short_seq_prob, rng=rng, cls_id=cls_id, sep_id=sep_id,
                    next_sentence=next_sentence):
                instances.append(dataclasses.replace(
                    instance, document=kept_index[instance.document],
                    next_document=kept_index[instance.next_document]))
    rng.shuffle(instances)
    return instances


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
    """Masked-LM options (the original's flags)."""
    masked_lm_prob: float = 0.15        # of the non-padding tokens, to predict
    max_predictions_per_seq: int = 20   # the length of the masked_lm_* arrays
    mask_token_prob: float = 0.8        # of the chosen: -> [MASK]
    random_token_prob: float = 0.1      # of the chosen: -> a random non-special id
    whole_word: bool = False            # a word and its ## pieces at once

    def __post_init__(self):
        for name in ("masked_lm_prob", "mask_token_prob", "random_token_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"MaskingConfig.{name}={getattr(self, name)}; give a probability")
        if self.mask_token_prob + self.random_token_prob > 1.0 + 1e-9:
            raise ValueError("MaskingConfig: mask_token_prob + random_token_prob > 1; lower them")
        if self.max_predictions_per_seq < 1:
            raise ValueError(f"MaskingConfig.max_predictions_per_seq="
                             f"{self.max_predictions_per_seq}; use at least 1")


def masking_rng(seed: int, *key: int) -> np.random.Generator:
    """The generator of one mask: `(seed, step, row)` for dynamic masking,
    `(seed, example_index)` for static; `MASKING_PURPOSE` keeps these streams
    apart from other generators of the same `seed`."""
    entropy = [int(seed), MASKING_PURPOSE, *(int(k) for k in key)]
    if any(k < 0 for k in entropy):
        raise ValueError(f"masking_rng(seed={seed}, key={key}): seed and keys must be >= 0")
    return np.random.default_rng(np.random.SeedSequence(entropy))


class Masker:
    """BERT's masked-LM corruption of one sequence (or a batch of them).

    `special_ids` (e.g. `WordPiece.special_ids`, plus the pad id 0) are never
    chosen nor drawn as replacements; `continuation_ids`: the `##` pieces.
    """

    def __init__(self, config: MaskingConfig, *, vocab_size: int, mask_id: int,
                 special_ids: Iterable[int], continuation_ids: Iterable[int] = ()):
        self.config = config
        self.vocab_size = int(vocab_size)
        self.mask_id = int(mask_id)
        special = {int(i) for i in special_ids} | {PAD_ID}
        self.special_ids = np.array(sorted(special), dtype=np.int64)
        self.replacement_ids = np.setdiff1d(np.arange(self.vocab_size), self.special_ids)
        if not 0 <= self.mask_id < self.vocab_size:
            raise ValueError(f"mask_id={mask_id} is outside the vocabulary [0, {vocab_size})")
        if self.replacement_ids.size == 0 and config.random_token_prob > 0:
            raise ValueError(f"vocab_size={vocab_size}: no non-special id to draw random "
                             "replacements from")
        # Lookup tables by id (the masking below is vectorised over a batch).
        self.is_candidate = np.ones(self.vocab_size, bool)
        self.is_candidate[self.special_ids[self.special_ids < self.vocab_size]] = False
        self.is_continuation = np.zeros(self.vocab_size, bool)
        self.is_continuation[[int(i) for i in continuation_ids]] = True

    def __call__(self, tokens: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Masks one sequence `[length]` (padding 0s never chosen): the row of
        `mask_batch` with the same generator."""
        tokens = np.asarray(tokens)
        if tokens.ndim != 1:
            raise ValueError(f"tokens: expected [length], got shape {tokens.shape}")
        return {k: v[0] for k, v in self.mask_batch(tokens[None], [rng]).items()}

    def _choose(self, tokens: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """[batch, length] bool: the positions to predict, at most num_to_predict
        per row. Candidates (whole words with `whole_word`) are taken in the
        order of their `keys` (a uniform permutation); a word that would not fit
        is skipped, as the original."""
        config = self.config
        num_real = np.count_nonzero(tokens != PAD_ID, axis=1)
        num_to_predict = np.minimum(config.max_predictions_per_seq,
                                    np.maximum(1, np.rint(num_real * config.masked_lm_prob)))
        candidate = self.is_candidate[tokens]
        if not config.whole_word:
            rank = np.argsort(np.argsort(np.where(candidate, keys, 2.0), axis=1), axis=1)
            return candidate & (rank < num_to_predict[:, None])
        # A '##' piece right after another candidate joins its word, which is
        # named by (its key is that of) its first piece.
        joins = self.is_continuation[tokens] & candidate
        joins[:, 1:] &= candidate[:, :-1]
        joins[:, 0] = False
        starts = candidate & ~joins
        batch, length = tokens.shape
        start_of = np.maximum.accumulate(np.where(starts, np.arange(length), 0), axis=1)
        pieces = np.bincount((np.arange(batch)[:, None] * length + start_of).ravel(),
                             weights=candidate.ravel(), minlength=batch * length
                             ).reshape(batch, length).astype(np.int64)  # per word start
        order = np.argsort(np.where(starts, keys, 2.0), axis=1)  # words first, by key
        ordered_pieces = np.take_along_axis(pieces, order, 1)
        taken = np.zeros(tokens.shape, bool)                  # by rank of the word
        count = np.zeros(batch, np.int64)
        for rank in range(int(starts.sum(axis=1).max(initial=0))):  # greedy, all rows at once
            n = ordered_pieces[:, rank]
            taken[:, rank] = fits = (n > 0) & (count + n <= num_to_predict)
            count += np.where(fits, n, 0)
            if np.all(count >= num_to_predict):
                break
        taken_at_start = np.zeros(tokens.shape, bool)
        np.put_along_axis(taken_at_start, order, taken, 1)
        return candidate & np.take_along_axis(taken_at_start, start_of, 1)

    def mask_batch(self, tokens: np.ndarray, rngs: Sequence[np.random.Generator]
                   ) -> dict[str, np.ndarray]:
        """Masks a batch: row i of `tokens` [batch, length] with `rngs[i]`, which
        draws `[3, length]` uniforms: the order of the candidates, the
        [MASK]/random/unchanged choice and the random id, per position.

        Returns:
          'input_ids': [batch, length] int32, the masked sequences;
          'masked_lm_positions': [batch, max_predictions] int32, ascending, then 0s;
          'masked_lm_ids': [batch, max_predictions] int32, the original ids there;
          'masked_lm_weights': [batch, max_predictions] float32, 1.0 for real
            predictions, 0.0 for padding slots.
        """
        tokens = np.asarray(tokens)
        if tokens.ndim != 2:
            raise ValueError(f"tokens: expected [batch, length], got shape {tokens.shape}")
        if len(rngs) != tokens.shape[0]:
            raise ValueError(f"{len(rngs)} generators for a batch of {tokens.shape[0]} rows")
        if tokens.size and (tokens.min() < 0 or tokens.max() >= self.vocab_size):
            raise ValueError(f"tokens: ids outside [0, {self.vocab_size}): "
                             f"min {tokens.min()}, max {tokens.max()}")
        config = self.config
        batch, length = tokens.shape
        uniforms = np.array([rng.random((3, length)) for rng in rngs]).reshape(
            batch, 3, length)
        chosen = self._choose(tokens, uniforms[:, 0])
        draw = uniforms[:, 1]
        input_ids = tokens.astype(np.int32, copy=True)
        input_ids[chosen & (draw < config.mask_token_prob)] = self.mask_id
        replace = chosen & (draw >= config.mask_token_prob) & (
            draw < config.mask_token_prob + config.random_token_prob)
        if replace.any():   # then there are replacement ids (checked in __init__)
            n = self.replacement_ids.size
            input_ids[replace] = self.replacement_ids[
                np.minimum((uniforms[:, 2][replace] * n).astype(np.int64), n - 1)]

        max_predictions = config.max_predictions_per_seq
        positions = np.argsort(~chosen, axis=1, kind="stable")[:, :max_predictions]
        real = np.arange(positions.shape[1]) < chosen.sum(axis=1, keepdims=True)
        pad = max_predictions - positions.shape[1]            # a sequence shorter than that
        positions = np.pad(np.where(real, positions, 0), ((0, 0), (0, pad)))
        real = np.pad(real, ((0, 0), (0, pad)))
        return {"input_ids": input_ids,
                "masked_lm_positions": positions.astype(np.int32),
                "masked_lm_ids": np.where(real, np.take_along_axis(tokens, positions, 1),
                                          0).astype(np.int32),
                "masked_lm_weights": real.astype(np.float32)}
