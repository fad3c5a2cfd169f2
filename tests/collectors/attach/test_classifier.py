"""The stack classifier's rules on stacks written out: precedence, 3.10 names, idle workers, wait channels.

The signatures themselves are checked against real libraries in real processes
(test_signatures.py); these tests pin down how a stack's frames combine.
"""

from __future__ import annotations

import pytest

from latprof.layers import APP, DB_POOL, DB_QUERY, HTTP_POOL, LOCK, PROVIDER, TOOL
from latprof.collectors.attach.stacks import BUSY, IDLE, Frame, Signature, classify, frames_from_pyspy


def stack(*frames: str) -> list[Frame]:
    """`"name file"` strings, innermost first."""
    return [Frame(*f.split(" ", 1)) for f in frames]


QUEUEPOOL_WAIT_311 = stack(
    "Condition.wait threading.py",
    "Queue.get sqlalchemy/util/queue.py",
    "QueuePool._do_get sqlalchemy/pool/impl.py",
    "_ConnectionRecord.checkout sqlalchemy/pool/base.py",
    "Engine.connect sqlalchemy/engine/base.py",
    "handler app.py",
)


def test_a_generic_wait_inside_a_pool_checkout_is_the_pool():
    c = classify(QUEUEPOOL_WAIT_311, wchan="futex_do_wait")
    assert (c.state, c.layer, c.signature) == (BUSY, DB_POOL, "sqlalchemy.pool_wait")


def test_python_3_10_bare_names_match_the_same_signatures():
    bare = [Frame(f.name.rsplit(".", 1)[-1], f.file) for f in QUEUEPOOL_WAIT_311]
    assert classify(bare).layer == DB_POOL


def test_a_generic_wait_with_nothing_specific_outside_is_a_lock():
    c = classify(stack("Condition.wait threading.py", "Event.wait threading.py", "handler app.py"))
    assert (c.layer, c.signature) == (LOCK, "threading.condition_wait")


def test_the_innermost_specific_frame_wins():
    # a pool wait of httpcore inside an openai call: the wait is http.pool, not the LLM call
    pool_wait = stack(
        "Condition.wait threading.py",
        "Event.wait httpcore2/_synchronization.py",
        "PoolRequest.wait_for_connection httpcore2/_sync/connection_pool.py",
        "ConnectionPool.handle_request httpcore2/_sync/connection_pool.py",
        "SyncAPIClient.request openai/_base_client.py",
        "Completions.create openai/resources/chat/completions/completions.py",
    )
    assert classify(pool_wait).layer == HTTP_POOL


def test_an_http_read_is_an_llm_call_only_under_an_openai_frame():
    read = [
        "SyncStream.read httpcore/_backends/sync.py",
        "HTTP11Connection._receive_event httpcore/_sync/http11.py",
        "HTTP11Connection._receive_response_headers httpcore/_sync/http11.py",
        "HTTP11Connection.handle_request httpcore/_sync/http11.py",
        "ConnectionPool.handle_request httpcore/_sync/connection_pool.py",
    ]
    plain = classify(stack(*read, "Client.get httpx/_client.py", "lookup app.py"))
    assert (plain.layer, plain.split_unknown) == (TOOL, False)
    llm = classify(stack(*read, "SyncAPIClient.request openai/_base_client.py", "ask app.py"))
    assert (llm.layer, llm.split_unknown) == (PROVIDER, True)


def test_a_psycopg2_statement_under_sqlalchemy_is_a_query_by_its_caller():
    c = classify(stack("DefaultDialect.do_execute sqlalchemy/engine/default.py", "Connection._exec_single_context sqlalchemy/engine/base.py"),
                 wchan="poll_schedule_timeout.constprop.0")  # fmt: skip
    assert c.layer == DB_QUERY


@pytest.mark.parametrize(
    "frames",
    [
        ["SyncWorker.wait gunicorn/workers/sync.py", "SyncWorker.run_for_one gunicorn/workers/sync.py"],
        ["_worker concurrent/futures/thread.py", "Thread.run threading.py"],
        ["EpollSelector.select selectors.py", "BaseEventLoop._run_once asyncio/base_events.py"],
    ],
)
def test_workers_waiting_for_work_are_idle(frames):
    c = classify(stack(*frames), wchan="do_epoll_wait")
    assert (c.state, c.layer) == (IDLE, None)


def test_a_worker_loop_waiting_on_its_queue_is_idle_but_one_running_a_task_is_not():
    waiting = stack("Condition.wait threading.py", "Queue.get queue.py", "WorkerThread.run anyio/_backends/_asyncio.py")
    assert classify(waiting).state == IDLE
    working = stack("Condition.wait threading.py", "Queue.get queue.py", "handler app.py", "WorkerThread.run anyio/_backends/_asyncio.py")
    assert (classify(working).state, classify(working).layer) == (BUSY, LOCK)


def test_a_busy_executor_worker_is_not_idle_though_its_worker_loop_is_on_the_stack():
    busy = stack("handler app.py", "_WorkItem.run concurrent/futures/thread.py", "_worker concurrent/futures/thread.py")
    assert classify(busy, wchan="0").state == BUSY and classify(busy, wchan="0").layer == APP


@pytest.mark.parametrize(
    "wchan, active, layer, signature",
    [
        ("0", True, APP, "running"),
        ("futex_do_wait", False, LOCK, "wchan.futex"),
        ("futex_wait_queue+gil", False, APP, "wchan.gil"),  # a GIL wait (`pyspy.mark_gil_waits`) waits for the CPU
        ("hrtimer_nanosleep", False, None, "wchan.sleep"),
        ("wait_woken", False, None, "wchan.socket"),
        (None, True, APP, "running"),
        (None, False, None, "waiting"),
    ],
)
def test_without_a_signature_the_wait_channel_decides(wchan, active, layer, signature):
    c = classify(stack("handler app.py", "dispatch framework/app.py"), wchan=wchan, active=active)
    assert (c.layer, c.signature) == (layer, signature)


def test_file_suffixes_match_whole_path_components():
    # `multiqueue.py` is not `queue.py`; a full path under site-packages is
    assert classify(stack("Queue.get mylib/multiqueue.py"), wchan="0").signature == "running"
    full = [Frame(f.name, "/srv/venv/lib/python3.11/site-packages/" + f.file) for f in QUEUEPOOL_WAIT_311]
    assert classify(full).layer == DB_POOL


def test_extra_signatures_come_first():
    mine = Signature("app.cache_wait", "app.py", "handler", DB_POOL)
    assert classify(QUEUEPOOL_WAIT_311[-1:], extra=[mine]).signature == "app.cache_wait"


def test_frames_from_py_spy_json_are_innermost_first():
    thread = {"frames": [{"name": "Condition.wait", "short_filename": "threading.py", "filename": "/usr/lib/python3.11/threading.py"},
                         {"name": "handler", "short_filename": "app.py"}]}  # fmt: skip
    assert frames_from_pyspy(thread) == [Frame("Condition.wait", "threading.py"), Frame("handler", "app.py")]


# --- one classifier, one own frame, one event-loop thread (attach, top, the event-loop rule) ---------------------


def test_what_attach_writes_and_top_shows_is_what_the_analysis_reads_again():
    """`classify_window` (the capture and `latprof top`) and `classify_sample` (the analysis of
    the capture) are one classifier: every event written classifies again to the same thing."""
    from latprof.attach.session import classify_window
    from latprof.collectors.attach.pyspy import StackCount, Window
    from latprof.collectors.attach.stacks import classify_sample

    running = stack("render app/reports.py", "handle_request gunicorn/workers/sync.py")
    window = Window(7, 1_000, 2_000, 100, [
        StackCount(1, "MainThread", tuple(QUEUEPOOL_WAIT_311), 40),  # a signature decides
        StackCount(2, "worker", tuple(running), 50),  # shared out over the wait channels seen
        StackCount(3, "other", tuple(running), 10),  # no wait channel read
    ])  # fmt: skip
    wchans = {2: {"0": 3, "futex_wait_queue": 1, "hrtimer_nanosleep": 1, "": 1}}
    events = classify_window(window, wchans)
    assert sum(e.weight for e, _ in events) == 100
    assert {(e.tid, e.wchan): c.signature for e, c in events} == {
        (1, None): "sqlalchemy.pool_wait", (2, "0"): "running", (2, "futex_wait_queue"): "wchan.futex",
        (2, "hrtimer_nanosleep"): "wchan.sleep", (2, ""): "waiting", (3, None): "waiting",
    }  # fmt: skip
    assert all(classify_sample(e) == c for e, c in events)


@pytest.mark.parametrize("filename, library", [
    ("flask/app.py", True),  # py-spy's short name of a library
    ("json/decoder.py", True),  # ... and of the standard library
    ("apps/wsgi_app.py", False),  # the service, relative to where it runs
    ("<frozen importlib._bootstrap>", True),
    ("/venv/lib/python3.12/site-packages/tiktoken/core.py", True),
    ("/usr/lib/python3/dist-packages/yaml/reader.py", True),
    ("/usr/lib/python3.12/gzip.py", True),
    ("/srv/app/export.py", False),
    ("C:\\srv\\app\\export.py", False),
    ("C:\\Python312\\Lib\\site-packages\\httpx\\_client.py", True),
])  # fmt: skip
def test_library_files_are_told_from_the_services_own(filename, library):
    from latprof.collectors.attach.stacks import library_file

    assert library_file(filename) is library


def test_the_services_own_frame_is_the_innermost_outside_libraries_for_attach_and_the_event_loop_rule():
    from latprof.attach.analysis import _app_frame
    from latprof.collectors.attach.stacks import own_frame
    from latprof.events import Frame as EventFrame, StackSample
    from latprof.rules.event_loop_blocked import _app_frame as rule_app_frame

    frames = (EventFrame("loads", "/usr/lib/python3.12/json/__init__.py"),
              EventFrame("encode", "/venv/lib/python3.12/site-packages/tiktoken/core.py"),
              EventFrame("count_tokens", "/srv/app/tokens.py", 12), EventFrame("run_forever", "asyncio/base_events.py"))  # fmt: skip
    assert own_frame(frames) == frames[2]
    assert rule_app_frame(frames) == frames[2]
    assert _app_frame(StackSample(0, 1, 1, "MainThread", frames, True)) == "count_tokens (/srv/app/tokens.py)"
    only_libraries = frames[:1]
    assert own_frame(only_libraries) is None and rule_app_frame(only_libraries) == only_libraries[0]


def test_an_event_loop_thread_runs_a_loop_not_just_any_asyncio_code():
    from latprof.collectors.attach.stacks import event_loop_thread
    from latprof.events import Frame as EventFrame

    def frames(*names: str) -> list[EventFrame]:
        return [EventFrame(*n.split(" ", 1)) for n in names]

    assert event_loop_thread(frames("_run asyncio/events.py", "_run_once asyncio/base_events.py",
                                    "BaseEventLoop.run_forever asyncio/base_events.py"))  # fmt: skip
    assert event_loop_thread(frames("Runner.run asyncio/runners.py", "run asyncio/runners.py"))  # uvloop: native loop
    # a worker thread asking for the loop is not one
    assert not event_loop_thread(frames("get_event_loop asyncio/events.py", "handler app.py", "run concurrent/futures/thread.py"))
