"""The hooks' runtime: request context across tasks and threads, nesting, error counting, import hooks."""

from __future__ import annotations

import asyncio
import contextvars
import sys
import threading
import types

import pytest
from recording import recording

from latprof.collectors.hooks import runtime
from latprof.events import QualityRecord, Request, Segment


@pytest.fixture
def recorded():
    with recording() as events:
        yield events


def test_nothing_is_recorded_before_start():
    assert not runtime.active()
    token = runtime.begin_request("GET /", runtime.now_ns())
    with runtime.segment("x", "tool") as attrs:
        attrs["k"] = 1
    runtime.end_request(token)
    assert runtime.record("y", "tool", 1, 2) is None


def test_segments_nest_under_the_open_segment_and_belong_to_the_request(recorded):
    token = runtime.begin_request("POST /chat", runtime.now_ns(), {"http.route": "/chat"})
    with runtime.segment("outer", "provider") as attrs:
        attrs["gen_ai.request.model"] = "m"
        with runtime.segment("inner", "retry"):
            pass
    with runtime.segment("after", "db.query"):
        pass
    runtime.end_request(token)
    inner, outer, after, root = recorded
    assert isinstance(root, Request) and root.route == "POST /chat" and root.attrs == {"http.route": "/chat"}
    assert {s.request_id for s in (inner, outer, after)} == {root.request_id}
    assert inner.parent_id == outer.segment_id and outer.parent_id is None and after.parent_id is None
    assert outer.attrs == {"gen_ai.request.model": "m"}
    assert outer.start_ns <= inner.start_ns <= inner.end_ns <= outer.end_ns <= root.end_ns
    assert runtime.current_request() is None


def test_concurrent_tasks_of_one_request_keep_their_own_parents(recorded):
    async def tool(name: str) -> None:
        with runtime.segment(name, "tool"):
            await asyncio.sleep(0.01)
            with runtime.segment(name + ".db", "db.query"):
                await asyncio.sleep(0.01)

    async def handler() -> None:
        token = runtime.begin_request("POST /agent", runtime.now_ns())
        await asyncio.gather(tool("a"), tool("b"))
        runtime.end_request(token)

    asyncio.run(handler())
    by_name = {e.name: e for e in recorded if isinstance(e, Segment)}
    assert by_name["a.db"].parent_id == by_name["a"].segment_id
    assert by_name["b.db"].parent_id == by_name["b"].segment_id


def test_threads_that_run_in_a_copied_context_see_the_request(recorded):
    token = runtime.begin_request("GET /sync", runtime.now_ns())
    context = contextvars.copy_context()
    thread = threading.Thread(target=context.run, args=(lambda: runtime.record("in thread", "db.query", 1, 2),))
    thread.start()
    thread.join()
    runtime.end_request(token)
    segment, root = recorded
    assert segment.request_id == root.request_id


def test_guarded_callbacks_count_errors_instead_of_raising(recorded):
    @runtime.guarded("demo")
    def broken() -> None:
        raise ValueError("boom")

    assert broken() is None
    assert broken() is None
    runtime.report_errors(force=True)
    records = [e for e in recorded if isinstance(e, QualityRecord)]
    assert sum(r.occurrences for r in records) == 2
    last = records[-1].attrs["latprof.last_error"]
    assert records[-1].attrs["collector"] == "demo" and last.startswith("ValueError at test_runtime.py:") and last.endswith(" in broken")
    assert "boom" not in last  # a library's message can quote the service's values: not recorded


def test_ids_are_unique_and_short():
    ids = {runtime.new_id() for _ in range(10_000)}
    assert len(ids) == 10_000 and max(len(i) for i in ids) <= 16


def test_when_imported_patches_a_module_when_it_is_imported(tmp_path, monkeypatch):
    (tmp_path / "latprof_demo_lib.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[types.ModuleType] = []
    runtime.when_imported("latprof_demo_lib", lambda module: seen.append(module))
    assert seen == []
    import latprof_demo_lib  # noqa: F401

    assert seen == [sys.modules["latprof_demo_lib"]]
    runtime.when_imported("latprof_demo_lib", lambda module: seen.append(module))  # already imported: now
    assert len(seen) == 2


def test_a_failing_patch_does_not_break_the_import(tmp_path, monkeypatch, recorded):
    (tmp_path / "latprof_demo_lib2.py").write_text("VALUE = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def bad_patch(module: types.ModuleType) -> None:
        raise RuntimeError("cannot patch")

    runtime.when_imported("latprof_demo_lib2", bad_patch)
    import latprof_demo_lib2

    assert latprof_demo_lib2.VALUE == 2
    runtime.report_errors(force=True)
    assert any(isinstance(e, QualityRecord) and "RuntimeError at" in e.attrs["latprof.last_error"]
               and e.attrs["latprof.last_error"].endswith("in bad_patch") for e in recorded)  # fmt: skip


def test_a_hook_that_records_is_noted_once_per_capture_and_only_while_recording():
    runtime.saw("sqlalchemy")  # not recording: nothing, and not remembered
    for _ in range(2):  # each capture notes it again
        with recording() as events:
            for _ in range(3):
                runtime.saw("sqlalchemy")
            runtime.saw("openai")
        notes = [e for e in events if isinstance(e, QualityRecord) and e.kind == "hook_active"]
        assert [(n.attrs["collector"], n.pid) for n in notes] == [("sqlalchemy", runtime.pid()), ("openai", runtime.pid())]
