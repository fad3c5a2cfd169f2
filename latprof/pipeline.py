"""From capture files to a finished report: read, build the timeline, analyse, run the rules, report."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence

from latprof.analysis.explain import Explanation, explain_requests
from latprof.analysis.requests import DEFAULT_MIN_TAIL_EXCESS_MS, DEFAULT_WARMUP_S, MIN_REQUESTS_FOR_VERDICT, Analysis, analyze
from latprof.capture.files import gc_paused
from latprof.capture.format import SOURCE_KINDS, TRACE_SOURCES
from latprof.analysis.cohort_first import DEFAULT_COHORT_CAP, DEFAULT_SAMPLE_REQUESTS, MAX_READ_SHARE, Pick, analyze_picked, pick
from latprof.capture.reader import Input, read_captures, read_deferred_segments
from latprof.ci.config import Config
from latprof.engine import Finding, Rule, all_rules, configured, run_rules
from latprof.analysis.span_inference import infer_from_spans
from latprof.report.model import Report, build_report
from latprof.analysis.timeline import RequestTimeline, Timeline, build_timeline, with_read_segments
from latprof.errors import InputError
from latprof.analysis.genai import is_unstreamed
from latprof.attach.reconstruct import RECONSTRUCTED

if TYPE_CHECKING:
    from latprof.attach.analysis import AttachAnalysis


def default_rules() -> list[Rule]:
    """An instance of every rule (built-in and from entry points) with its default thresholds."""
    return [rule_class() for rule_class in all_rules()]


@dataclass(frozen=True)
class Diagnosis:
    """A finished diagnosis with what it was made from: the analysis and the rules' findings.

    `analysis` is None for an attach capture (stack samples, no requests): `samples` holds its
    sample analysis (`latprof.attach.analysis`), None otherwise.
    """

    analysis: Analysis | None
    findings: list[Finding]
    report: Report
    samples: AttachAnalysis | None = None


def run_diagnosis(
    paths: Iterable[Input],
    *,
    warmup_s: float | None = DEFAULT_WARMUP_S,
    rules: Sequence[Rule] | None = None,
    source_kind: str | None = None,
    min_tail_excess_ms: float = DEFAULT_MIN_TAIL_EXCESS_MS,
    trace_id: str | None = None,
    exact: bool = False,
    sample_requests: int = DEFAULT_SAMPLE_REQUESTS,
    max_read_share: float = MAX_READ_SHARE,
    cohort_cap: int = DEFAULT_COHORT_CAP,
) -> Diagnosis:
    """Read the captures (or trace files) at `paths`, analyse them and run the rules: on the
    request analysis, or on the sample analysis of an attach capture (`Rule.judge_samples`).

    `source_kind` (one of report-v1's `source.kind`s) says how the data was collected when the
    files cannot: `latprof receive` passes "receive" for the OTLP file it wrote, which read
    alone is "otlp". By default the files' headers (or trace format) decide.
    `min_tail_excess_ms` is the smallest tail worth a verdict (docs/layers.md). `warmup_s`
    None: the source's default - none for hooks loaded into a process already serving
    (`attach --inject`), else `DEFAULT_WARMUP_S`. `trace_id` keeps the requests of that one
    trace (nothing is warm-up then); with it, or with fewer requests than a verdict needs, the
    report explains each request (`latprof.analysis.explain`).

    A large capture is analysed cohort-first (`latprof.analysis.cohort_first`): every
    request's latency, then the segments of the cohorts, of each window's tail and of a sample of
    about `sample_requests` others; `exact` reads every segment. A trace file is read, mapped and inferred
    whole (its inferences compare each trace with the ones beside it), then analysed cohort-first the same way.
    `max_read_share` is the share of requests above which every segment is read anyway;
    `cohort_cap` the most requests read of one cohort (a larger one is read as a sample).
    """
    if source_kind is not None and source_kind not in SOURCE_KINDS:
        raise ValueError(f"source_kind must be one of {SOURCE_KINDS}, not {source_kind!r}")
    with gc_paused(freeze=True):
        data = read_captures(paths, defer_segments=not exact and trace_id is None)
        timeline = build_timeline(data)
        if source_kind is not None:
            timeline.source_kind = source_kind
        if trace_id is not None:
            warmup_s = 0.0
        if warmup_s is None:
            warmup_s = 0.0 if timeline.method == "inject" else DEFAULT_WARMUP_S
        chosen: Pick | None = None
        if data.deferred_segments:  # the first pass of a cohort-first read: pick what to read of the segments
            if timeline.source_kind not in TRACE_SOURCES and timeline.source_kind != "attach":
                chosen = pick(timeline, warmup_s, sample_requests=sample_requests, max_read_share=max_read_share,
                              cohort_cap=cohort_cap)  # fmt: skip
            read_deferred_segments(data, None if chosen is None else chosen.wanted_ids(timeline))
            timeline = with_read_segments(timeline, data)
            if source_kind is not None:  # (the timeline may have been built again)
                timeline.source_kind = source_kind
        del data  # what the timeline does not hold of it (the reader's lists of segments) can go
        if timeline.source_kind == "attach" and all(RECONSTRUCTED in rt.request.attrs for rt in timeline.requests):
            # stack samples, and the requests reconstructed from them
            from latprof.attach.analysis import analyze_attach, build_attach_report, judge

            samples = analyze_attach(timeline)
            found = judge(samples, default_rules() if rules is None else rules)
            return Diagnosis(None, found, build_attach_report(samples, found), samples)
        if timeline.source_kind in TRACE_SOURCES:
            timeline = infer_from_spans(timeline, warmup_s)
            # mapped and inferred whole; analysed cohort-first unless a call's first token is unknown somewhere
            if not exact and trace_id is None and not any_unstreamed(timeline):
                chosen = pick(timeline, warmup_s, sample_requests=sample_requests, max_read_share=max_read_share,
                              cohort_cap=cohort_cap)  # fmt: skip
                if chosen is not None:
                    timeline = unpicked_let_go(timeline, chosen)
        if trace_id is not None:
            timeline = select_trace(timeline, trace_id)
        if chosen is not None:
            skipped = len(timeline.requests) - len(chosen.kept)
            analysis = analyze_picked(timeline, chosen, warmup_skipped=skipped, min_tail_excess_ms=min_tail_excess_ms)
        else:
            analysis = analyze(timeline, warmup_s=warmup_s, min_tail_excess_ms=min_tail_excess_ms)
        findings = run_rules(analysis, default_rules() if rules is None else rules)
        explained = explain(analysis) if trace_id is not None or len(timeline.requests) < MIN_REQUESTS_FOR_VERDICT else None
        return Diagnosis(analysis, findings, build_report(analysis, findings, explained))


def any_unstreamed(timeline: Timeline) -> bool:
    """Whether any request has an LLM call whose first token is unknown (`TTFT_KNOWN` false: a non-streamed
    call, or one whose chunk events were lost). The analysis splits such a call into provider and model by the
    decode rates of every streamed and non-streamed call it analyses (`genai.unstreamed_splitter`), so a trace
    file holding one is analysed whole: the split, and the tail numbers made of it, are then the exact analysis's."""
    return any(is_unstreamed(segment) for rt in timeline.requests for segment in rt.segments)


def unpicked_let_go(timeline: Timeline, chosen: Pick) -> Timeline:
    """`timeline` with the segments of the requests `chosen` does not pick let go (their roots kept): what
    a cohort-first analysis of a trace file, mapped and inferred whole, holds afterwards - the same as a
    capture read cohort-first, whose unpicked requests' segments are never read."""
    keep = {chosen.kept[i] for i in chosen.read}
    requests = [rt if i in keep or not rt.segments else RequestTimeline(rt.request, ()) for i, rt in enumerate(timeline.requests)]
    return dataclasses.replace(timeline, requests=requests)


def select_trace(timeline: Timeline, trace_id: str) -> Timeline:
    """`timeline` with only the requests of trace `trace_id` (hex, any case; a trace with several
    roots is several requests); `InputError` naming the inputs when it holds none."""
    wanted = trace_id.strip().lower()
    kept = [rt for rt in timeline.requests if rt.request.request_id == wanted or rt.request.request_id.startswith(wanted + ":")]
    if not kept:
        raise InputError(f"no trace {trace_id} in {', '.join(timeline.inputs) or 'the input'} ({len(timeline.requests)} requests read)")
    return dataclasses.replace(timeline, requests=kept)


def explain(analysis: Analysis) -> list[Explanation]:
    """Each request explained (the slowest `MAX_EXPLAINED`), warm-up included: with a handful of
    requests there is no tail to compare with, and each is worth reading on its own."""
    processed = {rt.request.request_id: rt for rt in analysis.requests}
    requests = [processed.get(rt.request.request_id, rt) for rt in analysis.timeline.requests]
    return explain_requests(requests, services_of(analysis.timeline))


def services_of(timeline: Timeline) -> dict[int, str]:
    """The service name of each instance number trace readers give events as `pid`."""
    out: dict[int, str] = {}
    for header in timeline.headers:
        instances = header.get("instances")
        if isinstance(instances, dict):
            for number, about in instances.items():
                if isinstance(about, dict) and str(number).isdigit():
                    out[int(number)] = str(about.get("service.name") or "")
    return out


def run_configured(
    paths: Iterable[Input],
    config: Config,
    rule_classes: Sequence[type[Rule]],
    *,
    warmup_s: float | None = None,
    source_kind: str | None = None,
    trace_id: str | None = None,
    exact: bool = False,
    sample_requests: int | None = None,
) -> Diagnosis:
    """`run_diagnosis` as the config says: its enabled rules with their thresholds, its
    `min_tail_excess_ms`, and its `skip_warmup_s` unless `warmup_s` is given (else the source's default)."""
    if warmup_s is None:
        warmup_s = config.skip_warmup_s  # None: the source's default
    floor = config.min_tail_excess_ms if config.min_tail_excess_ms is not None else DEFAULT_MIN_TAIL_EXCESS_MS
    return run_diagnosis(paths, warmup_s=warmup_s, rules=configured(rule_classes, config.rules), min_tail_excess_ms=floor,
                         source_kind=source_kind, trace_id=trace_id, exact=exact,
                         sample_requests=DEFAULT_SAMPLE_REQUESTS if sample_requests is None else sample_requests)  # fmt: skip


def diagnose(
    paths: Iterable[Input],
    *,
    warmup_s: float = DEFAULT_WARMUP_S,
    rules: Sequence[Rule] | None = None,
) -> Report:
    """Diagnose the captures at `paths` and return the report."""
    return run_diagnosis(paths, warmup_s=warmup_s, rules=rules).report
