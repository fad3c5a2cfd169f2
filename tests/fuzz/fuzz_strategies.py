"""Hypothesis strategies for the readers' fuzz tests: real documents of every input format with
wrong or odd values put in, rendered in each encoding the readers accept, and real files damaged byte by byte."""

from __future__ import annotations

import base64
import copy
import gzip
import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import orjson
from hypothesis import strategies as st

from fuzzing import damaged

REPO = Path(__file__).resolve().parents[2]
OTLP_FIXTURES = sorted((REPO / "tests/collectors/traces/fixtures/otlp").glob("*.otlp.json"))
EXAMPLES = sorted((REPO / "examples").glob("*.jsonl.gz"))
T0_NS = 1_796_006_086_000_000_000

# --- odd values -------------------------------------------------------------------------------------

#: Values that sit at the edges of what the readers check: ids of the wrong length or all zeros,
#: numbers past 64 bits, times as text, names of layers, control and non-BMP characters.
ODD_SCALARS: list[Any] = [
    None, True, False, 0, -1, 1, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30, 0.5, -0.0, 1e308, 1e-320,
    "", " ", "0", "-1", "1e3", "NaN", "Infinity", "0x10", "0" * 16, "0" * 32, "f" * 16, "F" * 32, "g" * 16,
    "00000000000000000000000000000001", "1" * 33, "\x00", "\ufeff", "\U0001f600" * 3, "a\nb", "CHILD_OF",
    "STATUS_CODE_ERROR", "SPAN_KIND_SERVER", "SERVER", "db.pool", "header", "segment", "request", "latprof.capture/1",
    "latprof.capture/2", "+10%", "p99", "p100", "<=", "AAAAAAAAAAAAAAAAAAAAAA==", "1796006086433936787",
]  # fmt: skip


def _nested(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Short lists and small objects of `inner`'s values."""
    return st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)


def junk_values() -> st.SearchStrategy[Any]:
    """Any JSON value, odd ones first: edge scalars, text, floats including NaN and infinity, nested a little."""
    scalars = st.one_of(
        st.sampled_from(ODD_SCALARS),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(),  # NaN and infinity render as JSON's non-standard NaN / Infinity
        st.text(max_size=40),
    )
    return st.recursive(scalars, _nested, max_leaves=10)


def _paths(doc: Any) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []

    def walk(node: Any, where: tuple[Any, ...]) -> None:
        if where:
            out.append(where)
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, (*where, key))
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, (*where, index))

    walk(doc, ())
    return out


@st.composite
def mutated(draw: st.DrawFn, seeds: list[Any], junk: st.SearchStrategy[Any] | None = None) -> Any:
    """A copy of one of `seeds` (a real document) with 1 to 4 edits: a value replaced by junk, a key
    deleted, a list element repeated up to 200 times, a value wrapped in a list or an object."""
    index = draw(st.integers(0, len(seeds) - 1))
    doc = copy.deepcopy(seeds[index])
    paths = _paths_of(index, seeds)
    junk = junk if junk is not None else junk_values()
    for _ in range(draw(st.integers(1, 4))):
        *parents, last = draw(st.sampled_from(paths))
        node = doc
        try:
            for step in parents:
                node = node[step]
            value = node[last]
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit took it away
        edit = draw(st.sampled_from(("replace", "replace", "replace", "delete", "repeat", "wrap")))
        if edit == "replace":
            node[last] = draw(junk)
        elif edit == "delete" and isinstance(node, dict):
            del node[last]
        elif edit == "repeat" and isinstance(node, list):
            node[last + 1:last + 1] = [copy.deepcopy(value) for _ in range(draw(st.integers(1, 200)))]
        elif edit == "wrap":
            node[last] = [value] if draw(st.booleans()) else {"value": value}
    return doc


_PATHS: dict[int, list[tuple[Any, ...]]] = {}


def _paths_of(index: int, seeds: list[Any]) -> list[tuple[Any, ...]]:
    key = id(seeds[index])
    if key not in _PATHS:
        _PATHS[key] = _paths(seeds[index])
    return _PATHS[key]


def dumps(doc: Any, indent: int | None = None) -> bytes:
    """`doc` as JSON text, big integers and NaN included (stdlib json; orjson refuses both)."""
    return json.dumps(doc, indent=indent).encode()


@st.composite
def json_file(draw: st.DrawFn, docs: st.SearchStrategy[Any]) -> bytes:
    """One drawn document as a file: compact, pretty-printed, as JSON Lines (a list, one element a
    line), with a byte order mark or CRLF line ends, gzip-compressed or not."""
    doc = draw(docs)
    form = draw(st.sampled_from(("compact", "pretty", "lines")))
    if form == "lines" and isinstance(doc, list):
        data = b"".join(dumps(item) + b"\n" for item in doc)
    else:
        data = dumps(doc, indent=2 if form == "pretty" else None)
    if draw(st.integers(0, 9)) == 0:
        data = b"\xef\xbb\xbf" + data
    if draw(st.integers(0, 9)) == 0:
        data = data.replace(b"\n", b"\r\n")
    return gzip.compress(data, mtime=0) if draw(st.integers(0, 3)) == 0 else data


@st.composite
def damaged_bytes(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    """One of `seeds` (real files' bytes) damaged 1 to 4 times (tests/fuzzing.py `damaged`), or
    damaged and then gzip-compressed (damage the gzip layer does not see)."""
    data = draw(st.sampled_from(seeds))
    rng = draw(st.randoms(use_true_random=False))
    if data[:2] != b"\x1f\x8b" and draw(st.integers(0, 4)) == 0:
        return gzip.compress(damaged(data, rng), mtime=0)
    return damaged(data, rng)


# --- the seeds: real documents of each format -----------------------------------------------------


@lru_cache(maxsize=None)
def otlp_documents() -> tuple[Any, ...]:
    """The OTLP JSON fixtures (real exporters' output, the tests' and the shared ones, each once), parsed."""
    contents = dict.fromkeys(p.read_bytes() for p in OTLP_FIXTURES)
    return tuple(orjson.loads(data) for data in contents)


@lru_cache(maxsize=None)
def capture_lines() -> tuple[Any, ...]:
    """Captures cut from the examples: the header and the first 40 lines of each, as lists of objects."""
    out = []
    for path in EXAMPLES[:4]:
        lines = gzip.decompress(path.read_bytes()).splitlines()
        out.append([orjson.loads(line) for line in lines[:40]])
    return tuple(out)


#: Request ids the writer escapes (a quote, a backslash, control characters) or writes as raw UTF-8.
ODD_REQUEST_IDS = ('say "hi"', "C:\\tmp\\x", "tab\there", "nl\nid", "\x01ctl", "caf\u00e9-\u00fc", "\u65e5\u672c-\U0001f600",
                   "\u2028sep", "plain-1", "plain-2", "a\\", 'q"')  # fmt: skip


def writer_line(doc: Any) -> bytes:
    """`doc` as the capture writer writes a line (orjson's compact form, raw UTF-8), or as close as
    JSON text can be when orjson refuses it (integers past 64 bits, NaN)."""
    try:
        return orjson.dumps(doc)
    except TypeError:
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")


@lru_cache(maxsize=None)
def odd_id_capture_lines() -> tuple[Any, ...]:
    """Small captures written by `latprof.capture.format.encode`, of requests whose ids the writer
    escapes or writes as raw UTF-8, some with segment lines of requests not in the capture."""
    from latprof.capture.format import encode, make_header
    from latprof.events import Gauge, Request, Segment

    out = []
    for variant in range(2):
        events: list[Any] = [make_header("run", pid=7, host="fuzz", wall_ns=T0_NS, monotonic_ns=1, ppid=1)]
        for n, rid in enumerate(ODD_REQUEST_IDS[variant::2] + ("in-flight \"x\"",)):
            t = T0_NS + n * 1_000_000
            if not rid.startswith("in-flight"):
                events.append(encode(Request(rid, "POST /chat", t, t + 900_000, 7, 10, 200)))
            events += [encode(Segment(rid, f"s{n}a", None, "sqlalchemy checkout", "db.pool", t + 10, t + 50, 7, {"db.client.connection.pool.name": "main"})),
                       encode(Segment(rid, f"s{n}b", f"s{n}a", "SELECT 1", "db.query", t + 50, t + 90, 7)),
                       encode(Gauge("db.pool.in_use", float(n), t + 60, 7))]  # fmt: skip
        out.append(events)
    return tuple(out)


def odd_id_capture_seeds() -> list[bytes]:
    """`odd_id_capture_lines` in the writer's bytes, plain and gzip-compressed, and a capture whose
    ids collide once escaped (`q"`'s line starts like the line of `q\\`)."""
    from latprof.capture.format import encode, make_header
    from latprof.events import Request, Segment

    files = [b"".join(writer_line(d) + b"\n" for d in lines) for lines in odd_id_capture_lines()]
    collide = [make_header("run", pid=7, host="fuzz", wall_ns=T0_NS, monotonic_ns=1, ppid=1)]
    for n, rid in enumerate(('q"', "q\\", "n\nx", "n\\nx")):
        collide += [encode(Request(rid, "GET /", T0_NS, T0_NS + 100, 7, None, 200)),
                    encode(Segment(rid, f"s{n}", None, "SELECT 1", "db.query", T0_NS + 10, T0_NS + 20, 7))]  # fmt: skip
    return [*files, gzip.compress(files[0], mtime=0), b"".join(writer_line(d) + b"\n" for d in collide)]


@st.composite
def two_pass_capture_file(draw: st.DrawFn) -> bytes:
    """A capture (an example's first lines, or an odd-id one), often with odd values put in, each line in
    the writer's form (what a cohort-first read defers) or, now and then, in another: stdlib
    JSON's spaced form, its keys in another order, a trailing CR or blank, a segment line moved
    before the header; gzip-compressed or not."""
    seeds = [*capture_lines(), *odd_id_capture_lines()]
    lines = draw(mutated(seeds) | st.sampled_from(seeds))  # unedited too: the full read of most edited ones fails
    rng = draw(st.randoms(use_true_random=False))
    odd = draw(st.sampled_from((0.0, 0.0, 0.05, 0.3)))  # how often a line is not in the writer's form
    out = []
    for doc in lines:
        line = writer_line(doc)
        if rng.random() < odd:
            form = rng.randrange(4)
            if form == 0:
                line = dumps(doc)
            elif form == 1 and isinstance(doc, dict):
                line = writer_line(dict(reversed(list(doc.items()))))
            else:
                line += b"\r" if form == 2 else b" "
        out.append(line)
    if odd and out and rng.random() < 0.2:
        at = rng.randrange(len(out))
        if out[at].startswith(b'{"type":"segment"'):
            out.insert(0, out.pop(at))
    data = b"".join(line + b"\n" for line in out)
    return gzip.compress(data, mtime=0) if draw(st.integers(0, 3)) == 0 else data


def _fixture_spans() -> list[Any]:
    from latprof.collectors.traces.otlp_json import read_otlp_json

    return [read_otlp_json(path).spans for path in OTLP_FIXTURES]


@lru_cache(maxsize=None)
def jaeger_documents() -> tuple[Any, ...]:
    """The OTLP fixtures' spans as the Jaeger query API returns them (OpenTelemetry's Jaeger mapping)."""
    kinds = {1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
    docs = []
    for spans in _fixture_spans():
        processes: dict[str, Any] = {}
        traces: dict[str, list[Any]] = {}
        for span in spans:
            pid = processes.setdefault(span.service, f"p{len(processes) + 1}")
            tags = [{"key": k, "type": "int64" if type(v) is int else "string", "value": v if type(v) is int else str(v)}
                    for k, v in span.attrs.items()]  # fmt: skip
            if span.kind in kinds:
                tags.append({"key": "span.kind", "type": "string", "value": kinds[span.kind]})
            if span.status_code == 2:
                tags.append({"key": "error", "type": "bool", "value": True})
            traces.setdefault(span.trace_id, []).append({
                "traceID": span.trace_id, "spanID": span.span_id, "operationName": span.name,
                "references": [{"refType": "CHILD_OF", "traceID": span.trace_id, "spanID": span.parent_id}] if span.parent_id else [],
                "startTime": span.start_ns // 1000, "duration": (span.end_ns - span.start_ns) // 1000, "tags": tags,
                "logs": [{"timestamp": e.ts_ns // 1000, "fields": [{"key": "event", "type": "string", "value": e.name}]} for e in span.events],
                "processID": pid,
            })  # fmt: skip
        process_table = {pid: {"serviceName": service, "tags": []} for service, pid in processes.items()}
        docs.append({"data": [{"traceID": trace_id, "spans": trace_spans, "processes": process_table}
                              for trace_id, trace_spans in traces.items()],
                     "total": 0, "limit": 0, "offset": 0, "errors": None})  # fmt: skip
    return tuple(docs)


@lru_cache(maxsize=None)
def zipkin_documents() -> tuple[Any, ...]:
    """The OTLP fixtures' spans as Zipkin v2 JSON (OpenTelemetry's Zipkin mapping)."""
    kinds = {2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
    docs = []
    for spans in _fixture_spans():
        out = []
        for span in spans:
            zspan: dict[str, Any] = {
                "traceId": span.trace_id, "id": span.span_id, "name": span.name,
                "timestamp": span.start_ns // 1000, "duration": max(1, (span.end_ns - span.start_ns) // 1000),
                "localEndpoint": {"serviceName": span.service},
                "tags": {k: str(v) for k, v in span.attrs.items()},
                "annotations": [{"timestamp": e.ts_ns // 1000, "value": e.name} for e in span.events],
            }  # fmt: skip
            if span.parent_id:
                zspan["parentId"] = span.parent_id
            if span.kind in kinds:
                zspan["kind"] = kinds[span.kind]
            if span.status_code == 2:
                zspan["tags"]["otel.status_code"] = "ERROR"
            out.append(zspan)
        docs.append(out)
    return tuple(docs)


# --- OTLP protobuf: messages with odd field values, and their framing --------------------------------


def _proto_from_json(doc: Any) -> Any:
    """An OTLP JSON document (hex ids) as the protobuf message it encodes (protobuf's JSON has base64 ids)."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    doc = copy.deepcopy(doc)
    for rs in doc["resourceSpans"]:
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for holder in [span, *span.get("links", [])]:
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if holder.get(key):
                            holder[key] = base64.b64encode(bytes.fromhex(holder[key])).decode()
    return json_format.ParseDict(doc, ExportTraceServiceRequest())


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | 0x80 if value else byte)
        if not value:
            return bytes(out)


def _proto_odd_bytes(width: int) -> st.SearchStrategy[bytes]:
    return st.one_of(st.binary(min_size=width, max_size=width), st.binary(max_size=width * 2), st.just(bytes(width)))


@st.composite
def otlp_proto_file(draw: st.DrawFn) -> bytes:
    """A binary ExportTraceServiceRequest built from a real fixture with odd field values put in
    (ids of any length or all zeros, times of 0 or past 2^63, unknown kinds and status codes,
    attributes nested deep), as one message or the Collector's length-prefixed stream (lengths
    sometimes lying), gzip-compressed or not."""
    msg = _proto_from_json(draw(st.sampled_from(otlp_documents())))
    spans = [sp for rs in msg.resource_spans for ss in rs.scope_spans for sp in ss.spans]
    for _ in range(draw(st.integers(1, 4))):
        sp = draw(st.sampled_from(spans))
        field = draw(st.sampled_from(("trace_id", "span_id", "parent_span_id", "start", "end", "kind", "status",
                                      "name", "attribute", "nested", "event", "link", "many")))  # fmt: skip
        if field in ("trace_id", "span_id", "parent_span_id"):
            setattr(sp, field, draw(_proto_odd_bytes(16 if field == "trace_id" else 8)))
        elif field in ("start", "end"):
            value = draw(st.sampled_from((0, 1, 2**63 - 1, 2**63, 2**64 - 1)))
            setattr(sp, f"{field}_time_unix_nano", value)
        elif field == "kind":
            sp.kind = draw(st.integers(-(2**31), 2**31 - 1))
        elif field == "status":
            sp.status.code = draw(st.integers(-(2**31), 2**31 - 1))
            sp.status.message = draw(st.text(max_size=20))
        elif field == "name":
            sp.name = draw(st.text(max_size=60))
        elif field == "attribute":
            kv = sp.attributes.add()
            kv.key = draw(st.text(max_size=20))
            which = draw(st.sampled_from(("string_value", "int_value", "double_value", "bool_value", "bytes_value", "none")))
            if which == "string_value":
                kv.value.string_value = draw(st.text(max_size=30))
            elif which == "int_value":
                kv.value.int_value = draw(st.integers(-(2**63), 2**63 - 1))
            elif which == "double_value":
                kv.value.double_value = draw(st.floats())
            elif which == "bool_value":
                kv.value.bool_value = draw(st.booleans())
            elif which == "bytes_value":
                kv.value.bytes_value = draw(st.binary(max_size=30))
        elif field == "nested":
            kv = sp.attributes.add()
            kv.key = "nested"
            value = kv.value
            for _ in range(draw(st.integers(1, 60))):
                value = value.array_value.values.add() if draw(st.booleans()) else value.kvlist_value.values.add().value
            value.string_value = "deep"
        elif field == "event":
            ev = sp.events.add()
            ev.time_unix_nano = draw(st.sampled_from((0, T0_NS, 2**64 - 1)))
            ev.name = draw(st.text(max_size=20))
        elif field == "link":
            link = sp.links.add()
            link.trace_id = draw(_proto_odd_bytes(16))
            link.span_id = draw(_proto_odd_bytes(8))
        else:
            ss_spans = msg.resource_spans[0].scope_spans[0].spans if msg.resource_spans[0].scope_spans else None
            if ss_spans is not None:
                for _ in range(draw(st.integers(1, 300))):
                    ss_spans.add().CopyFrom(sp)
    body = msg.SerializeToString()
    framing = draw(st.sampled_from(("single", "stream", "stream-lying")))
    if framing == "single":
        data = body
    else:
        # each record one resourceSpans (its field written by hand: a message nested past the
        # decoder's depth limit cannot be copied into a new request, only serialized)
        fields = [rs.SerializeToString() for rs in msg.resource_spans]
        parts = [b"\x0a" + _varint(len(f)) + f for f in fields] or [body]
        lengths = [len(p) for p in parts]
        if framing == "stream-lying":
            at = draw(st.integers(0, len(parts) - 1))
            lengths[at] = draw(st.sampled_from((0, 1, lengths[at] - 1, lengths[at] + 1, 2**31, 2**32 - 1)))
        data = b"".join(min(n, 2**32 - 1).to_bytes(4, "big") + p for n, p in zip(lengths, parts))
    return gzip.compress(data, mtime=0) if draw(st.integers(0, 3)) == 0 else data


def otlp_proto_seeds() -> list[bytes]:
    """The OTLP fixtures as binary requests and as a length-prefixed stream of them (real bytes to damage)."""
    bodies = [_proto_from_json(doc).SerializeToString() for doc in otlp_documents()]
    stream = b"".join(len(b).to_bytes(4, "big") + b for b in bodies)
    return [*bodies[:2], stream, gzip.compress(stream, mtime=0)]


# --- the [tool.latprof] config ------------------------------------------------------------------------

CONFIG_SEED: dict[str, Any] = {
    "skip_warmup_s": 2.0,
    "min_tail_excess_ms": 20.0,
    "budget": {
        "p99_ms": 2000, "p50_ms": 500, "ttft_p99_ms": 1200, "pool_wait_p99_ms": "+10%",
        "layers": {"db.pool": {"share": 0.10, "tail_ms": 100, "p99_ms": 80}},
        "routes": [{"route": "POST /chat", "p99_ms": 1500}],
    },
    "rules": {"db-pool-exhaustion": {"enabled": True, "severity": "warning", "min_share_of_tail_excess": 0.1}},
    "checks": [{
        "id": "search-tool-p99", "select": "segments",
        "where": {"layer": "tool", "name": "GET *search*", "attributes": {"server.address": "127.0.0.1"}},
        "stat": "p99", "op": "<=", "threshold": 300, "message": "search calls p99 {value:.0f} ms (budget {threshold:.0f} ms)",
    }],
}  # fmt: skip


def toml_junk() -> st.SearchStrategy[Any]:
    """Values TOML can hold (no null), odd ones first."""
    scalars = st.one_of(
        st.sampled_from([v for v in ODD_SCALARS if v is not None and (type(v) is not int or -(2**63) <= v < 2**63)]),
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        st.floats(),
        st.text(max_size=40).filter(lambda s: not any(0xD800 <= ord(c) <= 0xDFFF for c in s)),
        st.datetimes(),
    )
    return st.recursive(scalars, _nested, max_leaves=10)


def toml_value(value: Any) -> str:
    """`value` as an inline TOML value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON's escapes are TOML basic string escapes (\uXXXX, \n, \")
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return value.isoformat()  # a datetime


@st.composite
def config_file(draw: st.DrawFn) -> tuple[str, bytes]:
    """A config built from the documented example with odd values put in: (file name, its TOML)."""
    table = draw(mutated([CONFIG_SEED], toml_junk()))
    lines = [f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in table.items()] if isinstance(table, dict) else []
    if draw(st.booleans()):
        return "pyproject.toml", ("[project]\nname = \"x\"\n\n[tool.latprof]\n" + "\n".join(lines) + "\n").encode()
    return "latprof.toml", ("\n".join(lines) + "\n").encode()


def config_seeds() -> list[bytes]:
    """The documented example as pyproject.toml text (real bytes to damage)."""
    lines = [f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in CONFIG_SEED.items()]
    return [("[tool.latprof]\n" + "\n".join(lines) + "\n").encode()]


def targets() -> dict[str, tuple[Callable[[], st.SearchStrategy[Any]], Callable[[], list[bytes]], str]]:
    """Per reader: its structure-aware strategy (file bytes, or the config's (name, bytes)), the real files to damage, the case file's name."""
    return {
        "capture": (lambda: json_file(mutated(list(capture_lines()))),
                    lambda: [p.read_bytes() for p in EXAMPLES[:3]] + [gzip.decompress(EXAMPLES[0].read_bytes())[:20000]],
                    "case.jsonl"),
        "capture_two_pass": (two_pass_capture_file,
                             lambda: targets()["capture"][1]() + odd_id_capture_seeds(),
                             "case.jsonl"),
        "otlp_json": (lambda: json_file(mutated(list(otlp_documents()))),
                      lambda: [p.read_bytes() for p in OTLP_FIXTURES] + [gzip.compress(OTLP_FIXTURES[0].read_bytes(), mtime=0),
                                                                         b"".join(dumps(d) + b"\n" for d in otlp_documents())],
                      "case.json"),
        "otlp_proto": (otlp_proto_file, otlp_proto_seeds, "case.pb"),
        "jaeger_json": (lambda: json_file(mutated(list(jaeger_documents()))),
                        lambda: [dumps(d) for d in jaeger_documents()] + [dumps(jaeger_documents()[0], indent=2)],
                        "case.json"),
        "zipkin_json": (lambda: json_file(mutated(list(zipkin_documents()))),
                        lambda: [dumps(d) for d in zipkin_documents()] + [b"\n".join(dumps(d) for d in zipkin_documents())],
                        "case.json"),
        "config": (lambda: config_file(), config_seeds, "pyproject.toml"),
    }  # fmt: skip
