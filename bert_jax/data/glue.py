"""`glue`: GLUE-style TSV classification/regression tasks, read from local files.

    dev = read_split("../shared/data/glue", "sst2", "validation")  # task dir or GLUE root

`read_split` returns the split's examples in file order, each a dict
`{"text_a": str, "text_b": str ("" for a single sentence), "label", "line"}`:
the label is an int index into the task's `labels` (a float for regression),
`line` the 1-based line of the file. `GLUE_TASKS` describes each task (its
columns, labels, metrics and files). The fine-tuning task
(`bert_jax.tasks.finetune`) reads its GLUE data here and tokenizes it.

The files are small (MNLI's 393k pairs read in seconds): no dataset build.
The tfds catalog's examples (`load_source("glue/sst2", "validation")`) map to
the same dicts, without `line`, through `from_catalog`.

TSV: UTF-8, one example a line, split at tabs only (GLUE sentences hold `"`,
kept as text); text fields and labels are stripped. Files with a header row
name their columns there; header-less files (CoLA's train/dev) use 0-based
indices. Rows may have more fields than the header, not fewer than the columns
used. With `labels_required=False` (GLUE's `test.tsv`), an absent label gives
-1 (classification) or NaN (regression); with `text_only=True` the label
column is never looked at and the examples have no "label" (the unlabelled
text of in-task pretraining). A file that cannot be read so raises a
`DataError` naming file:line[:column] and the bad field.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from bert_jax.data.text_files import as_text, char_column, utf8_lines
from bert_jax.errors import DataError, MissingFileError

Column = str | int


@dataclasses.dataclass(frozen=True)
class GlueTaskSpec:
    """How to read one GLUE-style task from its TSV files: the columns (header
    names, or 0-based indices for header-less files), `labels` in class order
    (`()`: regression), `metrics` (of `evaluation.classification_metrics`),
    split name -> file, and the tfds catalog's names (its ClassLabel order in
    `catalog_labels`, `()`: that of `label_names`, or else `labels`)."""

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
        def check(ok: bool, fields: str, value: Any, need: str) -> None:
            if not ok:
                raise ValueError(f"GlueTaskSpec {self.name}: {fields}={value!r}; give {need}")

        columns = [c for c in (self.text_a, self.text_b, self.label_column) if c is not None]
        kinds = {type(c) for c in columns}
        check(kinds == {str} or kinds == {int} and min(columns) >= 0,
              "text_a, text_b, label_column", columns, "all header names, or all 0-based indices")
        check(len(set(self.labels)) == len(self.labels), "labels", self.labels,
              "without duplicates")
        classes = self.label_names or self.labels
        check(all(not names or len(names) == len(self.labels) and set(names) == set(classes)
                  for names in (self.label_names, self.catalog_labels)),
              "label_names, catalog_labels", (self.label_names, self.catalog_labels),
              f"each empty or a reordering of {classes}")
        check(bool(self.splits) and all(isinstance(k, str) and isinstance(v, str)
                                        for k, v in self.splits.items()),
              "splits", self.splits, "a non-empty map of split name -> file name")

    @property
    def is_regression(self) -> bool:
        return not self.labels

    @property
    def num_labels(self) -> int:   # one output for regression
        return len(self.labels) or 1

    @property
    def has_header(self) -> bool:   # columns given by name
        return not isinstance(self.text_a, int)


_STANDARD_SPLITS = {"train": "train.tsv", "validation": "dev.tsv", "test": "test.tsv"}

GLUE_TASKS: dict[str, GlueTaskSpec] = {spec.name: spec for spec in (
    GlueTaskSpec(
        name="sst2", text_a="sentence", text_b=None, label_column="label",
        labels=("0", "1"), label_names=("negative", "positive"),
        metrics=("accuracy",), splits=dict(_STANDARD_SPLITS),
        catalog="glue/sst2", catalog_text_a="sentence", catalog_text_b=None,
        directory="SST-2",
        description="Stanford Sentiment Treebank: a movie review phrase's sentiment."),
    GlueTaskSpec(
        name="mrpc", text_a="#1 String", text_b="#2 String", label_column="Quality",
        labels=("0", "1"), label_names=("not_equivalent", "equivalent"),
        metrics=("accuracy", "f1"), splits=dict(_STANDARD_SPLITS),
        catalog="glue/mrpc", catalog_text_a="sentence1", catalog_text_b="sentence2",
        directory="MRPC",
        description="Microsoft Research Paraphrase Corpus: is the pair a paraphrase."),
    GlueTaskSpec(
        name="stsb", text_a="sentence1", text_b="sentence2", label_column="score",
        labels=(), metrics=("pearson", "spearman"), splits=dict(_STANDARD_SPLITS),
        catalog="glue/stsb", catalog_text_a="sentence1", catalog_text_b="sentence2",
        directory="STS-B",
        description="Semantic Textual Similarity Benchmark: a similarity score 0-5."),
    GlueTaskSpec(
        name="cola", text_a=3, text_b=None, label_column=1,
        labels=("0", "1"), label_names=("unacceptable", "acceptable"),
        metrics=("matthews_corrcoef",),
        # test.tsv has a header (`index sentence`), unlike train/dev: not read.
        splits={"train": "train.tsv", "validation": "dev.tsv"},
        catalog="glue/cola", catalog_text_a="sentence", catalog_text_b=None,
        directory="CoLA",
        description="Corpus of Linguistic Acceptability: is the sentence grammatical."),
    GlueTaskSpec(
        name="rte", text_a="sentence1", text_b="sentence2", label_column="label",
        labels=("entailment", "not_entailment"), metrics=("accuracy",),
        splits=dict(_STANDARD_SPLITS),
        catalog="glue/rte", catalog_text_a="sentence1", catalog_text_b="sentence2",
        directory="RTE",
        description="Recognizing Textual Entailment: does sentence1 entail sentence2."),
    GlueTaskSpec(
        name="qnli", text_a="question", text_b="sentence", label_column="label",
        labels=("entailment", "not_entailment"), metrics=("accuracy",),
        splits=dict(_STANDARD_SPLITS),
        catalog="glue/qnli", catalog_text_a="question", catalog_text_b="sentence",
        directory="QNLI",
        description="Question NLI (from SQuAD): does the sentence answer the question."),
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
        description="Multi-Genre NLI: premise/hypothesis entailment, BERT's class order."),
)}


def get_task(task: str | GlueTaskSpec) -> GlueTaskSpec:
    """`task` itself, or the `GLUE_TASKS` entry of that name."""
    if isinstance(task, GlueTaskSpec):
        return task
    if task not in GLUE_TASKS:
        raise ValueError(f"glue: unknown task {task!r}; known: {sorted(GLUE_TASKS)}")
    return GLUE_TASKS[task]


def read_tsv(path: str | os.PathLike, spec: str | GlueTaskSpec,
             labels_required: bool = True, text_only: bool = False) -> list[dict[str, Any]]:
    """The examples of one TSV file of a task, in file order:
    `{"text_a", "text_b" ("" for one sentence), "label", "line"}`, the label
    an index in `spec.labels` (a float for regression), `line` 1-based."""
    spec = get_task(spec)
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise MissingFileError(f"{path}: no such file; pass a file of task {spec.name} "
                               f"({', '.join(sorted(set(spec.splits.values())))})")
    rows = _rows(path)
    wanted = {"text_a": spec.text_a, "text_b": spec.text_b,
              **({} if text_only else {"label": spec.label_column})}
    index = dict(wanted)
    if spec.has_header:
        header = next(rows, (1, None))[1]
        if header is None:
            raise DataError(path, "empty file", f"a {spec.name} file starts with a header row",
                            line=1)
        names = [h.strip() for h in header]
        for key, column in wanted.items():
            if column in names:
                index[key] = names.index(column)
            elif column is not None and (key != "label" or labels_required):
                raise DataError(path, f"no column {column!r} in the header {names}",
                                f"is it a file of task {spec.name}?", line=1)
            else:
                index[key] = None
    width = 1 + max(i for key, i in index.items()
                    if i is not None and (key != "label" or labels_required))
    label_ids = {label: i for i, label in enumerate(spec.labels)}
    examples = []
    for lineno, row in rows:
        if len(row) < width:
            raise DataError(path, f"{len(row)} tab-separated field(s), {width} needed",
                            "add the missing tab or field, or join a sentence broken over "
                            "lines", line=lineno)
        example: dict[str, Any] = {"line": lineno}
        for key in ("text_a", "text_b"):
            i = index[key]
            example[key] = "" if i is None else row[i].strip()
            if i is not None and not example[key]:
                raise DataError(path, f"empty {key}", "fix or remove the line", line=lineno,
                                column=char_column(row, i))
        if text_only:
            examples.append(example)
            continue
        i = index["label"]
        value = row[i].strip() if i is not None and i < len(row) else ""
        if not value and not labels_required:
            label = math.nan if spec.is_regression else -1
        elif spec.is_regression:
            label = float(value) if _is_number(value) else None
        else:
            label = label_ids.get(value)
        if label is None:
            allowed = "a number" if spec.is_regression else f"one of {list(spec.labels)}"
            raise DataError(path, f"label {value!r} is not {allowed}", "fix it" + (
                "" if value else ", or pass labels_required=False for an unlabelled file"),
                line=lineno, column=char_column(row, i))
        example["label"] = label
        examples.append(example)
    return examples


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _rows(path: str) -> Iterator[tuple[int, list[str]]]:
    """(1-based line number, tab-separated fields) of each line; a '\\r'
    inside a line is an error (csv would read it as a line break)."""
    for _, lineno, text in utf8_lines(path):
        text = text.removesuffix("\n").removesuffix("\r")
        if "\r" in text:
            raise DataError(path, "a carriage return (\\r) inside the line", "remove it",
                            line=lineno, column=text.index("\r") + 1)
        yield lineno, text.split("\t") if text else []


def from_catalog(spec: str | GlueTaskSpec, example: Mapping[str, Any]
                 ) -> dict[str, Any]:
    """An example of the task's tfds catalog dataset (`glue/sst2`, ...) as
    `read_tsv` gives it (without "line"); the catalog's class order is mapped
    to `spec.labels` (MNLI's differs), its unlabelled -1 stays -1 (NaN for
    regression)."""
    spec = get_task(spec)
    out: dict[str, Any] = {}
    for key, feature in (("text_a", spec.catalog_text_a), ("text_b", spec.catalog_text_b),
                         ("label", spec.catalog_label)):
        if feature is not None and feature not in example:
            raise KeyError(f"from_catalog({spec.name}): no feature {feature!r} (the example "
                           f"has {sorted(example)}); is it from {spec.catalog}?")
        if key != "label":
            out[key] = "" if feature is None else as_text(example[feature]).strip()
    raw = np.asarray(example[spec.catalog_label]).item()
    if spec.is_regression:
        out["label"] = math.nan if float(raw) == -1.0 else float(raw)
        return out
    names = spec.label_names or spec.labels
    catalog_names = spec.catalog_labels or names
    if not -1 <= int(raw) < len(catalog_names):
        raise ValueError(f"from_catalog({spec.name}): label {int(raw)} is out of range "
                         f"for the classes {catalog_names} of {spec.catalog}")
    out["label"] = -1 if int(raw) == -1 else names.index(catalog_names[int(raw)])
    return out


def task_directory(path: str | os.PathLike, spec: GlueTaskSpec) -> str:
    """The task's directory: `path` itself when it holds some of the task's
    files, or its `spec.directory` folder (a GLUE root: `SST-2`)."""
    directory = os.path.realpath(os.path.expanduser(os.fspath(path)))
    files = ", ".join(sorted(set(spec.splits.values())))
    if not os.path.isdir(directory):
        raise MissingFileError(f"{directory}: not a directory; pass the directory of "
                               f"task {spec.name} ({files}) or the GLUE root")
    if any(os.path.isfile(os.path.join(directory, f)) for f in spec.splits.values()):
        return directory
    if spec.directory and os.path.isdir(os.path.join(directory, spec.directory)):
        return task_directory(os.path.join(directory, spec.directory), spec)
    raise MissingFileError(f"{directory}: none of the files of task {spec.name} ({files}) "
                           f"nor a {spec.directory} folder; pass the task's directory")


def read_split(path: str | os.PathLike, spec: str | GlueTaskSpec, split: str,
               text_only: bool = False) -> list[dict[str, Any]]:
    """`read_tsv` of the file of `split` in the task directory (or GLUE
    root) `path`; a split without examples is an error."""
    spec = get_task(spec)
    if split not in spec.splits:
        raise DataError(f"glue {spec.name}", f"no split {split!r}",
                        f"the task has {sorted(spec.splits)}")
    file = os.path.join(task_directory(path, spec), spec.splits[split])
    examples = read_tsv(file, spec, labels_required=split not in spec.unlabeled_splits,
                        text_only=text_only)
    if not examples:
        raise DataError(file, "no examples", "add some or evaluate another split")
    return examples
