"""Random-access sources by dataset name: the built-in corpora, generated in
memory, and tfds datasets in `array_record` format, read without TensorFlow.

    source = load_source("synthetic_reverse", "train", num_train=64)
    source = load_source("parallel_text", "train", data_dir, path=..., ...)
    len(source); source[i]  # -> {"inputs": np.ndarray, ...} or {"source": text, ...}

A built-in name (`GENERATED`) calls its module's `generate(**kwargs)`; a tfds
dataset is prepared on first use and read with `builder.as_data_source`.

Several processes of one machine may prepare the same dataset at once: the
first takes an exclusive `fcntl` lock named after the dataset folder (in
`$TMPDIR/bert_jax_tfds_locks/`) and builds, the others wait and then read what
it built (without the lock all but one would fail: tfds cannot rename onto
the folder the first put in place). For a `data_dir` shared between machines,
prepare the dataset before the job, or from process 0 behind a barrier.
While preparing, a log line every PROGRESS_EVERY_SECONDS gives the time and
megabytes so far (tfds's tqdm bars draw only on a terminal).
"""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import hashlib
import inspect
import os
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

import tensorflow_datasets as tfds
from absl import logging
from tensorflow_datasets.core.registered import DatasetNotFoundError

# parallel_text registers its builder with tfds, so that it resolves by name.
from bert_jax.data import parallel_text, synthetic_reverse, synthetic_translation  # noqa: F401
from bert_jax.data.splits import no_examples, no_split, select
from bert_jax.errors import DataError

FILE_FORMAT = "array_record"
PROGRESS_EVERY_SECONDS = 30.0
# The built-in corpora: name -> `generate(**kwargs) -> {split: examples}`.
GENERATED = {"synthetic_reverse": synthetic_reverse.generate,
             "synthetic_translation": synthetic_translation.generate}


def load_source(builder: str | tfds.core.DatasetBuilder, split: str,
                data_dir: str | os.PathLike | None = None,
                **builder_kwargs: Any) -> Sequence[dict[str, Any]]:
    """A random-access source of `split` (slices included: `"validation[:100]"`),
    preparing a tfds dataset if needed. `builder`: a built-in name, a tfds
    builder, or a name as `tfds.builder` takes it. `data_dir` (empty: tfds's
    default) and `builder_kwargs` (the dataset's parameters) are for a name.
    """
    if isinstance(builder, str) and builder in GENERATED:
        generate = GENERATED[builder]
        takes = inspect.signature(generate).parameters
        unknown = sorted(set(builder_kwargs) - set(takes))
        if unknown:
            raise DataError(builder, f"no parameter(s) {unknown} (config.data.builder_kwargs)",
                            f"it takes {sorted(takes)}")
        return select(builder, generate(**builder_kwargs), split)
    if isinstance(builder, str):
        kwargs = dict(builder_kwargs)
        if data_dir:
            kwargs["data_dir"] = os.fspath(data_dir)
        try:
            builder = tfds.builder(builder, **kwargs)
        except DatasetNotFoundError as e:
            raise DataError(builder, *_not_found(builder)) from e
    elif isinstance(builder, tfds.core.DatasetBuilder):
        if builder_kwargs or data_dir:
            raise ValueError(f"load_source: data_dir and builder_kwargs are for a name; "
                             f"drop them for the builder {builder.info.full_name}")
    else:
        raise TypeError(f"load_source: builder is a {type(builder).__name__}; give a "
                        "dataset name or a tfds DatasetBuilder")
    prepare(builder)
    if not builder.info.splits and is_prepared(builder):
        # Another process built it while we waited: this builder's info came
        # from code (no splits), so read the dataset through its files.
        builder = tfds.builder_from_directory(builder.data_dir)
    name, splits = builder.info.full_name, builder.info.splits
    try:  # splits are unknown only under `tfds.testing.mock_data`
        empty = bool(splits) and splits[split].num_examples == 0
    except (KeyError, ValueError) as e:
        raise no_split(name, split, splits.keys(), f"the data in {builder.data_dir}") from e
    # (array_record would fail on an empty split with an obscure error)
    source = None if empty else builder.as_data_source(split, file_format=FILE_FORMAT)
    if source is None or len(source) == 0:
        raise no_examples(name, split, f"the data in {builder.data_dir}")
    return source


def _not_found(name: str) -> tuple[str, str]:
    """What is wrong with the dataset `name` tfds does not know, and the fix."""
    known = [*GENERATED, *tfds.list_builders(with_community_datasets=False)]
    close = difflib.get_close_matches(name.split("/")[0].split(":")[0], known, n=3)
    return (f"no such dataset (config.data.builder): neither a tfds catalog name nor one of "
            f"the project's datasets ({', '.join(GENERATED)}, parallel_text, bert_pretraining)",
            f"did you mean {' or '.join(close)}?" if close else "check the name")


def is_prepared(builder: tfds.core.DatasetBuilder) -> bool:
    """Whether the builder's version folder is complete (tfds renames it into
    place only after writing `dataset_info.json` and every shard)."""
    return (builder.data_path / "dataset_info.json").exists()


def prepare(builder: tfds.core.DatasetBuilder) -> None:
    """Builds the dataset unless it exists; safe for concurrent processes."""
    if is_prepared(builder):
        return
    with _exclusive_lock(builder):
        if is_prepared(builder):  # another process built it while we waited
            logging.info("load_source: %s was prepared by another process",
                         builder.info.full_name)
            return
        logging.info("load_source: preparing %s in %s", builder.info.full_name,
                     builder.data_dir)
        with _progress_lines(builder):
            builder.download_and_prepare(file_format=FILE_FORMAT)


@contextlib.contextmanager
def _progress_lines(builder: tfds.core.DatasetBuilder):
    """Logs the progress of the preparation inside the block as plain lines."""
    if not sys.stderr.isatty():
        tfds.disable_progress_bar()
    name = builder.info.full_name
    folder = os.path.dirname(os.fspath(builder.data_dir))  # holds tfds's temp folder
    start = time.perf_counter()
    done = threading.Event()

    def report():
        while not done.wait(PROGRESS_EVERY_SECONDS):
            logging.info("load_source: preparing %s: %.0f s, %.1f MB written", name,
                         time.perf_counter() - start, _megabytes(folder))

    thread = threading.Thread(target=report, name="dataset-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
    splits = ", ".join(f"{split} {info.num_examples:,}"
                       for split, info in builder.info.splits.items())
    logging.info("load_source: prepared %s in %.0f s (%.1f MB): %s examples", name,
                 time.perf_counter() - start, _megabytes(folder), splits)


def _megabytes(folder: str) -> float:
    """Size of the files under `folder` (0 for a remote one)."""
    if "://" in folder:
        return 0.0
    total = 0
    for root, _, files in os.walk(folder):
        for file in files:
            try:
                total += os.path.getsize(os.path.join(root, file))
            except OSError:  # moved or deleted since the walk listed it (tfds renames)
                pass
    return total / 1e6


@contextlib.contextmanager
def _exclusive_lock(builder: tfds.core.DatasetBuilder):
    """A lock per dataset folder, on a file in the temp dir (not beside the data)."""
    data_dir = os.fspath(builder.data_dir)
    if "://" in data_dir:  # remote filesystem: no flock; see the module docstring
        logging.warning("load_source: no inter-process lock on a remote data_dir; "
                        "prepare the dataset from one process first.")
        yield
        return
    digest = hashlib.sha256(os.path.realpath(data_dir).encode()).hexdigest()[:16]
    stem = builder.info.full_name.replace("/", "-")
    path = os.path.join(tempfile.gettempdir(), "bert_jax_tfds_locks", f"{stem}-{digest}.lock")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)   # released when the file closes
        yield
