"""bert_jax.noise: library reports are dropped by where they come from, not by their text."""

import logging
import sys
import types

from bert_jax import noise

SITE = "/venv/lib/python3.11/site-packages"


def _record(path: str, level: int = logging.WARNING, func: str = "read", exc_info=None,
            message: str = "anything") -> logging.LogRecord:
    return logging.LogRecord("absl", level, SITE + path, 1, message, (), exc_info, func=func)


def test_library_logs_are_filtered_by_module_function_and_level():
    quiet = noise._QuietLibraries()
    reader = noise.ORBAX_METADATA_READERS[0]
    kept = [_record(reader, logging.ERROR),               # a metadata file it cannot read
            _record("/orbax/checkpoint/checkpoint_manager.py"),  # another module's warning
            _record(reader, func="write"),
            _record("/bert_jax/training/trainer.py", logging.INFO),
            _record("/grain/_src/python/dataset.py", logging.WARNING, func="f")]
    dropped = [_record(reader, message="reworded by a new Orbax: still dropped"),
               _record(noise.ORBAX_METADATA_READERS[1]),
               _record("/orbax/checkpoint/_src/futures.py", logging.ERROR, func="run",
                       exc_info=(OSError, OSError(28, "No space"), None)),
               _record("/jax/_src/compiler.py", logging.INFO, func="compile")]
    assert [quiet.filter(r) for r in kept] == [True] * len(kept)
    assert [quiet.filter(r) for r in dropped] == [False] * len(dropped)


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


def test_unraisable_errors_are_dropped_only_when_raised_through_orbax(monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    noise.drop_unraisable_io_errors()
    noise.drop_unraisable_io_errors()  # once: the hook is not wrapped twice

    def raised_in(filename: str) -> BaseException:
        try:
            exec(compile("raise OSError('lost')", filename, "exec"))
        except OSError as e:
            return e
    for filename in (SITE + "/orbax/checkpoint/_src/path/async_path.py",
                     SITE + "/asyncio/events.py", "/work/bert_jax/x.py"):
        sys.unraisablehook(types.SimpleNamespace(exc_value=raised_in(filename)))
    assert [u.exc_value.__traceback__.tb_next.tb_frame.f_code.co_filename
            for u in seen] == ["/work/bert_jax/x.py"]
