"""Benchmark `latprof analyze clickhouse://...`: what each query reads in ClickHouse and what latprof does with the answer.

    python benchmarks/bench_clickhouse.py [--spans 1000000 10000000] [--dir PATH]

For each size, ClickHouse's engine in-process (chdb: `pip install 'latprof[test-clickhouse]'`)
creates the OpenTelemetry Collector ClickHouse exporter's table (its DDL from
tests/collectors/traces/fixtures/clickhouse) and fills it with synthetic traces made by SQL in
the engine (10 spans a trace over the last hour: a FastAPI-like root, a SQLAlchemy pool connect,
three statements, an LLM call over HTTP, four spans of the app's own code; 2% of the requests wait
0.5-1.5 s for a connection). Then, in a fresh process per size, latprof's source reads the hour
(`run_diagnosis`) through a runner that records each query's time and what the engine read
(`storage_rows_read`, `storage_bytes_read`) and returned. A documented run, not in CI: the
numbers are in docs/clickhouse.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DDL = ROOT / "tests" / "collectors" / "traces" / "fixtures" / "clickhouse" / "traces_table.sql"

#: One trace per number: 10 spans (ARRAY JOIN over their index i), times in ns from the hour's start.
FILL = """
INSERT INTO otel.otel_traces (Timestamp, TraceId, SpanId, ParentSpanId, TraceState, SpanName, SpanKind, ServiceName,
    ResourceAttributes, ScopeName, ScopeVersion, SpanAttributes, Duration, StatusCode, StatusMessage)
SELECT
    fromUnixTimestamp64Nano(toInt64(start + offs[i])), trace, leftPad(lower(hex(cityHash64(t, i))), 16, '0'),
    if(i = 1, '', leftPad(lower(hex(cityHash64(t, 1))), 16, '0')), '',
    ['GET /chat', 'connect', 'SELECT messages', 'SELECT users', 'INSERT messages', 'POST', 'render', 'tokenize',
     'serialize', 'log'][i],
    ['Server', 'Client', 'Client', 'Client', 'Client', 'Client', 'Internal', 'Internal', 'Internal', 'Internal'][i],
    'chat-api', map('service.name', 'chat-api', 'service.instance.id', concat('chat-api-', toString(t % 4))),
    ['opentelemetry.instrumentation.fastapi', 'opentelemetry.instrumentation.sqlalchemy',
     'opentelemetry.instrumentation.sqlalchemy', 'opentelemetry.instrumentation.sqlalchemy',
     'opentelemetry.instrumentation.sqlalchemy', 'opentelemetry.instrumentation.httpx', 'app', 'app', 'app', 'app'][i], '',
    [map('http.route', '/chat', 'http.request.method', 'GET', 'http.response.status_code', '200'),
     map('db.system.name', 'postgresql', 'db.namespace', 'app'),
     map('db.system.name', 'postgresql', 'db.query.text', 'SELECT role, content FROM messages WHERE conversation_id = %(cid)s'),
     map('db.system.name', 'postgresql', 'db.query.text', 'SELECT name FROM users WHERE id = %(uid)s'),
     map('db.system.name', 'postgresql', 'db.query.text', 'INSERT INTO messages VALUES (%(cid)s, %(role)s, %(content)s)'),
     map('http.request.method', 'POST', 'url.full', 'https://api.openai.com/v1/chat/completions',
         'server.address', 'api.openai.com', 'http.response.status_code', '200'),
     map('code.function', 'render'), map('code.function', 'tokenize'), map('code.function', 'serialize'),
     map('code.function', 'log')][i],
    durs[i], 'Unset', ''
FROM (
    SELECT t, trace, start, w, llm,
        [w + llm + 14000000, w, 2000000, 3000000, 4000000, llm, 500000, 600000, 700000, 800000] AS durs,
        [0, 1000000, w + 1000000, w + 3100000, w + 6200000, w + 10300000, w + llm + 10400000, w + llm + 11000000,
         w + llm + 11700000, w + llm + 12500000] AS offs
    FROM (
        SELECT number AS t,
            concat(leftPad(lower(hex(cityHash64(t, 101))), 16, '0'), leftPad(lower(hex(cityHash64(t, 102))), 16, '0')) AS trace,
            {t0:Int64} + toInt64(t) * {step:Int64} AS start,
            if(cityHash64(t, 7) % 100 < 2, 500000000 + cityHash64(t, 8) % 1000000000, 200000 + cityHash64(t, 8) % 800000) AS w,
            120000000 + cityHash64(t, 9) % 60000000 AS llm
        FROM numbers({traces:UInt64})
    )
)
ARRAY JOIN arrayEnumerate(durs) AS i
"""

def fill(path: Path, spans: int) -> tuple[int, float]:
    """Create the exporter's table under `path` and fill it with `spans` spans over the last hour; (the hour's start, s taken)."""
    from chdb import session

    sess = session.Session(str(path))
    sess.query("CREATE DATABASE IF NOT EXISTS otel")
    sess.query(DDL.read_text().format(database="otel", table="otel_traces", ttl_days=3))
    traces = spans // 10
    t0 = (time.time_ns() - 3600 * 10**9) // 10**9 * 10**9
    start = time.perf_counter()
    sess.query(FILL, params={"t0": t0, "step": 3600 * 10**9 // traces - 1, "traces": traces})
    sess.query("OPTIMIZE TABLE otel.otel_traces FINAL")
    took = time.perf_counter() - start
    sess.close()
    return t0, took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--dir", type=Path, help="where the tables go (default: a temporary directory)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "tests" / "collectors" / "traces"))
    from chdb import session
    from clickhouse_http import ClickHouseHttp

    base = args.dir or Path(tempfile.mkdtemp(prefix="latprof-bench-clickhouse-"))
    for spans in args.spans:
        path = base / f"chdb-{spans}"
        t0, took = fill(path, spans)
        sess = session.Session(str(path))
        with ClickHouseHttp(sess) as server:
            url = f"clickhouse://127.0.0.1:{server.port}/otel?table=otel_traces"
            start = time.perf_counter()
            # through /usr/bin/time: a child forked from this process (the engine's gigabyte) would count it in its peak
            done = subprocess.run(["/usr/bin/time", "-f", "%M %U %S", sys.executable, "-m", "latprof", "analyze", url, "--since",
                                   str(t0 // 10**9), "--until", str(t0 // 10**9 + 3600), "--format", "json"],
                                  capture_output=True, text=True, cwd=ROOT)  # fmt: skip
            wall = time.perf_counter() - start
            queries, costs = list(server.queries), list(server.costs)
        sess.close()
        if done.returncode != 0:
            sys.exit(done.stderr)
        report = json.loads(done.stdout)
        peak_kib, user_s, system_s = done.stderr.strip().splitlines()[-1].split()
        in_engine = sum(c["s"] for c in costs)
        print(f"\n{spans:,} spans ({spans // 10:,} requests over an hour; filled in {took:.1f} s)")
        print(f"  latprof analyze over HTTP: {wall:.2f} s end to end ({in_engine:.2f} s of it in ClickHouse),"
              f" latprof's peak RSS {int(peak_kib) // 1024} MiB, its CPU {float(user_s) + float(system_s):.2f} s;"
              f" {report['window']['requests']:,} requests, p99 {report['latency_ms']['p99']} ms,"
              f" verdict {report['verdict']['layer']} ({report['verdict']['rule']})")  # fmt: skip
        ours = [(text, cost) for (text, _), cost in zip(queries, costs) if text.endswith("FORMAT JSONCompactEachRow")]
        for text, cost in ours:
            print(f"  {text.split(' FROM ')[0][:40]:<42} {cost['s']:>6.2f} s  read {cost['rows_read']:>11,} rows"
                  f" {cost['bytes_read'] / 2**20:>8.1f} MiB  back {cost['rows_back']:>9,} rows {cost['bytes_back'] / 2**20:>7.1f} MiB")
    print(f"\n(tables in {base})")


if __name__ == "__main__":
    main()
