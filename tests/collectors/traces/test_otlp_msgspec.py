"""msgspec's reading of OTLP JSON lines (`latprof.collectors.traces.otlp_msgspec`) against the
general way (orjson, then `_Reader._take`): the same spans, warnings and counts, or the same
InputError, for generated and real files and for lines written otherwise."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from typing import Any, Callable

import orjson
import pytest
from fuzzing import damaged, mutations

from latprof.collectors.traces import otlp_json
from latprof.collectors.traces.otlp_json import read_otlp_json
from latprof.errors import InputError

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "otlp"
T0 = 1_764_000_000_000_000_000
MS = 1_000_000
TRACE = "0af7651916cd43dd8448eb211c80319c"
ROOT_ID = "b7ad6b7169203331"
CHILD_ID = "00f067aa0ba902b7"


def _span(span_id: str, parent: str | None, name: str, kind: int, start: int, end: int, attrs: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"traceId": TRACE, "spanId": span_id}
    if parent is not None:
        out["parentSpanId"] = parent
    out.update(flags=257, name=name, kind=kind, startTimeUnixNano=str(start), endTimeUnixNano=str(end), attributes=attrs,
               status={})  # fmt: skip
    return out


#: A request in the plain shape, with an attribute value of each plain kind.
BASE: dict[str, Any] = {"resourceSpans": [{
    "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "chat-api"}},
                                {"key": "n", "value": {"intValue": "3"}}]},
    "scopeSpans": [{"scope": {"name": "opentelemetry.instrumentation.fastapi", "version": "0.48b0"}, "spans": [
        _span(ROOT_ID, None, "POST /chat", 2, T0, T0 + 10 * MS, [
            {"key": "http.route", "value": {"stringValue": "/chat"}},
            {"key": "http.response.status_code", "value": {"intValue": "200"}},
            {"key": "ok", "value": {"boolValue": True}},
            {"key": "ratio", "value": {"doubleValue": 0.5}},
            {"key": "blob", "value": {"bytesValue": "AAE="}},
        ]),
        {**_span(CHILD_ID, ROOT_ID, "SELECT users", 3, T0 + 2 * MS, T0 + 6 * MS, [
            {"key": "db.system.name", "value": {"stringValue": "postgresql"}},
            {"key": "server.port", "value": {"intValue": 5432}},
            {"key": "args", "value": {"arrayValue": {"values": [{"stringValue": "-v"}, {"kvlistValue": {"values": [
                {"key": "k", "value": {"doubleValue": 2}}]}}]}}},
        ]), "events": [{"timeUnixNano": str(T0 + 3 * MS), "name": "first", "attributes": [
            {"key": "n", "value": {"intValue": "1"}}]}, {"timeUnixNano": T0 + 4 * MS, "name": "second"}],
            "droppedEventsCount": 2, "links": [{"traceId": TRACE, "spanId": ROOT_ID, "traceState": "a=b"}]},
    ]}],
    "schemaUrl": "https://opentelemetry.io/schemas/1.11.0",
}]}  # fmt: skip
GOOD = orjson.dumps(BASE)
#: The plain line, with one text replaced by another (each must occur in it).
EDITS: dict[str, tuple[bytes, bytes]] = {
    "snake-case-key": (b'"traceId"', b'"trace_id"'),
    "snake-case-top": (b'"resourceSpans"', b'"resource_spans"'),
    "pre-1.0-scope-spans": (b'"scopeSpans"', b'"instrumentationLibrarySpans"'),
    "unknown-key": (b'"flags":257', b'"flags":257,"x":1'),
    "unknown-key-not-utf8": (b'"flags":257', b'"flags":257,"x":"\xff"'),
    "unknown-key-number-out-of-range": (b'"flags":257', b'"flags":257,"x":1e400'),
    "unknown-key-at-the-top": (b'{"resourceSpans"', b'{"x":[1e400],"resourceSpans"'),
    "trace-id-uppercase": (TRACE.encode(), TRACE.upper().encode()),
    "trace-id-base64": (TRACE.encode(), b"CvdlGRbNQ92ESOshHIAxnA=="),
    "trace-id-zero": (TRACE.encode(), b"0" * 32),
    "trace-id-short": (TRACE.encode(), TRACE[:31].encode()),
    "trace-id-not-ascii": (TRACE.encode(), ("\u00e9" + TRACE[1:]).encode()),
    "span-id-zero": (b'"spanId":"' + ROOT_ID.encode(), b'"spanId":"' + b"0" * 16),
    "parent-id-zero": (b'"parentSpanId":"' + ROOT_ID.encode(), b'"parentSpanId":"' + b"0" * 16),
    "parent-id-empty": (b'"parentSpanId":"' + ROOT_ID.encode() + b'"', b'"parentSpanId":""'),
    "parent-id-null": (b'"parentSpanId":"' + ROOT_ID.encode() + b'"', b'"parentSpanId":null'),
    "parent-id-uppercase": (b'"parentSpanId":"' + ROOT_ID.encode(), b'"parentSpanId":"' + ROOT_ID.upper().encode()),
    "times-as-numbers": (f'"startTimeUnixNano":"{T0}"'.encode(), f'"startTimeUnixNano":{T0}'.encode()),
    "time-a-float": (f'"startTimeUnixNano":"{T0}"'.encode(), b'"startTimeUnixNano":1.764e18'),
    "time-spaced-string": (f'"startTimeUnixNano":"{T0}"'.encode(), f'"startTimeUnixNano":" {T0} "'.encode()),
    "time-underscored": (f'"startTimeUnixNano":"{T0}"'.encode(), f'"startTimeUnixNano":"{T0 // 1000}_000"'.encode()),
    "time-zero": (f'"startTimeUnixNano":"{T0}"'.encode(), b'"startTimeUnixNano":"0"'),
    "time-negative": (f'"startTimeUnixNano":"{T0}"'.encode(), b'"startTimeUnixNano":-5'),
    "time-past-64-bits": (f'"startTimeUnixNano":"{T0}"'.encode(), b'"startTimeUnixNano":18446744073709551616'),
    "end-before-start": (f'"endTimeUnixNano":"{T0 + 10 * MS}"'.encode(), f'"endTimeUnixNano":"{T0 - 1}"'.encode()),
    "time-not-a-number": (f'"startTimeUnixNano":"{T0}"'.encode(), b'"startTimeUnixNano":"soon"'),
    "kind-a-name": (b'"kind":2', b'"kind":"SPAN_KIND_SERVER"'),
    "kind-unknown": (b'"kind":2', b'"kind":9'),
    "kind-true": (b'"kind":2', b'"kind":true'),
    "kind-a-float": (b'"kind":2', b'"kind":2.0'),
    "status-code-name": (b'"status":{}', b'"status":{"code":"STATUS_CODE_ERROR"}'),
    "status-code-error": (b'"status":{}', b'"status":{"code":2,"message":"boom"}'),
    "status-code-unknown": (b'"status":{}', b'"status":{"code":7}'),
    "status-null": (b'"status":{}', b'"status":null'),
    "status-a-list": (b'"status":{}', b'"status":[]'),
    "name-a-number": (b'"name":"POST /chat"', b'"name":5'),
    "name-null": (b'"name":"POST /chat"', b'"name":null'),
    "name-absent": (b'"name":"POST /chat",', b""),
    "attributes-null": (b'"attributes":[{"key":"db', b'"attributes":null,"x":[{"key":"db'),
    "attributes-empty": (b'"attributes":[{"key":"db.system.name","value":{"stringValue":"postgresql"}},', b'"attributes":[],"a":['),
    "attribute-key-a-number": (b'{"key":"http.route"', b'{"key":7'),
    "attribute-no-value": (b'{"key":"ok","value":{"boolValue":true}}', b'{"key":"ok"}'),
    "int-value-not-a-number": (b'{"intValue":"200"}', b'{"intValue":"abc"}'),
    "int-value-a-float": (b'{"intValue":"200"}', b'{"intValue":1.5}'),
    "int-value-past-64-bits": (b'{"intValue":"200"}', b'{"intValue":18446744073709551616}'),
    "string-value-null": (b'{"stringValue":"/chat"}', b'{"stringValue":null}'),
    "string-value-a-number": (b'{"stringValue":"/chat"}', b'{"stringValue":5}'),
    "string-and-int-value": (b'{"stringValue":"/chat"}', b'{"stringValue":"/chat","intValue":"4"}'),
    "int-and-string-value": (b'{"stringValue":"/chat"}', b'{"intValue":"4","stringValue":"/chat"}'),
    "null-string-then-int": (b'{"stringValue":"/chat"}', b'{"stringValue":null,"intValue":"4"}'),
    "resource-string-and-int": (b'{"stringValue":"chat-api"}', b'{"intValue":"4","stringValue":"chat-api"}'),
    "service-name-an-int": (b'{"stringValue":"chat-api"}', b'{"intValue":"4"}'),
    "empty-value": (b'{"stringValue":"/chat"}', b"{}"),
    "unknown-value-member": (b'{"stringValue":"/chat"}', b'{"futureValue":1,"stringValue":"/chat"}'),
    "unknown-value-member-not-utf8": (b'{"stringValue":"/chat"}', b'{"futureValue":"\xff","stringValue":"/chat"}'),
    "int-and-string-value-on-a-span-with-events": (b'{"stringValue":"postgresql"}', b'{"intValue":"4","stringValue":"postgresql"}'),
    "array-value": (b'{"stringValue":"/chat"}', b'{"arrayValue":{"values":[{"stringValue":"a"},{"intValue":"2"}]}}'),
    "array-value-not-utf8": (b'{"stringValue":"/chat"}', b'{"arrayValue":{"values":[{"stringValue":"\xff"}]}}'),
    "kvlist-value": (b'{"stringValue":"/chat"}', b'{"kvlistValue":{"values":[{"key":"a","value":{"boolValue":false}}]}}'),
    "double-value-an-int": (b'{"doubleValue":0.5}', b'{"doubleValue":5}'),
    "double-value-nan-text": (b'{"doubleValue":0.5}', b'{"doubleValue":"NaN"}'),
    "double-value-out-of-range": (b'{"doubleValue":0.5}', b'{"doubleValue":1e400}'),
    "bool-value-text": (b'{"boolValue":true}', b'{"boolValue":"true"}'),
    "events": (b'"status":{}', b'"status":{},"events":[{"timeUnixNano":"1764000000001000000","name":"e"}]'),
    "events-not-utf8": (b'"status":{}', b'"status":{},"events":[{"name":"\xff"}]'),
    "events-empty": (b'"status":{}', b'"status":{},"events":[],"links":[]'),
    "links": (b'"status":{}', b'"status":{},"links":[{"traceId":"' + TRACE.encode() + b'","spanId":"' + CHILD_ID.encode() + b'"}]'),
    "event-time-absent": (b'{"timeUnixNano":"' + str(T0 + 3 * MS).encode() + b'",', b'{'),
    "event-time-zero": (str(T0 + 3 * MS).encode(), b"0"),
    "event-time-not-a-number": (str(T0 + 3 * MS).encode(), b"soon"),
    "event-name-null": (b'"name":"first"', b'"name":null'),
    "event-attribute-unreadable": (b'{"key":"n","value":{"intValue":"1"}}', b'{"key":"n","value":{}}'),
    "event-not-an-object": (b'"events":[', b'"events":[5,'),
    "events-null": (b'"events":[', b'"events":null,"x":['),
    "dropped-events-negative": (b'"droppedEventsCount":2', b'"droppedEventsCount":-2'),
    "dropped-events-zero": (b'"droppedEventsCount":2', b'"droppedEventsCount":0'),
    "dropped-events-true": (b'"droppedEventsCount":2', b'"droppedEventsCount":true'),
    "link-uppercase": (b'"spanId":"' + ROOT_ID.encode() + b'","traceState"', b'"spanId":"' + ROOT_ID.upper().encode() + b'","traceState"'),
    "link-zero": (b'"spanId":"' + ROOT_ID.encode() + b'","traceState"', b'"spanId":"' + b"0" * 16 + b'","traceState"'),
    "link-no-span-id": (b'"spanId":"' + ROOT_ID.encode() + b'","traceState"', b'"traceState"'),
    "link-snake-case": (b'"spanId":"' + ROOT_ID.encode() + b'","traceState"', b'"span_id":"' + ROOT_ID.encode() + b'","traceState"'),
    "link-attribute-unreadable": (b'"traceState":"a=b"', b'"traceState":"a=b","attributes":[{"key":"a","value":{}}]'),
    "array-item-unreadable": (b'{"stringValue":"-v"}', b'{"stringValue":null}'),
    "array-values-null": (b'"arrayValue":{"values":[', b'"arrayValue":{"values":null,"x":['),
    "kvlist-key-a-number": (b'{"key":"k","value":{"doubleValue":2', b'{"key":1,"value":{"doubleValue":2'),
    "dropped-counts": (b'"status":{}', b'"status":{},"droppedAttributesCount":1,"droppedEventsCount":2,"droppedLinksCount":3'),
    "dropped-count-a-string": (b'"status":{}', b'"status":{},"droppedEventsCount":"2"'),
    "scope-null": (b'"scope":{"name":"opentelemetry.instrumentation.fastapi","version":"0.48b0"}', b'"scope":null'),
    "scope-name-null": (b'"name":"opentelemetry.instrumentation.fastapi"', b'"name":null'),
    "scope-name-empty": (b'"name":"opentelemetry.instrumentation.fastapi"', b'"name":""'),
    "scope-attributes": (b'"version":"0.48b0"', b'"version":"0.48b0","attributes":[{"key":"a","value":{"intValue":"1"}}]'),
    "scope-attribute-unreadable": (b'"version":"0.48b0"', b'"version":"0.48b0","attributes":[{"key":"a","value":{}}]'),
    "resource-null": (b'"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"chat-api"}},'
                      b'{"key":"n","value":{"intValue":"3"}}]}', b'"resource":null'),
    "resource-dropped-count": (b'"resource":{', b'"resource":{"droppedAttributesCount":0,'),
    "resource-entity-refs": (b'"resource":{', b'"resource":{"entityRefs":[],'),
    "resource-spans-null": (b'"resourceSpans":[', b'"resourceSpans":null,"x":['),
    "spans-null": (b'"spans":[', b'"spans":null,"x":['),
    "duplicate-key": (b'"name":"POST /chat"', b'"name":"first","name":"POST /chat"'),
    "duplicate-resource-spans": (b'{"resourceSpans"', b'{"resourceSpans":[],"resourceSpans"'),
    "lone-surrogate": (b'"name":"POST /chat"', b'"name":"\\ud800"'),
    "escaped-text": (b'"name":"POST /chat"', b'"name":"\\u00e9\\n\\ud83d\\ude00"'),
    "nan-literal": (b'{"doubleValue":0.5}', b'{"doubleValue":NaN}'),
    "trailing-comma": (b'"status":{}', b'"status":{},'),
    "control-character": (b'"name":"POST /chat"', b'"name":"POST\x01/chat"'),
}
#: Whole lines written otherwise.
LINES: dict[str, bytes] = {
    "empty-object": b"{}",
    "empty-line": b"",
    "blank-line": b"  \t",
    "wrapped-result": b'{"result":' + GOOD + b"}",
    "array-of-requests": b"[" + GOOD + b"," + GOOD + b"]",
    "top-level-string": b'"resourceSpans"',
    "top-level-null": b"null",
    "no-resource-spans": b'{"resourceMetrics":[]}',
    "torn": GOOD[: len(GOOD) // 2],
    "deep-nesting": b'{"resourceSpans":' + b"[" * 5000 + b"]" * 5000 + b"}",
    "deep-nesting-unknown-key": b'{"x":' + b"[" * 100_000 + b"]" * 100_000 + b',"resourceSpans":[]}',
    "byte-order-mark": b"\xef\xbb\xbf" + GOOD,
    "crlf": GOOD + b"\r",
    "trailing-junk": GOOD + b" x",
    "two-documents": GOOD + b" " + GOOD,
    "no-spans": b'{"resourceSpans":[{"resource":{},"scopeSpans":[{"scope":{},"spans":[]}]}]}',
    "empty-resource-spans": b'{"resourceSpans":[]}',
    "zeros-across-ids": GOOD.replace(TRACE.encode(), TRACE[:24].encode() + b"00000000").replace(
        ROOT_ID.encode(), b"00000000" + ROOT_ID[8:].encode()),
}  # fmt: skip


#: A place in the plain line at each level of the request (each object type), for an unknown key.
LEVELS: dict[str, bytes] = {
    "request": b'{"resourceSpans"',
    "resource-spans": b'{"resource":',
    "resource": b'"resource":{',
    "scope-spans": b'{"scope":',
    "scope": b'"scope":{',
    "span": b'{"traceId"',
    "status": b'"status":{',
    "key-value": b'{"key":"http.route"',
    "any-value": b'"value":{',
    "array-value": b'"arrayValue":{',
    "kvlist-value": b'"kvlistValue":{',
    "kvlist-key-value": b'{"key":"k"',
    "event": b'{"timeUnixNano"',
    "link": b'"links":[{',
}


def _odd_lines() -> dict[str, bytes]:
    out = dict(LINES)
    for level, at in LEVELS.items():  # its value skipped unchecked by msgspec, refused by orjson
        assert at in GOOD, level
        head, rest = GOOD.split(at, 1)
        if at.endswith(b"{"):  # the key first in the object
            line = head + at + b'"x":"\xff"' + (b"" if rest.startswith(b"}") else b",") + rest
        else:  # the key before `at`'s key
            line = head + at[:1] + b'"x":"\xff",' + at[1:] + rest
        out[f"unknown-key-not-utf8-in-{level}"] = line
    for name, (old, new) in EDITS.items():
        assert old in GOOD, name
        out[name] = GOOD.replace(old, new, 1)
    return out


ODD = _odd_lines()


def outcome(path: Path) -> tuple[Any, ...]:
    """All a read of `path` gives: the spans (in a form where 1, 1.0 and True differ), warnings and
    counts, or the InputError's message."""
    try:
        read = read_otlp_json(path)
    except InputError as exc:
        return ("error", str(exc))
    return ("read", repr(read.spans), [type(v) for s in read.spans for v in (*s, *s.attrs.values())], read.warnings,
            read.documents)  # fmt: skip


def both_ways(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[tuple[Any, ...], tuple[Any, ...], int]:
    """The outcome of reading `path` with msgspec's lines and without, and how many lines msgspec read."""
    taken = 0
    line_reader = otlp_json.line_reader

    def counting(reader: Any) -> Callable[[bytes], bool]:
        read_line = line_reader(reader)

        def counted(line: bytes) -> bool:
            nonlocal taken
            took = read_line(line)
            taken += took
            return took

        return counted

    with monkeypatch.context() as patch:
        patch.setattr(otlp_json, "line_reader", counting)
        fast = outcome(path)
    with monkeypatch.context() as patch:
        patch.setattr(otlp_json, "MSGSPEC_LINES", False)
        general = outcome(path)
    return fast, general, taken


def _generate(path: Path, spans: int, seed: int) -> None:
    spec = importlib.util.spec_from_file_location("gen_otlp", ROOT / "benchmarks" / "gen_otlp.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    lines = gen.generate(path, spans=spans, batch_spans=50, seed=seed)
    assert lines > 3


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_generated_files_are_read_the_fast_way_as_the_general_way_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    path = tmp_path / "gen.json"
    _generate(path, spans=600, seed=seed)
    fast, general, taken = both_ways(path, monkeypatch)
    assert fast == general
    assert taken == len(path.read_bytes().splitlines()) - 1  # every line but the first went the fast way


def test_spans_with_the_same_attributes_share_one_dict(tmp_path: Path) -> None:
    """A span's attributes are made once per distinct text in a file: a million spans of a few kinds hold a few
    thousand dicts, not a million (the reader's memory, docs/performance.md)."""
    generated = tmp_path / "gen.json"
    _generate(generated, spans=600, seed=3)
    path = tmp_path / "lines.json"
    path.write_bytes(GOOD + b"\n" + generated.read_bytes())  # every generated line after the first: read the fast way
    spans = [s for s in read_otlp_json(path).spans if s.trace_id != TRACE]
    assert len(spans) == 600
    distinct_texts = {orjson.dumps(list(s.attrs.items())) for s in spans}  # (equal dicts are equal texts in these files)
    assert len({id(s.attrs) for s in spans}) == len(distinct_texts) < 300


@pytest.mark.parametrize("fixture", sorted(FIXTURES.glob("*.otlp.json")), ids=lambda p: p.name)
def test_real_files_as_lines_are_read_the_fast_way_as_the_general_way_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fixture: Path
) -> None:
    """The fixtures are one pretty-printed document each: as is, and as lines (the first line is read the general way)."""
    fast, general, _ = both_ways(fixture, monkeypatch)
    assert fast == general
    line = orjson.dumps(orjson.loads(fixture.read_bytes()))
    path = tmp_path / "lines.json"
    path.write_bytes(line + b"\n" + line + b"\n" + line + b"\n")
    fast, general, taken = both_ways(path, monkeypatch)
    assert fast == general and fast[0] == "read"
    assert taken == 2


@pytest.mark.parametrize("name", sorted(ODD))
@pytest.mark.parametrize("where", ["last", "middle"])
def test_a_line_written_otherwise_is_read_or_refused_as_the_general_way_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, where: str
) -> None:
    path = tmp_path / "odd.json"
    path.write_bytes(GOOD + b"\n" + ODD[name] + (b"\n" + GOOD if where == "middle" else b"") + b"\n")
    fast, general, _ = both_ways(path, monkeypatch)
    assert fast == general, name


def test_the_plain_line_goes_the_fast_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """So the lines above that differ from it by one edit test the fast way's refusals, not only the general way."""
    path = tmp_path / "good.json"
    path.write_bytes(GOOD + b"\n" + GOOD + b"\n" + ODD["escaped-text"] + b"\n" + ODD["times-as-numbers"] + b"\n")
    fast, general, taken = both_ways(path, monkeypatch)
    assert fast == general and taken == 3


def test_junk_anywhere_in_a_line_is_read_or_refused_as_the_general_way_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    junk = [None, 0, -1, 7, 2.5, 1e29, 2**63, 2**64 - 1, True, False, "", "x", " 5", "1_0", "NaN", "0" * 16, "A" * 32,
            TRACE.upper(), "t61rcWkgMzE=", "AAAAAAAAAAA=", "SPAN_KIND_CLIENT", "STATUS_CODE_ERROR", [], [1], {}, {"a": 1},
            {"stringValue": "s"}, {"intValue": "12"}, {"doubleValue": 1}, "1764000000000000000"]  # fmt: skip
    rng = random.Random(5)
    taken_total = 0
    for i, doc in enumerate(mutations(BASE, rng, 300, junk)):
        path = tmp_path / f"m{i}.json"
        path.write_bytes(GOOD + b"\n" + orjson.dumps(doc) + b"\n" + GOOD + b"\n")
        fast, general, taken = both_ways(path, monkeypatch)
        assert fast == general, doc
        taken_total += taken
    assert 300 < taken_total < 600  # both ways were taken by the mutated lines


def test_a_damaged_line_is_read_or_refused_as_the_general_way_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bytes changed, cut out or inserted: msgspec must refuse whatever orjson refuses (a byte that is not
    UTF-8, a number out of range), or the line would be read where the general way says it is damaged."""
    rng = random.Random(9)
    outcomes = set()
    for i in range(300):
        path = tmp_path / f"d{i}.json"
        line = damaged(GOOD, rng).replace(b"\n", b" ")
        path.write_bytes(GOOD + b"\n" + line + b"\n" + (GOOD + b"\n" if i % 2 else b""))
        fast, general, taken = both_ways(path, monkeypatch)
        assert fast == general, line
        outcomes.add((fast[0], taken))
    assert {("read", 1), ("read", 0), ("error", 0)} <= outcomes  # read fast, read the general way, refused


def _nested(depth: int, kvlist: bool) -> bytes:
    value = b'{"stringValue":"x"}'
    for _ in range(depth):
        value = b'{"kvlistValue":{"values":[{"key":"k","value":' + value + b"}]}}" if kvlist else (
            b'{"arrayValue":{"values":[' + value + b"]}}")
    return value


@pytest.mark.parametrize("depth", [150, 250, 256, 330, 342, 400])
@pytest.mark.parametrize("where", ['{"stringValue":"/chat"}', '"version":"0.48b0"', '"traceState":"a=b"'])
@pytest.mark.parametrize("kvlist", [False, True])
def test_values_nested_deep_are_read_or_refused_as_the_general_way_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, depth: int, where: str, kvlist: bool
) -> None:
    """msgspec nests as deep as Python's recursion limit lets it, orjson 1024 levels: with the limit
    raised, a line orjson refuses must not be read the fast way."""
    nested = _nested(depth, kvlist)
    if where.startswith("{"):
        line = GOOD.replace(where.encode(), nested, 1)
    else:
        line = GOOD.replace(where.encode(), where.encode() + b',"attributes":[{"key":"deep","value":' + nested + b"}]", 1)
    path = tmp_path / "deep.json"
    path.write_bytes(GOOD + b"\n" + line + b"\n")
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)
    try:
        fast, general, taken = both_ways(path, monkeypatch)
    finally:
        sys.setrecursionlimit(limit)
    assert fast == general
    assert taken == (depth <= 200)
