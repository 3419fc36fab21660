"""Every way into a workdir ends in one line and loses nothing (issue 38): Ctrl-C while
training, a damaged metrics.jsonl, an edited config.json, lock files of dead, live,
other and unreadable holders. Each launcher case checks the exit status, the one
`error:` line naming the thing, and that the workdir's files are unchanged except
what the command is meant to write."""

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
import time

import pytest

from bert_jax.errors import DamagedFileError
from bert_jax.training import trainer
from bert_jax.training.checkpoints import Checkpointer
from bert_jax.training.evaluation import saved_config
from bert_jax.training.preemption import PreemptionWatcher
from bert_jax.training.workdir import (
    LOCK_FILE, METRICS_FILE, WorkdirError, WorkdirLock, parse_metrics, read_metrics)
from helpers import REPO, finish, launch, tiny_config

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
    for line in process.stdout:
        if " | loss " in line and int(line.split("step ")[1].split("/")[0]) > step:
            return
    pytest.fail(f"exited before logging a step after {step}: {finish(process)[1]}")


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
        assert watcher.requested(2)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_DFL  # a third kills
    finally:
        watcher.close()
    assert signal.getsignal(signal.SIGINT) is previous


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
    assert str(error.value).startswith(f"{lock} names no holder (not a JSON lock record)")
    assert "(in 9 min)" in str(error.value) and len(str(error.value).splitlines()) == 1
    assert lock.read_text() == content
    with caplog.at_level("WARNING", logger="absl"), _lock(tmp_path, Clock(NOW + 541)):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert "took over a lock file that names no holder" in caplog.records[0].getMessage()


def test_a_lock_taken_over_meanwhile_is_not_renewed_nor_deleted(tmp_path, caplog):
    clock = Clock()
    held = _lock(tmp_path, clock)
    with held:
        theirs = {"host": "vm-new", "pid": 5, "renewed": NOW + 700}
        (tmp_path / LOCK_FILE).write_text(json.dumps(theirs))
        with caplog.at_level("ERROR", logger="absl"):
            assert not held.renew()
        assert "taken over by pid 5 on host vm-new" in caplog.records[0].getMessage()
    assert json.loads((tmp_path / LOCK_FILE).read_text()) == theirs


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
