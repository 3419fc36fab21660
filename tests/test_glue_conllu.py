"""Fine-tuning data: GLUE-style TSV tasks (`bert_jax.data.glue`) and CoNLL-U /
CoNLL-2003 token tagging (`bert_jax.data.conllu`): parsing, errors, the
splits of a directory, the tfds catalog under mock_data, and the real files
of ../shared/data when present."""

from __future__ import annotations

import math
import os
import re

import numpy as np
import pytest
import tensorflow_datasets as tfds

from bert_jax.data.conllu import (
    UPOS_TAGS, read_conllu, read_splits, split_files, tag_vocabulary)
from bert_jax.data.glue import (
    GLUE_TASKS, GlueTaskSpec, from_catalog, read_split, read_tsv)
from bert_jax.data.sources import load_source
from bert_jax.data.splits import select
from bert_jax.errors import ConfigError, DataError
from bert_jax.evaluation import classification_metrics


def _write(path, text: str | bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, str):
        text = text.encode("utf-8")
    path.write_bytes(text)
    return str(path)


def _error(exc_type, fn, *args, **kwargs) -> str:
    with pytest.raises(exc_type) as info:
        fn(*args, **kwargs)
    return str(info.value)


# ================================================================== GLUE ==

MRPC_HEAD = "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"


def test_task_specs():
    assert {"sst2", "mrpc", "stsb", "cola", "rte", "qnli", "mnli"} <= set(GLUE_TASKS)
    for name, spec in GLUE_TASKS.items():
        assert spec.name == name and spec.catalog == f"glue/{name}"
        assert spec.splits["train"] == "train.tsv"
        for metric in spec.metrics:
            assert callable(getattr(classification_metrics, metric)), (name, metric)
        assert spec.num_labels == (1 if spec.is_regression else len(spec.labels))
    assert GLUE_TASKS["stsb"].is_regression and GLUE_TASKS["stsb"].num_labels == 1
    assert GLUE_TASKS["mnli"].num_labels == 3
    assert GLUE_TASKS["mnli"].splits["validation"] == "dev_matched.tsv"
    assert GLUE_TASKS["mrpc"].metrics == ("accuracy", "f1")
    assert GLUE_TASKS["cola"].metrics == ("matthews_corrcoef",)
    assert not GLUE_TASKS["cola"].has_header and GLUE_TASKS["sst2"].has_header
    with pytest.raises(ValueError, match=r"GlueTaskSpec x: text_a, text_b, label_column="
                                         r"\[0, 'b', 1\]; "):
        GlueTaskSpec(name="x", text_a=0, text_b="b", label_column=1, labels=("0",),
                     metrics=(), splits={"train": "t.tsv"}, catalog="",
                     catalog_text_a="", catalog_text_b=None)


def test_read_tsv_bom_quotes_and_pairs(tmp_path):
    path = _write(tmp_path / "dev.tsv", MRPC_HEAD
                  + '1\t11\t12\tHe said " hi " .\t" Hi , " he said .\n'
                  + "0\t13\t14\tA 'quoted\" thing\tOther  \n")
    ex = read_tsv(path, "mrpc")
    assert ex == [
        {"text_a": 'He said " hi " .', "text_b": '" Hi , " he said .', "label": 1,
         "line": 2},
        {"text_a": "A 'quoted\" thing", "text_b": "Other", "label": 0, "line": 3}]
    sst = _write(tmp_path / "sst.tsv", 'sentence\tlabel\n" a film \t1\r\nbad \t0\n')
    assert read_tsv(sst, GLUE_TASKS["sst2"]) == [
        {"text_a": '" a film', "text_b": "", "label": 1, "line": 2},
        {"text_a": "bad", "text_b": "", "label": 0, "line": 3}]


def test_read_tsv_regression_headerless_and_unlabelled(tmp_path):
    head = "\t".join(["index", "genre", "filename", "year", "old_index", "source1",
                      "source2", "sentence1", "sentence2"])
    stsb = _write(tmp_path / "train.tsv", f"{head}\tscore\n"
                  + "0\tg\tf\t2012\t0\tn\tn\tA man .\tA person .\t3.800\n")
    assert read_tsv(stsb, "stsb") == [
        {"text_a": "A man .", "text_b": "A person .", "label": 3.8, "line": 2}]
    test = _write(tmp_path / "test.tsv", f"{head}\n0\tg\tf\t2012\t0\tn\tn\tA .\tB .\n")
    [row] = read_tsv(test, "stsb", labels_required=False)
    assert math.isnan(row["label"]) and row["text_b"] == "B ."
    msg = _error(DataError, read_tsv, test, "stsb")
    assert "test.tsv:1:" in msg and "'score'" in msg

    cola = _write(tmp_path / "cola.tsv", "gj04\t1\t\tThe sailors rode the breeze .\n"
                  "gj04\t0\t*\tThe more we study verbs , the crazier .\n")
    assert [(e["text_a"][:3], e["label"], e["line"]) for e in read_tsv(cola, "cola")] == [
        ("The", 1, 1), ("The", 0, 2)]
    sst_test = _write(tmp_path / "sst_test.tsv", "index\tsentence\n0\tfine .\n")
    assert read_tsv(sst_test, "sst2", labels_required=False) == [
        {"text_a": "fine .", "text_b": "", "label": -1, "line": 2}]


@pytest.mark.parametrize("name, content, task, where, words", [
    ("hdr.tsv", "sentence\tscore\nok\t1\n", "sst2", ":1:",
     ["'label'"]),
    ("few.tsv", MRPC_HEAD + "1\t2\t3\tonly one sentence\n", "mrpc", ":2:",
     []),
    ("blank.tsv", "sentence\tlabel\nok\t1\n\nfine\t0\n", "sst2", ":3:",
     []),
    ("lab.tsv", "sentence\tlabel\nok\t1\nbad\tpositive\n", "sst2", ":3:5:",
     ["'positive'"]),
    ("reg.tsv", "sentence1\tsentence2\tscore\na\tb\t4.2\na\tb\tfive\n", "stsb", ":3:5:",
     ["'five'"]),
    ("nan.tsv", "sentence1\tsentence2\tscore\na\tb\tnan\n", "stsb", ":2:5:",
     ["'nan'"]),
    ("empty.tsv", MRPC_HEAD + "1\t2\t3\tfine\t  \n", "mrpc", ":2:12:",
     ["text_b"]),
    ("utf8.tsv", b"sentence\tlabel\nok\t1\ncaf\xe9\t0\n", "sst2", ":3:4:",
     ["UTF-8"]),
    ("cr.tsv", "sentence\tlabel\na\rb\t1\n", "sst2", ":2:", ["\\r"]),
    ("cola.tsv", "src\t1\t\tfine .\nsrc\t1\n", "cola", ":2:",
     []),
])
def test_read_tsv_errors_name_file_and_line(tmp_path, name, content, task, where, words):
    path = _write(tmp_path / name, content)
    msg = _error(DataError, read_tsv, path, task)
    assert f"{path}{where}" in msg, msg
    for word in words:
        assert word in msg, msg


def test_read_tsv_missing_file(tmp_path):
    msg = _error(FileNotFoundError, read_tsv, tmp_path / "nope.tsv", "sst2")
    assert "nope.tsv" in msg
    assert "unknown task 'sst3'" in _error(ValueError, read_tsv, tmp_path / "x", "sst3")


def _sst2_dir(root, n_train=5) -> str:
    _write(root / "train.tsv", "sentence\tlabel\n" + "".join(
        f"train sentence {i} \t{i % 2}\n" for i in range(n_train)))
    _write(root / "dev.tsv", 'sentence\tlabel\n" quoted "\t1\nplain\t0\n')
    _write(root / "test.tsv", "index\tsentence\n0\tunlabelled one\n")
    return str(root)


def test_glue_splits_read_from_the_task_directory(tmp_path):
    path = _sst2_dir(tmp_path / "glue" / "SST-2")
    dev = read_split(path, "sst2", "validation")
    assert [(e["text_a"], e["text_b"], e["label"]) for e in dev] == [
        ('" quoted "', "", 1), ("plain", "", 0)]
    train = read_split(path, "sst2", "train")
    assert [e["text_a"] for e in train] == [f"train sentence {i}" for i in range(5)]
    assert read_split(path, "sst2", "test")[0]["label"] == -1      # unlabelled
    # The GLUE root works too (the task's directory inside it).
    assert read_split(tmp_path / "glue", "sst2", "validation") == dev


def test_glue_regression_split_is_read_as_the_file_is_now(tmp_path):
    root = tmp_path / "stsb"
    _write(root / "train.tsv", "sentence1\tsentence2\tscore\na b\tc d\t2.5\n")
    _write(root / "dev.tsv", "sentence1\tsentence2\tscore\ne\tf\t0.25\n")
    dev = read_split(root, "stsb", "validation")
    assert (dev[0]["text_a"], dev[0]["text_b"], dev[0]["label"]) == ("e", "f", 0.25)
    _write(root / "dev.tsv", "sentence1\tsentence2\tscore\ne\tf\t0.5\n")
    assert read_split(root, "stsb", "validation")[0]["label"] == 0.5


def test_glue_split_errors(tmp_path):
    root = tmp_path / "bad"
    _write(root / "train.tsv", "sentence\tlabel\nok\t1\nnot ok\t7\n")
    msg = _error(DataError, read_split, root, "sst2", "train")
    assert f"{root / 'train.tsv'}:3:8:" in msg and "'7'" in msg
    msg = _error(FileNotFoundError, read_split, tmp_path, "mrpc", "train")
    assert "train.tsv" in msg and "MRPC" in msg
    _write(root / "dev.tsv", "sentence\tlabel\n")
    msg = _error(DataError, read_split, root, "sst2", "validation")
    assert f"{root / 'dev.tsv'}:" in msg
    assert "no split 'dev'" in _error(DataError, read_split, root, "sst2", "dev")


def test_from_catalog_maps_labels():
    mnli = GLUE_TASKS["mnli"]
    # Catalog class order: entailment, neutral, contradiction.
    got = [from_catalog(mnli, {"premise": b"p ", "hypothesis": "h", "label": np.int64(i),
                               "idx": np.int32(0)})["label"] for i in (0, 1, 2, -1)]
    assert [mnli.labels[i] for i in got[:3]] == ["entailment", "neutral", "contradiction"]
    assert got[3] == -1
    assert from_catalog("sst2", {"sentence": "x ", "label": 1, "idx": 3}) == {
        "text_a": "x", "text_b": "", "label": 1}
    assert math.isnan(from_catalog("stsb", {"sentence1": "a", "sentence2": "b",
                                            "label": np.float32(-1)})["label"])
    with pytest.raises(KeyError, match="no feature 'sentence1'"):
        from_catalog("mrpc", {"sentence": "a", "label": 0})


def test_from_catalog_under_mock_data(tmp_path):
    # Catalog datasets register when their module is imported; mock_data
    # (offline, random examples) cannot find `glue` otherwise.
    import tensorflow_datasets.text.glue  # noqa: F401
    with tfds.testing.mock_data(num_examples=4):
        for task in ("sst2", "mrpc", "stsb", "mnli"):
            spec = GLUE_TASKS[task]
            source = load_source(spec.catalog, "train", tmp_path / task)
            assert len(source) == 4
            for i in range(len(source)):
                ex = from_catalog(spec, source[i])
                assert set(ex) == {"text_a", "text_b", "label"}
                assert isinstance(ex["text_a"], str) and isinstance(ex["text_b"], str)
                assert (ex["text_b"] == "") == (spec.text_b is None)
                if spec.is_regression:
                    assert isinstance(ex["label"], float)
                else:
                    assert isinstance(ex["label"], int)
                    assert 0 <= ex["label"] < spec.num_labels


# =============================================================== CoNLL-U ==

CONLLU = (
    "# newdoc id = d1\n"
    "# sent_id = s-1\n"
    "# text = Don't go_\n"
    "1-2\tDon't\t_\t_\t_\t_\t_\t_\t_\t_\n"
    "1\tDo\tdo\tAUX\tVBP\t_\t3\taux\t3:aux\t_\n"
    "2\tn't\tnot\tPART\tRB\t_\t3\tadvmod\t3:advmod\t_\n"
    "3\tgo\tgo\tVERB\tVB\t_\t0\troot\t0:root\t_\n"
    "3.1\tgo\tgo\tVERB\tVB\t_\t_\t_\t3:conj\tCopyOf=3\n"
    "4\t_\t_\tPUNCT\tNFP\t_\t3\tpunct\t3:punct\t_\n"
    "\n\n"
    "1\tHi\thi\tINTJ\tUH\t_\t0\troot\t0:root\t_\n"     # no blank line at the end
)


def test_read_conllu(tmp_path):
    path = _write(tmp_path / "x-ud-train.conllu", CONLLU)
    s = read_conllu(path)
    assert s == [
        {"words": ["Do", "n't", "go", "_"], "tags": ["AUX", "PART", "VERB", "PUNCT"],
         "line": 1, "sent_id": "s-1"},
        {"words": ["Hi"], "tags": ["INTJ"], "line": 12, "sent_id": ""}]
    assert read_conllu(path, "xpos")[0]["tags"] == ["VBP", "RB", "VB", "NFP"]
    assert read_conllu(path, "deprel")[0]["tags"] == ["aux", "advmod", "root", "punct"]
    assert read_conllu(path, 2)[0]["tags"] == ["do", "not", "go", "_"]
    # A BOM and CRLF line ends are fine.
    crlf = _write(tmp_path / "crlf.conllu", "\ufeff" + CONLLU.replace("\n", "\r\n"))
    assert read_conllu(crlf) == s
    with pytest.raises(DataError, match=f"^{re.escape(str(path))}: conllu has no column='ner'"):
        read_conllu(path, "ner")
    with pytest.raises(ConfigError, match=r"^conllu: format='conll': unknown; .*'conll2003'"):
        read_conllu(path, format="conll")


def test_read_conll2003(tmp_path):
    path = _write(tmp_path / "eng.train", (
        "-DOCSTART- -X- -X- O\n\n"
        "EU NNP B-NP B-ORG\nrejects VBZ B-VP O\nGerman JJ B-NP B-MISC\n\n"
        "Peter NNP B-NP B-PER\nBlackburn NNP I-NP I-PER\n\n\n"
        "-DOCSTART- -X- -X- O\n\n# NN B-NP O\n"))
    s = read_conllu(path, format="conll2003")
    assert [(x["words"], x["tags"], x["line"]) for x in s] == [
        (["EU", "rejects", "German"], ["B-ORG", "O", "B-MISC"], 3),
        (["Peter", "Blackburn"], ["B-PER", "I-PER"], 7),
        (["#"], ["O"], 13)]
    assert read_conllu(path, "pos", format="conll2003")[0]["tags"] == ["NNP", "VBZ", "JJ"]
    by_index = read_conllu(path, "-2", format="conll2003", word_column=1)[0]
    assert (by_index["words"], by_index["tags"]) == (["NNP", "VBZ", "JJ"],
                                                     ["B-NP", "B-VP", "B-NP"])
    with pytest.raises(DataError, match=f"^{re.escape(str(path))}: column=1 .*word_column"):
        read_conllu(path, 1, format="conll2003", word_column=1)
    msg = _error(DataError, read_conllu, path, format="conll2003", word_column=4)
    assert f"{path}:3:" in msg and "column 4" in msg and "word_column" in msg
    assert tag_vocabulary(s) == ["B-MISC", "B-ORG", "B-PER", "I-PER", "O"]
    bad = _write(tmp_path / "bad.txt", "EU NNP B-NP B-ORG\nrejects O\n")
    msg = _error(DataError, read_conllu, bad, format="conll2003")
    assert f"{bad}:2:" in msg and "line 1" in msg


@pytest.mark.parametrize("content, where, words", [
    ("1\tA\ta\tDET\n", ":1:", ["4 tab-separated"]),
    ("1 A a DET DT _ 0 root _ _\n", ":1:", ["1 tab-separated"]),
    ("# c\n1\tA\ta\tDET\tDT\t_\t0\troot\t_\t_\nx\tB\tb\tX\tX\t_\t1\tdep\t_\t_\n", ":3:1:",
     ["ID 'x'"]),
    ("1\tA\ta\tDET\tDT\t_\t0\troot\t_\t_\n3\tB\tb\tX\tX\t_\t1\tdep\t_\t_\n", ":2:1:",
     ["ID 3", "line 1"]),
    ("1\tA\ta\tDET\tDT\t_\t0\troot\t_\t_\n1\tB\tb\tX\tX\t_\t1\tdep\t_\t_\n", ":2:1:",
     ["ID 1"]),
    ("1\tA\ta\tDET\tDT\t_\t0\troot\t_\t_\n\n2\tB\tb\tX\tX\t_\t0\troot\t_\t_\n", ":3:1:",
     ["ID 2"]),
    ("1\t\ta\tDET\tDT\t_\t0\troot\t_\t_\n", ":1:3:", ["empty FORM"]),
    ("1\tA\ta\t\tDT\t_\t0\troot\t_\t_\n", ":1:7:", ["empty UPOS"]),
    (b"1\tA\ta\tDET\tDT\t_\t0\troot\t_\t_\n2\t\xff\tb\tX\tX\t_\t1\tdep\t_\t_\n", ":2:3:",
     ["UTF-8"]),
])
def test_read_conllu_errors_name_file_and_line(tmp_path, content, where, words):
    path = _write(tmp_path / "bad.conllu", content)
    msg = _error(DataError, read_conllu, path)
    assert f"{path}{where}" in msg, msg
    for word in words:
        assert word in msg, msg
    assert "/no:" in _error(FileNotFoundError, read_conllu, tmp_path / "no")


def test_upos_tags():
    assert len(UPOS_TAGS) == len(set(UPOS_TAGS)) == 17
    assert UPOS_TAGS == tuple(sorted(UPOS_TAGS))
    assert {"NOUN", "VERB", "PROPN", "AUX", "CCONJ", "SCONJ", "X"} <= set(UPOS_TAGS)


def test_conllu_splits_of_a_directory(tmp_path):
    root = tmp_path / "UD_X"
    _write(root / "x-ud-train.conllu", CONLLU)
    _write(root / "x-ud-dev.conllu", "1\tHi\thi\tINTJ\tUH\t_\t0\troot\t0:root\t_\n\n")
    files = split_files(root)
    assert files == {"train": str(root / "x-ud-train.conllu"),
                     "validation": str(root / "x-ud-dev.conllu")}
    train = read_splits(files)["train"]
    assert len(train) == 2
    assert train[0]["words"] == ["Do", "n't", "go", "_"]
    assert train[0]["tags"] == ["AUX", "PART", "VERB", "PUNCT"]
    splits = read_splits(files, column="xpos")
    assert splits["validation"][0]["tags"] == ["UH"]
    assert tag_vocabulary(s for split in splits.values() for s in split) == [
        "NFP", "RB", "UH", "VB", "VBP"]
    with pytest.raises(DataError, match="no split 'test'"):
        select("conllu", splits, "test")
    # CoNLL-2003 with explicit files.
    _write(root / "eng.testa", "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\n")
    ner = read_splits(split_files(root, {"validation": "eng.testa"}), format="conll2003")
    assert ner["validation"][0]["tags"] == ["B-ORG"]
    # Errors name the file and the line; an empty split names its file.
    _write(tmp_path / "B" / "b-ud-train.conllu", "1\tA\ta\tDET\n")
    msg = _error(DataError, read_splits, split_files(tmp_path / "B"))
    assert "b-ud-train.conllu:1:" in msg
    _write(root / "empty.conllu", "# only a comment\n\n")
    msg = _error(DataError, read_splits, split_files(root, {"test": "empty.conllu"}))
    assert "['test']" in msg and "empty.conllu:" in msg
    msg = _error(DataError, split_files, tmp_path / "B" / "..")
    assert "-ud-{train,dev,test}.conllu" in msg
    assert f"{root / 'no'}:" in _error(FileNotFoundError, split_files, root, {"train": "no"})
    assert "/none:" in _error(FileNotFoundError, split_files, tmp_path / "none")


# ============================================================ real files ==

@pytest.fixture(scope="module")
def real_glue(shared_data):
    return shared_data / "glue"


@pytest.mark.slow
def test_real_glue_counts(real_glue, tmp_path):
    expected = {("sst2", "SST-2"): (67349, 872), ("mrpc", "MRPC"): (3668, 408),
                ("stsb", "STS-B"): (5749, 1500)}
    for (task, folder), counts in expected.items():
        examples = [read_tsv(real_glue / folder / f, task)
                    for f in ("train.tsv", "dev.tsv")]
        assert tuple(map(len, examples)) == counts, task
        spec = GLUE_TASKS[task]
        for ex in examples[1]:
            assert ex["text_a"] and (ex["text_b"] != "") == (spec.text_b is not None)
        if spec.is_regression:
            assert all(0.0 <= ex["label"] <= 5.0 for ex in examples[0])
        else:
            assert {ex["label"] for ex in examples[0]} == {0, 1}
    # MRPC keeps the quote characters of its sentences (csv.QUOTE_NONE).
    dev = read_tsv(real_glue / "MRPC" / "dev.tsv", "mrpc")
    assert sum('"' in ex["text_a"] + ex["text_b"] for ex in dev) > 10
    # By split from the GLUE root (the task's folder inside it).
    for task, split, n in (("mrpc", "validation", 408), ("stsb", "train", 5749)):
        assert len(read_split(real_glue, task, split)) == n


@pytest.mark.slow
def test_real_ud_ewt(shared_data):
    splits = read_splits(split_files(shared_data / "ud_en_ewt"))
    counts = {split: len(sentences) for split, sentences in splits.items()}
    assert counts == {"train": 12544, "validation": 2001, "test": 2077}
    assert tag_vocabulary(s for split in splits.values() for s in split) == sorted(
        UPOS_TAGS)   # all 17 occur
    dev = read_conllu(shared_data / "ud_en_ewt" / "en_ewt-ud-dev.conllu")
    assert all(len(s["words"]) == len(s["tags"]) > 0 and s["sent_id"] for s in dev)
    assert set(tag_vocabulary(dev)) <= set(UPOS_TAGS)
    assert splits["validation"] == dev
