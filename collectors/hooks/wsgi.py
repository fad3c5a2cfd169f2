"""Inbound HTTP requests of WSGI services under gunicorn (sync and gthread workers), any WSGI app; Flask routes.

One request root per HTTP request, backdated to when its bytes reached the server's socket:

- **Where it hooks.** gunicorn's `Worker.load_wsgi`, which every worker runs after the fork
  (with `--preload` too, where the app itself was imported in the master): the worker's
  WSGI callable is wrapped, so any WSGI application (Flask, Django, Falcon, bare callables)
  is seen. gthread's `ThreadWorker.enqueue_req` notes when a connection was handed to the
  worker's thread pool. Flask's `RequestContext.match_request` names the route.
- **Which requests.** As the ASGI hook: every request up to `latprof run --max-rate` a
  second per process, above that a weighted random sample (`runtime.Sampler`); a request
  outside the sample calls the application untouched.
- **Start.** The connection's socket is `environ["gunicorn.socket"]`; TCP_INFO on it says
  when the request's last bytes arrived (`_inbound.last_data_arrival`), read when the
  application is called. An `X-Request-Start` header moves the start earlier still (a
  `queue` segment with `latprof.queue.source = "header"`). Without a TCP socket (a unix
  socket, another WSGI server) the request starts when the application was called, and a
  warning record says so once per process.
- **Before the application.** The time from arrival to the application call is `queue`: in
  a sync worker, the connection waited in the accept backlog for the worker to be free
  (`latprof.queue.source = "backlog"`); in a gthread worker, the part after the connection
  was handed to the thread pool is the wait for a worker thread (`"threadpool"`), the part
  before it the backlog. Waits under a millisecond get no segment (TCP_INFO counts in
  kernel ticks of 1-10 ms).
- **End** is when the server closes the application's response iterable, which it does
  after writing the last bytes (PEP 3333). A `wsgi.file_wrapper` response (sendfile) is
  not wrapped, so that the server still recognises it: it ends when the application
  returned it.
- **cpu_ns** is the thread CPU time from the application call to the end, when the same
  thread ends it (both gunicorn worker types do).
- **Route** is the method and Flask's matched URL rule (`POST /chat/<int:id>`), never the raw
  path; `<unmatched>` when Flask matched nothing, `<no route>` for other applications.
- A request already open in this context (a WSGI app mounted inside an ASGI one) is not
  opened again.
- **Installed late** (into a worker that is already serving): the worker ran `load_wsgi`
  long ago, so when the gunicorn part is applied the running workers of this process are
  found (the frames of its threads whose `self` is a gunicorn `Worker`: the main thread runs
  `worker.run()`) and their `worker.wsgi` is wrapped there and then. Requests the worker
  starts after that are recorded from their arrival; those already being handled run on in
  the application they began in, unrecorded. Uninstall puts each worker's application back
  (when `worker.wsgi` is still the wrapper).
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from typing import Any, Callable, Iterable, Iterator

from latprof.collectors.hooks import _inbound, _scaffold, runtime
from latprof.layers import QUEUE
from latprof.semconv import NOTE_WARNING, QUEUE_SOURCE, SAMPLE_WEIGHT

HOOK = "wsgi"

#: Waits before the application shorter than this get no `queue` segment.
MIN_QUEUE_NS = 1_000_000
BACKLOG_WAIT = "accept backlog"
THREADPOOL_WAIT = "threadpool wait"
BEHIND_THE_PROXY = "queue before the server (X-Request-Start)"
NO_ROUTE = "<no route>"
UNMATCHED = "<unmatched>"

_time_ns = time.time_ns
_thread_time_ns = time.thread_time_ns

#: gthread: when each connection was last handed to the thread pool (wall-clock ns), by the
#: socket's file descriptor. An entry is overwritten each time a connection on that descriptor
#: is handed over, before the request it carries is read, so a closed connection's entry is
#: never read for a later one; at most one entry per descriptor. A plain dict: one store
#: under the GIL, no lock, on every request whether it is recorded or not.
_enqueued: dict[int, int] = {}


# --- gunicorn ----------------------------------------------------------------------------------


def _patch_worker(module: Any) -> None:
    cls = module.Worker
    original = cls.__dict__["load_wsgi"]
    part = scaffold._current

    def load_wsgi(self: Any) -> Any:
        result = original(self)
        try:
            _wrap_worker(self, part)
        except Exception as exc:
            runtime.count_error(HOOK, exc)
        return result

    functools.update_wrapper(load_wsgi, original)
    scaffold.replace(cls, "load_wsgi", load_wsgi)
    for worker in running_workers(cls):  # installed late: the workers loaded their application already
        _wrap_worker(worker, part)


def _wrap_worker(worker: Any, part: _scaffold.Library | None) -> None:
    """Wrap the worker's WSGI application (once), and put it back at uninstall if it is still the wrapper."""
    app = getattr(worker, "wsgi", None)
    if app is None or getattr(app, _scaffold.MARK, None) is not None:
        return
    wrapped = wrap_app(app, server="gunicorn", threaded=type(worker).__name__ == "ThreadWorker")
    worker.wsgi = wrapped

    def unwrap() -> None:
        if vars(worker).get("wsgi") is wrapped:
            worker.wsgi = app
        _enqueued.clear()  # (gthread's hand-off times: nothing reads them any more)

    scaffold.on_uninstall(unwrap, part)


def running_workers(cls: type) -> list[Any]:
    """The gunicorn workers (instances of `cls`, `gunicorn.workers.base.Worker`) running in this process
    whose WSGI application is loaded the way `Worker.load_wsgi` loads it.

    Found in the frames of this process's threads: the main thread of a worker runs
    `worker.run()`, a gthread worker's threads `worker.handle(...)`. Only frames of gunicorn's
    worker modules are looked at, and only their first argument.
    """
    found: dict[int, Any] = {}
    for top in sys._current_frames().values():
        frame: Any = top
        while frame is not None:
            code = frame.f_code
            if code.co_argcount and code.co_varnames[0] == "self" and \
                    str(frame.f_globals.get("__name__", "")).startswith("gunicorn.workers."):  # fmt: skip
                worker = frame.f_locals.get("self")
                if isinstance(worker, cls) and id(worker) not in found and _loads_like(type(worker), cls):
                    found[id(worker)] = worker
            frame = frame.f_back
    return list(found.values())


def _loads_like(worker_class: type, cls: type) -> bool:
    """Whether workers of `worker_class` load their application with `cls.load_wsgi` (sync, gthread: a
    WSGI callable), not a `load_wsgi` of their own (gunicorn's ASGI worker)."""
    for klass in worker_class.__mro__:
        if "load_wsgi" in vars(klass):
            return klass is cls
    return False


def _patch_gthread(module: Any) -> None:
    cls = module.ThreadWorker
    original = cls.__dict__["enqueue_req"]

    def enqueue_req(self: Any, conn: Any) -> Any:
        try:
            sock = getattr(conn, "sock", None)
            if sock is not None and runtime._writer is not None:
                _enqueued[sock.fileno()] = _time_ns()
        except Exception as exc:
            runtime.count_error(HOOK, exc)
        return original(self, conn)

    functools.update_wrapper(enqueue_req, original)
    scaffold.replace(cls, "enqueue_req", enqueue_req)


# --- the application ---------------------------------------------------------------------------


def wrap_app(app: Callable[..., Any], *, server: str = "wsgi", threaded: bool = False) -> Callable[..., Any]:
    """`app` with every call recorded as a request (see the module's notes).

    `threaded`: the server hands connections to a thread pool (gthread), so time after the
    hand-off is a wait for a worker thread rather than the accept backlog.
    """

    def application(environ: Any, start_response: Callable[..., Any]) -> Any:
        if not runtime.active() or runtime.current_request() is not None:
            return app(environ, start_response)
        timing = runtime.cost_begin()
        try:
            weight = runtime.sampler()
            request = _open(environ, weight, threaded) if weight else None
        except Exception as exc:
            runtime.count_error(HOOK, exc)
            request = None
        runtime.cost_end(timing)
        if request is None:
            return app(environ, start_response)

        def start(status: str, headers: Any, exc_info: Any = None) -> Any:
            try:
                request.status = int(str(status)[:3])
            except (TypeError, ValueError):
                pass
            return start_response(status, headers, exc_info) if exc_info is not None else start_response(status, headers)

        try:
            result = app(environ, start)
        except BaseException:
            if request.status is None:
                request.status = 500
            _finish(request)
            raise
        file_wrapper = environ.get("wsgi.file_wrapper")
        if isinstance(file_wrapper, type) and isinstance(result, file_wrapper):
            _finish(request)
            return result
        return _Response(result, request)

    functools.update_wrapper(application, app)
    setattr(application, _scaffold.MARK, app)  # wrapped once: gunicorn may load the app again
    return application


class _Request:
    __slots__ = ("token", "state", "status", "thread", "cpu0", "finished")

    def __init__(self, token: Any, state: runtime.RequestState, thread: int, cpu0: int) -> None:
        self.token = token
        self.state = state
        self.status: int | None = None
        self.thread = thread
        self.cpu0 = cpu0
        self.finished = False


def _open(environ: Any, weight: int, threaded: bool) -> _Request | None:
    """Open the request whose application call starts now: its arrival, waits before, root."""
    called_ns = _time_ns()
    sock = environ.get("gunicorn.socket")
    _inbound.load()
    arrival_ns: int | None = None
    if _inbound.has_tcp_info(sock):
        arrival_ns = _inbound.last_data_arrival(sock, called_ns)
    else:
        _inbound.note_once(
            HOOK,
            NOTE_WARNING,
            "wsgi: no TCP_INFO on the server's socket (unix socket, not gunicorn or not Linux): requests start"
            " when the application was called, time they waited before that is not seen",
        )
    arrival = min(arrival_ns, called_ns) if arrival_ns is not None else called_ns
    header_ns = _inbound.header_start(environ.get("HTTP_X_REQUEST_START"), arrival, HOOK)
    start_ns = header_ns if header_ns is not None else arrival
    attrs = {SAMPLE_WEIGHT: weight} if weight > 1 else None
    token, state = runtime.open_request(f"{environ.get('REQUEST_METHOD') or 'GET'} {NO_ROUTE}", start_ns, attrs)
    runtime.saw(HOOK)
    request = _Request(token, state, threading.get_ident(), _thread_time_ns())
    if header_ns is not None and header_ns < arrival:
        _segment(state, BEHIND_THE_PROXY, header_ns, arrival, "header")
    if called_ns - arrival >= MIN_QUEUE_NS:
        handed = None
        if threaded and sock is not None:
            handed = _enqueued.get(sock.fileno())
        if handed is None or handed > called_ns:  # a sync worker: it accepted the connection when free
            _segment(state, BACKLOG_WAIT, arrival, called_ns, "backlog")
        elif handed <= arrival:  # in the thread pool's queue before its bytes arrived
            _segment(state, THREADPOOL_WAIT, arrival, called_ns, "threadpool")
        else:
            pool_from = arrival  # a backlog wait too short to tell apart is the pool's: the queue starts at arrival
            if handed - arrival >= MIN_QUEUE_NS:
                _segment(state, BACKLOG_WAIT, arrival, handed, "backlog")
                pool_from = handed
            if called_ns - pool_from >= MIN_QUEUE_NS:
                _segment(state, THREADPOOL_WAIT, pool_from, called_ns, "threadpool")
    return request


def _segment(state: runtime.RequestState, name: str, start_ns: int, end_ns: int, source: str) -> None:
    runtime.record(name, QUEUE, start_ns, end_ns, {QUEUE_SOURCE: source}, parent_id=runtime.ROOT, state=state)


def _finish(request: _Request) -> None:
    """Emit the request's root (once); never raises."""
    if request.finished:
        return
    timing = runtime.cost_begin()
    request.finished = True
    try:
        end_ns = _time_ns()
        state = request.state
        if threading.get_ident() == request.thread:
            state.cpu_ns = max(0, _thread_time_ns() - request.cpu0)
        state.status_code = request.status
        runtime.end_request(request.token, end_ns)
    except Exception as exc:
        runtime.count_error(HOOK, exc)
    runtime.cost_end(timing)


class _Response:
    """The application's response iterable; the request ends when the server closes it."""

    __slots__ = ("_inner", "_request")

    def __init__(self, inner: Iterable[bytes], request: _Request) -> None:
        self._inner = inner
        self._request = request

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._inner)

    def close(self) -> None:
        try:
            close = getattr(self._inner, "close", None)
            if close is not None:
                close()
        finally:
            _finish(self._request)

    def __del__(self) -> None:  # a server that never closes: the root is still emitted
        if not self._request.finished:
            _finish(self._request)


# --- route templates ---------------------------------------------------------------------------


def _patch_flask(module: Any) -> None:
    cls = module.RequestContext
    original = cls.__dict__["match_request"]

    def match_request(self: Any) -> Any:
        try:
            return original(self)
        finally:
            try:
                state = runtime.current_request()
                if state is not None and state.route.endswith(NO_ROUTE):
                    request = self.request
                    rule = getattr(request, "url_rule", None)
                    template = getattr(rule, "rule", None)
                    state.route = f"{request.method} {template if isinstance(template, str) else UNMATCHED}"
            except Exception as exc:
                runtime.count_error(HOOK, exc)

    functools.update_wrapper(match_request, original)
    scaffold.replace(cls, "match_request", match_request)


_T = _scaffold.Target
#: What the hook patches, each part when (if ever) its module is imported, in the lines the
#: README's command installs.
#: In this order: installed into a serving process, the route (Flask) and the thread-pool hand-off
#: are patched before the running worker's application is wrapped, so that no request it
#: records lacks them.
scaffold = _scaffold.Hook(HOOK, [
    _scaffold.Library("flask.ctx", [_T("flask.ctx", "RequestContext", "match_request", False)], _patch_flask,
                      [_scaffold.Tested("flask", "3.1", "3.1")]),
    _scaffold.Library("gunicorn.workers.gthread", [_T("gunicorn.workers.gthread", "ThreadWorker", "enqueue_req", False)],
                      _patch_gthread, [_scaffold.Tested("gunicorn", "27.0", "27.0")]),
    _scaffold.Library("gunicorn.workers.base", [_T("gunicorn.workers.base", "Worker", "load_wsgi", False)], _patch_worker,
                      [_scaffold.Tested("gunicorn", "27.0", "27.0")]),
])  # fmt: skip
#: Patch gunicorn's workers and Flask when (if ever) the service imports them (now, if it already
#: did: then also the running workers' applications); idempotent.
install = scaffold.install
#: Restore the originals, and each worker's own application.
uninstall = scaffold.uninstall


def late_coverage() -> str:
    """What the hook sees, and misses, when installed into a process that is already serving."""

    def describe() -> str:
        base = sys.modules.get("gunicorn.workers.base")
        if base is None:
            return ("no gunicorn worker runs in this process (gunicorn is not imported): WSGI applications are seen only"
                    " when a gunicorn worker loads them")
        workers = running_workers(base.Worker)
        if not workers:
            return ("gunicorn is loaded but no worker of it runs in this process (its master?): requests are served by"
                    " the worker processes, each of which needs the hooks itself")
        return (f"found {len(workers)} running gunicorn worker(s) in this process, whose application is wrapped: requests they"
                " start after the injection are recorded from their arrival at the socket, those already being handled are"
                " left out, and in a gthread worker a connection handed to the thread pool before the injection counts its"
                " whole wait as accept backlog")  # fmt: skip

    return scaffold.late_coverage(describe)
