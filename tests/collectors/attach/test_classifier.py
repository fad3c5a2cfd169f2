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
