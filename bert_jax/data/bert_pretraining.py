"""`bert_pretraining`: a tfds builder of BERT pretraining examples from raw text.

The examples of google-research/bert `create_pretraining_data.py`, built once
per corpus and vocabulary by an Apache Beam pipeline (the algorithm is
`bert_jax.data.pretraining_data`), e.g. `load_source(BertPretraining(files=[
"docs.txt", "wiki.valid.raw:wikitext"], vocab_file="vocab.txt", ...), "train")`.

Each example: `tokens` `[n <= max_seq_length]` int32 (`[CLS] A [SEP] B
[SEP]`, unmasked; `[CLS] text [SEP]` with `next_sentence_prediction=False`),
`segment_ids` `[n]` int32, `next_sentence_label` (1: B is from another
document; always 0 without pairs) and `index` (a 63-bit hash of the instance's file,
shard and place: the key of static masking). Masking is the input pipeline's
(`Masker`), from (seed, step) or, static, from (seed, index).

The unit of work is a shard, `documents_per_shard` consecutive documents of
one file, as the original was run per input shard. (1) Each file is read
once, streaming, for its shards' byte offsets and its document count. (2) A
worker reads one shard from its offset, tokenizes it and cuts it into
instances (a random B from the same shard; the random choices seeded by
(seed, file name, shard)), so its memory is bounded by a shard. (3) It writes
them, shuffled within the shard, to an `array_record` file of its own; only
statistics leave it. The files become the split's tfds shards in corpus
order; the input pipeline shuffles the whole split by random access. The
same corpus, vocabulary and options give the same dataset on any runner.

`validation`: the instances of the `eval_documents` documents of smallest
SHA-256 of (seed, file name, position) (one pass, no corpus in memory),
paired among themselves with seed + 1, so none is seen in training.

`beam_options` are Beam's flags (any `--runner`: docs/PRETRAINING_DATA.md).
Files are `path` or `path:format` (`config_schema.DOCUMENT_FORMATS`); a
path ending in `.gz` is read as a gzip stream (`text_files.utf8_lines`) and
gives the instances of the same text uncompressed (`file_key`).
Empty files and shards left with fewer than 2 documents are skipped and
recorded, with the other statistics, in `builder.info.metadata["corpus"]`.
The config name ends in a hash of the parameters, the vocabulary and each
file's name, size and mtime, so a changed corpus is built afresh.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import itertools
import json
import os
import re
import shlex
from collections.abc import Sequence

import numpy as np
import tensorflow_datasets as tfds
from absl import logging
from etils import epath

from bert_jax import noise
from bert_jax.config_schema import corpus_file, pretraining_data_problems
from bert_jax.data import pretraining_data
from bert_jax.data.builder_configs import LocalFilesBuilder
from bert_jax.data.wordpiece import WordPiece
from bert_jax.errors import DataError, MissingFileError

with noise.importing_beam():
    import apache_beam as beam

_EVAL_SEED_OFFSET = 1  # the validation instances use seed + 1
SUMMARY = "summary.json"  # the build's summed statistics, beside its parts


@dataclasses.dataclass(eq=False)
class BertPretrainingConfig(tfds.core.BuilderConfig):
    """A corpus, a vocabulary and the instance parameters; see `pretraining_config`."""

    files: tuple[tuple[str, str], ...] = ()        # (absolute path, format)
    vocab_file: str = ""
    lowercase: bool = True
    max_seq_length: int = 128
    short_seq_prob: float = 0.1
    dupe_factor: int = 5
    eval_documents: int = 0
    seed: int = 12345
    documents_per_shard: int = 10_000
    next_sentence_prediction: bool = True   # False: single segments, no random next
    document_sample: float = 1.0   # the fraction of training documents cut into instances


def parse_file_spec(spec: str) -> tuple[str, str]:
    """`'path'` or `'path:format'` -> (absolute path, format); a format that is
    not a `DOCUMENT_FORMATS` (`config_schema`'s rule of `config.data.corpus_files`,
    checked before the build) raises a ValueError."""
    path, fmt = corpus_file(spec)
    if problems := pretraining_data_problems({"corpus_files": [spec]}, "bert_pretraining: "):
        raise ValueError(problems[0])
    path = os.path.realpath(os.path.expanduser(path))
    if not os.path.isfile(path):
        raise MissingFileError(f"{path}: no such corpus file (from {spec!r}); check the path")
    return path, fmt


def pretraining_config(files: Sequence[str], vocab_file: str, *, lowercase: bool = True,
                       max_seq_length: int = 128, short_seq_prob: float = 0.1,
                       dupe_factor: int = 5, eval_documents: int = 0,
                       seed: int = 12345, documents_per_shard: int = 10_000,
                       next_sentence_prediction: bool = True,
                       document_sample: float = 1.0) -> BertPretrainingConfig:
    """The validated, fingerprinted, interned config (see module docstring).
    The options follow `config_schema.PRETRAINING_DATA`, whose rule refuses a
    config's before anything is built; a caller's that break it raise a
    ValueError (so does an empty `files`: a config's is refused by the task)."""
    if isinstance(files, str) or not files:
        raise ValueError(f"bert_pretraining: files={files!r}; give a non-empty list of "
                         "'path' or 'path:format'")
    parsed = tuple(parse_file_spec(spec) for spec in files)
    if not os.path.isfile(vocab_file):
        raise MissingFileError(f"{vocab_file}: no such vocab_file; check the path")
    options = dict(max_seq_length=max_seq_length, short_seq_prob=short_seq_prob,
                   dupe_factor=dupe_factor, eval_documents=eval_documents,
                   documents_per_shard=documents_per_shard, document_sample=document_sample)
    if problems := pretraining_data_problems(options, "bert_pretraining: "):
        raise ValueError(problems[0])
    fingerprint = {
        "files": [(os.path.basename(p), fmt, os.stat(p).st_size, os.stat(p).st_mtime_ns)
                  for p, fmt in parsed],
        "paths": [p for p, _ in parsed],
        "vocab": hashlib.sha256(epath.Path(vocab_file).read_bytes()).hexdigest(),
        "lowercase": bool(lowercase), "max_seq_length": max_seq_length,
        "short_seq_prob": short_seq_prob, "dupe_factor": dupe_factor,
        "eval_documents": eval_documents, "seed": seed,
        "documents_per_shard": documents_per_shard,
        "version": str(BertPretraining.VERSION)}
    if not next_sentence_prediction:   # only then: the names of pair datasets stay as built
        fingerprint["next_sentence_prediction"] = False
    if document_sample != 1:           # likewise
        fingerprint["document_sample"] = document_sample
    digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()
    stem = re.sub(r"[^A-Za-z0-9]+", "_", os.path.basename(parsed[0][0]).split(".")[0])
    name = f"{stem.strip('_').lower() or 'corpus'}_{digest[:12]}"
    return BertPretraining.intern(name, lambda: BertPretrainingConfig(
        name=name, description=f"BERT pretraining examples of {len(parsed)} file(s)",
        files=parsed, vocab_file=os.path.realpath(vocab_file),
        lowercase=bool(lowercase), max_seq_length=max_seq_length,
        short_seq_prob=short_seq_prob, dupe_factor=dupe_factor,
        eval_documents=eval_documents, seed=seed, documents_per_shard=documents_per_shard,
        next_sentence_prediction=bool(next_sentence_prediction),
        document_sample=float(document_sample)))


def file_key(path: str) -> str:
    """The name of a corpus file in the keys of its random choices: its base
    name without `.gz`, so a compressed file gives the same instances."""
    return os.path.basename(path).removesuffix(".gz")


def _derived_int(*parts) -> int:
    """A non-negative 63-bit integer of `parts` (SHA-256 of their repr): the
    same in every process, on every machine."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "big") >> 1


def in_sample(fraction: float, seed: int, purpose: str, path: str, position: int) -> bool:
    """Whether the document at `position` of the corpus file `path` is in the
    `fraction` of documents sampled for `purpose`: its hash of (seed, purpose,
    file, position) decides, so a sample is spread evenly over the corpus and
    the same on every machine."""
    return fraction == 1 or _derived_int(seed, purpose, file_key(path), position) < (
        fraction * 2 ** 63)


def corpus_lines(files: Sequence[str], sample: float = 1.0, seed: int = 0):
    """The lines of the corpus `files` ('path' or 'path:format'), streamed, for
    training a vocabulary: with `sample` < 1, only the documents `in_sample`
    (each file is still read whole: the sample saves the trainer's time, not
    the reading). `sample` is not checked: `config_schema` refuses a config's
    `data.vocab_sample` outside (0, 1] before anything is read."""
    for spec in files:
        path, fmt = parse_file_spec(spec)
        for position, document in enumerate(pretraining_data.iter_documents(path, fmt)):
            if in_sample(sample, seed, "vocab", path, position):
                yield from document.lines


@dataclasses.dataclass(frozen=True)
class Shard:
    """The unit of parallelism: `num_documents` consecutive documents of the
    corpus file `file_index`, the first at position `first_document` of the
    file, starting at `start` (byte offset, line) so a worker reads just them."""
    file_index: int
    index: int
    start: tuple[int, int]
    first_document: int
    num_documents: int


def scan_file(indexed_file: tuple[int, tuple[str, str]], cfg: BertPretrainingConfig):
    """Pass 1 over one file, streaming: its `Shard`s (tagged "shards"), each
    document's held-out key (tagged "candidates") and its statistics."""
    file_index, (path, fmt) = indexed_file
    name, per_shard = file_key(path), cfg.documents_per_shard
    starts, stats = [], {"documents": 0, "lines": 0, "one_line_documents": 0}
    for position, document in enumerate(pretraining_data.iter_documents(path, fmt)):
        if position % per_shard == 0:
            starts.append(document.start)
        if cfg.eval_documents:
            yield beam.pvalue.TaggedOutput(
                "candidates", (_derived_int(cfg.seed, name, position), file_index, position))
        stats["documents"] += 1
        stats["lines"] += len(document.lines)
        stats["one_line_documents"] += len(document.lines) < 2
    sizes = [min(per_shard, stats["documents"] - i * per_shard) for i in range(len(starts))]
    if len(sizes) > 1 and sizes[-1] < 2:  # a last shard of one document joins the one before
        leftover = sizes.pop()
        sizes[-1] += leftover
    for index, size in enumerate(sizes):
        yield beam.pvalue.TaggedOutput(
            "shards", Shard(file_index, index, starts[index], index * per_shard, size))
    if not starts:
        logging.warning("bert_pretraining: %s has no text; skipped.", path)
    yield {**stats, "empty_files": [] if starts else [path]}


def held_out_documents(smallest: list[tuple[int, int, int]], documents: int,
                       cfg: BertPretrainingConfig) -> list[tuple[int, int]]:
    """(file_index, position) of the `eval_documents` documents of smallest
    hash; raises when too few documents are left for training."""
    needed = 2 if cfg.next_sentence_prediction else 1
    if documents - len(smallest) < needed:
        raise DataError(", ".join(path for path, _ in cfg.files), (
            f"eval_documents={cfg.eval_documents} leaves {documents - len(smallest)} of "
            f"{documents} documents for training"),
            "lower it" + (" (next-sentence pairs need 2)" if needed == 2 else ""))
    return [(file_index, position) for _, file_index, position in smallest]


@functools.lru_cache(maxsize=4)
def _vocabulary(vocab_file: str, lowercase: bool) -> WordPiece:
    return WordPiece.from_vocab_file(vocab_file, lowercase=lowercase)


def _create_instances(documents, cfg: BertPretrainingConfig, *, dupe_factor: int, seed: int):
    vocab = _vocabulary(cfg.vocab_file, cfg.lowercase)
    return pretraining_data.create_instances(
        documents, max_seq_length=cfg.max_seq_length, short_seq_prob=cfg.short_seq_prob,
        dupe_factor=dupe_factor, seed=seed, cls_id=vocab.cls_id, sep_id=vocab.sep_id,
        next_sentence=cfg.next_sentence_prediction)


def _features() -> tfds.features.FeaturesDict:
    ids = tfds.features.Tensor(shape=(None,), dtype=np.int32)
    return tfds.features.FeaturesDict({
        "tokens": ids, "segment_ids": ids,
        "next_sentence_label": tfds.features.Scalar(dtype=np.int64),
        "index": tfds.features.Scalar(dtype=np.int64)})


def _part_file(split: str, name: str) -> str:
    """`train-000000-000003.array_record` for part `0/3` of `train`."""
    return "-".join([split, *(f"{int(x):06d}" if x.isdigit() else x
                              for x in name.split("/"))]) + ".array_record"


def write_part(parts_dir: str, split: str, name: str, instances) -> dict:
    """Writes `instances` as the part `name` of `split` (as tfds reads them;
    none: no file) and returns its statistics; `index` hashes `{name}/{i}`."""
    if not instances:
        return {}
    features = _features()
    serializer = tfds.core.ExampleSerializer(features.get_serialized_info())
    examples = ((f"{name}/{i}", serializer.serialize_example(features.encode_example({
        "tokens": np.asarray(x.tokens, np.int32),
        "segment_ids": np.asarray(x.segment_ids, np.int32),
        "next_sentence_label": int(x.is_random_next),
        "index": _derived_int(f"{name}/{i}")}))) for i, x in enumerate(instances))
    path = os.path.join(parts_dir, _part_file(split, name))
    tfds.core.ExampleWriter(tfds.core.FileFormat.ARRAY_RECORD).write(path, examples)
    return {f"{split}_instances": len(instances),
            f"{split}_random_next": sum(x.is_random_next for x in instances),
            "parts": [(split, name, len(instances), os.path.getsize(path))]}


def build_shard(shard: Shard, cfg: BertPretrainingConfig, held_out: list[tuple[int, int]],
                parts_dir: str):
    """Pass 2 over one shard: the held-out documents out (tagged "held_out"),
    the others' instances (of the `document_sample`, drawn per sequence length,
    so two phases read different documents) written as a part of `train`
    (seeded by (seed, file name, shard)); the shard's statistics (the main
    output)."""
    path, fmt = cfg.files[shard.file_index]
    held_out, kept = set(held_out), []
    documents = [(position, d.lines) for position, d in enumerate(itertools.islice(
        pretraining_data.iter_documents(path, fmt, shard.start), shard.num_documents),
        start=shard.first_document)
        if (shard.file_index, position) in held_out
        or in_sample(cfg.document_sample, cfg.seed, f"train/{cfg.max_seq_length}", path,
                     position)]
    ids = iter(_vocabulary(cfg.vocab_file, cfg.lowercase).encode_batch(
        [line for _, lines in documents for line in lines]))
    for position, lines in documents:
        segments = [s for s in (next(ids) for _ in lines) if s]
        if (shard.file_index, position) in held_out:
            yield beam.pvalue.TaggedOutput("held_out", ((shard.file_index, position), segments))
        else:
            kept.append(segments)
    paired = sum(bool(segments) for segments in kept) >= (
        2 if cfg.next_sentence_prediction else 1)
    stats = {"train_documents": len(kept), "shards": 1,
             "unpaired_documents": 0 if paired else len(kept)}
    if not paired:
        logging.warning("bert_pretraining: shard %d of %s has too few documents left for "
                        "training (%d); skipped.", shard.index, path, len(kept))
        yield stats
        return
    seed = _derived_int(cfg.seed, file_key(path), shard.index)
    instances = _create_instances(kept, cfg, dupe_factor=cfg.dupe_factor, seed=seed)
    yield {**stats, **write_part(parts_dir, "train", f"{shard.file_index}/{shard.index}",
                                 instances)}


def build_validation(held_out: list[tuple[tuple[int, int], list]], cfg: BertPretrainingConfig,
                     parts_dir: str) -> dict:
    """The validation part: every held-out document in one list (they are
    `eval_documents`, few), in corpus order, one pass, seed + 1."""
    documents = [segments for _, segments in sorted(held_out)]
    return write_part(parts_dir, "validation", "held_out", _create_instances(
        documents, cfg, dupe_factor=1, seed=cfg.seed + _EVAL_SEED_OFFSET))


def sum_statistics(parts) -> dict:
    """Statistics added up key by key (numbers summed, lists joined)."""
    total: dict = {}
    for part in parts:
        for key, value in part.items():
            total[key] = total[key] + value if key in total else value
    return total


def corpus_metadata(stats: dict, cfg: BertPretrainingConfig) -> dict:
    """The `builder.info.metadata["corpus"]` record of the summed statistics."""
    splits = ["train", "validation"] if cfg.eval_documents else ["train"]
    return {
        "files": [p for p, _ in cfg.files], "empty_files": sorted(stats["empty_files"]),
        **{key: stats.get(key, 0) for key in (
            "documents", "one_line_documents", "lines", "train_documents",
            "shards", "unpaired_documents")},
        "eval_documents": cfg.eval_documents, "documents_per_shard": cfg.documents_per_shard,
        "document_sample": cfg.document_sample,
        "instances": {s: stats.get(f"{s}_instances", 0) for s in splits},
        "random_next": {s: stats.get(f"{s}_random_next", 0) / max(1, stats.get(
            f"{s}_instances", 0)) for s in splits}}


def beam_pipeline_options(flags: str = "") -> "beam.options.pipeline_options.PipelineOptions":
    """Beam options from command-line `flags` over the default: Beam's local
    Python runner, a worker process per core. It is named (`FnApiRunner`):
    `DirectRunner` online first downloads and tries Beam's Go runner (Prism),
    whose memory and parallelism are not those measured here."""
    defaults = ["--runner=FnApiRunner", f"--direct_num_workers={os.cpu_count() or 1}",
                "--direct_running_mode=multi_processing"]
    return beam.options.pipeline_options.PipelineOptions(defaults + shlex.split(flags))


# The user errors a Beam worker may raise: written as JSON into `parts/errors/`
# by `_reporting`, raised again by the builder (Beam gives it only text).
ERRORS = "errors"
_WORKER_ERRORS = {error.__name__: error for error in (DataError, MissingFileError)}


def _reporting(fn, parts_dir: str):
    """`fn` (a function, or a generator function: its outputs for one element
    collected) for a Beam worker, writing a user error it raises into
    `parts_dir/errors/` before raising it."""
    def call(*args):
        try:
            return list(fn(*args)) if inspect.isgeneratorfunction(fn) else fn(*args)
        except tuple(_WORKER_ERRORS.values()) as error:
            path = epath.Path(parts_dir, ERRORS, f"{os.getpid()}-{id(error)}.json")
            path.parent.mkdir(parents=True, exist_ok=True)
            fields = {k: v for k, v in vars(error).items() if not k.startswith("_")}
            path.write_text(json.dumps([type(error).__name__, list(error.args),
                                        fields if isinstance(error, DataError) else {}]))
            raise
    return call


def build_parts(pipeline: beam.Pipeline, cfg: BertPretrainingConfig, parts_dir: str) -> None:
    """The Beam pipeline: the parts of each split and their summed statistics
    (`SUMMARY`), written into `parts_dir`."""
    scan, pick, build, validate = (_reporting(fn, parts_dir) for fn in (
        scan_file, held_out_documents, build_shard, build_validation))
    files = pipeline | "Files" >> beam.Create(list(enumerate(cfg.files)))
    scanned = files | "Scan" >> beam.FlatMap(scan, cfg).with_outputs(
        "shards", "candidates", main="stats")
    file_stats = scanned.stats | "SumFileStats" >> beam.CombineGlobally(sum_statistics)
    held_out = (scanned.candidates
                | "Smallest" >> beam.combiners.Top.Smallest(cfg.eval_documents)
                | "HeldOut" >> beam.Map(pick, beam.pvalue.AsSingleton(
                    file_stats | beam.Map(lambda s: s.get("documents", 0))), cfg))
    built = (scanned.shards
             | "Spread" >> beam.Reshuffle()
             | "Build" >> beam.FlatMap(build, cfg, beam.pvalue.AsSingleton(held_out),
                                       parts_dir).with_outputs("held_out", main="stats"))
    stats = [scanned.stats, built.stats]
    if cfg.eval_documents:
        stats.append(built.held_out
                     | "CollectHeldOut" >> beam.combiners.ToList()
                     | "Validation" >> beam.Map(validate, cfg, parts_dir))
    _ = (stats | "AllStats" >> beam.Flatten()
         | "SumStats" >> beam.CombineGlobally(sum_statistics)
         | "Summary" >> beam.Map(lambda s: epath.Path(parts_dir, SUMMARY).write_text(
             json.dumps(s))))


class BertPretraining(LocalFilesBuilder):
    """Pretraining examples of a text corpus (see module docstring)."""

    def __init__(self, *, files: Sequence[str] | None = None, vocab_file: str | None = None,
                 config=None, beam_options: str = "", data_dir: str | None = None,
                 version=None, **options):
        """The corpus (`files`, `vocab_file`, `pretraining_config`'s options) or
        `config`, not both; `beam_options` never change the examples."""
        given = files is not None or vocab_file is not None or options
        if config is not None and given or config is None and None in (files, vocab_file):
            raise ValueError("bert_pretraining: give either config= or files= and vocab_file=")
        if config is None:
            config = pretraining_config(files, vocab_file, **options)
        self.beam_options = beam_options
        super().__init__(config=config, data_dir=data_dir, version=version)

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(features=_features(),
                                              metadata=tfds.core.MetadataDict())

    def _download_and_prepare(self, dl_manager, download_config) -> None:
        """Runs `build_parts`, then makes the parts of each split its tfds
        shards, in the corpus's order."""
        del dl_manager  # nothing to download
        cfg: BertPretrainingConfig = self.builder_config
        parts = self.data_path / "parts"   # in tfds's temporary folder until complete
        parts.mkdir()
        options = download_config.beam_options
        if options is None and download_config.beam_runner is None:
            options = beam_pipeline_options(self.beam_options)
        try:
            with beam.Pipeline(runner=download_config.beam_runner, options=options) as pipeline:
                build_parts(pipeline, cfg, os.fspath(parts))
        except Exception:  # a worker's user error is raised again as itself
            for report in sorted((parts / ERRORS).glob("*.json")):
                name, args, fields = json.loads(report.read_text())
                raise (_WORKER_ERRORS[name](**fields) if fields
                       else _WORKER_ERRORS[name](*args)) from None
            raise
        summary = json.loads((parts / SUMMARY).read_text())
        splits = []
        for split in ["train", "validation"] if cfg.eval_documents else ["train"]:
            written = sorted(((name, count, size) for s, name, count, size in
                              summary.get("parts", []) if s == split),
                             key=lambda part: _part_file(split, part[0]))
            if not written:
                knob = "documents_per_shard" if split == "train" else "eval_documents"
                raise DataError("bert_pretraining", f"no {split} instances (too few "
                                "documents with text)", f"raise {knob}")
            template = self._get_filename_template(split_name=split)
            for index, (name, _, _) in enumerate(written):
                (parts / _part_file(split, name)).rename(
                    template.sharded_filepath(shard_index=index, num_shards=len(written)))
            splits.append(tfds.core.SplitInfo(
                name=split, shard_lengths=[count for _, count, _ in written],
                num_bytes=sum(size for _, _, size in written), filename_template=template))
        self.info.set_splits(tfds.core.SplitDict(splits))
        self.info.metadata["corpus"] = corpus_metadata(summary, cfg)
        parts.rmtree()

    def _split_generators(self, dl_manager):
        raise NotImplementedError("the splits are written by _download_and_prepare")

    def _generate_examples(self):
        raise NotImplementedError("the splits are written by _download_and_prepare")
