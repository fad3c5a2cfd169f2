"""Read the spans a team keeps in ClickHouse, where the OpenTelemetry Collector's ClickHouse exporter writes them.

`latprof analyze 'clickhouse://HOST:8123/DB?table=otel_traces' --since 1h` asks ClickHouse the
questions (`latprof.collectors.traces.clickhouse_sql`: the requests' count and duration
quantiles, which requests to bring back) and reads back only the spans of the requests picked,
as `Span`s: from there they are mapped, inferred and judged as spans read from a file.

- A small range (up to about `sample_requests / (MAX_READ_SHARE - 0.25)` requests) comes back
  whole. A larger one comes back cohort-first: the tail (p95 and up), the median cohort (p40 to p60)
  and each one-second window's p99 and up, whole unless larger than `cohort_cap`, and a sample of
  about `sample_requests` of the others; each request picked one in k carries
  `latprof.sample_weight` k on its root, so the analysis weighs it as the k requests it stands for.
- The exporter's maps hold every attribute as text: the numeric attributes latprof reads (status
  codes, ports, token counts) are read back as numbers, as from Zipkin.
- Credentials come from the environment (`LATPROF_CLICKHOUSE_USER`, `LATPROF_CLICKHOUSE_PASSWORD`,
  else `CLICKHOUSE_USER`, `CLICKHOUSE_PASSWORD`); a password in the URL works but is warned about
  (it shows in `ps` and in shell history) and is never printed: the report names the URL without it.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

import orjson

from latprof.collectors.traces import clickhouse_sql as sql
from latprof.collectors.traces._tracefile import FLOAT_ATTRIBUTES, HEX, INT_ATTRIBUTES, ZERO_SPAN_ID, ZERO_TRACE_ID, ReaderState, number_attribute
from latprof.collectors.traces.spans import KIND_NAMES, STATUS_NAMES, STATUS_UNSET, KIND_UNSPECIFIED, Span, SpanEvent, SpanLink
from latprof.errors import InputError
from latprof.events import NO_ATTRS
from latprof.semconv import SAMPLE_WEIGHT

SCHEMES = ("clickhouse", "clickhouses")  # clickhouses: over HTTPS
DEFAULT_PORTS = {"clickhouse": 8123, "clickhouses": 8443}
DEFAULT_TABLE = "otel_traces"
#: `latprof.analysis.cohort_first`'s sample, cohort cap and the share above which everything is read (not imported:
#: the analysis imports the readers; a test holds them equal).
DEFAULT_SAMPLE_REQUESTS, DEFAULT_COHORT_CAP, MAX_READ_SHARE = 10_000, 20_000, 0.6
#: The shares of requests in the tail (p95 and up) and the median cohort (p40-p60).
_TAIL_SHARE, _MEDIAN_SHARE = 0.05, 0.20
_AGO = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h|d)")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
#: Distinct attribute maps shared per read (past it, forgotten: a table of all-distinct attributes pays little for it).
_MAX_SHARED_ATTRIBUTES = 1 << 16
_MAX_SHARED_IDS = 1 << 20
_SCOPE_KEYS = ("otel.scope.name", "otel.scope.version", "otel.library.name", "otel.library.version")


def is_clickhouse_url(text: object) -> bool:
    """Whether a command line input names a ClickHouse table (`clickhouse://` or `clickhouses://`), not a file."""
    return isinstance(text, str) and text.split("://", 1)[0].lower() in SCHEMES and "://" in text


def parse_time(text: str, now_ns: int) -> int:
    """A time given on the command line, in ns since the epoch: an age (`90s`, `30m`, `1h`, `2d`: that long before now),
    seconds since the epoch, or an ISO 8601 time (UTC unless it names its offset); ValueError for anything else."""
    text = text.strip()
    ago = _AGO.fullmatch(text)
    if ago:
        return now_ns - int(float(ago.group(1)) * _SECONDS[ago.group(2)] * 1e9)
    if re.fullmatch(r"\d{9,11}(\.\d+)?", text):
        return int(float(text) * 1e9)
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return int(parsed.timestamp()) * 1_000_000_000 + parsed.microsecond * 1000


@dataclass(frozen=True)
class Selection:
    """The requests asked about: their roots began in [since, until), of `service` and `route` ('' for any)."""

    since_ns: int
    until_ns: int
    service: str = ""
    route: str = ""

    def params(self) -> dict[str, Any]:
        return {"since_ns": self.since_ns, "until_ns": self.until_ns, "service": self.service, "route": self.route}


@dataclass(frozen=True)
class Target:
    """Where the spans are: the server, the database and table, and who asks (the password never shown)."""

    scheme: str
    host: str
    port: int
    database: str
    table: str
    username: str = "default"
    password: str = field(default="", repr=False)
    #: The URL as the report and messages show it: no password.
    shown: str = ""
    #: The time range and filters the URL itself gave (`since`, `until`, `service`, `route`).
    given: Mapping[str, str] = field(default_factory=dict)


def parse_url(url: str, env: Mapping[str, str] | None = None) -> tuple[Target, list[str]]:
    """The target named by `clickhouse://[USER@]HOST[:PORT]/DB?table=TABLE[&since=..&until=..&service=..&route=..]`
    and the warnings it gives (a password in the URL); `InputError` for one latprof cannot use."""
    env = os.environ if env is None else env
    warnings: list[str] = []
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port = None, None
    query = {key: values[-1] for key, values in parse_qs(parts.query, keep_blank_values=True).items()}
    unknown = sorted(set(query) - {"table", "since", "until", "service", "route"})
    shown = f"{scheme}://{host}{'' if parts.port is None else f':{parts.port}'}{parts.path}" + (f"?{parts.query}" if parts.query else "")
    if not host:
        raise InputError(f"{shown}: no host in the ClickHouse URL (clickhouse://HOST:8123/DATABASE?table=otel_traces)")
    if unknown:
        raise InputError(f"{shown}: unknown parameter(s) {', '.join(unknown)} (table, since, until, service and route are read)")
    database = unquote(parts.path.strip("/")) or "default"
    table = query.get("table") or DEFAULT_TABLE
    for what, name in (("database", database), ("table", table)):
        try:
            sql.identifier(name)
        except ValueError:
            raise InputError(f"{shown}: the {what} name {name!r} is not a plain identifier (letters, digits and underscores)") from None
    username = unquote(parts.username) if parts.username else env.get("LATPROF_CLICKHOUSE_USER") or env.get("CLICKHOUSE_USER") or "default"
    password = env.get("LATPROF_CLICKHOUSE_PASSWORD") or env.get("CLICKHOUSE_PASSWORD") or ""
    if parts.password:
        password = unquote(parts.password)
        warnings.append(
            f"{shown}: the URL holds a password, which shows in `ps` and in your shell's history;"
            " set LATPROF_CLICKHOUSE_PASSWORD instead"
        )
    given: dict[str, str] = {key: query[key] for key in ("since", "until", "service", "route") if key in query}
    return Target(scheme, host, port or DEFAULT_PORTS[scheme], database, table, username, password, shown, given), warnings


class Runner(Protocol):
    """What carries a query to ClickHouse and its answer back: the rows in `JSONCompactEachRow`, in chunks of bytes.
    `params` are bound by the server to the query's `{name:Type}` placeholders."""

    def query(self, text: str, params: Mapping[str, Any]) -> Iterable[bytes]: ...


class HttpRunner:
    """ClickHouse's HTTP interface through clickhouse-connect (`pip install 'latprof[clickhouse]'`)."""

    def __init__(self, target: Target) -> None:
        try:  # (imported by name: the `clickhouse` extra, absent from most environments mypy checks in)
            clickhouse_connect = importlib.import_module("clickhouse_connect")
        except ImportError:
            raise InputError(f"{target.shown}: reading ClickHouse needs clickhouse-connect: pip install 'latprof[clickhouse]'") from None
        self.shown = target.shown
        quiet = logging.getLogger("clickhouse_connect")  # its errors are said once, here, as one line
        if not quiet.handlers:
            quiet.addHandler(logging.NullHandler())
        quiet.propagate = False
        try:
            self.client = clickhouse_connect.get_client(
                host=target.host, port=target.port, username=target.username, password=target.password,
                database=target.database, secure=target.scheme == "clickhouses", connect_timeout=10,
            )  # fmt: skip
        except Exception as exc:  # its errors name the host, never the password
            raise InputError(f"{target.shown}: cannot connect: {_one_line(exc)}") from None

    def query(self, text: str, params: Mapping[str, Any]) -> Iterator[bytes]:
        try:
            with self.client.raw_stream(text, parameters=dict(params), fmt="JSONCompactEachRow") as stream:
                yield from stream
        except Exception as exc:
            raise InputError(f"{self.shown}: query failed: {_one_line(exc)}") from None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    for plain in ("Connection refused", "Name or service not known", "timed out", "Authentication failed"):
        if plain in text:
            return plain.lower()
    return (text[:300] + "...") if len(text) > 300 else text or type(exc).__name__


def rows(chunks: Iterable[bytes]) -> Iterator[list[Any]]:
    """The rows of a `JSONCompactEachRow` answer arriving in chunks (a row may straddle two); `InputError` for an
    answer that is not (a proxy's error page, a cut stream)."""
    rest = b""
    try:
        for chunk in chunks:
            lines = (rest + chunk).split(b"\n") if rest else chunk.split(b"\n")
            rest = lines.pop()
            for line in lines:
                if line:
                    yield orjson.loads(line)
        if rest.strip():
            yield orjson.loads(rest)
    except orjson.JSONDecodeError as exc:
        raise InputError(f"ClickHouse answered with something that is not JSONCompactEachRow rows ({exc})") from None


@dataclass
class ClickHouseRead:
    """The spans brought back, and what was said about them (`TraceRead`'s shape)."""

    spans: list[Span] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: Requests in the range, and requests brought back.
    requests: int = 0
    picked: int = 0


@dataclass
class ClickHouseSource:
    """A table of spans to read, the requests asked about, and how to reach it (`runner`: `HttpRunner` by default)."""

    target: Target
    selection: Selection
    sample_requests: int = DEFAULT_SAMPLE_REQUESTS
    cohort_cap: int = DEFAULT_COHORT_CAP
    #: Every request in the range comes back (`--exact`), however many.
    exact: bool = False
    runner: Callable[[Target], Runner] = HttpRunner
    warnings: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return self.target.shown

    def read(self) -> ClickHouseRead:
        return read_clickhouse(self)


def source_of(url: str, *, since: str | None = None, until: str | None = None, service: str | None = None,
              route: str | None = None, now_ns: int | None = None, env: Mapping[str, str] | None = None,
              sample_requests: int = DEFAULT_SAMPLE_REQUESTS, exact: bool = False) -> ClickHouseSource:  # fmt: skip
    """The source a command line names: the URL, with the time range and filters the URL gives, else those given here
    (`--since` is required one way or the other; `--until` defaults to now)."""
    target, warnings = parse_url(url, env)
    now = time.time_ns() if now_ns is None else now_ns
    since = target.given.get("since", since)
    until = target.given.get("until", until)
    if since is None:
        raise InputError(f"{target.shown}: say which requests to read: --since (1h, 30m, an ISO 8601 time or epoch seconds)")
    times = []
    for what, text in (("since", since), ("until", until)):
        if text is None:
            times.append(now)
            continue
        try:
            times.append(parse_time(text, now))
        except ValueError:
            raise InputError(f"{target.shown}: --{what} {text!r} is not a time (1h, 30m, 2026-12-07T05:00:00Z, epoch seconds)") from None
    if times[0] >= times[1]:
        raise InputError(f"{target.shown}: --since must be before --until")
    selection = Selection(times[0], times[1], target.given.get("service", service or ""), target.given.get("route", route or ""))
    return ClickHouseSource(target, selection, sample_requests=sample_requests, exact=exact, warnings=warnings)


def inspect_table(runner: Runner, target: Target) -> sql.Schema:
    """The table's schema variant (`clickhouse_sql.Schema`); `InputError` when it is absent or is not the exporter's."""
    where = {"database": target.database, "table": target.table}
    columns = {name: kind for name, kind in rows(runner.query(sql.columns_sql(), where))}
    if not columns:
        raise InputError(f"{target.shown}: no table {target.database}.{target.table} (the Collector's ClickHouse exporter creates otel_traces)")
    missing = [name for name in sql.REQUIRED_COLUMNS if name not in columns]
    if missing:
        raise InputError(f"{target.shown}: {target.database}.{target.table} is not a table of the Collector's ClickHouse exporter:"
                         f" no column {', '.join(missing)}")  # fmt: skip
    typed = [name for name in ("SpanAttributes", "ResourceAttributes") if not columns[name].startswith("Map(")]
    if typed:  # the exporter's JSON-typed variant (`traces_json_table.sql`): its attributes are not read by key here yet
        raise InputError(f"{target.shown}: {target.database}.{target.table} keeps {' and '.join(typed)} as"
                         f" {columns[typed[0]]}, not the exporter's Map(LowCardinality(String), String): not read yet")  # fmt: skip
    lookup = f"{target.table}_trace_id_ts"
    found = [count for (count,) in rows(runner.query(sql.table_exists_sql(), {"database": target.database, "table": lookup}))]
    return sql.Schema(target.database, target.table, "ScopeName" in columns, lookup if found and int(found[0]) else None)


def rates(requests: int, sample_requests: int, cohort_cap: int, exact: bool = False) -> dict[str, int]:
    """The one-in-k rate of each stratum (`clickhouse_sql.pick_sql`): all 1 (everything) when `exact`, or when what a pick
    reads would be more than `MAX_READ_SHARE` of the requests."""
    if exact or (_TAIL_SHARE + _MEDIAN_SHARE) * requests + sample_requests > MAX_READ_SHARE * requests:
        return {"k_tail": 1, "k_median": 1, "k_window": 1, "k_other": 1}
    others = (1 - _TAIL_SHARE - _MEDIAN_SHARE) * requests
    return {
        "k_tail": max(1, math.ceil(_TAIL_SHARE * requests / cohort_cap)),
        "k_median": max(1, math.ceil(_MEDIAN_SHARE * requests / cohort_cap)),
        "k_window": max(1, math.ceil(0.01 * requests / cohort_cap)),
        "k_other": max(1, math.ceil(others / sample_requests)),
    }


def read_clickhouse(source: ClickHouseSource) -> ClickHouseRead:
    """The spans of the requests `source` picks (module docstring), read into `Span`s; `InputError` (one line) when the
    table cannot be read or holds no request in the range."""
    target, selection = source.target, source.selection
    runner = source.runner(target)
    schema = inspect_table(runner, target)
    params = selection.params()
    [(count, quantiles, longest)] = list(rows(runner.query(sql.stats_sql(schema), params)))
    requests = int(count)
    if requests == 0:
        what = "".join(f" of {k} {v!r}" for k, v in (("service", selection.service), ("route", selection.route)) if v)
        raise InputError(f"{target.shown}: no request (root span){what} between {_iso(selection.since_ns)} and {_iso(selection.until_ns)}")
    p40, p60, p95 = (int(q) for q in quantiles)
    params.update({"p40": p40, "p60": p60, "p95": p95, "longest_ns": int(longest), **rates(requests, source.sample_requests, source.cohort_cap, source.exact)})
    out = ClickHouseRead(warnings=list(source.warnings), requests=requests)
    weights = {trace_id: int(weight) for trace_id, weight in rows(runner.query(sql.pick_sql(schema), params))}
    out.picked = len(weights)
    reader = _SpanRows(target.shown)
    for row in rows(runner.query(sql.spans_sql(schema), params)):
        reader.add(row)
    out.spans = reader.spans
    sampled = {trace_id: w for trace_id, w in weights.items() if w > 1}
    if sampled:  # the roots of requests read one in k stand for k
        for i, span in enumerate(out.spans):
            if span[2] is None and span[0] in sampled:
                out.spans[i] = span._replace(attrs={**span[9], SAMPLE_WEIGHT: sampled[span[0]]})
        out.warnings.append(
            f"{target.shown}: {requests:,} requests between {_iso(selection.since_ns)} and {_iso(selection.until_ns)}; read"
            f" {out.picked:,} in ClickHouse's pick (the tail, the median cohort and each second's p99 whole or one in k,"
            f" one in {params['k_other']} of the others), each weighted by the requests it stands for"
        )
    out.warnings.extend(reader.skipped_lines(f"{target.shown}: "))
    if not out.spans:
        raise InputError(f"{target.shown}: {requests} request(s) in the range, but none of their spans could be read")
    return out


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class _SpanRows(ReaderState):
    """`spans_sql`'s rows made into `Span`s, with a file reader's shared strings and skip counts (`path`: the URL shown)."""

    def __init__(self, shown: str) -> None:
        super().__init__(shown)
        self.resources: dict[Any, Mapping[str, Any]] = {}
        self.by_text: dict[Any, dict[str, Any]] = {}
        self.ids: dict[str, str] = {}

    def add(self, row: list[Any]) -> None:
        try:
            (start, trace_id, span_id, parent_id, name, kind, service, resource, scope, attrs, duration, status,
             event_times, event_names, event_attrs, link_traces, link_spans) = row  # fmt: skip
            start, duration = int(start), int(duration)
        except (ValueError, TypeError):
            self._skip("row(s) not in the shape latprof asked for")
            return
        if not _hex(trace_id, 32) or trace_id == ZERO_TRACE_ID or not _hex(span_id, 16) or span_id == ZERO_SPAN_ID:
            self._skip("span(s) without a valid TraceId and SpanId")
            return
        if parent_id and not _hex(parent_id, 16):
            self._skip("span(s) with a ParentSpanId that is not 16 hex digits")
            return
        if start <= 0 or duration < 0:
            self._skip("span(s) with a negative Duration or no Timestamp")
            return
        shared = self.shared
        span_attrs = self._attributes(attrs)
        ids = self.ids  # a trace's id, and a parent's, one string for all the spans that name it
        if len(ids) > _MAX_SHARED_IDS:
            ids.clear()
        trace_id = ids.setdefault(trace_id, trace_id)
        if parent_id:
            parent_id = ids.setdefault(parent_id, parent_id)
        events = tuple(
            SpanEvent(shared.setdefault(ev_name, ev_name), int(ts), self._attributes(ev_attrs) or NO_ATTRS)
            for ts, ev_name, ev_attrs in zip(event_times, event_names, event_attrs)
        )
        links = tuple(SpanLink(t, s) for t, s in zip(link_traces, link_spans) if _hex(t, 32) and _hex(s, 16))
        self.spans.append(Span(
            trace_id, span_id, parent_id if parent_id and parent_id != ZERO_SPAN_ID else None, shared.setdefault(name, name),
            _kind(kind), start, start + duration, shared.setdefault(service, service), shared.setdefault(scope or "", scope or ""),
            span_attrs or NO_ATTRS, _status(status), events, links, self._resource(resource), 0,
        ))  # fmt: skip

    def _attributes(self, attrs: Any) -> dict[str, Any]:
        """The attributes read back (numbers where latprof reads numbers); spans of one kind from one place repeat
        theirs, so one dict per distinct map is shared by them (no one changes a span's attributes)."""
        if type(attrs) is not dict:
            return {}
        key = tuple(attrs.items())
        known = self.by_text.get(key)
        if known is not None:
            return known
        if len(self.by_text) >= _MAX_SHARED_ATTRIBUTES:
            self.by_text.clear()
        out = self._attributes_of(attrs)
        if any(name in out for name in _SCOPE_KEYS):  # the exporter before its ScopeName column kept the scope there
            out = {name: value for name, value in out.items() if name not in _SCOPE_KEYS}
        self.by_text[key] = out
        return out

    def _attributes_of(self, attrs: dict[str, Any]) -> dict[str, Any]:
        shared = self.shared
        out: dict[str, Any] = {}
        for key, value in attrs.items():
            if type(value) is str:
                value = number_attribute(key, value) if key in INT_ATTRIBUTES or key in FLOAT_ATTRIBUTES else shared.setdefault(value, value)
            out[shared.setdefault(key, key)] = value
        return out

    def _resource(self, resource: Any) -> Mapping[str, Any]:
        if type(resource) is not dict or not resource:
            return NO_ATTRS
        key = tuple(resource.items())
        found = self.resources.get(key)
        if found is None:
            found = self.resources[key] = self._attributes_of(resource)
        return found


def _hex(value: Any, width: int) -> bool:
    return type(value) is str and len(value) == width and not value.strip(HEX)


def _kind(text: Any) -> int:
    """`SpanKind` as the exporter writes it (`Server`; before, `SPAN_KIND_SERVER`)."""
    if type(text) is not str:
        return KIND_UNSPECIFIED
    return KIND_NAMES.get(text, KIND_NAMES.get(text.lower().removeprefix("span_kind_"), KIND_UNSPECIFIED))


def _status(text: Any) -> int:
    """`StatusCode` as the exporter writes it (`Error`; before, `STATUS_CODE_ERROR`)."""
    return STATUS_NAMES.get(text.upper(), STATUS_UNSET) if type(text) is str else STATUS_UNSET
