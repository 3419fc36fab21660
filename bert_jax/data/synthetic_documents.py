"""Built-in documents for BERT pretraining, so that the default experiment runs
anywhere without a corpus.

The documents are sentences of `synthetic_translation`'s source language
grouped by *topic*: each document draws `TOPIC_NOUNS` nouns that replace every
noun of its sentences (number kept). So a masked word is predictable from its
sentence (grammar) and its document (topic), and a true next segment shares
nouns with the first while a random one rarely does: both pretraining tasks
have something to learn.

`documents(n, seed)` returns `n` documents, each a list of 2 to 12 sentences
(strings of space-separated words); `write_corpus` writes them as a text file
in the format of google-research/bert's corpora (one sentence per line, a
blank line between documents), from which `bert_jax.tasks.bert_pretraining`
builds its pretraining data when `config.data.synthetic_documents` is set.
"""

from __future__ import annotations

import os
import random

from bert_jax.data import synthetic_translation as grammar
from bert_jax.file_io import write_atomically

TOPIC_NOUNS = 4
MIN_SENTENCES, MAX_SENTENCES = 2, 12


def _topical(sentence: str, topic: list[int]) -> str:
    words = []
    for word in sentence.split():
        kind = grammar.SOURCE_WORDS.get(word)
        if kind is not None and kind[0] == "noun":
            _, noun, plural = kind
            stem = grammar.NOUNS[topic[noun % len(topic)]].source
            word = stem + (grammar.SOURCE_PLURAL_SUFFIX if plural else "")
        words.append(word)
    return " ".join(words)


def documents(num_documents: int, seed: int = 0) -> list[list[str]]:
    """`num_documents` documents of `MIN_SENTENCES..MAX_SENTENCES` sentences."""
    rng = random.Random(seed)
    out = []
    for _ in range(num_documents):
        topic = rng.sample(range(len(grammar.NOUNS)), TOPIC_NOUNS)
        count = rng.randint(MIN_SENTENCES, MAX_SENTENCES)
        out.append([_topical(grammar.render_source(grammar.sample_sentence(rng, 2)), topic)
                    for _ in range(count)])
    return out


def write_corpus(path: str, num_documents: int, seed: int = 0) -> str:
    """Writes the corpus to `path` (atomically) unless it exists; returns `path`."""
    if os.path.isfile(path):
        return path
    text = "\n\n".join("\n".join(document) for document in documents(num_documents, seed))
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    write_atomically(path, text + "\n")
    return path
