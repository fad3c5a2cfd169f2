"""Opening input files (plain or gzip, by their magic bytes; a decompression bomb refused) and pausing the garbage collector
while a file's objects are built: shared by the capture reader and the trace readers."""

from __future__ import annotations

import contextlib
import gc
import gzip
import io
import os
from typing import IO, BinaryIO, Iterator

from latprof.errors import InputError

GZIP_MAGIC = b"\x1f\x8b"
#: How many times the compressed bytes read so far a gzip input may decompress to (once past
#: `BOMB_FLOOR_BYTES`). JSON and captures compress 5 to 30 times; deflate's ceiling is about
#: 1030, which only a decompression bomb (gigabytes of one byte in a few MB) comes near.
MAX_GZIP_RATIO = 100
#: Decompressed bytes below which the ratio is not checked: a small file of repeated lines may compress more,
#: and a bomb of blank lines is past it before the readers have spent a second skipping them.
BOMB_FLOOR_BYTES = 2 << 20
_GZIP_CHUNK = 1 << 16


class _GuardedGzip(io.RawIOBase):
    """A gzip stream's decompressed bytes, refused (InputError) when they outgrow the compressed
    ones `MAX_GZIP_RATIO` times: a bomb would exhaust memory in a reader that holds a line or
    a whole document, and take minutes in one that does not."""

    def __init__(self, path: str | os.PathLike[str], raw: BinaryIO) -> None:
        super().__init__()
        self._path = path
        self._raw = raw
        self._gzip = gzip.GzipFile(fileobj=raw, mode="rb")
        self._out = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self._gzip.read(min(len(buffer), _GZIP_CHUNK))
        n = len(data)
        buffer[:n] = data
        self._out += n
        if self._out > BOMB_FLOOR_BYTES and self._out > MAX_GZIP_RATIO * self._raw.tell():
            raise InputError(
                f"{self._path}: refused: its gzip stream decompresses to more than {MAX_GZIP_RATIO} times"
                " its size (a decompression bomb?)"
            )
        return n

    def close(self) -> None:
        try:
            self._gzip.close()
            self._raw.close()
        finally:
            super().close()


class GzipInput(io.BufferedReader):
    """What `open_input` returns for a gzip file: its decompressed bytes, guarded against bombs."""


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
    raw.seek(0)
    return GzipInput(_GuardedGzip(path, raw), buffer_size=_GZIP_CHUNK)


def skip_blank_lines(stream: IO[bytes]) -> int:
    """Skip the blank lines buffered next in `stream` (a file `open_input` returned); how many.

    Line readers call it after a blank line: each one costs a failed parse (microseconds), so a
    file of millions of them would take seconds a megabyte; this skips them a buffer at a time.
    """
    peek = getattr(stream, "peek", None)
    if peek is None:
        return 0
    ahead: bytes = peek(1)
    blank = len(ahead) - len(ahead.lstrip(b" \t\r\n"))
    cut = ahead.rfind(b"\n", 0, blank) + 1  # whitespace after the last newline may start a line of JSON
    if not cut:
        return 0
    stream.read(cut)
    return ahead.count(b"\n", 0, cut)


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
