"""The rules a config must satisfy, declared in one place.

A config (`experiments/*.py`, `ml_collections.ConfigDict`) is checked here field
by field: `CHOICES` (the names a field may take), `AT_LEAST` (the smallest value
of a count), and the rules a table cannot state (`RULES`: ranges and rules
across fields, small named functions). `config_problems(config)` lists every broken rule, one line each,
naming the field, its value and the fix; `check_config(config)` raises them
together as one `ConfigError`. Each command that trains or compiles applies
them once, at its start: `launch/train.py`, `launch/compile.py`, and each run of
a sweep or transfer study (`analysis/sweeps/runner.py`); the trainer's
`training/validation.py` then checks what needs the task, the files or the
devices. The evaluation of a workdir's run (`launch/evaluate.py` and friends)
applies the task rules (`TASK_RULES`) to its saved config after the overrides,
with what evaluation may not change (`evaluation_problems`). The model dataclasses
(`modeling.configs`: `BertConfig`, `TransformerConfig`) check their own fields however
they are built, by `check_model` (`MODEL_FIELDS`, `MODEL_CHOICES`, the heads and the
vocabularies), and the lengths they take by `check_length`.

The modules that read a chosen name (the optimizer, the schedule, the dropout
generator, the attention kernel) read it as checked here: a direct caller's bad
name is a bug (`KeyError`). `choice` names a value given outside these tables
(the task and evaluator registries, the model presets, `input_lines`' `on_error`)
in the same one-line message. The name tuples live here, beside their rules. This
module imports only `bert_jax.errors` (and JAX within `platform`, for a rule on
'flash'), so every layer may use it.
"""

from __future__ import annotations

import collections
import math
import re
from typing import Any, Callable, Mapping, Sequence

from bert_jax.errors import ConfigError

DROPOUT_PRNGS = ("threefry", "rbg", "unsafe_rbg")   # jax.random's implementations
SCHEDULES = ("constant", "linear", "cosine", "rsqrt", "poly")
OPTIMIZERS = ("adamw", "lamb")
ATTENTION_IMPLS = ("einsum", "xla", "cudnn", "splash", "flash")  # modeling.fused_attention
FLASH_KERNELS = {"gpu": "cudnn", "cuda": "cudnn", "tpu": "splash", "cpu": "xla"}  # 'flash'
SPLASH_LANES = 128   # splash attention's lengths are multiples of it (modeling.splash)
POOLINGS = ("cls", "mean")  # config.head.pooling (modeling.bert)
MESH_AXES = ("data", "fsdp", "tensor")  # config.mesh.shape (training.sharding)
CONLL_FORMATS = ("conllu", "conll2003")  # config.data.format of tagging (data.conllu)
DOCUMENT_FORMATS = ("blank_lines", "paragraphs", "wikitext")  # data.pretraining_data

# field -> the names it may take (a field the config lacks is not checked).
CHOICES = {
    "train.dropout_prng": DROPOUT_PRNGS,
    "optimizer.schedule": SCHEDULES,
    "optimizer.name": OPTIMIZERS,
    "data.format": CONLL_FORMATS,
    "head.pooling": POOLINGS,
}
# field -> (its smallest value, what that value means).
AT_LEAST = {
    "train.num_steps": (1, ""), "train.log_every": (1, ""), "train.eval_every": (1, ""),
    "train.checkpoint_every": (1, ""), "train.grad_accum_steps": (1, ""),
    "data.max_length": (1, ""), "data.train_examples": (0, " (0: the whole training split)"),
}


def unknown(field: str, value: Any, choices: Sequence[str]) -> str:
    """The line for a name that is not among `choices`."""
    return f"{field}={value!r}: unknown; choose one of {list(choices)}."


def choice(field: str, value: Any, choices: Sequence[str]) -> Any:
    """`value` if it is one of `choices`, else a one-line `ConfigError` naming
    `field` (e.g. 'config.train.dropout_prng') and the choices."""
    if value not in choices:
        raise ConfigError(unknown(field, value, choices))
    return value


def mesh_shape(shape: Sequence[int], num_devices: int, field: str = "config.mesh.shape"
               ) -> tuple[int, ...]:
    """`config.mesh.shape` `(data, fsdp, tensor)` (or the field named) with its -1
    replaced by the devices left, checked to use exactly `num_devices` (a fact of
    the run, so the trainer checks it when it builds the mesh)."""
    given = shape = tuple(int(s) for s in shape)
    known = math.prod(s for s in shape if s != -1)
    problem = None
    if len(shape) != len(MESH_AXES):
        problem = f"must give sizes for {MESH_AXES}."
    elif shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
        problem = "sizes must be positive, with at most one -1 (the rest of the devices)."
    elif -1 in shape and num_devices % known:
        problem = f"{num_devices} devices are not divisible by {known}."
    else:
        shape = tuple(num_devices // known if s == -1 else s for s in shape)
        if math.prod(shape) != num_devices:
            problem = (f"{shape} uses {math.prod(shape)} devices but {num_devices} are "
                       "available; use -1 for one axis.")
    if problem:
        raise ConfigError(f"{field}={given}: {problem}")
    return shape


def profile_range(steps: Sequence[int | str] | None, field: str
                  ) -> tuple[int, int] | None:
    """`(start, end)` of a config or flag value (numbers or text; `field` names
    it, e.g. 'config.train.profile_steps'); empty: None."""
    if not steps:
        return None
    try:
        start, end = (int(step) for step in steps)
    except ValueError:  # not two numbers
        start, end = 0, 0
    if not 1 <= start <= end:
        raise ConfigError(f"{field}={tuple(steps)}: give (START, END) with "
                          "1 <= START <= END, e.g. (10, 12).")
    return start, end


def _get(config, path: str) -> Any:
    """`config.A.B` for 'A.B', None where a section or field is missing."""
    for key in path.split("."):
        config = config.get(key) if hasattr(config, "get") else None
    return config


def _warmup(config) -> list[str]:
    """`optimizer.warmup_steps` within the run, unless `warmup_fraction` (> 0)
    replaces it; the fraction in [0, 1)."""
    optimizer, steps = config.optimizer, config.train.num_steps
    fraction = optimizer.get("warmup_fraction", 0.0)
    problems = []
    if not fraction and not 0 <= optimizer.warmup_steps <= max(steps, 0):
        problems.append(f"config.optimizer.warmup_steps={optimizer.warmup_steps} is outside "
                        f"0..config.train.num_steps={steps}: lower warmup_steps or raise "
                        "num_steps.")
    if not 0 <= fraction < 1:
        problems.append(f"config.optimizer.warmup_fraction={fraction}: must "
                        "be in [0, 1) (0: use warmup_steps).")
    return problems


def _learning_rate(config) -> list[str]:
    rate = config.optimizer.learning_rate
    return ([f"config.optimizer.learning_rate={rate}: must not be negative."]
            if rate < 0 else [])


def _profile_steps(config) -> list[str]:
    """`train.profile_steps` (START, END) within the run."""
    steps, last = _get(config, "train.profile_steps"), _get(config, "train.num_steps")
    try:
        profile = profile_range(steps, "config.train.profile_steps")
    except ConfigError as e:
        return list(e.args)  # its message
    return [f"config.train.profile_steps={tuple(steps)}: the run ends at "
            f"config.train.num_steps={last}; profile steps within it."
            ] if profile and profile[1] > last else []


def _length_buckets(config) -> list[str]:
    """Fine-tuning's row lengths (`data.length_buckets`), each positive."""
    buckets = _get(config, "data.length_buckets") or ()
    return ([f"config.data.length_buckets={tuple(buckets)} must be positive."]
            if any(int(b) <= 0 for b in buckets) else [])


# -- Rules of the model fields (config.model: bert_jax/modeling/) --------------------------
# Each rule: config -> its problems, one line each (a section the config lacks: none).

def platform() -> str:
    """'tpu', 'gpu'/'cuda' or 'cpu', the platform a step is compiled for: that of the
    mesh in context (`jax.set_mesh`, as the train loop and `launch/compile.py` use),
    otherwise JAX's default backend (a fact of the run; imports JAX)."""
    import jax
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty and mesh.abstract_device is not None:
        return mesh.abstract_device.platform
    return jax.default_backend()


def _kernel_name(impl: Any) -> list[str]:
    """`impl` names one of `ATTENTION_IMPLS` ('fused' was renamed 'xla')."""
    field = "config.model.attention_impl"
    if impl == "fused":
        return [f"{field}='fused': renamed 'xla' (what it computed); 'flash' is the "
                "platform's flash kernel."]
    return [] if impl in ATTENTION_IMPLS else [unknown(field, impl, ATTENTION_IMPLS)]


def _attention(config) -> list[str]:
    """`model.attention_impl` names a kernel ('fused' was renamed 'xla') that can run
    the run: fused kernels apply no attention dropout; 'flash' is the platform's
    kernel; cuDNN takes bfloat16/float16 and no packed rows (`data.pack_length`);
    splash takes lengths that are multiples of `SPLASH_LANES`."""
    impl, field = _get(config, "model.attention_impl"), "config.model.attention_impl"
    if impl in (None, "einsum"):
        return []
    if named := _kernel_name(impl):   # 'fused', or no kernel's name
        return named
    here = platform() if impl == "flash" else None   # 'flash': the platform's kernel
    problems, kernel = [], FLASH_KERNELS.get(here) if here else impl
    if rate := _get(config, "model.attention_dropout_rate"):
        problems.append(f"config.model.attention_dropout_rate={rate}: attention_impl={impl!r} "
                        "applies no attention dropout; set it to 0, or attention_impl='einsum'.")
    if kernel is None:
        problems.append(f"{field}='flash': no flash kernel for platform {here!r}; use 'xla' "
                        "or 'einsum'.")
    if kernel == "cudnn" and _get(config, "model.dtype") == "float32":
        problems.append(f"{field}='cudnn' (or 'flash' on GPU) needs bfloat16 or float16, not "
                        "float32: set config.model.dtype='bfloat16' or use 'xla'.")
    if kernel == "cudnn" and (_get(config, "data.pack_length") or 0) > 0:
        problems.append(f"{field}='cudnn' (or 'flash' on GPU) takes no packed segments: set "
                        "config.data.pack_length=0, or attention_impl 'xla' or 'einsum'.")
    for name in ("max_seq_length", "max_length", "pack_length", "length_buckets"):
        value = _get(config, f"data.{name}") or 0   # pack_length 0: rows are not packed
        if kernel == "splash" and any(int(n) % SPLASH_LANES for n in (
                value if isinstance(value, (list, tuple)) else [value])):
            problems.append(f"{field}={impl!r}: splash needs lengths that are multiples of "
                            f"{SPLASH_LANES} (config.data.{name}={value}); set the data's "
                            "sequence length to one, or use attention_impl='xla'.")
    return problems


MODEL_RULES: tuple[Callable[[Any], list[str]], ...] = (_attention,)


# -- Rules of the model dataclasses (bert_jax/modeling/configs.py) -------------------------
# BertConfig and TransformerConfig check their fields whenever one is built (from
# config.model, a checkpoint's config.json, a Hugging Face config, a preset, `replace`)
# by `check_model`; a field the class lacks is not checked.

NORM_POSITIONS = ("post", "pre")
INITIALIZERS = ("truncated_normal", "normal", "xavier_uniform")
POSITION_KINDS = ("learned", "sinusoidal")  # TransformerConfig.position
DTYPES = ("float32", "bfloat16", "float16")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# field -> (whether a value works, the problem of one that does not).
MODEL_FIELDS = {
    **dict.fromkeys(("hidden_size", "num_heads", "mlp_dim", "num_layers", "max_len",
                     "vocab_size", "type_vocab_size"),
                    (lambda n: _is_int(n) and n > 0, "must be a positive integer.")),
    # None: the encoder's (the Transformer's decoder depth and target vocabulary)
    **dict.fromkeys(("num_decoder_layers", "target_vocab_size"), (
        lambda n: n is None or _is_int(n) and n > 0, "must be a positive integer.")),
    "scan_layers": (lambda b: isinstance(b, bool), "must be True or False."),
    **dict.fromkeys(("dropout_rate", "attention_dropout_rate"),
                    (lambda p: _is_number(p) and 0 <= p < 1, "must be in [0, 1).")),
    **dict.fromkeys(("layer_norm_eps", "initializer_range"),
                    (lambda x: _is_number(x) and x > 0, "must be > 0.")),
}
# field -> the names it may take; also `activation` and `remat`, the names of the tables
# modeling.configs maps them by (ACTIVATIONS, REMAT_POLICIES; passed to `check_model`).
MODEL_CHOICES = {"norm_position": NORM_POSITIONS, "initializer": INITIALIZERS,
                 "dtype": DTYPES, "param_dtype": DTYPES, "position": POSITION_KINDS}


def _heads(model) -> list[str]:
    """`num_heads` divides `hidden_size`; the line names the nearest count that does."""
    hidden, heads = model["hidden_size"], model["num_heads"]
    if not hidden % heads:
        return []
    nearest = min((h for h in range(1, hidden + 1) if hidden % h == 0),
                  key=lambda h: (abs(h - heads), h))
    return [f"config.model.num_heads={heads}: does not divide hidden_size={hidden}; the "
            f"nearest that does is {nearest} (BERT uses hidden_size // 64)."]


def _vocabularies(model) -> list[str]:
    """The Transformer's `share_embeddings` needs one vocabulary; special token ids lie
    in theirs: BERT's `pad_token_id`, the Transformer's `pad_id` (padding on both
    sides) and target tokens `bos_id`, `eos_id`."""
    source = model.get("vocab_size", 0)
    target = model.get("target_vocab_size") or source
    problems = [f"config.model.share_embeddings=True: needs one vocabulary, but vocab_size="
                f"{source} and target_vocab_size={target}; set it False."
                ] if model.get("share_embeddings") and target != source else []
    # token id -> (the size of its vocabulary, which that is)
    sizes = {"pad_token_id": (source, "the vocabulary"),
             "pad_id": (min(source, target), "both vocabularies"),
             "bos_id": (target, "the target vocabulary"),
             "eos_id": (target, "the target vocabulary")}
    return problems + [
        f"config.model.{field}={model[field]!r}: must be a token id in [0, {size}) ({which})."
        for field, (size, which) in sizes.items() if field in model
        and not (_is_int(model[field]) and 0 <= model[field] < size)]


def model_problems(model: Mapping[str, Any], choices: Mapping[str, Any]) -> list[str]:
    """The lines of the fields of `model` (a model dataclass's, by name) that break
    `MODEL_FIELDS`, `MODEL_CHOICES` with `choices` or name no attention kernel; when
    every field is good alone, those of the rules across fields."""
    problems = [f"config.model.{field}={model[field]!r}: {problem}"
                for field, (works, problem) in MODEL_FIELDS.items()
                if field in model and not works(model[field])]
    problems += [unknown(f"config.model.{field}", model[field], names)
                 for field, names in {**MODEL_CHOICES, **choices}.items()
                 if field in model and model[field] not in names]
    problems += _kernel_name(model["attention_impl"])
    return problems or _heads(model) + _vocabularies(model)


def check_model(model: Mapping[str, Any], choices: Mapping[str, Any]) -> None:
    """Raises the `model_problems` of `model` (none: returns): their lines alone, so
    the trainer lists them among the config's (`training.validation`)."""
    refuse(model_problems(model, choices), "")


def check_length(length: int, max_len: int, what: str = "input") -> None:
    """Raises if a sequence of `length` tokens (of `what`: 'input', 'source', a config
    field) exceeds `max_len` (config.model.max_len), the positions the model has."""
    if length > max_len:
        raise ConfigError(f"{what} length {length} exceeds config.model.max_len={max_len}: "
                          "shorten it, or raise max_len (learned positions then need training).")


# -- Rules of the data fields (config.data: bert_jax/data/) ---------------------------------
# Each rule: config -> its problems, one line each (a section the config lacks: none).

# The options of a `bert_pretraining` corpus build (config.data, the arguments of
# data.bert_pretraining.pretraining_config): name -> (whether a value works, what to use).
PRETRAINING_DATA = {
    "max_seq_length": (lambda n: n >= 8, "at least 8"),
    "short_seq_prob": (lambda p: 0 <= p <= 1, "a probability"),
    "dupe_factor": (lambda n: n >= 1, "at least 1"),
    "eval_documents": (lambda n: n == 0 or n >= 2, "0, or at least 2 for random-next pairs"),
    "documents_per_shard": (lambda n: n >= 2, "at least 2"),
    **dict.fromkeys(("document_sample", "vocab_sample"),
                    (lambda f: 0 < f <= 1, "a fraction in (0, 1]"))}


def corpus_file(spec: str) -> tuple[str, str]:
    """A corpus file `'path'` or `'path:format'` -> (path, format; `blank_lines`
    when none is given)."""
    path, _, fmt = spec.rpartition(":") if re.search(r":[a-z_]+$", spec) else (spec, "", "")
    return path, fmt or "blank_lines"


def pretraining_data_problems(data, prefix: str) -> list[str]:
    """The lines of the options in `data` (a mapping; absent ones are not
    checked) that break `PRETRAINING_DATA`, and of its `corpus_files` whose
    format is not a `DOCUMENT_FORMATS`; `prefix` says whose they are."""
    problems = [f"{prefix}{name}={data[name]}; use {todo}"
                for name, (works, todo) in PRETRAINING_DATA.items()
                if data.get(name) is not None and not works(data[name])]
    return problems + [f"{prefix}corpus_files: {spec!r} has format {fmt!r}; use one of "
                       f"{DOCUMENT_FORMATS}" for spec in data.get("corpus_files") or ()
                       if (fmt := corpus_file(spec)[1]) not in DOCUMENT_FORMATS]


def _pretraining_data(config) -> list[str]:
    """`pretraining_data_problems` of a `bert_pretraining` config."""
    data = _get(config, "data") if _get(config, "task") == "bert_pretraining" else None
    return [] if data is None else pretraining_data_problems(data, "config.data.")


DATA_RULES: tuple[Callable[[Any], list[str]], ...] = (_pretraining_data,)


# -- Rules of the task, training and evaluation fields (bert_jax/tasks/, training/) ---------
# Each rule: config -> its problems, one line each (a section the config lacks: none).

HELDOUT = "heldout"  # the evaluation split carved from the training subset (tasks.finetune)
SQUAD_SPLITS = ("train", "validation", HELDOUT)
IN_TASK_TASKS = ("glue", "tagging")  # whose text in-task masked-LM pretraining reads


def _heldout_fraction(config) -> list[str]:
    """The part of the training subset `data.eval_split='heldout'` holds out, in (0, 1)."""
    fraction = _get(config, "data.heldout_fraction")
    return ([f"config.data.heldout_fraction={fraction}: it must leave examples for training "
             "and hold out at least one; use a fraction in (0, 1)."]
            if _get(config, "data.eval_split") == HELDOUT and fraction is not None
            and not 0 < fraction < 1 else [])


def _squad(config) -> list[str]:
    """SQuAD's evaluation split; from the catalog (no `data.path`), whole splits."""
    data = config.data if _get(config, "task") == "squad" else None
    problems = ([unknown("config.data.eval_split", data.eval_split, SQUAD_SPLITS)]
                if data and data.eval_split not in SQUAD_SPLITS else [])
    if data and not data.path and {str(a).strip() for a in (
            data.train_articles, data.eval_articles)} - {"", ":"}:
        problems.append("config.data.path='': the catalog's squad/v1.1 splits are whole; set "
                        "data.train_articles=':' and data.eval_articles=':', or give "
                        "data.path a JSON file.")
    return problems


def _batch_tokens(config) -> list[str]:
    """`data.batch_tokens` (translation): whole rows of `data.pack_length` or `max_length`."""
    tokens = _get(config, "data.batch_tokens")
    row = _get(config, "data.pack_length") or _get(config, "data.max_length")
    return ([f"config.data.batch_tokens={tokens}: make it a multiple of the row length {row} "
             "(data.pack_length or data.max_length)."] if tokens and row and tokens % row else [])


TASK_RULES: tuple[Callable[[Any], list[str]], ...] = (
    _heldout_fraction, _squad, _batch_tokens)


def evaluation_problems(config, trained, refused: dict[str, Any], may_change: Sequence[str],
                        saved: str) -> list[str]:
    """The rules of evaluating a workdir's run (`training.evaluation.evaluation_config`):
    `config` is its config after the overrides evaluation may make (`may_change`, keys
    or `section.` prefixes), checked by `TASK_RULES` and for a batch of one row at
    least; `trained` is the config the run trained with, read from `saved` (the
    workdir's config.json), where `refused` maps the keys changed that define the
    model, its data or its task to their value. The 'heldout' split exists only for a
    run that held it out of training: otherwise it would score examples trained on."""
    problems = [problem for rule in TASK_RULES for problem in rule(config)]
    split = _get(trained, "data.eval_split")
    if _get(config, "data.eval_split") == HELDOUT and split != HELDOUT:
        problems.append("config.data.eval_split='heldout': this run trained on its whole "
                        f"training subset (data.eval_split={split!r} in {saved}), so no "
                        "examples were held out; evaluate another split, or train a run with "
                        "config.data.eval_split='heldout'.")
    if refused:
        changed = ", ".join(f"config.{k} ({v!r} in {saved})" for k, v in refused.items())
        problems.append(f"evaluation cannot change {changed}: it defines the model, its data "
                        "or its task. Evaluation may change " + ", ".join(
                            f"config.{k.rstrip('.')}" for k in may_change)
                        + ". To evaluate another model, use its workdir.")
    if (size := _get(config, "train.batch_size")) is not None and size < 1:
        problems.append(f"config.train.batch_size={size}: must be at least 1.")
    return problems


RULES: tuple[Callable[[Any], list[str]], ...] = (
    _warmup, _learning_rate, _profile_steps, _length_buckets,
    *MODEL_RULES, *DATA_RULES, *TASK_RULES)


def config_problems(config) -> list[str]:
    """Every rule of this module that `config` breaks, one line each."""
    problems = [f"config.{field}={value}: must be at least {least}{meaning}."
                for field, (least, meaning) in AT_LEAST.items()
                if isinstance(value := _get(config, field), int) and value < least]
    problems += [unknown(f"config.{field}", value, names) for field, names in CHOICES.items()
                 if (value := _get(config, field)) is not None and value not in names]
    return problems + [problem for rule in RULES for problem in rule(config)]


def refuse(problems: Sequence[str], headline: str = "the config cannot train") -> None:
    """Raises one `ConfigError` of `headline` and `problems`, one a line (none:
    returns; headline '': the lines alone): the one report of every config check."""
    if problems:
        raise ConfigError("\n  ".join(([f"{headline}:"] if headline else []) + list(problems)))


def check_config(config) -> None:
    """Raises one `ConfigError` listing every problem of `config_problems`."""
    refuse(config_problems(config))


# -- Command-line specs of the study and sweep tools ---------------------------------------
# launch/transfer_study.py and launch/sweep.py (bert_jax.analysis.transfer,
# bert_jax.analysis.sweeps) parse their flags and study files through these.

STUDY_REFUSED = "the transfer study cannot run"
SWEEP_REFUSED = "the sweep cannot run"
IN_TASK_PREFIX = "in_task_mlm:"   # --backbone=NAME=in_task_mlm:PATH
# spec -> (its grammar, a regex a text matches in full; the line of a text breaking it).
SPECS = {
    "--backbone": (r"(?s)(?P<name>[A-Za-z0-9._-]+)=(?P<path>.*)",
                   "--backbone={text}: write NAME=PATH (NAME of letters, digits, '.', '_', "
                   "'-'; PATH '' for random weights)"),
    "--metric": (r"(?s)(?:(?P<task>.*)=)?(?P<key>[^=]+)",
                 "--metric={text}: write KEY or TASK=KEY (e.g. mrpc=eval/f1)"),
    # a task variant of experiments/finetune.py: its runs' folder name as it is
    "--task": (r"[A-Za-z0-9._=,+-]+",
               "tasks={text!r}: give task variants such as 'sst2,steps=800' or 'mrpc'"),
    "--sweep": (r"(?s)\s*\S.*", "empty sweep spec: give e.g. "
                "'model.num_heads=1,2 x model.num_layers=1'"),
    "sweep axis": (r"(?s)\s*(?P<key>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\s*=\s*(?P<values>.*?)\s*",
                   "{text!r}: write an axis as KEY=V1,V2,... (e.g. model.num_heads=1,2)"),
    "sweep value": (r"\S+", "bad value {text!r} of {key}; separate axes with ' x ' or "
                    "' + ' and quote values holding spaces or commas"),
}
# a study's list of numbers -> (int or float, what the whole list must satisfy, the fix).
NUMBER_LISTS = {
    "seeds": (int, lambda numbers: True, "give whole numbers"),
    "train_examples": (int, lambda numbers: min(numbers) >= 0,
                       "give whole numbers, each at least 0 (0: the whole split)"),
    "lr_grid": (float, lambda rates: all(r > 0 for r in rates) and len(set(rates)) == len(
        rates), "give distinct positive learning rates, e.g. 5e-5,1e-4,2e-4"),
}


def spec(kind: str, text: Any, problems: list[str], **names) -> dict[str, str] | None:
    """The named parts of `text` by the grammar of `SPECS[kind]`; None, with
    its line added to `problems`, when `text` breaks it (`names` fill the line)."""
    pattern, line = SPECS[kind]
    match = re.fullmatch(pattern, text) if isinstance(text, str) else None
    if match is None:
        problems.append(line.format(text=text, **names))
    return None if match is None else match.groupdict()


def numbers(field: str, values: Any, problems: list[str]) -> tuple:
    """`values` (one or a list, numbers or their texts) as a `NUMBER_LISTS[field]`
    list without repeats, its line added to `problems` when none or a bad one."""
    kind, good, fix = NUMBER_LISTS[field]
    try:
        out = [kind(v) for v in ([values] if isinstance(values, (int, float, str))
                                 else values)]
    except (TypeError, ValueError):
        out = []
    if not out or not good(out):
        problems.append(f"{field}={values!r}: {fix}")
    return tuple(dict.fromkeys(out))


def backbones(texts: Sequence[str], problems: list[str]) -> dict[str, str]:
    """{NAME: PATH} of `--backbone=NAME=PATH` texts, in order (PATH '' or `''`:
    random weights); a name given twice, `in_task_mlm:` without its checkpoint,
    or no backbone at all add their lines to `problems`."""
    out = {}
    for text in texts or ():
        if (parts := spec("--backbone", text, problems)) is None:
            continue
        name, path = parts["name"], "" if parts["path"] in ("''", '""') else parts["path"]
        if name in out:
            problems.append(f"--backbone: the name {name!r} is given twice")
        if path == IN_TASK_PREFIX:
            problems.append(f"--backbone={text}: in-task masked-LM pretraining starts from "
                            f"a checkpoint: write {name}={IN_TASK_PREFIX}PATH")
        out[name] = path
    if not texts:
        problems.append("give the backbones: --backbone=NAME=PATH (PATH '' for random "
                        "weights of the first pretrained backbone's architecture)")
    return out


def axes_problems(axes: Sequence[Sequence[dict]], zipped: bool) -> list[str]:
    """The axes (lists of override dicts) of a sweep's product or zip: no key
    swept twice; a zip's of one length."""
    keys = [list(dict.fromkeys(k for point in axis for k in point)) for axis in axes]
    counts = collections.Counter(k for mine in keys for k in mine)
    problems = [f"key {k!r} is swept twice" for k, n in counts.items() if n > 1]
    lengths = [len(axis) for axis in axes]
    if zipped and len(set(lengths)) > 1:
        problems.append(f"zip of axes of unequal lengths {lengths} "
                        f"({'; '.join(', '.join(k) for k in keys)}); use ' x ' for every "
                        "combination")
    return problems
