"""Hand-built timelines for tests: requests and segments in milliseconds from an origin."""

from __future__ import annotations

import itertools
from typing import Any, Iterable, Sequence

from latprof.analysis.requests import Analysis, analyze
from latprof.events import Gauge, QualityRecord, Request, Segment, StackSample
from latprof.analysis.timeline import RequestTimeline, Timeline

ORIGIN_NS = 1_764_000_000 * 1_000_000_000
_ids = itertools.count(1)


def ms(t: float) -> int:
    """Wall-clock ns of `t` milliseconds after the origin."""
    return ORIGIN_NS + int(round(t * 1_000_000))


def seg(
    layer: str | None,
    start_ms: float,
    end_ms: float,
    *,
    name: str | None = None,
    id: str | None = None,
    parent: str | None = None,
    **attrs: Any,
) -> Segment:
    """A segment; `request_id` and `pid` are filled in by `req`."""
    return Segment(
        request_id="",
        segment_id=id or f"s{next(_ids)}",
        parent_id=parent,
        name=name or (layer or "marker"),
        layer=layer,
        start_ns=ms(start_ms),
        end_ns=ms(end_ms),
        pid=0,
        attrs=attrs,
    )


def req(
    start_ms: float,
    end_ms: float,
    *segments: Segment,
    cpu_ms: float | None = None,
    route: str = "POST /chat",
    pid: int = 1,
    id: str | None = None,
) -> RequestTimeline:
    rid = id or f"r{next(_ids)}"
    request = Request(
        request_id=rid,
        route=route,
        start_ns=ms(start_ms),
        end_ns=ms(end_ms),
        pid=pid,
        cpu_ns=None if cpu_ms is None else int(cpu_ms * 1_000_000),
        status_code=200,
    )
    owned = tuple(
        Segment(rid, s.segment_id, s.parent_id, s.name, s.layer, s.start_ns, s.end_ns, pid, s.attrs) for s in segments
    )
    return RequestTimeline(request, owned)


def gauge(name: str, value: float, at_ms: float, pid: int = 1, **attrs: Any) -> Gauge:
    return Gauge(name, value, ms(at_ms), pid, attrs)


def timeline(
    requests: Sequence[RequestTimeline],
    gauges: Iterable[Gauge] = (),
    samples: Iterable[StackSample] = (),
    quality: Iterable[QualityRecord] = (),
    source_kind: str = "run",
) -> Timeline:
    by_name: dict[str, list[Gauge]] = {}
    for g in sorted(gauges, key=lambda g: g.ts_ns):
        by_name.setdefault(g.name, []).append(g)
    return Timeline(
        source_kind=source_kind,
        inputs=["<test>"],
        requests=sorted(requests, key=lambda r: r.request.start_ns),
        gauges=by_name,
        samples=list(samples),
        quality=list(quality),
    )


def population(
    n: int,
    typical: Sequence[tuple[str, float]],
    slow: Sequence[tuple[str, float]],
    slow_every: int = 20,
    spacing_ms: float = 100.0,
    jitter_ms: float = 5.0,
) -> list[RequestTimeline]:
    """`n` requests built from sequential layer segments; every `slow_every`-th uses `slow`.

    Each spec is a list of (layer, duration ms) laid end to end. Requests start `spacing_ms`
    apart (all after any warm-up when analysed with warmup_s=0). A small deterministic jitter
    on the last segment keeps latencies distinct.
    """
    out = []
    for i in range(n):
        spec = slow if i % slow_every == slow_every - 1 else typical
        t0 = i * spacing_ms
        cursor = t0
        segs = []
        for j, (layer, dur) in enumerate(spec):
            if j == len(spec) - 1:
                dur += (i % 7) * jitter_ms / 7
            segs.append(seg(layer, cursor, cursor + dur))
            cursor += dur
        out.append(req(t0, cursor, *segs))
    return out


def analysed(requests: Sequence[RequestTimeline], **kw: Any) -> Analysis:
    """Analyse hand-built requests with no warm-up skipped."""
    gauges = kw.pop("gauges", ())
    samples = kw.pop("samples", ())
    return analyze(timeline(requests, gauges=gauges, samples=samples), warmup_s=kw.pop("warmup_s", 0.0))


def assert_min_tail_excess_is_the_boundary(rule_class: Any, thresholds_class: Any, analysis: Analysis) -> None:
    """The rule fires on `analysis` by default; `min_tail_excess_ms` just above the measured
    excess silences it, just below it fires again. (Small excesses in a capture without a
    tail never fire: see `engine.owns_tail`.)"""
    [finding] = rule_class().check(analysis)
    excess = finding.impact_ms
    above = rule_class(thresholds_class(min_tail_excess_ms=excess + 1)).check(analysis)
    assert [f for f in above if f.impact_ms > 0] == []
    [again] = rule_class(thresholds_class(min_tail_excess_ms=excess - 1)).check(analysis)
    assert again.impact_ms == excess
