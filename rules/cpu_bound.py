"""Rule cpu-bound: the service's workers spend their time running its own Python code on the CPU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from latprof.engine import Finding, Rule
from latprof.layers import APP

if TYPE_CHECKING:
    from latprof.attach.analysis import AttachAnalysis


@dataclass(frozen=True, slots=True)
class Thresholds:
    #: A finding when the workers run Python (not waiting) for this share of their busy time, or of
    #: their busy time plus the time connections queued for them.
    attach_min_share: float = 0.2


class CpuBound(Rule):
    """The workers are busy running the service's own Python code: the CPU is what they wait for.

    What it detects:
        In an attach capture (`latprof attach`), the request workers' stack samples show them
        running Python on the CPU - not waiting for a pool, a lock, a socket or a sleep - for
        at least `attach_min_share` of their busy time. It judges samples only: in a capture
        of `latprof run` or a trace, CPU time is the `app` layer of each request.

    Why it matters for p99:
        A worker running Python holds the GIL: the other threads of its process wait for it,
        and once every worker is busy, new requests queue in the accept backlog. Nothing
        outside the process is slow, so adding connections, raising timeouts or scaling the
        database changes nothing; the tail grows with the load.

        A thread waiting for the GIL (a timed futex wait while another thread of the process
        runs) counts here, not as lock contention: it waits for the CPU, and no lock of the
        service is involved.

    Evidence:
        the share of busy worker time (and of busy plus queue time) spent running Python
        (`gil_wait_share`: how much of it was threads waiting for the GIL),
        the number of workers and how often they were idle, the stack samples behind it, their
        signatures, and the three hottest frames of the service's own code as "function
        (file)" with their sample counts.

    How to fix:
        Find the hot code in the evidence's frames and make it cheaper, move CPU-heavy work
        off the request path (a task queue, a process pool), or add worker processes: threads
        share one GIL.

    Example:
        Two gunicorn sync workers render a report in Python for 50 ms per request. Under
        load, `latprof attach` finds both workers busy 95% of the time, 90% of it in
        `render (app/reports.py)`: app is the verdict and cpu-bound names the frame to
        optimise.
    """

    id = "cpu-bound"
    layer = APP
    Thresholds = Thresholds

    def judge_samples(self, samples: AttachAnalysis) -> Iterable[Finding]:
        from latprof.attach.analysis import layer_findings

        return layer_findings(self, samples, APP, min_share=self.thresholds.attach_min_share)
