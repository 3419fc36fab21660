"""`conllu`: token tagging data from CoNLL-U (Universal Dependencies) and
CoNLL-2003-style column files, read from local files.

    sentences = read_conllu("../shared/data/ud_en_ewt/en_ewt-ud-dev.conllu")
    sentences[0]   # {"words": ["From", "the", "AP", ...],
                   #  "tags": ["ADP", "DET", "PROPN", ...],
                   #  "line": 1, "sent_id": "weblog-..."}
    tag_ids = {tag: i for i, tag in enumerate(UPOS_TAGS)}

or every split of a corpus directory at once, read in a few seconds:

    files = split_files("../shared/data/ud_en_ewt")   # {"train": ".../en_ewt-ud-train.conllu", ...}
    splits = read_splits(files, column="upos")         # {"train": [sentence, ...], ...}

CoNLL-U (`format="conllu"`, https://universaldependencies.org/format.html):
one word a line, 10 tab-separated fields `ID FORM LEMMA UPOS XPOS FEATS HEAD
DEPREL DEPS MISC`; a blank line ends a sentence (a file whose last sentence
has no blank line after it still yields it); lines starting with `#` are
comments (`# sent_id = ...` gives `sent_id`); multi-word token ranges (`1-2`,
the surface token of `1` and `2`) and empty nodes (`8.1`) are skipped, so
`words` are the syntactic words, IDs 1, 2, 3, ... `column` picks the tag:
`"upos"` (the default), `"xpos"`, `"deprel"` (or any field name, or its
0-based index). A FORM of `_` is a word (an underscore), not a missing one.

CoNLL-2003 (`format="conll2003"`): whitespace-separated columns, the word
first (`word POS chunk NER`, BIO tags); a blank line ends a sentence;
`-DOCSTART-` lines are skipped; no comment lines (`#` may be a word). The tag
is the last column unless `column` says otherwise (`"pos"`, `"chunk"`,
`"ner"`, or an index, negative from the end); `word_column` (default 0) picks
the word. Every token line of a file must have the same number of columns.
Its files have no fixed names: pass `splits` (e.g. `{"train": "eng.train",
"validation": "eng.testa", "test": "eng.testb"}`). A column given as text
holding an integer (`"-1"`, as from a string config field) is that index.

`line` is the 1-based line where the sentence starts (its first comment line,
if any); `sent_id` is `""` without a `# sent_id` comment.

Errors (`ConlluFormatError`, a `ValueError`), naming the file, the 1-based
line (and the character column for a field) and what to do: invalid UTF-8,
a word line without exactly 10 tab-separated fields (CoNLL-U) or with another
number of columns than the file's first one (CoNLL-2003), a non-integer ID,
IDs that do not count 1, 2, 3, ... within a sentence, an empty FORM or tag.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from bert_jax.data.splits import check_split_names
from bert_jax.data.text_files import char_column, utf8_lines
from bert_jax.errors import MissingFileError, UserError

# The 17 Universal POS tags (https://universaldependencies.org/u/pos/), in the
# order of that page's alphabetical index (and of tfds's UPOS ClassLabel).
UPOS_TAGS: tuple[str, ...] = (
    "ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART",
    "PRON", "PROPN", "PUNCT", "SCONJ", "SYM", "VERB", "X")
CONLLU_COLUMNS: tuple[str, ...] = (
    "id", "form", "lemma", "upos", "xpos", "feats", "head", "deprel", "deps", "misc")
CONLL2003_COLUMNS: tuple[str, ...] = ("word", "pos", "chunk", "ner")
FORMATS = ("conllu", "conll2003")
# What to do when the files of the splits cannot be found by UD's naming.
_NAME_THE_FILES = ("name the files: --config.data.splits.SPLIT=FILE (SPLIT: train, validation, "
                   "test) in a training config, --train_file and --eval_file in "
                   "launch/extract_features.py")
# CoNLL-U file name part -> tfds split name.
UD_SPLITS = {"train": "train", "dev": "validation", "test": "test"}

_INT_ID = re.compile(r"[0-9]+")
_RANGE_ID = re.compile(r"[0-9]+-[0-9]+")
_EMPTY_NODE_ID = re.compile(r"[0-9]+\.[0-9]+")
_SENT_ID = re.compile(r"#\s*sent_id\s*=(.*)")


class ConlluFormatError(UserError, ValueError):
    """A tagging file that cannot be read (the message says where and how)."""


def _column_index(column: str | int | None, format: str, word_column: int = 0) -> int:
    """The 0-based (CoNLL-2003: possibly negative) index of the tag column."""
    if isinstance(column, str) and re.fullmatch(r"-?[0-9]+", column.strip()):
        column = int(column)
    if format not in FORMATS:
        raise ConlluFormatError(f"conllu: format must be one of {FORMATS}, got {format!r}")
    names = CONLLU_COLUMNS if format == "conllu" else CONLL2003_COLUMNS
    if column is None:
        return 3 if format == "conllu" else -1
    if isinstance(column, str):
        if column.lower() not in names:
            raise ConlluFormatError(f"conllu: unknown {format} column {column!r}; use one "
                                    f"of {names} or a 0-based index.")
        return names.index(column.lower())
    if isinstance(column, int) and not isinstance(column, bool):
        if format == "conllu" and not 0 <= column < len(CONLLU_COLUMNS):
            raise ConlluFormatError(f"conllu: a CoNLL-U column index is 0..9, got {column}")
        if format == "conll2003" and column == word_column:
            raise ConlluFormatError(f"conllu: column {column} of this CoNLL-2003 file is "
                                    "the word (word_column); pick a tag column (e.g. -1, "
                                    "the last)")
        return column
    raise ConlluFormatError(f"conllu: column must be a name, an int or None, got {column!r}")


def read_conllu(path: str | os.PathLike, column: str | int | None = None,
                format: str = "conllu", word_column: int = 0) -> list[dict[str, Any]]:
    """The sentences of a CoNLL-U (or CoNLL-2003) file, in file order.

    Args:
      path: the file.
      column: the tag column: a name (`"upos"`, `"xpos"`, `"deprel"`, ...;
        CoNLL-2003: `"pos"`, `"chunk"`, `"ner"`) or a 0-based index (CoNLL-2003:
        negative from the end). `None`: `"upos"`, or CoNLL-2003's last column.
      format: `"conllu"` or `"conll2003"` (see the module docstring).
      word_column: CoNLL-2003 only: the 0-based index of the word's column.

    Returns:
      `[{"words": [str], "tags": [str], "line": int, "sent_id": str}, ...]`,
      `line` the 1-based line where the sentence starts.

    Raises:
      FileNotFoundError: no such file.
      ConlluFormatError: see the module docstring; the message names the file
        and the line.
    """
    index = _column_index(column, format, word_column)
    column_name = (CONLLU_COLUMNS[index].upper() if format == "conllu"
                   else f"column {index}")
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise MissingFileError(f"conllu: {path} does not exist")
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

    for lineno, line in utf8_lines(path, ConlluFormatError, "conllu: "):
        line = line.rstrip("\r\n")
        if not line.strip():
            finish()
            continue
        if format == "conll2003":
            fields = line.split()
            if fields[0] == "-DOCSTART-":
                finish()
                continue
            if start is None:
                start = lineno
            if width is None:
                width = (len(fields), lineno)
                for name, i in (("column", index), ("word_column", word_column)):
                    if not -len(fields) <= i < len(fields):
                        raise ConlluFormatError(
                            f"conllu: {path}:{lineno}: the line has {len(fields)} "
                            f"whitespace-separated columns, no column {i}; set {name} "
                            f"to a column of this file (e.g. -1, the last).")
            elif len(fields) != width[0]:
                raise ConlluFormatError(
                    f"conllu: {path}:{lineno}: expected {width[0]} whitespace-"
                    f"separated columns (as on line {width[1]}), got {len(fields)}; "
                    f"a word with a space in it, or a missing tag? Fix that line.")
            words.append(fields[word_column])
            tags.append(fields[index])
            continue
        if start is None:
            start = lineno
        if line.startswith("#"):
            match = _SENT_ID.match(line)
            if match:
                sent_id = match.group(1).strip()
            continue
        fields = line.split("\t")
        if len(fields) != len(CONLLU_COLUMNS):
            spaces = (" (it has spaces: are the fields separated by spaces instead "
                      "of tabs?)" if len(fields) == 1 and " " in line else "")
            raise ConlluFormatError(
                f"conllu: {path}:{lineno}: expected 10 tab-separated fields (ID "
                f"FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC), got "
                f"{len(fields)}{spaces}; separate the fields with single tabs and "
                f"write `_` for an empty one.")
        word_id = fields[0]
        if _RANGE_ID.fullmatch(word_id) or _EMPTY_NODE_ID.fullmatch(word_id):
            continue   # multi-word token range or empty node: not a word
        if not _INT_ID.fullmatch(word_id):
            raise ConlluFormatError(
                f"conllu: {path}:{lineno}:1: ID {word_id!r} is not an integer (nor "
                f"a multi-word range like '1-2' or an empty node like '1.1'); fix "
                f"the ID field.")
        expected = len(words) + 1
        if int(word_id) != expected:
            raise ConlluFormatError(
                f"conllu: {path}:{lineno}:1: ID {word_id} where {expected} was "
                f"expected (sentence starting on line {start}); IDs count 1, 2, "
                f"3, ... within a sentence: is a word line missing, or the blank "
                f"line that ends the previous sentence?")
        if not fields[1]:
            raise ConlluFormatError(
                f"conllu: {path}:{lineno}:{char_column(fields, 1)}: empty FORM; "
                f"every word needs its form (`_` for an underscore).")
        if not fields[index]:
            raise ConlluFormatError(
                f"conllu: {path}:{lineno}:{char_column(fields, index)}: empty "
                f"{column_name} field; write `_` for an unspecified value.")
        words.append(fields[1])
        tags.append(fields[index])
    finish()
    return sentences


def tag_vocabulary(sentences: Iterable[Mapping[str, Any]]) -> list[str]:
    """The sorted unique tags of `sentences` (e.g. an NER tag set); for UPOS
    prefer the fixed `UPOS_TAGS` order."""
    return sorted({tag for sentence in sentences for tag in sentence["tags"]})


# ------------------------------------------------------------------ splits --


def discover_splits(directory: str) -> tuple[tuple[str, str], ...]:
    """(split, file name) of the `*-ud-{train,dev,test}.conllu` files of a
    Universal Dependencies treebank directory (dev -> `validation`)."""
    found = []
    for part, split in UD_SPLITS.items():
        names = sorted(os.path.basename(p) for p in glob.glob(
            os.path.join(glob.escape(directory), f"*-ud-{part}.conllu")))
        if len(names) > 1:
            raise ConlluFormatError(
                f"conllu: {directory} has several {part} files {names}; {_NAME_THE_FILES}.")
        if names:
            found.append((split, names[0]))
    if not found:
        present = sorted(n for n in os.listdir(directory) if not n.startswith("."))
        raise ConlluFormatError(
            f"conllu: {directory} has no `*-ud-{{train,dev,test}}.conllu` file (it "
            f"has {present[:20]}); {_NAME_THE_FILES}.")
    return tuple(sorted(found))


def split_files(path: str | os.PathLike, splits: Mapping[str, str] | None = None
                ) -> dict[str, str]:
    """Split name -> its file (absolute), each checked to exist.

    `splits`: split name -> file name in the directory `path`; by default
    (`None`) the UD files `*-ud-{train,dev,test}.conllu` (as `train`,
    `validation`, `test`). The files are read by `read_splits`.
    """
    directory = os.path.realpath(os.path.expanduser(os.fspath(path)))
    if not os.path.isdir(directory):
        raise MissingFileError(
            f"conllu: {directory} is not a directory (path={os.fspath(path)!r}); "
            f"pass the directory holding the files.")
    if splits is None:
        splits = dict(discover_splits(directory))
    check_split_names("conllu", splits, "file name", ConlluFormatError)
    for split, name in splits.items():
        if not isinstance(name, str) or not name or os.sep in name:
            raise ConlluFormatError(f"conllu: the file of split {split!r} must be a "
                                    f"file name in {directory}, got {name!r}")
    missing = [os.path.join(directory, n) for n in splits.values()
               if not os.path.isfile(os.path.join(directory, n))]
    if missing:
        raise MissingFileError(f"conllu: missing file(s) {missing} "
                               f"(splits={dict(splits)})")
    return {split: os.path.join(directory, name) for split, name in sorted(splits.items())}


def read_splits(files: Mapping[str, str], column: str | int | None = None,
                format: str = "conllu", word_column: int = 0
                ) -> dict[str, list[dict[str, Any]]]:
    """`read_conllu` of every split's file (`split_files`), in file order;
    a split without sentences is a `ConlluFormatError` naming its file."""
    sentences = {split: read_conllu(file, column, format, word_column)
                 for split, file in files.items()}
    empty = [split for split, s in sentences.items() if not s]
    if empty:
        raise ConlluFormatError(
            f"conllu: split(s) {empty} have no sentences "
            f"({', '.join(files[split] for split in empty)}).")
    return sentences
