"""Requests of a threaded server, reconstructed from each worker thread's samples in order.

A worker thread of a threaded server (gunicorn's sync and gthread workers, the anyio threads
behind FastAPI's sync endpoints, waitress) serves one request at a time. In one py-spy
recording (`latprof.collectors.attach.pyspy.Window`), a run of a thread's samples inside a
request's frames (`SERVING_FRAMES`) between two samples outside them is one request: it began
about when the run's first sample was taken and ended by the sample after its last. Each of
its samples says which layer it was in (`latprof.collectors.attach.stacks`), so the request
gets a segment per stretch of samples in one layer, and the request rules apply to it as to a
request a hook recorded. Requests so made are inferred, and say so: `RECONSTRUCTED` (the rate
they were sampled at) on the request, `latprof.inferred` on every segment.

What sampling cannot see, and how the analysis is told:
- a run cut by either end of a recording is left out (it may have begun or ended in the gap
  between recordings): `GAUGE_CUT` counts them per recording. Long requests are cut more often
  than short ones, so the slowest are under-represented, never made up.
- the time a request waits before a thread picks it up (the accept backlog, gthread's queue)
  is not in it: the attach analysis measures that queue from the kernel's accept queue.
- a request shorter than a sampling interval may fall between two samples; two requests with
  no sample outside the request's frames between them are one run (a worker that picks the
  next request at once): the analysis leaves a thread out when it was not seen idle
  (`min_idle_share`).
- time a worker waits for work it handed to other threads (`future.result`) is `unattributed`
  here; the attach analysis counts those threads' own samples.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from latprof.collectors.attach.stacks import IDLE, Classification, classify_sample, has_frame, library_file
from latprof.events import Frame as EventFrame
from latprof.events import Gauge, Request, Segment, StackSample
from latprof.layers import UNATTRIBUTED

#: Frames of a thread that serves a request (file suffix, function): the server's workers.
SERVING_FRAMES = (
    ("gunicorn/workers/sync.py", "handle_request"),
    ("gunicorn/workers/gthread.py", "handle_request"),
    ("anyio/_backends/_asyncio.py", "run"),  # WorkerThread.run: FastAPI/Starlette sync endpoints
    ("uvicorn/protocols/http/h11_impl.py", "run_asgi"),
    ("uvicorn/protocols/http/httptools_impl.py", "run_asgi"),
    ("waitress/channel.py", "service"),
)
#: Of those, the frames of threads that serve one request at a time (not an event loop's, on
#: which coroutines of many requests interleave).
THREAD_SERVING_FRAMES = tuple(f for f in SERVING_FRAMES if not f[0].startswith("uvicorn/"))

#: float on a request made from samples: the rate (Hz) its thread was sampled at.
RECONSTRUCTED = "latprof.reconstructed.rate_hz"
#: int on a request made from samples: the kernel thread id that served it.
THREAD_ID = "thread.id"
#: Gauge per recording: runs of a worker's samples cut by the recording's start or end (left out).
GAUGE_CUT = "requests.reconstructed.cut"
#: What reconstructed requests are inferred from (`evidence.inferred_from`).
INFERRED_FROM_SAMPLES = "runs of each worker thread's stack samples between two idle samples (requests reconstructed)"


def _thread_serving(frames: Iterable[Any]) -> bool:
    return has_frame(frames, THREAD_SERVING_FRAMES)


def _route(frames: Sequence[EventFrame]) -> str:
    """The service's outermost own frame (its handler) as "function (file)", else "?"."""
    for f in reversed(frames):  # outermost first
        if not library_file(f.filename):
            return f"{f.function} ({f.filename.rsplit('/', 1)[-1]})"
    return "?"


def reconstruct(
    window: Any, wchan_in: Callable[[int, int, int], str | None] | None = None
) -> tuple[list[Request | Segment], Gauge | None]:
    """The requests the worker threads of one recording (`window`) served whole, as request and
    segment events, and a gauge of the runs left out because the recording cut them.

    `wchan_in(tid, start_ns, end_ns)` gives the wait channel a thread was most seen in over a
    time range, for a stack no signature explains (a C call); without it such stacks are
    classified as the wait channel-less samples they are."""
    spans_by_thread = window.spans
    if not spans_by_thread:
        return [], None
    frames_at = [tuple(EventFrame(f.name, f.file) for f in c.frames) for c in window.counts]
    serving_at = [_thread_serving(frames) for frames in frames_at]
    rate_hz = float(window.rate)
    events: list[Request | Segment] = []
    cut = 0
    for tid, spans in spans_by_thread.items():
        if not any(serving_at[index] for _, _, index in spans):
            continue
        # per span: (start, end, (layer, signature) while in a request, else None, stack index)
        marked: list[tuple[int, int, tuple[str, str] | None, int]] = []
        for begin, end, index in spans:
            start_ns, end_ns = window.start_ns + begin, window.start_ns + end
            mark = None
            if serving_at[index]:
                wchan = wchan_in(tid, start_ns, end_ns) if wchan_in is not None else None
                c = classify_sample(StackSample(start_ns, window.pid, tid, "", frames_at[index], wchan == "0", wchan))
                mark = None if c.state == IDLE else (c.layer or UNATTRIBUTED, c.signature)
            marked.append((start_ns, end_ns, mark, index))
        k, n = 0, len(marked)
        while k < n:
            if marked[k][2] is None:
                k += 1
                continue
            first = k
            while k < n and marked[k][2] is not None:
                k += 1
            if first == 0 or k == n:  # began before the recording, or ended after it
                cut += 1
                continue
            events += _request(window.pid, tid, rate_hz, marked[first:k], frames_at)
    gauge = Gauge(GAUGE_CUT, cut, window.start_ns, window.pid) if cut or events else None
    return events, gauge


def _request(
    pid: int, tid: int, rate_hz: float, run: list[tuple[int, int, tuple[str, str] | None, int]],
    frames_at: list[tuple[EventFrame, ...]],
) -> list[Request | Segment]:  # fmt: skip
    """One run of spans as a request and its segments, one per stretch in one layer."""
    start, end = run[0][0], run[-1][1]
    request_id = f"attach-{pid}-{tid}-{start}"
    route = Counter(_route(frames_at[index]) for _, _, _, index in run).most_common(1)[0][0]
    out: list[Request | Segment] = [Request(request_id, route, start, end, pid, attrs={RECONSTRUCTED: rate_hz, THREAD_ID: tid})]
    j = 0
    while j < len(run):
        seg_start, _, mark, _ = run[j]
        assert mark is not None
        layer, signature = mark
        stretch = j
        while j < len(run) and (run[j][2] or ("", ""))[0] == layer:
            j += 1
        if layer == UNATTRIBUTED:  # time no segment covers is the request's unattributed time
            continue
        out.append(Segment(request_id, f"{request_id}-{stretch}", None, signature, layer, seg_start, run[j - 1][1], pid,
                           {RECONSTRUCTED: rate_hz}))  # fmt: skip
    return out
