"""The reading of the project's local text files, shared by the readers of GLUE
TSVs (`glue`), CoNLL files (`conllu`), parallel text (`parallel_text`) and
pretraining corpora (`pretraining_data`).

`utf8_lines` reads a file as UTF-8, line by line, and yields each line with its
byte offset and its 1-based line number, so that a reader can resume from an
offset (a pretraining shard) and its `DataError` can name `file:line[:column]`
(`char_column` gives the column of a tab-separated field). A file whose name ends
in `.gz` is read as a gzip stream, never unpacked to disk: its offsets count the
uncompressed bytes, and resuming from one decompresses the stream up to it (gzip
has no index). A damaged or truncated gzip is a
`DataError` naming the file. `as_text` turns a
tfds text feature (bytes, or a 0-d array of bytes) into a `str`.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator

import numpy as np

from bert_jax.errors import DataError


def utf8_lines(path: str, start: tuple[int, int] = (0, 1)) -> Iterator[tuple[int, int, str]]:
    """(byte offset, 1-based line number, text with its line break) of each
    line of `path` from `start`, the (byte offset, line number) of a line's
    beginning. Lines end at '\\n' only; a byte-order mark at the start of the
    file is dropped; invalid UTF-8 raises a `DataError` naming the line and
    column. `*.gz`: gzip, offsets in the uncompressed text (module docstring)."""
    offset, first_line = start
    compressed = path.endswith(".gz")
    lineno = first_line
    with (gzip.open if compressed else open)(path, "rb") as f:
        try:
            f.seek(offset)
            for lineno, raw in enumerate(f, start=first_line):
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise DataError(path, f"invalid UTF-8 ({e.reason})",
                                    "convert the file (e.g. `iconv -f latin1 -t utf-8`)",
                                    line=lineno, column=e.start + 1) from None
                yield offset, lineno, text.removeprefix("\ufeff") if offset == 0 else text
                offset += len(raw)
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:
            if not compressed:
                raise
            raise DataError(path, f"damaged or truncated gzip after line {lineno} ({e})",
                            "check it with `gzip -t`, then copy or compress it again"
                            ) from None


def char_column(fields: list[str], index: int) -> int:
    """1-based character column where field `index` of a tab-split line starts."""
    return 1 + sum(len(field) + 1 for field in fields[:index])


def as_text(value) -> str:
    """A tfds text feature (bytes, or a 0-d array of bytes) or any value as str."""
    if isinstance(value, np.ndarray):
        value = value.item()
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
