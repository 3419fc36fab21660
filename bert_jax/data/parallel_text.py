"""`parallel_text`: a tfds builder for local, line-aligned parallel text files.

A corpus is a directory of UTF-8 files `{stem}.{language}`, line `i` of
`{stem}.{src}` the translation of line `i` of `{stem}.{tgt}` (Multi30k:
`train.de`/`train.en`, `val.de`/`val.en`, ...). Each split becomes
`{"source": str, "target": str}` examples, in file order, lines stripped:

    train = load_source("parallel_text", "train", data_dir, path="../shared/data/multi30k",
                        source_language="de", target_language="en")

`splits` (split name -> file stem) names the splits; by default every stem
with both files, conventional stems taking tfds's names (`STEM_ALIASES`).
An empty line is an error unless `skip_empty` (the pairs dropped are in
`builder.info.metadata["skipped_empty_pairs"]`). Lines end at `\\n` only, so
U+2028 and the like cannot shift the alignment. The config name ends in a
hash of the resolved path, the parameters and each file's size and mtime: an
edited corpus is built afresh in its own folder, and a file changed between
construction and build is an error. (Reopen a build without its corpus with
`tfds.builder_from_directory`.) Every split is checked before any is written.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import itertools
import os
import re
from collections.abc import Iterator, Mapping

import tensorflow_datasets as tfds
from absl import logging

from bert_jax.data.builder_configs import LocalFilesBuilder
from bert_jax.data.splits import check_split_files
from bert_jax.data.text_files import utf8_lines
from bert_jax.errors import DataError, MissingFileError, where

# Conventional file stems and the standard tfds split names they get by default.
STEM_ALIASES: dict[str, str] = {
    "val": "validation", "valid": "validation", "dev": "validation",
    "test_2016_flickr": "test",
}
_LANGUAGE_RE = re.compile(r"^[A-Za-z0-9_\-]+$")
_MAX_REPORTED_LINES = 10


@dataclasses.dataclass(eq=False)
class ParallelTextConfig(tfds.core.BuilderConfig):
    """A corpus and its fingerprint; build instances with `parallel_text_config`."""

    path: str = ""                 # absolute, symlinks resolved
    source_language: str = ""
    target_language: str = ""
    splits: tuple[tuple[str, str], ...] = ()   # (tfds split name, file stem)
    skip_empty: bool = False
    # (file name, size in bytes, mtime in ns) of every file read.
    files: tuple[tuple[str, int, int], ...] = ()

    def split_files(self, split: str) -> tuple[str, str]:
        """The source and target file of `split`."""
        stem = dict(self.splits)[split]
        return (os.path.join(self.path, f"{stem}.{self.source_language}"),
                os.path.join(self.path, f"{stem}.{self.target_language}"))


def parallel_text_config(path: str | os.PathLike, source_language: str,
                         target_language: str,
                         splits: Mapping[str, str] | None = None,
                         skip_empty: bool = False) -> ParallelTextConfig:
    """The (validated, fingerprinted, interned) config of a corpus directory;
    the files' contents are checked when the dataset is built. A parameter
    that cannot name its files raises a `DataError` naming the directory."""
    directory = os.path.realpath(os.path.expanduser(os.fspath(path)))
    for field, value in (("source_language", source_language),
                         ("target_language", target_language)):
        if not isinstance(value, str) or not _LANGUAGE_RE.match(value):
            raise DataError(directory, f"parallel_text: {field}={value!r}", "give a file "
                            "suffix such as 'de' (letters, digits, '_', '-')")
    if source_language == target_language:
        raise DataError(directory, "parallel_text: source_language and target_language "
                        f"are both {source_language!r}", "give two languages")
    if not isinstance(skip_empty, bool):
        raise DataError(directory, f"parallel_text: skip_empty={skip_empty!r}", "give a bool")
    if not os.path.exists(directory):
        raise MissingFileError(f"{directory}: no such corpus directory; check the path")
    if not os.path.isdir(directory):
        raise NotADirectoryError(f"{directory}: a file; pass the directory holding the "
                                 f"{{stem}}.{source_language} files")
    if splits is None:
        mapping = discover_splits(directory, source_language, target_language)
    else:
        mapping = check_split_files("parallel_text", directory, splits, [
            f".{source_language}", f".{target_language}"])
    files = _file_stats(directory, [f"{stem}.{language}" for _, stem in mapping
                                    for language in (source_language, target_language)])
    params = dict(path=directory, source_language=source_language,
                  target_language=target_language, splits=mapping,
                  skip_empty=skip_empty, files=files)
    digest = hashlib.sha256(repr(sorted(params.items())).encode()).hexdigest()[:12]
    folder = re.sub(r"[^\w\-]+", "_", os.path.basename(directory))[:40] or "corpus"
    name = f"{folder}_{source_language}-{target_language}_{digest}"
    return ParallelText.intern(name, lambda: ParallelTextConfig(
        name=name, description=(
            f"{source_language}->{target_language} parallel text from "
            f"{directory}, splits {dict(mapping)}"), **params))


def _file_stats(directory: str, names: list[str]) -> tuple[tuple[str, int, int], ...]:
    """(name, size, mtime_ns) of each file, for a config's fingerprint."""
    stats = [os.stat(os.path.join(directory, name)) for name in names]
    return tuple((name, st.st_size, st.st_mtime_ns) for name, st in zip(names, stats))


def discover_splits(directory: str, source_language: str, target_language: str
                    ) -> tuple[tuple[str, str], ...]:
    """(split name, stem) of every stem with files in both languages."""
    names = sorted(n for n in os.listdir(directory) if not n.startswith(".")
                   and os.path.isfile(os.path.join(directory, n)))
    by_language: dict[str, set[str]] = {}
    for n in names:
        stem, dot, suffix = n.rpartition(".")
        if dot and stem:
            by_language.setdefault(suffix, set()).add(stem)
    stems = sorted(by_language.get(source_language, set())
                   & by_language.get(target_language, set()))
    if not stems:
        present = ", ".join(f"{s} ({len(v)} file{'s' * (len(v) != 1)})"
                            for s, v in sorted(by_language.items())) or "none"
        raise DataError(directory, f"no {{stem}}.{source_language} with a "
                        f"{{stem}}.{target_language}", f"the suffixes there: {present}")
    split_names = {stem: re.sub(r"[^\w\-]", "_", stem) for stem in stems}
    taken = set(split_names.values())
    claims = collections.Counter(STEM_ALIASES.get(stem) for stem in stems)
    for stem in stems:
        alias = STEM_ALIASES.get(stem)
        if alias is not None and alias not in taken and claims[alias] == 1:
            split_names[stem] = alias
    seen: dict[str, str] = {}
    for stem, split in split_names.items():
        if split in seen:
            raise DataError(directory, f"stems {seen[split]!r} and {stem!r} would both be "
                            f"split {split!r}", "pass splits={name: stem}")
        seen[split] = stem
    return tuple(sorted((split, stem) for stem, split in split_names.items()))


def read_lines(path: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, stripped text) of every line of a UTF-8 file."""
    for _, lineno, text in utf8_lines(path):
        yield lineno, text.strip()


def check_split(cfg: ParallelTextConfig, split: str) -> tuple[int, list[int]]:
    """The number of pairs kept and the 1-based lines of those dropped by
    `skip_empty`, from one read of both files; raises a `DataError` on
    invalid UTF-8, different line counts, or an empty line (unless `skip_empty`)."""
    src_path, tgt_path = cfg.split_files(split)
    counts = [0, 0]
    first_empty: list[int | None] = [None, None]
    skipped: list[int] = []
    pairs = itertools.zip_longest(read_lines(src_path), read_lines(tgt_path))
    for src, tgt in pairs:
        empty = False
        for side, item in enumerate((src, tgt)):
            if item is None:
                continue
            counts[side] = item[0]
            if not item[1]:
                empty = True
                if first_empty[side] is None:
                    first_empty[side] = item[0]
        if empty and src is not None and tgt is not None:
            skipped.append(src[0])
    paths = (src_path, tgt_path)
    if counts[0] != counts[1]:
        hint = "; ".join(f"first empty line: {where(paths[s], first_empty[s])}"
                         for s in (0, 1) if first_empty[s] is not None)
        raise DataError(src_path, f"{counts[0]} lines, {tgt_path} {counts[1]}",
                        "line i of one must translate line i of the other"
                        + (f" ({hint})" if hint else ""))
    if skipped and not cfg.skip_empty:
        side = 0 if first_empty[0] == skipped[0] else 1
        raise DataError(paths[side], f"empty line ({len(skipped)} pair(s) with an empty "
                        "side)", "remove the pair from both files, or pass skip_empty=True "
                        "to drop such pairs", line=skipped[0])
    return counts[0] - len(skipped), skipped


class ParallelText(LocalFilesBuilder):
    """Line-aligned `{stem}.{src}` / `{stem}.{tgt}` files (see module docstring)."""

    def __init__(self, *, path: str | os.PathLike | None = None,
                 source_language: str | None = None,
                 target_language: str | None = None,
                 splits: Mapping[str, str] | None = None,
                 skip_empty: bool = False, config=None, **kwargs):
        """The corpus (`path`, the two languages, ...) or `config`, not both."""
        corpus = (path, source_language, target_language)
        given = corpus != (None, None, None) or splits is not None or skip_empty
        if config is None and None in corpus or config is not None and given:
            raise ValueError("parallel_text: give either config= or path=, "
                             "source_language= and target_language=")
        if config is None:
            config = parallel_text_config(*corpus, splits=splits, skip_empty=skip_empty)
        super().__init__(config=config, **kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict({
                "source": tfds.features.Text(), "target": tfds.features.Text()}),
            supervised_keys=("source", "target"),
            metadata=tfds.core.MetadataDict(),
            disable_shuffling=True,   # source[i] is the i-th kept line pair
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # nothing to download
        cfg: ParallelTextConfig = self.builder_config
        for name, size, mtime_ns in cfg.files:
            path = os.path.join(cfg.path, name)
            if not os.path.isfile(path) or _file_stats(cfg.path, [name])[0] != (
                    name, size, mtime_ns):
                raise DataError(path, "changed or removed after the builder was made",
                                "make the builder again")
        # Check every split before tfds writes any example.
        checks = {split: check_split(cfg, split) for split, _ in cfg.splits}
        skipped = {split: {"count": len(lines), "first_lines": lines[:_MAX_REPORTED_LINES]}
                   for split, (_, lines) in checks.items() if lines}
        for split, dropped in skipped.items():
            logging.warning("parallel_text %s: skip_empty dropped %d pair(s) of split %r with "
                            "an empty side (first lines %s of %s)", cfg.name, dropped["count"],
                            split, dropped["first_lines"], " / ".join(cfg.split_files(split)))
        self.info.metadata["skipped_empty_pairs"] = skipped
        # tfds cannot write a split with no examples, so an empty one is an error.
        empty = [split for split, (pairs, _) in checks.items() if pairs == 0]
        if empty:
            raise DataError(", ".join(cfg.split_files(empty[0])), f"no sentence pairs "
                            f"(split(s) {empty})", "add some or drop the split")
        return {split: self._generate_examples(split) for split in checks}

    def _generate_examples(self, split: str):
        src_path, tgt_path = self.builder_config.split_files(split)
        for (lineno, src), (_, tgt) in zip(read_lines(src_path), read_lines(tgt_path)):
            if src and tgt:   # an empty side only with skip_empty (checked)
                yield lineno, {"source": src, "target": tgt}
