r"""Wall time, instances/s and peak memory of building the BERT pretraining data;
with `--iterator`, rows/s of the training iterator that reads it.

  python launch/benchmark_pretraining_data.py --megabytes=1024 --workers=2 \
      --corpus_dir=/tmp/corpus_1g --data_dir=/tmp/bench_tfds
  taskset -c 1 python launch/benchmark_pretraining_data.py --iterator \
      --config=experiments/pretrain_bert.py:corpus --workdir=W --config.data.data_dir=D

The corpus (written once) is the shared pretraining files repeated, each document of
copy C headed "copy C document D ." so that no two are the same; the vocabulary an 8k
WordPiece trained on them. The build (sequence 128, 500 held-out documents) goes to a
fresh `--data_dir`; one JSON line reports wall seconds, instances/s and the peak
resident memory (sampled from /proc) of the process tree, this process and its
largest child (a Beam worker). `--workers=0` passes no Beam options (with PYTHONPATH
at an older revision: the single-process builder).

`--iterator`: rows/s and rows per CPU second of the training iterator of `--config`
and `--workdir` (reading and masking, as training does), after one untimed batch.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time

from absl import app, flags

import common_flags
from bert_jax.data.bert_pretraining import BertPretraining
from bert_jax.data.pretraining_data import read_documents
from bert_jax.data.sources import load_source
from bert_jax.data.wordpiece import WordPiece
from bert_jax.tasks import build_task

SHARED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared",
                      "data", "pretrain")
SOURCES = (("reuters21578_docs.txt", "blank_lines"), ("wiki.valid.raw", "wikitext"),
           ("wiki.test.raw", "wikitext"))

MEGABYTES = flags.DEFINE_integer("megabytes", 100, "Size of the generated corpus (MB).")
FILE_MEGABYTES = flags.DEFINE_integer("file_megabytes", 64, "Size of each corpus file (MB).")
CORPUS_DIR = flags.DEFINE_string("corpus_dir", None, "Where the corpus is (or is written).")
DATA_DIR = flags.DEFINE_string("data_dir", None, "tfds data_dir of the build (emptied first).")
WORKERS = flags.DEFINE_integer("workers", 2, "Beam local-runner worker processes (0: the "
                               "builder's default options).")
DUPE_FACTOR = flags.DEFINE_integer("dupe_factor", 1, "Passes over the corpus.")
SHARED_DIR = flags.DEFINE_string("shared_dir", SHARED, "The shared pretraining files.")
ITERATOR = flags.DEFINE_bool("iterator", False, "Time the training iterator of --config "
                             "and --workdir instead of the build.")
BATCHES = flags.DEFINE_integer("batches", 100, "Batches timed (--iterator).")


def write_corpus(directory: str, megabytes: int, file_megabytes: int) -> list[str]:
    """The corpus files (written unless `directory` already holds them)."""
    done = os.path.join(directory, "files.json")
    if os.path.exists(done):
        return json.load(open(done))
    os.makedirs(directory, exist_ok=True)
    documents = [d for name, fmt in SOURCES
                 for d in read_documents(os.path.join(SHARED_DIR.value, name), fmt)]
    paths, written, copy, out = [], 0, 0, None
    while written < megabytes << 20:
        for d, lines in enumerate(documents):
            if out is None or out.tell() >= file_megabytes << 20:
                if out:
                    out.close()
                paths.append(os.path.join(directory, f"corpus_{len(paths):04d}.txt"))
                out = open(paths[-1], "w", encoding="utf-8")
            text = "\n".join([f"copy {copy} document {d} .", *lines]) + "\n\n"
            out.write(text)
            written += len(text.encode())
            if written >= megabytes << 20:
                break
        copy += 1
    out.close()
    json.dump(paths, open(done, "w"))
    return paths


def vocabulary(directory: str) -> str:
    path = os.path.join(directory, "vocab", "vocab.txt")
    if not os.path.exists(path):
        files = [(os.path.join(SHARED_DIR.value, n), f) for n, f in SOURCES]
        WordPiece.train(lambda: (line for p, f in files for d in read_documents(p, f)
                                 for line in d), vocab_size=8192).save(os.path.dirname(path))
    return path


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(x.split()[1]) for x in f if x.startswith("VmRSS")) / 1024
    except (OSError, StopIteration):
        return 0.0


def _descendants(pid: int) -> list[int]:
    """The process ids of `pid`'s children, grandchildren, ..."""
    found, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    children = [int(c) for c in f.read().split()]
                found += children
                frontier += children
        except OSError:  # the process ended meanwhile
            pass
    return found


class PeakMemory(threading.Thread):
    """Samples the resident memory of this process and its descendants."""

    def __init__(self, every: float = 0.2):
        super().__init__(daemon=True)
        self.every, self.stop = every, threading.Event()
        self.peak = {"tree_mb": 0.0, "main_mb": 0.0, "largest_child_mb": 0.0}

    def run(self):
        while not self.stop.wait(self.every):
            main = _rss_mb(os.getpid())
            children = [_rss_mb(p) for p in _descendants(os.getpid())]
            for key, value in (("tree_mb", main + sum(children)), ("main_mb", main),
                               ("largest_child_mb", max(children, default=0.0))):
                self.peak[key] = max(self.peak[key], value)


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of these processes so far (0 for one that ended)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                total += sum(int(x) for x in f.read().rsplit(")", 1)[1].split()[11:13])
        except OSError:
            pass
    return total / os.sysconf("SC_CLK_TCK")


def time_iterator():
    config = common_flags.CONFIG.value
    it = build_task(config, common_flags.WORKDIR.value).train_iterator(0, 1)
    tokens = 0
    next(it)
    pids = [os.getpid(), *_descendants(os.getpid())]
    cpu, start = _cpu_seconds(pids), time.perf_counter()
    for _ in range(BATCHES.value):
        tokens += int((next(it)["input_ids"] != 0).sum())
    seconds, cpu = time.perf_counter() - start, _cpu_seconds(pids) - cpu
    it.close()
    rows = BATCHES.value * config.train.batch_size
    data = config.data
    print(json.dumps({"max_seq_length": data.max_seq_length,
                      "predictions": data.max_predictions_per_seq,
                      "whole_word_masking": data.whole_word_masking,
                      "input_workers": config.train.get("input_workers", 0), "rows": rows,
                      "seconds": round(seconds, 2), "rows_per_s": round(rows / seconds),
                      "cpu_seconds": round(cpu, 2), "rows_per_cpu_s": round(rows / cpu),
                      "tokens_per_row": round(tokens / rows, 1)}))


def main(argv):
    if ITERATOR.value:
        return time_iterator()
    if not (CORPUS_DIR.value and DATA_DIR.value):
        raise app.UsageError("--corpus_dir and --data_dir are required (or --iterator).")
    files = write_corpus(CORPUS_DIR.value, MEGABYTES.value, FILE_MEGABYTES.value)
    vocab_file = vocabulary(CORPUS_DIR.value)
    shutil.rmtree(DATA_DIR.value, ignore_errors=True)
    beam = ({"beam_options": f"--direct_num_workers={WORKERS.value} "
                             "--direct_running_mode=multi_processing"} if WORKERS.value else {})
    memory = PeakMemory()
    memory.start()
    start = time.perf_counter()
    builder = BertPretraining(files=files, vocab_file=vocab_file, max_seq_length=128,
                              dupe_factor=DUPE_FACTOR.value, eval_documents=500, seed=0,
                              data_dir=DATA_DIR.value, **beam)
    instances = sum(len(load_source(builder, s)) for s in ("train", "validation"))
    seconds = time.perf_counter() - start
    memory.stop.set()
    memory.join()
    corpus_mb = sum(os.path.getsize(p) for p in files) / 2**20
    print(json.dumps({"corpus_mb": round(corpus_mb), "files": len(files),
                      "workers": WORKERS.value, "seconds": round(seconds, 1),
                      "instances": instances, "instances_per_s": round(instances / seconds),
                      **{k: round(v) for k, v in memory.peak.items()},
                      "corpus": builder.info.metadata.get("corpus", {})}))


if __name__ == "__main__":
    common_flags.run(main)
