"""An LLM call's network before its answer: connection set-up (DNS, connect, TLS) and the server's first byte, per call and per request."""

from __future__ import annotations

from typing import NamedTuple

from latprof.analysis.requests import NS_PER_MS, Analysis
from latprof.analysis.genai import token_count
from latprof.layers import PROVIDER
from latprof.semconv import NET_CONNECT_MS, NET_DNS_MS, NET_NEW_CONNECTION, NET_SERVER_MS, NET_TLS_MS


class NetCall(NamedTuple):
    """One LLM call whose HTTP client said how its last attempt went (`latprof.net.*` on its `provider` segment)."""

    request_index: int
    provider_ms: float  # the provider segment: TTFT for a streamed call, the whole call otherwise
    new_connection: bool
    dns_ms: float | None
    connect_ms: float | None
    tls_ms: float | None
    server_ms: float | None

    @property
    def setup_ms(self) -> float:
        """DNS, connect and TLS: what opening the connection cost the call (0 on a reused one)."""
        return sum(v for v in (self.dns_ms, self.connect_ms, self.tls_ms) if v is not None)


def net_calls(analysis: Analysis) -> list[NetCall]:
    """The analysed requests' LLM calls with network timings, in request order."""
    out = []
    for index, segment in analysis.segments(PROVIDER):
        attrs = segment.attrs
        new = attrs.get(NET_NEW_CONNECTION)
        if not isinstance(new, bool):
            continue
        out.append(NetCall(index, max(0.0, (segment.end_ns - segment.start_ns) / NS_PER_MS), new,
                           token_count(attrs.get(NET_DNS_MS)), token_count(attrs.get(NET_CONNECT_MS)),
                           token_count(attrs.get(NET_TLS_MS)), token_count(attrs.get(NET_SERVER_MS))))  # fmt: skip
    return out


class CohortSetup(NamedTuple):
    """Connection set-up in a cohort's requests (those with timed LLM calls), weighted like the cohort."""

    requests: int
    setup_mean_ms: float  # per request: every call's set-up summed
    provider_mean_ms: float  # per request: the same calls' provider time
    new_connection_share: float  # of the calls


def cohort_setup(analysis: Analysis, calls: list[NetCall], which: str) -> CohortSetup | None:
    """Set-up in cohort `which` (`tail`, `median`), or None when none of its requests has a timed call."""
    members = set(getattr(analysis.groups, which))
    per_request: dict[int, list[NetCall]] = {}
    for call in calls:
        if call.request_index in members:
            per_request.setdefault(call.request_index, []).append(call)
    if not per_request:
        return None
    weight = total_setup = total_provider = 0.0
    new = count = 0
    for index, own in per_request.items():
        w = analysis.weight(index)
        weight += w
        total_setup += w * sum(c.setup_ms for c in own)
        total_provider += w * sum(c.provider_ms for c in own)
        new += sum(c.new_connection for c in own)
        count += len(own)
    return CohortSetup(len(per_request), total_setup / weight, total_provider / weight, new / count)


def setup_excess_ms(tail: CohortSetup | None, median: CohortSetup | None) -> float:
    """How much more connection set-up a tail request paid than a median one (0 without a tail's timings)."""
    if tail is None:
        return 0.0
    return max(0.0, tail.setup_mean_ms - (median.setup_mean_ms if median is not None else 0.0))


def tail_setup_excess_ms(analysis: Analysis, calls: list[NetCall]) -> float:
    """`setup_excess_ms` of the analysis's cohorts over `calls` (`net_calls`); 0 without a tail.

    The part of the `provider` layer's tail excess that the network's set-up explains: rules
    that explain the rest of that layer (`provider-floor`) leave it to `connection-setup`.
    """
    if not analysis.groups.tail or not calls:
        return 0.0
    return setup_excess_ms(cohort_setup(analysis, calls, "tail"), cohort_setup(analysis, calls, "median"))
