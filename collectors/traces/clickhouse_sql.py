"""The SQL latprof sends to ClickHouse: one text per question, whichever client carries it.

Every query reads the table the OpenTelemetry Collector's ClickHouse exporter creates
(`otel_traces`: its `traces_table.sql` template in opentelemetry-collector-contrib,
`exporter/clickhouseexporter`), and tolerates its older variants: `Duration` signed (`Int64`) or
not, the scope's name in a `ScopeName` column or (before it) in `SpanAttributes['otel.scope.name']`.

What runs in ClickHouse:

1. `stats_sql`: the requests (root spans: no `ParentSpanId`) in the time range, of one service
   and route when asked, counted, with the p40, p60 and p95 of their durations (exact quantiles)
   and the longest.
2. `pick_sql`: which of those requests come back, each with the number of requests it stands for
   (its weight): the tail (at or above p95), the median cohort (p40-p60) and the requests at or
   above their one-second window's p99, each read whole unless it is larger than the cap (then
   one in k, by the hash of the trace id); of the others one in k.
3. `spans_sql`: every span of the picked traces (the pick again as a subquery: no list of ids
   travels), in the time range the roots leave for their spans, or the range the exporter's
   trace-id/timestamp lookup table (`<table>_trace_id_ts`) gives them when it is there.

Values - times, service, route, quantiles, rates - are query parameters (`{name:Type}`, bound by
the server), never pasted into the text; the database and table names, which cannot be bound
everywhere, are checked to be plain identifiers (`identifier`) and quoted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: A database or table name latprof will put in a query: letters, digits and underscores, not starting with a digit.
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")

#: The columns every variant of the exporter's table has, that latprof reads.
REQUIRED_COLUMNS = (
    "Timestamp", "TraceId", "SpanId", "ParentSpanId", "SpanName", "SpanKind", "ServiceName", "ResourceAttributes",
    "SpanAttributes", "Duration", "StatusCode", "Events.Timestamp", "Events.Name", "Events.Attributes", "Links.TraceId",
    "Links.SpanId",
)  # fmt: skip

#: How far before the time range (and after it, past the longest request) a picked trace's spans are looked for when
#: there is no lookup table: another service's clock may be that far off.
SKEW_NS = 60_000_000_000


def identifier(name: str) -> str:
    """`name` quoted for a query; ValueError unless it is a plain identifier (letters, digits, underscores)."""
    if not _IDENTIFIER.fullmatch(name):
        raise ValueError(name)
    return f"`{name}`"


@dataclass(frozen=True)
class Schema:
    """What latprof found of the table: its database and name, whether the scope has a column of its own,
    and the lookup table beside it (None when absent)."""

    database: str
    table: str
    scope_column: bool = True
    lookup_table: str | None = None

    @property
    def qualified(self) -> str:
        return f"{identifier(self.database)}.{identifier(self.table)}"


#: The route latprof gives a request (`tracemap.route_of`): `METHOD route` when the root span has an `http.route`
#: (the method from `http.request.method`, or the older `http.method`), the route alone without a method, else the span's name.
_METHOD = "if(SpanAttributes['http.request.method'] != '', SpanAttributes['http.request.method'], SpanAttributes['http.method'])"
ROUTE = (
    f"multiIf(SpanAttributes['http.route'] = '', SpanName, {_METHOD} = '', SpanAttributes['http.route'],"
    f" concat({_METHOD}, ' ', SpanAttributes['http.route']))"
)

#: The requests asked about: root spans in [since, until), of the service and route when given ('' for any).
ROOTS = (
    "ParentSpanId = ''"
    " AND Timestamp >= fromUnixTimestamp64Nano({since_ns:Int64}) AND Timestamp < fromUnixTimestamp64Nano({until_ns:Int64})"
    " AND ({service:String} = '' OR ServiceName = {service:String})"
    f" AND ({{route:String}} = '' OR {ROUTE} = {{route:String}})"
)


def columns_sql() -> str:
    """The table's columns (name, type); parameters `database`, `table`."""
    return "SELECT name, type FROM system.columns WHERE database = {database:String} AND table = {table:String} ORDER BY position"


def table_exists_sql() -> str:
    """1 when the table exists; parameters `database`, `table`."""
    return "SELECT count() FROM system.tables WHERE database = {database:String} AND name = {table:String}"


def stats_sql(schema: Schema) -> str:
    """One row: the requests counted, their duration's p40, p60 and p95 (ns, exact) and the longest; parameters `ROOTS`'s."""
    return (
        "SELECT count(), quantilesExact(0.4, 0.6, 0.95)(toInt64(Duration)), max(toInt64(Duration))"
        f" FROM {schema.qualified} WHERE {ROOTS}"
    )


def pick_sql(schema: Schema) -> str:
    """The picked requests' trace ids and weights; parameters `ROOTS`'s and `p40`, `p60`, `p95` (ns) and the
    rates `k_tail`, `k_median`, `k_window`, `k_other` (1: read whole; k: one in k, each standing for k)."""
    return (
        "SELECT TraceId, weight FROM ("
        " SELECT TraceId, multiIf(d >= {p95:Int64}, {k_tail:UInt64}, d >= {p40:Int64} AND d <= {p60:Int64}, {k_median:UInt64},"
        " d >= window_p99, {k_window:UInt64}, {k_other:UInt64}) AS weight"
        " FROM ("
        "  SELECT TraceId, toInt64(Duration) AS d,"
        "   quantileExact(0.99)(toInt64(Duration)) OVER (PARTITION BY toStartOfSecond(Timestamp)) AS window_p99"
        f"  FROM {schema.qualified} WHERE {ROOTS}"
        " )"
        ") WHERE cityHash64(TraceId) % weight = 0"
    )


def spans_sql(schema: Schema) -> str:
    """Every span of the picked traces (`pick_sql`'s parameters, and `longest_ns`: the longest request's duration)."""
    scope = "ScopeName" if schema.scope_column else "SpanAttributes['otel.scope.name']"
    picked = f"SELECT TraceId FROM ({pick_sql(schema)})"
    if schema.lookup_table is not None:  # the exporter's trace-id/timestamp table: each picked trace's first and last span
        lookup = f"{identifier(schema.database)}.{identifier(schema.lookup_table)}"
        within = (
            f" AND Timestamp >= (SELECT toDateTime64(min(Start), 9) FROM {lookup} WHERE TraceId IN ({picked}))"
            f" AND Timestamp <= (SELECT toDateTime64(max(End), 9) + INTERVAL 1 SECOND FROM {lookup} WHERE TraceId IN ({picked}))"
        )
    else:
        within = (
            f" AND Timestamp >= fromUnixTimestamp64Nano({{since_ns:Int64}} - {SKEW_NS})"
            f" AND Timestamp <= fromUnixTimestamp64Nano({{until_ns:Int64}} + {{longest_ns:Int64}} + {SKEW_NS})"
        )
    return (
        "SELECT toUnixTimestamp64Nano(Timestamp), TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName,"
        f" ResourceAttributes, {scope}, SpanAttributes, toInt64(Duration), StatusCode,"
        " arrayMap(t -> toUnixTimestamp64Nano(t), `Events.Timestamp`), `Events.Name`, `Events.Attributes`,"
        " `Links.TraceId`, `Links.SpanId`"
        f" FROM {schema.qualified} WHERE TraceId IN ({picked}){within}"
    )
