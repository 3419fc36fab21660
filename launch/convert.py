r"""Converts BERT weights between Hugging Face and bert_jax pretrained folders.

Import (Hugging Face folder with config.json + model.safetensors):
  python launch/convert.py --hf_dir=PATH --output=DIR
Export (a bert_jax pretrained folder back to Hugging Face format):
  python launch/convert.py --from_pretrained=DIR --hf_output=PATH
"""

from absl import app, flags, logging

import cli

from bert_jax.convert import load_hf_bert, load_pretrained, save_hf_bert, save_pretrained
from bert_jax.modeling.configs import BertConfig

_HF_DIR = flags.DEFINE_string("hf_dir", None, "Hugging Face BERT folder to import.")
_OUTPUT = flags.DEFINE_string("output", None, "bert_jax pretrained folder to write.")
_FROM_PRETRAINED = flags.DEFINE_string("from_pretrained", None,
                                       "bert_jax pretrained folder to export.")
_HF_OUTPUT = flags.DEFINE_string("hf_output", None, "Hugging Face folder to write.")


def main(argv):
    if _HF_DIR.value and _OUTPUT.value:
        config, params = load_hf_bert(_HF_DIR.value)
        save_pretrained(_OUTPUT.value, config, params)
        logging.info("imported %s -> %s (%d layers, hidden %d)", _HF_DIR.value,
                     _OUTPUT.value, config.num_layers, config.hidden_size)
    elif _FROM_PRETRAINED.value and _HF_OUTPUT.value:
        config, params = load_pretrained(_FROM_PRETRAINED.value)
        if not isinstance(config, BertConfig):
            raise app.UsageError(f"{_FROM_PRETRAINED.value} holds a "
                                 f"{type(config).__name__}, not a BERT model.")
        save_hf_bert(_HF_OUTPUT.value, config, params)
        logging.info("exported %s -> %s", _FROM_PRETRAINED.value, _HF_OUTPUT.value)
    else:
        raise app.UsageError("give --hf_dir and --output (import), or "
                             "--from_pretrained and --hf_output (export).")


if __name__ == "__main__":
    cli.run(main)
