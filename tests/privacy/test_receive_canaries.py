"""Privacy canaries through `latprof receive`: OTLP spans whose content attributes carry canaries.

Stock instrumentations export what latprof must not keep: prompts and completions
(`gen_ai.prompt`, `gen_ai.input.messages`, OpenInference's `input.value`, the chunk events'
content), tool arguments and results, SQL parameters (`db.query.parameter.*`), headers
(`http.request.header.*`), query strings in URLs, exception messages and stack traces, the
process's command line (`process.command_args`). They are sent to a real `latprof receive`
(protobuf and OTLP JSON, gzip and not) and then searched for in its trace file, its report, and
every report format of `latprof analyze` of that file. A statement's text (`db.statement`) and
a URL's path are kept in the trace file (the analysis reads them) but never reach a report.
"""

from __future__ import annotations

import base64
import gzip
import json
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from latprof.collectors.traces.otlp_json import read_otlp_json
from latprof.report.renderers import REPORT

pytestmark = [pytest.mark.slow, pytest.mark.long]  # a `latprof receive` process and three analyses, about 10 s

ROOT = Path(__file__).resolve().parents[2]
MS = 1_000_000
#: Attributes (span, event or resource) that must not reach the trace file: purpose -> key.
DROPPED = {
    "prompt": "gen_ai.prompt.0.content", "completion": "gen_ai.completion.0.content",
    "input_messages": "gen_ai.input.messages", "output_messages": "gen_ai.output.messages",
    "input_value": "input.value", "output_value": "output.value",
    "tool_arguments": "gen_ai.tool.call.arguments", "tool_result": "gen_ai.tool.call.result",
    "db_parameter": "db.query.parameter.0", "request_header": "http.request.header.authorization",
    "response_header": "http.response.header.set-cookie", "url_query": "url.query",
    "exception_message": "exception.message", "exception_stacktrace": "exception.stacktrace",
    "command_args": "process.command_args", "command_line": "process.command_line",
    "event_content": "gen_ai.completion",
}  # fmt: skip
#: In values latprof reads but never reports: the query string of a URL, a statement's literal.
IN_VALUES = ("url_full_query", "http_url_query", "statement_literal")


def canaries() -> dict[str, str]:
    return {p: f"CANARY_receive_{p}_{uuid.uuid4().hex}" for p in (*DROPPED, *IN_VALUES)}


def _value(value: Any) -> dict[str, Any]:
    if isinstance(value, list):
        return {"arrayValue": {"values": [_value(v) for v in value]}}
    if isinstance(value, int):
        return {"intValue": str(value)}
    return {"stringValue": str(value)}


def _attrs(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _value(v)} for k, v in attrs.items()]


def export_request(c: dict[str, str], n: int, t0: int) -> dict[str, Any]:
    """`n` traces of `POST /chat`: an LLM call with prompt and completion, a tool call, a query, an
    HTTP call that failed with an exception; canaries in every attribute of `DROPPED` and `IN_VALUES`."""
    spans = []
    for i in range(n):
        trace, start = uuid.uuid4().hex, t0 + i * 500 * MS
        root, llm, tool, db, http = (uuid.uuid4().hex[:16] for _ in range(5))

        def span(span_id: str, parent: str | None, name: str, kind: int, begin: int, end: int, attrs: dict[str, Any],
                 events: list[dict[str, Any]] | None = None, status: int = 0) -> dict[str, Any]:  # fmt: skip
            out: dict[str, Any] = {"traceId": trace, "spanId": span_id, "name": name, "kind": kind,
                                   "startTimeUnixNano": str(begin), "endTimeUnixNano": str(end), "attributes": _attrs(attrs),
                                   "events": events or [], "status": {"code": status}}  # fmt: skip
            if parent:
                out["parentSpanId"] = parent
            return out

        spans += [
            span(root, None, "POST /chat", 2, start, start + (200 + 40 * (i % 7)) * MS,
                 {"http.request.method": "POST", "http.route": "/chat", "http.response.status_code": 200,
                  DROPPED["request_header"]: [f"Bearer {c['request_header']}"], DROPPED["response_header"]: [c["response_header"]],
                  DROPPED["url_query"]: f"q={c['url_query']}"}),
            span(llm, root, "chat gpt-x", 3, start + 10 * MS, start + 150 * MS,
                 {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-x", "gen_ai.usage.output_tokens": 20,
                  DROPPED["prompt"]: c["prompt"], DROPPED["completion"]: c["completion"],
                  DROPPED["input_messages"]: json.dumps([{"role": "user", "content": c["input_messages"]}]),
                  DROPPED["output_messages"]: json.dumps([{"role": "assistant", "content": c["output_messages"]}]),
                  DROPPED["input_value"]: c["input_value"], DROPPED["output_value"]: c["output_value"]},
                 [{"timeUnixNano": str(start + 60 * MS), "name": "gen_ai.content.completion.chunk",
                   "attributes": _attrs({DROPPED["event_content"]: c["event_content"]})}]),
            span(tool, root, "execute_tool lookup", 1, start + 150 * MS, start + 170 * MS,
                 {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup",
                  DROPPED["tool_arguments"]: json.dumps({"q": c["tool_arguments"]}), DROPPED["tool_result"]: c["tool_result"]}),
            span(db, root, "SELECT orders", 3, start + 170 * MS, start + 180 * MS,
                 {"db.system.name": "postgresql", "db.query.text": f"SELECT * FROM orders WHERE note = '{c['statement_literal']}' AND id = $1",
                  DROPPED["db_parameter"]: c["db_parameter"]}),
            span(http, root, "GET", 3, start + 180 * MS, start + 195 * MS,
                 {"http.request.method": "GET", "server.address": "api.internal", "server.port": 443,
                  "url.full": f"https://api.internal/v1/items?token={c['url_full_query']}",
                  "http.url": f"https://api.internal/v1/items?token={c['http_url_query']}", "error.type": "ReadTimeout"},
                 [{"timeUnixNano": str(start + 195 * MS), "name": "exception",
                   "attributes": _attrs({"exception.type": "ReadTimeout", DROPPED["exception_message"]: f"timed out for {c['exception_message']}",
                                         DROPPED["exception_stacktrace"]: f"Traceback ...\nReadTimeout: {c['exception_stacktrace']}"})}],
                 status=2),
        ]  # fmt: skip
    resource = {"service.name": "chat", "service.instance.id": "one", DROPPED["command_args"]: ["python", "app.py", c["command_args"]],
                DROPPED["command_line"]: f"python app.py {c['command_line']}"}  # fmt: skip
    return {"resourceSpans": [{"resource": {"attributes": _attrs(resource)}, "scopeSpans": [{"scope": {"name": "test"}, "spans": spans}]}]}


def _ids_as_base64(request: dict[str, Any]) -> dict[str, Any]:
    """An OTLP JSON request with its hex ids in protobuf's JSON mapping of bytes (base64), for `ParseDict`."""
    out = json.loads(json.dumps(request))
    for span in (s for r in out["resourceSpans"] for scope in r["scopeSpans"] for s in scope["spans"]):
        for key in ("traceId", "spanId", "parentSpanId"):
            if key in span:
                span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    return out


def _post(port: int, body: bytes, content_type: str, encoding: str = "") -> None:
    headers = {"Content-Type": content_type, **({"Content-Encoding": encoding} if encoding else {})}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/traces", data=body, headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=20) as response:
        assert response.status == 200


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_receive_keeps_no_content_attribute_and_no_report_carries_a_canary(tmp_path: Path) -> None:
    c = canaries()
    port, out, report = _free_port(), tmp_path / "received.otlp.jsonl", tmp_path / "receive-report.json"
    cmd = [sys.executable, "-m", "latprof", "receive", "--listen", f"127.0.0.1:{port}", "--out", str(out), "--duration", "8",
           "--format", "json", "-o", str(report), "--skip-warmup", "0"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
                time.sleep(0.05)
        t0 = time.time_ns() - 60_000 * MS
        sent = [export_request(c, 30, t0), export_request(c, 30, t0 + 20_000 * MS)]
        _post(port, json.dumps(sent[0]).encode(), "application/json")
        message = json_format.ParseDict(_ids_as_base64(sent[1]), ExportTraceServiceRequest())
        _post(port, gzip.compress(message.SerializeToString()), "application/x-protobuf", "gzip")
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr[-3000:]
    assert all(v in json.dumps(sent) for v in c.values())  # every canary was sent
    spans = list(read_otlp_json(out).spans)
    assert len(spans) == 300  # every span was kept, ...
    kept = {k for s in spans for k in (*s.attrs, *s.resource, *(k for e in s.events for k in e.attrs))}
    assert {"gen_ai.request.model", "db.query.text", "url.full", "exception.type", "http.route", "service.name"} <= kept
    assert not kept & set(DROPPED.values()), kept & set(DROPPED.values())  # ... without what it must not keep
    written = [out, report, tmp_path / "receive.stdout"]
    written[-1].write_bytes(stdout + stderr)
    for fmt in REPORT.names():
        target = tmp_path / f"analyze.{fmt}"
        result = subprocess.run([sys.executable, "-m", "latprof", "analyze", str(out), "--format", fmt, "-o", str(target),
                                 "--skip-warmup", "0"], cwd=ROOT, capture_output=True, timeout=120)  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        written.append(target)
    in_file = [p for p, v in c.items() if v.encode() in out.read_bytes()]
    assert in_file == ["statement_literal"]  # a statement's text is kept as exported (its parameters are not)
    reported = [f"{path.name}: {purpose}" for path in written[1:] for purpose, value in c.items() if value.encode() in path.read_bytes()]
    assert reported == []
