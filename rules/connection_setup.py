"""Rule connection-setup: LLM calls that pay DNS, TCP and TLS before their first token, again and again."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from latprof.analysis.network import CohortSetup, NetCall, cohort_setup, net_calls, setup_excess_ms
from latprof.analysis.requests import Analysis, percentile
from latprof.engine import Finding, Rule, fmt_ms, severity_for_share
from latprof.layers import PROVIDER

#: Causes, most specific first (evidence `cause`).
KEEPALIVE_LOST = "keepalive_lost"
TOO_FEW_IDLE_CONNECTIONS = "too_few_idle_connections"
SLOW_SETUP = "slow_setup"
FAR_ENDPOINT = "far_endpoint"


@dataclass(frozen=True, slots=True)
class Thresholds:
    #: LLM calls with network timings needed before anything is said.
    min_calls: int = 10
    #: Connection set-up must be at least this share of the LLM calls' time to first token
    #: (of the tail's, when it owns the tail; of every call's, when it does not).
    min_share_of_ttft: float = 0.2
    #: Owning the tail: at least this share of the tail excess, and this many ms of it.
    min_share_of_tail_excess: float = 0.2
    min_tail_excess_ms: float = 50.0
    #: Without a tail it owns, a typical request must pay at least this much set-up.
    min_median_setup_ms: float = 20.0
    #: Keep-alive lost: at least this share of calls opened a new connection.
    keepalive_lost_share: float = 0.8
    #: A far endpoint: a new connection costs at least this much (a few network round trips).
    far_setup_ms: float = 50.0


class ConnectionSetup(Rule):
    """Connection set-up (DNS, TCP connect, TLS handshake) is a large part of time to first token.

    What it detects:
        For LLM calls whose HTTP client reported its connection events (the httpx hook through
        httpcore's trace extension, the openai SDK included; the aiohttp_client hook through a
        TraceConfig), the time spent opening a connection before the request could be sent,
        against the call's time to first token. It names the tail when tail requests paid more
        set-up than median ones, or the typical call when every call pays it; and the likely
        cause: keep-alive lost (almost every call opens a new connection), too few idle
        connections kept (the tail opened connections the median reused), set-up itself slow
        in the tail (a lost handshake packet waits a 1 s retransmission), or a far endpoint.

    Why it matters for p99:
        A new TLS connection costs two to three network round trips before the first byte is
        even sent: 5 ms next door, 100-300 ms to another region, and a second or more when a
        handshake packet is lost. This time sits inside the provider's time to first token, so
        it reads as "the model is slow"; no prompt change, model or provider moves it, while a
        client setting removes it.

    Evidence:
        calls with timings, share of calls that opened a connection (all, tail, median), the
        set-up per new connection (p50, p99; DNS, connect, TLS p50), set-up per request and its
        share of time to first token in the tail and the median cohorts, the server's time to
        first byte p50, a network round trip inferred from the TCP connect time, and when the
        tail is owned, the set-up excess and its share of the tail excess.

    How to fix:
        Keep connections: create the client once per process and reuse it (not per request or
        per call); use HTTP/2 (httpx `http2=True`), which carries every call on one connection,
        where HTTP/1.1 closes a connection whenever a stream is left before its end; keep as
        many idle connections as calls in flight (httpx `Limits(max_keepalive_connections=...)`,
        aiohttp `TCPConnector(limit_per_host=...)`) with a keep-alive expiry longer than the gap
        between calls. For a far endpoint, call a closer region or a regional endpoint.

    Example:
        A chat service on another continent's endpoint: TTFT p50 700 ms, p99 2.1 s. Every
        streamed call opens a new TLS connection (120 ms p50); in the slowest 1% the handshake
        took 1.1 s (a lost packet). Connection set-up explains 70% of the tail excess: HTTP/2
        on one client removes all but the first handshake.
    """

    id = "connection-setup"
    layer = PROVIDER
    Thresholds = Thresholds

    def check(self, analysis: Analysis) -> Iterable[Finding]:
        t: Thresholds = self.thresholds
        calls = net_calls(analysis)
        if len(calls) < t.min_calls:
            return
        tail = cohort_setup(analysis, calls, "tail") if analysis.has_tail else None
        median = cohort_setup(analysis, calls, "median")
        excess = setup_excess_ms(tail, median)
        share_of_excess = excess / analysis.tail_excess_ms if analysis.tail_excess_ms > 0 else 0.0
        owns_tail = (
            tail is not None
            and excess >= t.min_tail_excess_ms
            and share_of_excess >= t.min_share_of_tail_excess
            and _share(tail) >= t.min_share_of_ttft
        )
        overall_setup = sum(c.setup_ms for c in calls)
        overall_provider = sum(c.provider_ms for c in calls)
        overall_share = overall_setup / overall_provider if overall_provider > 0 else 0.0
        typical = (
            median is not None and median.setup_mean_ms >= t.min_median_setup_ms and overall_share >= t.min_share_of_ttft
        )
        if not owns_tail and not typical:
            return
        yield self._finding(analysis, calls, tail, median, excess, share_of_excess, overall_share, owns_tail)

    def _finding(
        self,
        analysis: Analysis,
        calls: Sequence[NetCall],
        tail: CohortSetup | None,
        median: CohortSetup | None,
        excess: float,
        share_of_excess: float,
        overall_share: float,
        owns_tail: bool,
    ) -> Finding:
        t: Thresholds = self.thresholds
        new = [c for c in calls if c.new_connection]
        new_share = len(new) / len(calls)
        setups = sorted(c.setup_ms for c in new)
        evidence: dict[str, Any] = {
            "calls_with_network_timings": len(calls),
            "new_connection_share": round(new_share, 4),
            "setup_share_of_ttft": round(overall_share, 4),
            "threshold_share_of_ttft": t.min_share_of_ttft,
        }
        if setups:
            evidence["setup_per_new_connection_p50_ms"] = round(percentile(setups, 50), 3)
            evidence["setup_per_new_connection_p99_ms"] = round(percentile(setups, 99), 3)
            for key, values in (("dns", [c.dns_ms for c in new]), ("connect", [c.connect_ms for c in new]),
                                ("tls", [c.tls_ms for c in new])):  # fmt: skip
                known = sorted(v for v in values if v is not None)
                if known:
                    evidence[f"{key}_p50_ms"] = round(percentile(known, 50), 3)
            connects = sorted(c.connect_ms for c in new if c.connect_ms is not None)
            if connects:  # a TCP handshake is one round trip (DNS included where the client resolves inside it)
                evidence["round_trip_ms_inferred"] = round(percentile(connects, 50), 3)
        servers = sorted(c.server_ms for c in calls if c.server_ms is not None)
        if servers:
            evidence["server_first_byte_p50_ms"] = round(percentile(servers, 50), 3)
        for name, cohort in (("tail", tail), ("median", median)):
            if cohort is not None:
                evidence[f"{name}_setup_mean_ms"] = round(cohort.setup_mean_ms, 3)
                evidence[f"{name}_setup_share_of_ttft"] = round(_share(cohort), 4)
                evidence[f"{name}_new_connection_share"] = round(cohort.new_connection_share, 4)
        cause = _cause(t, new_share, tail, median, setups)
        evidence["cause"] = cause
        if owns_tail:
            evidence["tail_excess_ms"] = round(excess, 3)
            evidence["share_of_tail_excess"] = round(share_of_excess, 4)
            evidence["example_request_ids"] = _examples(analysis, calls)

        setup_p50 = fmt_ms(percentile(setups, 50)) if setups else "0 ms"
        if owns_tail:
            assert tail is not None
            summary = (
                f"Opening connections to the LLM provider explains {share_of_excess:.0%} of the tail excess: the slowest"
                f" 1% of requests spent {fmt_ms(tail.setup_mean_ms)} on DNS, TCP and TLS before their first byte was"
                f" sent ({_share(tail):.0%} of their time to first token), {fmt_ms(excess)} more than a median request"
            )
            severity = severity_for_share(share_of_excess)
            confidence = min(0.95, 0.55 + share_of_excess / 2)
        else:
            summary = (
                f"Opening connections to the LLM provider is {overall_share:.0%} of its time to first token: a median"
                f" request spends {fmt_ms(median.setup_mean_ms if median else 0.0)} on DNS, TCP and TLS"
            )
            severity = "warning" if overall_share >= 0.4 else "info"
            confidence = min(0.9, 0.5 + overall_share / 2)
        summary += f"; {new_share:.0%} of {len(calls)} calls opened a new connection ({setup_p50} each at p50). "
        summary += _CAUSE_TEXT[cause].format(**_cause_values(evidence))
        return self.finding(
            severity=severity,
            confidence=confidence,
            impact_ms=excess if owns_tail else 0.0,
            summary=summary,
            evidence=evidence,
            fix=_FIX[cause],
        )


def _share(cohort: CohortSetup) -> float:
    return cohort.setup_mean_ms / cohort.provider_mean_ms if cohort.provider_mean_ms > 0 else 0.0


def _cause(t: Thresholds, new_share: float, tail: CohortSetup | None, median: CohortSetup | None, setups: list[float]) -> str:
    """The likeliest cause, inferred from who opened connections and what each cost."""
    if tail is not None and median is not None and setups:
        typical = percentile(setups, 50)
        per_new_tail = tail.setup_mean_ms / max(tail.new_connection_share, 1e-9) if tail.new_connection_share else 0.0
        if tail.new_connection_share <= median.new_connection_share + 0.25 and per_new_tail >= 3 * max(typical, 1.0):
            return SLOW_SETUP
        if tail.new_connection_share >= 0.5 and median.new_connection_share <= 0.25:
            return TOO_FEW_IDLE_CONNECTIONS
    if new_share >= t.keepalive_lost_share:
        return KEEPALIVE_LOST
    if setups and percentile(setups, 50) >= t.far_setup_ms:
        return FAR_ENDPOINT
    return TOO_FEW_IDLE_CONNECTIONS


def _cause_values(evidence: dict[str, Any]) -> dict[str, str]:
    return {
        "setup": fmt_ms(evidence.get("setup_per_new_connection_p50_ms", 0.0)),
        "setup_p99": fmt_ms(evidence.get("setup_per_new_connection_p99_ms", 0.0)),
        "rtt": fmt_ms(evidence.get("round_trip_ms_inferred", 0.0)),
    }


_CAUSE_TEXT = {
    KEEPALIVE_LOST: "Inferred cause: keep-alive is lost - almost every call opens its own connection.",
    TOO_FEW_IDLE_CONNECTIONS: (
        "Inferred cause: too few idle connections are kept - the tail opened connections that median requests"
        " found open."
    ),
    SLOW_SETUP: (
        "Inferred cause: set-up itself was slow in the tail ({setup_p99} at p99 against {setup} at p50) - a lost"
        " handshake packet waits a retransmission (1 s on Linux), or DNS or the path stalled."
    ),
    FAR_ENDPOINT: (
        "Inferred cause: a far endpoint - each new connection costs {setup}, a TCP connect alone about {rtt}"
        " (one round trip)."
    ),
}

_KEEP = (
    "Create the LLM client once per process and reuse it; use HTTP/2 (httpx `http2=True`, `pip install httpx[http2]`),"
    " which carries every call on one connection"
)
_FIX = {
    KEEPALIVE_LOST: (
        f"{_KEEP}, where HTTP/1.1 closes a connection whenever a stream is left before its end (the openai SDK stops"
        " reading at `[DONE]`). Check that no proxy between you and the provider sends `Connection: close`."
    ),
    TOO_FEW_IDLE_CONNECTIONS: (
        "Keep as many idle connections as calls in flight: httpx `Limits(max_keepalive_connections=...)` (openai's"
        " default is 100, httpx's 20), aiohttp `TCPConnector(limit_per_host=...)`, and a keep-alive expiry longer than"
        f" the gaps between calls. {_KEEP}."
    ),
    SLOW_SETUP: (
        f"{_KEEP}: the fewer handshakes, the fewer that can stall. Look for packet loss or SYN drops on the path"
        " (`nstat TcpExtTCPSynRetrans`), and for slow DNS (cache it, or resolve once)."
    ),
    FAR_ENDPOINT: (
        f"Call a closer region or a regional endpoint. {_KEEP}, so that only the first call pays the round trips."
    ),
}


def _examples(analysis: Analysis, calls: Sequence[NetCall]) -> list[str]:
    """Up to 3 tail requests, most set-up first."""
    tail = set(analysis.groups.tail)
    per_request: dict[int, float] = {}
    for call in calls:
        if call.request_index in tail:
            per_request[call.request_index] = per_request.get(call.request_index, 0.0) + call.setup_ms
    ranked = sorted(per_request, key=lambda i: -per_request[i])[:3]
    return [analysis.requests[i].request.request_id for i in ranked if per_request[i] > 0]
