"""Data: the synthetic_reverse corpus, load_source and the grain pipelines."""

import collections
import json
import logging
import os
import re
import subprocess
import sys
import textwrap
import time

import grain
import numpy as np
import pytest

from bert_jax.data import (
    eval_batches, load_source, num_filtered, synthetic_reverse, train_iterator)
from bert_jax.data.pipeline import shuffle_seed
from bert_jax.errors import DataError
from bert_jax.data.synthetic_reverse import EOS_ID, FIRST_TOKEN_ID
from tiny_models import translation_preprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = dict(num_train=64, num_validation=20)  # max_length 12 -> targets <= 13


@pytest.fixture(scope="session")
def train_source():
    return load_source("synthetic_reverse", "train", **SMALL)


@pytest.fixture(scope="session")
def val_source():
    return load_source("synthetic_reverse", "validation", **SMALL)


def _key(inputs) -> bytes:
    inputs = np.asarray(inputs)
    return inputs[inputs != 0].astype(np.int32).tobytes()


def _train(source, **kw):
    args = dict(global_batch_size=8, seed=0, process_index=0, process_count=1,
                preprocess=translation_preprocess, max_length=13)
    args.update(kw)
    return train_iterator(source, **args)


def _take(it, n):
    return [next(it) for _ in range(n)]


def _assert_batches_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])


def _run_python(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=REPO)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------- synthetic_reverse --

@pytest.mark.slow
def test_generate_and_read_without_tensorflow():
    result = _run_python("""
        import sys
        from bert_jax.data import eval_batches, load_source, train_iterator
        train = load_source("synthetic_reverse", "train", num_train=16, num_validation=4)
        val = load_source("synthetic_reverse", "validation", num_train=16, num_validation=4)
        assert (len(train), len(val)) == (16, 4)
        it = train_iterator(train, global_batch_size=4, seed=0, process_index=0,
                            process_count=1, preprocess=dict, max_length=13)
        assert next(it)["targets"].shape == (4, 13)
        ev = eval_batches(train, global_batch_size=4, process_index=0,
                          process_count=1, max_length=13, preprocess=dict)
        assert next(ev)["inputs"].shape == (4, 13)
        print("TF_LOADED", "tensorflow" in sys.modules)
        # `it` (a prefetching thread) and `ev` stay alive until exit: that
        # must not abort the interpreter (grain's ThreadPrefetch would).
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "TF_LOADED False" in result.stdout, result.stdout
    assert "terminate called" not in result.stderr
    assert "Exception ignored" not in result.stderr, result.stderr[-3000:]


def test_targets_are_reversed_inputs_plus_eos(train_source, val_source):
    assert (len(train_source), len(val_source)) == (64, 20)
    for source in (train_source, val_source):
        for i in range(len(source)):
            ex = source[i]
            inputs, targets = ex["inputs"], ex["targets"]
            assert inputs.dtype == targets.dtype == np.int32
            assert 4 <= len(inputs) <= 12   # the default min_length, max_length
            assert inputs.min() >= FIRST_TOKEN_ID and inputs.max() < 32   # vocab_size
            np.testing.assert_array_equal(targets, np.append(inputs[::-1], EOS_ID))


def test_train_and_validation_are_disjoint(train_source, val_source):
    train = {_key(train_source[i]["inputs"]) for i in range(len(train_source))}
    val = {_key(val_source[i]["inputs"]) for i in range(len(val_source))}
    assert not train & val


def test_the_examples_and_their_order_are_those_of_the_former_tfds_builder():
    """The first examples the tfds builder (commit 8f5ff60) stored for these
    parameters: generation order shuffled by tfds's hash of the keys."""
    splits = synthetic_reverse.generate(num_train=64, num_validation=16, seed=3)
    assert [x["inputs"].tolist() for x in splits["train"][:2]] == [
        [9, 15, 5, 28, 13], [17, 24, 10, 16, 7, 21, 14, 22, 31, 13]]
    assert [x["inputs"].tolist() for x in splits["validation"][:2]] == [
        [21, 30, 21, 3, 19, 10, 19], [11, 9, 8, 23, 8]]


def test_parameters_give_their_own_data_deterministically(train_source):
    assert synthetic_reverse.generate(**SMALL)["train"] is train_source   # cached
    other = load_source("synthetic_reverse", "train", seed=1, **SMALL)
    assert ({_key(other[i]["inputs"]) for i in range(64)}
            != {_key(train_source[i]["inputs"]) for i in range(64)})
    synthetic_reverse.generate.cache_clear()
    again = load_source("synthetic_reverse", "train", "/data/dir/is/ignored", **SMALL)
    assert again is not train_source
    for i in range(len(train_source)):
        np.testing.assert_array_equal(again[i]["inputs"], train_source[i]["inputs"])


@pytest.mark.parametrize("params, match", [
    (dict(vocab_size=3), "vocab_size"),
    (dict(min_length=5, max_length=4), "min_length"),
    (dict(num_train=-1), "num_train"),
    (dict(seed=1.5), "seed"),
    (dict(vocab_size=4, min_length=1, max_length=1, num_train=1, num_validation=1),
     "num_validation"),
])
def test_parameters_are_validated(params, match):
    with pytest.raises(DataError, match=f"^synthetic_reverse: {match}=") as error:
        synthetic_reverse.generate(**params)
    assert error.value.path == "synthetic_reverse"


def test_splits_slices_and_their_errors(train_source):
    first = load_source("synthetic_reverse", "train[:5]", **SMALL)
    assert [_key(x["inputs"]) for x in first] == [_key(train_source[i]["inputs"])
                                                  for i in range(5)]
    assert len(load_source("synthetic_reverse", "train[-4:]", **SMALL)) == 4
    with pytest.raises(DataError, match=r"synthetic_reverse.* 'train\[:0\]'"):
        load_source("synthetic_reverse", "train[:0]", **SMALL)
    with pytest.raises(DataError, match=r"synthetic_reverse.* 'validation'"):
        load_source("synthetic_reverse", "validation", num_train=8, num_validation=0)
    with pytest.raises(DataError, match=r"'test'.*\['train', 'validation'\]"):
        load_source("synthetic_reverse", "test", **SMALL)
    assert len(load_source("synthetic_reverse", "train", num_train=8, num_validation=0)) == 8


# ------------------------------------------------------------ tfds datasets --

def _corpus(folder, train_lines: int, validation_lines: int) -> str:
    """A parallel_text corpus of `src`/`tgt` files (line i: i, and i reversed)."""
    folder.mkdir()
    for stem, n in (("train", train_lines), ("val", validation_lines)):
        (folder / f"{stem}.src").write_text("".join(f"{i}\n" for i in range(n)))
        (folder / f"{stem}.tgt").write_text("".join(f"{str(i)[::-1]}\n" for i in range(n)))
    return str(folder)


def test_tfds_split_errors_name_the_dataset(tmp_path):
    corpus = dict(path=_corpus(tmp_path / "corpus", 8, 2), source_language="src",
                  target_language="tgt")
    data_dir = tmp_path / "tfds"
    assert len(load_source("parallel_text", "train[:3]", data_dir, **corpus)) == 3
    with pytest.raises(DataError, match=r"'train\[:0\]'") as error:
        load_source("parallel_text", "train[:0]", data_dir, **corpus)
    assert re.fullmatch(r"dataset parallel_text/corpus_src-tgt_\w+/1.0.0", error.value.path)
    with pytest.raises(DataError, match=r"'test'.*\['train', 'validation'\]"):
        load_source("parallel_text", "test", data_dir, **corpus)


@pytest.mark.slow
def test_concurrent_prepare_builds_once(tmp_path):
    # Processes start building at the same instant; the build takes ~0.3 s.
    # Without the lock all but one fail (tfds cannot rename onto the folder
    # the first one renamed into place).
    corpus = _corpus(tmp_path / "corpus", 3000, 30)
    start_at = time.time() + 2.0
    code = f"""
        import time
        from bert_jax.data import load_source
        time.sleep(max(0.0, {start_at} - time.time()))
        s = load_source("parallel_text", "train", {str(tmp_path / "tfds")!r},
                        path={corpus!r}, source_language="src", target_language="tgt")
        print("FIRST", s[1]["source"], len(s))
    """
    env = dict(os.environ, PYTHONPATH=REPO)
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = [p.communicate(timeout=60) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    firsts = {line for out, _ in outs for line in out.splitlines() if line.startswith("FIRST")}
    assert firsts == {"FIRST b'1' 3000"}, firsts
    # One config, one version folder, no leftover incomplete folders.
    (config_dir,) = (tmp_path / "tfds" / "parallel_text").iterdir()
    assert sorted(p.name for p in config_dir.iterdir()) == ["1.0.0"]


# ------------------------------------------------------------------- train --

def test_train_batches_shapes_dtypes_padding(train_source):
    by_key = {_key(train_source[i]["inputs"]): train_source[i] for i in range(64)}
    it = _train(train_source, max_length=16)
    for batch in _take(it, 5):
        assert set(batch) == {"inputs", "targets"}
        for v in batch.values():
            assert v.shape == (8, 16) and v.dtype == np.int32
        for inputs, targets in zip(batch["inputs"], batch["targets"]):
            ex = by_key[_key(inputs)]  # every row is a real example...
            n, m = len(ex["inputs"]), len(ex["targets"])
            np.testing.assert_array_equal(inputs[:n], ex["inputs"])
            np.testing.assert_array_equal(targets[:m], ex["targets"])
            assert not inputs[n:].any() and not targets[m:].any()  # ...padded with 0


def test_train_is_deterministic_in_seed(train_source):
    a = _take(_train(train_source, seed=3), 10)
    _assert_batches_equal(a, _take(_train(train_source, seed=3, prefetch=0), 10))
    b = _take(_train(train_source, seed=4), 10)
    assert any(not np.array_equal(x["inputs"], y["inputs"]) for x, y in zip(a, b))
    assert shuffle_seed(0) + 1 != shuffle_seed(1)  # nearby seeds share no epoch order


def test_train_reshuffles_every_epoch(train_source):
    everything = collections.Counter(_key(train_source[i]["inputs"]) for i in range(64))
    it = _train(train_source)  # 8 steps of 8 = one epoch; max_length 13 drops nothing
    epochs = []
    for _ in range(3):
        keys = [_key(row) for b in _take(it, 8) for row in b["inputs"]]
        assert collections.Counter(keys) == everything  # each example once per epoch
        epochs.append(keys)
    assert epochs[0] != epochs[1] and epochs[1] != epochs[2]
    assert num_filtered(it) == 0


@pytest.mark.parametrize("max_length", [13, 11])  # 11 drops examples
def test_global_batch_is_independent_of_process_count(train_source, max_length):
    it = _train(train_source, global_batch_size=8, max_length=max_length)
    one = _take(it, 12)
    assert (num_filtered(it) > 0) == (max_length < 13)
    for count in (2, 4):
        its = [_train(train_source, global_batch_size=8, max_length=max_length,
                      process_index=p, process_count=count) for p in range(count)]
        for step, reference in enumerate(one):
            locals_ = [next(it) for it in its]
            assert all(b["inputs"].shape == (8 // count, max_length) for b in locals_)
            joined = {k: np.concatenate([b[k] for b in locals_]) for k in reference}
            _assert_batches_equal([joined], [reference])


def test_scalar_features_and_per_feature_lengths(train_source):
    def preprocess(ex):
        return {**translation_preprocess(ex), "label": len(ex["inputs"]) % 2,
                "score": np.float64(len(ex["inputs"]))}

    it = _train(train_source, preprocess=preprocess,
                max_length={"inputs": 12, "targets": 14})
    batch = next(it)
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == {
        "inputs": ((8, 12), np.int32), "targets": ((8, 14), np.int32),
        "label": ((8,), np.int32), "score": ((8,), np.float32)}
    np.testing.assert_array_equal(batch["score"], (batch["inputs"] != 0).sum(1))
    with pytest.raises(ValueError, match="'targets'"):
        next(_train(train_source, max_length={"inputs": 12}, prefetch=0))


def test_train_rejects_bad_layout(train_source):
    with pytest.raises(ValueError, match="process_count=3"):
        _train(train_source, global_batch_size=8, process_count=3)
    with pytest.raises(ValueError, match="process_index"):
        _train(train_source, process_index=2, process_count=2)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_get_state_set_state_resumes_exactly(train_source, prefetch):
    it = _train(train_source, max_length=11, prefetch=prefetch)
    _take(it, 7)
    state = json.loads(json.dumps(it.get_state()))  # JSON-serialisable
    assert state["step"] == 7 and len(state["consumed"]) == len(state["filtered"]) == 8
    expected = _take(it, 12)  # crosses an epoch boundary
    fresh = _train(train_source, max_length=11, prefetch=prefetch)
    _take(fresh, 2)  # a used iterator resumes just as well
    fresh.set_state(state)
    _assert_batches_equal(_take(fresh, 12), expected)
    assert fresh.get_state() == it.get_state()
    # Rewinding the same iterator works too.
    it.set_state(state)
    _assert_batches_equal(_take(it, 12), expected)


def test_set_state_refuses_other_settings(train_source):
    state = _train(train_source).get_state()
    with pytest.raises(ValueError, match="seed=0 vs 1"):
        _train(train_source, seed=1).set_state(state)
    with pytest.raises(ValueError, match="process_count"):
        _train(train_source, global_batch_size=8, process_count=2).set_state(state)


def test_orbax_checkpoint_manager_round_trip(train_source, tmp_path):
    import orbax.checkpoint as ocp

    it = _train(train_source, max_length=11)
    _take(it, 5)
    tree = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "step": np.array(5, np.int32)}
    with ocp.CheckpointManager(tmp_path / "ckpt", item_names=("state", "data")) as mngr:
        mngr.save(5, args=ocp.args.Composite(
            state=ocp.args.StandardSave(tree), data=grain.checkpoint.CheckpointSave(it)))
        mngr.wait_until_finished()
    expected = _take(it, 6)

    fresh = _train(train_source, max_length=11)
    with ocp.CheckpointManager(tmp_path / "ckpt", item_names=("state", "data")) as mngr:
        assert mngr.latest_step() == 5
        restored = mngr.restore(5, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(tree), data=grain.checkpoint.CheckpointRestore(fresh)))
    np.testing.assert_array_equal(restored["state"]["w"], tree["w"])
    assert restored["data"] is fresh
    _assert_batches_equal(_take(fresh, 6), expected)


# ------------------------------------------------------------- filtering --

def _indexed_source(lengths):
    """Example i: inputs [i + 3] * lengths[i] (its index readable from any row)."""
    return [{"inputs": np.full(n, i + 3, np.int32),
             "targets": np.append(np.full(n, i + 3, np.int32), EOS_ID).astype(np.int32)}
            for i, n in enumerate(lengths)]


def test_long_examples_are_dropped_and_counted(caplog):
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 9, size=40)  # targets 2..9 long
    max_length, g, seed, steps = 6, 4, 7, 25
    long = lengths + 1 > max_length
    source = _indexed_source(lengths)
    it = _train(source, global_batch_size=g, seed=seed, max_length=max_length)
    with caplog.at_level(logging.WARNING):
        batches = _take(it, steps)

    # Reference: row r takes the next fitting example of positions r, r+g, ...
    order = grain.MapDataset.range(40).shuffle(seed=shuffle_seed(seed)).repeat()
    cursors, skipped = [0] * g, 0
    for batch in batches:
        for r in range(g):
            while long[order[cursors[r] * g + r]]:
                cursors[r] += 1
                skipped += 1
            assert batch["inputs"][r, 0] - 3 == order[cursors[r] * g + r]
            cursors[r] += 1
        assert (batch["targets"] == EOS_ID).sum() == g  # every row fits, with its EOS
    assert skipped > 0 and num_filtered(it) == skipped
    assert any("dropped" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------- packing --

def _unpack(batch, r):
    """Row r of a packed batch -> [(inputs, targets)] of its examples."""
    examples = []
    for segment in range(1, batch["inputs_segmentation"][r].max() + 1):
        pair = []
        for key in ("inputs", "targets"):
            where = batch[f"{key}_segmentation"][r] == segment
            np.testing.assert_array_equal(batch[f"{key}_positions"][r][where],
                                          np.arange(where.sum()))
            assert (np.diff(np.flatnonzero(where)) == 1).all()  # contiguous
            pair.append(batch[key][r][where])
        examples.append(tuple(pair))
    return examples


def test_packing_reads_each_row_stream_in_order():
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 12, size=60)  # targets 2..12 long
    max_length, pack_length, g, seed = 10, 24, 4, 3
    long = lengths + 1 > max_length
    source = _indexed_source(lengths)
    it = _train(source, global_batch_size=g, seed=seed, max_length=max_length,
                pack_length=pack_length)
    batches = _take(it, 12)
    order = grain.MapDataset.range(60).shuffle(seed=shuffle_seed(seed)).repeat()
    cursors, dropped, fill = [0] * g, 0, []
    for batch in batches:
        assert batch["inputs"].shape == batch["targets_positions"].shape == (g, pack_length)
        for r in range(g):
            examples = _unpack(batch, r)
            assert examples and (batch["inputs"][r] != 0).sum() == sum(
                len(x) for x, _ in examples)
            for inputs, targets in examples:
                while long[order[cursors[r] * g + r]]:
                    cursors[r] += 1
                    dropped += 1
                index = order[cursors[r] * g + r]
                np.testing.assert_array_equal(inputs, source[index]["inputs"])
                np.testing.assert_array_equal(targets, source[index]["targets"])
                cursors[r] += 1
            # Greedy: the stream's next example short enough did not fit (the
            # long ones before it are already read and dropped).
            while long[order[cursors[r] * g + r]]:
                cursors[r] += 1
                dropped += 1
            nxt = source[order[cursors[r] * g + r]]
            assert (len(nxt["targets"]) + (batch["targets"][r] != 0).sum() > pack_length
                    or len(nxt["inputs"]) + (batch["inputs"][r] != 0).sum() > pack_length)
        fill.append(np.mean(batch["targets"] != 0))
    assert dropped > 0 and num_filtered(it) == dropped
    assert np.mean(fill) > 0.6  # unpacked rows of max_length=10 are about half padding


@pytest.mark.slow
@pytest.mark.parametrize("prefetch", [0, 2])
def test_packing_resumes_exactly_and_ignores_process_count(train_source, prefetch):
    kw = dict(max_length=11, pack_length=40, prefetch=prefetch)
    it = _train(train_source, **kw)
    _take(it, 5)
    state = json.loads(json.dumps(it.get_state()))
    expected = _take(it, 6)
    fresh = _train(train_source, **kw)
    fresh.set_state(state)
    _assert_batches_equal(_take(fresh, 6), expected)
    halves = [_take(_train(train_source, process_index=p, process_count=2, **kw), 11)
              for p in range(2)]
    for k, batch in enumerate(_take(_train(train_source, **kw), 11)):
        _assert_batches_equal([batch], [{key: np.concatenate([halves[0][k][key],
                                                              halves[1][k][key]])
                                         for key in batch}])
    with pytest.raises(ValueError, match="pack_length"):
        _train(train_source, **dict(kw, pack_length=0)).set_state(state)


def test_packing_rejects_bad_settings(train_source):
    with pytest.raises(ValueError, match="pack_length=8"):
        _train(train_source, max_length=11, pack_length=8)
    scalar = lambda ex: {"inputs": np.asarray(ex["inputs"]), "label": np.int32(1)}
    it = _train(train_source, max_length=11, pack_length=20, preprocess=scalar,
                prefetch=0)
    with pytest.raises(ValueError, match="'label'"):
        next(it)


def test_eval_drops_long_examples_as_zero_rows():
    lengths = [3, 8, 2, 9, 4]
    ev = eval_batches(_indexed_source(lengths), global_batch_size=4, process_index=0,
                      process_count=1, preprocess=translation_preprocess, max_length=6)
    rows = np.concatenate([b["inputs"] for b in ev])
    np.testing.assert_array_equal(rows[:, 0], [3, 0, 5, 0, 7, 0, 0, 0])
    assert ev.num_filtered == 2


# -------------------------------------------------------------------- eval --

@pytest.mark.parametrize("global_batch_size", [8, 20, 32])
def test_eval_batches_cover_every_example_once(val_source, global_batch_size):
    per_process = [list(eval_batches(
        val_source, global_batch_size=global_batch_size, process_index=p,
        process_count=2, preprocess=translation_preprocess, max_length=13))
        for p in range(2)]
    num_batches = -(-20 // global_batch_size)
    assert [len(b) for b in per_process] == [num_batches, num_batches]
    rows = []
    for step in range(num_batches):
        for p in range(2):
            batch = per_process[p][step]
            assert {k: (v.shape, v.dtype) for k, v in batch.items()} == {
                k: ((global_batch_size // 2, 13), np.int32) for k in ("inputs", "targets")}
            rows.extend(zip(batch["inputs"], batch["targets"]))
    real = [(i, t) for i, t in rows if i.any()]
    assert len(rows) - len(real) == num_batches * global_batch_size - 20  # zero rows
    assert all(not t.any() for i, t in rows if not i.any())
    # In dataset order, each example exactly once.
    assert [_key(i) for i, _ in real] == [_key(val_source[j]["inputs"]) for j in range(20)]


def test_eval_batches_len_and_repeatable(val_source):
    kw = dict(global_batch_size=8, process_index=1, process_count=2,
              preprocess=translation_preprocess, max_length=13)
    ev = eval_batches(val_source, **kw)
    assert len(ev) == 3
    _assert_batches_equal(list(ev), list(eval_batches(val_source, **kw)))
