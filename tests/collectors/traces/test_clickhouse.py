"""Spans in ClickHouse, where the Collector's ClickHouse exporter keeps them, get the verdict of the same spans read from a file.

ClickHouse's own engine runs in-process (chdb: `nox -s clickhouse` installs it; the README's run
skips this module). The spans are a real instrumented service's (the OTLP harness's recordings:
FastAPI, SQLAlchemy on PostgreSQL, the official openai client against a provider the test starts),
loaded into the exporter's exact table as the exporter writes them (`clickhouse_tables`), and read
back by latprof's queries - the texts `latprof.collectors.traces.clickhouse_sql` builds, bound by
the engine.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

chdb_session = pytest.importorskip("chdb.session")

from clickhouse_tables import ChdbRunner, ExporterTables  # noqa: E402
from latprof.collectors.traces import clickhouse_sql  # noqa: E402
from latprof.collectors.traces.otlp_json import read_otlp_json  # noqa: E402
from latprof.errors import InputError  # noqa: E402
from latprof.pipeline import Diagnosis, run_diagnosis  # noqa: E402
from latprof.semconv import SAMPLE_WEIGHT  # noqa: E402


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Any]:
    sess = chdb_session.Session(str(tmp_path / "chdb"))
    yield sess
    sess.close()


def _span_range(path: Path) -> tuple[int, int]:
    spans = read_otlp_json(path).spans
    return min(s.start_ns for s in spans), max(s.end_ns for s in spans)


def _summary(diagnosis: Diagnosis) -> dict[str, Any]:
    report = diagnosis.report.to_dict()
    return {
        "requests": report["window"]["requests"],
        "latency": report["latency_ms"],
        "verdict": (report["verdict"]["layer"], report["verdict"]["rule"], round(report["verdict"]["share_of_tail_excess"], 3)),
        "rules": sorted(f["rule"] for f in report["findings"]),
        "tail": {row["layer"]: round(row["tail_excess_ms"], 1) for row in report["layers"]},
    }


@pytest.mark.slow  # records a real service
@pytest.mark.parametrize(("variant", "lookup"), [("current", True), ("current", False), ("v0", False)])
def test_real_traces_in_the_exporters_table_get_the_verdict_of_the_file(recording: Callable[..., Path], session: Any,
                                                                       variant: str, lookup: bool) -> None:  # fmt: skip
    source_file = recording("pool_held", "sqlalchemy")
    from_file = run_diagnosis([source_file])
    tables = ExporterTables(session, variant=variant, lookup=lookup)
    loaded = tables.load(read_otlp_json(source_file).spans)
    start, end = _span_range(source_file)
    runner = ChdbRunner(session)
    from_table = run_diagnosis([tables.source(runner, start - 1, end + 1)])
    assert _summary(from_table) == _summary(from_file)
    assert _summary(from_file)["verdict"][:2] == ("db.pool", "db-pool-exhaustion")
    assert from_table.report.to_dict()["source"]["kind"] == "otlp"
    assert from_table.report.to_dict()["collection"]["collectors"] == ["clickhouse"]
    # every query is one clickhouse_sql builds; the spans' query reads the lookup table when it is there
    schema = clickhouse_sql.Schema("otel", "otel_traces", variant == "current", "otel_traces_trace_id_ts" if lookup else None)
    assert runner.texts[2:] == [clickhouse_sql.stats_sql(schema), clickhouse_sql.pick_sql(schema), clickhouse_sql.spans_sql(schema)]
    assert ("otel_traces_trace_id_ts" in runner.texts[-1]) is lookup
    assert loaded == len(read_otlp_json(source_file).spans)


@pytest.mark.slow  # records a real service
def test_a_large_range_comes_back_cohort_first_each_request_weighted(recording: Callable[..., Path], session: Any) -> None:
    """With a sample of 20 the recording's few hundred requests are a large range: ClickHouse picks the tail, the
    median cohort and each second's p99 whole and one in k of the others, and latprof weighs those by k."""
    source_file = recording("pool_held", "sqlalchemy")
    from_file = run_diagnosis([source_file])
    tables = ExporterTables(session)
    tables.load(read_otlp_json(source_file).spans)
    start, end = _span_range(source_file)
    picked = tables.source(ChdbRunner(session), start - 1, end + 1, sample_requests=20)
    read = picked.read()
    roots = [s for s in read.spans if s.parent_id is None]
    weights = [s.attrs.get(SAMPLE_WEIGHT, 1) for s in roots]
    assert read.requests > len(roots) == read.picked  # not every request came back ...
    assert max(weights) > 1 and sum(weights) == pytest.approx(read.requests, rel=0.5)  # ... and those that did stand for the rest
    # the slowest 5% all came back, unweighted
    durations = sorted((s.end_ns - s.start_ns for s in read_otlp_json(source_file).spans if s.parent_id is None), reverse=True)
    slowest = durations[: max(1, len(durations) // 20)]
    back = {s.end_ns - s.start_ns: s.attrs.get(SAMPLE_WEIGHT, 1) for s in roots}
    assert all(back.get(d) == 1 for d in slowest)
    everything = tables.source(ChdbRunner(session), start - 1, end + 1, sample_requests=20)
    everything.exact = True  # --exact
    assert everything.read().picked == read.requests
    diagnosis = run_diagnosis([tables.source(ChdbRunner(session), start - 1, end + 1, sample_requests=20)])
    summary, exact = _summary(diagnosis), _summary(from_file)
    assert summary["verdict"][:2] == exact["verdict"][:2] and summary["rules"] == exact["rules"]
    assert summary["latency"]["p99"] == pytest.approx(exact["latency"]["p99"], rel=0.15)
    assert any("each weighted by the requests it stands for" in w for w in diagnosis.report.to_dict()["collection"]["warnings"])


def test_service_and_route_are_bound_by_the_server_never_pasted(tmp_path: Path, session: Any) -> None:
    """Hostile names read nothing and change nothing; a service really named with quotes is found by its name."""
    tables = ExporterTables(session)
    path = Path(__file__).parent / "fixtures" / "otlp" / "sibling_errors.otlp.json"
    spans = read_otlp_json(path).spans
    odd = "o'brien \"svc\"; --"
    import time

    shift = time.time_ns() - 60_000_000_000 - max(s.end_ns for s in spans)  # the table's TTL drops older parts
    tables.load([s._replace(service=odd) for s in spans], shift)
    before = tables.count()
    start, end = min(s.start_ns for s in spans) + shift, max(s.end_ns for s in spans) + shift
    hostile = ["x' OR '1'='1", "'); DROP TABLE otel.otel_traces; --", "\\' OR 1=1 --", "{service:String}"]
    for name in hostile:
        for field in ("service", "route"):
            source = tables.source(ChdbRunner(session), start - 1, end + 1, **{field: name})
            with pytest.raises(InputError, match="no request"):
                source.read()
    assert tables.count() == before
    found = tables.source(ChdbRunner(session), start - 1, end + 1, service=odd).read()
    assert found.requests == 1 and {s.service for s in found.spans} == {odd}


def test_a_table_that_is_not_the_exporters_is_one_line(session: Any) -> None:
    session.query("CREATE DATABASE IF NOT EXISTS otel")
    session.query("CREATE TABLE otel.spans (TraceId String, SpanId String) ENGINE = MergeTree ORDER BY TraceId")
    tables = ExporterTables(session)  # otel.otel_traces: there, empty
    empty = tables.source(ChdbRunner(session), 1, 2)
    with pytest.raises(InputError, match="no request"):
        empty.read()
    for table, message in (("spans", "not a table of the Collector's ClickHouse exporter: no column Timestamp"), ("absent", "no table otel.absent")):
        source = tables.source(ChdbRunner(session), 1, 2)
        source.target = dataclasses.replace(source.target, table=table)
        with pytest.raises(InputError, match=message):
            source.read()


@pytest.mark.slow  # records a real service
def test_retries_after_429s_are_inferred_from_the_exporters_text_attributes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                           session: Any) -> None:  # fmt: skip
    """The exporter keeps `http.response.status_code` as text ("429"): read back as the number the retry inference
    needs, the verdict is the file's (`retry-backoff`, after 429)."""
    from test_stock_faults_e2e import record_stock

    source_file = record_stock(tmp_path, monkeypatch, "stock_retry", "/chat")
    from_file = run_diagnosis([source_file])
    tables = ExporterTables(session)
    tables.load(read_otlp_json(source_file).spans)
    start, end = _span_range(source_file)
    from_table = run_diagnosis([tables.source(ChdbRunner(session), start - 1, end + 1)])
    assert _summary(from_table) == _summary(from_file)
    assert _summary(from_file)["verdict"][:2] == ("retry", "retry-backoff")
    [retry] = [f for f in from_table.report.to_dict()["findings"] if f["rule"] == "retry-backoff"]
    assert list(retry["evidence"]["after"]) == ["429"]


@pytest.mark.slow  # records a real service
def test_latprof_analyze_reads_clickhouse_over_http_through_clickhouse_connect(recording: Callable[..., Path], session: Any) -> None:
    """`latprof analyze clickhouse://...` as a user runs it: clickhouse-connect carries the very texts `clickhouse_sql` builds
    (the ones the chdb runner carries above) over ClickHouse's HTTP interface, the values as server-side parameters; the
    password, from the environment, is never printed; the report is the file's."""
    pytest.importorskip("clickhouse_connect")
    import json
    import os
    import subprocess
    import sys

    from clickhouse_http import ClickHouseHttp

    source_file = recording("pool_held", "sqlalchemy")
    tables = ExporterTables(session, lookup=True)
    tables.load(read_otlp_json(source_file).spans)
    start, end = _span_range(source_file)
    secret = "s3cret-pa55"
    with ClickHouseHttp(session) as server:
        url = f"clickhouse://reader@127.0.0.1:{server.port}/otel?table=otel_traces"
        done = subprocess.run(
            [sys.executable, "-m", "latprof", "analyze", url, "--since", str(start // 10**9), "--until", str(end // 10**9 + 1),
             "--format", "json"],
            capture_output=True, text=True, timeout=120, env={**os.environ, "LATPROF_CLICKHOUSE_PASSWORD": secret},
        )  # fmt: skip
        sent = list(server.queries)
    assert done.returncode == 0, done.stderr
    assert secret not in done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["source"]["inputs"] == [f"clickhouse://127.0.0.1:{server.port}/otel?table=otel_traces"]
    file_report = run_diagnosis([source_file]).report.to_dict()
    assert (report["verdict"]["layer"], report["verdict"]["rule"]) == (file_report["verdict"]["layer"], file_report["verdict"]["rule"])
    assert report["window"]["requests"] == file_report["window"]["requests"] and report["latency_ms"] == file_report["latency_ms"]
    schema = clickhouse_sql.Schema("otel", "otel_traces", True, "otel_traces_trace_id_ts")
    ours = [text.removesuffix("\n FORMAT JSONCompactEachRow") for text, _ in sent if text.endswith("FORMAT JSONCompactEachRow")]
    assert ours == [clickhouse_sql.columns_sql(), clickhouse_sql.table_exists_sql(), clickhouse_sql.stats_sql(schema),
                    clickhouse_sql.pick_sql(schema), clickhouse_sql.spans_sql(schema)]  # fmt: skip
    bound = [params for text, params in sent if text.startswith(clickhouse_sql.stats_sql(schema))]
    assert bound and bound[0]["service"] == "" and int(bound[0]["since_ns"]) == start // 10**9 * 10**9


def test_a_password_in_the_url_is_warned_about_and_never_shown(session: Any) -> None:
    pytest.importorskip("clickhouse_connect")
    import os
    import subprocess
    import sys

    from clickhouse_http import ClickHouseHttp

    ExporterTables(session)
    with ClickHouseHttp(session) as server:
        done = subprocess.run([sys.executable, "-m", "latprof", "analyze", f"clickhouse://me:hunter2@127.0.0.1:{server.port}/otel",
                               "--since", "1h"], capture_output=True, text=True, timeout=120, env=dict(os.environ))  # fmt: skip
    assert done.returncode == 2 and "hunter2" not in done.stdout + done.stderr
    assert "the URL holds a password" in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("latprof: error: clickhouse://127.0.0.1:") and "no request" in done.stderr


def test_no_server_at_the_url_is_one_line_and_exit_2() -> None:
    pytest.importorskip("clickhouse_connect")
    import socket
    import subprocess
    import sys

    with socket.socket() as probe:  # a port nothing listens on: bound, never listened to
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "latprof", "analyze", f"clickhouse://127.0.0.1:{port}/otel", "--since", "1h"],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip() == f"latprof: error: clickhouse://127.0.0.1:{port}/otel: cannot connect: connection refused"


def test_the_exporters_json_typed_table_is_refused_by_name(session: Any) -> None:
    """The exporter's `json: true` variant keeps attributes as JSON, which latprof's queries do not read by key yet."""
    session.query("CREATE DATABASE IF NOT EXISTS otel")
    ddl = (Path(__file__).parent / "fixtures" / "clickhouse" / "traces_table.sql").read_text()
    ddl = ddl.replace("SpanAttributes Map(LowCardinality(String), String)", "SpanAttributes JSON")
    ddl = "\n".join(line for line in ddl.splitlines() if "SpanAttribute" not in line or "JSON" in line)  # its Map-only indexes
    session.query(ddl.format(database="otel", table="otel_traces_json", ttl_days=3))
    tables = ExporterTables(session)
    source = tables.source(ChdbRunner(session), 1, 2)
    source.target = dataclasses.replace(source.target, table="otel_traces_json")
    with pytest.raises(InputError, match="keeps SpanAttributes as JSON"):
        source.read()


@pytest.mark.slow  # records a real service
def test_check_and_diff_read_ranges_of_the_table(recording: Callable[..., Path], session: Any) -> None:
    """`latprof check` gates on the table's range as on the file; `latprof diff` compares two ranges of one table, each in its URL."""
    pytest.importorskip("clickhouse_connect")
    import json
    import subprocess
    import sys

    from clickhouse_http import ClickHouseHttp

    source_file = recording("pool_held", "sqlalchemy")
    tables = ExporterTables(session)
    tables.load(read_otlp_json(source_file).spans)
    start, end = _span_range(source_file)
    first, last, middle = start // 10**9, end // 10**9 + 1, (start + end) // 2 // 10**9

    def latprof(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "latprof", *args], capture_output=True, text=True, timeout=120)

    with ClickHouseHttp(session) as server:
        url = f"clickhouse://127.0.0.1:{server.port}/otel?table=otel_traces"
        checked = latprof("check", url, "--since", str(first), "--until", str(last), "--format", "json")
        on_file = latprof("check", str(source_file), "--format", "json")
        diffed = latprof("diff", f"{url}&since={first}&until={middle}", f"{url}&since={middle}&until={last}", "--format", "json")
    assert checked.returncode == on_file.returncode == 1, checked.stderr  # db-pool-exhaustion fails its check on both
    failed = sorted(c["id"] for c in json.loads(checked.stdout)["checks"] if c["failed"])
    assert failed == sorted(c["id"] for c in json.loads(on_file.stdout)["checks"] if c["failed"])
    assert "rule.db-pool-exhaustion" in failed
    assert json.loads(checked.stdout)["inputs"] == [url]
    assert diffed.returncode == 0, diffed.stderr
    both = json.loads(diffed.stdout)
    assert both["before"]["input"] == f"{url}&since={first}&until={middle}" and both["after"]["input"].endswith(f"since={middle}&until={last}")


@pytest.mark.slow  # records a real service
def test_service_and_route_pick_the_requests_latprof_names_so(recording: Callable[..., Path], session: Any) -> None:
    """--route matches the route the report names (`GET /chat`: method and http.route), --service the root's service."""
    from collections import Counter

    from latprof.collectors.traces.tracemap import route_of

    source_file = recording("sequential_tools")
    spans = read_otlp_json(source_file).spans
    tables = ExporterTables(session)
    tables.load(spans)
    start, end = _span_range(source_file)
    roots = [s for s in spans if s.parent_id is None]
    routes, services = Counter(route_of(s) for s in roots), Counter(s.service for s in roots)
    route, count = routes.most_common(1)[0]
    assert " /" in route  # a method and a route template, as the report names it
    assert tables.source(ChdbRunner(session), start - 1, end + 1, route=route, sample_requests=10**6).read().requests == count
    [(service, all_roots)] = services.items()
    assert tables.source(ChdbRunner(session), start - 1, end + 1, service=service).read().requests == all_roots == len(roots)
    with pytest.raises(InputError, match=f"no request \\(root span\\) of service 'other' of route {route!r}"):
        tables.source(ChdbRunner(session), start - 1, end + 1, service="other", route=route).read()
