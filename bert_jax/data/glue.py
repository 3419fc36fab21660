"""`glue`: GLUE-style TSV classification/regression tasks, read from local files.

A task is described by a `GlueTaskSpec` (which columns hold the sentences and
the label, the label set, the metrics, the files of each split, and the
matching tfds catalog dataset). `GLUE_TASKS` has SST-2, MRPC, STS-B, CoLA, RTE,
QNLI and MNLI, laid out as in the official GLUE download
(`{task dir}/train.tsv`, `dev.tsv`, `test.tsv`):

    examples = read_tsv("../shared/data/glue/SST-2/dev.tsv", GLUE_TASKS["sst2"])
    examples[0]   # {"text_a": "it 's a charming ...", "text_b": "", "label": 1,
                  #  "line": 2}

or as a tfds dataset in `array_record` format (read without TensorFlow):

    builder = GlueTsv(path="../shared/data/glue/SST-2", task="sst2",
                      data_dir=data_dir)
    dev = load_source(builder, "validation")  # dev[i]: text_a, text_b, label, idx
    # or by name, the parameters passed through load_source (this module must
    # have been imported, which registers the builder):
    dev = load_source("glue_tsv", "validation", data_dir,
                      path="../shared/data/glue/SST-2", task="sst2")

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

`GlueTsv` config name, e.g. `SST-2_sst2_3f9a0c1b2d4e`: the directory's name,
the task, and a 12-hex-digit SHA-256 of the absolute (symlink-resolved) path,
the task's parsing parameters (columns, labels, split files) and each file's
name, size and modification time (ns), as in `parallel_text`: an edited file
gets a config (and folder) of its own; a file that changes between
constructing the builder and building it is an error.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from bert_jax.data.builder_configs import (
    ConfigRegistry, LocalFilesBuilder, check_unchanged, config_name, file_stats)
from bert_jax.data.text_files import utf8_lines
from bert_jax.errors import UserError

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

    def _fingerprint(self) -> tuple:
        """What decides how the files are parsed (not the description)."""
        return (self.name, self.text_a, self.text_b, self.label_column, self.labels,
                tuple(sorted(self.splits.items())), self.unlabeled_splits)


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


def _decoded_lines(path: str, where: list[int], prefix: str) -> Iterator[str]:
    """The lines of a UTF-8 file (BOM dropped); `where[0]` is the current line."""
    for lineno, text in utf8_lines(path, GlueFormatError, prefix):
        where[0] = lineno
        yield text


def _char_column(row: list[str], index: int) -> int:
    """1-based character column where field `index` of a tab-split row starts."""
    return 1 + sum(len(field) + 1 for field in row[:index])


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
        raise FileNotFoundError(
            f"{prefix}{path} does not exist; point the path at the task's "
            f"directory holding {sorted(set(spec.splits.values()))}.")
    where = [0]
    reader = csv.reader(_decoded_lines(path, where, prefix), delimiter="\t",
                        quoting=csv.QUOTE_NONE, strict=True)

    def rows() -> Iterator[list[str]]:
        while True:
            try:
                yield next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                reason = ("a carriage return (\\r) inside the line: remove it"
                          if "new-line character" in str(e) else f"{e}; fix that line")
                raise GlueFormatError(
                    f"{prefix}{path}:{where[0]}: cannot split the line into "
                    f"tab-separated fields ({reason}).") from None

    wanted = {"text_a": spec.text_a, "text_b": spec.text_b,
              "label": spec.label_column}
    row_iter = rows()
    header: list[str] | None = None
    if spec.has_header:
        header = next(row_iter, None)
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
    for row in row_iter:
        lineno = where[0]
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
                    f"{prefix}{path}:{lineno}:{_char_column(row, i)}: empty {key} "
                    f"(column {wanted[key]!r}); every example needs its text: fix or "
                    f"remove line {lineno}.")
            example[key] = text
        value = (row[label_index].strip()
                 if label_index is not None and label_index < len(row) else "")
        column = (_char_column(row, label_index)
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
        out[key] = _to_str(example[feature]).strip()
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


def _to_str(value: Any) -> str:
    if isinstance(value, np.ndarray):
        value = value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return str(value)


# ----------------------------------------------------------------- builder --


@dataclasses.dataclass(eq=False)
class GlueTsvConfig(tfds.core.BuilderConfig):
    """A task directory and its fingerprint; build instances with `glue_tsv_config`."""

    path: str = ""                                # absolute, symlinks resolved
    task: GlueTaskSpec | None = None
    splits: tuple[tuple[str, str], ...] = ()      # (tfds split name, file name)
    # (file name, size in bytes, mtime in ns) of every file read.
    files: tuple[tuple[str, int, int], ...] = ()

    def split_file(self, split: str) -> str:
        """The TSV file of `split`."""
        return os.path.join(self.path, dict(self.splits)[split])


_CONFIGS: ConfigRegistry[GlueTsvConfig] = ConfigRegistry()


def glue_tsv_config(path: str | os.PathLike, task: str | GlueTaskSpec
                    ) -> GlueTsvConfig:
    """The (validated, fingerprinted, interned) config of a task directory.

    `path` is the task's directory (holding `train.tsv`, `dev.tsv`, ...), or a
    GLUE root holding it as `spec.directory` (`SST-2`). The splits are those
    of `spec.splits` whose file exists; their contents are checked when the
    dataset is built.
    """
    spec = get_task(task)
    directory = os.path.realpath(os.path.expanduser(os.fspath(path)))
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"glue {spec.name}: {directory} is not a directory (path="
            f"{os.fspath(path)!r}); pass the task's directory, holding "
            f"{sorted(set(spec.splits.values()))}.")
    present = [(split, name) for split, name in spec.splits.items()
               if os.path.isfile(os.path.join(directory, name))]
    if not present and spec.directory and os.path.isdir(
            os.path.join(directory, spec.directory)):
        return glue_tsv_config(os.path.join(directory, spec.directory), spec)
    if not present:
        raise FileNotFoundError(
            f"glue {spec.name}: {directory} has none of the task's files "
            f"{sorted(set(spec.splits.values()))} (nor a {spec.directory!r} folder); "
            f"pass the task's directory.")
    params = dict(path=directory, task=spec._fingerprint(),
                  splits=tuple(sorted(present)),
                  files=file_stats(directory, [name for _, name in present]))
    name = config_name(directory, params, spec.name, default="glue")
    return _CONFIGS.intern(name, lambda: GlueTsvConfig(
        name=name, description=(
            f"GLUE task {spec.name} from {directory}, splits "
            f"{dict(present)}"),
        path=directory, task=spec, splits=params["splits"], files=params["files"]))


class GlueTsv(LocalFilesBuilder):
    """A GLUE-style task read from local TSV files (see the module docstring).

    Features: `text_a`, `text_b` (text; `""` for single-sentence tasks),
    `label` (int64 class index, -1 when unlabelled; float32 for regression,
    NaN when unlabelled), `idx` (int64, the example's 0-based position in
    its file). Examples keep the file order.
    """

    CONFIGS = _CONFIGS

    def __init__(self, *, path: str | os.PathLike | None = None,
                 task: str | GlueTaskSpec | None = None, config=None, **kwargs):
        """The task directory and task (`path`, `task`) or `config`, not both."""
        given = {k for k, v in dict(path=path, task=task).items() if v is not None}
        if config is not None:
            if given:
                raise ValueError(f"glue_tsv: pass either config= or {sorted(given)}, "
                                 f"not both.")
        else:
            missing = {"path", "task"} - given
            if missing:
                raise ValueError(f"glue_tsv needs path= (the task directory) and "
                                 f"task= (one of {sorted(GLUE_TASKS)} or a "
                                 f"GlueTaskSpec); missing: {', '.join(sorted(missing))}.")
            config = glue_tsv_config(path, task)
        super().__init__(config=config, **kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
        spec: GlueTaskSpec = self.builder_config.task
        label = np.float32 if spec.is_regression else np.int64
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict({
                "text_a": tfds.features.Text(),
                "text_b": tfds.features.Text(),
                "label": tfds.features.Scalar(dtype=label),
                "idx": tfds.features.Scalar(dtype=np.int64),
            }),
            metadata=tfds.core.MetadataDict(
                task=spec.name, labels=list(spec.labels),
                label_names=list(spec.label_names or spec.labels),
                metrics=list(spec.metrics), is_regression=spec.is_regression),
            disable_shuffling=True,   # example i is the file's i-th example
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # nothing to download
        cfg: GlueTsvConfig = self.builder_config
        spec = cfg.task
        prefix = f"glue {spec.name}: "
        check_unchanged(cfg.path, cfg.files, cfg.name, f"glue {spec.name}", GlueFormatError)
        # Read (and check) every split before tfds writes any example.
        examples = {split: read_tsv(cfg.split_file(split), spec,
                                    labels_required=split not in spec.unlabeled_splits)
                    for split, _ in cfg.splits}
        empty = [split for split, ex in examples.items() if not ex]
        if empty:  # tfds cannot write a split with no examples
            raise GlueFormatError(
                f"{prefix}split(s) {empty} have no examples "
                f"({', '.join(cfg.split_file(s) for s in empty)}); remove the "
                f"file(s) or add examples.")
        return {split: self._generate_examples(ex) for split, ex in examples.items()}

    def _generate_examples(self, examples):
        for idx, ex in enumerate(examples):
            yield idx, {"text_a": ex["text_a"], "text_b": ex["text_b"],
                        "label": ex["label"], "idx": idx}
