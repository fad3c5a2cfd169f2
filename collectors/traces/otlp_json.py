"""Read OpenTelemetry OTLP JSON trace files (Collector `file` exporter lines, or one document) into `Span`s.

Accepted, told apart by content and never by file name:

- JSON Lines of `ExportTraceServiceRequest` objects, one per line, as the Collector's `file`
  exporter writes them (one trace may straddle lines);
- one document, compact or pretty-printed over many lines;
- a document wrapped as `{"result": {...}}` (Jaeger's api/v3), or a JSON array of documents;
- any of those gzip-compressed (told by the magic bytes).

Both encodings of the fields are read: the OTLP/JSON one (hex ids, lowerCamelCase keys,
integer enums) and what protobuf's `json_format` writes from the same messages (base64 ids,
enum names, and with `preserving_proto_field_name` snake_case keys), as well as the
pre-1.0 `instrumentationLibrarySpans`. Damage costs as little as it can: a torn last line or
a truncated gzip stream keeps everything before it, a span that cannot be read is skipped and
an attribute value that cannot be read is dropped, each counted into one warning per reason.

The loop over spans is the hot path of reading a million-span file: it takes the shapes
exporters write (lowercase hex ids, decimal-string times, integer kinds, string and int
attribute values) in line, and hands anything else to `_careful_span`, which decides what the
span means or why it is skipped. The fast path must never accept what the careful one would
read differently; it may only send more spans to it (tests/collectors/traces/test_otlp_json.py
reads junk both ways and compares). Before that, in line mode, a line after the first in the
plain shape is decoded by msgspec straight into structs and read from them
(`otlp_msgspec`): no dict per span and attribute; any other line is read as before.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import os
import zlib
from dataclasses import dataclass
from typing import IO, Any, Mapping

import orjson

from latprof.capture.files import gc_paused, open_input, skip_blank_lines
from latprof.collectors.traces._tracefile import UTF8_BOM as _UTF8_BOM, ReaderState, TraceRead
from latprof.collectors.traces._tracefile import ZERO_SPAN_ID as _ZERO_SPAN_ID, ZERO_TRACE_ID as _ZERO_TRACE_ID, has_key
from latprof.collectors.traces._tracefile import HEX, cached_parent_id, cached_trace_id, forget_ids, ids_plain, trim_caches
from latprof.collectors.traces._tracefile import first_keys as _first_keys, sniff_text as _sniff_text
from latprof.errors import InputError
from latprof.events import NO_ATTRS
from latprof.collectors.traces.spans import KIND_NAMES, STATUS_NAMES, STATUS_UNSET, Span, SpanEvent, SpanLink
from latprof.collectors.traces.otlp_msgspec import line_reader

#: How far into a file `sniff` looks for the top-level key.
_SNIFF_KEY_WINDOW = 512
#: Span kinds and status codes by their number and by their names, each to its number.
_KINDS: dict[Any, int] = {**{n: n for n in range(6)}, **KIND_NAMES}
_STATUSES: dict[Any, int] = {**{n: n for n in range(3)}, **STATUS_NAMES}

#: protobuf's field names of a Span (and its parts) to their JSON names.
_SNAKE_TO_CAMEL = {
    "trace_id": "traceId",
    "span_id": "spanId",
    "parent_span_id": "parentSpanId",
    "trace_state": "traceState",
    "start_time_unix_nano": "startTimeUnixNano",
    "end_time_unix_nano": "endTimeUnixNano",
    "time_unix_nano": "timeUnixNano",
    "dropped_attributes_count": "droppedAttributesCount",
    "dropped_events_count": "droppedEventsCount",
    "dropped_links_count": "droppedLinksCount",
}
#: Read the lines after the first that are in the plain shape with msgspec (`otlp_msgspec`); False reads
#: every line the general way (the tests read files both ways and compare).
MSGSPEC_LINES = True
_SIGNAL_KEYS = (
    "resourceMetrics", "resource_metrics", "resourceLogs", "resource_logs",
    "resourceProfiles", "resource_profiles",
)  # fmt: skip


class _Unreadable(Exception):
    """An attribute value that cannot be read (the attribute is dropped)."""


@dataclass
class OtlpRead(TraceRead):
    """The spans of one OTLP JSON file, and what was skipped to read them (`documents`:
    `ExportTraceServiceRequest` objects read)."""


def sniff(head: bytes) -> bool:
    """True when `head` (the first up to 64 KiB of a file, decompressed) looks like OTLP JSON traces.

    That is: after optional whitespace (and a UTF-8 byte order mark) a JSON object or an array
    of objects, with the key `"resourceSpans"` or `"resource_spans"` within its first few hundred
    bytes, possibly inside an outer `{"result": ...}`. No parse: a capture file (`{"type":
    "header", ...`) or any other JSON is False.
    """
    text = _sniff_text(head)
    if text.startswith(b"["):
        text = text[1:].lstrip()
    if not text.startswith(b"{"):
        return False
    window = text[:_SNIFF_KEY_WINDOW]
    return has_key(window, b'"resourceSpans"') or has_key(window, b'"resource_spans"')


def read_otlp_json(path: str | os.PathLike[str]) -> OtlpRead:
    """Read the OTLP JSON traces in `path` (plain or gzip) into spans, in file order.

    Raises `InputError` (one line, naming the file, and the line where one applies) for a
    missing or unreadable file, an empty one, one that is not OTLP JSON traces, a line that is
    not valid JSON before the last, a single document that is truncated, or a file holding no
    readable span. The cyclic garbage collector is paused while the spans are built (they hold
    no cycles; a million new objects would make it scan them over and over).
    """
    reader = _Reader(os.fspath(path))
    with gc_paused():
        reader.read()
    return reader.result()


def spans_from_document(doc: Any) -> tuple[list[Span], list[str], int]:
    """The spans of one parsed `ExportTraceServiceRequest` object (or a `{"result": ...}` wrapping one).

    Returns the spans, what was skipped or dropped to read them (one line per reason, with its
    count, naming no file), and how many spans the document held, read or not. For
    `latprof receive`, whose requests are documents already parsed. Raises `TypeError` when
    `doc` is not a JSON object.
    """
    if type(doc) is not dict:
        raise TypeError(f"an ExportTraceServiceRequest is a JSON object, not a JSON {_json_type(doc)}")
    reader = _Reader("")
    reader._take(doc, in_array=True)
    return reader.spans, reader.count_warnings(""), reader.offered


def _canon_id(value: Any, hex_len: int) -> str | None:
    """The lowercase hex form of an id (`hex_len` digits) given in hex, any case, or in base64; None if neither.

    Base64 is what protobuf's `json_format` writes for the `bytes` ids (24 characters for a
    trace id, 12 for a span id); OTLP/JSON itself says hex.
    """
    if type(value) is not str:
        return None
    if len(value) == hex_len:
        low = value.lower()
        return None if low.strip(HEX) else low
    if len(value) == (hex_len // 2 + 2) // 3 * 4:
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            return None
        return raw.hex() if len(raw) * 2 == hex_len else None
    return None


def _json_type(value: Any) -> str:
    """The JSON name of a parsed value's type, for messages."""
    return {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean"}.get(
        type(value), "null"
    )


def _nanos(value: Any) -> int | None:
    """A time in ns from a decimal string or a JSON number (as `int()` reads it); None when absent, not positive or unreadable."""
    try:
        ns = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return ns if ns > 0 else None


def _any_value(value: Any, shared: dict[str, str]) -> Any:
    """The Python value of an OTLP `AnyValue` object; raises `_Unreadable`."""
    if type(value) is not dict:
        raise _Unreadable
    for tag, v in value.items():
        if tag == "stringValue" or tag == "string_value":
            if type(v) is not str:
                raise _Unreadable
            return shared.setdefault(v, v)
        if tag == "intValue" or tag == "int_value":
            if type(v) is int:
                return v
            if type(v) is str:
                try:
                    return int(v)
                except ValueError:
                    raise _Unreadable from None
            raise _Unreadable
        if tag == "boolValue" or tag == "bool_value":
            if type(v) is not bool:
                raise _Unreadable
            return v
        if tag == "doubleValue" or tag == "double_value":
            if type(v) is float or type(v) is int:
                return float(v)
            if type(v) is str:  # "NaN", "Infinity", "-Infinity", or a number as text
                try:
                    return float(v)
                except ValueError:
                    raise _Unreadable from None
            raise _Unreadable
        if tag == "arrayValue" or tag == "array_value":
            if type(v) is not dict:
                raise _Unreadable
            items = v.get("values", [])
            if type(items) is not list:
                raise _Unreadable
            return [_any_value(item, shared) for item in items]
        if tag == "kvlistValue" or tag == "kvlist_value":
            if type(v) is not dict:
                raise _Unreadable
            entries = v.get("values", [])
            if type(entries) is not list:
                raise _Unreadable
            out: dict[str, Any] = {}
            for kv in entries:
                if type(kv) is not dict or type(kv.get("key")) is not str:
                    raise _Unreadable
                out[kv["key"]] = _any_value(kv.get("value"), shared)
            return out
        if tag == "bytesValue" or tag == "bytes_value":
            if type(v) is not str:
                raise _Unreadable
            return v  # kept as its base64 text
        # an unknown member (a newer AnyValue, or junk): look at the next one
    raise _Unreadable


class _Reader(ReaderState):
    """The state of reading one file: spans so far, shared objects, and counts of what was skipped."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        #: Parent span ids (valid ones, lowercase hex): one object of each.
        self.parent_ids: dict[str, str] = {}
        self.other_signals = 0
        #: Spans met in scopeSpans lists, read or not.
        self.offered = 0
        #: The line being read (the last one read, after a failure).
        self.lineno = 0

    # --- files ----------------------------------------------------------------------------

    def read(self) -> None:
        path = self.path
        stream = open_input(path)
        lineno = 0
        try:
            first = b""
            for line in stream:  # find the first line that is not blank
                lineno += 1
                self.lineno = lineno
                if lineno == 1 and line.startswith(_UTF8_BOM):
                    line = line[len(_UTF8_BOM):]
                if line.strip():
                    first = line
                    break
            if not first:
                raise InputError(f"{path}: file is empty")
            try:
                doc = orjson.loads(first)
            except orjson.JSONDecodeError as exc:
                if first.lstrip()[:1] not in (b"{", b"["):
                    raise InputError(f"{path}: not OTLP JSON traces: not JSON ({exc})") from None
                # Not one JSON value a line: one document over many lines (or a damaged first line).
                self._read_whole(first + stream.read(), lineno)
                return
            self._check_first(doc)
            self._read_lines(stream, doc, lineno)
        except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
            if not self.documents:
                raise InputError(f"{path}: compressed stream is truncated or damaged ({exc})") from None
            self.warnings.append(
                f"{path}: compressed stream is truncated or damaged after line {self.lineno} ({exc});"
                " read what came before it"
            )
        except OSError as exc:
            raise InputError(f"{path}: read failed after line {self.lineno}: {exc.strerror or exc}") from None
        finally:
            stream.close()

    def _check_first(self, doc: Any) -> None:
        """Raise unless the first JSON value read is OTLP (traces, or another signal's requests)."""
        if type(doc) is list:
            if not doc:
                return  # no requests: said at the end
            doc = doc[0]
        if type(doc) is dict:
            inner = doc.get("result")
            if type(inner) is dict:
                doc = inner
            if not doc or "resourceSpans" in doc or "resource_spans" in doc:
                return
            if any(key in doc for key in _SIGNAL_KEYS):
                return  # metrics or logs: the lines after may still be traces; counted, said at the end
            keys = _first_keys(doc)
            reason = f"the first JSON object has no resourceSpans (its keys: {keys})"
        else:
            reason = f"it starts with a JSON {_json_type(doc)}, not an object"
        raise InputError(f"{self.path}: not OTLP JSON traces: {reason}")

    def _read_lines(self, stream: IO[bytes], first_doc: Any, lineno: int) -> None:
        """Line mode: one request per line; a bad line is fatal unless it turns out to be the last."""
        path = self.path
        loads = orjson.loads
        JSONDecodeError = orjson.JSONDecodeError
        take = self._take
        take(first_doc)
        read_plain = line_reader(self) if MSGSPEC_LINES else None
        torn: tuple[int, str] | None = None
        for line in stream:
            lineno += 1
            self.lineno = lineno
            if torn is not None:
                if not line.strip():
                    continue
                raise InputError(f"{path}:{torn[0]}: malformed line ({torn[1]}); the file is damaged before its end")
            if read_plain is not None and read_plain(line):
                continue
            try:
                doc = loads(line)
            except JSONDecodeError as exc:
                if line.strip():
                    torn = (lineno, f"not valid JSON: {exc}")
                else:
                    lineno += skip_blank_lines(stream)
                continue
            if not take(doc):
                torn = (lineno, f"a JSON {_json_type(doc)}, not an ExportTraceServiceRequest object")
        if torn is not None:
            self.warnings.append(f"{path}:{torn[0]}: skipped a torn last line ({torn[1]})")

    def _read_whole(self, text: bytes, first_lineno: int) -> None:
        """One document over many lines (it must be complete), or a first line that is damaged."""
        path = self.path
        try:
            doc = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            if not sniff(text[:4096]):
                raise InputError(f"{path}: not OTLP JSON traces: not JSON ({exc})") from None
            # JSON lines whose first line is damaged, or one damaged document? Look at the next line.
            for line in text.split(b"\n", 16)[1:16]:
                if line.strip():
                    try:
                        later = orjson.loads(line)
                    except orjson.JSONDecodeError:
                        break
                    if type(later) is dict:
                        raise InputError(
                            f"{path}:{first_lineno}: malformed line (not valid JSON: {exc}); the file is damaged"
                            " before its end"
                        ) from None
                    break
            raise InputError(f"{path}: truncated or not valid JSON: {exc}") from None
        self._check_first(doc)
        self._take(doc)  # an object or an array, or `_check_first` raised

    # --- documents -----------------------------------------------------------------------

    def _take(self, doc: Any, in_array: bool = False, unwrapped: bool = False) -> bool:
        """Read one JSON value of the file: a request, a wrapped one or an array of them; False if none of those.

        An array is read at the top only, and a `{"result": ...}` wrapper once (no recursion a
        deeply nested file could exhaust).
        """
        if type(doc) is dict:
            rss = doc.get("resourceSpans")
            if rss is None:
                rss = doc.get("resource_spans")
                if rss is None:
                    inner = doc.get("result")
                    if type(inner) is dict and not unwrapped:
                        return self._take(inner, in_array=True, unwrapped=True)
                    if any(key in doc for key in _SIGNAL_KEYS):
                        self.other_signals += 1
                        return True
                    if doc:
                        self._skip("object(s) that are not trace requests (no resourceSpans)")
                    else:
                        self.documents += 1  # an empty request: no spans
                    return True
            self.documents += 1
            if type(rss) is not list:
                self._skip("request(s) whose resourceSpans is not a list")
                return True
            self._document(rss)
            return True
        if type(doc) is list and not in_array:
            for item in doc:
                if type(item) is dict:
                    self._take(item, in_array=True)
                else:
                    self._skip("array element(s) that are not request objects")
            return True
        return False

    def _attributes(self, attrs: Any) -> dict[str, Any] | None:
        """A flat dict of an OTLP attribute list; None when `attrs` is not a list. Unreadable entries are dropped, counted."""
        if not attrs:
            return {}
        if type(attrs) is not list:
            return None
        shared = self.shared
        out: dict[str, Any] = {}
        for kv in attrs:
            if type(kv) is not dict:
                self._note("dropped {n} attribute(s) that are not key/value objects")
                continue
            key = kv.get("key")
            if type(key) is not str:
                self._note("dropped {n} attribute(s) without a string key")
                continue
            try:
                out[shared.setdefault(key, key)] = _any_value(kv.get("value"), shared)
            except (_Unreadable, RecursionError):
                self._note("dropped {n} attribute(s) with an unreadable value")
        return out

    def _document(self, rss: list[Any]) -> None:
        """Read the resourceSpans of one request."""
        intern = self.shared.setdefault
        for rs in rss:
            if type(rs) is not dict:
                self._skip("resourceSpans element(s) that are not objects")
                continue
            resource_obj = rs.get("resource")
            if resource_obj is None:
                resource_obj = {}
            flat = self._attributes(resource_obj.get("attributes")) if type(resource_obj) is dict else None
            if flat is None:
                self._skip("resourceSpans element(s) whose resource is not an object with an attribute list")
                continue
            service_name = flat.get("service.name")
            service = "" if service_name is None else str(service_name)
            service = intern(service, service)
            resource: Mapping[str, Any] = flat or NO_ATTRS  # one mapping for all the resource's spans
            scope_spans = rs.get("scopeSpans")
            if scope_spans is None:
                scope_spans = rs.get("scope_spans")
                if scope_spans is None:
                    scope_spans = rs.get("instrumentationLibrarySpans", rs.get("instrumentation_library_spans", []))
            if type(scope_spans) is not list:
                self._skip("resourceSpans element(s) whose scopeSpans is not a list")
                continue
            for ss in scope_spans:
                if type(ss) is not dict:
                    self._skip("scopeSpans element(s) that are not objects")
                    continue
                scope_obj = ss.get("scope")
                if scope_obj is None:
                    scope_obj = ss.get("instrumentationLibrary", ss.get("instrumentation_library"))
                if scope_obj is None:
                    scope = ""
                elif type(scope_obj) is dict and type(scope_obj.get("name") or "") is str:
                    scope = scope_obj.get("name") or ""
                    scope = intern(scope, scope)
                else:
                    self._skip("scopeSpans element(s) whose scope is not an object with a string name")
                    continue
                spans = ss.get("spans", [])
                if type(spans) is not list:
                    self._skip("scopeSpans element(s) whose spans is not a list")
                    continue
                self._spans(spans, service, scope, resource)

    def _spans(self, spans: list[Any], service: str, scope: str, resource: Mapping[str, Any]) -> None:
        """Read the spans of one scopeSpans element: the shapes exporters write in line, the rest carefully.

        The span ids the fast path takes (and the trace and parent ids it has not seen before)
        are checked all at once at the end, joined: lowercase hex (a byte translation, far
        cheaper than a check per id) and no run of 16 zeros. If that fails, the whole list is
        read again by `_careful_span`, which says which span is wrong.
        """
        out: list[Any] = self.spans
        first = len(out)
        self.offered += len(spans)
        out_append = out.append
        new_tuple = tuple.__new__
        trace_ids = self.trace_ids
        parent_ids = self.parent_ids
        shared = self.shared
        shared_get = shared.get
        kinds = _KINDS
        statuses = _STATUSES
        no_attrs: Any = NO_ATTRS
        unset = STATUS_UNSET
        anyvalue = _any_value
        span_ids: list[str] = []
        ids_append = span_ids.append
        # trace and parent ids not seen before: cached at once, checked below
        new_ids: list[str] = []
        slow: list[int] | None = None
        for sp in spans:
            try:
                trace_id = cached_trace_id(sp["traceId"], trace_ids, new_ids)
                span_id = sp["spanId"]
                if len(span_id) != 16:
                    raise ValueError
                parent_id = cached_parent_id(sp.get("parentSpanId"), parent_ids, new_ids)
                start = int(sp["startTimeUnixNano"])
                end = int(sp["endTimeUnixNano"])
                if not 0 < start <= end:
                    raise ValueError
                name = sp["name"]
                known = shared_get(name)
                if known is None:
                    if type(name) is not str:
                        raise ValueError
                    shared[name] = name
                else:
                    name = known
                kind = kinds[sp.get("kind", 0)]
                status = sp.get("status")
                status_code = statuses[status.get("code", 0)] if status else unset
                attributes = sp.get("attributes")
                if attributes:
                    attrs = {}
                    for kv in attributes:
                        key = kv["key"]
                        value = kv["value"]
                        string = value.get("stringValue")  # one lookup, not `in` and then `[]`: most values are strings
                        if string is not None:
                            value = shared_get(string)
                            if value is None:
                                if type(string) is not str:
                                    raise ValueError
                                value = shared[string] = string
                        elif "intValue" in value:
                            value = value["intValue"]
                            if type(value) is not str and type(value) is not int:
                                raise ValueError
                            value = int(value)
                        else:
                            value = anyvalue(value, shared)
                        known = shared_get(key)
                        if known is None:
                            if type(key) is not str:
                                raise ValueError
                            shared[key] = key
                            attrs[key] = value
                        else:
                            attrs[known] = value
                else:
                    attrs = no_attrs
                if "events" in sp or "links" in sp:
                    raise ValueError
                ids_append(span_id)
                out_append(new_tuple(Span, (
                    trace_id, span_id, parent_id, name, kind, start, end,
                    service, scope, attrs, status_code, (), (), resource, 0,
                )))  # fmt: skip
            except (KeyError, TypeError, ValueError, AttributeError, OverflowError, _Unreadable):
                if slow is None:
                    slow = []
                slow.append(len(out))
                out_append(sp)  # a placeholder, read carefully below
        careful = self._careful_span
        if not ids_plain(span_ids, new_ids):
            # Some id is not lowercase hex (or is all zero): read the list again, span by span.
            forget_ids(new_ids, trace_ids, parent_ids)
            del out[first:]
            for sp in spans:
                span = careful(sp, service, scope, resource)
                if span is not None:
                    out_append(span)
        elif slow is not None:
            rejected = False
            for at in slow:
                out[at] = span = careful(out[at], service, scope, resource)
                rejected = rejected or span is None
            if rejected:
                out[first:] = [span for span in out[first:] if span is not None]
        trim_caches(shared, parent_ids, trace_ids)

    def _careful_span(self, sp: Any, service: str, scope: str, resource: Mapping[str, Any]) -> Span | None:
        """The span `sp` means (any key style, id encoding, enum form), or None, its reason counted."""
        if type(sp) is not dict:
            self._skip("span(s) that are not objects")
            return None
        sp = {_SNAKE_TO_CAMEL.get(key, key): value for key, value in sp.items()}
        shared = self.shared
        raw_trace_id = sp.get("traceId")
        trace_id = self.trace_ids.get(raw_trace_id) if type(raw_trace_id) is str else None
        if trace_id is None:
            trace_id = _canon_id(raw_trace_id, 32)
            if trace_id is None or trace_id == _ZERO_TRACE_ID:
                self._skip("span(s) without a valid traceId")
                return None
            trace_id = self.trace_ids.setdefault(trace_id, trace_id)
            self.trace_ids[raw_trace_id] = trace_id
        span_id = _canon_id(sp.get("spanId"), 16)
        if span_id is None or span_id == _ZERO_SPAN_ID:
            self._skip("span(s) without a valid spanId")
            return None
        raw_parent = sp.get("parentSpanId")
        if not raw_parent:  # absent, empty (or another falsy value, as the fast path reads it): a root
            parent_id = None
        else:
            parent_id = _canon_id(raw_parent, 16)
            if parent_id is None:
                self._skip("span(s) with an invalid parentSpanId")
                return None
            if parent_id == _ZERO_SPAN_ID:  # some exporters mark a root so
                parent_id = None
            else:
                parent_id = self.parent_ids.setdefault(parent_id, parent_id)
        start = _nanos(sp.get("startTimeUnixNano"))
        end = _nanos(sp.get("endTimeUnixNano"))
        if start is None or end is None:
            self._skip("span(s) without a readable start and end time")
            return None
        if end < start:
            self._skip("span(s) that end before they start")
            return None
        name = sp.get("name", "")
        if type(name) is not str:
            self._skip("span(s) whose name is not a string")
            return None
        try:  # the fast path's lookup, so both agree on odd values (True, 2.0)
            kind = _KINDS.get(sp.get("kind", 0))
        except TypeError:
            kind = None
        if kind is None:
            self._note("read {n} span(s) with an unknown kind as unspecified")
            kind = 0
        status = sp.get("status") or {}
        if type(status) is not dict:
            self._skip("span(s) whose status is not an object")
            return None
        try:
            status_code = _STATUSES.get(status.get("code", 0))
        except TypeError:
            status_code = None
        if status_code is None:
            self._note("read {n} span(s) with an unknown status code as unset")
            status_code = STATUS_UNSET
        attrs = self._attributes(sp.get("attributes"))
        if attrs is None:
            self._skip("span(s) whose attributes is not a list")
            return None
        events = self._events(sp.get("events"))
        if events is None:
            self._skip("span(s) whose events is not a list")
            return None
        links = self._links(sp.get("links"))
        if links is None:
            self._skip("span(s) whose links is not a list")
            return None
        dropped = sp.get("droppedEventsCount", sp.get("dropped_events_count", 0))
        if type(dropped) is str and dropped.isdigit():  # (a uint32: JSON numbers, but be lenient)
            dropped = int(dropped)
        return Span(
            trace_id, span_id, parent_id, shared.setdefault(name, name), kind, start, end, service, scope,
            attrs or NO_ATTRS, status_code, events, links, resource, dropped if events and type(dropped) is int and dropped > 0 else 0,
        )  # fmt: skip

    def _events(self, raw: Any) -> tuple[SpanEvent, ...] | None:
        if raw is None:
            return ()
        if type(raw) is not list:
            return None
        shared = self.shared
        events = []
        for ev in raw:
            if type(ev) is not dict:
                self._note("dropped {n} event(s) that are not objects")
                continue
            ts = _nanos(ev.get("timeUnixNano", ev.get("time_unix_nano")))
            name = ev.get("name", "")
            attrs = self._attributes(ev.get("attributes"))
            if ts is None or type(name) is not str or attrs is None:
                self._note("dropped {n} event(s) without a readable time, name or attributes")
                continue
            events.append(SpanEvent(shared.setdefault(name, name), ts, attrs or NO_ATTRS))
        return tuple(events)

    def _links(self, raw: Any) -> tuple[SpanLink, ...] | None:
        if raw is None:
            return ()
        if type(raw) is not list:
            return None
        links = []
        for link in raw:
            if type(link) is dict:
                trace_id = _canon_id(link.get("traceId", link.get("trace_id")), 32)
                span_id = _canon_id(link.get("spanId", link.get("span_id")), 16)
                if trace_id is not None and span_id is not None and trace_id != _ZERO_TRACE_ID and span_id != _ZERO_SPAN_ID:
                    links.append(SpanLink(self.trace_ids.get(trace_id, trace_id), span_id))
                    continue
            self._note("dropped {n} link(s) without a valid traceId and spanId")
        return tuple(links)

    # --- the result ----------------------------------------------------------------------

    def count_warnings(self, prefix: str) -> list[str]:
        """One line per reason something was skipped or dropped, with its count, each after `prefix`."""
        lines = self.skipped_lines(prefix) + self.note_lines(prefix)
        if self.other_signals:
            lines.append(f"{prefix}skipped {self.other_signals} OTLP metrics, logs or profiles request(s) (not traces)")
        return lines

    def result(self) -> OtlpRead:
        path = self.path
        warnings = self.warnings
        warnings.extend(self.count_warnings(f"{path}: "))
        if not self.spans:
            if not self.documents and self.other_signals:
                raise InputError(f"{path}: not OTLP JSON traces: it holds OTLP metrics, logs or profiles only")
            reasons = self.skipped_reasons()
            raise InputError(
                f"{path}: OTLP JSON file holds no readable spans"
                + (f": skipped {reasons}" if reasons else f" ({self.documents} request(s), none with spans)")
            )
        return OtlpRead(self.spans, warnings, self.documents)

