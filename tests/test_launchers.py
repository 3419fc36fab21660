"""Job launchers: launch/tpu_vm.py against a fake `gcloud`, launch/slurm_train.sbatch
against a fake `srun`/`sbatch`. No network, no cloud, no cluster.

The fakes are small Python scripts put first on PATH; each appends its argv
(program name first, one JSON list a line) to $FAKE_LOG. The fake gcloud can
also play a TPU worker: with $FAKE_REMOTE_HOME set, `gcloud ... ssh --command=C`
runs `bash -c C` in that directory, where a fake `python3` stands for training.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
TPU_VM_PY = REPO / "launch" / "tpu_vm.py"
SBATCH = REPO / "launch" / "slurm_train.sbatch"

_spec = importlib.util.spec_from_file_location("tpu_vm", TPU_VM_PY)
tpu_vm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tpu_vm)

LOG_ARGV = """\
import json, os, sys
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\\n")
"""
FAKES = {
    "gcloud": LOG_ARGV + """\
if os.environ.get("FAKE_FAIL"):
    sys.exit(int(os.environ["FAKE_FAIL"]))
home = os.environ.get("FAKE_REMOTE_HOME")
if home and sys.argv[1:5] == ["compute", "tpus", "tpu-vm", "ssh"]:
    command = next(a for a in sys.argv if a.startswith("--command=")).split("=", 1)[1]
    import subprocess
    sys.exit(subprocess.run(["bash", "-c", command], cwd=home,
                            env={**os.environ, "HOME": home}).returncode)
""",
    "python3": LOG_ARGV + """\
print("fake training started", flush=True)
import time
time.sleep(float(os.environ.get("FAKE_TRAIN_SECONDS", "0")))
""",
    "srun": LOG_ARGV,
    "sbatch": LOG_ARGV + """\
import subprocess
sys.exit(subprocess.run(["bash", *sys.argv[1:]]).returncode)
""",
}

# Training flags that a careless shell round trip would mangle.
AWKWARD_FLAGS = [
    "--config=experiments/tiny_translate.py:big",
    "--workdir=/gcs/bucket/runs/run 1",
    "--config.mesh.shape=(1,4,1)",
    "--config.name=it's \"quoted\" $HOME `hostname` ; & | > * ~",
    "--config.train.num_steps", "10",
    "--config.note=",
]
ZONE = "us-central2-b"


class Fakes:
    def __init__(self, root: pathlib.Path):
        self.bin = root / "bin"
        self.log = root / "calls.jsonl"
        self.home = root / "worker_home"

    def calls(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def clear(self) -> None:
        self.log.unlink(missing_ok=True)


@pytest.fixture
def fakes(tmp_path, monkeypatch) -> Fakes:
    f = Fakes(tmp_path)
    f.bin.mkdir()
    for name, body in FAKES.items():
        path = f.bin / name
        path.write_text(f"#!{sys.executable}\n{body}")
        path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{f.bin}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LOG", str(f.log))
    for var in ("FAKE_FAIL", "FAKE_REMOTE_HOME", "FAKE_TRAIN_SECONDS"):
        monkeypatch.delenv(var, raising=False)
    return f


def tpu(*argv: str) -> int:
    return tpu_vm.main(list(argv))


def remote_command(argv: list[str]) -> str:
    (command,) = [a.split("=", 1)[1] for a in argv if a.startswith("--command=")]
    return command


def train_argv(command: str) -> list[str]:
    """The flags given to launch/train.py in a remote train command."""
    words = shlex.split(command)
    start = words.index("launch/train.py") + 1
    return words[start:words.index(">", start)]


SSH = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "tpu1", f"--zone={ZONE}"]
CASES = {
    "create": (["create", "tpu1", f"--zone={ZONE}", "--accelerator_type=v4-32",
                "--version=tpu-ubuntu2204-base", "--spot"],
               [["gcloud", "compute", "tpus", "tpu-vm", "create", "tpu1", f"--zone={ZONE}",
                 "--accelerator-type=v4-32", "--version=tpu-ubuntu2204-base", "--spot"]]),
    "create_queued": (["create", "tpu1", f"--zone={ZONE}", "--project=my-proj",
                       "--accelerator-type=v5litepod-16",
                       "--version=v2-alpha-tpuv5-lite", "--queued"],
                      [["gcloud", "compute", "tpus", "queued-resources", "create", "tpu1",
                        "--node-id=tpu1", f"--zone={ZONE}", "--project=my-proj",
                        "--accelerator-type=v5litepod-16",
                        "--runtime-version=v2-alpha-tpuv5-lite"]]),
    "setup_copy": (["setup", "tpu1", f"--zone={ZONE}"],
                   [SSH + ["--worker=all", "--command=rm -rf bert_jax && mkdir bert_jax"],
                    ["gcloud", "compute", "tpus", "tpu-vm", "scp", "--recurse",
                     *(str(REPO / p)
                       for p in ("setup.py", "bert_jax", "experiments", "launch")),
                     "tpu1:bert_jax", f"--zone={ZONE}", "--worker=all"],
                    SSH + ["--worker=all", "--command=cd bert_jax && python3 -m pip install "
                                           "-e . && python3 -m pip install 'jax[tpu]'"]]),
    "setup_git": (["setup", "tpu1", f"--zone={ZONE}", "--repo_url=https://example.com/b j.git",
                   "--ref=v1"],
                  [SSH + ["--worker=all", "--command=(test -d bert_jax/.git || git clone "
                          "'https://example.com/b j.git' bert_jax) && git -C bert_jax fetch "
                          "origin v1 && git -C bert_jax checkout --detach FETCH_HEAD && cd "
                          "bert_jax && python3 -m pip install -e . && python3 -m pip install "
                          "'jax[tpu]'"]]),
    "train": (["train", "tpu1", f"--zone={ZONE}", "--", *AWKWARD_FLAGS], None),
    "logs": (["logs", "tpu1", f"--zone={ZONE}", "--follow"],
             [SSH + ["--worker=0", '--command=tail -n 100 -F "$HOME/bert_jax_train.log"']]),
    "stop": (["stop", "tpu1", f"--zone={ZONE}"], None),
    "delete": (["delete", "tpu1", f"--zone={ZONE}"],
               [["gcloud", "compute", "tpus", "tpu-vm", "delete", "tpu1", f"--zone={ZONE}"]]),
    "delete_queued": (["delete", "tpu1", f"--zone={ZONE}", "--queued"],
                      [["gcloud", "compute", "tpus", "queued-resources", "delete", "tpu1",
                        f"--zone={ZONE}", "--force"]]),
}


@pytest.mark.parametrize("case", CASES)
def test_dry_run_prints_the_commands_and_runs_nothing(case, fakes, capsys):
    argv, expected = CASES[case]
    split = argv.index("--") if "--" in argv else len(argv)
    assert tpu(*argv[:split], "--dry_run", *argv[split:]) == 0
    printed = [shlex.split(line) for line in capsys.readouterr().out.splitlines()]
    assert fakes.calls() == []
    if expected is not None:
        assert printed == expected
    else:  # train, stop: one ssh to every worker
        assert len(printed) == 1 and printed[0][:-1] == SSH + ["--worker=all"]
    if case == "train":
        assert train_argv(remote_command(printed[0])) == AWKWARD_FLAGS


@pytest.mark.parametrize("case", CASES)
def test_runs_gcloud_with_exactly_the_dry_run_commands(case, fakes, capsys):
    argv, _ = CASES[case]
    split = argv.index("--") if "--" in argv else len(argv)
    assert tpu(*argv[:split], "--dry_run", *argv[split:]) == 0
    printed = [shlex.split(line) for line in capsys.readouterr().out.splitlines()]
    assert tpu(*argv) == 0
    assert fakes.calls() == printed


def test_train_flags_reach_every_worker_unchanged(fakes):
    assert tpu("train", "tpu1", f"--zone={ZONE}", "--project=p", "--", *AWKWARD_FLAGS) == 0
    (call,) = fakes.calls()
    assert call[:9] == SSH + ["--project=p", "--worker=all"]
    command = remote_command(call)
    assert train_argv(command) == AWKWARD_FLAGS
    assert "nohup" in shlex.split(command)


def test_train_stop_logs_on_a_fake_worker(fakes, monkeypatch, capfd):
    """Runs the remote commands in bash: background start, refusal of a second
    run, the log, SIGTERM to the training process."""
    (fakes.home / "bert_jax").mkdir(parents=True)
    monkeypatch.setenv("FAKE_REMOTE_HOME", str(fakes.home))
    monkeypatch.setenv("FAKE_TRAIN_SECONDS", "30")
    assert tpu("stop", "tpu1", f"--zone={ZONE}") == 0
    assert "no training running" in capfd.readouterr().out
    fakes.clear()
    start = time.monotonic()
    assert tpu("train", "tpu1", f"--zone={ZONE}", "--", *AWKWARD_FLAGS) == 0
    assert time.monotonic() - start < 5, "train must return while training runs on"
    pid = int((fakes.home / "bert_jax_train.pid").read_text())
    try:
        _wait(lambda: len(fakes.calls()) == 2)
        gcloud, python3 = fakes.calls()
        assert python3 == ["python3", "launch/train.py", *AWKWARD_FLAGS]

        assert tpu("train", "tpu1", f"--zone={ZONE}", "--", *AWKWARD_FLAGS) == 1
        assert "already training" in capfd.readouterr().err

        assert tpu("logs", "tpu1", f"--zone={ZONE}") == 0
        assert "fake training started" in capfd.readouterr().out

        assert tpu("stop", "tpu1", f"--zone={ZONE}") == 0
        assert "sent SIGTERM" in capfd.readouterr().out
        _wait(lambda: not _alive(pid))
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_force_stop_kills_the_process_group(fakes, monkeypatch, capfd):
    (fakes.home / "bert_jax").mkdir(parents=True)
    monkeypatch.setenv("FAKE_REMOTE_HOME", str(fakes.home))
    monkeypatch.setenv("FAKE_TRAIN_SECONDS", "30")
    assert tpu("train", "tpu1", "--", *AWKWARD_FLAGS) == 0
    pid = int((fakes.home / "bert_jax_train.pid").read_text())
    try:
        _wait(lambda: len(fakes.calls()) == 2)  # the fake python3 is running
        assert os.getpgid(pid) == pid  # setsid: its own process group, same pid
        assert tpu("stop", "tpu1", "--force") == 0
        assert "sent SIGKILL" in capfd.readouterr().out
        _wait(lambda: not _alive(pid))
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _wait(condition, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    """Running (an orphan may stay a zombie here: PID 1 need not reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("workdir", [["--workdir=/tmp/run"], ["--workdir", "runs/a"]])
def test_train_refuses_a_local_workdir(workdir, fakes, capsys):
    flags = ["--config=experiments/tiny_translate.py", *workdir]
    with pytest.raises(SystemExit) as exit_:
        tpu("train", "tpu1", f"--zone={ZONE}", "--", *flags)
    assert exit_.value.code == 2
    assert "not on GCS" in capsys.readouterr().err
    assert fakes.calls() == []
    # A one-host VM may use its disk, with a warning.
    assert tpu("train", "tpu1", "--allow_local_workdir", "--", *flags) == 0
    assert "warning: local workdir" in capsys.readouterr().err
    assert train_argv(remote_command(fakes.calls()[0])) == flags


def test_train_refuses_object_store_urls(fakes, capsys):
    with pytest.raises(SystemExit):
        tpu("train", "tpu1", "--", "--config=experiments/tiny_translate.py",
            "--workdir=gs://bucket/run")
    assert "mount the bucket with gcsfuse" in capsys.readouterr().err
    assert fakes.calls() == []


@pytest.mark.parametrize("argv", [
    ["train", "tpu1"],
    ["train", "tpu1", "--", "--workdir=/gcs/b/r"],
    ["train", "tpu1", "--", "--config=experiments/tiny_translate.py"],
    ["logs", "tpu1", "--", "--workdir=/gcs/b/r"],
    ["create", "tpu1", "--accelerator_type=v4-8", "--version=v", "--queued", "--preemptible"],
    ["create", "tpu1", "--accelerator_type=v4-8", "--version=v", "--spot", "--preemptible"],
    ["setup", "tpu1", "--remote_dir=../x"],
    ["train", "tpu1", "--config=experiments/tiny_translate.py", "--workdir=/gcs/b/r"],
])
def test_bad_usage_is_refused_before_running_anything(argv, fakes, capsys):
    with pytest.raises(SystemExit) as exit_:
        tpu(*argv)
    assert exit_.value.code == 2
    assert fakes.calls() == []


def test_a_failing_command_stops_the_sequence(fakes, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL", "3")
    assert tpu("setup", "tpu1", f"--zone={ZONE}") == 3
    assert len(fakes.calls()) == 1  # not the scp or pip after a failed ssh


def test_cli_end_to_end(fakes):
    result = subprocess.run(
        [sys.executable, str(TPU_VM_PY), "train", "tpu1", f"--zone={ZONE}", "--dry_run", "--",
         *AWKWARD_FLAGS], capture_output=True, text=True, check=True)
    (line,) = result.stdout.splitlines()
    assert train_argv(remote_command(shlex.split(line))) == AWKWARD_FLAGS
    assert fakes.calls() == []


# SLURM ---------------------------------------------------------------------------

SLURM_ENV = {"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "16", "SLURM_JOB_NUM_NODES": "2",
             "SLURM_CPUS_PER_TASK": "8"}


def fake_venv(tmp_path) -> pathlib.Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text('echo sourced > "$BERT_JAX_VENV/activated"\n')
    return venv


@pytest.mark.parametrize("with_venv", [True, False])
def test_sbatch_script_sruns_train_with_the_flags_unchanged(with_venv, fakes, tmp_path):
    env = {**os.environ, **SLURM_ENV, "SLURM_SUBMIT_DIR": str(REPO)}
    env.pop("BERT_JAX_DIR", None)
    env.pop("BERT_JAX_VENV", None)
    if with_venv:
        env["BERT_JAX_VENV"] = str(fake_venv(tmp_path))
    result = subprocess.run(["bash", str(SBATCH), *AWKWARD_FLAGS], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=10)
    assert result.returncode == 0, result.stderr
    assert fakes.calls() == [["srun", "--kill-on-bad-exit=1", "python", "launch/train.py",
                              *AWKWARD_FLAGS]]
    assert f"in {REPO}" in result.stdout  # ran from the submit directory
    assert (tmp_path / "venv" / "activated").exists() == with_venv


def test_sbatch_submission_passes_the_flags_after_the_script(fakes, tmp_path):
    env = {**os.environ, **SLURM_ENV, "BERT_JAX_VENV": str(fake_venv(tmp_path)),
           "BERT_JAX_DIR": str(REPO)}
    subprocess.run(["sbatch", str(SBATCH), *AWKWARD_FLAGS], env=env, check=True,
                   capture_output=True, timeout=10)
    assert fakes.calls() == [
        ["sbatch", str(SBATCH), *AWKWARD_FLAGS],
        ["srun", "--kill-on-bad-exit=1", "python", "launch/train.py", *AWKWARD_FLAGS]]


def test_sbatch_directives_one_task_per_gpu():
    subprocess.run(["bash", "-n", str(SBATCH)], check=True)
    text = SBATCH.read_text()
    directives = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", text, re.MULTILINE))
    assert {"nodes", "gpus-per-node", "ntasks-per-node", "time"} <= directives.keys()
    # jax.distributed.initialize() under SLURM drives GPU number SLURM_LOCALID.
    assert directives["ntasks-per-node"] == directives["gpus-per-node"]
    # sbatch reads #SBATCH lines only before the first command.
    body = [l for l in text.splitlines()[1:] if l.strip() and not l.startswith("#")]
    last_directive = max(i for i, l in enumerate(text.splitlines()) if l.startswith("#SBATCH"))
    assert text.splitlines().index(body[0]) > last_directive
