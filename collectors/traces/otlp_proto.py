"""Read OpenTelemetry OTLP protobuf traces (one `ExportTraceServiceRequest`, or a length-prefixed stream of them) into `Span`s.

Accepted, told apart by content and never by file name:

- one binary `ExportTraceServiceRequest`, as an OTLP/HTTP exporter posts it (a body saved to a
  file);
- what the Collector's `file` exporter writes with `format: proto`: each request prefixed by its
  length in 4 bytes, big-endian;
- either of those gzip-compressed (told by the magic bytes).

Messages are decoded by opentelemetry-proto (imported when first needed, so that `latprof`
starts quickly), one `ResourceSpans` (or one stream record) at a time. Values are read as the
OTLP JSON reader reads them: ids as lowercase hex, kinds and status codes as OTLP numbers them,
attributes flat (`bytesValue` as its base64 text), one resource mapping shared by the spans of
each `ResourceSpans`. A span that cannot be read is skipped and an attribute, event or link that
cannot be read is dropped, each counted into one warning per reason, with the JSON reader's
wording. A file cut short (a writer killed mid-record, a truncated gzip stream) keeps every
complete message before the cut, with a warning; bytes that are not OTLP protobuf are an
`InputError`.

`spans_from_request` is shared with `latprof receive`, which decodes request bodies with
`parse_request` and answers with `export_response` and `rpc_status`.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from latprof.capture.files import gc_paused
from latprof.collectors.traces._tracefile import read_bytes as _read_bytes
from latprof.errors import InputError
from latprof.events import NO_ATTRS
from latprof.collectors.traces.spans import STATUS_UNSET, Span, SpanEvent, SpanLink

#: The first byte of a request: field 1 (`resource_spans`), length-delimited.
_RESOURCE_SPANS_TAG = 0x0A
_ZERO_TRACE_ID = bytes(16)
_ZERO_SPAN_ID = bytes(8)
#: Distinct strings and ids remembered to share one object of each (bounds memory).
_SHARED_MAX = 500_000
#: Stream records `sniff` looks through for a first complete span.
_SNIFF_RECORDS = 64
_SNIFF_DEPTH = 24

# --- sniffing: the wire format of a trace request, without decoding it ---------------------------

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
#: Per message: field number -> (wire type, the message it holds or None). Other fields are
#: allowed (a newer proto) when their wire type is valid, except at the top of a request.
_WIRE: dict[str, dict[int, tuple[int, str | None]]] = {
    "request": {1: (_LEN, "resource_spans")},
    "resource_spans": {1: (_LEN, "resource"), 2: (_LEN, "scope_spans"), 3: (_LEN, None)},
    "resource": {1: (_LEN, "key_value"), 2: (_VARINT, None)},
    "scope_spans": {1: (_LEN, "scope"), 2: (_LEN, "span"), 3: (_LEN, None)},
    "scope": {1: (_LEN, None), 2: (_LEN, None), 3: (_LEN, "key_value"), 4: (_VARINT, None)},
    "span": {
        1: (_LEN, None), 2: (_LEN, None), 3: (_LEN, None), 4: (_LEN, None), 5: (_LEN, None), 6: (_VARINT, None),
        7: (_I64, None), 8: (_I64, None), 9: (_LEN, "key_value"), 10: (_VARINT, None), 11: (_LEN, "event"),
        12: (_VARINT, None), 13: (_LEN, "link"), 14: (_VARINT, None), 15: (_LEN, "status"), 16: (_I32, None),
    },
    "key_value": {1: (_LEN, None), 2: (_LEN, "any_value"), 3: (_VARINT, None)},
    "any_value": {1: (_LEN, None), 2: (_VARINT, None), 3: (_VARINT, None), 4: (_I64, None), 5: (_LEN, "array"),
                  6: (_LEN, "kvlist"), 7: (_LEN, None), 8: (_VARINT, None)},
    "array": {1: (_LEN, "any_value")},
    "kvlist": {1: (_LEN, "key_value")},
    "event": {1: (_I64, None), 2: (_LEN, None), 3: (_LEN, "key_value"), 4: (_VARINT, None)},
    "link": {1: (_LEN, None), 2: (_LEN, None), 3: (_LEN, None), 4: (_LEN, "key_value"), 5: (_VARINT, None),
             6: (_I32, None)},
    "status": {1: (_VARINT, None), 2: (_LEN, None), 3: (_VARINT, None)},
}  # fmt: skip
#: Span fields whose length is fixed: trace_id, span_id.
_SPAN_ID_LENGTHS = {1: 16, 2: 8}


class _NotProto(Exception):
    """The bytes break the wire format of a trace request."""


class _HeadEnds(Exception):
    """The bytes looked at end inside a field."""


class _SpanSeen(Exception):
    """A complete span with a trace id and a span id was walked."""


def _varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise _HeadEnds
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift >= 64:
            raise _NotProto


def _walk(buf: bytes, pos: int, end: int, message: str, depth: int) -> None:
    """Check the fields of `message` in `buf[pos:end]` (`end` may lie past the bytes); raise `_SpanSeen` at a complete span."""
    if depth > _SNIFF_DEPTH:
        raise _NotProto
    fields = _WIRE[message]
    have = len(buf)
    ids = 0
    while pos < end:
        if pos >= have:
            raise _HeadEnds
        tag, pos = _varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        expected = fields.get(number)
        if number == 0 or (expected is None and (message == "request" or wire not in (_VARINT, _I64, _LEN, _I32))):
            raise _NotProto
        if expected is not None and expected[0] != wire:
            raise _NotProto
        if wire == _VARINT:
            _, pos = _varint(buf, pos)
        elif wire == _I64:
            pos += 8
        elif wire == _I32:
            pos += 4
        else:
            length, pos = _varint(buf, pos)
            stop = pos + length
            if stop > end:
                raise _NotProto  # a field longer than the message holding it
            if message == "span" and number in _SPAN_ID_LENGTHS:
                ids += length == _SPAN_ID_LENGTHS[number]  # a span with a bad id: look on to the next one
            elif expected is not None and expected[1] is not None:
                _walk(buf, pos, stop, expected[1], depth + 1)
            pos = stop
    if pos > end:
        raise _NotProto
    if message == "span" and ids >= 2 and end <= have:
        raise _SpanSeen


def sniff(head: bytes) -> bool:
    """True when `head` (the first up to 64 KiB of a file, decompressed) looks like OTLP protobuf traces.

    That is: the wire format of an `ExportTraceServiceRequest` (or of a stream of them, each
    after a 4-byte big-endian length) holds, within `head`, every field where a trace request
    has it, up to the end of a first complete span with a 16-byte trace id and an 8-byte span
    id. Text cannot pass (a span's container is field 2, byte 0x12, a control character), so a
    JSON file, a latprof capture or a Jaeger or Zipkin file is False.
    """
    if not head:
        return False
    try:
        if head[0] == _RESOURCE_SPANS_TAG:  # one request (a stream's first byte is its length's highest)
            _walk(head, 0, 1 << 62, "request", 0)
            return False
        if head[0] >= _RESOURCE_SPANS_TAG:
            return False
        pos = 0
        for _ in range(_SNIFF_RECORDS):
            if len(head) - pos < 4:
                return False
            length = int.from_bytes(head[pos:pos + 4], "big")
            _walk(head, pos + 4, pos + 4 + length, "request", 0)
            pos += 4 + length
    except _SpanSeen:
        return True
    except (_NotProto, _HeadEnds):
        return False
    return False


# --- decoding ---------------------------------------------------------------------------------------


class _Unreadable(Exception):
    """An attribute value that cannot be read (the attribute is dropped)."""


class Counters:
    """What converting requests skipped or dropped, by reason, and the strings and ids shared across them.

    One per file read; `latprof receive` makes one per request (its reasons go into the
    response), passing every request the same `shared` and `hex_ids` caches.
    """

    def __init__(self, shared: dict[str, str] | None = None, hex_ids: dict[bytes, str] | None = None) -> None:
        #: Why spans were skipped, with counts (the OTLP JSON reader's wording).
        self.skipped: dict[str, int] = {}
        #: What was dropped or replaced inside spans that were kept (each with an `{n}` for the count).
        self.notes: dict[str, int] = {}
        #: Spans met, read or not.
        self.offered = 0
        #: Names, attribute keys and string values: one object of each.
        self.shared: dict[str, str] = {} if shared is None else shared
        #: Trace and parent span ids (valid ones) to their hex form: one object of each.
        self.hex_ids: dict[bytes, str] = {} if hex_ids is None else hex_ids

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def note(self, note: str) -> None:
        self.notes[note] = self.notes.get(note, 0) + 1

    def warnings(self, prefix: str = "") -> list[str]:
        """One line per reason, with its count, each after `prefix` ("x.pb: ")."""
        lines = [f"{prefix}skipped {count} {reason}" for reason, count in self.skipped.items()]
        lines += [f"{prefix}{note.format(n=count)}" for note, count in self.notes.items()]
        return lines


def parse_request(data: bytes | memoryview) -> Any:
    """Decode a binary `ExportTraceServiceRequest`; raises `ValueError` (one line) when `data` is not one."""
    from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    try:
        return ExportTraceServiceRequest.FromString(data)
    except (DecodeError, RecursionError) as exc:
        raise ValueError(f"not a protobuf ExportTraceServiceRequest: {exc}") from None


def export_response(rejected_spans: int = 0, error_message: str = "", *, json: bool = False) -> bytes:
    """An `ExportTraceServiceResponse` (a partial success when either argument is set), protobuf or OTLP JSON."""
    from google.protobuf import json_format  # type: ignore[import-untyped]
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    response = ExportTraceServiceResponse()
    if rejected_spans or error_message:
        response.partial_success.rejected_spans = rejected_spans
        response.partial_success.error_message = error_message
    if json:
        import orjson

        return orjson.dumps(json_format.MessageToDict(response))
    return bytes(response.SerializeToString())


def rpc_status(code: int, message: str, *, json: bool = False) -> bytes:
    """A `google.rpc.Status` (the body OTLP/HTTP gives a 4xx or 5xx response), protobuf or JSON.

    Its two fields are written by hand: `code` (field 1, a gRPC code) and `message` (field 2);
    the googleapis protos are not a dependency for so little.
    """
    if json:
        import orjson

        return orjson.dumps({"code": code, "message": message})
    text = message.encode("utf-8")
    return b"\x08" + _encode_varint(code) + b"\x12" + _encode_varint(len(text)) + text


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def spans_from_request(msg: Any, counters: Counters) -> list[Span]:
    """The spans of a decoded `ExportTraceServiceRequest`, in message order; what was skipped is counted into `counters`."""
    out: list[Span] = []
    for rs in msg.resource_spans:
        _resource_spans(rs, counters, out)
    return out


def _resource_spans(rs: Any, counters: Counters, out: list[Span]) -> None:
    """Append the readable spans of one `ResourceSpans` to `out`."""
    shared = counters.shared
    intern = shared.setdefault
    hex_ids = counters.hex_ids
    skip = counters.skip
    flat = _attributes(rs.resource.attributes, counters)
    service_name = flat.get("service.name")
    service = "" if service_name is None else str(service_name)
    service = intern(service, service)
    resource: Mapping[str, Any] = flat or NO_ATTRS  # one mapping for all the resource's spans
    new_tuple = tuple.__new__
    out_append = out.append
    no_attrs: Any = NO_ATTRS
    zero_trace, zero_span = _ZERO_TRACE_ID, _ZERO_SPAN_ID
    for ss in rs.scope_spans:
        scope = ss.scope.name
        scope = intern(scope, scope)
        spans = ss.spans
        counters.offered += len(spans)
        for sp in spans:
            raw = sp.trace_id
            trace_id = hex_ids.get(raw)
            if trace_id is None or len(raw) != 16:  # (the cache holds parent ids too: 8 bytes)
                if len(raw) != 16 or raw == zero_trace:
                    skip("span(s) without a valid traceId")
                    continue
                trace_id = hex_ids[raw] = raw.hex()
            raw = sp.span_id
            if len(raw) != 8 or raw == zero_span:
                skip("span(s) without a valid spanId")
                continue
            span_id = raw.hex()
            raw = sp.parent_span_id
            if not raw or raw == zero_span:  # absent, or all zero as some exporters mark a root
                parent_id = None
            else:
                parent_id = hex_ids.get(raw)
                if parent_id is None or len(raw) != 8:  # (the cache holds trace ids too: 16 bytes)
                    if len(raw) != 8:
                        skip("span(s) with an invalid parentSpanId")
                        continue
                    parent_id = hex_ids[raw] = raw.hex()
            start = sp.start_time_unix_nano
            end = sp.end_time_unix_nano
            if not start or not end:
                skip("span(s) without a readable start and end time")
                continue
            if end < start:
                skip("span(s) that end before they start")
                continue
            name = sp.name
            name = intern(name, name)
            kind = sp.kind
            if not 0 <= kind <= 5:
                counters.note("read {n} span(s) with an unknown kind as unspecified")
                kind = 0
            status_code = sp.status.code
            if not 0 <= status_code <= 2:
                counters.note("read {n} span(s) with an unknown status code as unset")
                status_code = STATUS_UNSET
            attrs = _attributes(sp.attributes, counters) if len(sp.attributes) else no_attrs
            events = _events(sp.events, counters) if len(sp.events) else ()
            links = _links(sp.links, counters) if len(sp.links) else ()
            out_append(new_tuple(Span, (
                trace_id, span_id, parent_id, name, kind, start, end, service, scope,
                attrs or no_attrs, status_code, events, links, resource, sp.dropped_events_count if events else 0,
            )))  # fmt: skip
    if len(shared) > _SHARED_MAX:
        shared.clear()  # many distinct values: stop paying for what is not shared
    if len(hex_ids) > 4 * _SHARED_MAX:
        hex_ids.clear()


def _attributes(kvs: Any, counters: Counters) -> dict[str, Any]:
    """A flat dict of repeated `KeyValue`s; an unreadable value drops its attribute, counted."""
    shared = counters.shared
    out: dict[str, Any] = {}
    for kv in kvs:
        key = kv.key
        try:
            out[shared.setdefault(key, key)] = _any_value(kv.value, shared)
        except _Unreadable:
            counters.note("dropped {n} attribute(s) with an unreadable value")
    return out


def _any_value(value: Any, shared: dict[str, str]) -> Any:
    """The Python value of an `AnyValue`; raises `_Unreadable` for one with no value (or only a string-table index)."""
    which = value.WhichOneof("value")
    if which == "string_value":
        text = value.string_value
        return shared.setdefault(text, text)
    if which == "int_value":
        return value.int_value
    if which == "bool_value":
        return value.bool_value
    if which == "double_value":
        return value.double_value
    if which == "array_value":
        return [_any_value(item, shared) for item in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _any_value(kv.value, shared) for kv in value.kvlist_value.values}
    if which == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")  # as OTLP JSON writes it, and its reader keeps it
    raise _Unreadable


def _events(raw: Any, counters: Counters) -> tuple[SpanEvent, ...]:
    shared = counters.shared
    events = []
    for ev in raw:
        if not ev.time_unix_nano:
            counters.note("dropped {n} event(s) without a readable time, name or attributes")
            continue
        name = ev.name
        events.append(SpanEvent(shared.setdefault(name, name), ev.time_unix_nano,
                                _attributes(ev.attributes, counters) or NO_ATTRS))  # fmt: skip
    return tuple(events)


def _links(raw: Any, counters: Counters) -> tuple[SpanLink, ...]:
    hex_ids = counters.hex_ids
    links = []
    for link in raw:
        trace_id, span_id = link.trace_id, link.span_id
        if len(trace_id) == 16 and len(span_id) == 8 and trace_id != _ZERO_TRACE_ID and span_id != _ZERO_SPAN_ID:
            links.append(SpanLink(hex_ids.get(trace_id) or trace_id.hex(), span_id.hex()))
        else:
            counters.note("dropped {n} link(s) without a valid traceId and spanId")
    return tuple(links)


# --- files ----------------------------------------------------------------------------------------


@dataclass
class OtlpProtoRead:
    """The spans of one OTLP protobuf file, and what was skipped to read them."""

    spans: list[Span] = field(default_factory=list)
    #: One line each, naming the file, with counts ("x.pb: skipped 3 span(s) without a valid spanId").
    warnings: list[str] = field(default_factory=list)
    #: `ExportTraceServiceRequest` messages read (the records of a stream; 1 for a single message).
    documents: int = 0


def read_otlp_proto(path: str | os.PathLike[str]) -> OtlpProtoRead:
    """Read the OTLP protobuf traces in `path` (plain or gzip) into spans, in file order.

    Raises `InputError` (one line, naming the file) for a missing or unreadable file, an empty
    one, one that is not OTLP protobuf traces, a message that cannot be decoded before the last
    one (damage inside the file), or a file holding no readable span. A file cut short keeps
    what came before the cut, with a warning. The cyclic garbage collector is paused while the
    spans are built (they hold no cycles).
    """
    name = os.fspath(path)
    data, gzip_damage = _read_bytes(name)
    result = OtlpProtoRead()
    if gzip_damage is not None:
        if not data:
            raise InputError(f"{name}: compressed stream is truncated or damaged ({gzip_damage})")
        result.warnings.append(f"{name}: compressed stream is truncated or damaged ({gzip_damage}); read what came before it")
    if not data:
        raise InputError(f"{name}: file is empty")
    if not sniff(data[:65536]):
        what = "JSON or text" if data.lstrip()[:1] in (b"{", b"[") else "no trace request's wire format"
        raise InputError(f"{name}: not OTLP protobuf traces ({what})")
    counters = Counters()
    with gc_paused():
        if data[0] == _RESOURCE_SPANS_TAG:
            _read_message(name, data, counters, result)
        else:
            _read_stream(name, data, counters, result)
    result.warnings.extend(counters.warnings(f"{name}: "))
    if not result.spans:
        reasons = "; ".join(f"{count} {reason}" for reason, count in counters.skipped.items())
        raise InputError(f"{name}: OTLP protobuf file holds no readable spans" + (f": skipped {reasons}" if reasons else ""))
    return result


def _read_message(name: str, data: bytes, counters: Counters, result: OtlpProtoRead) -> None:
    """One request: its `resource_spans` fields one by one, so a cut keeps every complete span before it."""
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans

    view = memoryview(data)
    pos, size, read = 0, len(data), 0
    result.documents = 1
    while pos < size:
        try:
            tag, start = _varint(data, pos)
            if tag != _RESOURCE_SPANS_TAG:
                raise _NotProto
            length, start = _varint(data, start)
        except _HeadEnds:
            _cut(name, pos, result)
            return
        except _NotProto:
            raise InputError(f"{name}: damaged at byte {pos}: not a resourceSpans field (after {read} resourceSpans)") from None
        cut = start + length > size
        try:
            rs = ResourceSpans.FromString(_salvage(view[start:], "resource_spans") if cut else view[start:start + length])
        except (DecodeError, RecursionError) as exc:
            if cut:
                _cut(name, pos, result)
                return
            raise InputError(f"{name}: damaged at byte {pos}: resourceSpans {read + 1} cannot be decoded ({exc})") from None
        _resource_spans(rs, counters, result.spans)
        if cut:
            _cut(name, pos, result)
            return
        read += 1
        pos = start + length


def _read_stream(name: str, data: bytes, counters: Counters, result: OtlpProtoRead) -> None:
    """The Collector file exporter's records: a 4-byte big-endian length, then that many bytes of request."""
    view = memoryview(data)
    pos, size = 0, len(data)
    while pos < size:
        if size - pos < 4:
            _cut(name, pos, result)
            return
        length = int.from_bytes(data[pos:pos + 4], "big")
        start = pos + 4
        cut = start + length > size
        try:
            msg = parse_request(_salvage(view[start:], "request") if cut else view[start:start + length])
        except ValueError as exc:
            if cut:
                _cut(name, pos, result)
                return
            raise InputError(f"{name}: damaged at byte {pos}: record {result.documents + 1} is {exc}") from None
        result.spans.extend(spans_from_request(msg, counters))
        result.documents += 1
        if cut:
            _cut(name, pos, result)
            return
        pos = start + length


def _cut(name: str, pos: int, result: OtlpProtoRead) -> None:
    result.warnings.append(
        f"{name}: truncated: the file ends inside the message that starts at byte {pos}; read the"
        f" {len(result.spans)} complete span(s) before the cut"
    )


#: The fields of a message cut short worth salvaging: its containers of spans, by field number.
_CONTAINERS = {"request": {1: "resource_spans"}, "resource_spans": {2: "scope_spans"}, "scope_spans": {}}


def _salvage(buf: memoryview, message: str) -> bytes:
    """The complete fields at the start of `buf` (a message cut short) and what is complete of a cut container of spans.

    A cut span is left out; a cut `scope_spans` keeps its scope and its complete spans, and so on up.
    """
    out = bytearray()
    pos, size = 0, len(buf)
    containers = _CONTAINERS[message]
    while pos < size:
        first = pos
        try:
            tag, pos = _varint(buf, pos)
            wire = tag & 7
            if wire == _VARINT:
                _, pos = _varint(buf, pos)
            elif wire == _I64:
                pos += 8
            elif wire == _I32:
                pos += 4
            elif wire == _LEN:
                length, start = _varint(buf, pos)
                pos = start + length
                container = containers.get(tag >> 3)
                if pos > size and container is not None:
                    part = _salvage(buf[start:], container)
                    out += _encode_varint(tag) + _encode_varint(len(part)) + part
                    break
            else:
                break
        except (_HeadEnds, _NotProto):
            break
        if pos > size:
            break
        out += buf[first:pos]
    return bytes(out)
