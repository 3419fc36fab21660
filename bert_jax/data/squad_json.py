"""`squad_json`: a SQuAD v1.1 JSON file as a tfds dataset, split by articles.

    builder = SquadJson(path="../shared/data/squad_v1.1/dev-v1.1.json",
                        splits={"train": "0:38", "validation": "38:"})
    source = load_source(builder, "validation")
    examples = [from_features(source[i]) for i in range(len(source))]  # QAExample

Each split is a range of the file's articles (entries of its `data` list),
written `START:STOP` as a Python slice (`"0:38"`, `"38:"`, `":"` for all);
by default the whole file is one split, `train` when the file's name contains
"train" and `validation` otherwise. The file is read by
`squad_windows.read_squad`, so a file that is not SQuAD v1.1, a missing key, a
repeated question id or an answer that is not at its `answer_start` fails
before anything is written, with a `SquadFormatError` naming the file and the
question.

The features are those of the tfds catalog's `squad/v1.1` (`id`, `title`,
`context`, `question`, `answers: {text, answer_start}`), so `from_features`
reads examples of both; users with network access can load the official
splits with `load_source("squad/v1.1", "train")`.

Config name, e.g. `dev-v1_1_json_a1b2c3d4e5f6`: the file's name and a
fingerprint of its absolute path, size, modification time and the splits; a
file that changes between constructing the builder and building it is an
error (see `builder_configs`).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from bert_jax.data.builder_configs import (
    ConfigRegistry, LocalFilesBuilder, check_split_names, check_unchanged, config_name,
    file_stats)
from bert_jax.data.squad_windows import QAExample, SquadFormatError, read_squad

CATALOG = "squad/v1.1"
_ARTICLES = re.compile(r"\s*(-?\d*)\s*:\s*(-?\d*)\s*")


def parse_articles(spec: str, what: str = "articles") -> slice:
    """`'0:38'` -> `slice(0, 38)`, `'38:'` -> `slice(38, None)`, `':'` -> all."""
    match = _ARTICLES.fullmatch(str(spec))
    if not match:
        raise ValueError(f"{what}={spec!r} is not an article range START:STOP "
                         f"(e.g. '0:38', '38:', ':').")
    start, stop = (int(x) if x else None for x in match.groups())
    return slice(start, stop)


@dataclasses.dataclass(eq=False)
class SquadJsonConfig(tfds.core.BuilderConfig):
    """A SQuAD file, its article splits and its fingerprint; build instances
    with `squad_json_config`."""

    path: str = ""                                # absolute, symlinks resolved
    splits: tuple[tuple[str, str], ...] = ()      # (tfds split name, 'START:STOP')
    files: tuple[tuple[str, int, int], ...] = ()  # (file name, size, mtime in ns)


_CONFIGS: ConfigRegistry[SquadJsonConfig] = ConfigRegistry()


def squad_json_config(path: str | os.PathLike,
                      splits: Mapping[str, str] | None = None) -> SquadJsonConfig:
    """The (validated, fingerprinted, interned) config of a SQuAD file."""
    file = os.path.realpath(os.path.expanduser(os.fspath(path)))
    if not os.path.isfile(file):
        raise FileNotFoundError(f"squad_json: {file} is not a file (path="
                                f"{os.fspath(path)!r}); pass a SQuAD v1.1 JSON file.")
    if splits is None:
        splits = {"train" if "train" in os.path.basename(file) else "validation": ":"}
    check_split_names("squad_json", splits, "article range 'START:STOP'")
    for split, articles in splits.items():
        parse_articles(articles, f"squad_json: split {split!r}")
    directory, name = os.path.split(file)
    params = dict(path=file, splits=tuple(sorted((k, str(v)) for k, v in splits.items())),
                  files=file_stats(directory, [name]))
    config = config_name(file, params, default="squad")
    return _CONFIGS.intern(config, lambda: SquadJsonConfig(
        name=config, description=f"SQuAD v1.1 questions of {file}, splits "
                                 f"{dict(params['splits'])}", **params))


class SquadJson(LocalFilesBuilder):
    """Questions of a SQuAD v1.1 file (see the module docstring), in file order."""

    CONFIGS = _CONFIGS

    def __init__(self, *, path: str | os.PathLike | None = None,
                 splits: Mapping[str, str] | None = None, config=None, **kwargs):
        """The file (`path`, optionally `splits`) or `config`, not both."""
        if config is not None:
            if path is not None or splits is not None:
                raise ValueError("squad_json: pass either config= or path=/splits=, "
                                 "not both.")
        elif path is None:
            raise ValueError("squad_json needs path= (a SQuAD v1.1 JSON file).")
        else:
            config = squad_json_config(path, splits)
        super().__init__(config=config, **kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict({
                "id": tfds.features.Text(),
                "title": tfds.features.Text(),
                "context": tfds.features.Text(),
                "question": tfds.features.Text(),
                "answers": tfds.features.Sequence({
                    "text": tfds.features.Text(),
                    "answer_start": np.int32,
                }),
            }),
            disable_shuffling=True,   # example i is the split's i-th question
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # nothing to download
        cfg: SquadJsonConfig = self.builder_config
        directory = os.path.dirname(cfg.path)
        check_unchanged(directory, cfg.files, cfg.name, "squad_json", SquadFormatError)
        # Read (and check) every split before tfds writes any example.
        examples = {split: read_squad(cfg.path, parse_articles(articles))
                    for split, articles in cfg.splits}
        empty = [f"{split} ({dict(cfg.splits)[split]})"
                 for split, found in examples.items() if not found]
        if empty:  # tfds cannot write a split with no examples
            raise SquadFormatError(f"squad_json: {cfg.path}: split(s) {empty} have no "
                                   f"questions; check the article ranges.")
        return {split: self._generate_examples(found) for split, found in examples.items()}

    def _generate_examples(self, examples):
        for i, example in enumerate(examples):
            yield i, {"id": example.id, "title": example.title, "context": example.context,
                      "question": example.question,
                      "answers": {"text": list(example.answers),
                                  "answer_start": list(example.answer_starts)}}


def _text(value: Any) -> str:
    value = value.item() if isinstance(value, np.ndarray) else value
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def from_features(example: Mapping[str, Any]) -> QAExample:
    """A `QAExample` from an example of `squad_json` or of the catalog's `squad`."""
    answers = example["answers"]
    return QAExample(
        id=_text(example["id"]), question=_text(example["question"]),
        context=_text(example["context"]), title=_text(example["title"]),
        answers=tuple(_text(t) for t in answers["text"]),
        answer_starts=tuple(int(s) for s in answers["answer_start"]))
