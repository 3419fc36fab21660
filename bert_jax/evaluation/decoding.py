"""Greedy and beam search over an incremental decoder with a key/value cache.

Both take `step(tokens [n, 1], cache) -> (logits [n, vocab], cache)`. Cache
leaves with a leading dimension are per row; scalar leaves (step counters) are
shared. Beam search keeps K live and up to K finished hypotheses: of the best K
one-token extensions, those ending in EOS join the finished set, scored with
the GNMT length penalty `((5 + length) / 6) ** alpha` (Wu et al. 2016), the
others stay live. As an EOS extension finishes only when among the best K
(fairseq's rule), beam size 1 with alpha = 0 is exactly greedy search. The
search stops when no live hypothesis can beat the worst finished one, or at
`max_length`. Neither search generates `pad_id` or `bos_id`.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from bert_jax.modeling.layers import SCANNED_LAYERS

Array = jax.Array
StepFn = Callable[[Array, Any], tuple[Array, Any]]
NEG_INF = -1.0e9


def _forbid(logits: Array, *token_ids: int) -> Array:
    return logits.astype(jnp.float32).at[..., jnp.array(token_ids)].set(NEG_INF)


def length_penalty(length: Array, alpha: float) -> Array:
    return ((5.0 + length.astype(jnp.float32)) / 6.0) ** alpha


def greedy_search(step: StepFn, cache: Any, batch_size: int, max_length: int, bos_id: int,
                  eos_id: int, pad_id: int = 0) -> Array:
    """`[batch, max_length]` tokens, `pad_id` after EOS."""
    def body(state):
        i, tokens, cache, done = state
        previous = jax.lax.dynamic_slice_in_dim(tokens, i, 1, axis=1)
        logits, cache = step(previous, cache)
        best = _forbid(logits, pad_id, bos_id).argmax(-1).astype(tokens.dtype)
        token = jnp.where(done, pad_id, best)
        tokens = jax.lax.dynamic_update_slice_in_dim(tokens, token[:, None], i + 1, axis=1)
        return i + 1, tokens, cache, done | (token == eos_id)

    tokens = jnp.full((batch_size, max_length + 1), pad_id, jnp.int32).at[:, 0].set(bos_id)
    done = jnp.zeros((batch_size,), bool)
    _, tokens, _, _ = jax.lax.while_loop(
        lambda s: (s[0] < max_length) & ~jnp.all(s[3]), body,
        (jnp.array(0), tokens, cache, done))
    return tokens[:, 1:]


def _gather_beams(tree: Any, indices: Array, batch_size: int, beam_size: int) -> Any:
    """Picks beams: leaves `[batch * beam, ...]` reordered by `indices`
    `[batch, beam]`; scalars unchanged. Leaves under a `layers` key (the cache
    of scanned layers, `config.scan_layers`) carry a leading layer axis:
    `[layers, batch * beam, ...]`, or `[layers]` for per-layer scalars."""
    flat = (jnp.arange(batch_size)[:, None] * beam_size + indices).reshape(-1)

    def gather(path, x):
        axis = int(any(getattr(key, "key", None) == SCANNED_LAYERS for key in path))
        if x.ndim <= axis:
            return x
        return jnp.take(x, flat, axis=axis)
    return jax.tree_util.tree_map_with_path(gather, tree)


def beam_search(step: StepFn, cache: Any, batch_size: int, beam_size: int,
                max_length: int, bos_id: int, eos_id: int, alpha: float = 0.0,
                pad_id: int = 0) -> tuple[Array, Array]:
    """`step` runs `batch_size * beam_size` rows, example-major (row
    `b * beam_size + k` is beam k of example b). Returns sequences `[batch,
    beam, max_length]` (best first, EOS included, then `pad_id`) and their
    length-normalised scores `[batch, beam]` (unfinished hypotheses only where
    an example finished none)."""
    B, K, T = batch_size, beam_size, max_length
    live = jnp.full((B, K, T + 1), pad_id, jnp.int32).at[:, :, 0].set(bos_id)
    live_logprob = jnp.tile(jnp.array([0.0] + [NEG_INF] * (K - 1)), (B, 1))
    finished = jnp.full((B, K, T + 1), pad_id, jnp.int32)
    finished_score = jnp.full((B, K), NEG_INF)

    def not_done(state):
        i, _, live_logprob, _, finished_score, _ = state
        # The best a live hypothesis can still reach: its log-probability only
        # falls, and its length penalty grows at most to that of max_length.
        best_possible = live_logprob[:, 0] / length_penalty(jnp.array(T), alpha)
        if alpha == 0.0:
            best_possible = live_logprob[:, 0]
        can_improve = best_possible > finished_score[:, -1]
        return (i < T) & jnp.any(can_improve)

    def body(state):
        i, live, live_logprob, finished, finished_score, cache = state
        previous = jax.lax.dynamic_slice_in_dim(live, i, 1, axis=2).reshape(B * K, 1)
        logits, cache = step(previous, cache)
        log_probs = _forbid(jax.nn.log_softmax(logits.astype(jnp.float32)), pad_id, bos_id)
        log_probs = log_probs.reshape(B, K, -1)
        vocab = log_probs.shape[-1]
        candidates = (live_logprob[:, :, None] + log_probs).reshape(B, K * vocab)
        top_logprob, top_index = jax.lax.top_k(candidates, 2 * K)
        top_beam, top_token = top_index // vocab, (top_index % vocab).astype(jnp.int32)
        top_seqs = jnp.take_along_axis(live, top_beam[:, :, None], axis=1)
        top_seqs = jax.lax.dynamic_update_slice_in_dim(
            top_seqs, top_token[:, :, None], i + 1, axis=2)
        is_eos = top_token == eos_id

        # Finished: EOS extensions that rank among the best K candidates.
        rank = jnp.arange(2 * K)[None, :]
        new_score = jnp.where(is_eos & (rank < K),
                              top_logprob / length_penalty(i + 1, alpha), NEG_INF)
        all_scores = jnp.concatenate([finished_score, new_score], axis=1)
        all_seqs = jnp.concatenate([finished, top_seqs], axis=1)
        finished_score, keep = jax.lax.top_k(all_scores, K)
        finished = jnp.take_along_axis(all_seqs, keep[:, :, None], axis=1)

        # Live: the best K extensions that do not end in EOS.
        live_candidates = jnp.where(is_eos, NEG_INF, top_logprob)
        live_logprob, keep = jax.lax.top_k(live_candidates, K)
        live = jnp.take_along_axis(top_seqs, keep[:, :, None], axis=1)
        beams = jnp.take_along_axis(top_beam, keep, axis=1)
        cache = _gather_beams(cache, beams, B, K)
        return i + 1, live, live_logprob, finished, finished_score, cache

    _, live, live_logprob, finished, finished_score, _ = jax.lax.while_loop(
        not_done, body, (jnp.array(0), live, live_logprob, finished, finished_score, cache))
    # Examples that finished nothing fall back to their live hypotheses.
    none_finished = finished_score[:, :1] <= NEG_INF / 2
    sequences = jnp.where(none_finished[:, :, None], live, finished)
    scores = jnp.where(none_finished,
                       live_logprob / length_penalty(jnp.array(T), alpha), finished_score)
    return sequences[:, :, 1:], scores


def transformer_search(model, params: Any, inputs: Array, *, max_length: int,
                       beam_size: int = 1, alpha: float = 0.0) -> tuple[Array, Array]:
    """`inputs` `[batch, src_len]` through a `Transformer(config,
    incremental=True)`, greedy for `beam_size=1`: the best hypotheses `[batch,
    max_length]` and (beam search; greedy: None) all beams with their scores."""
    config = model.config
    config.check_length(max_length, "max_length")
    batch = inputs.shape[0]
    rows = batch * beam_size
    encoded = model.apply({"params": params}, inputs, method=model.encode)
    inputs = jnp.repeat(inputs, beam_size, axis=0)
    encoded = jnp.repeat(encoded, beam_size, axis=0)
    shapes = jax.eval_shape(lambda: model.init(
        jax.random.PRNGKey(0), inputs, jnp.zeros((rows, max_length), jnp.int32)))["cache"]
    cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    def step(tokens, cache):
        logits, variables = model.apply(
            {"params": params, "cache": cache}, encoded, inputs, tokens,
            method=model.decode, mutable=["cache"])
        return logits[:, -1], variables["cache"]

    if beam_size == 1:
        best = greedy_search(step, cache, batch, max_length, config.bos_id, config.eos_id,
                             config.pad_id)
        return best, None
    sequences, scores = beam_search(step, cache, batch, beam_size, max_length,
                                    config.bos_id, config.eos_id, alpha, config.pad_id)
    return sequences[:, 0], (sequences, scores)
