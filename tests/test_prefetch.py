"""Host-to-device prefetch returns the pipeline's batches, in order, on the
devices, ahead of time, and checkpoints the position of the last batch returned."""

import jax
import numpy as np
import pytest

from bert_jax.data.pipeline import train_iterator
from tiny_models import translation_preprocess
from bert_jax.training.prefetch import DevicePrefetch
from bert_jax.training.sharding import global_batch, make_mesh

SOURCE = [{"inputs": np.full(3 + i % 5, 3 + i, np.int32),
           "targets": np.full(2 + i % 4, 3 + i, np.int32)} for i in range(50)]


def _pipeline():
    return train_iterator(SOURCE, global_batch_size=8, seed=0, process_index=0,
                          process_count=1, preprocess=translation_preprocess,
                          max_length=8, prefetch=0)


@pytest.mark.parametrize("size", [0, 1, 3])
def test_device_prefetch_is_transparent_and_resumes_exactly(size):
    mesh = make_mesh((-1, 1, 1))
    transfers = []

    def to_device(batch):
        transfers.append(batch["inputs"][0, 0])
        return global_batch(batch, mesh)

    reference = _pipeline()
    expected = [next(reference) for _ in range(10)]
    it = DevicePrefetch(_pipeline(), to_device, size)
    for k in range(4):
        batch = next(it)
        assert isinstance(batch["inputs"], jax.Array)
        assert batch["inputs"].sharding.mesh.shape == mesh.shape
        np.testing.assert_array_equal(np.asarray(batch["inputs"]), expected[k]["inputs"])
        assert len(transfers) == k + 1 + size  # `size` batches already on the devices
    state = it.get_state()
    assert state["step"] == 4  # the last batch returned, not the last transferred
    resumed = DevicePrefetch(_pipeline(), to_device, size)
    resumed.set_state(state)
    for k in range(4, 10):
        np.testing.assert_array_equal(np.asarray(next(resumed)["targets"]),
                                      expected[k]["targets"])
    it.set_state(state)  # rewinding drops the batches in flight
    np.testing.assert_array_equal(np.asarray(next(it)["inputs"]), expected[4]["inputs"])
    it.close()
    resumed.close()


def test_negative_size_is_refused():
    with pytest.raises(ValueError, match="size.*-1"):
        DevicePrefetch(_pipeline(), lambda b: b, -1)
