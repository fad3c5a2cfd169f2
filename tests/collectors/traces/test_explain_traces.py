"""Single traces the team makes itself, so the per-request rules are not fitted to four files: real
SQLAlchemy against the real PostgreSQL and real httpx against a local server, traced by the stock
OpenTelemetry SDK and instrumentations, exported as OTLP JSON, then `latprof analyze --trace`.

- a lazy-loading N+1 (one SELECT per user's addresses) must be named with its saving, and the same
  page loaded eagerly (selectinload: two queries) must not;
- five tool calls awaited one after another must be named, and the same five under
  `asyncio.gather` (overlapping) must not.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.report_schema import assert_valid
from tests.services import PG_DSN, require_pg

pytest.importorskip("opentelemetry.sdk")
sqlalchemy = pytest.importorskip("sqlalchemy")
httpx = pytest.importorskip("httpx")

from google.protobuf.json_format import MessageToJson  # noqa: E402
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import SpanKind  # noqa: E402
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship, selectinload  # noqa: E402

USERS = 20


class Traced:
    """A private tracer provider (the process's global one is left alone) whose spans go to an OTLP JSON file."""

    def __init__(self, service: str) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider(resource=Resource.create({"service.name": service}))
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("tests.explain")

    def request(self, route: str) -> Any:
        """The request's server span, as a web framework's instrumentation opens it."""
        return self.tracer.start_as_current_span(f"GET {route}", kind=SpanKind.SERVER,
                                                 attributes={"http.route": route, "http.request.method": "GET"})  # fmt: skip

    def write(self, path: Path) -> str:
        """Write the finished spans as one OTLP JSON document; the trace id of the last request."""
        spans = self.exporter.get_finished_spans()
        path.write_text(MessageToJson(encode_spans(spans)))
        root = [s for s in spans if s.parent is None][-1]
        return f"{root.context.trace_id:032x}"


def analyze(path: Path, trace_id: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "latprof", "analyze", str(path), "--trace", trace_id, "--format", "json"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert_valid(report)
    [request] = report["requests"]
    return request


# --- a lazy-loading N+1 through SQLAlchemy ----------------------------------------------------


class Base(DeclarativeBase):
    pass


def models(suffix: str) -> tuple[type, type]:
    class User(Base):
        __tablename__ = f"explain_users_{suffix}"
        id: Mapped[int] = mapped_column(primary_key=True)
        name: Mapped[str]
        addresses: Mapped[list[Address]] = relationship(back_populates="user", lazy="select")

    class Address(Base):
        __tablename__ = f"explain_addresses_{suffix}"
        id: Mapped[int] = mapped_column(primary_key=True)
        user_id: Mapped[int] = mapped_column(sqlalchemy.ForeignKey(f"explain_users_{suffix}.id"))
        email: Mapped[str]
        user: Mapped[User] = relationship(back_populates="addresses")

    return User, Address


@pytest.fixture(scope="module")
def database() -> Iterator[tuple[Any, type, type]]:
    require_pg()
    pytest.importorskip("opentelemetry.instrumentation.sqlalchemy")
    suffix = uuid.uuid4().hex[:8]
    User, Address = models(suffix)
    engine = sqlalchemy.create_engine(PG_DSN.replace("postgresql://", "postgresql+psycopg://"), pool_size=2)
    Base.metadata.create_all(engine, tables=[User.__table__, Address.__table__])  # type: ignore[attr-defined]
    try:
        with Session(engine) as session:
            for i in range(USERS):
                session.add(User(name=f"user{i}", addresses=[Address(email=f"a{i}.{j}@example.invalid") for j in range(2)]))
            session.commit()
        yield engine, User, Address
    finally:
        Base.metadata.drop_all(engine, tables=[Address.__table__, User.__table__])  # type: ignore[attr-defined]
        engine.dispose()


def page(engine: Any, User: type, eager: bool, tmp_path: Path) -> dict[str, Any]:
    from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor

    traced = Traced("users-api")
    instrumentor = SQLAlchemyInstrumentor()
    # skip_dep_check: what a user on SQLAlchemy 2.1 has to pass (the instrumentation declares < 2.1)
    instrumentor.instrument(engine=engine, tracer_provider=traced.provider, skip_dep_check=True)
    try:
        with traced.request("/users"), Session(engine) as session:
            query = sqlalchemy.select(User).order_by(User.id)  # type: ignore[attr-defined]
            if eager:
                query = query.options(selectinload(User.addresses))  # type: ignore[attr-defined]
            emails = [a.email for user in session.scalars(query) for a in user.addresses]
        assert len(emails) == 2 * USERS
    finally:
        instrumentor.uninstrument()
    path = tmp_path / ("eager.otlp.json" if eager else "lazy.otlp.json")
    return analyze(path, traced.write(path))


def test_a_lazy_loading_n_plus_one_through_sqlalchemy_is_named_with_what_a_batch_saves(database: Any, tmp_path: Path) -> None:
    engine, User, _ = database
    request = page(engine, User, eager=False, tmp_path=tmp_path)
    [finding] = [f for f in request["findings"] if f["kind"] == "sequential-calls"]
    evidence = finding["evidence"]
    assert evidence["calls"] == USERS  # one SELECT of addresses per user; the users' own SELECT is not one of them
    assert evidence["inferred"] is True and 0 < evidence["saved_ms_if_concurrent"] < evidence["sequential_ms"]
    assert "selectinload" in finding["fix"]
    assert "example.invalid" not in json.dumps(request)  # no row data, no parameters
    assert request["critical_path"]["layers"][0]["layer"] in ("db.query", "unattributed")


def test_the_same_page_loaded_eagerly_is_not_an_n_plus_one(database: Any, tmp_path: Path) -> None:
    engine, User, _ = database
    request = page(engine, User, eager=True, tmp_path=tmp_path)
    assert [f["kind"] for f in request["findings"]] == []
    assert any(layer["layer"] == "db.query" for layer in request["critical_path"]["layers"])


# --- tool calls awaited one by one, or together ------------------------------------------------


class _Slow(http.server.BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        time.sleep(0.05)
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def tool_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def tools(base: str, together: bool, tmp_path: Path) -> dict[str, Any]:
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    traced = Traced("agent")

    async def handle() -> None:
        async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
            HTTPXClientInstrumentor.instrument_client(client, tracer_provider=traced.provider)
            with traced.request("/plan"):
                urls = [f"{base}/weather?city={i}" for i in range(5)]
                if together:
                    await asyncio.gather(*(client.get(url) for url in urls))
                else:
                    for url in urls:
                        await client.get(url)

    asyncio.run(handle())
    path = tmp_path / ("gather.otlp.json" if together else "sequential.otlp.json")
    return analyze(path, traced.write(path))


def test_tool_calls_awaited_one_by_one_are_named(tool_server: str, tmp_path: Path) -> None:
    request = tools(tool_server, together=False, tmp_path=tmp_path)
    [finding] = request["findings"]
    assert finding["kind"] == "sequential-calls" and finding["evidence"]["calls"] == 5
    assert finding["evidence"]["saved_ms_if_concurrent"] > 150  # five 50 ms calls: about 200 ms saved


def test_the_same_calls_under_asyncio_gather_are_not(tool_server: str, tmp_path: Path) -> None:
    request = tools(tool_server, together=True, tmp_path=tmp_path)
    assert request["findings"] == []
    assert request["latency_ms"] < 200  # they overlapped
