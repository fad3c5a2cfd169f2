"""Opening input files (plain or gzip, by their magic bytes) and pausing the garbage collector
while a file's objects are built: shared by the capture reader and the trace readers."""

from __future__ import annotations

import contextlib
import gc
import gzip
import os
from typing import IO, Iterator

from latprof.errors import InputError

GZIP_MAGIC = b"\x1f\x8b"


def open_input(path: str | os.PathLike[str]) -> IO[bytes]:
    """`path` opened for reading, decompressed when it starts with the gzip magic; InputError
    (one line naming the file) when it is a directory or cannot be opened or read."""
    try:
        raw = open(path, "rb")
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot open: {exc.strerror or exc}") from None
    try:
        magic = raw.peek(2)[:2]
    except OSError as exc:
        raw.close()
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if magic != GZIP_MAGIC:
        return raw
    raw.close()
    return gzip.open(path, "rb")  # type: ignore[return-value]


@contextlib.contextmanager
def gc_paused(*, freeze: bool = False) -> Iterator[None]:
    """The cyclic garbage collector off while many new objects are built, then back as it was.

    Events, spans and their attributes hold no reference cycles (reference counting frees
    them), but a million new objects would trigger full collections over all of them again and
    again while they are built. With `freeze`, pending garbage is collected first (so that no
    cycle of the caller's is frozen with them) and what is alive at the end is moved to the
    permanent generation (`gc.freeze`), so later collections do not scan it either.
    """
    was_enabled = gc.isenabled()
    if was_enabled and freeze:
        gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if freeze:
                gc.freeze()
            gc.enable()
