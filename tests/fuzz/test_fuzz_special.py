"""The inputs built to hurt a reader, one named test each: a gzip bomb, JSON nested 100k deep, a
span with a million attributes, protobuf claiming huge lengths, millions of blank lines; each read
in the fuzz sandbox (memory limit, time limit) and each ending in spans or one-line input error."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Iterator

import orjson
import pytest

from fuzzing import Sandbox

CAPTURE_HEADER = b'{"type":"header","schema":"latprof.capture/1","source":"run","pid":1}\n'
TRACE_READERS = ("capture", "otlp_json", "otlp_proto", "jaeger_json", "zipkin_json")


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    with Sandbox(tmp_path_factory.mktemp("special")) as box:
        yield box


@pytest.fixture()
def roomy_sandbox(tmp_path: Path) -> Iterator[Sandbox]:
    """A sandbox with the fuzz cases' memory limit but a minute a case: for files of tens of MB."""
    with Sandbox(tmp_path, case_seconds=60) as box:
        yield box


def _gzip_of_repeats(unit: bytes, total_bytes: int) -> bytes:
    """`unit` repeated to `total_bytes` as gzip: one member of 16 MiB, repeated (gzip readers read
    every member in turn), so that making a 1 GiB bomb takes a tenth of a second."""
    member = gzip.compress(unit * ((16 << 20) // len(unit)), compresslevel=9, mtime=0)
    return member * (total_bytes // (16 << 20))


@pytest.fixture(scope="module")
def bombs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    where = tmp_path_factory.mktemp("bombs")
    out = {}
    for name, head, unit in (("zeros", b"", b"\0"), ("newlines", CAPTURE_HEADER, b"\n"),
                             ("otlp", b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "', b"a")):  # fmt: skip
        path = where / f"{name}.json.gz"
        path.write_bytes(gzip.compress(head, mtime=0) + _gzip_of_repeats(unit, 1 << 30))  # 1 GiB in about 1 MB
        out[name] = path
    return out


@pytest.mark.parametrize("target", TRACE_READERS)
@pytest.mark.parametrize("bomb", ["zeros", "newlines", "otlp"])
def test_gzip_bomb_is_refused_in_bounded_memory_and_time(sandbox: Sandbox, bombs: dict[str, Path], target: str, bomb: str) -> None:
    assert bombs[bomb].stat().st_size < 2 << 20
    outcome = sandbox.read_path(target, bombs[bomb])
    assert outcome.kind == "error", outcome
    refused = f"{bombs[bomb]}: refused: its gzip stream decompresses to more than 100 times its size (a decompression bomb?)"
    if bomb == "newlines" and target == "otlp_json":  # its first line is a capture's header: not OTLP, said at once
        assert outcome.detail.startswith(f"{bombs[bomb]}: not OTLP JSON traces: "), outcome
    else:
        assert outcome.detail == refused, outcome
    assert outcome.seconds < 1.5, outcome  # refused after the first few MiB, not after the gigabyte


def test_a_capture_of_blank_lines_is_read_in_linear_time(sandbox: Sandbox) -> None:
    # a failed parse per blank line cost 3 us: 2 MB of newlines took 6 s before they were skipped in runs
    for blank in (b"\n", b"  \n", b"\r\n"):
        data = CAPTURE_HEADER + blank * 2_000_000 + b'{"type":"request"}\n' + blank * 1000
        outcome = sandbox.read("capture", data, "blank.jsonl")
        assert outcome.kind == "error" and outcome.seconds < 1.0, outcome
        assert "no events" in outcome.detail


def test_otlp_json_lines_with_blank_lines_are_read_in_linear_time(sandbox: Sandbox) -> None:
    line = orjson.dumps(_otlp_doc([_otlp_span(1)])) + b"\n"
    outcome = sandbox.read("otlp_json", line + b"\n" * 3_000_000 + line, "blank.json")
    assert outcome.kind == "read" and outcome.seconds < 1.0, outcome


def _otlp_span(n: int, attributes: list[Any] | None = None) -> dict[str, Any]:
    return {"traceId": "1" * 32, "spanId": f"{n:016x}", "name": "GET /x", "kind": 2, "startTimeUnixNano": "1796006086000000000",
            "endTimeUnixNano": "1796006087000000000", "attributes": attributes or []}  # fmt: skip


def _otlp_doc(spans: list[Any]) -> dict[str, Any]:
    return {"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"scope": {"name": "s"}, "spans": spans}]}]}


@pytest.mark.parametrize("target", ["otlp_json", "jaeger_json", "zipkin_json", "capture"])
@pytest.mark.parametrize("opener", ["[", '{"a":', '{"resourceSpans":['])
def test_json_nested_100k_deep_is_an_input_error(sandbox: Sandbox, target: str, opener: str) -> None:
    depth = 100_000
    data = (opener * depth + "1" + ("]" if opener == "[" else "}" if opener == '{"a":' else "]}") * depth).encode()
    outcome = sandbox.read(target, data, "deep.json")
    assert outcome.kind == "error", outcome


def test_attribute_values_nested_as_deep_as_json_allows_are_dropped_or_read(sandbox: Sandbox) -> None:
    value: dict[str, Any] = {"stringValue": "x"}
    for _ in range(300):  # 3 JSON levels each: near orjson's 1024
        value = {"arrayValue": {"values": [value]}}
    doc = _otlp_doc([_otlp_span(1, [{"key": "deep", "value": value}])])
    outcome = sandbox.read("otlp_json", json.dumps(doc).encode(), "deep.json")
    assert outcome.kind == "read", outcome


@pytest.mark.slow
@pytest.mark.long
def test_span_with_a_million_attributes(roomy_sandbox: Sandbox) -> None:
    # A 50 MB file: read in linear time (about 1 us an attribute on a quiet machine) and in the
    # sandbox's memory, with the time limit raised from the fuzz cases' 2 s to what the size needs.
    sandbox = roomy_sandbox
    attributes = [{"key": f"k{i}", "value": {"stringValue": "v"}} for i in range(1_000_000)]
    data = orjson.dumps(_otlp_doc([_otlp_span(1, attributes), _otlp_span(2)]))
    outcome = sandbox.read("otlp_json", data, "wide.json")
    assert outcome.kind == "read" and outcome.detail.startswith("2 spans"), outcome

    jaeger = {"data": [{"traceID": "1" * 32, "processes": {"p1": {"serviceName": "svc"}}, "spans": [{
        "traceID": "1" * 32, "spanID": "1" * 16, "operationName": "op", "startTime": 1796006086000000, "duration": 5,
        "processID": "p1", "tags": [{"key": f"k{i}", "type": "string", "value": "v"} for i in range(1_000_000)]}]}]}  # fmt: skip
    outcome = sandbox.read("jaeger_json", orjson.dumps(jaeger), "wide.json")
    assert outcome.kind == "read", outcome

    zipkin = [{"traceId": "1" * 32, "id": "1" * 16, "name": "op", "timestamp": 1796006086000000, "duration": 5,
               "localEndpoint": {"serviceName": "svc"}, "tags": {f"k{i}": "v" for i in range(1_000_000)}}]  # fmt: skip
    outcome = sandbox.read("zipkin_json", orjson.dumps(zipkin), "wide.json")
    assert outcome.kind == "read", outcome


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | 0x80 if value else byte)
        if not value:
            return bytes(out)


def _real_request() -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    msg = ExportTraceServiceRequest()
    span = msg.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = b"\x01" * 16, b"\x02" * 8, "GET /x"
    span.start_time_unix_nano, span.end_time_unix_nano = 1796006086000000000, 1796006087000000000
    return bytes(msg.SerializeToString())


@pytest.mark.parametrize("claimed", [2**31, 2**32 - 1, 2**62, 2**64 - 1])
def test_protobuf_claiming_huge_lengths(sandbox: Sandbox, claimed: int) -> None:
    body = _real_request()
    cases = {
        # a resourceSpans field claiming more bytes than the file holds, after a real one
        "field": body + b"\x0a" + _varint(claimed) + b"\x12\x00",
        # the Collector's stream: a second record claiming up to 4 GiB
        "record": len(body).to_bytes(4, "big") + body + min(claimed, 2**32 - 1).to_bytes(4, "big") + body,
        # a span's attribute list claiming a huge length inside a real request
        "inner": body[:-2] + b"\x4a" + _varint(claimed) + b"\x0a\x01k",
        # a varint that never ends
        "varint": body + b"\x0a" + b"\xff" * 64,
    }
    for name, data in cases.items():
        for packed in (data, gzip.compress(data, mtime=0)):
            outcome = sandbox.read("otlp_proto", packed, f"{name}.pb")
            assert not outcome.failed and outcome.seconds < 1.0, (name, outcome)


@pytest.mark.parametrize(
    ("target", "doc"),
    [
        ("zipkin_json", [{"\n": 1, "b": 2}]),
        ("zipkin_json", {"a\r\nb": 1}),
        ("jaeger_json", {"x\ny": 1}),
        ("jaeger_json", [{"\u2028": 1}]),
        ("otlp_json", {"resourceSpans\n": [], "k" * 200: 1}),
    ],
)  # fmt: skip
def test_keys_with_line_breaks_stay_on_one_line(sandbox: Sandbox, target: str, doc: Any) -> None:
    # found by the Zipkin fuzz run: "not Zipkin JSON spans: ... its keys: \n)" was two lines
    outcome = sandbox.read(target, json.dumps(doc).encode(), "keys.json")
    assert outcome.kind == "error" and "its keys: " in outcome.detail, outcome
    assert "\n" not in outcome.detail and "\r" not in outcome.detail and "\u2028" not in outcome.detail
    assert len(outcome.detail) < 400
