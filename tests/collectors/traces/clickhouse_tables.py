"""ClickHouse's own engine in-process (chdb) holding spans in the exporter's tables, for the ClickHouse reader's tests.

`ExporterTables` creates the OpenTelemetry Collector ClickHouse exporter's table (its DDL as the
exporter renders it: fixtures/clickhouse) in a chdb session and loads spans into it the way the
exporter writes them: every attribute as text (pcommon's `AsString`), the kind and status as names,
the scope in its column (or, in the first variant, among the attributes). `ChdbRunner` carries
latprof's queries - the very texts `latprof.collectors.traces.clickhouse_sql` builds, the ones
clickhouse-connect sends - to that session.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Mapping

from latprof.collectors.traces.clickhouse import ClickHouseSource, Selection, Target
from latprof.collectors.traces.spans import Span

FIXTURES = Path(__file__).parent / "fixtures" / "clickhouse"
_KINDS = {0: "Unspecified", 1: "Internal", 2: "Server", 3: "Client", 4: "Producer", 5: "Consumer"}
_STATUSES = {0: "Unset", 1: "Ok", 2: "Error"}


class ChdbRunner:
    """latprof's `Runner` over a chdb session: each query's text and parameters as given, bound by the engine."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.texts: list[str] = []

    def query(self, text: str, params: Mapping[str, Any]) -> list[bytes]:
        self.texts.append(text)
        return [self.session.query(text, "JSONCompactEachRow", params=dict(params)).bytes()]


def as_text(value: Any) -> str:
    """An attribute value as the exporter's maps hold it (pcommon `Value.AsString`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _ts(ns: int) -> str:
    return f"{ns // 1_000_000_000}.{ns % 1_000_000_000:09d}"


class ExporterTables:
    """The exporter's table `database.table` in a chdb session (`variant` "current" or "v0"; `lookup`: its trace-id
    lookup table and view too), and loading spans into it."""

    def __init__(self, session: Any, database: str = "otel", table: str = "otel_traces", *, variant: str = "current",
                 lookup: bool = False, ttl_days: int = 3) -> None:  # fmt: skip
        self.session, self.database, self.table, self.variant = session, database, table, variant
        session.query(f"CREATE DATABASE IF NOT EXISTS {database}")
        ddl = (FIXTURES / ("traces_table.sql" if variant == "current" else "traces_table_v0.sql")).read_text()
        session.query(ddl.format(database=database, table=table, ttl_days=ttl_days))
        if lookup:
            for statement in (FIXTURES / "trace_id_ts.sql").read_text().split(";\n"):
                if statement.strip():
                    session.query(statement.format(database=database, table=table, ttl_days=ttl_days))

    def row(self, span: Span, shift_ns: int = 0) -> dict[str, Any]:
        attrs = {k: as_text(v) for k, v in span.attrs.items()}
        current = self.variant == "current"
        if not current and span.scope:
            attrs["otel.scope.name"] = span.scope
        row: dict[str, Any] = {
            "Timestamp": _ts(span.start_ns + shift_ns), "TraceId": span.trace_id, "SpanId": span.span_id,
            "ParentSpanId": span.parent_id or "", "TraceState": "", "SpanName": span.name,
            "SpanKind": _KINDS[span.kind] if current else f"SPAN_KIND_{_KINDS[span.kind].upper()}",
            "ServiceName": span.service, "ResourceAttributes": {k: as_text(v) for k, v in span.resource.items()},
            "SpanAttributes": attrs, "Duration": span.end_ns - span.start_ns,
            "StatusCode": _STATUSES[span.status_code] if current else f"STATUS_CODE_{_STATUSES[span.status_code].upper()}",
            "StatusMessage": "", "Events.Timestamp": [_ts(e.ts_ns + shift_ns) for e in span.events],
            "Events.Name": [e.name for e in span.events], "Events.Attributes": [{k: as_text(v) for k, v in e.attrs.items()} for e in span.events],
            "Links.TraceId": [link.trace_id for link in span.links], "Links.SpanId": [link.span_id for link in span.links],
            "Links.TraceState": ["" for _ in span.links], "Links.Attributes": [{} for _ in span.links],
        }  # fmt: skip
        if current:
            row["ScopeName"], row["ScopeVersion"] = span.scope, ""
        return row

    def load(self, spans: Iterable[Span], shift_ns: int = 0, batch: int = 5000) -> int:
        """Insert `spans` (each moved by `shift_ns`) as the exporter would; how many."""
        rows = [json.dumps(self.row(span, shift_ns)) for span in spans]
        for at in range(0, len(rows), batch):
            self.session.query(f"INSERT INTO {self.database}.{self.table} FORMAT JSONEachRow\n" + "\n".join(rows[at : at + batch]))
        return len(rows)

    def count(self) -> int:
        return int(self.session.query(f"SELECT count() FROM {self.database}.{self.table}", "CSV").bytes())

    def source(self, runner: ChdbRunner, since_ns: int, until_ns: int, *, service: str = "", route: str = "",
               sample_requests: int = 10_000, cohort_cap: int = 20_000) -> ClickHouseSource:  # fmt: skip
        """latprof's source for this table, its queries carried by `runner`."""
        shown = f"clickhouse://127.0.0.1:8123/{self.database}?table={self.table}"
        target = Target("clickhouse", "127.0.0.1", 8123, self.database, self.table, shown=shown)
        return ClickHouseSource(target, Selection(since_ns, until_ns, service, route), sample_requests=sample_requests,
                                cohort_cap=cohort_cap, runner=lambda _: runner)  # fmt: skip
