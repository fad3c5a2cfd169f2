"""Names of attributes and gauges: OpenTelemetry's where one exists, latprof's own fenced under `latprof.`."""

from __future__ import annotations

from typing import Final

# --- OpenTelemetry semantic conventions (reused as they are) ------------------------------
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GEN_AI_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
#: The conversation (session, thread) an LLM call belongs to: read, never stored (`CONVERSATION_DIGEST` is).
GEN_AI_CONVERSATION_ID: Final = "gen_ai.conversation.id"
#: On an agent tool call (`execute_tool {name}`): the tool's name, and the model's id for the call.
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
DB_SYSTEM_NAME: Final = "db.system.name"
DB_OPERATION_NAME: Final = "db.operation.name"
DB_QUERY_SUMMARY: Final = "db.query.summary"
#: int on a `db.query` segment of a batch (a redis pipeline or transaction): how many operations it sent.
DB_OPERATION_BATCH_SIZE: Final = "db.operation.batch.size"
DB_POOL_NAME: Final = "db.client.connection.pool.name"
SERVER_ADDRESS: Final = "server.address"
SERVER_PORT: Final = "server.port"
HTTP_REQUEST_METHOD: Final = "http.request.method"
HTTP_ROUTE: Final = "http.route"
HTTP_STATUS_CODE: Final = "http.response.status_code"
HTTP_RESEND_COUNT: Final = "http.request.resend_count"
#: A proxy's request-start stamp (`X-Request-Start: t=<epoch time>`) as a server span records it when told to
#: (`OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST=x-request-start`): a list of strings. The semantic
#: conventions keep the header's `-`; opentelemetry-python-contrib's instrumentations (util-http
#: `normalise_request_header_name`, still in 0.66b1) write `_`. The only header attribute latprof reads.
HTTP_REQUEST_HEADER_X_REQUEST_START: Final = "http.request.header.x-request-start"
HTTP_REQUEST_HEADER_X_REQUEST_START_PY: Final = "http.request.header.x_request_start"
#: the class of error that ended an operation
ERROR_TYPE: Final = "error.type"
#: histogram (seconds) of the time to obtain an open connection from a pool
METRIC_DB_CONNECTION_WAIT_TIME: Final = "db.client.connection.wait_time"

# --- latprof's own attributes --------------------------------------------------------------
#: bool on an LLM segment: False when the call was not streamed and TTFT was not observed.
TTFT_KNOWN: Final = "latprof.ttft_known"
#: bool on a segment made from a span whose status was ERROR (OpenTelemetry's status code).
SPAN_STATUS_ERROR: Final = "latprof.span.status_error"
#: str shared by the provider and model segments of one LLM call.
LLM_CALL_ID: Final = "latprof.llm_call_id"
#: str on an LLM segment: the keyed digest of its conversation id (`latprof.digests`), never the id itself.
CONVERSATION_DIGEST: Final = "latprof.conversation.digest"
#: bool: the segment's boundaries are an estimate, not a measurement.
ESTIMATED: Final = "latprof.estimated"
#: bool on an LLM segment from stack samples: TTFT and decode could not be told apart.
SPLIT_UNKNOWN: Final = "latprof.split_unknown"
#: int on the segments of a streamed LLM call: chunks that carried output (a non-empty delta).
OUTPUT_CHUNKS: Final = "latprof.output_chunks"
#: float on a pool checkout segment: ms of it spent opening a new connection.
CONNECT_MS: Final = "latprof.db.connect_ms"
#: str on a `queue` segment: what the request queued in (backlog, threadpool, limiter, header,
#: executor: a task the request handed to a `ThreadPoolExecutor` waited for a worker; from traces also
#: downstream, and proxy: between a proxy's span and the app's server span below it).
QUEUE_SOURCE: Final = "latprof.queue.source"

#: int on a request root recorded as a random sample: the requests it stands for (1 / its
#: chance of being recorded). Absent means 1. The analysis weighs the request by it.
SAMPLE_WEIGHT: Final = "latprof.sample_weight"
#: Requests a second per process above which the hooks record a random sample (the default
#: of `latprof run --max-rate`). Recording a request costs a saturated asyncio server about
#: 40 us of CPU on its loop: this many a second is about 1% of a core.
DEFAULT_MAX_RATE: Final = 250.0

#: str on a `lock` segment: what kind of lock (`threading.Lock`, `asyncio.Semaphore`, ...).
LOCK_KIND: Final = "latprof.lock.kind"
#: str on a `lock` segment: where the lock was created, or for asyncio ones acquired (`app/cache.py:12`).
LOCK_SITE: Final = "latprof.lock.site"

#: on a `tool` segment: the id of an earlier call of the same request whose response carried a
#: value this call sent (so it could not have started before that call ended), or true when
#: the hook saw such a value without knowing which call it came from.
TOOL_DEPENDS_ON: Final = "latprof.tool.depends_on"
#: str on an agent tool call: the framework that called it (langchain, openai-agents, mcp).
TOOL_FRAMEWORK: Final = "latprof.tool.framework"

#: Name of the segment of a sleep inside a request (collectors/hooks/sleeps.py): `retry` when a retry
#: library slept, else without a layer until the analysis finds it was a backoff.
SLEEP_SEGMENT: Final = "sleep"
#: str on a `retry` sleep: the retry library that slept (tenacity, backoff, urllib3, ...).
RETRY_LIBRARY: Final = "latprof.retry.library"
#: int on a `retry` sleep the analysis recognised: the status code of the failed call before it.
RETRY_AFTER_STATUS: Final = "latprof.retry.after_status"
#: str on such a sleep: the error type of the failed call before it (a timeout, a refused connection).
RETRY_AFTER_ERROR: Final = "latprof.retry.after_error"

#: str on an `http.pool` segment and the HTTP pool gauges: which client pool ("httpx pool 1", numbered per process).
HTTP_POOL_NAME: Final = "latprof.http.pool.name"
#: int on an `http.pool` segment: the pool's limits (absent when unlimited).
HTTP_POOL_MAX_CONNECTIONS: Final = "latprof.http.pool.max_connections"
HTTP_POOL_MAX_KEEPALIVE: Final = "latprof.http.pool.max_keepalive_connections"
HTTP_POOL_MAX_PER_HOST: Final = "latprof.http.pool.max_per_host"
#: On an LLM call's `provider` segment, from the HTTP client's own events (httpcore's trace
#: extension, aiohttp's `TraceConfig`) for the call's last HTTP attempt: float ms spent resolving
#: the host (aiohttp only: httpcore resolves inside its connect), opening the TCP connection, the
#: TLS handshake, sending the request, and from the request sent to the response's headers (the
#: server's time to first byte, one network round trip included); and bool, whether the attempt
#: opened a new connection (absent: the client did not say).
NET_DNS_MS: Final = "latprof.net.dns_ms"
NET_CONNECT_MS: Final = "latprof.net.connect_ms"
NET_TLS_MS: Final = "latprof.net.tls_ms"
NET_UPLOAD_MS: Final = "latprof.net.upload_ms"
NET_SERVER_MS: Final = "latprof.net.server_ms"
NET_NEW_CONNECTION: Final = "latprof.net.new_connection"
#: On a `queue` segment of a task that waited for a worker of a `ThreadPoolExecutor`: the
#: pool's thread name prefix, and its `max_workers`.
THREAD_POOL_NAME: Final = "latprof.thread_pool.name"
THREAD_POOL_MAX_WORKERS: Final = "latprof.thread_pool.max_workers"

#: str on a NOTE_ERROR record: the text of the last error a collector swallowed.
LAST_ERROR: Final = "latprof.last_error"

#: Name of a layer-less segment marking how long a request held a pooled DB connection
#: (checkout to checkin). It owns no time on the critical path; rules read it.
SEGMENT_CONNECTION_HOLD: Final = "db.connection.hold"

# --- gauges (name carries the unit where there is one) ------------------------------------
GAUGE_POOL_SIZE: Final = "db.pool.size"  # connections open
GAUGE_POOL_MAX: Final = "db.pool.max"  # most connections the pool may open
GAUGE_POOL_IN_USE: Final = "db.pool.in_use"  # connections checked out
GAUGE_POOL_WAITERS: Final = "db.pool.waiters"  # callers waiting for a connection
GAUGE_POOL_OVERFLOW: Final = "db.pool.overflow"  # connections open beyond the pool's base size
GAUGE_HTTP_POOL_IN_USE: Final = "http.pool.in_use"  # connections busy
GAUGE_HTTP_POOL_MAX: Final = "http.pool.max"  # max_connections, when limited
GAUGE_HTTP_POOL_WAITERS: Final = "http.pool.waiters"  # requests queued for a connection
GAUGE_LOOP_LAG_MS: Final = "event_loop.lag_ms"
GAUGE_ACCEPT_QUEUE: Final = "accept.queue_depth"  # LISTEN socket rx_queue
GAUGE_CPU_PERCENT: Final = "process.cpu_percent"

# Gauges of a self-hosted inference engine, scraped from its Prometheus endpoint (`--engine-metrics`,
# collectors/scrape/). Each instance's attrs name the engine (`ENGINE_KIND`), the endpoint
# (`server.address`, `server.port`) and the model where the engine labels it (`gen_ai.request.model`).
GAUGE_ENGINE_WAITING: Final = "engine.requests.waiting"  # requests in the engine's scheduler queue
GAUGE_ENGINE_RUNNING: Final = "engine.requests.running"  # requests in its running batch
GAUGE_ENGINE_KV_USAGE: Final = "engine.kv_cache.usage"  # share of the KV cache in use, 0..1
GAUGE_ENGINE_PREEMPTIONS: Final = "engine.preemptions"  # preemptions since the previous scrape (counter delta)
GAUGE_ENGINE_FINISHED: Final = "engine.requests.finished"  # requests finished since the previous scrape
#: Per-request histograms of the engine, as the deltas since the previous scrape: gauge
#: `engine.<stage>_ms.sum` (milliseconds) and `engine.<stage>_ms.count` (requests) per stage.
ENGINE_STAGES: Final = ("queue", "prefill", "decode", "inference", "ttft", "e2e")


def engine_stage_gauges(stage: str) -> tuple[str, str]:
    """The sum (ms) and count gauge names of an engine histogram stage (`ENGINE_STAGES`)."""
    return f"engine.{stage}_ms.sum", f"engine.{stage}_ms.count"


ENGINE_KIND: Final = "latprof.engine"  # vllm, sglang, tgi, llamacpp
#: The engine scraper's name in a capture header's `collectors`, and its header's `role` (the
#: header of latprof's own process, not of a service process).
ENGINE_SCRAPER: Final = "engine-metrics"

# --- collection-quality record kinds --------------------------------------------------------
NOTE_HOOKS_LOADED: Final = "hooks_loaded"
NOTE_DROPPED: Final = "dropped"
NOTE_ERROR: Final = "error"
NOTE_PERMISSION: Final = "permission"
NOTE_CLOCK: Final = "clock"
NOTE_WARNING: Final = "warning"
#: A hook's part stays off: what it patches is missing from the library or has changed shape
#: (attrs `collector`, `library`, `versions`, `changed`).
NOTE_HOOK_OFF: Final = "hook_off"
#: A hook patched a library version outside the lines it is tested on (attrs `collector`,
#: `library`, `versions`, `untested`).
NOTE_UNTESTED_VERSION: Final = "untested_version"
#: A hook saw traffic: written by each process the first time the hook records something
#: (attrs `collector`). The report's `collection.collectors` lists these hooks, not every one loaded.
NOTE_HOOK_ACTIVE: Final = "hook_active"
#: bool in a `hooks_loaded` record: its process writes `hook_active` records (captures made
#: before they existed list every loaded hook instead).
NOTES_ACTIVITY: Final = "notes_activity"
#: attrs `cpu_percent` and `added_ms_per_request`: what collection cost the observed process.
#: `cpu_percent` is a percentage of one CPU core over the time collected (run.md, attach.md).
NOTE_OVERHEAD: Final = "overhead"
#: attr of an `overhead` record: whose cost it is. `OVERHEAD_SOURCE_HOOKS` for the in-process
#: hooks (`latprof run`, `attach --inject`: one record per process, more attrs in
#: `latprof.collectors.hooks.runtime.cost`); absent for the attach sampler's own process.
OVERHEAD_SOURCE: Final = "source"
OVERHEAD_SOURCE_HOOKS: Final = "hooks"
#: A capture writer closed cleanly: its process's last record (attrs `events`, `dropped`,
#: `errors`: its totals). A header with `closes: true` promises one; its absence means the
#: process was killed, crashed or could not write its end (reader: a collection warning).
NOTE_CLOSED: Final = "closed"
#: One process `latprof attach --inject` tried (attrs: `outcome`, `held_ms`, `hooks`,
#: `coverage`, `detach`, ...: `latprof.inject.session.Injected`); the report's `collection.injected`.
NOTE_INJECTED: Final = "injected"
#: What scraping one `--engine-metrics` endpoint saw (attrs: `endpoint`, `engine`, `scrapes`,
#: `failed`, `missing`, `models`: `latprof.collectors.scrape.prometheus.ScrapeSummary`); the report's `collection.engines`.
NOTE_ENGINE_METRICS: Final = "engine_metrics"
