"""The same real traces as Jaeger JSON and Zipkin v2 JSON get the same verdict as their OTLP file.

A stock-instrumented service's OTLP export (otlp_harness) is rewritten span by span the way the
Collector's Jaeger and Zipkin translators write them (ids in hex, microsecond times, OTel span
kind and scope as tags, resource attributes as the process / local endpoint), then read by
`latprof analyze` as a user would.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from report_schema import assert_valid
from test_otlp_e2e import analyze

KINDS = {1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


def _value(v: dict[str, Any]) -> Any:
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        return int(v["intValue"])
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "boolValue" in v:
        return v["boolValue"]
    return json.dumps(v)


def _otlp_spans(path: Path) -> list[tuple[dict[str, Any], str, dict[str, Any], dict[str, Any]]]:
    """(span, scope name, resource attributes, span attributes) of every span in a file-exporter file."""
    out = []
    for line in path.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            resource = {a["key"]: _value(a["value"]) for a in rs["resource"].get("attributes", [])}
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    attrs = {a["key"]: _value(a["value"]) for a in span.get("attributes", [])}
                    out.append((span, ss.get("scope", {}).get("name", ""), resource, attrs))
    return out


def _us(nanos: str) -> int:
    return int(nanos) // 1000


def as_jaeger(path: Path, out: Path) -> Path:
    traces: dict[str, dict[str, Any]] = {}
    for span, scope, resource, attrs in _otlp_spans(path):
        trace = traces.setdefault(span["traceId"], {"traceID": span["traceId"], "spans": [], "processes": {}, "warnings": None})
        pid = f"p{list(trace['processes']).index(resource['service.name']) + 1}" if resource["service.name"] in trace["processes"] else None
        if pid is None:
            trace["processes"][resource["service.name"]] = {"serviceName": resource["service.name"],
                                                            "tags": [{"key": k, "type": "string", "value": str(v)} for k, v in resource.items() if k != "service.name"]}  # fmt: skip
            pid = f"p{len(trace['processes'])}"
        tags = [{"key": k, "type": "int64" if isinstance(v, int) and not isinstance(v, bool) else "bool" if isinstance(v, bool) else "string", "value": v}
                for k, v in attrs.items()]  # fmt: skip
        tags += [{"key": "span.kind", "type": "string", "value": KINDS.get(span.get("kind", 0), "internal")},
                 {"key": "otel.scope.name", "type": "string", "value": scope}]  # fmt: skip
        refs = [{"refType": "CHILD_OF", "traceID": span["traceId"], "spanID": span["parentSpanId"]}] if span.get("parentSpanId") else []
        start = _us(span["startTimeUnixNano"])
        trace["spans"].append({"traceID": span["traceId"], "spanID": span["spanId"], "operationName": span["name"],
                               "references": refs, "flags": 1, "startTime": start,
                               "duration": _us(span["endTimeUnixNano"]) - start, "tags": tags, "logs": [],
                               "processID": pid, "warnings": None})  # fmt: skip
    for trace in traces.values():  # processes are keyed p1, p2, ... in the document
        trace["processes"] = {f"p{i}": p for i, p in enumerate(trace["processes"].values(), 1)}
    out.write_text(json.dumps({"data": list(traces.values()), "total": 0, "limit": 0, "offset": 0, "errors": None}))
    return out


def as_zipkin(path: Path, out: Path) -> Path:
    spans = []
    for span, scope, resource, attrs in _otlp_spans(path):
        zipkin: dict[str, Any] = {"traceId": span["traceId"], "id": span["spanId"], "name": span["name"].lower(),
                                  "timestamp": _us(span["startTimeUnixNano"]),
                                  "duration": _us(span["endTimeUnixNano"]) - _us(span["startTimeUnixNano"]),
                                  "localEndpoint": {"serviceName": resource["service.name"]},
                                  "tags": {**{k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in attrs.items()},
                                           "otel.scope.name": scope}}  # fmt: skip
        kind = KINDS.get(span.get("kind", 0))
        if kind and kind != "internal":
            zipkin["kind"] = kind.upper()
        if span.get("parentSpanId"):
            zipkin["parentId"] = span["parentSpanId"]
        spans.append(zipkin)
    out.write_text(json.dumps(spans))
    return out


def report(path: Path) -> dict[str, Any]:
    done = analyze(path)
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    assert_valid(out)
    return out


@pytest.mark.slow  # records a real service
@pytest.mark.parametrize(("scenario", "db"), [("pool_held", "sqlalchemy"), ("sequential_tools", "sqlalchemy")])
def test_jaeger_and_zipkin_copies_of_real_traces_get_the_same_verdict(recording: Callable[..., Path], tmp_path: Path,
                                                                      scenario: str, db: str) -> None:  # fmt: skip
    source = recording(scenario, db)
    original = report(source)
    jaeger = report(as_jaeger(source, tmp_path / "jaeger-download.json"))
    zipkin = report(as_zipkin(source, tmp_path / "zipkin-traces.json"))
    assert (original["source"]["kind"], jaeger["source"]["kind"], zipkin["source"]["kind"]) == ("otlp", "jaeger", "zipkin")
    for other in (jaeger, zipkin):
        assert other["window"]["requests"] == original["window"]["requests"]
        assert (other["verdict"]["layer"], other["verdict"]["rule"]) == (original["verdict"]["layer"], original["verdict"]["rule"])
        # microsecond times: the shares agree to within rounding
        assert other["verdict"]["share_of_tail_excess"] == pytest.approx(original["verdict"]["share_of_tail_excess"], abs=0.02)
