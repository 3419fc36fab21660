"""Every way into a workdir ends in one line and loses nothing (issue 38): Ctrl-C while
training, a damaged metrics.jsonl, an edited config.json, lock files of dead, live,
other and unreadable holders. Each launcher case checks the exit status, the one
`error:` line naming the thing, and that the workdir's files are unchanged except
what the command is meant to write."""

import errno
import hashlib
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from bert_jax.errors import CheckpointError, DamagedFileError
from bert_jax.training import averaging, trainer
from bert_jax.training.checkpoints import Checkpointer
from bert_jax.training.evaluation import saved_config
from bert_jax.training.preemption import PreemptionWatcher
from bert_jax.training.workdir import (
    LOCK_FILE, METRICS_FILE, WorkdirError, check_step, check_workdir, checkpoint_steps,
    parse_metrics, read_metrics, refuse_writing_into)
from bert_jax.training.workdir_lock import WorkdirLock
from helpers import REPO, RUN_AS_SCRIPT, finish, launch, tiny_config

import cli

RUN = {"train.num_steps": 20, "train.checkpoint_every": 10, "train.log_every": 5,
       "train.eval_every": 20, "optimizer.warmup_steps": 5, "train.keep_best": 0,
       "train.keep_last": 5, "data.bleu_examples": 0}
LONG = {**RUN, "train.num_steps": 100000, "train.checkpoint_every": 100000,
        "train.eval_every": 100000}


@pytest.fixture(scope="session")
def trained_once(tmp_path_factory, data_dir):
    """The tiny experiment, 20 steps (checkpoints 10 and 20), trained once a session."""
    workdir = tmp_path_factory.mktemp("trained")
    trainer.train_and_evaluate(tiny_config(data_dir, **RUN), str(workdir))
    return workdir


@pytest.fixture
def workdir(trained_once, tmp_path):
    """A copy of the trained workdir for one test."""
    return pathlib.Path(shutil.copytree(trained_once, tmp_path / "run"))


def snapshot(directory) -> dict[str, str]:
    """relative path -> sha256 of every file under `directory`."""
    root = pathlib.Path(directory)
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def changed(before: dict, after: dict) -> set[str]:
    """The files added, removed or modified between two snapshots."""
    return {path for path in set(before) | set(after) if before.get(path) != after.get(path)}


def errors(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error:")]


def wait_for_step_after(process, step: int) -> None:
    """Reads the process's output until it logs a training step after `step`."""
    lines = []
    for line in process.stdout:
        if " | loss " in line and int(line.split("step ")[1].split("/")[0]) > step:
            return
        lines.append(line)
    code, rest = finish(process)
    pytest.fail(f"exited ({code}) before logging a step after {step}:\n"
                + "".join(lines[-30:]) + rest)


# ----------------------------------------------------------------------------
# Ctrl-C (SIGINT) while training.


@pytest.mark.slow
def test_ctrl_c_saves_the_step_and_stops_like_sigterm(workdir, data_dir, caplog):
    before = snapshot(workdir)
    process = launch("train.py", workdir, {**LONG, "data.data_dir": data_dir})
    wait_for_step_after(process, 20)
    process.send_signal(signal.SIGINT)
    code, out = finish(process)
    assert code == 0 and "Traceback" not in out and not errors(out), out
    step = int(out.split("stopping after the preemption checkpoint at step ")[1].split(".")[0])
    assert step > 20 and Checkpointer(str(workdir), read_only=True).all_steps() == [10, 20, step]
    assert not (workdir / LOCK_FILE).exists()
    written = changed(before, snapshot(workdir))
    assert {p for p in written if not p.startswith((f"checkpoints/{step}/", "tensorboard/"))
            } <= {METRICS_FILE, "config.json"}, written  # config.json: the run's train.*

    config = tiny_config(data_dir, **{**RUN, "train.num_steps": step + 2})
    with caplog.at_level("INFO", logger="absl"):
        trainer.train_and_evaluate(config, str(workdir))
    assert f"resumed from {workdir}/checkpoints/{step}" in caplog.text
    assert read_metrics(workdir)[-1]["step"] == step + 2
    assert Checkpointer(str(workdir), read_only=True).all_steps() == [10, 20, step, step + 2]


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once_in_one_line(workdir, data_dir):
    process = launch("train.py", workdir, {**LONG, "data.data_dir": data_dir})
    wait_for_step_after(process, 20)
    process.send_signal(signal.SIGINT)
    for line in process.stdout:  # the first is handled: the second is not merged into it
        if "SIGINT received" in line:
            break
    process.send_signal(signal.SIGINT)
    code, out = finish(process)
    assert code == cli.EXIT_INTERRUPTED and "Traceback" not in out, out
    assert errors(out) == ["error: interrupted (Ctrl-C)"], out
    assert not (workdir / LOCK_FILE).exists()


def test_watcher_turns_ctrl_c_into_a_checkpoint_then_a_keyboard_interrupt():
    previous = signal.getsignal(signal.SIGINT)
    watcher = PreemptionWatcher()
    try:
        assert not watcher.requested(1)
        os.kill(os.getpid(), signal.SIGINT)  # handled before os.kill returns
        with pytest.raises(KeyboardInterrupt):  # before the save began: at once
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        watcher.close()
    assert signal.getsignal(signal.SIGINT) is previous


def test_signals_while_the_final_save_runs_are_acknowledged_not_obeyed(caplog):
    """Once the run is stopping (its checkpoint is being saved), SIGTERM and Ctrl-C
    interrupt nothing: one line says so, and a Ctrl-C is raised when the watcher closes
    (after the save and the lock's release)."""
    previous = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)]
    watcher = PreemptionWatcher()
    with caplog.at_level("WARNING", logger="absl"):
        os.kill(os.getpid(), signal.SIGTERM)
        assert watcher.requested(2)  # the save begins
        for signum in (signal.SIGTERM, signal.SIGINT) * 3:
            os.kill(os.getpid(), signum)
        with pytest.raises(KeyboardInterrupt):
            watcher.close()
    again = [r.getMessage() for r in caplog.records if "received again" in r.getMessage()]
    assert len(again) == 1 and again[0].startswith("SIGTERM received again"), again
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)] == previous


@pytest.mark.slow
def test_sigterm_again_and_again_never_tears_the_preemption_save(workdir, data_dir):
    """SIGTERM, then every 0.15 s until the process ends, while the save's commit takes
    3 s (a slow bucket): the checkpoint is complete, the lock released, exit 0."""
    process = launch("train.py", workdir, {**LONG, "data.data_dir": data_dir},
                     python_code=SLOW_COMMIT)
    wait_for_step_after(process, 20)
    while process.poll() is None:
        process.send_signal(signal.SIGTERM)
        time.sleep(0.15)
    code, out = finish(process)
    assert code == 0 and "Traceback" not in out and not errors(out), out
    assert len(re.findall("SIGTERM received again", out)) == 1, out
    step = int(out.split("stopping after the preemption checkpoint at step ")[1].split(".")[0])
    assert sorted(os.listdir(workdir / "checkpoints")) == ["10", "20", str(step)]
    assert not (workdir / LOCK_FILE).exists()


SLOW_COMMIT = """
import os, runpy, sys, time
from bert_jax.training import workdir_lock
fence = workdir_lock.WorkdirLock.fence
def slow(self):  # runs where Orbax commits an asynchronous save
    time.sleep(3)
    fence(self)
workdir_lock.WorkdirLock.fence = slow
""" + RUN_AS_SCRIPT


def test_a_ctrl_c_a_callback_swallows_still_stops_the_command(tmp_path):
    """The Ctrl-C lands inside a garbage-collection callback (as in JAX's), which Python
    would report as "Exception ignored" and go on: the command stops in one line."""
    script = tmp_path / "script.py"
    script.write_text(f"import gc, sys, time\nsys.path.insert(0, {str(REPO / 'launch')!r})\n"
                      "import cli\nslow = [True]\n"
                      "def callback(phase, info):  # slow until the Ctrl-C lands in it\n"
                      "    try:\n        time.sleep(1 if slow else 0)\n"
                      "    except KeyboardInterrupt:\n        slow.clear()\n        raise\n"
                      "def main(argv):\n    gc.callbacks.append(callback)\n"
                      "    print('ready', flush=True)\n"
                      "    while True:\n        gc.collect()\n        time.sleep(0.01)\n"
                      "cli.run(main)\n")
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "ready\n"
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == cli.EXIT_INTERRUPTED
    assert stderr == "error: interrupted (Ctrl-C)\n"


def test_a_thread_that_never_ends_does_not_hold_a_ctrl_c_exit(tmp_path):
    """A Ctrl-C that leaves a library's (non-daemon) thread waiting forever still ends
    the process, with its one line, within the grace period."""
    script = tmp_path / "script.py"
    script.write_text(f"import sys, threading\nsys.path.insert(0, {str(REPO / 'launch')!r})\n"
                      "import cli\ncli.EXIT_GRACE_SECONDS = 1\n"
                      "def main(argv):\n    threading.Thread(target=threading.Event().wait)"
                      ".start()\n    raise KeyboardInterrupt\ncli.run(main)\n")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == cli.EXIT_INTERRUPTED
    assert result.stderr == "error: interrupted (Ctrl-C)\n"


def test_cli_reports_a_keyboard_interrupt_in_one_line(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(REPO / 'launch')!r})\n"
                      "import cli\ndef main(argv):\n    raise KeyboardInterrupt\n"
                      "cli.run(main)\n")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert result.returncode == cli.EXIT_INTERRUPTED
    assert result.stderr == "error: interrupted (Ctrl-C)\n"


# ----------------------------------------------------------------------------
# metrics.jsonl: damage is reported, never silently drops a record.

RECORDS = [{"step": s, "train/loss": 4.0 - s / 10} for s in (5, 10, 15, 20)]


def _metrics_file(tmp_path, lines: list[bytes]) -> pathlib.Path:
    path = tmp_path / METRICS_FILE
    path.write_bytes(b"".join(lines))
    return path


def _lines() -> list[bytes]:
    return [json.dumps(r).encode() + b"\n" for r in RECORDS]


@pytest.mark.parametrize("damage, steps, problem", [
    # A torn line in the middle: skipped, the records after it kept.
    (lambda lines: [lines[0], lines[1][:12] + b"\n", *lines[2:]], [5, 15, 20],
     "not a JSON record"),
    # Lines 2 and 3 joined (a lost newline): both records kept.
    (lambda lines: [lines[0], lines[1].rstrip(b"\n"), *lines[2:]], [5, 10, 15, 20],
     "2 records on one line"),
    # A torn record and a whole one on one line: the whole one kept.
    (lambda lines: [lines[0], lines[1][:12], *lines[2:]], [5, 15, 20], "(1 recovered"),
    # A byte that is not UTF-8 inside a key: replaced, the record kept.
    (lambda lines: [lines[0], lines[1].replace(b"train/", b"tr\xffin/"), *lines[2:]],
     [5, 10, 15, 20], "not UTF-8"),
    # A JSON value that is no record (no "step").
    (lambda lines: [lines[0], b'{"train/loss": 1.0}\n', *lines[2:]], [5, 15, 20],
     "not a JSON record"),
])
def test_damaged_metrics_lines_are_named_and_the_rest_kept(tmp_path, caplog, damage,
                                                          steps, problem):
    path = _metrics_file(tmp_path, damage(_lines()))
    content = path.read_bytes()
    with caplog.at_level("WARNING", logger="absl"):
        records = read_metrics(str(tmp_path))
    assert [r["step"] for r in records] == steps
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and f"{path}:2: " in warnings[0] and problem in warnings[0]
    assert path.read_bytes() == content  # reading writes nothing


def test_a_torn_last_line_is_one_being_written(tmp_path, caplog):
    path = _metrics_file(tmp_path, [*_lines()[:3], _lines()[3][:15]])
    with caplog.at_level("WARNING", logger="absl"):
        assert [r["step"] for r in read_metrics(str(tmp_path))] == [5, 10, 15]
    assert not caplog.records
    assert parse_metrics(str(path)) == (RECORDS[:3], [])
    assert parse_metrics(str(tmp_path / "absent.jsonl")) == ([], [])


def test_the_same_damage_is_reported_once(tmp_path, caplog):
    _metrics_file(tmp_path, [_lines()[0], b"garbage\n"])
    with caplog.at_level("WARNING", logger="absl"):
        for _ in range(3):  # the sweep runner reads the file again and again
            read_metrics(str(tmp_path))
    assert len(caplog.records) == 1


@pytest.mark.slow
def test_a_resume_keeps_every_record_and_the_damaged_file(workdir, data_dir, caplog):
    path = workdir / METRICS_FILE
    lines = path.read_bytes().splitlines(keepends=True)  # steps 5, 10, 15, 20
    damaged = lines[0] + lines[1].rstrip(b"\n") + lines[2] \
        + lines[3].replace(b"train/", b"tr\xffin/")  # 10 and 15 on line 2, 20 on line 3
    path.write_bytes(damaged)
    before = snapshot(workdir)
    with caplog.at_level("WARNING", logger="absl"):
        trainer.train_and_evaluate(tiny_config(data_dir, **{**RUN, "train.num_steps": 25}),
                                   str(workdir))
    assert [m["step"] for m in read_metrics(workdir)] == [5, 10, 15, 20, 25]
    copies = list(workdir.glob(f"{METRICS_FILE}.damaged-*"))
    assert len(copies) == 1 and copies[0].read_bytes() == damaged  # nothing is lost
    warning = next(r.getMessage() for r in caplog.records if METRICS_FILE in r.getMessage())
    assert f"{path}:2: 2 records" in warning and f"{path}:3: bytes that are not UTF-8" \
        in warning and str(copies[0]) in warning
    written = changed(before, snapshot(workdir))
    rest = {p for p in written if not p.startswith(("checkpoints/25/", "tensorboard/"))}
    assert {METRICS_FILE, copies[0].name} <= rest <= {METRICS_FILE, copies[0].name,
                                                       "config.json"}, written


# ----------------------------------------------------------------------------
# config.json with a key under "model" the model config does not know.


def _add_model_key(workdir, key="hidden_sise"):
    config = json.loads((workdir / "config.json").read_text())
    config["model"][key] = 64
    (workdir / "config.json").write_text(json.dumps(config, indent=2))


@pytest.mark.slow
@pytest.mark.parametrize("script", ["evaluate.py", "translate.py", "train.py"])
def test_an_unknown_model_key_in_config_json_is_one_line(workdir, data_dir, script):
    _add_model_key(workdir)
    before = snapshot(workdir)
    config = "tiny_translate.py" if script == "train.py" else None
    overrides = {**RUN, "data.data_dir": data_dir} if config else {}
    code, out = finish(launch(script, workdir, overrides, config=config,
                              stdin=subprocess.DEVNULL))  # translate.py's default input
    assert code == cli.EXIT_USER_ERROR and "Traceback" not in out, out
    (line,) = errors(out)
    assert f"{workdir}/config.json: model.hidden_sise " in line and "model.hidden_size" \
        in line and "remove" in line, line
    assert snapshot(workdir) == before


@pytest.fixture
def workdir_config(tmp_path):
    """A workdir holding only a config.json of the tiny experiment with two unknown
    model keys."""
    config = json.loads(tiny_config("").to_json_best_effort())
    config["model"].update(a=1, b=2)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_every_unknown_model_key_is_named(workdir_config):
    with pytest.raises(DamagedFileError, match=r"config\.json: model\.a, model\.b are not"):
        saved_config(str(workdir_config))


def test_a_config_json_that_is_no_object_is_named(tmp_path):
    (tmp_path / "config.json").write_text("[1]")
    with pytest.raises(DamagedFileError, match=f"{tmp_path}/config.json holds a JSON list"):
        saved_config(str(tmp_path))


# ----------------------------------------------------------------------------
# The lock: a lease of `timeout` seconds, told by a fake clock.

HOST = socket.gethostname()
NOW = 1_700_000_000.0


class Clock:
    def __init__(self, now: float = NOW):
        self.now = now

    def __call__(self) -> float:
        return self.now


def _write_lock(tmp_path, content, mtime: float = NOW) -> pathlib.Path:
    lock = tmp_path / LOCK_FILE
    lock.write_text(content if isinstance(content, str) else json.dumps(content))
    os.utime(lock, (mtime, mtime))
    return lock


def _lock(tmp_path, clock=None, timeout=600) -> WorkdirLock:
    return WorkdirLock(str(tmp_path), timeout=timeout, clock=clock or Clock())


def test_a_live_pid_of_this_host_without_the_flock_is_not_called_dead(tmp_path, caplog):
    _write_lock(tmp_path, {"host": HOST, "pid": 1, "renewed": NOW - 30})
    with caplog.at_level("WARNING", logger="absl"), _lock(tmp_path):
        pass
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "pid 1 of this host" in warning and "no longer holds it" in warning
    assert "not running" not in warning  # pid 1 runs: only the flock was checked


def test_another_hosts_fresh_lock_is_refused_naming_the_holder_and_time_left(tmp_path):
    lock = _write_lock(tmp_path, {"host": "vm-old", "pid": 77, "renewed": NOW - 240})
    content = lock.read_bytes()
    with pytest.raises(WorkdirError) as error:
        _lock(tmp_path)
    message = str(error.value)
    assert len(message.splitlines()) == 1
    assert "pid 77 on host vm-old (lock last renewed " in message
    assert "--lock_timeout=600 s (in 6 min)" in message and f"delete {lock}" in message
    assert lock.read_bytes() == content


def test_another_hosts_stale_lock_is_taken_over_naming_it(tmp_path, caplog):
    lock = _write_lock(tmp_path, {"host": "vm-old", "pid": 77, "renewed": NOW - 601})
    clock = Clock()
    with caplog.at_level("WARNING", logger="absl"), _lock(tmp_path, clock) as held:
        record = json.loads(lock.read_text())
        assert (record["host"], record["pid"], record["renewed"]) == (HOST, os.getpid(), NOW)
        clock.now += 60
        assert held.renew() and json.loads(lock.read_text())["renewed"] == NOW + 60
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "took over the lock of pid 77 on host vm-old: not renewed since" in warning
    assert "10 min ago, more than --lock_timeout=600 s" in warning
    assert not lock.exists()  # released


def test_a_renewed_lock_stays_refused_past_its_start(tmp_path):
    """The lease counts from the last renewal, not from when the run started."""
    clock = Clock()
    with _lock(tmp_path, clock) as held:
        record = json.loads((tmp_path / LOCK_FILE).read_text())
        clock.now += 3600
        held.renew()
        renewed = json.loads((tmp_path / LOCK_FILE).read_text())
        assert renewed["renewed"] == NOW + 3600 and renewed["started"] == record["started"]
        other = {**renewed, "host": "vm-other"}
    lock = _write_lock(tmp_path, other)
    with pytest.raises(WorkdirError, match="pid .* on host vm-other"):
        _lock(tmp_path, Clock(NOW + 3600 + 599))
    with _lock(tmp_path, Clock(NOW + 3600 + 601)):
        assert json.loads(lock.read_text())["host"] == HOST


@pytest.mark.parametrize("content", ["[1]", "", "{\"host\": \"vm\"", "not json"])
def test_an_unreadable_lock_is_refused_while_recent_then_taken_over(tmp_path, caplog,
                                                                    content):
    lock = _write_lock(tmp_path, content, mtime=NOW - 60)
    with pytest.raises(WorkdirError) as error:
        _lock(tmp_path)
    assert str(error.value).startswith(f"{lock} is an unreadable lock (not a JSON lock record")
    assert "(in 9 min)" in str(error.value) and len(str(error.value).splitlines()) == 1
    assert lock.read_text() == content
    with caplog.at_level("WARNING", logger="absl"), _lock(tmp_path, Clock(NOW + 541)):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert "took over an unreadable lock" in caplog.records[0].getMessage()


@pytest.mark.parametrize("renewed", ["NaN", "Infinity", "1e300", "-1e300", str(NOW + 86400),
                                     '"yesterday"'])
def test_a_renewal_this_clock_cannot_have_seen_is_an_unreadable_lock(tmp_path, caplog,
                                                                     renewed):
    """Not a finite time, or more than the timeout ahead of the reader's clock (a host
    with a skewed clock): the lease runs from the file's modification, never from it."""
    lock = _write_lock(tmp_path, f'{{"host": "vm-other", "pid": 5, "started": "x", '
                                 f'"renewed": {renewed}}}', mtime=NOW - 60)
    content = lock.read_bytes()
    with pytest.raises(WorkdirError) as error:
        _lock(tmp_path)
    message = str(error.value)
    assert message.startswith(f"{lock} is an unreadable lock (its renewed, ")
    assert "(in 9 min)" in message and len(message.splitlines()) == 1
    assert lock.read_bytes() == content
    with caplog.at_level("WARNING", logger="absl"), _lock(tmp_path, Clock(NOW + 541)):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert "took over an unreadable lock" in caplog.records[0].getMessage()


def test_a_renewal_ahead_by_less_than_the_timeout_is_a_fresh_lease(tmp_path):
    _write_lock(tmp_path, {"host": "vm-other", "pid": 5, "renewed": NOW + 599})
    with pytest.raises(WorkdirError, match="pid 5 on host vm-other"):
        _lock(tmp_path)


@pytest.mark.parametrize("theirs, named", [
    ({"host": "vm-new", "pid": 5}, "now names pid 5 on host vm-new"),
    # This host and pid (a restarted container's run): told apart by the token.
    ({"host": HOST, "pid": os.getpid(), "token": "0123"}, "its token differs"),
    ("", "now names no holder"),
])
def test_a_lock_taken_over_meanwhile_is_not_renewed_nor_deleted(tmp_path, caplog, theirs,
                                                                named):
    clock = Clock()
    held = _lock(tmp_path, clock)
    with held:
        assert held.lost() is None
        lock = _write_lock(tmp_path, theirs and {**theirs, "renewed": NOW + 700})
        content = lock.read_bytes()
        error = held.lost()
        assert isinstance(error, WorkdirError) and str(error).startswith(f"{lock} ")
        assert named in str(error) and len(str(error).splitlines()) == 1
        with caplog.at_level("ERROR", logger="absl"):
            assert not held.renew()
        assert named in caplog.records[0].getMessage()
    assert lock.read_bytes() == content


def test_a_deleted_lock_is_lost(tmp_path):
    with _lock(tmp_path) as held:
        (tmp_path / LOCK_FILE).unlink()
        assert str(held.lost()).startswith(f"{tmp_path / LOCK_FILE} was deleted")
    assert not (tmp_path / LOCK_FILE).exists()


@pytest.mark.slow
def test_train_py_refuses_a_fresh_lock_of_another_host_in_one_line(workdir, data_dir):
    lock = _write_lock(workdir, {"host": "vm-old", "pid": 77, "renewed": time.time()},
                       mtime=time.time())
    before = snapshot(workdir)
    code, out = finish(launch("train.py", workdir, {**RUN, "data.data_dir": data_dir},
                              extra=["--lock_timeout=900"]))
    assert code == cli.EXIT_USER_ERROR and "Traceback" not in out, out
    (line,) = errors(out)
    assert "pid 77 on host vm-old" in line
    assert re.search(r"--lock_timeout=900 s \(in 1[0-5] min\)", line), line
    assert f"delete {lock}" in line
    assert snapshot(workdir) == before


# ----------------------------------------------------------------------------
# Fencing: a trainer whose lock another run took stops before its next write.


@pytest.mark.slow
def test_a_run_whose_lock_is_taken_makes_no_preemption_save(workdir, data_dir, monkeypatch):
    """Another run of this host and pid (a restarted container's: only the token differs)
    takes the lock at step 23, as SIGTERM asks for a preemption save: no save, no
    metrics after, and its lock stays."""
    taken = {}

    class TakenOver(PreemptionWatcher):
        def requested(self, step: int) -> bool:
            if step != 23:
                return super().requested(step)
            (workdir / LOCK_FILE).unlink()
            taken["lock"] = WorkdirLock(str(workdir))
            taken["metrics"] = (workdir / METRICS_FILE).read_bytes()
            return True

    monkeypatch.setattr(trainer, "PreemptionWatcher", TakenOver)
    config = tiny_config(data_dir, **{**RUN, "train.num_steps": 30, "train.log_every": 1})
    with pytest.raises(WorkdirError, match=f"{workdir / LOCK_FILE} now names pid "
                                           f"{os.getpid()} .*its token differs"):
        trainer.train_and_evaluate(config, str(workdir))
    with taken["lock"] as theirs:
        assert theirs.lost() is None  # neither deleted nor rewritten
    assert Checkpointer(str(workdir), read_only=True).all_steps() == [10, 20]
    assert (workdir / METRICS_FILE).read_bytes() == taken["metrics"]
    assert read_metrics(workdir)[-1]["step"] == 23


def test_a_save_in_flight_when_the_lock_is_lost_is_never_committed(tmp_path):
    """The fence runs again where Orbax commits an asynchronous save: the step stays an
    uncommitted `.orbax-checkpoint-tmp` folder (never read) and no older step is
    deleted for it; the error is the fence's, not a failed save's."""
    with _lock(tmp_path) as lock:
        open_gate = threading.Event()

        def fence():  # the commit waits at the gate
            open_gate.wait(60)
            lock.fence()

        checkpointer = Checkpointer(str(tmp_path), keep_last=1, fence=fence)
        open_gate.set()
        checkpointer.save(1, {"w": np.ones(3, np.float32)}, None)
        checkpointer.check(wait=True)
        open_gate.clear()
        checkpointer.save(2, {"w": np.ones(3, np.float32)}, None)
        (tmp_path / LOCK_FILE).unlink()  # while step 2 is being written
        open_gate.set()
        with pytest.raises(WorkdirError, match=f"{tmp_path / LOCK_FILE} was deleted"):
            checkpointer.close()
    assert Checkpointer(str(tmp_path), read_only=True).all_steps() == [1]
    assert [p.name for p in (tmp_path / "checkpoints").iterdir() if p.name != "1"] == [
        "2.orbax-checkpoint-tmp"]


@pytest.mark.slow
def test_train_py_stops_when_another_process_takes_its_lock(workdir, data_dir):
    """The lock deleted while train.py runs and taken by this test's process: at its next
    write (a metrics line, the SIGTERM's preemption save) it stops in one line naming
    the new holder, and writes nothing more, except the one metrics line whose check
    had passed when SIGSTOP landed between that check and its write (docs/RUNNING.md)."""
    process = launch("train.py", workdir, {**LONG, "train.log_every": 1,
                                           "data.data_dir": data_dir})
    wait_for_step_after(process, 20)
    process.send_signal(signal.SIGSTOP)
    try:
        (workdir / LOCK_FILE).unlink()
        theirs = WorkdirLock(str(workdir))
        metrics = (workdir / METRICS_FILE).read_bytes()
        process.send_signal(signal.SIGTERM)
    finally:
        process.send_signal(signal.SIGCONT)
    code, out = finish(process)
    with theirs:
        assert theirs.lost() is None
    assert code == cli.EXIT_USER_ERROR and "Traceback" not in out, out
    (line,) = errors(out)
    assert f"{workdir / LOCK_FILE} now names pid {os.getpid()} on host {HOST}" in line
    after = (workdir / METRICS_FILE).read_bytes()
    assert after.startswith(metrics), "a metrics line written before the stop was changed"
    in_flight = after[len(metrics):].splitlines()
    assert len(in_flight) <= 1, in_flight
    assert Checkpointer(str(workdir), read_only=True).all_steps() == [10, 20]


# ----------------------------------------------------------------------------
# An output of a command that reads a workdir never lands in it.


@pytest.mark.parametrize("output, refused", [
    ("run/out.json", True), ("run", True), ("link/out.json", True), ("link", True),
    ("run2/out.json", False), ("out.json", False)])
def test_an_output_resolving_into_a_folder_read_is_refused(tmp_path, output, refused):
    (tmp_path / "run").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "run")
    path = str(tmp_path / output)
    if not refused:
        refuse_writing_into({f"--output={path}": path}, {"--workdir": str(tmp_path / "run")})
        return
    with pytest.raises(WorkdirError, match=f"--output={path}.* lies inside --workdir="):
        refuse_writing_into({f"--output={path}": path}, {"--workdir": str(tmp_path / "run")})


# ----------------------------------------------------------------------------
# The workdir's shape: one guard before anything reads or writes (`check_workdir`),
# and the step a command reads (`check_step`).


def _steps(tmp_path, *names: str) -> pathlib.Path:
    """A workdir whose checkpoints/ holds a non-empty folder for each name."""
    for name in names:
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
        (tmp_path / "checkpoints" / name / "state").mkdir()
    return tmp_path


@pytest.mark.parametrize("name, make, problem", [
    ("checkpoints", lambda p: p.write_text("x"), "is a file, not a folder"),
    ("vocab", lambda p: p.write_text("x"), "is a file, not a folder"),
    ("config.json", lambda p: p.mkdir(), "is a folder, not a file"),
    ("metrics.jsonl", lambda p: p.mkdir(), "is a folder, not a file"),
    ("train.lock", lambda p: p.mkdir(), "is a folder, not a file"),
    ("config.json", lambda p: p.symlink_to(p), "is a symbolic link that leads nowhere"),
    ("metrics.jsonl", lambda p: (p.write_text(""), p.chmod(0)), "cannot be read"),
])
def test_an_entry_of_the_wrong_kind_is_named_before_anything_reads(tmp_path, name, make,
                                                                    problem):
    if problem == "cannot be read" and os.geteuid() == 0:
        pytest.skip("root reads any file")
    make(tmp_path / name)
    with pytest.raises(WorkdirError) as error:
        check_workdir(str(tmp_path))
    assert str(error.value).startswith(f"{tmp_path / name} {problem}")
    assert len(str(error.value).splitlines()) == 1


@pytest.mark.parametrize("name", ["²", "٣", "1٣"])
def test_a_step_name_of_other_digits_is_named(tmp_path, name):
    """`int` reads "٣" as 3 and fails on "²": only ASCII digits name a step."""
    _steps(tmp_path, "2", name)
    with pytest.raises(WorkdirError, match=f"{tmp_path}/checkpoints/{name}: a step folder is "
                                           "named by ASCII digits"):
        check_workdir(str(tmp_path))
    assert checkpoint_steps(str(tmp_path / "checkpoints")) == [2]


@pytest.mark.parametrize("make, problem", [
    (lambda p: p.mkdir(), "is empty: no checkpoint was saved there"),
    (lambda p: p.symlink_to("3"), "is a symbolic link that leads nowhere"),
    (lambda p: p.write_text("x"), "is a file, not a folder"),
    (lambda p: p.symlink_to(p.parents[2]), "is a symbolic link out of the workdir"),
])
def test_a_step_that_holds_no_checkpoint_names_its_cause_and_the_last_sound_one(
        tmp_path, make, problem):
    workdir = _steps(tmp_path / "run", "1", "2")
    make(workdir / "checkpoints" / "3")
    check_workdir(str(workdir))  # the entries are of their kinds
    with pytest.raises(CheckpointError) as error:
        check_step(str(workdir), None, "step")
    assert str(error.value).startswith(f"step 3 ({workdir}/checkpoints/3) {problem}")
    assert str(error.value).endswith(": use --step=2.") and error.value.rerun_with == {"step": 2}
    assert check_step(str(workdir), 2, "step") == 2  # the hint works


def test_a_step_linked_inside_the_workdir_is_followed(tmp_path):
    workdir = _steps(tmp_path, "2")
    (workdir / "checkpoints" / "3").symlink_to("2")
    assert check_step(str(workdir), None, "step") == 3


def test_without_a_sound_earlier_step_the_message_says_to_move_it(tmp_path):
    (tmp_path / "checkpoints" / "3").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="no earlier step holds a checkpoint: move it "
                                              f"out of {tmp_path}/checkpoints") as error:
        check_step(str(tmp_path), None, "restore_step")
    assert error.value.rerun_with is None


@pytest.mark.parametrize("content, problem", [
    ("{}", 'names no task (no "task" key)'),
    ('{"task": "translate", "model": {}}', "lacks the 'data' section"),
])
def test_a_config_json_without_a_task_or_section_is_named(tmp_path, content, problem):
    (tmp_path / "config.json").write_text(content)
    with pytest.raises(DamagedFileError, match=re.escape(f"{tmp_path}/config.json {problem}")):
        saved_config(str(tmp_path))


def test_save_average_claims_its_folder_and_removes_what_it_began(tmp_path):
    """Written to NEW.partial, which a second command finds taken, removed when the
    writing fails (a full disk), renamed to NEW when complete."""
    output = str(tmp_path / "new")
    with averaging._claimed(output) as partial:
        with pytest.raises(CheckpointError, match=f"{partial} exists: another command is "
                                                  "writing --save_average="):
            with averaging._claimed(output):
                pass
        pathlib.Path(partial, "average.json").write_text("{}")
    assert os.listdir(tmp_path) == ["new"] and os.listdir(output) == ["average.json"]
    with pytest.raises(CheckpointError, match="No space left on device"):
        with averaging._claimed(str(tmp_path / "full")) as partial:
            pathlib.Path(partial, "part").write_text("x")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert os.listdir(tmp_path) == ["new"]
