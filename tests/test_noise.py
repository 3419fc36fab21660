"""bert_jax.noise: library reports are dropped by where they come from, not by their text."""

import gc
import logging
import pathlib
import sys
import types
import warnings

import numpy as np

from bert_jax import noise

SITE = str(pathlib.Path(noise.installed(("orbax",))[0]).parent)  # where the libraries are


def _record(path: str, level: int = logging.WARNING, func: str = "read", exc_info=None,
            message: str = "anything", site: str = SITE) -> logging.LogRecord:
    return logging.LogRecord("absl", level, site + path, 1, message, (), exc_info, func=func)


def test_library_logs_are_filtered_by_module_function_and_level():
    reader = "/orbax/checkpoint/_src/metadata/checkpoint.py"
    kept = [_record(reader, logging.ERROR),               # a metadata file it cannot read
            _record("/orbax/checkpoint/checkpoint_manager.py"),  # another module's warning
            _record(reader, func="write"),
            _record("/bert_jax/training/trainer.py", logging.INFO),
            _record("/grain/_src/python/dataset.py", logging.WARNING, func="f"),
            _record("/orbax/notes.py", logging.INFO, site="/home/me"),  # not Orbax's folder
            _record(reader, site="/home/me")]
    dropped = [_record(reader, message="reworded by a new Orbax: still dropped"),
               _record("/orbax/checkpoint/experimental/v1/_src/metadata/serialization.py"),
               _record("/orbax/checkpoint/_src/futures.py", logging.ERROR, func="run",
                       exc_info=(OSError, OSError(28, "No space"), None)),
               _record("/jax/_src/compiler.py", logging.INFO, func="compile")]
    assert [noise._quiet_libraries(r) for r in kept] == [True] * len(kept)
    assert [noise._quiet_libraries(r) for r in dropped] == [False] * len(dropped)


def test_library_logs_are_quieted_on_named_loggers_only():
    absl, jax_src = logging.getLogger("absl"), logging.getLogger("jax._src")
    before = {name: logging.getLogger(name).level for name in noise.NOISY_LIBRARIES}
    try:
        noise.quiet_library_logs()
        noise.quiet_library_logs()  # once: the filter is not added twice
        assert absl.filters.count(noise._quiet_libraries) == 1
        assert not logging.getLogger().filters or noise._quiet_libraries not in (
            logging.getLogger().filters)
        assert logging.getLogger("jax._src.compiler").getEffectiveLevel() == logging.WARNING
        assert logging.getLogger("jax.experimental").level == logging.NOTSET
        assert jax_src.level == logging.getLogger("apache_beam").level == logging.WARNING
    finally:
        absl.removeFilter(noise._quiet_libraries)
        for name, level in before.items():
            logging.getLogger(name).setLevel(level)


def test_beam_gcp_import_warnings_are_dropped_only_while_beam_is_imported():
    root = logging.getLogger()
    gcp = _record("/apache_beam/io/gcp/internal/clients/bigquery/__init__.py",
                  func="<module>", message="any text")
    with noise.importing_beam():
        assert not root.filter(gcp)
        assert root.filter(_record("/apache_beam/io/gcp/x.py", func="<module>",
                                   level=logging.ERROR))
        assert root.filter(_record("/apache_beam/runners/x.py", func="<module>"))
    assert root.filter(gcp) and noise._not_beam_gcp not in root.filters


def _raised_in(module: str, code: str = "raise OSError(__name__)", **names) -> BaseException:
    """The error `code` raises, run as module `module`'s code (with `names` defined)."""
    try:
        exec(code, {"__name__": module, **names})
    except OSError as e:
        return e


def test_unraisable_errors_are_dropped_only_when_raised_in_orbax_or_asyncio(monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    noise.drop_unraisable_io_errors()
    noise.drop_unraisable_io_errors()  # once: the hook is not wrapped twice
    user_code = {"__name__": "bert_jax.y"}
    exec("def fail():\n    raise OSError(__name__)", user_code)
    errors = [_raised_in(module) for module in (
        "orbax.checkpoint._src.path.async_path", "asyncio.events", "bert_jax.x", "orbaxlike")]
    # Raised in user code that Orbax's code called: reported.
    errors.append(_raised_in("orbax.checkpoint._src.futures", "fail()", fail=user_code["fail"]))
    for error in errors:
        sys.unraisablehook(types.SimpleNamespace(exc_value=error))
    assert [str(u.exc_value) for u in seen] == ["bert_jax.x", "orbaxlike", "bert_jax.y"]


def test_after_a_failed_save_only_the_abandoned_io_is_muted(monkeypatch):
    """The asyncio logger's reports of errors raised in Orbax's code and CPython's
    warnings of coroutines never awaited; not asyncio's other records, not a NumPy
    RuntimeWarning."""
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    asyncio_logger = logging.getLogger("asyncio")

    def logged(error):
        return logging.LogRecord("asyncio", logging.ERROR, "base_events.py", 1,
                                 "Task exception was never retrieved", (),
                                 (type(error), error, error.__traceback__))

    async def write():
        pass
    try:
        with warnings.catch_warnings(record=True) as shown:
            warnings.simplefilter("always")
            noise.drop_reports_of_abandoned_io()
            coroutine = write()
            del coroutine  # collected unawaited
            gc.collect()
            np.float32(3e38) * np.float32(10)  # overflow
        assert [str(w.message) for w in shown] == ["overflow encountered in scalar multiply"]
        assert not asyncio_logger.filter(logged(_raised_in("orbax.checkpoint._src.x")))
        assert asyncio_logger.filter(logged(_raised_in("user_code")))
        assert asyncio_logger.filter(logging.LogRecord("asyncio", logging.WARNING, "", 1,
                                                       "slow callback", (), None))
    finally:
        asyncio_logger.removeFilter(noise._not_abandoned_io)
