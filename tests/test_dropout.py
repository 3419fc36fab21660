"""`modeling.dropout`: the keep mask drawn from bytes (or 16-bit halves) of random
words drops at the rounded rate, unbiased, independently between the elements a
word holds, the same wherever the mask is sharded; the module is flax's Dropout
with it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from bert_jax.modeling.dropout import Dropout, dropped, effective_rate, keep_mask

KEY = jax.random.PRNGKey(7)


@pytest.mark.parametrize("rate,expected", [(0.1, 26 / 256), (0.5, 0.5), (0.01, 655 / 65536),
                                           (0.3, 77 / 256), (0.999, 255 / 256)])
def test_the_rate_is_rounded_to_the_bits_it_is_drawn_from(rate, expected):
    assert effective_rate(rate) == expected
    keep = np.asarray(keep_mask(KEY, rate, (64, 256, 512)))
    dropped_share, n = 1.0 - keep.mean(), keep.size
    assert abs(dropped_share - expected) < 5 * np.sqrt(expected * (1 - expected) / n)


@pytest.mark.parametrize("prng,rate", [("rbg", 0.1), ("unsafe_rbg", 0.1), ("rbg", 0.6)])
def test_the_generators_words_drop_at_the_same_rate(prng, rate):
    """An `rbg` key compares a whole word per element with the threshold in its
    top bits (above 2**31 for rates over 1/2): the same rounded rate as threefry's
    bytes."""
    keep = np.asarray(keep_mask(jax.random.key(3, impl=prng), rate, (64, 256, 512)))
    p = effective_rate(rate)
    assert abs(1.0 - keep.mean() - p) < 5 * np.sqrt(p * (1 - p) / keep.size)


def test_dropout_is_unbiased_and_zero_where_dropped():
    values = jax.random.normal(jax.random.PRNGKey(1), (32, 128, 256))
    keep = keep_mask(KEY, 0.1, values.shape)
    out = np.asarray(dropped(values, keep, 0.1))
    assert (out[~np.asarray(keep)] == 0).all()
    np.testing.assert_allclose(out[np.asarray(keep)],
                               np.asarray(values)[np.asarray(keep)] / (1 - 26 / 256), rtol=1e-6)
    ones = np.asarray(dropped(jnp.ones((64, 256, 512)), keep_mask(KEY, 0.1, (64, 256, 512)),
                              0.1))
    assert abs(ones.mean() - 1.0) < 5 * np.sqrt(0.1 / 0.9 / ones.size)


@pytest.mark.parametrize("rate", [0.1, 0.01])
def test_the_elements_of_one_word_are_independent(rate):
    """Neighbours along the last axis share a random word: each pair is dropped
    together as often as two independent draws are."""
    keep = np.asarray(keep_mask(KEY, rate, (64, 256, 512)))
    both = (~keep[..., ::2] & ~keep[..., 1::2]).mean()
    p, n = effective_rate(rate), keep[..., ::2].size
    assert abs(both - p * p) < 5 * np.sqrt(p * p * (1 - p * p) / n)


def test_a_key_gives_one_mask_of_any_shape():
    shape = (3, 5, 7)   # a last axis that does not fill the words
    first = keep_mask(KEY, 0.2, shape)
    assert first.shape == shape and first.dtype == jnp.bool_
    np.testing.assert_array_equal(first, keep_mask(KEY, 0.2, shape))
    assert (np.asarray(first) != np.asarray(keep_mask(jax.random.PRNGKey(8), 0.2, shape))).any()


def test_the_mask_is_the_same_drawn_sharded():
    mesh = jax.make_mesh((len(jax.devices()),), ("data",))
    shape = (len(jax.devices()) * 2, 16, 64)
    sharded = jax.jit(lambda key: keep_mask(key, 0.1, shape),
                      out_shardings=NamedSharding(mesh, PartitionSpec("data")))(KEY)
    np.testing.assert_array_equal(sharded, keep_mask(KEY, 0.1, shape))


def test_the_module_is_the_identity_when_deterministic_or_rate_zero():
    x = jnp.arange(24.0).reshape(2, 3, 4)
    assert (Dropout(0.1).apply({}, x, deterministic=True) == x).all()
    assert (Dropout(0.0).apply({}, x, deterministic=False) == x).all()
    out = np.asarray(Dropout(0.5).apply({}, x.astype(jnp.bfloat16), deterministic=False,
                                        rngs={"dropout": KEY}), np.float32)
    dropped_out = out == 0
    assert 0 < dropped_out[1:].mean() < 1 and (out[~dropped_out] == 2 * x[~dropped_out]).all()
