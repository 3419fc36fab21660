"""The files of a training workdir, and their readers, importable without JAX so
that light tools can use them (the sweep runner reads a run's files while it
trains).

A workdir holds the resolved config the trainer writes (`config.json`), the
metrics log (`metrics.jsonl`, one JSON object per line, `{"step": N,
"train/loss": ..., ...}`), the checkpoint folders `checkpoints/<step>` and the
lock of the run writing there (`train.lock`, `workdir_lock.WorkdirLock`), and the
vocabulary (`vocab/`).
`check_workdir` is the one guard of that shape, run before anything reads or
writes a workdir, and `check_step` of the step folder a command reads. Every
reader of the metrics goes through `read_metrics`, which returns the records in
file order and reports a damaged line instead of dropping it silently;
`checkpoint_steps` lists the checkpoints, and `refuse_writing_into` keeps the
commands that read a workdir from writing into it.
"""

from __future__ import annotations

import json
import os
from typing import Any

from absl import logging

from bert_jax.errors import CheckpointError, WorkdirError, where
from bert_jax.workdir_layout import (  # noqa: F401 (re-exported)
    CHECKPOINT_DIR, CONFIG_FILE, checkpoint_steps, is_step_name)

METRICS_FILE = "metrics.jsonl"  # one JSON object a line: {"step": N, "train/loss": ...}
VOCAB_DIR = "vocab"             # the vocabulary files (= bert_jax.data.vocabulary.VOCAB_DIR)
LOCK_FILE = "train.lock"        # the lock of the run writing there: `workdir_lock.WorkdirLock`
# What a training run makes in its workdir, by kind (`check_workdir`).
ENTRY_KINDS = {CONFIG_FILE: "file", METRICS_FILE: "file", LOCK_FILE: "file",
               CHECKPOINT_DIR: "folder", VOCAB_DIR: "folder"}
def refuse_writing_into(outputs: dict[str, str | None], read: dict[str, str | None]) -> None:
    """Raises a `WorkdirError` when an output of a command, `outputs` ({what: path},
    `what` naming its flag, e.g. "--output=FILE"), resolves (symbolic links followed)
    into a folder the command reads, `read` ({flag: folder}, e.g. {"--workdir": W}): a
    command that reads a training run's files never writes among them. None: not
    given. Every command that reads a workdir or a model folder checks its outputs
    here before it starts (evaluate, ablate, visualize_attention, extract_features,
    --save_average, a transfer study's runs)."""
    for what, path in outputs.items():
        for flag, folder in read.items():
            if path and folder and _inside(os.path.realpath(path), folder):
                resolved = os.path.realpath(path)
                alias = f" (it is {resolved})" if resolved != os.path.abspath(path) else ""
                raise WorkdirError(
                    f"{what}{alias} lies inside {flag}={folder}, which this command reads: "
                    "it never writes among a training run's files. Choose a path outside "
                    f"{os.path.realpath(folder)}.")


def read_metrics(workdir: str) -> list[dict[str, Any]]:
    """The records of WORKDIR/metrics.jsonl in file order (none when it is absent),
    each a dict with an int "step". Damage never drops a record silently: see
    `parse_metrics`; what it finds is logged once per process (one warning naming
    FILE:LINE), as the sweep runner reads the file again and again."""
    path = os.path.join(workdir, METRICS_FILE)
    records, problems = parse_metrics(path)
    report_metrics_damage(path, problems)
    return records


def parse_metrics(path: str) -> tuple[list[dict[str, Any]], list[str]]:
    """(records, problems) of a metrics file: a line that is not one JSON record
    (torn by a crash, edited) is skipped and named, the records after it kept; two
    or more records on one line (a lost newline) are all kept; bytes that are not
    UTF-8 are replaced by U+FFFD. A last line without its newline may be one the
    trainer is writing: skipped unreported (a resume drops it)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return [], []
    records, problems = [], []
    lines = data.split(b"\n")
    for number, raw in enumerate(lines, 1):
        try:
            text, replaced = raw.decode("utf-8"), False
        except UnicodeDecodeError:
            text, replaced = raw.decode("utf-8", errors="replace"), True
        found, damaged = _json_records(text)
        records.extend(found)
        writing = number == len(lines)  # no newline after it (yet)
        what = [*(["bytes that are not UTF-8, replaced by U+FFFD"] if replaced else []),
                *([f"{len(found)} records on one line (a lost newline): all kept"]
                  if len(found) > 1 and not damaged else []),
                *([f"not a JSON record{f' ({len(found)} recovered from it)' if found else ''}"
                   ", skipped"] if damaged and not writing else [])]
        if what:
            problems.append(f"{where(path, number)}: {'; '.join(what)}")
    return records, problems


def _json_records(text: str) -> tuple[list[dict[str, Any]], bool]:
    """The {"step": int, ...} objects in `text`, one after another, and whether
    anything else was there; after a damaged part the search restarts at the next
    "{" (a torn record followed by whole ones)."""
    decoder, records, damaged, position = json.JSONDecoder(), [], False, 0
    while True:
        while position < len(text) and text[position].isspace():
            position += 1
        if position == len(text):
            return records, damaged
        try:
            value, position = decoder.raw_decode(text, position)
        except ValueError:
            damaged, position = True, text.find("{", position + 1)
            if position < 0:
                return records, damaged
            continue
        step = value.get("step") if isinstance(value, dict) else None
        if isinstance(step, int) and not isinstance(step, bool):
            records.append(value)
        else:
            damaged = True


_REPORTED: set[tuple[str, ...]] = set()


def report_metrics_damage(path: str, problems: list[str], kept: str | None = None) -> None:
    """One warning for `problems` (of `parse_metrics`), unless already given;
    `kept`: where the damaged file was copied before it was rewritten."""
    if problems and (kept or tuple(problems) not in _REPORTED):
        _REPORTED.add(tuple(problems))  # the problems name the file
        logging.warning("%s.%s", "; ".join(problems),
                        f" The file as it was is kept as {kept}." if kept else "")


def check_workdir(workdir: str) -> None:
    """Raises a `WorkdirError` naming the first entry of `workdir` that is not what a
    training run makes there, and what to do: an entry of `ENTRY_KINDS` of the other
    kind (or a link that leads nowhere) or unreadable, or in `checkpoints/` a name of
    digits that are not ASCII. Run once before anything reads or writes the workdir
    (the trainer, `evaluation.saved_config`), so that no command reads a part of it
    and writes over the rest: a resume never starts from step 0 beside a
    `checkpoints` it cannot read."""
    for name, kind in ENTRY_KINDS.items():
        path = os.path.join(workdir, name)
        problem = _entry_problem(path, kind)
        if problem:
            raise WorkdirError(f"{path} {problem}: it is not what a training run makes "
                               "there. Move it out of the workdir or fix it, then rerun.")
    directory = os.path.join(workdir, CHECKPOINT_DIR)
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else ():
        if name.isdigit() and not is_step_name(name):
            raise WorkdirError(f"{os.path.join(directory, name)}: a step folder is named by "
                               f"ASCII digits (0-9), and {name!r} is not. Rename it or move "
                               f"it out of {directory}, then rerun.")


def check_step(workdir: str, step: int | None, flag: str | None) -> int | None:
    """`step`, else the latest of `checkpoint_steps` (None: there is none), once its
    folder is found sound: a folder one can read, not empty, and a symbolic link only
    into the workdir. Else a `CheckpointError` naming its real problem and, as `--FLAG`
    (`rerun_with`), the last earlier step that is sound. A step that does not exist is
    left to the caller."""
    directory = os.path.join(workdir, CHECKPOINT_DIR)
    steps = checkpoint_steps(directory)
    step = steps[-1] if step is None and steps else step
    problem = step in steps and _step_problem(workdir, step)
    if not problem:
        return step
    earlier = max((s for s in steps if s < step and not _step_problem(workdir, s)),
                  default=None)
    use = (f"no earlier step holds a checkpoint: move it out of {directory}"
           if earlier is None else f"use --{flag}={earlier}" if flag else
           f"the last sound step before it is {earlier}")
    raise CheckpointError(
        f"step {step} ({os.path.join(directory, str(step))}) {problem}: {use}.", damaged=True,
        rerun_with={flag: earlier} if flag and earlier is not None else None)


def _step_problem(workdir: str, step: int) -> str | None:
    """What is wrong with the folder of `step` (see `check_step`), or None."""
    path = os.path.join(workdir, CHECKPOINT_DIR, str(step))
    problem = _entry_problem(path, "folder")
    if problem is None and os.path.islink(path) and not _inside(
            os.path.realpath(path), workdir, os.path.join(workdir, CHECKPOINT_DIR)):
        problem = f"is a symbolic link out of the workdir (to {os.path.realpath(path)})"
    if problem or os.listdir(path):
        return problem
    return "is empty: no checkpoint was saved there"


def _entry_problem(path: str, kind: str) -> str | None:
    """What is wrong with `path`, which must be a `kind` ("file" or "folder") that this
    process can read; None when nothing is, or it does not exist."""
    if not os.path.lexists(path):
        return None
    if not os.path.exists(path):
        return "is a symbolic link that leads nowhere (a loop, or its target is gone)"
    actual = "folder" if os.path.isdir(path) else "file" if os.path.isfile(path) else (
        "special file")
    if actual != kind:
        return f"is a {actual}, not a {kind}"
    if not os.access(path, os.R_OK | (os.X_OK if kind == "folder" else 0)):
        return "cannot be read (its permissions)"
    return None


def _inside(path: str, *folders: str) -> bool:
    """Whether the resolved `path` lies in one of `folders` (symbolic links followed)."""
    return any(os.path.commonpath([path, os.path.realpath(f)]) == os.path.realpath(f)
               for f in folders)
