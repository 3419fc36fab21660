"""`glue`: GLUE-style TSV classification/regression tasks, read from local files.

A task is described by a `GlueTaskSpec` (which columns hold the sentences and
the label, the label set, the metrics, the files of each split, and the
matching tfds catalog dataset). `GLUE_TASKS` has SST-2, MRPC, STS-B, CoLA, RTE,
QNLI and MNLI, laid out as in the official GLUE download
(`{task dir}/train.tsv`, `dev.tsv`, `test.tsv`):

    examples = read_tsv("../shared/data/glue/SST-2/dev.tsv", GLUE_TASKS["sst2"])
    examples[0]   # {"text_a": "it 's a charming ...", "text_b": "", "label": 1,
                  #  "line": 2}

or by split from the task's directory (or the GLUE root holding it):

    dev = read_split("../shared/data/glue", "sst2", "validation")

The files are small (MNLI's 393k training pairs read in seconds), so they are
read as they are, each time, with no dataset build in between.

Users with network access can use the tfds catalog instead
(`load_source("glue/sst2", "validation")`) and map its examples to the same
dict with `from_catalog(GLUE_TASKS["sst2"], example)`; note that the catalog
names MNLI's splits `validation_matched`/`validation_mismatched` and orders
MNLI's labels differently (`from_catalog` maps them).

Reading (`read_tsv`): tab-separated, UTF-8, one example a line, read with
`csv.QUOTE_NONE` (GLUE sentences contain `"` characters, kept as text); a
byte-order mark at the start of the file is dropped; the text fields and the
label are stripped of surrounding whitespace. Files with a header row name
their columns there (`GlueTaskSpec` columns are header names); header-less
files (CoLA's train/dev) use 0-based column indices. Rows may have more fields
than the header (the extra ones are ignored), not fewer than the columns used.
Labels: a classification label string becomes its index in `spec.labels`; a
regression label is a float. Unlabelled files (GLUE's `test.tsv`): with
`labels_required=False`, an absent label column or an empty label field gives
label -1 (classification) or NaN (regression).

Errors (`GlueFormatError`, a `ValueError`), each naming the file and the
1-based line (and column, counted in characters, where there is one) and what
to do: a missing file (`FileNotFoundError`), invalid UTF-8, a header without a
needed column, a row with too few fields, an unknown label, a regression label
that is not a finite number, an empty text field.

"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from bert_jax.data.text_files import as_text, char_column, utf8_lines
from bert_jax.errors import MissingFileError, UserError

Column = str | int


class GlueFormatError(UserError, ValueError):
    """A TSV file that cannot be read as its task says (the message says where)."""


# ------------------------------------------------------------------- tasks --


@dataclasses.dataclass(frozen=True)
class GlueTaskSpec:
    """How to read one GLUE-style task from its TSV files.

    Attributes:
      name: the task's short name (`sst2`).
      text_a, text_b: the sentence columns; `text_b` is `None` for a
        single-sentence task. Header names (`"sentence"`, `"#1 String"`), or
        0-based indices for header-less files (all columns then are indices).
      label_column: the label's column, like `text_a`.
      labels: the label strings of a classification task, in class-index order
        (label string -> its index here); `()` for regression (float label).
      metrics: names of functions in `bert_jax.evaluation.classification_metrics`.
      splits: tfds split name -> file name in the task directory.
      catalog: the tfds catalog dataset (`"glue/sst2"`).
      catalog_text_a, catalog_text_b, catalog_label: the catalog's feature
        names for text_a, text_b (`None` when single sentence) and the label.
      label_names: human-readable names of `labels`, same order (`()`: the
        labels themselves).
      catalog_labels: the catalog's ClassLabel names in its class-index order
        (`()`: the same as `label_names`, index for index).
      unlabeled_splits: splits whose files have no labels (read with
        `labels_required=False`).
      directory: the task's folder in the GLUE download (`"SST-2"`).
      description: a line or two about the task.
    """

    name: str
    text_a: Column
    text_b: Column | None
    label_column: Column
    labels: tuple[str, ...]
    metrics: tuple[str, ...]
    splits: dict[str, str] = dataclasses.field(hash=False)
    catalog: str
    catalog_text_a: str
    catalog_text_b: str | None
    catalog_label: str = "label"
    label_names: tuple[str, ...] = ()
    catalog_labels: tuple[str, ...] = ()
    unlabeled_splits: tuple[str, ...] = ("test",)
    directory: str = ""
    description: str = ""

    def __post_init__(self):
        columns = [c for c in (self.text_a, self.text_b, self.label_column)
                   if c is not None]
        kinds = {isinstance(c, int) for c in columns}
        if len(kinds) != 1 or not all(isinstance(c, (str, int)) for c in columns):
            raise ValueError(
                f"GlueTaskSpec {self.name}: columns must be all header names or all "
                f"0-based indices, got text_a={self.text_a!r}, text_b={self.text_b!r}, "
                f"label_column={self.label_column!r}")
        if any(isinstance(c, int) and c < 0 for c in columns):
            raise ValueError(f"GlueTaskSpec {self.name}: column indices must be >= 0")
        if len(set(self.labels)) != len(self.labels):
            raise ValueError(f"GlueTaskSpec {self.name}: duplicate labels {self.labels}")
        for attr in ("label_names", "catalog_labels"):
            names = getattr(self, attr)
            if names and (len(names) != len(self.labels) or set(names) != set(
                    self.label_names or self.labels)):
                raise ValueError(
                    f"GlueTaskSpec {self.name}: {attr} {names} must name the "
                    f"{len(self.labels)} labels {self.label_names or self.labels}")
        if not self.splits or not all(isinstance(k, str) and isinstance(v, str)
                                      for k, v in self.splits.items()):
            raise ValueError(f"GlueTaskSpec {self.name}: splits must map split "
                             f"names to file names, got {self.splits!r}")

    @property
    def is_regression(self) -> bool:
        """Whether the label is a float score (no label set)."""
        return not self.labels

    @property
    def num_labels(self) -> int:
        """The number of classes, or 1 for regression (one output)."""
        return len(self.labels) or 1

    @property
    def has_header(self) -> bool:
        """Whether the files start with a header row (columns given by name)."""
        return not isinstance(self.text_a, int)


_STANDARD_SPLITS = {"train": "train.tsv", "validation": "dev.tsv", "test": "test.tsv"}

GLUE_TASKS: dict[str, GlueTaskSpec] = {spec.name: spec for spec in (
    GlueTaskSpec(
        name="sst2", text_a="sentence", text_b=None, label_column="label",
        labels=("0", "1"), label_names=("negative", "positive"),
        metrics=("accuracy",), splits=dict(_STANDARD_SPLITS),
        catalog="glue/sst2", catalog_text_a="sentence", catalog_text_b=None,
        directory="SST-2",
        description="Stanford Sentiment Treebank: movie review phrase, binary "
                    "sentiment. Header `sentence label` (test: `index sentence`)."),
    GlueTaskSpec(
        name="mrpc", text_a="#1 String", text_b="#2 String", label_column="Quality",
        labels=("0", "1"), label_names=("not_equivalent", "equivalent"),
        metrics=("accuracy", "f1"), splits=dict(_STANDARD_SPLITS),
        catalog="glue/mrpc", catalog_text_a="sentence1", catalog_text_b="sentence2",
        directory="MRPC",
        description="Microsoft Research Paraphrase Corpus: is the pair a "
                    "paraphrase. Header `Quality #1 ID #2 ID #1 String #2 String` "
                    "(after a byte-order mark); test: `index #1 ID ...`."),
    GlueTaskSpec(
        name="stsb", text_a="sentence1", text_b="sentence2", label_column="score",
        labels=(), metrics=("pearson", "spearman"), splits=dict(_STANDARD_SPLITS),
        catalog="glue/stsb", catalog_text_a="sentence1", catalog_text_b="sentence2",
        directory="STS-B",
        description="Semantic Textual Similarity Benchmark: similarity score 0-5 "
                    "(regression). 10 columns `index genre filename year old_index "
                    "source1 source2 sentence1 sentence2 score` (test: no score)."),
    GlueTaskSpec(
        name="cola", text_a=3, text_b=None, label_column=1,
        labels=("0", "1"), label_names=("unacceptable", "acceptable"),
        metrics=("matthews_corrcoef",),
        # test.tsv has a header (`index sentence`), unlike train/dev: not read.
        splits={"train": "train.tsv", "validation": "dev.tsv"},
        catalog="glue/cola", catalog_text_a="sentence", catalog_text_b=None,
        directory="CoLA",
        description="Corpus of Linguistic Acceptability: is the sentence "
                    "grammatical. No header; columns source, label, original "
                    "label (or '*'), sentence."),
    GlueTaskSpec(
        name="rte", text_a="sentence1", text_b="sentence2", label_column="label",
        labels=("entailment", "not_entailment"), metrics=("accuracy",),
        splits=dict(_STANDARD_SPLITS),
        catalog="glue/rte", catalog_text_a="sentence1", catalog_text_b="sentence2",
        directory="RTE",
        description="Recognizing Textual Entailment: does sentence1 entail "
                    "sentence2. Header `index sentence1 sentence2 label`."),
    GlueTaskSpec(
        name="qnli", text_a="question", text_b="sentence", label_column="label",
        labels=("entailment", "not_entailment"), metrics=("accuracy",),
        splits=dict(_STANDARD_SPLITS),
        catalog="glue/qnli", catalog_text_a="question", catalog_text_b="sentence",
        directory="QNLI",
        description="Question NLI (from SQuAD): does the sentence answer the "
                    "question. Header `index question sentence label`."),
    GlueTaskSpec(
        name="mnli", text_a="sentence1", text_b="sentence2", label_column="gold_label",
        labels=("contradiction", "entailment", "neutral"), metrics=("accuracy",),
        splits={"train": "train.tsv", "validation": "dev_matched.tsv",
                "validation_mismatched": "dev_mismatched.tsv",
                "test": "test_matched.tsv", "test_mismatched": "test_mismatched.tsv"},
        unlabeled_splits=("test", "test_mismatched"),
        catalog="glue/mnli", catalog_text_a="premise", catalog_text_b="hypothesis",
        catalog_labels=("entailment", "neutral", "contradiction"),
        directory="MNLI",
        description="Multi-Genre NLI: premise/hypothesis entailment, 3 classes "
                    "(BERT's order). Header `index promptID pairID genre ... "
                    "sentence1 sentence2 label1 ... gold_label`; the catalog calls "
                    "the dev splits validation_matched/validation_mismatched."),
)}


def get_task(task: str | GlueTaskSpec) -> GlueTaskSpec:
    """`task` itself, or the `GLUE_TASKS` entry of that name."""
    if isinstance(task, GlueTaskSpec):
        return task
    if task not in GLUE_TASKS:
        raise ValueError(f"glue: unknown task {task!r}; known tasks: "
                         f"{sorted(GLUE_TASKS)}, or pass a GlueTaskSpec.")
    return GLUE_TASKS[task]


# ----------------------------------------------------------------- reading --


def read_tsv(path: str | os.PathLike, spec: str | GlueTaskSpec,
             labels_required: bool = True) -> list[dict[str, Any]]:
    """The examples of one TSV file of a task, in file order.

    Args:
      path: the `.tsv` file.
      spec: a `GlueTaskSpec` or the name of one in `GLUE_TASKS`.
      labels_required: `False` for unlabelled files (GLUE's `test.tsv`): an
        absent label column, or an empty label field, gives label -1
        (classification) or NaN (regression) instead of an error.

    Returns:
      `[{"text_a": str, "text_b": str ("" for a single-sentence task),
         "label": int (index in spec.labels) or float, "line": int}, ...]`,
      `line` the example's 1-based line in the file.

    Raises:
      FileNotFoundError: no such file.
      GlueFormatError: see the module docstring; the message names the file,
        the line (and column) and what to do.
    """
    spec = get_task(spec)
    path = os.fspath(path)
    prefix = f"glue {spec.name}: "
    if not os.path.isfile(path):
        raise MissingFileError(
            f"{prefix}{path} does not exist; point the path at the task's "
            f"directory holding {sorted(set(spec.splits.values()))}.")

    def rows() -> Iterator[tuple[int, list[str]]]:
        """(1-based line number, tab-separated fields) of each line."""
        for lineno, text in utf8_lines(path, GlueFormatError, prefix):
            try:
                yield lineno, next(csv.reader([text], delimiter="\t",
                                              quoting=csv.QUOTE_NONE, strict=True))
            except csv.Error as e:
                reason = ("a carriage return (\\r) inside the line: remove it"
                          if "new-line character" in str(e) else f"{e}; fix that line")
                raise GlueFormatError(
                    f"{prefix}{path}:{lineno}: cannot split the line into "
                    f"tab-separated fields ({reason}).") from None

    wanted = {"text_a": spec.text_a, "text_b": spec.text_b,
              "label": spec.label_column}
    row_iter = rows()
    header: list[str] | None = None
    if spec.has_header:
        header = next(row_iter, (1, None))[1]
        if header is None:
            raise GlueFormatError(
                f"{prefix}{path}:1: the file is empty; a {spec.name} file starts "
                f"with a header naming its columns.")
        names = [h.strip() for h in header]
        index: dict[str, int | None] = {}
        for key, column in wanted.items():
            if column is None:
                index[key] = None
            elif column in names:
                index[key] = names.index(column)
            elif key == "label" and not labels_required:
                index[key] = None
            else:
                raise GlueFormatError(
                    f"{prefix}{path}:1: the header has no column {column!r} (the "
                    f"{key} of task {spec.name}); header: {names}. Check that the "
                    f"file belongs to task {spec.name}, or define a GlueTaskSpec "
                    f"with this file's column names.")
    else:
        index = dict(wanted)
    label_index = index["label"]
    needed = [(key, i) for key, i in index.items()
              if i is not None and (key != "label" or labels_required)]
    label_ids = {label: i for i, label in enumerate(spec.labels)}

    examples = []
    for lineno, row in row_iter:
        for key, i in needed:
            if i >= len(row):
                width = (f"{len(header)} tab-separated fields, as in the header"
                         if header is not None else
                         f"at least {max(i for _, i in needed) + 1} tab-separated "
                         f"fields")
                blank = " (a blank line: remove it)" if not row else ""
                raise GlueFormatError(
                    f"{prefix}{path}:{lineno}: expected {width}, got {len(row)}"
                    f"{blank}; there is no {key} field (column {wanted[key]!r}). "
                    f"Check for a missing tab, or a line break inside a sentence.")
        example: dict[str, Any] = {}
        for key in ("text_a", "text_b"):
            i = index[key]
            if i is None:
                example[key] = ""
                continue
            text = row[i].strip()
            if not text:
                raise GlueFormatError(
                    f"{prefix}{path}:{lineno}:{char_column(row, i)}: empty {key} "
                    f"(column {wanted[key]!r}); every example needs its text: fix or "
                    f"remove line {lineno}.")
            example[key] = text
        value = (row[label_index].strip()
                 if label_index is not None and label_index < len(row) else "")
        column = (char_column(row, label_index)
                  if label_index is not None and label_index < len(row) else 0)
        if not value and not labels_required:
            example["label"] = math.nan if spec.is_regression else -1
        elif spec.is_regression:
            try:
                score = float(value)
            except ValueError:
                score = math.nan
            if not math.isfinite(score):
                raise GlueFormatError(
                    f"{prefix}{path}:{lineno}:{column}: the label {value!r} (column "
                    f"{spec.label_column!r}) is not a number; task {spec.name} is a "
                    f"regression with float scores: fix that field"
                    + (" (for an unlabelled file pass labels_required=False)."
                       if not value else "."))
            example["label"] = score
        elif value in label_ids:
            example["label"] = label_ids[value]
        else:
            raise GlueFormatError(
                f"{prefix}{path}:{lineno}:{column}: unknown label {value!r} (column "
                f"{spec.label_column!r}); task {spec.name} allows "
                f"{list(spec.labels)}. Fix the label, or define a GlueTaskSpec with "
                f"this file's labels"
                + (" (for an unlabelled file pass labels_required=False)."
                   if not value else "."))
        example["line"] = lineno
        examples.append(example)
    return examples


def from_catalog(spec: str | GlueTaskSpec, example: Mapping[str, Any]
                 ) -> dict[str, Any]:
    """An example of the task's tfds catalog dataset as `read_tsv` gives it.

    `example` is one element of e.g. `tfds.data_source("glue/sst2", ...)`
    (`{"sentence", "label", "idx"}`; `glue/mrpc`: sentence1/sentence2;
    `glue/stsb`: a float label). Returns `{"text_a": str, "text_b": str,
    "label": int or float}`, texts stripped like `read_tsv`'s, the label an
    index in `spec.labels` (the catalog's class order is mapped, e.g. MNLI's).
    The catalog's unlabelled test examples (label -1) give -1, or NaN for
    regression.
    """
    spec = get_task(spec)
    out: dict[str, Any] = {}
    for key, feature in (("text_a", spec.catalog_text_a),
                         ("text_b", spec.catalog_text_b)):
        if feature is None:
            out[key] = ""
            continue
        if feature not in example:
            raise KeyError(f"from_catalog({spec.name}): the example has no feature "
                           f"{feature!r} (it has {sorted(example)}); is it from "
                           f"{spec.catalog}?")
        out[key] = as_text(example[feature]).strip()
    if spec.catalog_label not in example:
        raise KeyError(f"from_catalog({spec.name}): the example has no feature "
                       f"{spec.catalog_label!r} (it has {sorted(example)})")
    raw = np.asarray(example[spec.catalog_label]).item()
    if spec.is_regression:
        score = float(raw)
        out["label"] = math.nan if score == -1.0 else score
        return out
    index = int(raw)
    if index == -1:
        out["label"] = -1
        return out
    names = spec.label_names or spec.labels
    catalog_names = spec.catalog_labels or names
    if not 0 <= index < len(catalog_names):
        raise ValueError(f"from_catalog({spec.name}): label {index} is out of range "
                         f"for the {len(catalog_names)} classes {catalog_names} of "
                         f"{spec.catalog}")
    out["label"] = names.index(catalog_names[index])
    return out


# ------------------------------------------------------------------ splits --


def task_directory(path: str | os.PathLike, spec: GlueTaskSpec) -> str:
    """The task's directory: `path` itself when it holds some of the task's
    files, or its `spec.directory` folder (a GLUE root: `SST-2`)."""
    directory = os.path.realpath(os.path.expanduser(os.fspath(path)))
    if not os.path.isdir(directory):
        raise MissingFileError(
            f"glue {spec.name}: {directory} is not a directory (path="
            f"{os.fspath(path)!r}); pass the task's directory, holding "
            f"{sorted(set(spec.splits.values()))}.")
    if any(os.path.isfile(os.path.join(directory, f)) for f in spec.splits.values()):
        return directory
    if spec.directory and os.path.isdir(os.path.join(directory, spec.directory)):
        return task_directory(os.path.join(directory, spec.directory), spec)
    raise MissingFileError(
        f"glue {spec.name}: {directory} has none of the task's files "
        f"{sorted(set(spec.splits.values()))} (nor a {spec.directory!r} folder); "
        "pass the task's directory.")


def read_split(path: str | os.PathLike, spec: str | GlueTaskSpec, split: str
               ) -> list[dict[str, Any]]:
    """The examples of `split` (`train`, `validation`, `test`, ...) of the
    task directory (or GLUE root) `path`, in file order (`read_tsv`); a split
    without examples is an error naming its file."""
    spec = get_task(spec)
    if split not in spec.splits:
        raise GlueFormatError(f"glue {spec.name}: no split {split!r}; the task has "
                              f"{sorted(spec.splits)}.")
    file = os.path.join(task_directory(path, spec), spec.splits[split])
    examples = read_tsv(file, spec, labels_required=split not in spec.unlabeled_splits)
    if not examples:
        raise GlueFormatError(f"glue {spec.name}: {file} has no examples; add examples "
                              "or evaluate another split.")
    return examples
