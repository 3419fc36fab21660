"""The SQuAD v1.1 questions of a split, read from a JSON file split by articles
or from the tfds catalog, for the SQuAD data of the fine-tuning task
(`bert_jax.tasks.finetune`).

    examples = read_split("../shared/data/squad_v1.1/dev-v1.1.json", "38:")  # QAExample

`read_split` returns a list of `squad_windows.QAExample`s (question, context,
answers and their character offsets), one per question, in file order. A
split is a range of the file's articles (its `data` list) written as a Python
slice, `START:STOP` (`":"`: all). The tfds catalog's splits
(`load_source(CATALOG, "train")`) become `QAExample`s through `from_features`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from bert_jax.data.squad_windows import QAExample, read_squad
from bert_jax.data.text_files import as_text
from bert_jax.errors import DataError, MissingFileError

CATALOG = "squad/v1.1"
_ARTICLES = re.compile(r"\s*(-?\d*)\s*:\s*(-?\d*)\s*")


def parse_articles(spec: str, what: str = "articles") -> slice:
    """`'0:38'` -> `slice(0, 38)`, `'38:'` -> `slice(38, None)`, `':'` -> all."""
    match = _ARTICLES.fullmatch(str(spec))
    if not match:
        raise ValueError(f"{what}={spec!r}; give an article range START:STOP (e.g. "
                         "'0:38', '38:', ':')")
    start, stop = (int(x) if x else None for x in match.groups())
    return slice(start, stop)


def read_split(path: str | os.PathLike, articles: str) -> list[QAExample]:
    """The questions of the articles `START:STOP` of a SQuAD v1.1 file, in
    file order; a range without questions is an error."""
    file = os.path.realpath(os.path.expanduser(os.fspath(path)))
    if not os.path.isfile(file):
        raise MissingFileError(f"{file}: no such file; pass a SQuAD v1.1 JSON file")
    examples = read_squad(file, parse_articles(articles))
    if not examples:
        raise DataError(file, f"no questions in the articles {articles!r}", "check the range")
    return examples


def from_features(example: Mapping[str, Any]) -> QAExample:
    """A `QAExample` from an example of `squad_json` or of the catalog's `squad`."""
    answers = example["answers"]
    return QAExample(
        id=as_text(example["id"]), question=as_text(example["question"]),
        context=as_text(example["context"]), title=as_text(example["title"]),
        answers=tuple(as_text(t) for t in answers["text"]),
        answer_starts=tuple(int(s) for s in answers["answer_start"]))
