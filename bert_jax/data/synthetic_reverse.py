"""`synthetic_reverse`: a tiny built-in parallel corpus for smoke tests.

Each example is `inputs`: random token ids in `[3, vocab_size)` of random
length in `[min_length, max_length]`, and `targets`: the same ids reversed,
followed by `EOS_ID` (2). Ids 0 (pad), 1 (bos) and 2 (eos) never occur in
`inputs`. Nothing is downloaded; the data are a pure function of the config.

Every parameter is part of the config *name*, and tfds stores each config in
its own folder `data_dir/synthetic_reverse/<config name>/<version>/`, so a
dataset built with other parameters is never silently reused:

    builder = SyntheticReverse(data_dir=d)                      # defaults
    builder = SyntheticReverse(data_dir=d, vocab_size=64, num_train=64)
    builder = tfds.builder("synthetic_reverse/v64_len4-12_train64_val200_seed0",
                           data_dir=d)                          # same as above

`train` and `validation` are drawn from different random streams, and a
validation example whose `inputs` also occur in `train` is redrawn, so the
splits are disjoint by construction.
"""

from __future__ import annotations

import dataclasses
import re
import threading

import numpy as np
import tensorflow_datasets as tfds
from etils import epath

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
FIRST_TOKEN_ID = 3  # first id that is neither pad, bos nor eos

_NAME_RE = re.compile(
    r"^v(?P<vocab_size>\d+)_len(?P<min_length>\d+)-(?P<max_length>\d+)"
    r"_train(?P<num_train>\d+)_val(?P<num_validation>\d+)_seed(?P<seed>\d+)$")


@dataclasses.dataclass(eq=False)
class SyntheticReverseConfig(tfds.core.BuilderConfig):
    """Parameters of `synthetic_reverse`; build instances with `reverse_config`."""

    vocab_size: int = 32
    min_length: int = 4
    max_length: int = 12
    num_train: int = 2000
    num_validation: int = 200
    seed: int = 0


_CONFIGS: dict[str, SyntheticReverseConfig] = {}
_CONFIGS_LOCK = threading.Lock()


def config_name(*, vocab_size: int, min_length: int, max_length: int,
                num_train: int, num_validation: int, seed: int) -> str:
    return (f"v{vocab_size}_len{min_length}-{max_length}"
            f"_train{num_train}_val{num_validation}_seed{seed}")


def reverse_config(*, vocab_size: int = 32, min_length: int = 4,
                   max_length: int = 12, num_train: int = 2000,
                   num_validation: int = 200, seed: int = 0
                   ) -> SyntheticReverseConfig:
    """The (validated, interned) config for these parameters.

    Interned: equal parameters give the identical object, which tfds requires
    of a config that is also reachable by name.
    """
    params = dict(vocab_size=vocab_size, min_length=min_length,
                  max_length=max_length, num_train=num_train,
                  num_validation=num_validation, seed=seed)
    for field, value in params.items():
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise ValueError(f"synthetic_reverse: {field} must be an int, got {value!r}")
        if value < 0:
            raise ValueError(f"synthetic_reverse: {field} must be >= 0, got {value}")
    params = {k: int(v) for k, v in params.items()}
    if params["vocab_size"] <= FIRST_TOKEN_ID:
        raise ValueError(
            f"synthetic_reverse: vocab_size={vocab_size} leaves no token ids; ids "
            f"0, 1, 2 are pad, bos, eos, so vocab_size must be > {FIRST_TOKEN_ID}.")
    if not 1 <= params["min_length"] <= params["max_length"]:
        raise ValueError(
            f"synthetic_reverse: need 1 <= min_length <= max_length, got "
            f"min_length={min_length}, max_length={max_length}.")
    name = config_name(**params)
    with _CONFIGS_LOCK:
        if name not in _CONFIGS:
            _CONFIGS[name] = SyntheticReverseConfig(
                name=name, description=f"synthetic_reverse with {params}", **params)
        return _CONFIGS[name]


def _random_inputs(rng: np.random.Generator, cfg: SyntheticReverseConfig) -> np.ndarray:
    length = int(rng.integers(cfg.min_length, cfg.max_length + 1))
    return rng.integers(FIRST_TOKEN_ID, cfg.vocab_size, size=length, dtype=np.int32)


def generate_inputs(cfg: SyntheticReverseConfig, split: str) -> list[np.ndarray]:
    """The `inputs` of every example of `split`, in generation order."""
    if split == "train":
        rng = np.random.default_rng([cfg.seed, 0])
        return [_random_inputs(rng, cfg) for _ in range(cfg.num_train)]
    if split == "validation":
        seen = {x.tobytes() for x in generate_inputs(cfg, "train")}
        rng = np.random.default_rng([cfg.seed, 1])
        out = []
        attempts = 0
        while len(out) < cfg.num_validation:
            attempts += 1
            if attempts > 100 * (cfg.num_validation + 1):
                raise ValueError(
                    f"synthetic_reverse {cfg.name}: cannot draw {cfg.num_validation} "
                    "validation examples disjoint from train; use a larger "
                    "vocab_size or max_length.")
            x = _random_inputs(rng, cfg)
            if x.tobytes() not in seen:
                out.append(x)
        return out
    raise ValueError(f"synthetic_reverse has no split {split!r}")


def make_example(inputs: np.ndarray) -> dict[str, np.ndarray]:
    targets = np.concatenate([inputs[::-1], np.array([EOS_ID], np.int32)])
    return {"inputs": np.asarray(inputs, np.int32), "targets": targets.astype(np.int32)}


class SyntheticReverse(tfds.core.GeneratorBasedBuilder):
    """Reverse a random token sequence and append EOS (see module docstring)."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}
    BUILDER_CONFIGS = [reverse_config()]
    # tfds 4.9.10 computes the default `code_path` through `importlib_resources`
    # (a backport that it declares only for Python < 3.9, so it is missing
    # here) and fails with ModuleNotFoundError; the path is plain to give.
    code_path = epath.Path(__file__)

    def __init__(self, *, config=None, vocab_size: int | None = None,
                 min_length: int | None = None, max_length: int | None = None,
                 num_train: int | None = None, num_validation: int | None = None,
                 seed: int | None = None, **kwargs):
        """`config` (a name or a config) or keyword parameters, not both."""
        params = {k: v for k, v in dict(
            vocab_size=vocab_size, min_length=min_length, max_length=max_length,
            num_train=num_train, num_validation=num_validation, seed=seed,
        ).items() if v is not None}
        if params:
            if config is not None:
                raise ValueError(
                    "synthetic_reverse: pass either config= or the parameters "
                    f"{sorted(params)}, not both.")
            config = reverse_config(**params)
        super().__init__(config=config, **kwargs)

    @classmethod
    def get_builder_config(cls, name, version=None):
        """Also resolves any name of the form `reverse_config` produces."""
        found = super().get_builder_config(name, version)
        if found is None and (m := _NAME_RE.match(name)):
            found = reverse_config(**{k: int(v) for k, v in m.groupdict().items()})
        return found

    def _info(self) -> tfds.core.DatasetInfo:
        ids = tfds.features.Tensor(shape=(None,), dtype=np.int32)
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict({"inputs": ids, "targets": ids}),
            supervised_keys=("inputs", "targets"),
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # nothing to download
        # tfds cannot write a split with no examples, so an empty one is left out.
        cfg = self.builder_config
        sizes = {"train": cfg.num_train, "validation": cfg.num_validation}
        return {split: self._generate_examples(split)
                for split, size in sizes.items() if size > 0}

    def _generate_examples(self, split: str):
        for i, inputs in enumerate(generate_inputs(self.builder_config, split)):
            yield i, make_example(inputs)
