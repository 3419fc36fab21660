"""The word features of a frozen BERT encoder, taken at each word's first
sub-token: for each sentence, every hidden state, float32
`[layers + 1, words, hidden]` (the embeddings first, then each layer's output).

`FeatureExtractor(config, params, vocab)` (or `.from_pretrained(folder)`)
holds the encoder; `hidden_states(sentences)` takes pre-split sentences
(lists of words) and returns one such array per sentence, `features` the same
combined by a layer strategy (`[words, feature_dim]`), and
`hidden_states_from_ids` every token's states of id sequences given as they
are. The probe (`probe.fit_probe`) and `launch/extract_features.py` read them.

Words and sub-words: features are per word of pre-split text (a tagging
corpus's tokens). Each word is WordPiece-tokenized; the word takes the feature
of its first sub-token (the paper's NER set-up). `[CLS]` and `[SEP]` frame each
sequence; a word that tokenizes to nothing (only control characters) is fed
as one `[UNK]`.

Long sentences are chunked, not truncated: a sentence whose sub-tokens exceed
`max_length - 2` is split at word boundaries into consecutive, non-overlapping
windows, each encoded as its own `[CLS] ... [SEP]` sequence (so every word gets
a feature; words near a window edge see less context). A single word longer
than a whole window keeps its first `max_length - 2` pieces (its feature is
that of its first piece anyway). Both are counted in `FeatureExtractor.stats`
and logged.

Efficiency: sequences are sorted by length, batched (`batch_size` rows; a
short last batch is padded with dummy rows) and padded to a multiple of
`bucket` tokens (capped at `max_length`), so the jit-compiled encoder runs one
program per bucket length. Padding keys are masked, so a word's features do
not depend on the padding (up to float rounding).
"""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from bert_jax.analysis.features.strategies import combine_layers
from bert_jax.data.wordpiece import WordPiece
from bert_jax.errors import MissingFileError
from bert_jax.modeling.bert import BertModel
from bert_jax.modeling.configs import BertConfig


class FeatureExtractor:
    """Contextual word features from a frozen BERT encoder.

    `params`: a tree with a `bert` entry (as `load_hf_bert` returns, heads
    ignored) or the BertModel parameters themselves, boxed or not. `vocab` is
    needed by `hidden_states`, not by `hidden_states_from_ids`. `batch_size`
    sequences go to each encoder call, padded to a multiple of `bucket`
    tokens; `max_length` (`[CLS]`/`[SEP]` included) is at most, and by default,
    `config.max_len`.
    """

    def __init__(self, config: BertConfig, params: Any, vocab: WordPiece | None = None, *,
                 batch_size: int = 32, bucket: int = 32, max_length: int | None = None):
        if batch_size < 1 or bucket < 1:
            raise ValueError(f"batch_size ({batch_size}) and bucket ({bucket}) must be >= 1.")
        params = nn.meta.unbox(params)
        if "bert" in params:
            params = params["bert"]
        if "embeddings" not in params:
            raise ValueError(f"params has entries {sorted(params)}; expected BertModel "
                             "parameters (embeddings, encoder, pooler) or a tree with 'bert'.")
        if vocab is not None and vocab.size > config.vocab_size:
            raise ValueError(f"vocabulary of {vocab.size} tokens for {config.vocab_size} "
                             "embeddings: give the encoder's own vocab file")
        self.config = config
        self.params = jax.device_put(params)
        self.vocab = vocab
        self.batch_size = int(batch_size)
        self.bucket = int(bucket)
        self.max_length = min(int(max_length or config.max_len), config.max_len)
        if self.max_length < 3:
            raise ValueError(f"max_length={self.max_length}: need room for [CLS] w [SEP].")
        self.stats = dict(sentences=0, words=0, pieces=0, chunked_sentences=0,
                          extra_chunks=0, truncated_pieces=0)
        model = BertModel(config)

        def forward(params, input_ids, attention_mask):
            out = model.apply({"params": params}, input_ids, attention_mask,
                              jnp.zeros_like(input_ids), output_hidden_states=True)
            return jnp.stack(out.hidden_states).astype(jnp.float32)

        self._forward = jax.jit(forward)

    @classmethod
    def from_pretrained(cls, folder: str, *, vocab_file: str | None = None,
                        lowercase: bool | None = None, **kwargs) -> FeatureExtractor:
        """From a Hugging Face BERT folder, a bert_jax pretrained folder or a
        BERT workdir (`bert_jax.analysis.encoders.load_encoder`), with
        `vocab_file` (default `folder/vocab.txt`, or the workdir's) and its
        casing (default: the one its folder declares, else uncased)."""
        from bert_jax.analysis.encoders import load_encoder

        encoder = load_encoder(folder, vocab_file=vocab_file, lowercase=lowercase)
        if encoder.vocab is None:
            raise MissingFileError(f"{folder} has no vocab.txt: give the vocabulary the "
                                   "encoder was trained with (--vocab_file).")
        return cls(encoder.config, encoder.params, encoder.vocab, **kwargs)

    @property
    def num_states(self) -> int:
        """layers + 1 (the embeddings and each layer's output)."""
        return self.config.num_layers + 1

    def word_pieces(self, words: Sequence[str]) -> list[list[int]]:
        """The WordPiece ids of each word (`[UNK]` for a word that tokenizes to
        nothing)."""
        if self.vocab is None:
            raise ValueError("no vocab: pass vocab= or use hidden_states_from_ids")
        if not words:
            return []
        ids, word_index = self.vocab.encode_words(list(words))
        pieces: list[list[int]] = [[] for _ in words]
        for i, w in zip(ids, word_index):
            pieces[w].append(i)
        return [p or [self.vocab.unk_id] for p in pieces]

    def _chunks(self, words: Sequence[str]) -> list[tuple[list[int], list[int]]]:
        """`[(ids with [CLS]/[SEP], position of each word's first piece)]`: one
        window, or several for a sentence longer than `max_length - 2` pieces."""
        budget = self.max_length - 2
        chunks: list[tuple[list[int], list[int]]] = []
        ids: list[int] = []
        firsts: list[int] = []
        pieces = self.word_pieces(words)
        self.stats["sentences"] += 1
        self.stats["words"] += len(pieces)
        for word in pieces:
            self.stats["pieces"] += len(word)
            if len(word) > budget:
                self.stats["truncated_pieces"] += len(word) - budget
                word = word[:budget]
            if ids and len(ids) + len(word) > budget:
                chunks.append((ids, firsts))
                ids, firsts = [], []
            firsts.append(len(ids) + 1)  # +1: [CLS]
            ids = ids + word
        chunks.append((ids, firsts))
        if len(chunks) > 1:
            self.stats["chunked_sentences"] += 1
            self.stats["extra_chunks"] += len(chunks) - 1
        cls_id, sep_id = self.vocab.cls_id, self.vocab.sep_id
        return [([cls_id] + c + [sep_id], f) for c, f in chunks]

    def _padded_length(self, length: int) -> int:
        return min(-(-length // self.bucket) * self.bucket, self.max_length)

    def _run(self, sequences: Sequence[Sequence[int]],
             positions: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """For each id sequence, `[layers + 1, len(positions[i]), hidden]`
        float32 hidden states at `positions[i]`."""
        results: list[np.ndarray | None] = [None] * len(sequences)
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
        for start in range(0, len(order), self.batch_size):
            rows = order[start:start + self.batch_size]
            length = self._padded_length(max(len(sequences[i]) for i in rows))
            ids = np.full((self.batch_size, length), self.config.pad_token_id, np.int32)
            mask = np.zeros((self.batch_size, length), np.int32)
            ids[:, 0] = mask[:, 0] = 1  # dummy rows: one real token, never empty
            for r, i in enumerate(rows):
                seq = sequences[i]
                if len(seq) > self.max_length:
                    raise ValueError(f"sequence {i} has {len(seq)} tokens, more than "
                                     f"max_length={self.max_length}.")
                ids[r, :len(seq)] = seq
                mask[r] = 0
                mask[r, :len(seq)] = 1
            states = np.asarray(self._forward(self.params, jnp.asarray(ids),
                                              jnp.asarray(mask)))
            for r, i in enumerate(rows):
                results[i] = states[:, r, np.asarray(positions[i], np.int64)]
        return results

    def hidden_states_from_ids(self, ids_batch: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Every token's hidden states, `[layers + 1, len(ids), hidden]`, of id
        sequences given as they are (add `[CLS]`/`[SEP]` yourself; at most
        `max_length` ids each)."""
        ids_batch = [list(map(int, ids)) for ids in ids_batch]
        if any(not ids for ids in ids_batch):
            raise ValueError("an id sequence is empty.")
        return self._run(ids_batch, [range(len(ids)) for ids in ids_batch])

    def hidden_states(self, words_batch: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """First-sub-token features of pre-split sentences: for each sentence,
        float32 `[layers + 1, len(words), hidden]` (embeddings first)."""
        sequences, positions, owner = [], [], []
        before = dict(self.stats)
        for s, words in enumerate(words_batch):
            if isinstance(words, str):
                raise TypeError("hidden_states takes pre-split sentences (lists of "
                                "words), not strings: split the text first.")
            if not words:
                continue
            for ids, firsts in self._chunks(words):
                sequences.append(ids)
                positions.append(firsts)
                owner.append(s)
        states = self._run(sequences, positions)
        out: list[list[np.ndarray]] = [[] for _ in words_batch]
        for s, state in zip(owner, states):
            out[s].append(state)
        chunked = self.stats["chunked_sentences"] - before["chunked_sentences"]
        truncated = self.stats["truncated_pieces"] - before["truncated_pieces"]
        if chunked or truncated:
            logging.info("FeatureExtractor: %d sentence(s) longer than %d sub-tokens were "
                         "split into windows (%d extra); %d sub-token(s) of over-long "
                         "words were dropped.", chunked, self.max_length - 2,
                         self.stats["extra_chunks"] - before["extra_chunks"], truncated)
        empty = np.zeros((self.num_states, 0, self.config.hidden_size), np.float32)
        return [np.concatenate(parts, axis=1) if parts else empty for parts in out]

    def features(self, words_batch: Sequence[Sequence[str]], strategy: str,
                 weights=None) -> list[np.ndarray]:
        """`combine_layers` of `hidden_states`: for each sentence
        `[len(words), feature_dim]`."""
        return [np.asarray(combine_layers(h, strategy, weights))
                for h in self.hidden_states(words_batch)]
