"""Attach findings come from the rules: each rule's `judge_samples`, run by the engine with the config's thresholds."""

from __future__ import annotations

import dataclasses

from attach.sampled import LOCKED, analysed, ids

from latprof.attach import analysis as attach_analysis
from latprof.attach.analysis import build_attach_report
from latprof.report.verdict import decide_verdict
from latprof.attach.wire import LOOP_BLOCKED_SHARE, LOOP_SATURATED_SHARE
from latprof.ci.config import RuleSettings
from latprof.engine import Rule, all_rules, configured, discover_rules, run_rules
from latprof.layers import LOCK
from latprof.pipeline import default_rules

DOC = """Summary line.

    What it detects:
        x
    Why it matters for p99:
        x
    Evidence:
        x
    How to fix:
        x
    Example:
        x
    """

#: The rules an attach finding can come from, and the layers they judge there.
SAMPLE_RULES = {
    "cpu-bound": "app", "db-pool-exhaustion": "db.pool", "event-loop-blocked": "event_loop",
    "http-pool-exhaustion": "http.pool", "lock-contention": "lock", "request-queueing": "queue",
    "retry-backoff": "retry",
}  # fmt: skip


def test_the_rules_that_judge_samples_have_attach_thresholds_at_the_numbers_attach_used():
    judging = {cls.id: cls for cls in discover_rules() if "samples" in cls.judges()}
    assert {k: v.layer for k, v in judging.items()} == SAMPLE_RULES
    for rule_id, cls in judging.items():
        defaults = {name: default for name, _, default in cls.threshold_fields() if name.startswith("attach_")}
        if rule_id == "event-loop-blocked":
            assert defaults == {"attach_min_loop_busy_share": LOOP_SATURATED_SHARE,
                                "attach_min_loop_blocked_share": LOOP_BLOCKED_SHARE}  # fmt: skip
        else:
            assert defaults == {"attach_min_share": attach_analysis.MIN_VERDICT_SHARE}, rule_id
    # the others judge requests only: asked nothing about samples
    assert all(cls.judges() == ("requests",) for cls in discover_rules() if cls.id not in SAMPLE_RULES)


def test_a_lock_workers_wait_in_is_the_lock_rules_finding_and_the_verdict():
    aa = analysed({"lock": 0.6, "cpu": 0.4})
    findings = run_rules(aa, default_rules())
    assert ids(findings) == ["lock-contention", "cpu-bound"]  # by impact
    lock = findings[0]
    assert lock.layer == LOCK and lock.evidence["share_of_busy_time"] == 0.6
    assert lock.summary == f"60% of busy worker time plus queue time was spent blocked on locks; mostly at {LOCKED.function} ({LOCKED.filename})."
    verdict = decide_verdict(aa, findings)
    assert (verdict.layer, verdict.rule, verdict.summary, verdict.status) == (LOCK, "lock-contention", lock.summary, "layer")


def test_the_config_disables_a_rule_or_moves_its_threshold_and_the_verdict_stays_measured():
    aa = analysed({"lock": 0.6, "cpu": 0.4})
    classes = all_rules()
    off = configured(classes, {"lock-contention": RuleSettings(enabled=False)})
    findings = run_rules(aa, off)
    assert ids(findings) == ["cpu-bound"]
    verdict = decide_verdict(aa, findings)  # workers still wait in the lock: the verdict names it, with no rule
    assert (verdict.layer, verdict.rule) == (LOCK, None)
    assert verdict.summary == "Saturated: lock holds 60% of busy worker time plus queue time."
    raised = configured(classes, {"lock-contention": RuleSettings(thresholds={"attach_min_share": 0.61}),
                                  "cpu-bound": RuleSettings(thresholds={"attach_min_share": 0.35})})  # fmt: skip
    assert ids(run_rules(aa, raised)) == ["cpu-bound"]
    at = configured(classes, {"lock-contention": RuleSettings(thresholds={"attach_min_share": 0.6})})
    assert ids(run_rules(aa, at)) == ["lock-contention", "cpu-bound"]


class ExplodingOnSamples(Rule):
    __doc__ = DOC
    id = "exploding-on-samples"
    layer = "app"

    def judge_samples(self, samples):
        raise ZeroDivisionError("division by zero")


class RequestsOnly(Rule):
    __doc__ = DOC
    id = "requests-only"
    layer = "app"

    def check(self, analysis):
        raise AssertionError("a rule that judges requests only is not asked about samples")


def test_a_rule_crashing_on_samples_becomes_a_finding_and_the_report_still_builds():
    aa = analysed({"cpu": 0.7, "socket": 0.3})
    findings = run_rules(aa, [ExplodingOnSamples(), RequestsOnly(), *default_rules()])
    crashed = [f for f in findings if f.crashed]
    assert [f.rule for f in crashed] == ["exploding-on-samples"] and "ZeroDivisionError" in crashed[0].summary
    assert "cpu-bound" in ids(findings)
    report = build_attach_report(aa, findings).to_dict()
    assert report["verdict"]["rule"] == "cpu-bound"
    assert ExplodingOnSamples.judges() == ("samples",) and RequestsOnly.judges() == ("requests",)


def test_a_held_event_loop_is_the_verdict_whether_or_not_its_rule_is_enabled():
    aa = analysed({"sleep": 0.8, "free": 0.2}, loop_busy_share=0.8)
    (finding,) = run_rules(aa, default_rules())
    assert (finding.rule, finding.layer) == ("event-loop-blocked", "event_loop")
    assert finding.evidence["loop_busy_share"] == 0.8 and finding.evidence["held_by"] == {"wchan.sleep": 240}
    assert finding.summary.startswith("The event loop was held 80% of the time, mostly at block (/srv/app/async_app.py)")
    verdict = decide_verdict(aa, [finding])
    assert (verdict.layer, verdict.rule, verdict.summary, verdict.confidence) == (
        "event_loop", "event-loop-blocked", finding.summary, finding.confidence)
    classes = all_rules()
    off = run_rules(aa, configured(classes, {"event-loop-blocked": RuleSettings(enabled=False)}))
    assert off == []
    assert decide_verdict(aa, off) == dataclasses.replace(verdict, rule=None)  # measured: only its rule goes
    unheld = configured(classes, {"event-loop-blocked": RuleSettings(thresholds={"attach_min_loop_busy_share": 0.81})})
    assert run_rules(aa, unheld) == []
    lowered = configured(classes, {"event-loop-blocked": RuleSettings(thresholds={"attach_min_loop_busy_share": 0.8})})
    assert ids(run_rules(aa, lowered)) == ["event-loop-blocked"]


def test_a_held_loop_the_requests_did_not_wait_for_is_no_verdict():
    """CI once named event_loop with confidence 1.0 on a service whose requests were all awaiting
    the provider: the loop's thread read as held (uvloop's native code, or runnable on a busy
    machine), but the census showed the requests were not waiting for it (1% of request time)."""
    held = {"sleep": 0.9, "free": 0.1}
    at_provider = analysed(held, loop_busy_share=0.9, census=(8.0, 8.0))  # all 8 in flight await the provider
    (finding,) = run_rules(at_provider, default_rules())
    assert finding.rule == "event-loop-blocked" and finding.severity == "info" and finding.confidence == 0.0
    assert "spent only 0% of their time waiting for it" in finding.summary
    verdict = decide_verdict(at_provider, [finding])
    assert verdict.layer is None and verdict.status == "not_saturated", verdict
    assert "requests spent only 0% of their time waiting for it" in verdict.summary
    # answers sitting unread at the provider's connections while the loop is busy: those
    # requests wait for the loop, not the provider (2 of 8: a quarter of request time)
    behind = analysed(held, loop_busy_share=0.9, census=(8.0, 8.0, 2.0))
    assert behind.share("event_loop") == 0.25 and behind.share("tool") == 0.75
    (finding,) = run_rules(behind, default_rules())
    assert finding.severity == "critical"
    assert (decide_verdict(behind, [finding]).layer, finding.evidence["share_of_request_time"]) == ("event_loop", 0.25)
    # the same loop with the requests waiting in the process: they waited for the loop
    waiting = analysed(held, loop_busy_share=0.9, census=(8.0, 0.0))
    (finding,) = run_rules(waiting, default_rules())
    assert finding.severity == "critical" and finding.confidence == 0.9
    verdict = decide_verdict(waiting, [finding])
    assert (verdict.layer, verdict.rule) == ("event_loop", "event-loop-blocked") and verdict.share_of_tail_excess == 0.9


def test_a_ceiling_of_db_connections_is_a_pool_only_when_they_carry_statements():
    """6 requests wait in the process beside 3 PostgreSQL connections open every second. Never
    used, they are persistent connections, not a pool the requests wait for: unattributed.
    Carrying statements, the same ceiling is a pool at its limit, inferred (0.5)."""
    free = {"free": 1.0}
    unused = analysed(free, loop_busy_share=0.0, census=(6.0, 0.0), db=(3, 0.0))
    assert unused.wire is not None and unused.wire.db_ceiling == 3 and unused.wire.db_active_share == 0.0
    findings = run_rules(unused, default_rules())
    assert not [f for f in findings if f.layer == "db.pool"], findings
    assert decide_verdict(unused, findings).layer == "unattributed"
    used = analysed(free, loop_busy_share=0.0, census=(6.0, 0.0), db=(3, 0.5))
    findings = run_rules(used, default_rules())
    verdict = decide_verdict(used, findings)
    assert (verdict.layer, verdict.rule, verdict.confidence) == ("db.pool", "db-pool-exhaustion", 0.5), verdict


def test_requests_behind_a_busy_ceiling_of_http_connections_are_http_pool_inferred_under_half():
    """8 requests in flight, 2 connections to one HTTP endpoint every second, both awaiting its
    answer, none at a database: 6 wait in the process, most likely for the client's limit."""
    aa = analysed({"free": 1.0}, loop_busy_share=0.0, census=(8.0, 2.0))
    findings = run_rules(aa, default_rules())
    (finding,) = [f for f in findings if f.rule == "http-pool-exhaustion"]
    assert finding.evidence["inferred"] is True and finding.evidence["http_endpoint"] == "127.0.0.1:8443"
    verdict = decide_verdict(aa, findings)
    assert (verdict.layer, verdict.rule, verdict.confidence) == ("http.pool", "http-pool-exhaustion", 0.4), verdict
    assert verdict.share_of_tail_excess == 0.75 and "semaphore" in verdict.summary
    # a database in use beside it: the wire cannot tell which limit they wait behind
    both = analysed({"free": 1.0}, loop_busy_share=0.0, census=(8.0, 2.0), db=(3, 1.0))
    assert decide_verdict(both, run_rules(both, default_rules())).layer != "http.pool"


def test_a_brief_backlog_behind_busy_cpus_leaves_the_verdict_to_the_cpu():
    # Workers busy running Python; the accept queue read 1 in one of three seconds (a client's
    # next connection arriving while both workers finish their request): the backlog's share of
    # request time is small, so it is the CPU's doing, not a queue that owns the time (CI once
    # named `queue` here with no rule behind it).
    brief = analysed({"cpu": 1.0}, backlog=[1, 0, 0], accept_rate=40)
    assert brief.backlog_seconds_share >= attach_analysis.MIN_BACKLOG_SECONDS_SHARE
    assert 0 < brief.share("queue") < attach_analysis.MIN_VERDICT_SHARE
    findings = run_rules(brief, default_rules())
    assert ids(findings) == ["cpu-bound"]
    verdict = decide_verdict(brief, findings)
    assert (verdict.layer, verdict.rule) == ("app", "cpu-bound"), verdict
    # A backlog that holds a real share of request time is the queue, with its rule.
    standing = analysed({"cpu": 1.0}, backlog=[4, 5, 4], accept_rate=20)
    assert standing.share("queue") >= attach_analysis.MIN_VERDICT_SHARE
    findings = run_rules(standing, default_rules())
    verdict = decide_verdict(standing, findings)
    assert (verdict.layer, verdict.rule) == ("queue", "request-queueing"), (verdict, ids(findings))


def _with_exchanges(timeline, *, llm_frames: bool, first_byte_s: float = 6.0, stream_s: float = 2.0):
    """`timeline` plus what the census's exchange tracking wrote for its HTTP endpoint, and (with
    `llm_frames`) a sample of the loop thread inside the openai client."""
    from attach.sampled import ORIGIN_NS, PID

    from latprof.events import Frame, Gauge, StackSample

    endpoint = {"server.address": "127.0.0.1", "server.port": 8443, "latprof.endpoint.kind": "http"}
    for name, value in (("first_byte_s", first_byte_s), ("stream_s", stream_s), ("exchanges", 40), ("streamed", 36)):
        timeline.gauges["census.outbound." + name] = [Gauge("census.outbound." + name, value, ORIGIN_NS, PID, endpoint)]
    if llm_frames:
        frame = Frame("AsyncStream.__anext__", "/venv/lib/python3.12/site-packages/openai/_streaming.py")
        loop = timeline.samples[0]
        timeline.samples.append(StackSample(ORIGIN_NS, loop.pid, loop.tid, loop.thread_name, (frame, *loop.frames), True))
    return timeline


def test_time_at_the_llm_endpoint_splits_into_provider_and_model_as_its_exchanges_did():
    """8 requests in flight, all at one HTTP endpoint whose answers streamed: with the openai
    client in the stacks it is the provider, its time 75% before the first byte (provider), 25%
    streaming (model); without, the wire cannot tell an LLM from a tool and says tool."""
    from attach.sampled import LOOP_KINDS, sampled

    from latprof.attach.analysis import analyze_attach
    from latprof.layers import MODEL, PROVIDER, TOOL

    free = {"free": 1.0}
    assert set(LOOP_KINDS) >= set(free)
    llm = analyze_attach(_with_exchanges(sampled(free, loop_busy_share=0.0, census=(8.0, 8.0)), llm_frames=True))
    assert llm.wire is not None and llm.wire.llm_endpoint == "127.0.0.1:8443"
    assert "openai" in (llm.wire.llm_recognised_by or "")
    assert round(llm.share(PROVIDER), 2) == 0.75 and round(llm.share(MODEL), 2) == 0.25 and llm.share(TOOL) == 0
    evidence = llm.wire.evidence()
    assert evidence["llm_endpoint"] == "127.0.0.1:8443" and evidence["llm_first_byte_share"] == 0.75
    tool = analyze_attach(_with_exchanges(sampled(free, loop_busy_share=0.0, census=(8.0, 8.0)), llm_frames=False))
    assert tool.wire is not None and tool.wire.llm_endpoint is None
    assert tool.share(TOOL) == 1.0 and tool.share(PROVIDER) == 0 == tool.share(MODEL)
