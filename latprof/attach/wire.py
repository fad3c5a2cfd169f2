"""What an asyncio service's loop, sockets and database backends say from outside, for attach mode.

A sampler sees only the coroutine running at that instant: every suspended task (a pool wait,
an awaited LLM stream) leaves no stack. Three signals in an attach capture still see them:

- **Loop state** (`event_loop.busy_share`, `event_loop.blocked_ms`: `attach_session.LoopWatch`):
  the share of its wait-channel readings in which a loop thread did anything but wait for
  events, and the intervals of at least 100 ms in which it never did. Held like that, every
  request in flight waits for the loop.
- **Socket census** (`census.*` gauges, per second: `collectors/attach/sockdiag.py`): requests in
  flight (received, not yet answered), connections still in the accept backlog, and per remote
  endpoint the established connections and how many are pending (a request sent, its answer
  not begun), receiving (an answer, a stream, in progress) or idle on the wire, and of those
  in flight how many have an answer sitting unread in the receive queue. A request whose
  answer sits unread waits for the process, not the endpoint: on an asyncio server, for the
  loop to get round to it (`event_loop`). Requests in
  flight that are neither at the database nor at another endpoint wait inside the process:
  for the loop, for a pool's connection, for a lock or semaphore — the wire does not say which.
  A pool keeps all its connections established whether they are busy or not, and a connection
  held across an LLM call is idle on the wire; so the census can conclude "requests wait
  beyond a stable ceiling of DB connections" (a pool, inferred), never "the pool is held".
- **Exchanges** (`census.outbound.first_byte_s`, `.stream_s`, `.exchanges`, `.streamed`, totals
  per HTTP endpoint: `sockdiag.Exchanges`): each request's wait for the first byte of its
  answer's last stream, and that stream. The endpoint that is the LLM provider (an LLM client
  in the process's stacks, and the only HTTP endpoint called or the only one that streamed) has
  its time on the wire split into `provider` (to the first token) and `model` (decoding) as its
  exchanges' was; any other endpoint's stays `tool`.
- **Database backends** (`db.backend.state_age_ms`, `--db DSN`: `collectors/attach/pg_activity.py`):
  the target's own PostgreSQL backends (matched by client port) and their state. Connections
  that sit `idle` or `idle in transaction` for long stretches while requests wait for one are
  held by requests doing something else, often the LLM call.

Each step is a pure function of the timeline (so `latprof analyze` of the capture agrees).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from latprof.layers import DB_POOL, DB_QUERY, EVENT_LOOP, HTTP_POOL, MODEL, PROVIDER, QUEUE, TOOL, UNATTRIBUTED
from latprof.analysis.timeline import Timeline
from latprof.collectors.attach.stacks import in_package

#: Remote ports of database and cache servers (the rest are outbound HTTP: providers, tools).
DB_PORTS = {5432: "postgresql", 3306: "mysql", 6379: "redis", 27017: "mongodb", 11211: "memcached", 1433: "mssql"}

#: A loop held at least this share of the time is saturated.
LOOP_SATURATED_SHARE = 0.5
#: Blocked intervals adding up to at least this share of the time are a blocked loop.
LOOP_BLOCKED_SHARE = 0.1
#: Requests waiting on nothing visible in at least this share of request time is a saturation the wire shows.
MIN_WAITING_SHARE = 0.25
#: DB connections at their peak in at least this share of the seconds are a stable ceiling.
STABLE_CEILING_SHARE = 0.8
#: A ceiling of DB connections is a pool in use only when they carried statements (a query sent
#: or an answer arriving) in at least this share of the seconds: a steady number of persistent
#: connections nobody uses is no pool requests wait for, however many requests wait.
MIN_DB_ACTIVE_SHARE = 0.5
#: An HTTP endpoint's ceiling is a connection limit only when its connections were this busy
#: (pending or receiving, on average, as a share of the ceiling): a client at its limit uses
#: every connection it may open.
HTTP_LIMIT_BUSY_SHARE = 0.8
#: Requests waiting on nothing visible are a saturation only when they have waited this long (the
#: median age of the requests in flight): a healthy handler awaiting its own short work is not.
MIN_WAITING_AGE_MS = 200.0
#: A backend idle (or idle in transaction) this long while requests wait for a connection is held.
HELD_MS = 100.0


@dataclass
class LoopState:
    """The event loop threads over the capture."""

    threads: int
    busy_share: float | None  # share of readings in which the loop was held (None: no readings)
    busy_by_second: dict[int, float]
    blocked_ms: list[float]
    seconds: float

    @property
    def blocked_share(self) -> float:
        return sum(self.blocked_ms) / 1000 / (self.seconds * max(1, self.threads)) if self.seconds else 0.0

    @property
    def held(self) -> bool:
        """Saturated (held most of the time) or blocked (long intervals add up)."""
        return self.held_at(LOOP_SATURATED_SHARE, LOOP_BLOCKED_SHARE)

    def held_at(self, min_busy_share: float, min_blocked_share: float) -> bool:
        """Held at least `min_busy_share` of the time, or blocked in intervals adding up to `min_blocked_share` of it."""
        return (self.busy_share or 0.0) >= min_busy_share or (self.blocked_share >= min_blocked_share and bool(self.blocked_ms))

    def evidence(self) -> dict[str, Any]:
        return {
            "loop_threads": self.threads,
            "loop_busy_share": None if self.busy_share is None else round(self.busy_share, 4),
            "loop_busy_share_by_second": [round(v, 3) for _, v in sorted(self.busy_by_second.items())],
            "blocked_intervals": len(self.blocked_ms),
            "blocked_ms_longest": max(self.blocked_ms, default=0.0),
            "blocked_share": round(self.blocked_share, 4),
        }


def loop_state(timeline: Timeline, threads: int, seconds: float) -> LoopState:
    """The loop threads' busy share (over all their readings, and per second) and blocked intervals."""
    busy = readings = 0.0
    by_second: dict[int, list[float]] = {}
    for g in timeline.gauges.get("event_loop.busy_share", ()):
        n = float(g.attrs.get("latprof.readings", 1) or 1)
        busy += g.value * n
        readings += n
        by_second.setdefault(g.ts_ns // 1_000_000_000, []).append(g.value)
    blocked = [float(g.value) for g in timeline.gauges.get("event_loop.blocked_ms", ())]
    return LoopState(
        threads, busy / readings if readings else None, {s: sum(v) / len(v) for s, v in by_second.items()}, blocked,
        seconds,
    )  # fmt: skip


@dataclass
class Endpoint:
    """One remote endpoint over the capture: the mean and peak of its connections' wire states."""

    address: str
    port: int
    kind: str  # "postgresql", "redis", ... or "http"
    established: dict[int, float] = field(default_factory=dict)  # second -> connections
    pending: dict[int, float] = field(default_factory=dict)
    receiving: dict[int, float] = field(default_factory=dict)
    #: connections whose answer sits unread in the receive queue (the process is behind)
    unread: dict[int, float] = field(default_factory=dict)
    #: its exchanges over the capture (`sockdiag.Exchanges`): seconds waiting for the first byte
    #: of each answer's last stream, seconds of those streams, exchanges, of them streamed
    first_byte_s: float = 0.0
    stream_s: float = 0.0
    exchanges: int = 0
    streamed: int = 0

    @property
    def db(self) -> bool:
        return self.kind != "http"

    @property
    def ceiling(self) -> int:
        """The most connections open at once (per-second means, rounded)."""
        return round(max(self.established.values(), default=0.0))

    def busy(self, second: int) -> float:
        """Connections carrying something that second: a request sent (pending) or an answer arriving."""
        return self.pending.get(second, 0.0) + self.receiving.get(second, 0.0)

    def summary(self, seconds: list[int]) -> dict[str, Any]:
        def mean(d: dict[int, float]) -> float:
            return round(sum(d.get(s, 0.0) for s in seconds) / len(seconds), 2) if seconds else 0.0

        out = {
            "kind": self.kind, "established_mean": mean(self.established),
            "established_peak": max(self.established.values(), default=0.0),
            "pending_mean": mean(self.pending), "receiving_mean": mean(self.receiving), "unread_mean": mean(self.unread),
        }  # fmt: skip
        if self.exchanges:
            out |= {"exchanges": self.exchanges, "streamed": self.streamed, "first_byte_s": round(self.first_byte_s, 3),
                    "stream_s": round(self.stream_s, 3)}  # fmt: skip
        return out

    @property
    def first_byte_share(self) -> float | None:
        """Of its exchanges' time, the share spent waiting for the first byte of the answer's stream."""
        total = self.first_byte_s + self.stream_s
        return self.first_byte_s / total if total > 0 else None


@dataclass
class WireState:
    """The socket census over the capture, and what it lets conclude."""

    seconds: list[int]
    in_flight: dict[int, float]
    backlog: dict[int, float]
    endpoints: dict[str, Endpoint]
    #: request-seconds per layer: at the DB (db.query), at other endpoints (tool), in the backlog
    #: (queue), held up by the loop (event_loop), waiting on nothing visible (db.pool when a
    #: pool's ceiling explains it, else unattributed)
    request_s: dict[str, float] = field(default_factory=dict)
    waiting_s: float = 0.0
    db_ceiling: int = 0
    db_ceiling_share: float = 0.0
    #: share of the seconds in which the DB connections carried statements (pending or receiving)
    db_active_share: float = 0.0
    pool_inferred: bool = False
    #: the outbound HTTP endpoint ("address:port") whose stable, busy ceiling of connections the
    #: requests waiting in the process most likely wait behind (a client's connection limit), or None
    http_limited: str | None = None
    #: the median over the seconds of the median time the requests in flight had waited so far
    in_flight_age_ms: float | None = None
    #: the LLM provider's endpoint ("address:port"), recognised as `llm_recognised_by` says: its
    #: requests' time on the wire is `provider` until the first byte of the stream, `model` after
    llm_endpoint: str | None = None
    llm_recognised_by: str | None = None

    @property
    def saturated(self) -> bool:
        """Requests wait inside the process on nothing visible, many and long enough to be a queue."""
        total = sum(self.in_flight.values())
        return bool(total > 0 and self.waiting_s / total >= MIN_WAITING_SHARE and self.waiting_mean >= 1.0
                    and (self.in_flight_age_ms or 0.0) >= MIN_WAITING_AGE_MS)  # fmt: skip

    def mean(self, per_second: dict[int, float]) -> float:
        return sum(per_second.get(s, 0.0) for s in self.seconds) / len(self.seconds) if self.seconds else 0.0

    @property
    def in_flight_mean(self) -> float:
        return self.mean(self.in_flight)

    @property
    def waiting_mean(self) -> float:
        return self.waiting_s / len(self.seconds) if self.seconds else 0.0

    def db_endpoints(self) -> list[Endpoint]:
        return [e for e in self.endpoints.values() if e.db]

    def at_db_mean(self) -> float:
        """Requests awaiting the database (a statement sent, its answer not begun) on average."""
        return sum(self.mean(e.pending) for e in self.db_endpoints())

    def outstanding_mean(self) -> float:
        """Requests at other endpoints (pending or receiving, less those whose answer sits unread) on average."""
        return sum(max(0.0, self.mean(e.pending) + self.mean(e.receiving) - self.mean(e.unread))
                   for e in self.endpoints.values() if not e.db)  # fmt: skip

    def evidence(self) -> dict[str, Any]:
        return {
            "source": "socket census",
            "seconds": len(self.seconds),
            "requests_in_flight_mean": round(self.in_flight_mean, 2),
            "requests_in_flight_peak": max(self.in_flight.values(), default=0.0),
            "accept_backlog_mean": round(self.mean(self.backlog), 2),
            "requests_waiting_in_process_mean": round(self.waiting_mean, 2),
            "requests_in_flight_age_ms_p50": self.in_flight_age_ms,
            "db_connections_ceiling": self.db_ceiling,
            "db_connections_at_ceiling_share": round(self.db_ceiling_share, 3),
            "db_connections_active_share": round(self.db_active_share, 3),
            "endpoints": {k: e.summary(self.seconds) for k, e in sorted(self.endpoints.items())},
            **({"llm_endpoint": self.llm_endpoint, "llm_recognised_by": self.llm_recognised_by,
                "llm_first_byte_share": _rounded(self.endpoints[self.llm_endpoint].first_byte_share)}
               if self.llm_endpoint else {}),
        }  # fmt: skip


def wire_state(timeline: Timeline, loop: LoopState | None) -> WireState | None:
    """The census per second, the request-seconds per layer it implies, and whether a pool's
    ceiling explains the requests waiting on nothing visible. None when no census was taken."""
    gauges = timeline.gauges
    if not gauges.get("census.inbound.in_flight"):
        return None
    in_flight = _per_second(gauges.get("census.inbound.in_flight", ()))
    backlog = _per_second(gauges.get("census.inbound.backlog", ()))
    endpoints: dict[str, Endpoint] = {}
    for name, attr in (("census.outbound.established", "established"), ("census.outbound.pending", "pending"),
                       ("census.outbound.receiving", "receiving"), ("census.outbound.unread", "unread")):  # fmt: skip
        by_endpoint: dict[str, list[Any]] = {}
        for g in gauges.get(name, ()):
            by_endpoint.setdefault(_endpoint(endpoints, g), []).append(g)
        for key, found in by_endpoint.items():
            setattr(endpoints[key], attr, _per_second(found))
    for name in ("first_byte_s", "stream_s", "exchanges", "streamed"):  # totals, not per-second means
        for g in gauges.get("census.outbound." + name, ()):
            e = endpoints[_endpoint(endpoints, g)]
            setattr(e, name, type(getattr(e, name))(getattr(e, name) + g.value))
    seconds = sorted(in_flight)
    wire = WireState(seconds, in_flight, backlog, endpoints)
    wire.llm_endpoint, wire.llm_recognised_by = _llm_endpoint(timeline, endpoints)
    llm = endpoints.get(wire.llm_endpoint) if wire.llm_endpoint else None
    first_byte = llm.first_byte_share if llm is not None else None
    ages = sorted(g.value for g in gauges.get("census.inbound.in_flight_age_ms", ()))
    wire.in_flight_age_ms = ages[len(ages) // 2] if ages else None
    db = wire.db_endpoints()
    db_per_second = {s: sum(e.established.get(s, 0.0) for e in db) for s in seconds}
    if db:
        wire.db_ceiling = int(max(db_per_second.values(), default=0))
        wire.db_ceiling_share = (
            sum(1 for v in db_per_second.values() if v >= wire.db_ceiling) / len(seconds) if seconds else 0.0
        )
    at_db: dict[int, float] = {}
    waiting: dict[int, float] = {}
    request_s: dict[str, float] = {}

    def add(layer: str, value: float) -> None:
        request_s[layer] = request_s.get(layer, 0.0) + value

    for s in seconds:
        at_db[s] = sum(e.pending.get(s, 0.0) for e in db)
        # an answer that arrived and sits unread waits for the process, not for the endpoint
        elsewhere = sum(max(0.0, e.busy(s) - e.unread.get(s, 0.0)) for e in endpoints.values() if not e.db)
        active = max(0.0, in_flight[s] - at_db[s])
        # requests whose answer sits unread wait for the process to read it: on an asyncio
        # server, for the loop to get round to them (it was busy with something else). The
        # most specific reading, so it goes first: the other counts can run high (a finished
        # stream's connection reads as receiving for RECEIVING_MS after its last byte)
        behind = min(active, sum(e.unread.get(s, 0.0) for e in endpoints.values() if not e.db))
        outbound = min(elsewhere, active - behind)
        waiting[s] = active - behind - outbound
        add(QUEUE, backlog.get(s, 0.0))
        add(DB_QUERY, at_db[s])
        at_llm = 0.0
        if llm is not None and first_byte is not None and elsewhere > 0:
            # the provider's share of the time at outbound endpoints, split as its exchanges were
            at_llm = outbound * max(0.0, llm.busy(s) - llm.unread.get(s, 0.0)) / elsewhere
            add(PROVIDER, at_llm * first_byte)
            add(MODEL, at_llm * (1 - first_byte))
        add(TOOL, outbound - at_llm)
        add(EVENT_LOOP if loop is not None else UNATTRIBUTED, behind)
    wire.waiting_s = sum(waiting.values())
    if db and seconds:
        wire.db_active_share = sum(1 for s in seconds if sum(e.busy(s) for e in db) > 0) / len(seconds)
    wire.pool_inferred = bool(
        db and wire.db_ceiling > 0
        and wire.db_ceiling_share >= STABLE_CEILING_SHARE
        and wire.db_active_share >= MIN_DB_ACTIVE_SHARE
        and wire.in_flight_mean > wire.db_ceiling
        and wire.saturated
    )  # fmt: skip
    if not wire.pool_inferred and wire.saturated and wire.at_db_mean() < 0.5:
        wire.http_limited = _http_limit(wire, endpoints)
    behind_what = DB_POOL if wire.pool_inferred else HTTP_POOL if wire.http_limited else UNATTRIBUTED
    for s in seconds:
        held = loop.busy_by_second.get(s, 0.0) if loop is not None else 0.0
        add(EVENT_LOOP, held * waiting[s])
        add(behind_what, (1 - held) * waiting[s])
    wire.request_s = {k: v for k, v in request_s.items() if v > 0}
    return wire


def _endpoint(endpoints: dict[str, Endpoint], g: Any) -> str:
    """The key ("address:port") of a census gauge's remote endpoint, added to `endpoints` when new."""
    address, port = str(g.attrs.get("server.address")), int(g.attrs.get("server.port") or 0)
    key = f"{address}:{port}"
    if key not in endpoints:
        # the session names the kind (the --db server is postgresql whatever its port)
        endpoints[key] = Endpoint(address, port, str(g.attrs.get("latprof.endpoint.kind") or DB_PORTS.get(port, "http")))
    return key


#: Top-level packages of LLM client libraries: a frame of one in the process's stacks says it calls an LLM.
LLM_CLIENTS = ("openai/", "anthropic/", "litellm/", "google/genai/", "mistralai/", "cohere/")


def _llm_endpoint(timeline: Timeline, endpoints: dict[str, Endpoint]) -> tuple[str | None, str | None]:
    """The outbound endpoint that is the LLM provider, and what recognised it: the process's
    stacks show an LLM client library, and one HTTP endpoint had exchanges (or, of several, only
    one streamed its answers, as an LLM does). None when the wire cannot tell which it is."""
    frames = {f.filename for sample in timeline.samples for f in sample.frames}
    client = next((c.rstrip("/") for c in LLM_CLIENTS if any(in_package(f, c) for f in frames)), None)
    if client is None:
        return None, None
    http = {k: e for k, e in endpoints.items() if not e.db and e.exchanges}
    if len(http) == 1:
        return next(iter(http)), f"{client} frames in the process's stacks; the only HTTP endpoint it called"
    streaming = [k for k, e in http.items() if e.streamed >= max(1, e.exchanges // 2)]
    if len(streaming) == 1:
        return streaming[0], f"{client} frames in the process's stacks; the only HTTP endpoint that streamed its answers"
    return None, None


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _http_limit(wire: WireState, endpoints: dict[str, Endpoint]) -> str | None:
    """The outbound HTTP endpoint whose connections stood at a stable ceiling, nearly all of them
    busy, while more requests were in flight than that ceiling: the requests waiting in the
    process most likely wait for one of them (an HTTP client's connection limit). None when no
    endpoint (or more than one) fits: then the wire cannot say what they wait for."""
    fits = []
    for key, e in endpoints.items():
        if e.db or not e.established or not wire.seconds:
            continue
        ceiling = e.ceiling
        # per-second means: a client that opens a connection per call dips between two of them
        at_ceiling = sum(1 for s in wire.seconds if e.established.get(s, 0.0) >= ceiling - 0.5) / len(wire.seconds)
        busy = wire.mean({s: e.busy(s) for s in wire.seconds})
        if (ceiling >= 1 and at_ceiling >= STABLE_CEILING_SHARE and busy >= HTTP_LIMIT_BUSY_SHARE * ceiling
                and wire.in_flight_mean > ceiling):  # fmt: skip
            fits.append(key)
    return fits[0] if len(fits) == 1 else None


def _per_second(gauges: Any) -> dict[int, float]:
    """Census gauges (one reading per port or endpoint, all of one reading stamped alike) as
    second -> value: the readings' sum, averaged when two readings fall into one second."""
    by_reading: dict[int, float] = {}
    for g in gauges:
        by_reading[g.ts_ns] = by_reading.get(g.ts_ns, 0.0) + g.value
    by_second: dict[int, list[float]] = {}
    for ts, value in by_reading.items():
        by_second.setdefault(ts // 1_000_000_000, []).append(value)
    return {second: sum(values) / len(values) for second, values in by_second.items()}


@dataclass
class Backends:
    """The target's PostgreSQL backends over the capture (`--db`)."""

    readings: int
    backends: int
    states: Counter[str]
    idle_ages_ms: list[float]
    held_readings: int

    @property
    def held_share(self) -> float:
        return self.held_readings / self.readings if self.readings else 0.0

    def evidence(self) -> dict[str, Any]:
        ages = sorted(self.idle_ages_ms)
        return {
            "source": "pg_stat_activity",
            "backends": self.backends,
            "readings": self.readings,
            "state_share": {k: round(v / self.readings, 3) for k, v in self.states.most_common()} if self.readings else {},
            "idle_age_ms_p50": round(ages[len(ages) // 2], 1) if ages else None,
            "held_share": round(self.held_share, 3),
        }


def backends(timeline: Timeline) -> Backends | None:
    """The backends' states; a reading idle or idle in transaction for at least `HELD_MS` is held."""
    gauges = timeline.gauges.get("db.backend.state_age_ms", ())
    if not gauges:
        return None
    states: Counter[str] = Counter()
    ages: list[float] = []
    held = 0
    pids = set()
    for g in gauges:
        state = str(g.attrs.get("db.backend.state") or "unknown")
        states[state] += 1
        pids.add(g.attrs.get("db.backend.pid"))
        if state.startswith("idle"):
            ages.append(float(g.value))
            if g.value >= HELD_MS:
                held += 1
    return Backends(len(gauges), len(pids), states, ages, held)
