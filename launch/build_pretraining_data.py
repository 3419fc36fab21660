r"""Builds the BERT pretraining dataset of an experiment, without training.

  python launch/build_pretraining_data.py \
      --config=experiments/pretrain_bert.py:base_2018 --workdir=DIR \
      --config.data.corpus_files="('/data/wiki_00.txt', '/data/books_00.txt')" \
      --config.data.data_dir=/mnt/bucket/tfds \
      --config.data.beam_options="--runner=FlinkRunner --flink_master=HOST:8081 \
          --environment_type=LOOPBACK"

The vocabulary is the run's: `data.vocab_file`, or one trained on the corpus
(streamed) into DIR/vocab/ the first time. The instances are written to
`data.data_dir` by Apache Beam: on the local FnApiRunner with one worker a
core when `data.beam_options` is empty, otherwise on the runner those flags
name (Beam's own pipeline flags; docs/PRETRAINING_DATA.md has the Dataflow,
Flink and Spark lines). Training with the same config and `data_dir` then
reads the dataset and does not build it again. Prints the corpus statistics.
"""

import json
import os

from absl import app

import common_flags as launch_flags
from bert_jax.config_schema import config_problems, refuse
from bert_jax.data import sources
from bert_jax.tasks import build_task
from bert_jax.training.validation import check_files


def main(argv):
    launch_flags.start()
    config = launch_flags.CONFIG.value
    if config.task != "bert_pretraining":
        raise app.UsageError(f"--config is a {config.task!r} experiment; this builds the "
                             "data of bert_pretraining ones (experiments/pretrain_bert.py).")
    refuse(config_problems(config), "the config cannot build its data")  # before anything
    check_files(config)  # is written
    builder = build_task(config, launch_flags.WORKDIR.value).dataset_builder()
    sources.prepare(builder)
    print(json.dumps({"data_dir": os.fspath(builder.data_path),
                      **builder.info.metadata["corpus"]}, indent=1))


if __name__ == "__main__":
    launch_flags.run(main)
