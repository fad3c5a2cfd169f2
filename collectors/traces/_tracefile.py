"""What the trace file readers share: opening plain or gzip files, reading them whole, ids and microsecond times."""

from __future__ import annotations

import gzip
import math
import re
import zlib
from dataclasses import dataclass, field
from typing import Any

import orjson

from latprof.capture.files import GzipInput, open_input
from latprof.errors import InputError
from latprof.collectors.traces.spans import STATUS_ERROR, STATUS_NAMES, STATUS_UNSET, Span

#: The UTF-8 byte order mark some tools write first.
UTF8_BOM = b"\xef\xbb\xbf"
#: The all-zero ids, which are no trace and no span.
ZERO_TRACE_ID = "0" * 32
ZERO_SPAN_ID = "0" * 16
DIGITS = frozenset("0123456789")
#: Distinct strings remembered per file to share one object of each (bounds memory).
SHARED_MAX = 500_000

#: OpenTelemetry attributes that are integers (Zipkin tags and the ClickHouse exporter's maps carry them as text), among them those latprof reads.
INT_ATTRIBUTES = frozenset({
    "http.response.status_code", "http.status_code", "server.port", "client.port", "net.peer.port", "net.host.port",
    "network.peer.port", "network.local.port", "http.request.resend_count", "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens", "db.operation.batch.size", "db.response.returned_rows", "messaging.batch.message_count",
    "rpc.grpc.status_code", "process.pid", "thread.id",
})  # fmt: skip
#: OpenTelemetry (and latprof-read) attributes that are floating-point numbers.
FLOAT_ATTRIBUTES = frozenset({"gen_ai.response.time_to_first_chunk", "gen_ai.request.temperature", "gen_ai.request.top_p"})
_FLOAT_TEXT = re.compile(r"-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")

_CHUNK = 1 << 16
HEX = "0123456789abcdef"
_HEX_BYTES = HEX.encode()
_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean"}


@dataclass
class TraceRead:
    """The spans of one trace file, and what was skipped to read them."""

    spans: list[Span] = field(default_factory=list)
    #: One line each, naming the file, with counts ("x.json: skipped 3 span(s) without a valid spanId").
    warnings: list[str] = field(default_factory=list)
    #: Documents read (what one is depends on the format).
    documents: int = 0


def cached_trace_id(raw: Any, trace_ids: dict[Any, str], new_ids: list[str]) -> str:
    """A plain trace id as the OTLP JSON readers take it in line: the cached string of `raw`, or `raw`
    itself cached and listed in `new_ids` (its hex is checked with the line's other ids, joined);
    ValueError (or TypeError) for one that is not 32 characters."""
    trace_id = trace_ids.get(raw)
    if trace_id is None:
        if len(raw) != 32:
            raise ValueError
        new_ids.append(raw)
        trace_id = trace_ids[raw] = raw
    return trace_id


def cached_parent_id(raw: Any, parent_ids: dict[str, str], new_ids: list[str]) -> str | None:
    """A plain parent span id as `cached_trace_id` takes a trace id: None for none (empty, or all zero)."""
    if not raw:
        return None
    known = parent_ids.get(raw)
    if known is not None:
        return known
    if len(raw) != 16:
        raise ValueError
    if raw == ZERO_SPAN_ID:
        return None
    new_ids.append(raw)
    parent_ids[raw] = raw
    return raw  # type: ignore[no-any-return]


def ids_plain(span_ids: list[str], new_ids: list[str]) -> bool:
    """Whether the ids an OTLP JSON reader took in line (`span_ids`, and the trace and parent ids new
    to its caches, `new_ids`) are all lowercase hex and none may be all zero: checked joined, a byte
    translation far cheaper than a check per id."""
    joined = "".join(span_ids) + "".join(new_ids)
    try:
        return not joined.encode("ascii").translate(None, _HEX_BYTES) and ZERO_SPAN_ID not in joined
    except UnicodeEncodeError:
        return False


def forget_ids(new_ids: list[str], trace_ids: dict[Any, str], parent_ids: dict[str, str]) -> None:
    """Take `new_ids` (cached by `cached_trace_id` and `cached_parent_id`) out of the caches again, when
    `ids_plain` refused them: the caches hold valid ids only."""
    for raw_id in new_ids:
        trace_ids.pop(raw_id, None)
        parent_ids.pop(raw_id, None)


def trim_caches(shared: dict[str, str], parent_ids: dict[str, str], trace_ids: dict[Any, str]) -> None:
    """Empty a reader's caches grown past `SHARED_MAX` (many distinct values: stop paying for what is not
    shared; ids seen again are checked again)."""
    if len(shared) > SHARED_MAX:
        shared.clear()
    if len(parent_ids) > SHARED_MAX:
        parent_ids.clear()
    if len(trace_ids) > 4 * SHARED_MAX:
        trace_ids.clear()


def number_attribute(key: str, value: str) -> Any:
    """An attribute's text as the number the OpenTelemetry attribute `key` is, when it is one of those and reads as one."""
    if key in INT_ATTRIBUTES:
        digits = value[1:] if value.startswith("-") else value
        if digits and digits.isascii() and DIGITS.issuperset(digits):
            return int(value)
    elif key in FLOAT_ATTRIBUTES and value.isascii() and _FLOAT_TEXT.fullmatch(value):
        return float(value)
    return value


def sniff_text(head: bytes) -> bytes:
    """A file's head after a UTF-8 byte order mark and whitespace: where a sniff looks for JSON."""
    return (head[len(UTF8_BOM):] if head.startswith(UTF8_BOM) else head).lstrip()


def has_key(window: bytes, key: bytes) -> bool:
    """`key` (quoted) occurs in `window` as an object key: followed by a colon, or where the window ends."""
    at = window.find(key)
    while at >= 0:
        if window[at + len(key):].lstrip()[:1] in (b":", b""):
            return True
        at = window.find(key, at + 1)
    return False




def read_bytes(path: str) -> tuple[bytes, str | None]:
    """The file's bytes (decompressed), and what was wrong with its compressed stream if it ended early."""
    stream = open_input(path)
    chunks: list[bytes] = []
    try:
        if isinstance(stream, GzipInput):  # in chunks, so a truncated stream keeps what came before
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


def first_keys(obj: dict[Any, Any], count: int = 4) -> str:
    """The first `count` keys of a parsed object for a one-line message: a key with a line break
    or another unprintable character (or past 40 characters) shown as its escaped, cut repr."""
    shown = []
    for key in list(obj)[:count]:
        text = str(key)
        shown.append(text if text.isprintable() and len(text) <= 40 else repr(text[:40]))
    return ", ".join(shown)


def json_type(value: Any) -> str:
    """The JSON name of a parsed value's type, for messages."""
    return _JSON_TYPES.get(type(value), "null")


def hex_id(value: Any, width: int) -> str | None:
    """`value` as `width` lowercase hex digits, left-padded with zeros; None unless a string of 1 to `width` hex digits."""
    if type(value) is not str or not 0 < len(value) <= width:
        return None
    low = value.lower()
    if low.strip(HEX):
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
        #: Raw trace id to its canonical form (valid ids only); also shares one string per trace.
        self.trace_ids: dict[Any, str] = {}

    def read_values(self, what: str) -> list[tuple[int, Any]]:
        """The file's JSON values (see `parse_values`; `what` names the format), after a UTF-8 byte order mark.

        Raises `InputError` for an empty file; a compressed stream that ends early is said in
        the warnings when what came before it could be read.
        """
        path = self.path
        data, damage = read_bytes(path)
        if data.startswith(UTF8_BOM):
            data = data[len(UTF8_BOM):]
        if not data.strip():
            if damage is not None:
                raise InputError(f"{path}: compressed stream is truncated or damaged ({damage})")
            raise InputError(f"{path}: file is empty")
        docs = parse_values(path, data, damage, self.warnings, what)
        if damage is not None:
            self.warnings.append(f"{path}: compressed stream is truncated or damaged ({damage}); read what came before it")
        return docs

    def _remember_trace_id(self, raw_trace_id: str, trace_id: str) -> str:
        """The one string of the valid trace id `trace_id`, first met as `raw_trace_id` (then remembered)."""
        trace_ids = self.trace_ids
        if len(trace_ids) > SHARED_MAX:
            trace_ids.clear()  # only a cache: ids seen again are checked again
        trace_id = trace_ids.setdefault(trace_id, trace_id)
        trace_ids[raw_trace_id] = trace_id
        return trace_id

    def _otel_status_scope(self, attrs: dict[str, Any], error: bool) -> tuple[int, str]:
        """The status (an error if `error`, else the `otel.status_code` tag) and the scope that the
        OpenTelemetry-to-Jaeger and -Zipkin mappings put in tags; those tags are removed from `attrs`."""
        status_code = STATUS_UNSET
        raw_status = attrs.pop("otel.status_code", None)
        attrs.pop("otel.status_description", None)
        if error:
            status_code = STATUS_ERROR
        elif raw_status is not None:
            found = STATUS_NAMES.get(raw_status.upper()) if type(raw_status) is str else None
            if found is None:
                self._note("read {n} span(s) with an unknown otel.status_code as unset")
            else:
                status_code = found
        scope = attrs.pop("otel.scope.name", None)
        library = attrs.pop("otel.library.name", None)
        attrs.pop("otel.scope.version", None)
        attrs.pop("otel.library.version", None)
        if type(scope) is not str:
            scope = library if type(library) is str else ""
        return status_code, scope

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
