r"""Cloud TPU VM jobs through `gcloud compute tpus tpu-vm`: create, set up, train,
read the log, stop, delete. Every step runs on all of the VM's workers at once
(`--worker=all`); `logs` reads worker 0.

  python launch/tpu_vm.py create NAME --zone=Z --accelerator_type=v4-32 \
      --version=tpu-ubuntu2204-base [--spot | --preemptible] [--queued]
  python launch/tpu_vm.py setup NAME --zone=Z [--repo_url=URL [--ref=REF]]
  python launch/tpu_vm.py train NAME --zone=Z [--allow_local_workdir] -- \
      --config=experiments/NAME.py[:ARG] --workdir=/gcs/BUCKET/RUN [--config.key=value ...]
  python launch/tpu_vm.py logs NAME --zone=Z [--follow] [--lines=100] [--worker=0]
  python launch/tpu_vm.py stop NAME --zone=Z [--force]
  python launch/tpu_vm.py delete NAME --zone=Z [--queued]

Every subcommand also takes --project=P and --dry_run (print the commands, run
nothing); without --zone/--project, gcloud's defaults apply.

- setup: without --repo_url, copies the local checkout's COPY_PATHS to ~/REMOTE_DIR.
- train: the flags after `--` reach `launch/train.py` on every worker as typed
  (shell-quoted), in the background (setsid nohup; log ~/bert_jax_train.log, pid
  ~/bert_jax_train.pid). The workdir must be a gcsfuse mount under /gcs/: the
  workers' disks are separate, so a local path would scatter checkpoints.
- stop: SIGTERM (the trainer saves a checkpoint and exits); --force: SIGKILL.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What `setup` copies without --repo_url: enough for `pip install -e .` and
# `python launch/train.py`. Keep in step with setup.py.
COPY_PATHS = ("setup.py", "bert_jax", "experiments", "launch")
TPU_VM = ["gcloud", "compute", "tpus", "tpu-vm"]
QUEUED = ["gcloud", "compute", "tpus", "queued-resources"]
PID_FILE = "bert_jax_train.pid"


SHARED_MOUNT = "/gcs/"  # where every worker mounts GCS buckets with gcsfuse


def _plain_name(value: str) -> str:
    """A file or directory name directly under the remote home (safe to rm -rf)."""
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._-]*", value):
        raise argparse.ArgumentTypeError(f"{value!r}: expected a plain name, e.g. bert_jax")
    return value


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("name", help="TPU VM (and queued resource) name.")
    common.add_argument("--zone", help="e.g. us-central2-b (default: gcloud's compute/zone).")
    common.add_argument("--project", help="GCP project (default: gcloud's core/project).")
    common.add_argument("--dry_run", "--dry-run", action="store_true",
                        help="Print the commands, one per line, and run nothing.")
    remote = argparse.ArgumentParser(add_help=False)  # for the steps that run on the VM
    remote.add_argument("--remote_dir", "--remote-dir", type=_plain_name, default="bert_jax",
                        help="The checkout, under each worker's home directory.")
    remote.add_argument("--log_file", "--log-file", type=_plain_name,
                        default="bert_jax_train.log", help="Training log, under the home.")

    top = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name, help_, on_vm=True, **kwargs):
        return sub.add_parser(name, parents=[common, remote] if on_vm else [common],
                              help=help_, allow_abbrev=False, **kwargs)

    create = add("create", "Create the TPU VM (or a queued resource).", on_vm=False)
    create.add_argument("--accelerator_type", "--accelerator-type", required=True,
                        help="e.g. v4-8, v4-32, v5litepod-16, v6e-8.")
    create.add_argument("--version", "--runtime_version", "--runtime-version", required=True,
                        help="TPU software version, e.g. tpu-ubuntu2204-base (v4), "
                             "v2-alpha-tpuv5-lite (v5e), v2-alpha-tpuv6e (v6e).")
    kind = create.add_mutually_exclusive_group()
    kind.add_argument("--spot", action="store_true", help="Spot capacity.")
    kind.add_argument("--preemptible", action="store_true",
                      help="Preemptible capacity (not with --queued).")
    create.add_argument("--queued", action="store_true", help="Create a queued resource.")

    setup = add("setup", "Put the code on every worker and pip install it.")
    setup.add_argument("--repo_url", "--repo-url",
                       help="git URL to clone (default: copy the local checkout).")
    setup.add_argument("--ref", default="HEAD",
                       help="Branch, tag or commit to check out (with --repo_url).")

    train = add("train", "Start launch/train.py on every worker: train ... -- TRAIN_FLAGS.",
                usage="%(prog)s NAME [options] -- --config=experiments/NAME.py "
                      "--workdir=/gcs/BUCKET/RUN [--config.key=value ...]")
    train.add_argument("--allow_local_workdir", "--allow-local-workdir", action="store_true",
                       help="Accept a workdir outside /gcs/ (only right for a one-host VM).")

    logs = add("logs", "Print (or follow) a worker's training log.")
    logs.add_argument("--follow", "-f", action="store_true", help="Stream it (tail -F).")
    logs.add_argument("--lines", type=int, default=100, help="Last lines to print.")
    logs.add_argument("--worker", default="0", help="Worker index (or all).")

    stop = add("stop", "Stop the training on every worker (SIGTERM: checkpoint, exit).")
    stop.add_argument("--force", action="store_true", help="SIGKILL its process group.")

    delete = add("delete", "Delete the TPU VM (or the queued resource and its VM).",
                 on_vm=False)
    delete.add_argument("--queued", action="store_true", help="Delete a queued resource.")
    return top


def parse(argv: list[str]) -> argparse.Namespace:
    """Parses `tpu_vm.py ARGS [-- TRAIN_FLAGS]`; checks the train flags' workdir."""
    split = argv.index("--") if "--" in argv else len(argv)
    top = parser()
    args = top.parse_args(argv[:split])
    args.train_flags = argv[split + 1:]
    if args.command != "train":
        if args.train_flags:
            top.error(f"{args.command} takes no flags after --")
        if args.command == "create" and args.queued and args.preemptible:
            top.error("queued resources take --spot, not --preemptible")
        return args
    workdir = flag_value(args.train_flags, "workdir")
    if not flag_value(args.train_flags, "config") or not workdir:
        top.error("train needs the training flags after --: "
                  "-- --config=experiments/NAME.py --workdir=/gcs/BUCKET/RUN [...]")
    if "://" in workdir:
        top.error(f"--workdir={workdir}: the trainer writes its workdir with file I/O; mount "
                  "the bucket with gcsfuse on every worker and pass /gcs/BUCKET/RUN.")
    if not workdir.startswith(SHARED_MOUNT):
        if not args.allow_local_workdir:
            top.error(f"--workdir={workdir} is not on GCS: every worker of a multi-host TPU "
                      "VM would write its own local disk (scattered checkpoints, no resume). "
                      f"Use a gcsfuse mount ({SHARED_MOUNT}BUCKET/RUN), or "
                      "--allow_local_workdir on a one-host VM.")
        print(f"warning: local workdir {workdir}: each worker writes its own disk.",
              file=sys.stderr)
    return args


def flag_value(flags: list[str], name: str) -> str | None:
    """The value of an absl flag (--name=V, --name V, -name=V), the last one winning."""
    value = None
    for i, arg in enumerate(flags):
        match = re.fullmatch(rf"--?{name}(=(.*))?", arg, re.DOTALL)
        if match:
            value = match.group(2) if match.group(1) else (
                flags[i + 1] if i + 1 < len(flags) else None)
    return value


def commands(args: argparse.Namespace) -> list[list[str]]:
    """The argv of each command that the subcommand runs, in order."""
    where = [f"--{k}={v}" for k, v in (("zone", args.zone), ("project", args.project)) if v]

    if args.command == "create":
        spot = ["--spot"] if args.spot else []
        if args.queued:
            return [[*QUEUED, "create", args.name, f"--node-id={args.name}", *where,
                     f"--accelerator-type={args.accelerator_type}",
                     f"--runtime-version={args.version}", *spot]]
        return [[*TPU_VM, "create", args.name, *where,
                 f"--accelerator-type={args.accelerator_type}", f"--version={args.version}",
                 *spot, *(["--preemptible"] if args.preemptible else [])]]
    if args.command == "delete":
        if args.queued:
            return [[*QUEUED, "delete", args.name, *where, "--force"]]
        return [[*TPU_VM, "delete", args.name, *where]]

    # The rest run shell commands on the workers, which start in the home directory.
    def ssh(worker: str, command: str) -> list[str]:
        return [*TPU_VM, "ssh", args.name, *where, f"--worker={worker}",
                f"--command={command}"]

    repo = args.remote_dir  # a plain name (_plain_name): no quoting needed
    log, pid = f'"$HOME/{args.log_file}"', f'"$HOME/{PID_FILE}"'
    if args.command == "setup":
        install = (f"cd {repo} && python3 -m pip install -e . && "
                   "python3 -m pip install 'jax[tpu]'")
        if args.repo_url:
            url, ref = shlex.quote(args.repo_url), shlex.quote(args.ref)
            return [ssh("all", f"(test -d {repo}/.git || git clone {url} {repo}) && "
                               f"git -C {repo} fetch origin {ref} && "
                               f"git -C {repo} checkout --detach FETCH_HEAD && {install}")]
        return [ssh("all", f"rm -rf {repo} && mkdir {repo}"),
                [*TPU_VM, "scp", "--recurse", *(os.path.join(REPO, p) for p in COPY_PATHS),
                 f"{args.name}:{repo}", *where, "--worker=all"],
                ssh("all", install)]
    if args.command == "train":
        train = shlex.join(["python3", "launch/train.py", *args.train_flags])
        return [ssh("all", f"if [ -f {pid} ] && kill -0 \"$(cat {pid})\" 2>/dev/null; then "
                           f"echo \"$(hostname): already training, pid $(cat {pid})\" >&2; "
                           f"exit 1; fi; cd {repo} || exit 1; "
                           f"BERT_JAX_DISTRIBUTED=1 setsid nohup {train} > {log} 2>&1 < /dev/null "
                           f"& echo $! > {pid}; "
                           f"echo \"$(hostname): started pid $!, log ~/{args.log_file}\"")]
    if args.command == "logs":
        return [ssh(args.worker, f"tail -n {args.lines}{' -F' if args.follow else ''} {log}")]
    if args.command == "stop":  # TERM: the process; KILL: its process group (setsid)
        signal, group = ("KILL", "-") if args.force else ("TERM", "")
        return [ssh("all", f"if [ -f {pid} ] && kill -{signal} -- {group}\"$(cat {pid})\" "
                           f"2>/dev/null; then echo \"$(hostname): sent SIG{signal}\"; "
                           f"else echo \"$(hostname): no training running\"; fi")]
    raise AssertionError(args.command)


def run(argvs: list[list[str]], dry_run: bool) -> int:
    """Prints the commands (dry run) or runs them in order, stopping at a failure."""
    for argv in argvs:
        if dry_run:
            print(shlex.join(argv))
            continue
        print("+", shlex.join(argv), file=sys.stderr, flush=True)
        try:
            subprocess.run(argv, check=True)
        except FileNotFoundError:
            print(f"error: {argv[0]} not found on PATH (install the Google Cloud SDK)",
                  file=sys.stderr)
            return 127
        except subprocess.CalledProcessError as e:
            print(f"error: exit status {e.returncode}", file=sys.stderr)
            return e.returncode
        except KeyboardInterrupt:
            return 130
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    return run(commands(args), args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
