"""`conllu`: token tagging data from CoNLL-U (Universal Dependencies) and
CoNLL-2003-style column files, read from local files.

    sentences = read_conllu("../shared/data/ud_en_ewt/en_ewt-ud-dev.conllu")
    sentences[0]   # {"words": ["From", ...], "tags": ["ADP", ...], "line": 1,
                   #  "sent_id": "weblog-..."}
    splits = read_splits(split_files("../shared/data/ud_en_ewt"), column="upos")

CoNLL-U (https://universaldependencies.org/format.html): multi-word token
ranges (`1-2`) and empty nodes (`8.1`) are skipped, so `words` are the
syntactic words, IDs 1, 2, 3, ...; a FORM of `_` is an underscore. CoNLL-2003:
whitespace-separated columns (`word POS chunk NER`), as many on every line;
`-DOCSTART-` lines are skipped; `#` is a word. `line` is the 1-based line
where a sentence starts (its first comment line, if any).

A file that cannot be read so raises a `DataError` naming file:line[:column], as
does a `column` the file cannot have or a bad `splits` of its directory; a
`format` not in `FORMATS` is refused by name (`config.data.format`, a rule of
`bert_jax.config_schema`).
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from bert_jax.config_schema import CONLL_FORMATS as FORMATS, choice
from bert_jax.data.splits import check_split_files
from bert_jax.data.text_files import char_column, utf8_lines
from bert_jax.errors import DataError, MissingFileError

# The 17 Universal POS tags (https://universaldependencies.org/u/pos/), in the
# order of that page's alphabetical index (and of tfds's UPOS ClassLabel).
UPOS_TAGS: tuple[str, ...] = (
    "ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART",
    "PRON", "PROPN", "PUNCT", "SCONJ", "SYM", "VERB", "X")
CONLLU_COLUMNS: tuple[str, ...] = (
    "id", "form", "lemma", "upos", "xpos", "feats", "head", "deprel", "deps", "misc")
CONLL2003_COLUMNS: tuple[str, ...] = ("word", "pos", "chunk", "ner")
_NAME_THE_FILES = ("name the files: --config.data.splits.SPLIT=FILE in a training config, "
                   "--train_file and --eval_file in launch/extract_features.py")
# CoNLL-U file name part -> tfds split name.
UD_SPLITS = {"train": "train", "dev": "validation", "test": "test"}

_INT_ID = re.compile(r"[0-9]+")
_RANGE_ID = re.compile(r"[0-9]+-[0-9]+")
_EMPTY_NODE_ID = re.compile(r"[0-9]+\.[0-9]+")
_SENT_ID = re.compile(r"#\s*sent_id\s*=(.*)")


def _column_index(path: str, column: str | int | None, format: str, word_column: int = 0
                  ) -> int:
    """The 0-based (CoNLL-2003: possibly negative) index of the tag column of
    the file `path`; text holding an integer (`"-1"`, from a string config
    field) is an index."""
    if isinstance(column, str) and re.fullmatch(r"-?[0-9]+", column.strip()):
        column = int(column)
    choice("conllu: format", format, FORMATS)
    names = CONLLU_COLUMNS if format == "conllu" else CONLL2003_COLUMNS
    if column is None:
        return 3 if format == "conllu" else -1
    if isinstance(column, str) and column.lower() in names:
        return names.index(column.lower())
    if not isinstance(column, int) or isinstance(column, bool) or (
            format == "conllu" and not 0 <= column < len(CONLLU_COLUMNS)):
        raise DataError(path, f"{format} has no column={column!r}", f"use one of {names} "
                        "or a 0-based index")
    if format == "conll2003" and column == word_column:
        raise DataError(path, f"column={column} is the word_column", "pick a tag column "
                        "(e.g. -1, the last)")
    return column


def read_conllu(path: str | os.PathLike, column: str | int | None = None,
                format: str = "conllu", word_column: int = 0) -> list[dict[str, Any]]:
    """The sentences of a CoNLL-U (or CoNLL-2003) file, in file order.
    `column`: the tag's, a name (`CONLLU_COLUMNS`, `CONLL2003_COLUMNS`) or an
    index (CoNLL-2003: negative from the end); `None`: UPOS, or the last."""
    path = os.fspath(path)
    index = _column_index(path, column, format, word_column)
    column_name = (CONLLU_COLUMNS[index].upper() if format == "conllu"
                   else f"column {index}")
    if not os.path.isfile(path):
        raise MissingFileError(f"{path}: no such file; pass a CoNLL-U or CoNLL-2003 file")
    sentences: list[dict[str, Any]] = []
    words: list[str] = []
    tags: list[str] = []
    start: int | None = None
    sent_id = ""
    width: tuple[int, int] | None = None   # CoNLL-2003: (columns, first line)

    def finish() -> None:
        nonlocal words, tags, start, sent_id
        if words:
            sentences.append({"words": words, "tags": tags, "line": start,
                              "sent_id": sent_id})
        words, tags, start, sent_id = [], [], None, ""

    def error(what: str, fix: str, column: int | None = None) -> DataError:
        return DataError(path, what, fix, line=lineno, column=column)

    for _, lineno, line in utf8_lines(path):
        line = line.rstrip("\r\n")
        if not line.strip():
            finish()
            continue
        if start is None:   # the sentence's first line (a -DOCSTART- line: finish resets it)
            start = lineno
        if format == "conll2003":
            fields = line.split()
            if fields[0] == "-DOCSTART-":
                finish()
                continue
            if width is None:
                width = (len(fields), lineno)
                for name, i in (("column", index), ("word_column", word_column)):
                    if not -len(fields) <= i < len(fields):
                        raise error(f"{len(fields)} columns, no column {i}",
                                    f"set {name} to one of them (e.g. -1, the last)")
            elif len(fields) != width[0]:
                raise error(f"{len(fields)} columns, {width[0]} on line {width[1]}",
                            "a word with a space in it, or a missing tag?")
            words.append(fields[word_column])
            tags.append(fields[index])
            continue
        if line.startswith("#"):
            match = _SENT_ID.match(line)
            if match:
                sent_id = match.group(1).strip()
            continue
        fields = line.split("\t")
        if len(fields) != len(CONLLU_COLUMNS):
            raise error(f"{len(fields)} tab-separated fields, not 10",
                        "separate the fields with single tabs, `_` for an empty one")
        word_id = fields[0]
        if _RANGE_ID.fullmatch(word_id) or _EMPTY_NODE_ID.fullmatch(word_id):
            continue   # multi-word token range or empty node: not a word
        if not _INT_ID.fullmatch(word_id):
            raise error(f"ID {word_id!r} is not an integer, a range '1-2' or a node '1.1'",
                        "fix the ID", 1)
        if int(word_id) != len(words) + 1:
            raise error(f"ID {word_id}, {len(words) + 1} expected (the sentence starts on "
                        f"line {start})", "a word line or a blank line is missing", 1)
        for i, name in ((1, "FORM"), (index, column_name)):
            if not fields[i]:
                raise error(f"empty {name}", "write `_` for an unspecified value",
                            char_column(fields, i))
        words.append(fields[1])
        tags.append(fields[index])
    finish()
    return sentences


def tag_vocabulary(sentences: Iterable[Mapping[str, Any]]) -> list[str]:
    """The sorted unique tags of `sentences` (e.g. an NER tag set); for UPOS
    prefer the fixed `UPOS_TAGS` order."""
    return sorted({tag for sentence in sentences for tag in sentence["tags"]})


def discover_splits(directory: str) -> tuple[tuple[str, str], ...]:
    """(split, file name) of the `*-ud-{train,dev,test}.conllu` files of a
    Universal Dependencies treebank directory (dev -> `validation`)."""
    found = []
    for part, split in UD_SPLITS.items():
        names = sorted(os.path.basename(p) for p in glob.glob(
            os.path.join(glob.escape(directory), f"*-ud-{part}.conllu")))
        if len(names) > 1:
            raise DataError(directory, f"several {part} files {names}", _NAME_THE_FILES)
        if names:
            found.append((split, names[0]))
    if not found:
        present = sorted(n for n in os.listdir(directory) if not n.startswith("."))
        raise DataError(directory, f"no `*-ud-{{train,dev,test}}.conllu` file (it has "
                        f"{present[:20]})", _NAME_THE_FILES)
    return tuple(sorted(found))


def split_files(path: str | os.PathLike, splits: Mapping[str, str] | None = None
                ) -> dict[str, str]:
    """Split name -> its file (absolute, checked to exist): `splits` (split
    name -> file name in the directory `path`), or else the UD files
    `*-ud-{train,dev,test}.conllu`."""
    directory = os.path.realpath(os.path.expanduser(os.fspath(path)))
    if not os.path.isdir(directory):
        raise MissingFileError(f"{directory}: not a directory; pass the directory "
                               "holding the files")
    if splits is None:
        splits = dict(discover_splits(directory))
    return {split: os.path.join(directory, name) for split, name in
            check_split_files("conllu", directory, splits, [""])}


def read_splits(files: Mapping[str, str], column: str | int | None = None,
                format: str = "conllu", word_column: int = 0
                ) -> dict[str, list[dict[str, Any]]]:
    """`read_conllu` of every split's file (`split_files`); a split without
    sentences is an error."""
    sentences = {split: read_conllu(file, column, format, word_column)
                 for split, file in files.items()}
    empty = [split for split, s in sentences.items() if not s]
    if empty:
        raise DataError(", ".join(files[split] for split in empty), f"no sentences "
                        f"(split(s) {empty})", "add some or drop the split")
    return sentences
