r"""Builds a BERT and a Transformer, runs them, prints shapes and parameter counts.

  python launch/demo.py [--bert=base] [--transformer=base] [--batch=2] [--length=16]
"""

import time

import jax
import jax.numpy as jnp
from absl import flags

import cli

from bert_jax.modeling import (
    BertForPreTraining, Transformer, bert_preset, transformer_preset)

_BERT = flags.DEFINE_enum("bert", "base", ["tiny", "mini", "small", "medium", "base", "large"],
                          "BERT preset.")
_TRANSFORMER = flags.DEFINE_enum("transformer", "base", ["base", "big"], "Transformer preset.")
_BATCH = flags.DEFINE_integer("batch", 2, "Batch size.")
_LENGTH = flags.DEFINE_integer("length", 16, "Sequence length.")


def count(tree) -> int:
    return sum(x.size for x in jax.tree.leaves(tree))


def report(name: str, params, outputs, seconds: float) -> None:
    print(f"\n{name}: {count(params):,} parameters (init + forward {seconds:.1f}s)")
    for module, subtree in params.items():
        print(f"  {module:<20} {count(subtree):>13,}")
    for path, leaf in jax.tree_util.tree_flatten_with_path(outputs)[0]:
        print(f"  output{jax.tree_util.keystr(path):<33} {leaf.shape} {leaf.dtype}")


def main(argv):
    rng = jax.random.PRNGKey(0)
    batch, length = _BATCH.value, _LENGTH.value

    config = bert_preset(_BERT.value)
    ids = jax.random.randint(rng, (batch, length), 1, config.vocab_size)
    masked = jnp.tile(jnp.array([1, 3]), (batch, 1))  # MLM head only at these
    start = time.perf_counter()
    model = BertForPreTraining(config)
    params = jax.jit(model.init)(rng, ids, masked_positions=masked)["params"]
    out = jax.jit(model.apply)({"params": params}, ids, masked_positions=masked)
    jax.block_until_ready(out)
    report(f"BERT-{_BERT.value} (pretraining heads)", params,
           {"mlm_logits": out.mlm_logits, "nsp_logits": out.nsp_logits,
            "sequence_output": out.bert.sequence_output}, time.perf_counter() - start)

    config = transformer_preset(_TRANSFORMER.value)
    source = jax.random.randint(rng, (batch, length), 3, config.vocab_size)
    target = jax.random.randint(rng, (batch, length + 2), 3, config.vocab_size)
    start = time.perf_counter()
    model = Transformer(config)
    params = jax.jit(model.init)(rng, source, target)["params"]
    logits = jax.jit(model.apply)({"params": params}, source, target)
    jax.block_until_ready(logits)
    report(f"Transformer-{_TRANSFORMER.value}", params, {"logits": logits},
           time.perf_counter() - start)


if __name__ == "__main__":
    cli.run(main)
