"""Privacy canaries through `latprof attach`, `latprof top` and `latprof attach --inject`.

test_canaries.py covers services under `latprof run`; this covers a service latprof did not
start. A FastAPI service on uvicorn, started plainly by the test, gets canaries
(`CANARY_attach_<purpose>_<hex>`, test_canaries.py's naming) as runtime values only: an argument
on its command line, an environment variable, and in every request it serves under load: path
ids, a query string, an unmatched path, Authorization, Cookie and a custom header, a JSON body,
an SQL parameter and an SQL literal against the real PostgreSQL (its connections'
`application_name` too), response headers (Set-Cookie, a custom one) and an exception message.
Its own file and function names hold none (py-spy reports those): the canaries come from a JSON
file and the requests.

While the load runs, `latprof attach` samples it (with `--db`, which reads `pg_stat_activity`),
`latprof top` watches it, and `latprof attach --inject` loads the hooks into it. Everything
latprof wrote is searched (raw and gunzipped, with test_canaries.py's `hits`): the captures, the
live reports, every report format of `analyze` of each capture, what each command printed
(stdout and stderr), whatever it left in its working directory and its TMPDIR, and copies taken
every 50 ms while it ran of its temporary files (py-spy's recordings under TMPDIR, the inject
workspace under /tmp with the hooks' own capture). Each canary is also shown to have arrived: in
the service's answers, in the database, or in the service's own log.

Last, `attach` and `top` given the PID of a shell that started a Python process refuse it with a
hint naming that process: what they print must not hold its command line's canary.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

import services
from attach.procs import free_port, start_server
from latprof.report.renderers import REPORT

sys.path.insert(0, str(Path(__file__).parent))  # test_canaries.py's helpers, whatever pytest's import mode
from test_canaries import _segments, hits, readable  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.long]  # one service under load through attach, top and attach --inject: about 25 s

#: What the canaries are: runtime values of the service and of its requests (never names py-spy reports).
PURPOSES = (
    "argv", "env", "path_user", "path_order", "query", "unmatched_path", "authorization", "cookie", "custom_header",
    "body", "sql_param", "sql_literal", "application_name", "response_header", "set_cookie", "exception",
)  # fmt: skip
DURATION_S = 4  # of each attach, and of top
CLIENTS = 3

#: The service (written into the test's directory as orders_service.py): canaries only from
#: ATTACH_CANARIES (a JSON file) and from its requests.
SERVICE = '''\
import json
import os
import sys
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from psycopg_pool import ConnectionPool

C = json.loads(Path(os.environ["ATTACH_CANARIES"]).read_text())
TABLE = os.environ["ATTACH_TABLE"]


@asynccontextmanager
async def lifespan(app):
    app.state.pool = ConnectionPool(os.environ["ATTACH_PG"], kwargs={"application_name": C["application_name"]},
                                    min_size=2, max_size=4, open=False)
    app.state.pool.open(wait=True, timeout=20)
    try:
        yield
    finally:
        app.state.pool.close()


app = FastAPI(lifespan=lifespan)


@app.middleware("http")
async def secret_headers(request, call_next):
    response = await call_next(request)
    response.headers["X-Service-Secret"] = C["response_header"]
    response.headers["Set-Cookie"] = f"session={C['set_cookie']}; HttpOnly"
    return response


@app.get("/health")
async def health():
    return "ok"


@app.get("/users/{user_id}/orders/{order_id}")
async def order(user_id: str, order_id: str, request: Request, q: str = ""):
    h = request.headers
    return {"user": user_id, "order": order_id, "q": q, "authorization": h.get("authorization", ""),
            "cookie": h.get("cookie", ""), "custom": h.get("x-custom-secret", "")}


@app.post("/orders/{order_id}")
def save(order_id: str, body: dict):  # sync: in an anyio worker thread, in psycopg statements
    with app.state.pool.connection() as conn:
        conn.execute(f"INSERT INTO {TABLE} (k, v, note, app) VALUES (%s, %s, '{C['sql_literal']}', "
                     "current_setting('application_name'))", (order_id, body["tag"]))
        conn.execute(f"SELECT pg_sleep(0.01) WHERE %s <> '{C['sql_literal']}'", (body["tag"],))
    return {"order": order_id, "note": body["note"]}


@app.get("/boom/{item}")
async def boom(item: str):
    raise RuntimeError(f"order {item} failed for {C['exception']}")


@app.get("/whoami")
async def whoami():
    return {"argv": " ".join(sys.argv), "env": os.environ.get("ATTACH_ENV_SECRET", "")}
'''


def make_canaries() -> dict[str, str]:
    return {p: f"CANARY_attach_{p}_{uuid.uuid4().hex}" for p in PURPOSES}


# --- the service and its load --------------------------------------------------------------------


@dataclass
class Service:
    canaries: dict[str, str]
    workdir: Path
    proc: subprocess.Popen[bytes]
    port: int
    table: str
    log: Path

    def database(self) -> str:
        import psycopg

        with psycopg.connect(services.PG_DSN) as conn:
            return json.dumps(conn.execute(f"SELECT k, v, note, app FROM {self.table}").fetchall())


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    services.require_pg()
    import psycopg

    workdir = tmp_path_factory.mktemp("attach-privacy")
    c = make_canaries()
    (workdir / "canaries.json").write_text(json.dumps(c))
    app_dir = workdir / "service"
    app_dir.mkdir()
    (app_dir / "orders_service.py").write_text(SERVICE)
    table = f"latprof_attach_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(services.PG_DSN, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (k text, v text, note text, app text)")
    port, log = free_port(), workdir / "service.log"
    env = {"ATTACH_CANARIES": str(workdir / "canaries.json"), "ATTACH_TABLE": table, "ATTACH_PG": services.PG_DSN,
           "ATTACH_ENV_SECRET": c["env"]}  # fmt: skip
    command = [sys.executable, "-m", "uvicorn", "orders_service:app", "--app-dir", str(app_dir), "--host", "127.0.0.1",
               "--port", str(port), "--http", "h11", "--loop", "asyncio", "--log-level", "info",
               "--header", f"x-argv:{c['argv']}"]  # fmt: skip
    try:
        proc = start_server(command, port, env, log)
        try:
            yield Service(c, workdir, proc, port, table, log)
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    finally:
        with psycopg.connect(services.PG_DSN, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}")


@dataclass
class Traffic:
    """What the clients got: statuses, failed requests, and the first answer (head and body) to each call."""

    statuses: Counter[int] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    answers: dict[str, bytes] = field(default_factory=dict)

    def seen(self) -> bytes:
        return b"\n".join(self.answers.values())


def _calls(c: dict[str, str]) -> list[tuple[str, str, bytes | None, int]]:
    """(method, path, body, status) of one round of a client: canaries in paths, queries, bodies."""
    return [
        ("GET", f"/users/{c['path_user']}/orders/{c['path_order']}?q={c['query']}", None, 200),
        ("POST", f"/orders/{c['path_order']}", json.dumps({"note": c["body"], "tag": c["sql_param"]}).encode(), 200),
        ("GET", f"/boom/{c['path_order']}?q={c['query']}", None, 500),
        ("GET", f"/nowhere/{c['unmatched_path']}?q={c['query']}", None, 404),
        ("GET", "/whoami", None, 200),
    ]


@contextlib.contextmanager
def traffic(svc: Service) -> Iterator[Traffic]:
    """CLIENTS threads calling every route of `_calls` (with canary headers) until the block ends."""
    c, got, stop, lock = svc.canaries, Traffic(), threading.Event(), threading.Lock()
    headers = {"Authorization": f"Bearer {c['authorization']}", "Cookie": f"sid={c['cookie']}", "X-Custom-Secret": c["custom_header"],
               "Content-Type": "application/json"}  # fmt: skip

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=30)
        while not stop.is_set():
            for method, path, body, status in _calls(c):
                try:
                    conn.request(method, path, body=body, headers=headers)
                    response = conn.getresponse()
                    answer = bytes(response.headers) + response.read()
                except (OSError, http.client.HTTPException) as exc:
                    conn.close()
                    with lock:
                        got.failures.append(f"{method} {path[:20]}: {type(exc).__name__}")
                    continue
                if response.status == 500:  # uvicorn closes a connection whose request raised
                    conn.close()
                with lock:
                    got.statuses[response.status] += 1
                    got.answers.setdefault(f"{method} {path} {response.status}", answer)
                    if response.status != status:
                        got.failures.append(f"{method} {path[:20]}: {response.status}")
        conn.close()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)  # every route called before latprof looks
        yield got
    finally:
        stop.set()
        for t in threads:
            t.join(35)


def assert_arrived(svc: Service, got: Traffic) -> None:
    """Every canary reached the service (so none can pass by never being sent): its answers, the database, its log."""
    assert got.failures == [] and {200, 404, 500} <= set(got.statuses), (got.failures[:5], got.statuses)
    c, answers, database = svc.canaries, got.seen(), svc.database()
    echoed = ("argv", "env", "path_user", "path_order", "query", "authorization", "cookie", "custom_header", "body",
              "response_header", "set_cookie")  # fmt: skip
    assert [p for p in echoed if c[p].encode() not in answers] == []
    assert [p for p in ("sql_param", "sql_literal", "application_name") if c[p] not in database] == []
    # the service logged its error and the unmatched path: the search finds a canary where there is one
    assert hits([svc.log], [c["exception"], c["unmatched_path"]]) == [f"service.log: {c['exception']}", f"service.log: {c['unmatched_path']}"]


# --- latprof, and what it wrote --------------------------------------------------------------------


class Snapshots:
    """Copies, every 50 ms while latprof runs, of the files under its TMPDIR and of the inject
    workspaces (/tmp/latprof-inject-*) of the service `pid`: temporary files are gone by the time
    it ends. A workspace is the service's when it holds one of its files open (its hooks' capture);
    new workspaces of other processes (another test injecting meanwhile) are copied, then dropped."""

    def __init__(self, tmpdir: Path, into: Path, pid: int | None = None) -> None:
        self.tmpdir, self.into, self.pid = tmpdir, into, pid
        self.before = set(Path("/tmp").glob("latprof-inject-*"))
        self.new: set[Path] = set()
        self.workspaces: set[Path] = set()  # the service's
        self._stop = threading.Event()
        self._last: dict[Path, bytes] = {}
        self._versions = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Snapshots:
        self.into.mkdir()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self._copy()
        for other in self.new - self.workspaces:
            shutil.rmtree(self.into / other.name, ignore_errors=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self._copy()

    def _claim(self) -> None:
        """The workspaces the service holds a file open in."""
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{self.pid}/fd").iterdir() if self.pid else ():
                with contextlib.suppress(OSError):
                    target = Path(os.readlink(fd))
                    if target.parent in self.new:
                        self.workspaces.add(target.parent)

    def _copy(self) -> None:
        self.new |= set(Path("/tmp").glob("latprof-inject-*")) - self.before
        self._claim()
        for root in (self.tmpdir, *self.new):
            for path in list(root.rglob("*")) if root.is_dir() else []:
                try:
                    data = path.read_bytes() if path.is_file() else b""
                except OSError:  # removed meanwhile
                    continue
                last = self._last.get(path, b"")
                if not data or data == last:
                    continue
                if not data.startswith(last):  # a file rewritten: keep the earlier version too
                    self._versions += 1
                into = self.into / root.name
                into.mkdir(exist_ok=True)
                (into / f"{self._versions}-{path.relative_to(root)}".replace("/", "__")).write_bytes(data)
                self._last[path] = data


@dataclass
class Phase:
    """One latprof command's directory: its working directory, TMPDIR, outputs and snapshots."""

    dir: Path

    @property
    def tmp(self) -> Path:
        return self.dir / "tmp"

    def env(self) -> dict[str, str]:
        return {**os.environ, "TMPDIR": str(self.tmp)}

    def latprof(self, name: str, *args: Any, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """`python -m latprof ARGS` in this directory; its stdout and stderr kept as NAME.stdout / NAME.stderr."""
        done = subprocess.run([sys.executable, "-m", "latprof", *map(str, args)], cwd=self.dir, env=self.env(),
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip
        self.printed(name, done.stdout, done.stderr)
        assert done.returncode == 0, (args, done.returncode, done.stderr[-3000:])
        return done

    def printed(self, name: str, stdout: str, stderr: str) -> None:
        (self.dir / f"{name}.stdout").write_text(stdout)
        (self.dir / f"{name}.stderr").write_text(stderr)

    def analyze_every_format(self, capture: Path) -> None:
        for fmt in REPORT.names():
            self.latprof(f"analyze-{fmt}", "analyze", capture, "--format", fmt, "-o", self.dir / f"analyze.{fmt}", "--skip-warmup", "0")

    def written(self) -> list[Path]:
        """Every file under this directory: what latprof wrote and printed, and the copies of its temporary files."""
        return sorted(p for p in self.dir.rglob("*") if p.is_file())


def phase(svc: Service, name: str) -> Phase:
    made = Phase(svc.workdir / name)
    made.tmp.mkdir(parents=True)
    return made


def around(path: Path, needle: bytes, width: int = 160) -> str:
    data = readable(path)
    at = data.find(needle)
    return f"{path}: {needle.decode()} in {data[max(0, at - width): at + len(needle) + width]!r}"


def assert_nothing_leaked(svc: Service, where: Phase, expected: tuple[str, ...]) -> None:
    """No canary (nor the bare word CANARY) in any file of `where`, which holds at least `expected`."""
    files = where.written()
    names = {p.name for p in files}
    assert set(expected) <= names, (expected, sorted(names))
    assert all((where.dir / name).stat().st_size > 0 for name in expected if not name.endswith((".stdout", ".stderr"))), expected
    found = hits(files, list(svc.canaries.values()))
    assert found == [], "\n".join(around(p, c.encode()) for p in files for c in svc.canaries.values() if c.encode() in readable(p))
    bare = [around(p, b"CANARY") for p in files if b"CANARY" in readable(p)]
    assert bare == []


# --- the tests -------------------------------------------------------------------------------------


def test_attach_and_every_analysis_of_its_capture_hold_no_canary(service: Service) -> None:
    where, capture = phase(service, "attach"), Path("attach.jsonl")
    with traffic(service) as got, Snapshots(where.tmp, where.dir / "snapshots"):
        done = where.latprof("attach", "attach", "--pid", service.proc.pid, "--duration", DURATION_S, "--db", services.PG_DSN,
                             "--out", capture, "--format", "json", "-o", "attach-report.json")  # fmt: skip
    assert_arrived(service, got)
    report = json.loads((where.dir / "attach-report.json").read_text())
    assert report["source"]["kind"] == "attach", done.stderr[-2000:]
    # py-spy saw the code that handled the canaries (its file, by name)
    assert b"orders_service.py" in readable(where.dir / capture)
    where.analyze_every_format(where.dir / capture)
    assert_nothing_leaked(service, where, ("attach.jsonl", "attach-report.json", "attach.stdout", "attach.stderr",
                                           *(f"analyze.{fmt}" for fmt in REPORT.names())))  # fmt: skip


def test_top_prints_no_canary(service: Service) -> None:
    where = phase(service, "top")
    with traffic(service) as got, Snapshots(where.tmp, where.dir / "snapshots"):
        proc = subprocess.Popen([sys.executable, "-m", "latprof", "top", "--pid", str(service.proc.pid), "--interval", "1"],
                                cwd=where.dir, env=where.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        try:
            time.sleep(DURATION_S + 1)
            proc.send_signal(signal.SIGINT)  # Ctrl-C: what ends it when stdout is not a terminal
            stdout, stderr = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    where.printed("top", stdout, stderr)
    assert_arrived(service, got)
    assert proc.returncode == 0, stderr[-3000:]
    assert f"PID {service.proc.pid}" in stdout and re.search(r"samples [1-9]", stdout), (stdout[-2000:], stderr[-2000:])  # tables of samples
    assert_nothing_leaked(service, where, ("top.stdout", "top.stderr"))


def test_attach_inject_and_every_analysis_of_its_capture_hold_no_canary(service: Service) -> None:
    if shutil.which("gdb") is None:  # as tests/inject/conftest.py: a skip on a developer box, a failure under CI=true
        services.missing("gdb is not installed: the --inject tests need it (Debian/Ubuntu: apt-get install gdb)", "gdb")
    where, capture = phase(service, "inject"), Path("inject.jsonl")
    with traffic(service) as got, Snapshots(where.tmp, where.dir / "snapshots", service.proc.pid) as snapshots:
        done = where.latprof("inject", "attach", "--pid", service.proc.pid, "--inject", "--duration", DURATION_S, "--max-rate", "0",
                             "--out", capture, "--format", "json", "-o", "inject-report.json")  # fmt: skip
    assert_arrived(service, got)
    report = json.loads((where.dir / "inject-report.json").read_text())
    assert report["source"]["method"] == "inject", done.stderr[-2000:]
    assert [p["outcome"] for p in report["collection"]["injected"]] == ["recorded"], report["collection"]["injected"]
    assert len(snapshots.workspaces) == 1 and not any(w.exists() for w in snapshots.workspaces)  # copied, then removed
    assert list((where.dir / "snapshots").glob("latprof-inject-*/*capture-*.jsonl"))  # the hooks' own capture, as they wrote it
    # the hooks recorded the calls the canaries went through
    requests, segments = _segments(where.dir / capture)
    assert {"GET /users/{user_id}/orders/{order_id}", "POST /orders/{order_id}"} <= {r.route for r in requests}
    assert {200, 404, 500} <= {r.status_code for r in requests}
    assert any(s.attrs.get("db.query.summary", "").startswith(f"INSERT {service.table}") for s in segments)
    where.analyze_every_format(where.dir / capture)
    assert_nothing_leaked(service, where, ("inject.jsonl", "inject-report.json", "inject.stdout", "inject.stderr",
                                           *(f"analyze.{fmt}" for fmt in REPORT.names())))  # fmt: skip


@pytest.mark.parametrize("command", ["attach", "top"])
def test_refusing_a_non_python_parent_prints_no_canary_of_its_childrens_command_lines(tmp_path: Path, command: str) -> None:
    """`latprof attach --pid` (and `top`) of a shell that started the service is refused with a hint naming the
    Python processes it started: by PID, without their arguments (a command line can hold a secret)."""
    argv = make_canaries()["argv"]
    script = tmp_path / "idle.py"
    script.write_text("import time\ntime.sleep(60)\n")
    # `python - CANARY...` (stdin the script): short enough that the hint's 60 characters hold the whole canary
    shell = subprocess.Popen(["sh", "-c", f"python - {argv} < {script}; true"], cwd=tmp_path,
                             env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"})  # fmt: skip
    child = None
    try:
        deadline = time.monotonic() + 20
        while child is None:
            assert time.monotonic() < deadline and shell.poll() is None, "the shell's python never started"
            for pid in Path(f"/proc/{shell.pid}/task/{shell.pid}/children").read_text().split():
                if argv.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():  # the canary is in its argv
                    child = int(pid)
            time.sleep(0.05)
        args = ["--duration", "1", "--out", str(tmp_path / "c.jsonl")] if command == "attach" else []
        done = subprocess.run([sys.executable, "-m", "latprof", command, "--pid", str(shell.pid), *args], cwd=tmp_path,
                              capture_output=True, timeout=60)  # fmt: skip
    finally:
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        if shell.poll() is None:
            shell.kill()
        shell.wait(20)
    printed = done.stdout + done.stderr
    assert done.returncode != 0 and f"latprof attach --pid {child}".encode() in printed, printed  # the hint was printed
    found = [printed[max(0, at - 80): at + len(argv) + 40] for at in range(len(printed)) if printed.startswith(b"CANARY", at)]
    assert found == [], f"latprof {command}'s output holds the service's argv canary {argv} (whole: {argv.encode() in printed}): {found}"
