"""Scrape an inference engine's Prometheus endpoint once a second into gauge events (`--engine-metrics`).

The text is parsed with `prometheus_client`'s own parser (the exposition format's reference
implementation; OpenMetrics text with its OpenMetrics parser), never by hand. What is kept is
what `collectors/scrape/engines.py` maps for the engine the page belongs to (vLLM, SGLang, TGI,
llama.cpp's server), in latprof's units:

- gauges as read: `engine.requests.waiting`, `engine.requests.running`, `engine.kv_cache.usage`;
- counters as the delta since the previous scrape (`engine.preemptions`, `engine.requests.finished`);
  a counter that went down was reset (the engine restarted): its new value is the delta;
- per-request histograms as the deltas of their sum (ms) and count: `engine.<stage>_ms.sum` and
  `engine.<stage>_ms.count` (`semconv.ENGINE_STAGES`).

Samples are summed over every label but the model's (a data-parallel vLLM's `engine="0"`,
`"1"`, a counter split by `finished_reason`), except the KV-cache share, where the fullest
wins. Each gauge's attrs name the engine, the endpoint (host and port: the URL's path and query
are never recorded, they may hold a token) and the model where the engine labels it.

The scraper runs in latprof's process, never in the service. It never raises: a failed scrape
(refused, timed out, not Prometheus text) is counted, and `summary()` says what was seen. The
first scrape only sets the baseline of counters and histograms.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

from latprof.capture.writer import CaptureWriter
from latprof.collectors.scrape.engines import MEASURES, Engine, detect
from latprof.errors import InputError
from latprof.events import Event, Gauge, QualityRecord
from latprof.semconv import (
    ENGINE_KIND,
    ENGINE_SCRAPER,
    GAUGE_ENGINE_FINISHED,
    GAUGE_ENGINE_KV_USAGE,
    GAUGE_ENGINE_PREEMPTIONS,
    GAUGE_ENGINE_RUNNING,
    GAUGE_ENGINE_WAITING,
    GEN_AI_REQUEST_MODEL,
    NOTE_ENGINE_METRICS,
    NOTE_WARNING,
    SERVER_ADDRESS,
    SERVER_PORT,
    engine_stage_gauges as stage_gauges,
)

#: The gauge each gauge or counter measure is recorded as.
GAUGE_OF = {
    "waiting": GAUGE_ENGINE_WAITING,
    "running": GAUGE_ENGINE_RUNNING,
    "kv_cache_usage": GAUGE_ENGINE_KV_USAGE,
    "preemptions": GAUGE_ENGINE_PREEMPTIONS,
    "finished": GAUGE_ENGINE_FINISHED,
}
#: A page larger than this is not read (a real engine's is tens of KB).
MAX_BODY_BYTES = 8 * 1024 * 1024
#: The classic text format only: every exporter serves it, and prometheus_client's servers (vLLM's,
#: SGLang's) answer an Accept that names OpenMetrics at all with OpenMetrics, whose escaping of
#: names with a colon its own text parser does not read back.
_ACCEPT = "text/plain;version=0.0.4"


def check_url(url: str) -> str:
    """`url` when it is an http(s) URL with a host; `InputError` (one line) otherwise."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError(f"--engine-metrics {url!r}: not an http(s) URL of a Prometheus endpoint (e.g. http://127.0.0.1:8000/metrics)")
    try:
        parts.port  # noqa: B018  # a bad port raises here
    except ValueError as exc:
        raise InputError(f"--engine-metrics {url!r}: {exc}") from None
    return url


def endpoint_of(url: str) -> tuple[str, int]:
    """The host and port of `url` (the scheme's default port when none is given)."""
    parts = urllib.parse.urlsplit(url)
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


def parse(text: str, openmetrics: bool = False) -> list[Any]:
    """The metric families of a page, with prometheus_client's parser (ValueError when it is not one)."""
    if openmetrics:
        from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om

        return list(parse_om(text))  # type: ignore[no-untyped-call]
    from prometheus_client.parser import text_string_to_metric_families

    return list(text_string_to_metric_families(text))


@dataclass
class ScrapeSummary:
    """What one endpoint's scraping saw: written as the capture's `engine_metrics` record."""

    endpoint: str
    engine: str | None = None
    title: str | None = None
    scrapes: int = 0
    failed: int = 0
    last_error: str = ""
    missing: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)

    def attrs(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "engine": self.engine, "title": self.title, "scrapes": self.scrapes,
                "failed": self.failed, "last_error": self.last_error, "missing": list(self.missing),
                "models": list(self.models)}  # fmt: skip

    def problems(self) -> list[str]:
        """One line per thing the user should know about this endpoint's metrics."""
        out = []
        if self.failed:
            out.append(f"engine metrics at {self.endpoint}: {self.failed} of {self.scrapes + self.failed} scrapes failed"
                       + (f" (last: {self.last_error})" if self.last_error else ""))  # fmt: skip
        if self.scrapes and self.engine is None:
            out.append(f"engine metrics at {self.endpoint}: no known engine's metrics on the page (vLLM, SGLang, TGI,"
                       " llama.cpp's server); nothing recorded from it")  # fmt: skip
        elif self.missing:
            out.append(f"engine metrics at {self.endpoint} ({self.title}): the page has no {', '.join(self.missing)}"
                       " (another version of the engine, or not published): what needs them is not judged")  # fmt: skip
        return out


class EngineScrape:
    """The state of one endpoint between scrapes: the engine, and the previous counter and histogram values."""

    def __init__(self, url: str, pid: int | None = None) -> None:
        self.url = url
        host, port = endpoint_of(url)
        self.base_attrs: dict[str, Any] = {SERVER_ADDRESS: host, SERVER_PORT: port}
        self.pid = os.getpid() if pid is None else pid
        self.summary = ScrapeSummary(f"{host}:{port}")
        self.engine: Engine | None = None
        self._previous: dict[tuple[str, str], float] = {}
        self._baseline_taken = False  # a counter first seen after the first scrape counts from zero

    def take(self, text: str, ts_ns: int) -> list[Event]:
        """The events of one page as `fetch` returned it; a page that is not Prometheus text, or that
        the engine tables did not expect, is a failed scrape (counted), never an exception."""
        try:
            openmetrics = text.endswith("\x00openmetrics")
            families = parse(text.removesuffix("\x00openmetrics"), openmetrics)
        except Exception as exc:  # not Prometheus text
            self.failed(exc)
            return []
        self.summary.scrapes += 1
        try:
            return self.events(families, ts_ns)
        except Exception as exc:  # a page the engine tables did not expect
            self.summary.scrapes -= 1
            self.failed(exc)
            return []

    def failed(self, exc: BaseException) -> None:
        self.summary.failed += 1
        self.summary.last_error = _describe(exc)

    def events(self, families: Iterable[Any], ts_ns: int) -> list[Event]:
        """The gauge events of one scrape's metric families (counters and histograms as deltas)."""
        families = list(families)
        types = {f.name: f.type for f in families}
        if self.engine is None:
            self.engine = detect(types)
            if self.engine is None:
                return []
            self.summary.engine, self.summary.title = self.engine.name, self.engine.title
        engine = self.engine
        self.summary.missing = engine.missing(types)
        by_name = {f.name: f for f in families}
        values: dict[tuple[str, str], float] = {}  # (gauge name, model) -> value this scrape
        deltas: set[str] = set()
        for measure in MEASURES:
            metric = engine.metric_for(measure, types)
            if metric is None:
                continue
            family = by_name[metric.family]
            if metric.kind == "histogram" or family.type == "histogram":
                total_name, count_name = stage_gauges(measure)
                for model, value in _sum_by_model(family, engine.model_label, "_sum").items():
                    values[(total_name, model)] = value * metric.scale
                for model, value in _sum_by_model(family, engine.model_label, "_count").items():
                    values[(count_name, model)] = value
                deltas.update((total_name, count_name))
            else:
                name = GAUGE_OF[measure]
                suffix = "_total" if metric.kind == "counter" else ""
                combine = max if measure == "kv_cache_usage" else None
                for model, value in _sum_by_model(family, engine.model_label, suffix, combine).items():
                    values[(name, model)] = value * metric.scale
                if metric.kind == "counter":
                    deltas.add(name)
        out: list[Event] = []
        models = sorted({model for _, model in values if model})
        self.summary.models = sorted(set(self.summary.models) | set(models))
        for (name, model), value in sorted(values.items()):
            if name in deltas:
                before = self._previous.get((name, model))
                self._previous[(name, model)] = value
                if before is None:
                    if not self._baseline_taken:
                        continue  # the baseline: what happened before latprof looked
                    before = 0.0  # a series the engine started publishing while latprof looked
                value = value - before if value >= before else value  # a reset: counted from zero again
            attrs = {ENGINE_KIND: engine.name, **self.base_attrs}
            if model:
                attrs[GEN_AI_REQUEST_MODEL] = model
            out.append(Gauge(name, float(value), ts_ns, self.pid, attrs))
        self._baseline_taken = True
        return out


def _sum_by_model(family: Any, model_label: str | None, suffix: str,
                  combine: Callable[[float, float], float] | None = None) -> dict[str, float]:  # fmt: skip
    """The family's samples named `<family><suffix>` combined per model label value ("" without one):
    summed over every other label, or `combine`d. A histogram's buckets are never read here."""
    out: dict[str, float] = {}
    wanted = family.name + suffix
    for sample in family.samples:
        if sample.name != wanted and not (suffix == "_total" and sample.name == family.name):
            continue
        value = float(sample.value)
        if not math.isfinite(value):  # NaN (nothing to report yet), or infinite: no reading
            continue
        model = str(sample.labels.get(model_label, "")) if model_label else ""
        if model in out:
            out[model] = combine(out[model], value) if combine else out[model] + value
        else:
            out[model] = value
    return out


def fetch(url: str, timeout_s: float) -> str:
    """The page at `url` as text; OSError or ValueError when it cannot be read or parsed."""
    request = urllib.request.Request(url, headers={"Accept": _ACCEPT, "User-Agent": "latprof"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310  # the user's own URL, http(s) only (check_url)
        body: bytes = response.read(MAX_BODY_BYTES + 1)
        content_type = str(response.headers.get("Content-Type", ""))
    if len(body) > MAX_BODY_BYTES:
        raise ValueError(f"page larger than {MAX_BODY_BYTES // (1024 * 1024)} MB")
    return body.decode("utf-8", "replace") + ("\x00openmetrics" if "openmetrics" in content_type else "")


class EngineScraper:
    """Scrapes each URL every `interval_s` on a daemon thread and hands the events to `emit`.

    `emit` is the capture writer's (bounded, never raises). `stop()` ends the thread and emits
    one `engine_metrics` record per endpoint with what it saw, and a warning per problem.
    """

    def __init__(self, urls: Iterable[str], emit: Callable[[Event], None], *, interval_s: float = 1.0,
                 timeout_s: float = 0.8, pid: int | None = None) -> None:  # fmt: skip
        self.emit = emit
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.scrapes = [EngineScrape(check_url(url), pid) for url in urls]
        self.pid = os.getpid() if pid is None else pid
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __bool__(self) -> bool:
        return bool(self.scrapes)

    def start(self) -> EngineScraper:
        if self.scrapes and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="latprof-engine-metrics", daemon=True)
            self._thread.start()
        return self

    def scrape_once(self) -> None:
        """Scrape every endpoint once (what the thread does each interval)."""
        for scrape in self.scrapes:
            now = time.time_ns()
            try:
                text = fetch(scrape.url, self.timeout_s)
            except Exception as exc:  # refused, timed out, HTTP error: counted, never raised
                scrape.failed(exc)
                continue
            for event in scrape.take(text, now):
                self.emit(event)

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.scrape_once()
            next_at += self.interval_s
            delay = next_at - time.monotonic()
            if delay < 0:  # a slow endpoint: skip the missed ticks rather than scrape back to back
                next_at = time.monotonic()
                delay = 0.0
            self._stop.wait(delay)

    def stop(self) -> list[ScrapeSummary]:
        """Stop scraping; emit and return what each endpoint's scraping saw."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 2)
        now = time.time_ns()
        out = []
        for scrape in self.scrapes:
            summary = scrape.summary
            self.emit(QualityRecord(NOTE_ENGINE_METRICS, now, self.pid, summary.endpoint, attrs=summary.attrs()))
            for line in summary.problems():
                self.emit(QualityRecord(NOTE_WARNING, now, self.pid, line))
            out.append(summary)
        return out


def _describe(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}"
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    return f"{type(exc).__name__}: {exc}"[:200]


#: The `collectors` a capture header names for the engine scraper; its header's `role`.
COLLECTOR = ENGINE_SCRAPER


@contextlib.contextmanager
def scraping_into(path: str | os.PathLike[str], urls: Sequence[str], source: str) -> Iterator[EngineScraper | None]:
    """Scrape `urls` into the capture at `path` (appended, under its own header, as another writing
    process would) while the block runs; None and nothing written without URLs."""
    if not urls:
        yield None
        return
    scraper = EngineScraper(urls, lambda event: None)  # bad URLs raise here, before a file is touched
    writer = CaptureWriter(path, source=source, header_extra={"role": COLLECTOR, "collectors": [COLLECTOR]})
    scraper.emit = writer.emit
    scraper.start()
    try:
        yield scraper
    finally:
        scraper.stop()
        writer.close()
