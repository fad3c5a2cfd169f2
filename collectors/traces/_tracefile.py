"""What the trace file readers share: opening plain or gzip files, reading them whole, ids and microsecond times."""

from __future__ import annotations

import contextlib
import gc
import gzip
import math
import zlib
from typing import IO, Any, Iterator

import orjson

from latprof.errors import InputError
from latprof.collectors.traces.spans import Span

_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 16
_HEX = "0123456789abcdef"
_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean"}


def has_key(window: bytes, key: bytes) -> bool:
    """`key` (quoted) occurs in `window` as an object key: followed by a colon, or where the window ends."""
    at = window.find(key)
    while at >= 0:
        if window[at + len(key):].lstrip()[:1] in (b":", b""):
            return True
        at = window.find(key, at + 1)
    return False


def open_file(path: str) -> IO[bytes]:
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
    if magic != _GZIP_MAGIC:
        return raw
    raw.close()
    return gzip.open(path, "rb")  # type: ignore[return-value]


def read_bytes(path: str) -> tuple[bytes, str | None]:
    """The file's bytes (decompressed), and what was wrong with its compressed stream if it ended early."""
    stream = open_file(path)
    chunks: list[bytes] = []
    try:
        if isinstance(stream, gzip.GzipFile):
            while True:
                chunk = stream.read(_CHUNK)
                if not chunk:
                    break
                chunks.append(chunk)
        else:
            chunks.append(stream.read())
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        return b"".join(chunks), str(exc) or type(exc).__name__
    except OSError as exc:
        raise InputError(f"{path}: read failed: {exc.strerror or exc}") from None
    finally:
        stream.close()
    return b"".join(chunks), None


def json_type(value: Any) -> str:
    """The JSON name of a parsed value's type, for messages."""
    return _JSON_TYPES.get(type(value), "null")


def hex_id(value: Any, width: int) -> str | None:
    """`value` as `width` lowercase hex digits, left-padded with zeros; None unless a string of 1 to `width` hex digits."""
    if type(value) is not str or not 0 < len(value) <= width:
        return None
    low = value.lower()
    if low.strip(_HEX):
        return None
    return low if len(low) == width else low.zfill(width)


def micros_ns(value: Any) -> int | None:
    """A time or duration in integer (or fractional) microseconds, in ns; None for anything but a finite number."""
    if type(value) is int:
        return value * 1000
    if type(value) is float and math.isfinite(value):
        whole = int(value)
        return whole * 1000 + round((value - whole) * 1000)
    return None


def parse_values(path: str, data: bytes, damage: str | None, warnings: list[str], what: str) -> list[tuple[int, Any]]:
    """The file's JSON values, each with the line it is on (0 for a file that is one value).

    One value (compact or pretty-printed), else JSON Lines if the first line is a value of
    its own: then a line that is not valid JSON is fatal unless it is the last (torn, and said
    in `warnings`). `what` names the format in messages ("Jaeger JSON traces").
    """
    loads = orjson.loads
    JSONDecodeError = orjson.JSONDecodeError
    try:
        return [(0, loads(data))]
    except JSONDecodeError as exc:
        whole = exc
    docs: list[tuple[int, Any]] = []
    torn: tuple[int, str] | None = None
    for lineno, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        if torn is not None:
            raise InputError(f"{path}:{torn[0]}: malformed line ({torn[1]}); the file is damaged before its end")
        try:
            docs.append((lineno, loads(line)))
        except JSONDecodeError as exc:
            if not docs:  # not JSON Lines: one document, damaged
                if data.lstrip()[:1] not in (b"{", b"["):
                    raise InputError(f"{path}: not {what}: not JSON ({whole})") from None
                if damage is not None:
                    raise InputError(f"{path}: compressed stream is truncated or damaged ({damage})") from None
                raise InputError(f"{path}: truncated or not valid JSON: {whole}") from None
            torn = (lineno, f"not valid JSON: {exc}")
    if torn is not None:
        warnings.append(f"{path}:{torn[0]}: skipped a torn last line ({torn[1]})")
    return docs


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off while spans are built (they hold no cycles; a million new
    objects would make it scan them over and over), then back as it was."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class ReaderState:
    """What every trace reader keeps while it reads one file: the spans so far, shared strings,
    and counts of what it skipped (whole spans) or dropped (inside spans it kept)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.spans: list[Span] = []
        self.warnings: list[str] = []
        self.documents = 0
        #: Why spans (or whole containers of spans) were skipped, with counts.
        self.skipped: dict[str, int] = {}
        #: What was dropped or replaced inside spans that were kept (each with an `{n}` for the count).
        self.notes: dict[str, int] = {}
        #: Names, keys and string values: one object of each.
        self.shared: dict[str, str] = {}

    def _skip(self, reason: str) -> None:
        """Count a span (or a container of spans) skipped for `reason`."""
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def _note(self, note: str) -> None:
        """Count something dropped or replaced inside a span that is kept (`note` has an `{n}` for the count)."""
        self.notes[note] = self.notes.get(note, 0) + 1

    def skipped_lines(self, prefix: str) -> list[str]:
        """One line per reason spans were skipped, with its count, after `prefix`."""
        return [f"{prefix}skipped {count} {reason}" for reason, count in self.skipped.items()]

    def note_lines(self, prefix: str) -> list[str]:
        """One line per thing dropped inside kept spans, with its count, after `prefix`."""
        return [f"{prefix}{note.format(n=count)}" for note, count in self.notes.items()]

    def skipped_reasons(self) -> str:
        """The skip counts in one phrase ("3 span(s) without ...; 1 ..."), "" when nothing was skipped."""
        return "; ".join(f"{count} {reason}" for reason, count in self.skipped.items())
