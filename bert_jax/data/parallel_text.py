"""`parallel_text`: a tfds builder for local, line-aligned parallel text files.

A corpus is a directory of plain UTF-8 files `{stem}.{language}`, one sentence
a line, line `i` of `{stem}.{src}` the translation of line `i` of
`{stem}.{tgt}` (Multi30k: `train.de`/`train.en`, `val.de`/`val.en`,
`test_2016_flickr.de`/`test_2016_flickr.en`). Each split becomes
`{"source": str, "target": str}` examples (tokenize later, e.g. SentencePiece):

    builder = ParallelText(path="../shared/data/multi30k", source_language="de",
                           target_language="en", data_dir=data_dir)
    train = load_source(builder, "train")         # train[i]["source"], ...
    # or by name, the parameters passed through load_source:
    val = load_source("parallel_text", "validation", data_dir,
                      path="../shared/data/multi30k",
                      source_language="de", target_language="en")

Parameters (`ParallelText(...)`, `parallel_text_config(...)`):
  path: the corpus directory. It is read in place, never copied or written.
  source_language, target_language: the file suffixes (`de`, `en`).
  splits: tfds split name -> file stem, e.g. `{"train": "train", "test":
    "newstest2014"}`; exactly these splits are built. By default (`None`)
    every stem with both `{stem}.{src}` and `{stem}.{tgt}` is a split named
    after the stem, except that the conventional stems get tfds's standard
    names (`STEM_ALIASES`: `val`/`valid`/`dev` -> `validation`,
    `test_2016_flickr` -> `test`), when no other stem claims that name.
    Characters other than letters, digits, `_` and `-` become `_`.
  skip_empty: an empty line (after stripping whitespace) on either side is an
    error by default; `True` drops such pairs instead, logs how many, and
    records them in `builder.info.metadata["skipped_empty_pairs"]`
    (`{split: {"count": n, "first_lines": [...]}}`, 1-based line numbers).

Examples keep the files' order: `source[i]` is the i-th line pair (of those
kept); shuffle in the input pipeline. Each line is stripped of surrounding
whitespace (and a byte-order mark at the start of a file). Lines are split at
`\\n` only (a `\\r\\n` ending is fine; U+2028 and other Unicode line breaks
inside a line are kept as text, so they cannot shift the alignment).

Config name, e.g. `multi30k_de-en_3f9a0c1b2d4e`: the directory's name, the
language pair, and a 12-hex-digit SHA-256 of the absolute (symlink-resolved)
path, the pair, the split mapping, `skip_empty` and each file's name, size and
modification time (ns). tfds keeps each config in its own folder, so an edited
corpus (other size or mtime) is built afresh, never silently read from an old
build; a file that changes between constructing the builder and building it
is an error. Old builds stay on disk until removed. (A file rewritten with the
same size and the same mtime, to the nanosecond, would not be noticed.)

Errors, each naming the file (and the 1-based line where there is one):
  at construction: the directory or a split's file is missing
    (`FileNotFoundError`); no file pair for the language pair (lists the
    language suffixes that are present) or a bad parameter
    (`ParallelTextError`, a `ValueError`);
  at build time, before any example is written: invalid UTF-8, the two sides
    having different numbers of lines (both files, both counts), an empty line
    (without `skip_empty`) (`ParallelTextError`).

A built dataset can be reopened without the corpus (the config name is a
hash and cannot be resolved back to a path): `tfds.builder_from_directory(
builder.data_path)`, or in the same process `ParallelText(config=name)`.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
from collections.abc import Iterator, Mapping

import tensorflow_datasets as tfds
from absl import logging

from bert_jax.data.builder_configs import (
    ConfigRegistry, LocalFilesBuilder, check_unchanged, config_name, file_stats)
from bert_jax.data.splits import check_split_names
from bert_jax.data.text_files import utf8_lines
from bert_jax.errors import MissingFileError, UserError

# Conventional file stems and the standard tfds split names they get by default.
STEM_ALIASES: dict[str, str] = {
    "val": "validation", "valid": "validation", "dev": "validation",
    "test_2016_flickr": "test",
}
_LANGUAGE_RE = re.compile(r"^[A-Za-z0-9_\-]+$")
_MAX_REPORTED_LINES = 10


class ParallelTextError(UserError, ValueError):
    """A corpus that cannot be built as it is (the message says where and how)."""


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


_CONFIGS: ConfigRegistry[ParallelTextConfig] = ConfigRegistry()


def parallel_text_config(path: str | os.PathLike, source_language: str,
                         target_language: str,
                         splits: Mapping[str, str] | None = None,
                         skip_empty: bool = False) -> ParallelTextConfig:
    """The (validated, fingerprinted, interned) config of a corpus directory.

    Checks the directory, the language pair and that every split's two files
    exist; the files' contents are checked when the dataset is built.
    """
    for field, value in (("source_language", source_language),
                         ("target_language", target_language)):
        if not isinstance(value, str) or not _LANGUAGE_RE.match(value):
            raise ParallelTextError(
                f"parallel_text: {field} must be a file suffix such as 'de' "
                f"(letters, digits, '_', '-'), got {value!r}")
    if source_language == target_language:
        raise ParallelTextError(
            f"parallel_text: source_language and target_language are both "
            f"{source_language!r}")
    if not isinstance(skip_empty, bool):
        raise ParallelTextError(f"parallel_text: skip_empty must be a bool, got "
                                f"{skip_empty!r}")
    directory = os.path.realpath(os.path.expanduser(os.fspath(path)))
    if not os.path.exists(directory):
        raise MissingFileError(f"parallel_text: corpus directory {directory} does "
                               f"not exist (path={os.fspath(path)!r})")
    if not os.path.isdir(directory):
        raise NotADirectoryError(
            f"parallel_text: path {directory} is a file; pass the directory that "
            f"holds the {{split}}.{source_language} / {{split}}.{target_language} files")
    if splits is None:
        mapping = discover_splits(directory, source_language, target_language)
    else:
        mapping = _check_splits(directory, source_language, target_language, splits)
    files = file_stats(directory, [f"{stem}.{language}" for _, stem in mapping
                                   for language in (source_language, target_language)])
    params = dict(path=directory, source_language=source_language,
                  target_language=target_language, splits=mapping,
                  skip_empty=skip_empty, files=files)
    name = config_name(directory, params, f"{source_language}-{target_language}",
                       default="corpus")
    return _CONFIGS.intern(name, lambda: ParallelTextConfig(
        name=name, description=(
            f"{source_language}->{target_language} parallel text from "
            f"{directory}, splits {dict(mapping)}"), **params))


def discover_splits(directory: str, source_language: str, target_language: str
                    ) -> tuple[tuple[str, str], ...]:
    """(split name, stem) of every stem with files in both languages; see the
    module docstring for the names."""
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
        raise ParallelTextError(
            f"parallel_text: {directory} has no file pair for the language pair "
            f"{source_language}-{target_language} (no stem with both "
            f"{{stem}}.{source_language} and {{stem}}.{target_language}). Language "
            f"suffixes present: {present}.")
    split_names = {stem: re.sub(r"[^\w\-]", "_", stem) for stem in stems}
    taken = set(split_names.values())
    claims: dict[str, list[str]] = {}
    for stem in stems:
        if stem in STEM_ALIASES and STEM_ALIASES[stem] not in taken:
            claims.setdefault(STEM_ALIASES[stem], []).append(stem)
    for alias, claimants in claims.items():
        if len(claimants) == 1:
            split_names[claimants[0]] = alias
    seen: dict[str, str] = {}
    for stem, split in split_names.items():
        if split in seen:
            raise ParallelTextError(
                f"parallel_text: in {directory}, stems {seen[split]!r} and {stem!r} "
                f"would both be split {split!r}; pass splits={{name: stem}}.")
        seen[split] = stem
    return tuple(sorted((split, stem) for stem, split in split_names.items()))


def _check_splits(directory: str, source_language: str, target_language: str,
                  splits: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    check_split_names("parallel_text", splits, "file stem, e.g. {'train': 'train', "
                      "'validation': 'val'}", ParallelTextError)
    for split, stem in splits.items():
        if not isinstance(stem, str) or not stem or os.sep in stem:
            raise ParallelTextError(
                f"parallel_text: the file stem of split {split!r} must be a file "
                f"name without its language suffix, got {stem!r}")
    missing = [os.path.join(directory, f"{stem}.{language}")
               for stem in splits.values()
               for language in (source_language, target_language)
               if not os.path.isfile(os.path.join(directory, f"{stem}.{language}"))]
    if missing:
        raise MissingFileError(
            f"parallel_text: missing file{'s' * (len(missing) > 1)}: "
            f"{', '.join(missing)} (splits={dict(splits)})")
    return tuple(sorted(splits.items()))


# ----------------------------------------------------------------- reading --


def read_lines(path: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, stripped text) of every line of a UTF-8 file."""
    for lineno, text in utf8_lines(path, ParallelTextError, "parallel_text: "):
        yield lineno, text.strip()


@dataclasses.dataclass(frozen=True)
class SplitCheck:
    """What `check_split` found: the pairs kept and the empty lines dropped."""

    num_pairs: int
    skipped_lines: tuple[int, ...]   # 1-based, pairs dropped by skip_empty


def check_split(cfg: ParallelTextConfig, split: str) -> SplitCheck:
    """Reads both files of `split` once; raises `ParallelTextError` on invalid
    UTF-8, different line counts, or an empty line (unless `skip_empty`)."""
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
        hint = "; ".join(f"first empty line: {paths[s]}:{first_empty[s]}"
                         for s in (0, 1) if first_empty[s] is not None)
        raise ParallelTextError(
            f"parallel_text: split {split!r} is misaligned: {src_path} has "
            f"{counts[0]} lines but {tgt_path} has {counts[1]}; line i of one must "
            f"be the translation of line i of the other"
            + (f" ({hint})." if hint else "."))
    if skipped and not cfg.skip_empty:
        side = 0 if first_empty[0] == skipped[0] else 1
        raise ParallelTextError(
            f"parallel_text: {paths[side]}:{skipped[0]}: empty line ({len(skipped)} "
            f"pair{'s' * (len(skipped) > 1)} of split {split!r} with an empty side). "
            f"Remove line {skipped[0]} from both {src_path} and {tgt_path}, or pass "
            f"skip_empty=True to drop such pairs.")
    return SplitCheck(counts[0] - len(skipped), tuple(skipped))


# ----------------------------------------------------------------- builder --


class ParallelText(LocalFilesBuilder):
    """Line-aligned `{stem}.{src}` / `{stem}.{tgt}` files (see module docstring)."""

    CONFIGS = _CONFIGS

    def __init__(self, *, path: str | os.PathLike | None = None,
                 source_language: str | None = None,
                 target_language: str | None = None,
                 splits: Mapping[str, str] | None = None,
                 skip_empty: bool = False, config=None, **kwargs):
        """The corpus (`path`, the two languages, ...) or `config`, not both."""
        corpus = (path, source_language, target_language)
        if config is None:
            if None in corpus:
                raise ValueError("parallel_text needs path=, source_language= and "
                                 "target_language= (or config=).")
            config = parallel_text_config(*corpus, splits=splits, skip_empty=skip_empty)
        elif corpus != (None, None, None) or splits is not None or skip_empty:
            raise ValueError("parallel_text: pass either config= or the corpus "
                             "parameters (path=, ...), not both.")
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
        check_unchanged(cfg.path, cfg.files, cfg.name, "parallel_text", ParallelTextError)
        # Check every split before tfds writes any example.
        checks = {split: check_split(cfg, split) for split, _ in cfg.splits}
        skipped = {}
        for split, check in checks.items():
            if check.skipped_lines:
                skipped[split] = {
                    "count": len(check.skipped_lines),
                    "first_lines": list(check.skipped_lines[:_MAX_REPORTED_LINES])}
                logging.warning(
                    "parallel_text %s: skip_empty dropped %d pair(s) of split %r with "
                    "an empty side (lines %s%s of %s)", cfg.name,
                    len(check.skipped_lines), split,
                    ", ".join(map(str, check.skipped_lines[:_MAX_REPORTED_LINES])),
                    ", ..." if len(check.skipped_lines) > _MAX_REPORTED_LINES else "",
                    " / ".join(cfg.split_files(split)))
        self.info.metadata["skipped_empty_pairs"] = skipped
        # tfds cannot write a split with no examples, so an empty one is an error.
        empty = [split for split, check in checks.items() if check.num_pairs == 0]
        if empty:
            raise ParallelTextError(
                f"parallel_text: split(s) {empty} of {cfg.path} have no sentence "
                f"pairs ({', '.join(cfg.split_files(empty[0]))}).")
        return {split: self._generate_examples(split) for split in checks}

    def _generate_examples(self, split: str):
        src_path, tgt_path = self.builder_config.split_files(split)
        for (lineno, src), (_, tgt) in zip(read_lines(src_path), read_lines(tgt_path)):
            if src and tgt:   # an empty side only with skip_empty (checked)
                yield lineno, {"source": src, "target": tgt}
