"""docs/report-v1.schema.json: a valid JSON Schema, held by the report of every source kind (the
example captures, attach captures, OTLP JSON and protobuf, Jaeger, Zipkin, `receive`), and
broken by reports that break report-v1 (an unknown layer, a missing key, a wrong type, ...)."""

from __future__ import annotations

import base64
import copy
import gzip
import json
from pathlib import Path
from typing import Any, Callable

import orjson
import pytest
from attach.sampled import sampled
from google.protobuf import json_format
from jsonschema import Draft202012Validator
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from report_schema import SCHEMA, VALIDATOR, closed, schema_errors
from timelines import analysed, population

from latprof.attach.analysis import diagnose_attach
from latprof.capture.format import SOURCE_KINDS, encode, make_header
from latprof.engine import SEVERITIES, Rule, run_rules
from latprof.layers import LAYERS
from latprof.pipeline import default_rules, diagnose, run_diagnosis
from latprof.report.model import build_report

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.jsonl.gz"))
OTLP_FIXTURES = sorted((ROOT / "tests" / "collectors" / "traces" / "fixtures" / "otlp").glob("*.otlp.json"))
DEFS = SCHEMA["$defs"]


def assert_valid(report: dict[str, Any]) -> None:
    """Valid against the public schema and against the closed one the tests use (every field declared)."""
    assert schema_errors(report, VALIDATOR) == []
    assert schema_errors(report) == []


def test_the_schema_is_a_valid_draft_2020_12_schema() -> None:
    Draft202012Validator.check_schema(SCHEMA)
    Draft202012Validator.check_schema(closed(SCHEMA))
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_the_schemas_vocabularies_are_the_codes() -> None:
    assert DEFS["layer"]["enum"] == list(LAYERS)
    assert DEFS["finding"]["properties"]["severity"]["enum"] == list(SEVERITIES)
    assert DEFS["source"]["properties"]["kind"]["enum"] == list(SOURCE_KINDS)


def test_report_v1_md_links_the_schema() -> None:
    assert "(report-v1.schema.json)" in (ROOT / "docs" / "report-v1.md").read_text(encoding="utf-8")


# --- request captures ---------------------------------------------------------------------------


@pytest.mark.parametrize("capture", EXAMPLES, ids=lambda p: p.name)
def test_the_report_of_every_example_capture_validates(capture: Path) -> None:
    assert_valid(diagnose([capture]).to_dict())


class Exploding(Rule):
    """Crashes on every analysis.

    What it detects:
        x
    Why it matters for p99:
        x
    Evidence:
        x
    How to fix:
        x
    Example:
        x
    """

    id = "exploding"
    layer = "app"

    def check(self, analysis: Any) -> list[Any]:
        raise ZeroDivisionError("division by zero")


def test_a_report_with_a_crashed_rule_validates() -> None:
    analysis = analysed(population(200, [("db.query", 20)], [("db.pool", 3000), ("db.query", 20)]))
    findings = run_rules(analysis, [Exploding(), *default_rules()])
    report = build_report(analysis, findings).to_dict()
    crashed = next(f for f in report["findings"] if f["rule"] == "exploding")
    assert crashed["layer"] is None and crashed["evidence"]["rule_crashed"] is True
    assert report["verdict"]["layer"] == "db.pool"
    assert_valid(report)


# --- trace files --------------------------------------------------------------------------------

T0_NS = 1_764_000_000 * 1_000_000_000
MS_NS = 1_000_000
SERVICE = "chat-api"


def spans() -> list[dict[str, Any]]:
    """100 requests 100 ms apart, each a server span around one statement (5 ms; 300 ms in every
    25th request: a db.query tail), as OTLP JSON spans."""
    out = []
    for i in range(100):
        trace, root, statement = f"{i + 1:032x}", f"{2 * i + 1:016x}", f"{2 * i + 2:016x}"
        start = T0_NS + i * 100 * MS_NS
        db_ms = 300 if i % 25 == 24 else 5
        out.append({"traceId": trace, "spanId": root, "name": "POST /chat", "kind": "SPAN_KIND_SERVER",
                    "startTimeUnixNano": str(start), "endTimeUnixNano": str(start + (db_ms + 15) * MS_NS),
                    "attributes": [{"key": "http.request.method", "value": {"stringValue": "POST"}},
                                   {"key": "http.route", "value": {"stringValue": "/chat"}}]})  # fmt: skip
        out.append({"traceId": trace, "spanId": statement, "parentSpanId": root, "name": "SELECT chat",
                    "kind": "SPAN_KIND_CLIENT", "startTimeUnixNano": str(start + 5 * MS_NS),
                    "endTimeUnixNano": str(start + (5 + db_ms) * MS_NS),
                    "attributes": [{"key": "db.system.name", "value": {"stringValue": "postgresql"}}]})  # fmt: skip
    return out


def otlp_document() -> dict[str, Any]:
    return {"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": SERVICE}}]},
        "scopeSpans": [{"scope": {"name": "opentelemetry.instrumentation.fastapi"}, "spans": spans()}],
    }]}  # fmt: skip


def as_otlp_json(path: Path) -> Path:
    path.write_text(json.dumps(otlp_document()))
    return path


def as_otlp_proto(path: Path) -> Path:
    """The OTLP JSON document as protobuf (whose JSON mapping writes ids in base64, not hex)."""
    doc = copy.deepcopy(otlp_document())
    for span in doc["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        for key in ("traceId", "spanId", "parentSpanId"):
            if key in span:
                span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    path.write_bytes(json_format.ParseDict(doc, ExportTraceServiceRequest()).SerializeToString())
    return path


def _us(nanos: str) -> int:
    return int(nanos) // 1000


def _attributes(span: dict[str, Any]) -> dict[str, str]:
    return {a["key"]: a["value"]["stringValue"] for a in span["attributes"]}


def as_jaeger(path: Path) -> Path:
    """The spans as the Jaeger query API writes them (one document, a trace per request)."""
    traces: dict[str, dict[str, Any]] = {}
    for span in spans():
        trace = traces.setdefault(span["traceId"], {"traceID": span["traceId"], "spans": [], "warnings": None,
                                                    "processes": {"p1": {"serviceName": SERVICE, "tags": []}}})  # fmt: skip
        kind = "server" if span["kind"] == "SPAN_KIND_SERVER" else "client"
        refs = [{"refType": "CHILD_OF", "traceID": span["traceId"], "spanID": span["parentSpanId"]}] if "parentSpanId" in span else []
        trace["spans"].append({
            "traceID": span["traceId"], "spanID": span["spanId"], "operationName": span["name"], "references": refs,
            "flags": 1, "startTime": _us(span["startTimeUnixNano"]),
            "duration": _us(span["endTimeUnixNano"]) - _us(span["startTimeUnixNano"]),
            "tags": [{"key": k, "type": "string", "value": v} for k, v in _attributes(span).items()]
                    + [{"key": "span.kind", "type": "string", "value": kind}],
            "logs": [], "processID": "p1", "warnings": None,
        })  # fmt: skip
    path.write_text(json.dumps({"data": list(traces.values()), "total": 0, "limit": 0, "offset": 0, "errors": None}))
    return path


def as_zipkin(path: Path) -> Path:
    """The spans as Zipkin's v2 API writes them."""
    out = []
    for span in spans():
        zipkin = {"traceId": span["traceId"], "id": span["spanId"], "name": span["name"].lower(),
                  "kind": "SERVER" if span["kind"] == "SPAN_KIND_SERVER" else "CLIENT",
                  "timestamp": _us(span["startTimeUnixNano"]),
                  "duration": _us(span["endTimeUnixNano"]) - _us(span["startTimeUnixNano"]),
                  "localEndpoint": {"serviceName": SERVICE}, "tags": _attributes(span)}  # fmt: skip
        if "parentSpanId" in span:
            zipkin["parentId"] = span["parentSpanId"]
        out.append(zipkin)
    path.write_text(json.dumps(out))
    return path


TRACE_FORMATS: dict[str, tuple[str, Callable[[Path], Path]]] = {
    "otlp": ("traces.otlp.json", as_otlp_json),
    "otlp-proto": ("traces.pb", as_otlp_proto),
    "jaeger": ("jaeger-download.json", as_jaeger),
    "zipkin": ("zipkin-traces.json", as_zipkin),
}


@pytest.mark.parametrize("trace_format", sorted(TRACE_FORMATS))
def test_the_report_of_each_trace_format_validates(tmp_path: Path, trace_format: str) -> None:
    name, write = TRACE_FORMATS[trace_format]
    report = diagnose([write(tmp_path / name)]).to_dict()
    assert report["source"]["kind"] == trace_format.removesuffix("-proto")
    assert report["verdict"]["layer"] == "db.query" and report["window"]["requests"] == 80  # 2 s of warm-up left out
    assert_valid(report)


def test_the_report_of_latprof_receive_validates(tmp_path: Path) -> None:
    report = run_diagnosis([as_otlp_json(tmp_path / "received.otlp.json")], source_kind="receive").report.to_dict()
    assert report["source"]["kind"] == "receive"
    assert_valid(report)


@pytest.mark.parametrize("fixture", OTLP_FIXTURES, ids=lambda p: p.name)
def test_the_report_of_a_single_real_trace_validates(fixture: Path, tmp_path: Path) -> None:
    """One trace is too few requests for a verdict, and warm-up leaves none: nulls where the numbers would be."""
    report = diagnose([fixture]).to_dict()
    assert (report["window"]["requests"], report["latency_ms"], report["verdict"]["status"]) == (0, None, "too_few_requests")
    assert_valid(report)
    doc = json.loads(fixture.read_text())
    proto = tmp_path / f"{fixture.stem}.pb"
    for span in (s for rs in doc["resourceSpans"] for ss in rs.get("scopeSpans", []) for s in ss.get("spans", [])):
        for holder in [span, *span.get("links", [])]:
            for key in ("traceId", "spanId", "parentSpanId"):
                if holder.get(key):
                    holder[key] = base64.b64encode(bytes.fromhex(holder[key])).decode()
    proto.write_bytes(json_format.ParseDict(doc, ExportTraceServiceRequest()).SerializeToString())
    assert_valid(diagnose([proto]).to_dict())


# --- attach captures ----------------------------------------------------------------------------

ATTACH_MIXES = {
    "lock": ({"lock": 0.6, "cpu": 0.4}, {}),
    "cpu": ({"cpu": 1.0}, {}),
    "unattributed": ({"socket": 0.6, "cpu": 0.4}, {}),
    "held-loop": ({"sleep": 0.8, "free": 0.2}, {"loop_busy_share": 0.8}),
    "free-loop": ({"sleep": 0.1, "free": 0.9}, {"loop_busy_share": 0.1}),
}


@pytest.mark.parametrize("mix", sorted(ATTACH_MIXES))
def test_the_report_of_an_attach_capture_validates(mix: str) -> None:
    shares, options = ATTACH_MIXES[mix]
    report = diagnose_attach(sampled(shares, **options)).to_dict()
    assert report["source"]["kind"] == "attach" and report["latency_ms"] is None and report["window"]["requests"] is None
    assert_valid(report)


def test_an_attach_capture_file_analysed_again_validates(tmp_path: Path) -> None:
    """`latprof analyze` of an attach capture: read from the file, through the pipeline's attach branch."""
    timeline = sampled({"lock": 0.6, "cpu": 0.4}, loop_busy_share=None)
    header = make_header("attach", **{k: v for k, v in timeline.headers[0].items() if k not in ("type", "source")})
    events = [*timeline.samples, *(g for gauges in timeline.gauges.values() for g in gauges)]
    path = tmp_path / "attach.jsonl.gz"
    path.write_bytes(gzip.compress(b"".join(orjson.dumps(line) + b"\n" for line in [header, *map(encode, events)])))
    report = diagnose([path]).to_dict()
    assert (report["source"]["kind"], report["verdict"]["layer"]) == ("attach", "lock")
    assert report["layers"] and all(row["p50_ms"] is None for row in report["layers"])
    assert_valid(report)


# --- what breaks it -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run_report() -> dict[str, Any]:
    return diagnose([ROOT / "examples" / "pool_held_across_llm.jsonl.gz"]).to_dict()


@pytest.fixture(scope="module")
def attach_report() -> dict[str, Any]:
    return diagnose_attach(sampled({"lock": 0.6, "cpu": 0.4})).to_dict()


def broken(report: dict[str, Any], change: Callable[[dict[str, Any]], Any]) -> list[str]:
    """The schema errors of a copy of `report` changed by `change`."""
    copied = copy.deepcopy(report)
    change(copied)
    return schema_errors(copied)


#: What breaks report-v1, and where the schema says so.
BREAKS: dict[str, tuple[str, Callable[[dict[str, Any]], Any]]] = {
    "unknown layer in layers": ("layers/0/layer", lambda r: r["layers"][0].update(layer="network")),
    "idle is not a layer": ("verdict/layer", lambda r: r["verdict"].update(layer="idle")),
    "unknown layer in a finding": ("findings/0/layer", lambda r: r["findings"][0].update(layer="db")),
    "missing verdict key": ("verdict", lambda r: r["verdict"].pop("confidence")),
    "missing verdict summary": ("verdict", lambda r: r["verdict"].pop("summary")),
    "missing verdict": ("(root)", lambda r: r.pop("verdict")),
    "wrong schema": ("schema", lambda r: r.update(schema="latprof.report/2")),
    "p99 as a string": ("latency_ms/p99", lambda r: r["latency_ms"].update(p99="607 ms")),
    "requests as a float": ("window/requests", lambda r: r["window"].update(requests=185.5)),
    "confidence above 1": ("verdict/confidence", lambda r: r["verdict"].update(confidence=1.5)),
    "unknown severity": ("findings/0/severity", lambda r: r["findings"][0].update(severity="error")),
    "unknown source kind": ("source/kind", lambda r: r["source"].update(kind="datadog")),
    "findings not a list": ("findings", lambda r: r.update(findings={})),
    "evidence not an object": ("findings/0/evidence", lambda r: r["findings"][0].update(evidence=[])),
    "a rule with no verdict layer": ("verdict/rule", lambda r: r["verdict"].update(layer=None, share_of_tail_excess=None, status="no_tail")),
    "a null layer on a finding that did not crash": ("findings/0/evidence", lambda r: r["findings"][0].update(layer=None)),
    "status layer naming no layer": ("verdict/layer", lambda r: r["verdict"].update(layer=None, rule=None, share_of_tail_excess=None)),
    "attach-mode nulls in a run report: latency": ("latency_ms", lambda r: r.update(latency_ms=None)),
    "attach-mode nulls in a run report: requests": ("window/requests", lambda r: r["window"].update(requests=None)),
    "attach-mode nulls in a run report: layer p50": ("layers/0/p50_ms", lambda r: r["layers"][0].update(p50_ms=None)),
    "an estimated latency outside attach mode": ("latency_ms/estimated", lambda r: r["latency_ms"].update(estimated=True)),
    "missing collection key": ("collection", lambda r: r["collection"].pop("warnings")),
    "missing overhead key": ("collection/overhead", lambda r: r["collection"]["overhead"].pop("cpu_percent")),
}  # fmt: skip


@pytest.mark.parametrize("change", sorted(BREAKS))
def test_a_report_that_breaks_report_v1_fails_validation(run_report: dict[str, Any], change: str) -> None:
    assert schema_errors(run_report) == []
    where, how = BREAKS[change]
    errors = broken(run_report, how)
    assert errors and all(e.startswith(f"{where}: ") for e in errors), errors


def test_attach_mode_allows_nulls_and_an_estimated_latency_only(attach_report: dict[str, Any]) -> None:
    assert schema_errors(attach_report) == []
    estimated = {"p50": 120.0, "p90": 300.0, "p99": 800.0, "max": 900.0, "estimated": True}
    assert broken(attach_report, lambda r: r.update(latency_ms=estimated)) == []
    assert broken(attach_report, lambda r: r.update(latency_ms={**estimated, "estimated": False}))
    assert broken(attach_report, lambda r: r.update(latency_ms={k: v for k, v in estimated.items() if k != "estimated"}))
    assert broken(attach_report, lambda r: r["layers"][0].update(layer="busy"))


def test_a_field_the_schema_does_not_declare_passes_the_public_schema_but_not_the_tests(run_report: dict[str, Any]) -> None:
    """report-v1 lets latprof add fields (readers ignore them); the tests make each one be declared first."""
    added = copy.deepcopy(run_report)
    added["verdict"]["why"] = "an undeclared field"
    assert schema_errors(added, VALIDATOR) == []
    assert schema_errors(added) == ["verdict: Unevaluated properties are not allowed ('why' was unexpected)"]


def test_a_broken_report_a_latprof_subprocess_prints_fails_the_test_that_ran_it(tmp_path: Path) -> None:
    # conftest's wrapper of subprocess.run: a command whose argv names latprof and whose stdout
    # holds a report (here after a service's own line) has that report validated.
    import subprocess
    import sys

    good = diagnose([EXAMPLES[0]]).to_dict()
    broken = {**good, "verdict": {**good["verdict"], "layer": "gpu"}}
    for report, fails in ((good, False), (broken, True)):
        script = tmp_path / "prints.py"
        script.write_text(f"print('INFO: a service line')\nprint({json.dumps(json.dumps(report, indent=2))})\n")
        argv = [sys.executable, str(script), "latprof"]
        if fails:
            with pytest.raises(pytest.fail.Exception, match="verdict"):
                subprocess.run(argv, capture_output=True, text=True, timeout=60)
        else:
            assert subprocess.run(argv, capture_output=True, text=True, timeout=60).returncode == 0
