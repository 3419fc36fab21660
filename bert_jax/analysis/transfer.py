r"""Transfer studies: fine-tuning from several backbones over tasks, seeds and
training-set sizes in one command, then one table and one figure of learning
curves (launch/transfer_study.py, docs/SWEEPS.md).

A study is, per task variant (the argument of experiments/finetune.py:
`sst2,steps=800`, `mrpc`, `upos,epochs=2`), one sweep (`sweeps.Sweep`) over
backbone x training-set size (`data.train_examples`; 0: the whole split) x
seed: the union of the study's `Group`s. Its runs are named by labels, not by
their many overrides:

    DIR/study.json                         config file, tasks, backbones, split sizes
    DIR/<task>/sweep.json                  the task's sweep
    DIR/<task>/backbone=NAME,n=N,seed=S/   a run's workdir (overrides.json, run.json, ...)
    DIR/results.csv, results.md            per task x backbone x size: seeds, mean, sample
                                           sd, min and max of the task's metric, wall time
    DIR/learning_curves.png                the metric against labelled examples (log x),
                                           a panel a task, a line a backbone, +-1 sd shaded

A backbone is a name and an `init_from` (a bert_jax workdir, a Hugging Face
BERT folder, a bert_jax pretrained folder, `package:NAME`) or '': random
weights of the first pretrained backbone's architecture with its vocabulary
(`scratch_overrides`), so that only the weights differ. `in_task_mlm:PATH` is
PATH after in-task masked-LM pretraining (task-adaptive pretraining,
Gururangan et al. 2020, arXiv 2004.10964): per task, the masked-LM objective
continues from PATH on the text of the task's whole training split, read
without its labels (`FinetuneTask.unlabelled_texts`; also when a run uses
only K of the labels), for the fixed steps of `in_task_config`
(experiments/pretrain_bert.py:in_task_mlm); its runs then fine-tune from the
result. The text and that run live in DIR/in_task_mlm/<task>/ (a sweep of one
run a backbone), made before the task's first run from it and then reused.

The runs go seed by seed (every task, size and backbone at seed 0 first: a
study stopped half-way already fills the table), smaller sizes first; a
finished run is skipped and an interrupted one resumed (the sweep's). Size 0
is tabulated and drawn at the split's real number of examples
(`train_split_size`).

A learning-rate grid (`lr_grid`, the same for every backbone) chooses each
backbone's rate per task and size without the dev set, before those runs:
seed 0 trains at each rate on the size's subset less a held-out tenth and is
scored on that tenth (`data.eval_split='heldout'`, `finetune.carve_heldout`),
in DIR/lr_selection/<task>/; the rate of the best main metric (ties: the
smaller) goes to DIR/lr_selection.json and the runs train at it on the whole
subset.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import statistics
import sys
import tempfile
from typing import Any, Callable, Iterable, Sequence

from bert_jax.analysis.sweeps.points import apply_overrides, load_config, module_function
from bert_jax.analysis.sweeps.results import (
    collect as collect_runs, human_seconds, markdown_table, number, write_csv)
from bert_jax.analysis.sweeps.runner import SWEEP_FILE, Sweep, is_finished, read_record
from bert_jax.config_schema import (
    HELDOUT, IN_TASK_PREFIX, IN_TASK_TASKS, STUDY_REFUSED, backbones as backbone_specs, numbers,
    refuse, spec)
from bert_jax.convert.pretrained import PACKAGE_PREFIX, checkpoint_path
from bert_jax.errors import UserError
from bert_jax.file_io import jsonable, write_json
from bert_jax.modeling import BertConfig
from bert_jax.tasks import bert_backbone
from bert_jax.tasks.bert_backbone import RUNTIME_FIELDS
from bert_jax.training.workdir import refuse_writing_into

STUDY_FILE = "study.json"
LR_DIR = "lr_selection"
LR_FILE = "lr_selection.json"
LR_KEY = "optimizer.learning_rate"
IN_TASK_DIR = "in_task_mlm"
IN_TASK_TEXT = "text.txt"
# The in-task text's documents are runs of this many consecutive examples: a
# document bounds how many short examples one 128-token instance packs.
EXAMPLES_PER_DOCUMENT = 16
CSV_FILE = "results.csv"
MARKDOWN_FILE = "results.md"
FIGURE_FILE = "learning_curves.png"
SIZE_KEY = "data.train_examples"
LABELS = ("backbone", "n", "seed")
# The fields a scratch backbone copies: BertConfig's architecture (its
# vocabulary size comes with the vocabulary).
ARCHITECTURE = tuple(f.name for f in dataclasses.fields(BertConfig)
                     if f.name not in RUNTIME_FIELDS and f.name != "vocab_size")


# -- what a study is -------------------------------------------------------------------


@dataclasses.dataclass
class Group:
    """Every task x backbone x size x seed of these is a run of the study.
    `tasks`: experiments/finetune.py arguments (`sst2,steps=800`);
    `train_examples`: sizes of the training subset (0: the whole split);
    `backbones`: names (None: every backbone of the study). Each may be given as one
    value or a list (as flags and study files give them): it is kept as a tuple without
    repeats, `seeds='0'` as `(0,)`."""

    tasks: tuple[str, ...]
    seeds: tuple[int, ...] = (0,)
    train_examples: tuple[int, ...] = (0,)
    backbones: tuple[str, ...] | None = None

    def __post_init__(self):
        tasks = (self.tasks,) if isinstance(self.tasks, str) else tuple(self.tasks or ())
        problems = []
        for task in tasks or [self.tasks]:   # none: the line of the empty list
            spec("--task", task, problems)
        self.tasks = tuple(dict.fromkeys(tasks))
        self.seeds = numbers("seeds", self.seeds, problems)
        self.train_examples = numbers("train_examples", self.train_examples, problems)
        refuse(problems, STUDY_REFUSED)
        if self.backbones is not None:
            names = (self.backbones,) if isinstance(self.backbones, str) else self.backbones
            self.backbones = tuple(dict.fromkeys(names))


def as_groups(groups: Iterable[Group | dict]) -> list[Group]:
    """Groups from `Group`s or dicts of its fields."""
    fields = [f.name for f in dataclasses.fields(Group)]
    groups = list(groups or ())
    problems = [f"study group {group}: unknown keys {unknown}; a group has "
                f"{', '.join(fields)}" for group in groups if isinstance(group, dict)
                and (unknown := sorted(set(group) - set(fields)))]
    problems += [f"a study is a list of groups (dicts), not {group!r}" for group in groups
                 if not isinstance(group, (dict, Group))]
    refuse(problems or ([] if groups else ["the study has no groups: give --task (or a "
                                           "study file)"]), STUDY_REFUSED)
    return [Group(**group) if isinstance(group, dict) else group for group in groups]


def load_study(path: str) -> list[Group]:
    """The groups of a study file's `get_study()` (experiments/transfer_study.py)."""
    return as_groups(module_function(path, "get_study", "write one returning its groups")())


def parse_backbones(specs: Iterable[str]) -> dict[str, str]:
    """`NAME=PATH` texts -> {name: init_from}, in order; PATH '' (or `''`) is
    from scratch; a directory is made absolute (runs compare their overrides);
    `in_task_mlm:PATH` keeps its prefix."""
    problems: list[str] = []
    backbones = backbone_specs(specs, problems)
    refuse(problems, STUDY_REFUSED)
    for name, path in backbones.items():
        prefix = IN_TASK_PREFIX if path.startswith(IN_TASK_PREFIX) else ""
        path = path.removeprefix(prefix)
        if path and not path.startswith(PACKAGE_PREFIX):
            path = os.path.abspath(os.path.expanduser(path))
        backbones[name] = prefix + path
    return backbones


def backbone_model(init_from: str) -> tuple[BertConfig, str, bool | None]:
    """(architecture, its vocab.txt or '', its declared casing or None) of a
    backbone, read as fine-tuning reads it (`bert_backbone`); no weights."""
    folder = checkpoint_path(init_from)
    return bert_backbone.checkpoint_model(folder, bert_backbone.checkpoint_kind(folder))


def architecture_overrides(init_from: str, config: Any, who: str) -> dict[str, Any]:
    """`model.<ARCHITECTURE field>` overrides of `config` that write out the
    architecture of the backbone `init_from` (for `who`, a scratch or in-task
    backbone, in the error when the `model` section lacks a field)."""
    architecture = backbone_model(init_from)[0]
    overrides, lacking = {}, []
    for field in ARCHITECTURE:
        value = getattr(architecture, field)
        if field in config.model:
            overrides[f"model.{field}"] = value
        elif value != BertConfig.__dataclass_fields__[field].default:
            lacking.append(f"{field}={value!r}")
    refuse([f"a {who} backbone copies {init_from}, whose {', '.join(lacking)} its config's "
            "`model` section cannot set; add the field"] if lacking else [], STUDY_REFUSED)
    return overrides


def scratch_overrides(init_from: str, config: Any) -> dict[str, Any]:
    """Overrides of `config` (a fine-tuning config) that train from random
    weights of the backbone `init_from`'s architecture and vocabulary (and
    casing): `init_from=''`, `model.<ARCHITECTURE field>`, `data.vocab_file`
    (`config.data.vocab_file` if set, as fine-tuning from it takes it),
    `data.lowercase`."""
    _, vocab_file, lowercase = backbone_model(init_from)
    overrides = {"init_from": "", **architecture_overrides(init_from, config, "scratch")}
    vocab_file = config.data.get("vocab_file", "") or vocab_file
    if not vocab_file:
        refuse([f"a scratch backbone copies {init_from}, which has no vocab.txt: give "
                "--config.data.vocab_file"], STUDY_REFUSED)
    overrides["data.vocab_file"] = os.path.abspath(vocab_file)
    if lowercase is not None:
        overrides["data.lowercase"] = bool(lowercase)
    return overrides


def architecture_key(init_from: str) -> tuple:
    """What makes two backbones train at the same speed: the architecture and
    the vocabulary size."""
    architecture = backbone_model(init_from)[0]
    return tuple(getattr(architecture, f) for f in (*ARCHITECTURE, "vocab_size"))


def write_in_task_text(config: Any, path: str) -> int:
    """Writes the text of the whole training split of the fine-tuning task of
    `config`, without labels, as a pretraining corpus (one text a line, a
    blank line after every `EXAMPLES_PER_DOCUMENT` examples) to `path`,
    atomically; returns the number of examples."""
    texts = _whole_train_split(config, lambda task: task.unlabelled_texts())
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=os.path.dirname(path),
                                     delete=False) as f:
        for start in range(0, len(texts), EXAMPLES_PER_DOCUMENT):
            lines = [" ".join(t.split()) for example in texts[start:start +
                                                             EXAMPLES_PER_DOCUMENT]
                     for t in example]
            f.write("\n".join(line for line in lines if line) + "\n\n")
    os.replace(f.name, path)
    return len(texts)


def train_split_size(config: Any) -> int:
    """The training split's number of examples as the task reads it (with
    `data.train_examples` 0), from a fine-tuning config."""
    return len(_whole_train_split(config, lambda task: task.examples("train")))


def _whole_train_split(config: Any, read: Callable[[Any], Any]) -> Any:
    """`read(task)` of the fine-tuning task of `config` (built in a scratch
    workdir) reading the whole training split, whatever `data.train_examples`
    the runs use."""
    from bert_jax.tasks import build_task

    if SIZE_KEY.split(".")[1] in config.data:
        config = apply_overrides(config, {SIZE_KEY: 0})
    with tempfile.TemporaryDirectory() as workdir:
        return read(build_task(config, workdir))


# -- running ------------------------------------------------------------------------------


class Study:
    """The runs of `groups` (see `Group`) with `backbones` ({name: init_from},
    `parse_backbones`): a `Sweep` a task of `config_file` (experiments/finetune.py,
    `path.py:TASK` each) in DIR/<task>/, `base_overrides` applied to every run.
    `train_fn(config, workdir)` and `log(line)` go to the sweeps. The
    `in_task_mlm:` backbones' masked-LM runs use `in_task_config`
    (`path.py:ARG`) with `in_task_overrides`."""

    def __init__(self, directory: str, backbones: dict[str, str],
                 groups: Iterable[Group | dict], *, config_file: str,
                 base_overrides: dict[str, Any] | None = None,
                 train_fn: Callable[[Any, str], Any] | None = None,
                 log: Callable[[str], None] | None = None,
                 in_task_config: str | None = None,
                 in_task_overrides: dict[str, Any] | None = None,
                 lr_grid: Sequence[float] = ()):
        self.directory = directory
        problems: list[str] = []
        self.lr_grid = numbers("lr_grid", lr_grid, problems) if lr_grid else ()
        self.backbones = dict(backbones)
        self.groups = as_groups(groups)
        self.config_file = config_file
        self.base_overrides = dict(base_overrides or {})
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.train_fn = train_fn
        problems += [f"study group of {', '.join(group.tasks)} names backbones {unknown} "
                     f"that --backbone does not give (given: {', '.join(self.backbones)})"
                     for group in self.groups if (unknown := [
                         b for b in group.backbones or () if b not in self.backbones])]
        # name -> the checkpoint in-task masked-LM pretraining starts from
        self.in_task = {name: path.removeprefix(IN_TASK_PREFIX)
                        for name, path in self.backbones.items()
                        if path.startswith(IN_TASK_PREFIX)}
        starts = {name: self.in_task.get(name, path) for name, path in self.backbones.items()}
        first = next((path for path in starts.values() if path), None)
        refuse(problems + ([] if first else [
            "a scratch backbone takes the architecture and vocabulary of the first pretrained "
            "backbone: give one"]), STUDY_REFUSED)
        refuse_writing_into({f"--workdir={directory}": directory},
                            {f"--backbone={name}": path for name, path in starts.items()
                             if path and not path.startswith(PACKAGE_PREFIX)})
        problems = [] if in_task_config or not self.in_task else [
            f"the {IN_TASK_PREFIX} backbones need the config of their masked-LM runs: give "
            "in_task_config (experiments/pretrain_bert.py:in_task_mlm)"]
        self.architectures = {}
        for name, path in starts.items():
            try:
                self.architectures[name] = architecture_key(path or first)
            except UserError as e:
                problems.append(f"--backbone={name}={path or first}: {e}")
        refuse(problems, STUDY_REFUSED)
        self.tasks = list(dict.fromkeys(t for g in self.groups for t in g.tasks))
        self.configs, self.overrides = {}, {}   # per task: its config, each backbone's
        self.in_task_sweeps: dict[str, Sweep] = {}
        self.selection_sweeps: dict[str, Sweep] = {}
        for task in self.tasks:
            config = apply_overrides(load_config(f"{config_file}:{task}"), self.base_overrides)
            if self.in_task and config.task not in IN_TASK_TASKS:
                refuse([f"{task}: in-task masked-LM pretraining reads the text of GLUE and "
                        f"tagging tasks, not of task {config.task!r}"], STUDY_REFUSED)
            overrides = {name: {"init_from": path} if path else scratch_overrides(first, config)
                         for name, path in self.backbones.items()}
            if self.in_task:
                in_task = self._in_task_sweep(task, in_task_config, in_task_overrides or {})
                self.in_task_sweeps[task] = in_task
                overrides.update({run.labels["backbone"]: {"init_from": run.workdir}
                                  for run in in_task.runs})
            self.configs[task], self.overrides[task] = config, overrides
            if self.lr_grid:
                self.selection_sweeps[task] = self._selection_sweep(task)
        self._build_sweeps()

    def _runs(self, task: str) -> list[tuple[int, int, str]]:
        """(seed, size, backbone) of the task's runs: seed by seed, smaller sizes
        first (0: the whole split), backbones in their order."""
        names = list(self.backbones)
        runs = {(seed, size, names.index(name)) for g in self.groups if task in g.tasks
                for seed in g.seeds for size in g.train_examples
                for name in (g.backbones or names)}
        return [(seed, size, names[b]) for seed, size, b in
                sorted(runs, key=lambda r: (r[0], r[1] or math.inf, r[2]))]

    def _build_sweeps(self) -> None:
        """The study's sweeps, a task each, with the learning rates chosen so far."""
        self.chosen = self._chosen_rates() if self.lr_grid else {}
        self.sweeps: dict[str, Sweep] = {}
        for task in self.tasks:
            runs = self._runs(task)
            rates = [self.chosen.get((task, name, size)) for _, size, name in runs]
            self.sweeps[task] = Sweep(
                self.configs[task], os.path.join(self.directory, task),
                [{**self.overrides[task][name], "seed": seed, SIZE_KEY: size,
                  **({LR_KEY: rate} if rate else {})}
                 for (seed, size, name), rate in zip(runs, rates)],
                labels=[{"backbone": name, "n": size, "seed": seed} for seed, size, name in runs],
                config_file=f"{self.config_file}:{task}", base_overrides=self.base_overrides,
                train_fn=self.train_fn, log=self.log)
        # Seed by seed across the tasks; each sweep's runs are in (seed, size, backbone) order.
        self.order = sorted(((task, sweep, run) for task, sweep in self.sweeps.items()
                             for run in sweep.runs),
                            key=lambda item: (item[2].labels["seed"], self.tasks.index(item[0]),
                                              item[2].index))

    def _selection_sweep(self, task: str) -> Sweep:
        """The learning-rate selection runs of `task`: seed 0 of every backbone
        and size of its runs at every rate of `lr_grid`, scored on the held-out
        part of the training subset (module docstring)."""
        pairs = list(dict.fromkeys((size, name) for _, size, name in self._runs(task)))
        points = [{**self.overrides[task][name], "seed": 0, SIZE_KEY: size,
                   "data.eval_split": HELDOUT, LR_KEY: lr}
                  for size, name in pairs for lr in self.lr_grid]
        return Sweep(self.configs[task], os.path.join(self.directory, LR_DIR, task),
                     points, labels=[{"backbone": name, "n": size, "lr": lr}
                                     for size, name in pairs for lr in self.lr_grid],
                     config_file=f"{self.config_file}:{task}",
                     base_overrides=self.base_overrides, train_fn=self.train_fn, log=self.log)

    def _chosen_rates(self) -> dict[tuple[str, str, int], float]:
        """{(task, backbone, size): the rate of the best held-out main metric}
        for the selections whose runs have all finished (ties: the smaller rate)."""
        chosen = {}
        for task, sweep in self.selection_sweeps.items():
            scores = collections.defaultdict(dict)
            for row in collect_runs(sweep.directory):
                labels = row["labels"]
                key = main_metric(row["config"], row["metrics"])
                if row["status"] == "done" and key and labels.get("lr") in self.lr_grid:
                    scores[(labels["backbone"], labels["n"])][labels["lr"]] = row["metrics"][key]
            for (name, size), by_rate in scores.items():
                if len(by_rate) == len(self.lr_grid):
                    chosen[(task, name, size)] = max(sorted(by_rate), key=by_rate.__getitem__)
        return chosen

    def _select_rates(self, stop_on_error: bool) -> dict[str, str]:
        """Trains the selection runs, then writes DIR/lr_selection.json and
        rebuilds the study's sweeps with the chosen rates."""
        outcome = {}
        for task, sweep in self.selection_sweeps.items():
            sweep.prepare()
            for run in sweep.runs:
                outcome[f"{LR_DIR}/{task}/{run.name}"] = self._run_one(task, sweep, run,
                                                                      stop_on_error)
                if outcome[f"{LR_DIR}/{task}/{run.name}"] == "interrupted":
                    return outcome
        self._build_sweeps()
        write_json(os.path.join(self.directory, LR_FILE), {
            "grid": list(self.lr_grid), "split": f"data.eval_split={HELDOUT}, seed 0",
            "chosen": [{"task": task, "backbone": name, "n": size, "learning_rate": rate}
                       for (task, name, size), rate in sorted(self.chosen.items())]})
        for (task, name, size), rate in sorted(self.chosen.items()):
            self.log(f"lr selection: {task} {name} n={size or 'all'}: {rate:g}")
        return outcome

    def _in_task_sweep(self, task: str, config_file: str | None,
                       overrides: dict[str, Any]) -> Sweep:
        """The in-task masked-LM runs of `task`, one an `in_task_mlm:` backbone,
        in DIR/in_task_mlm/<task>/ (their corpus: its `IN_TASK_TEXT`)."""
        directory = os.path.join(self.directory, IN_TASK_DIR, task)
        corpus = {"data.corpus_files": (os.path.join(directory, IN_TASK_TEXT),),
                  "data.synthetic_documents": 0,
                  "data.data_dir": os.path.join(self.directory, IN_TASK_DIR, "tfds")}
        names = list(self.in_task)
        config = apply_overrides(load_config(config_file), {**corpus, **overrides})
        # The architecture written out, so the workdir's config.json is the
        # model its checkpoints hold (fine-tuning reads it from there).
        return Sweep(config, directory,
                     [{"init_from": self.in_task[name],
                       **architecture_overrides(self.in_task[name], config, "in-task")}
                      for name in names],
                     labels=[{"backbone": name} for name in names], config_file=config_file,
                     base_overrides={**corpus, **overrides}, train_fn=self.train_fn,
                     log=self.log)

    def _in_task_run(self, task: str, backbone: str) -> str:
        """Makes `backbone`'s in-task masked-LM checkpoint for `task` (its text
        first, if missing); its sweep's outcome ('skipped' when already made)."""
        sweep = self.in_task_sweeps[task]
        run = next(r for r in sweep.runs if r.labels["backbone"] == backbone)
        text = sweep.config.data.corpus_files[0]
        if not os.path.isfile(text):
            config = apply_overrides(self.sweeps[task].config,
                                     {"init_from": self.in_task[backbone]})
            count = write_in_task_text(config, text)
            self.log(f"in-task MLM: {task}: wrote the text of {count:,} training examples, "
                     f"without labels, to {text}")
        return sweep.run_one(run, stop_on_error=True)

    def _run_one(self, task: str, sweep: Sweep, run, stop_on_error: bool) -> str:
        """`sweep.run_one(run)`, after its backbone's in-task masked-LM run for
        `task` when it has one and `run` is not finished."""
        backbone = run.labels["backbone"]
        if backbone in self.in_task and not is_finished(run.workdir, sweep.num_steps(run)):
            status = self._in_task_run(task, backbone)
            if status == "interrupted":
                return status
        return sweep.run_one(run, stop_on_error=stop_on_error)

    def run(self, *, stop_on_error: bool = False) -> dict[str, str]:
        """Trains every unfinished run here, stopping after a preempted one: the
        learning-rate selection first, an in-task backbone's masked-LM run
        before its task's first run. Returns {'<task>/<run>' (a selection run:
        'lr_selection/<task>/<run>'): 'skipped' | 'done' | 'failed' |
        'interrupted'}."""
        for sweep in self.in_task_sweeps.values():
            sweep.prepare()
        outcome = self._select_rates(stop_on_error) if self.lr_grid else {}
        if "interrupted" in outcome.values():
            return outcome
        for sweep in self.sweeps.values():
            sweep.prepare()
        self._record()
        for task, sweep, run in self.order:
            outcome[f"{task}/{run.name}"] = self._run_one(task, sweep, run, stop_on_error)
            if outcome[f"{task}/{run.name}"] == "interrupted":
                break
        return outcome

    def _record(self) -> None:
        """DIR/study.json: what `report` reads for the order of tasks and backbones."""
        path = os.path.join(self.directory, STUDY_FILE)
        previous = read_record(path) or {}
        write_json(path, jsonable({
            "config_file": self.config_file,
            "tasks": list(dict.fromkeys([*previous.get("tasks", []), *self.tasks])),
            "backbones": {**previous.get("backbones", {}), **self.backbones},
            "base_overrides": self.base_overrides,
            "train_split_examples": previous.get("train_split_examples", {}),
        }))

    # -- the dry run ---------------------------------------------------------------------

    def plan(self) -> tuple[list[dict], list[str]]:
        """(one row per run in the order they train: task, backbone, n,
        examples, seed, steps, step, status, seconds (done: its wall time;
        else an estimate of what is left), estimated; the estimates' sources).
        Writes nothing. Seconds a step come from the finished runs of the same
        task and architecture in DIR, else from the task's FLOPs a step at the
        peak FLOP/s MFU uses (building the task once per architecture, which
        tokenises its training split); the split's size from study.json, else
        from a built task."""
        cached = (read_record(os.path.join(self.directory, STUDY_FILE)) or {}).get(
            "train_split_examples", {})
        states = {task: {row["name"]: row for row in collect_runs(sweep.directory)}
                  for task, sweep in self.sweeps.items()}
        rates, sources = self._measured_rates(states)
        tasks: dict[tuple, Any] = {}      # (task, architecture) -> a built task
        throughput = None
        rows = []
        for task, sweep, run in self.order:
            key = (task, self.architectures[run.labels["backbone"]])
            if key not in tasks and (key not in rates or task not in cached):
                from bert_jax.tasks import build_task
                overrides = {**run.overrides, SIZE_KEY: 0}
                if run.labels["backbone"] in self.in_task:   # its checkpoint may not exist yet
                    overrides["init_from"] = self.in_task[run.labels["backbone"]]
                with tempfile.TemporaryDirectory() as workdir:
                    tasks[key] = build_task(apply_overrides(sweep.config, overrides), workdir)
                    tasks[key].model_config  # made while the workdir of its vocabulary exists
            if key not in rates:
                throughput = throughput or self._throughput(sweep.config)
                flops = tasks[key].flops_per_step()
                rates[key] = flops / throughput
                sources.append(f"{self._who(key)}: {flops:.3g} FLOPs a step at {throughput:.3g}"
                               " FLOP/s, the peak (config.peak_flops, else the chip's, else a "
                               "matmul timed now): a lower bound on an idle machine, without "
                               "compiling and evaluation")
            if task not in cached:
                cached[task] = len(tasks[key].examples("train"))
            steps = sweep.num_steps(run)
            state = states[task].get(run.name, {})
            status, step = state.get("status", "not started"), state.get("step", 0)
            done = status == "done"
            rows.append({
                "task": task, **run.labels, "examples": run.labels["n"] or cached[task],
                "steps": steps, "step": step, "status": status,
                "seconds": state["wall_seconds"] if done else rates[key] * max(0, steps - step),
                "estimated": not done})
        return rows, sources

    def _who(self, key: tuple) -> str:
        task, architecture = key
        names = [n for n, a in self.architectures.items() if a == architecture]
        return f"{task} from {', '.join(names)}"

    def _measured_rates(self, states: dict[str, dict[str, dict]]
                        ) -> tuple[dict[tuple, float], list[str]]:
        """Seconds a step of each (task, architecture) over its finished runs
        (run.json's wall time: compiling and evaluation included), and where
        each comes from."""
        totals: dict[tuple, list] = collections.defaultdict(lambda: [0.0, 0, 0])
        for task, runs in states.items():
            for row in runs.values():
                backbone = row["labels"].get("backbone")
                if (row["status"] == "done" and row["wall_source"] == "run.json"
                        and backbone in self.architectures and row["num_steps"]):
                    total = totals[(task, self.architectures[backbone])]
                    total[0] += row["wall_seconds"]
                    total[1] += row["num_steps"]
                    total[2] += 1
        rates = {key: seconds / steps for key, (seconds, steps, _) in totals.items()}
        return rates, [f"{self._who(key)}: {rates[key]:.3g} s a step, measured over {runs} "
                       "finished run(s)" for key, (_, _, runs) in totals.items()]

    @staticmethod
    def _throughput(config: Any) -> float:
        import jax
        from bert_jax.training.metrics import peak_flops_per_device
        return peak_flops_per_device(config.get("peak_flops", 0.0)) * jax.device_count()

    def dry_run(self) -> str:
        """The runs (task, backbone, examples, seed, steps, status, time) and the
        time left, as text; trains and writes nothing."""
        rows, sources = self.plan()
        body = [[r["task"], r["backbone"],
                 f"{r['examples']:,}" + (" (all)" if not r["n"] else ""), r["seed"],
                 r["steps"], r["status"] + (f" at {r['step']}" if r["status"] not in (
                     "done", "not started") else ""),
                 human_seconds(r["seconds"], r["estimated"])] for r in rows]
        left = [r for r in rows if r["status"] != "done"]
        counts = collections.Counter(r["status"] for r in rows)
        summary = (f"{len(rows)} runs ({', '.join(f'{n} {s}' for s, n in counts.items())}); "
                   f"left: {human_seconds(sum(r['seconds'] for r in left), True)}")
        notes = "\ntime: a done run's wall time" + (
            "; '~' the estimated time left, from\n" + "".join(f"  {s}\n" for s in sources)
            if sources else "\n")
        def unfinished(sweep: Sweep) -> int:
            return sum(not is_finished(run.workdir, sweep.num_steps(run)) for run in sweep.runs)

        before = [(unfinished(sweep), f"learning-rate selection runs of {task} (lr_grid="
                   f"{','.join(f'{lr:g}' for lr in self.lr_grid)})")
                  for task, sweep in self.selection_sweeps.items()]
        before += [(unfinished(sweep), f"in-task masked-LM runs of {task} "
                    f"({sweep.num_steps(sweep.runs[0])} steps each)")
                   for task, sweep in self.in_task_sweeps.items()]
        before = "".join(f"before these, not timed: {count} {what}\n"
                         for count, what in before if count)
        return markdown_table(["task", "backbone", "examples", "seed", "steps", "status",
                               "time"], body) + notes + before + summary + "\n"


# -- results --------------------------------------------------------------------------------


def parse_metric_flags(specs: Iterable[str]) -> dict[str, str]:
    """`KEY` (every task) or `TASK=KEY` (a task variant or its name, `sst2`)
    texts -> {task or '': metric key}."""
    problems: list[str] = []
    parts = [spec("--metric", text, problems) for text in specs or ()]
    refuse(problems, STUDY_REFUSED)
    return {part["task"] or "": part["key"] for part in parts}


def main_metric(config: dict | None, logged: Iterable[str]) -> str | None:
    """The task's headline metric among the logged keys: GLUE's F1 where the
    task reports it (MRPC, QQP), else its first metric (accuracy, Pearson,
    Matthews); tagging's entity F1 (BIO tags), else word accuracy; SQuAD's
    F1; else the first eval/* key."""
    logged = set(logged)
    kind, data = (config or {}).get("task"), (config or {}).get("data", {})
    candidates: list[str] = []
    if kind == "glue":
        from bert_jax.data import glue
        names = glue.get_task(data["glue_task"]).metrics
        candidates = ["f1"] if "f1" in names else list(names[:1])
    elif kind == "tagging":
        candidates = ["entity_f1", "tag_accuracy"]
    elif kind == "squad":
        candidates = ["f1"]
    return next((f"eval/{c}" for c in candidates if f"eval/{c}" in logged),
                min((k for k in logged if k.startswith("eval/")), default=None))


def collect(directory: str) -> tuple[list[dict], dict]:
    """(one record per study run in DIR: task, backbone, n, seed, status,
    metrics, wall_seconds, config, workdir; DIR/study.json or {}). Tasks in
    study.json's order, then any other DIR/<task>/sweep.json."""
    study = read_record(os.path.join(directory, STUDY_FILE)) or {}
    try:
        others = sorted(d for d in os.listdir(directory)
                        if os.path.isfile(os.path.join(directory, d, SWEEP_FILE)))
    except OSError:
        others = []
    records = [{"task": task, **{k: row["labels"][k] for k in LABELS},
                **{k: row[k] for k in ("status", "metrics", "wall_seconds", "config", "workdir")}}
               for task in dict.fromkeys([*study.get("tasks", []), *others])
               for row in collect_runs(os.path.join(directory, task))
               if all(k in row["labels"] for k in LABELS)]
    return records, study


def aggregate(records: Iterable[dict]) -> list[dict]:
    """Records (task, metric, backbone, examples, seed, value, wall_seconds)
    -> one row per task x backbone x examples, in the records' order of tasks
    and backbones and by examples: seeds, mean, sd (sample, ddof=1; None for
    one seed), min, max, wall_seconds (mean; None when none is known)."""
    groups: dict[tuple, list[dict]] = {}
    for record in records:
        if record.get("value") is not None and not math.isnan(record["value"]):
            groups.setdefault((record["task"], record["backbone"], record["examples"]),
                              []).append(record)
    tasks = list(dict.fromkeys(k[0] for k in groups))
    backbones = list(dict.fromkeys(k[1] for k in groups))
    rows = []
    for (task, backbone, examples), members in sorted(
            groups.items(), key=lambda item: (tasks.index(item[0][0]),
                                              backbones.index(item[0][1]), item[0][2])):
        values = [float(m["value"]) for m in members]
        walls = [m["wall_seconds"] for m in members if m.get("wall_seconds") is not None]
        rows.append({
            "task": task, "metric": members[0]["metric"], "backbone": backbone,
            "train_examples": examples, "seeds": len(values),
            "mean": statistics.fmean(values),
            "sd": statistics.stdev(values) if len(values) > 1 else None,
            "min": min(values), "max": max(values),
            "wall_seconds": statistics.fmean(walls) if walls else None})
    return rows


CSV_COLUMNS = ("task", "metric", "backbone", "train_examples", "seeds", "mean", "sd", "min",
               "max", "wall_seconds")


def write_results(rows: Sequence[dict], directory: str, full: dict[str, int]) -> str:
    """DIR/results.csv and DIR/results.md (a table a task, under its name and
    metric); returns the Markdown. `full`: {task: training split size}, to
    mark the whole-split rows."""
    os.makedirs(directory, exist_ok=True)
    write_csv(os.path.join(directory, CSV_FILE),
              [list(CSV_COLUMNS), *([r[c] for c in CSV_COLUMNS] for r in rows)])
    sections = []
    for task in dict.fromkeys(r["task"] for r in rows):
        mine = [r for r in rows if r["task"] == task]
        body = [[r["backbone"], f"{r['train_examples']:,}" + (
                    " (all)" if r["train_examples"] == full.get(task) else ""),
                 r["seeds"], number(r["mean"]), number(r["sd"]), number(r["min"]),
                 number(r["max"]), human_seconds(r["wall_seconds"])] for r in mine]
        sections.append(f"## {task}: {mine[0]['metric']}\n\n" + markdown_table(
            ["backbone", "examples", "seeds", "mean", "sd", "min", "max", "wall time"],
            body))
    text = "\n".join(sections)
    with open(os.path.join(directory, MARKDOWN_FILE), "w") as f:
        f.write(text)
    return text


def plot_learning_curves(rows: Sequence[dict], path: str) -> str:
    """The metric against labelled training examples (log x), a panel a task,
    a line a backbone (its mean over seeds, +-1 sample sd shaded; a point with
    an error bar when a backbone has one size). Writes and returns `path`."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter

    tasks = list(dict.fromkeys(r["task"] for r in rows))
    colours = {b: f"C{i}" for i, b in enumerate(dict.fromkeys(r["backbone"] for r in rows))}
    columns = min(len(tasks), 2) or 1
    lines = math.ceil(len(tasks) / columns) or 1
    fig = Figure(figsize=(5.5 * columns, 4 * lines))
    axes = fig.subplots(lines, columns, squeeze=False).ravel()
    for ax, task in zip(axes, tasks):
        mine = [r for r in rows if r["task"] == task]
        for backbone, colour in colours.items():
            points = sorted((r for r in mine if r["backbone"] == backbone),
                            key=lambda r: r["train_examples"])
            if not points:
                continue
            xs = [p["train_examples"] for p in points]
            means = [p["mean"] for p in points]
            sds = [p["sd"] or 0.0 for p in points]
            low, high = min(p["seeds"] for p in points), max(p["seeds"] for p in points)
            label = f"{backbone} ({low if low == high else f'{low}-{high}'} seed" + (
                "s)" if high > 1 else ")")
            if len(points) == 1:
                ax.errorbar(xs, means, yerr=sds, color=colour, marker="o", capsize=4,
                            label=label)
            else:
                ax.plot(xs, means, color=colour, marker="o", label=label)
                ax.fill_between(xs, [m - s for m, s in zip(means, sds)],
                                [m + s for m, s in zip(means, sds)], color=colour,
                                alpha=0.2, linewidth=0)
        ax.set_xscale("log")
        sizes = sorted({r["train_examples"] for r in mine})  # ticks at the study's sizes
        ax.set_xticks(sizes, [f"{size:,}" for size in sizes])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set(xlabel="labelled training examples", ylabel=mine[0]["metric"], title=task)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8, loc="best")
    for ax in axes[len(tasks):]:
        ax.set_visible(False)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    return path


def report(directory: str, metrics: dict[str, str] | None = None) -> tuple[str, list[dict]]:
    """Tabulates and plots DIR's finished runs (results.csv, results.md,
    learning_curves.png); returns (the Markdown, the rows). `metrics`: {task
    variant, its name or '': metric key} (default `main_metric`). The whole
    split's size is cached in study.json (computed from a run's config.json)."""
    from bert_jax.training.evaluation import saved_config

    metrics = dict(metrics or {})
    records, study = collect(directory)
    tasks = list(dict.fromkeys(r["task"] for r in records))
    unknown = [t for t in metrics if t and t not in tasks
               and t not in {task.split(",")[0] for task in tasks}]
    refuse([f"--metric names tasks {unknown} that {directory} does not hold (it holds "
            f"{', '.join(tasks) or 'none'})"] if unknown else [], STUDY_REFUSED)
    full = dict(study.get("train_split_examples", {}))
    computed = False
    values = []
    for task in tasks:
        done = [r for r in records if r["task"] == task and r["status"] == "done"]
        if not done:
            continue
        metric = next((metrics[k] for k in (task, task.split(",")[0], "") if k in metrics),
                      None) or main_metric(done[0]["config"], {
                          k for r in done for k in r["metrics"]})
        if any(not r["n"] for r in done) and task not in full:
            full[task] = train_split_size(saved_config(next(
                r["workdir"] for r in done if not r["n"])))
            computed = True
        values += [{"task": task, "metric": metric, "backbone": r["backbone"],
                    "examples": r["n"] or full[task], "seed": r["seed"],
                    "value": r["metrics"].get(metric), "wall_seconds": r["wall_seconds"]}
                   for r in done]
    if computed and study:
        write_json(os.path.join(directory, STUDY_FILE),
                   jsonable({**study, "train_split_examples": full}))
    rows = aggregate(values)
    if not rows:
        refuse([f"{directory} holds no finished run of a study (with its metric)"],
               STUDY_REFUSED)
    text = write_results(rows, directory, full)
    plot_learning_curves(rows, os.path.join(directory, FIGURE_FILE))
    return text, rows
