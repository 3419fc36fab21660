"""Greedy and beam search against exhaustive search and teacher forcing."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.evaluation.decoding import beam_search, greedy_search, transformer_search
from bert_jax.modeling import Transformer, TransformerConfig

from tiny_models import random_variables

# Vocabulary 0 pad, 1 bos, 2 eos, 3..5 words: small enough to enumerate.
CONFIG = TransformerConfig(hidden_size=16, num_heads=2, mlp_dim=32, num_layers=1,
                           max_len=8, vocab_size=6, dropout_rate=0.0)
MAX_LENGTH = 4


@pytest.fixture(scope="module")
def setup():
    inputs = jnp.array([[3, 4, 5, 2], [5, 3, 2, 0], [4, 4, 2, 0]], jnp.int32)
    # Large weights make the distributions peaked and the searches disagree.
    variables = random_variables(Transformer(CONFIG), inputs, inputs, seed=3, scale=0.8)
    return inputs, variables["params"]


def sequence_logprob(params, inputs, targets):
    """log p(targets | inputs) by teacher forcing; targets `[batch, length]`."""
    logits = Transformer(CONFIG).apply({"params": params}, inputs, targets)
    log_probs = jax.nn.log_softmax(logits)
    picked = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    return (picked * (targets != CONFIG.pad_id)).sum(-1)


@pytest.mark.slow
def test_beam_one_equals_greedy(setup):
    inputs, params = setup
    model = Transformer(CONFIG, incremental=True)
    greedy, _ = transformer_search(model, params, inputs, max_length=MAX_LENGTH)
    step = jax.jit(lambda p, x: transformer_search(model, p, x, max_length=MAX_LENGTH,
                                                   beam_size=1)[0])
    np.testing.assert_array_equal(step(params, inputs), greedy)
    # beam_search itself with K=1 (transformer_search routes K=1 to greedy).
    from bert_jax.evaluation import decoding
    encoded = model.apply({"params": params}, inputs, method=model.encode)
    shapes = jax.eval_shape(lambda: model.init(
        jax.random.PRNGKey(0), inputs, jnp.zeros((3, MAX_LENGTH), jnp.int32)))["cache"]
    cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    def one_step(tokens, cache):
        logits, v = model.apply({"params": params, "cache": cache}, encoded, inputs, tokens,
                                method=model.decode, mutable=["cache"])
        return logits[:, -1], v["cache"]

    beams, _ = decoding.beam_search(one_step, cache, 3, 1, MAX_LENGTH, CONFIG.bos_id,
                                    CONFIG.eos_id)
    np.testing.assert_array_equal(beams[:, 0], greedy)


@pytest.mark.slow
def test_greedy_takes_the_argmax_of_teacher_forced_logits(setup):
    inputs, params = setup
    greedy, _ = transformer_search(Transformer(CONFIG, incremental=True), params, inputs,
                                   max_length=MAX_LENGTH)
    logits = Transformer(CONFIG).apply({"params": params}, inputs, greedy)
    for row, tokens in enumerate(np.asarray(greedy)):
        for t, token in enumerate(tokens):
            if t > 0 and tokens[t - 1] in (CONFIG.eos_id, CONFIG.pad_id):
                assert token == CONFIG.pad_id
                continue
            allowed = np.asarray(logits[row, t]).copy()
            allowed[[CONFIG.pad_id, CONFIG.bos_id]] = -np.inf
            assert token == int(np.argmax(allowed))


def all_finished_sequences():
    """Every sequence of 1..MAX_LENGTH tokens that ends with EOS."""
    for length in range(1, MAX_LENGTH + 1):
        for words in itertools.product(range(3, 6), repeat=length - 1):
            yield list(words) + [CONFIG.eos_id] + [0] * (MAX_LENGTH - length)


# 3^3 live prefixes x 4 extensions at the last step: with this many beams every
# extension, EOS ones included, ranks among the best K, so the search is exhaustive.
WIDE = 108


@pytest.mark.slow
@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_wide_beam_finds_the_exhaustive_best(setup, alpha):
    inputs, params = setup
    candidates = jnp.array(list(all_finished_sequences()), jnp.int32)  # [n, T]
    lengths = (candidates != 0).sum(-1)
    best, (beams, scores) = transformer_search(
        Transformer(CONFIG, incremental=True), params, inputs, max_length=MAX_LENGTH,
        beam_size=WIDE, alpha=alpha)
    for row in range(inputs.shape[0]):
        logprob = sequence_logprob(params, jnp.repeat(inputs[row:row + 1],
                                                      len(candidates), 0), candidates)
        normalised = logprob / ((5.0 + lengths) / 6.0) ** alpha
        expected = int(jnp.argmax(normalised))
        np.testing.assert_array_equal(best[row], candidates[expected])
        np.testing.assert_allclose(scores[row, 0], normalised[expected], rtol=1e-5)
        # All 40 finished sequences are found, sorted, scored as the model says.
        found = np.asarray(scores[row]) > -1e8
        assert found.sum() == len(candidates)
        assert np.all(np.diff(np.asarray(scores[row])[found]) <= 1e-6)
        beam_logprob = sequence_logprob(params, jnp.repeat(inputs[row:row + 1], WIDE, 0),
                                        beams[row])
        beam_lengths = (beams[row] != 0).sum(-1)
        np.testing.assert_allclose(
            (beam_logprob / ((5.0 + beam_lengths) / 6.0) ** alpha)[found],
            np.asarray(scores[row])[found], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_search_on_a_toy_step_function():
    """A hand-made distribution where greedy is wrong and beam search is right:
    p(a)=0.6 then p(eos|a)=0.5; p(b)=0.4 then p(eos|b)=1.0."""
    a, b, eos = 3, 4, 2
    table = np.full((6, 6), -1e9, np.float32)  # [previous token, next token]
    table[1, a], table[1, b] = np.log(0.6), np.log(0.4)
    table[a, eos], table[a, b] = np.log(0.5), np.log(0.5)
    table[b, eos] = 0.0

    def step(tokens, cache):
        return jnp.asarray(table)[tokens[:, 0]], cache

    greedy = greedy_search(step, (), 1, 3, bos_id=1, eos_id=eos)
    assert greedy.tolist() == [[a, eos, 0]]  # probability 0.3
    beams, scores = beam_search(step, (), 1, 2, 3, bos_id=1, eos_id=eos)
    assert beams[0, 0].tolist() == [b, eos, 0]  # probability 0.4
    np.testing.assert_allclose(np.exp(scores[0]), [0.4, 0.3], rtol=1e-6)
