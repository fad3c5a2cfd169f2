"""`latprof demo`: a bundled provider and AI service with a known fault, load, and the diagnosis.

The provider runs in a thread of this process; the service runs under `latprof run` (so the
hooks load in it exactly as for a user's service) and is stopped with SIGTERM by pid. With
`attach=True` the service runs plainly (no latprof in it) and `latprof attach --pid` samples it
from outside while the load runs: the same fault as attach sees it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, TextIO

import httpx

from latprof.analysis.requests import DEFAULT_WARMUP_S
from latprof.demo.load import LoadStats, drive
from latprof.demo.provider import LocalCertificate, Provider, ProviderConfig
from latprof.demo.scenarios import DEFAULT_SCENARIO, Scenario, get_scenario
from latprof.errors import CollectorError, ConfigError
from latprof.pipeline import Diagnosis, run_diagnosis
from latprof.report.model import Report

ENV_SECONDS = "LATPROF_DEMO_SECONDS"
DEFAULT_DURATION_S = 20.0
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
#: uvicorn's `--http` and `--loop` choices the demo accepts ("auto": uvicorn picks).
HTTP_IMPLEMENTATIONS = ("auto", "h11", "httptools")
LOOP_IMPLEMENTATIONS = ("auto", "asyncio", "uvloop")


@dataclass(frozen=True)
class DemoResult:
    scenario: Scenario
    capture: Path
    diagnosis: Diagnosis
    load: LoadStats

    @property
    def report(self) -> Report:
        return self.diagnosis.report


def normalize_dsn(dsn: str) -> str:
    """A SQLAlchemy URL with an asyncio driver: postgresql(+psycopg2) -> +psycopg, sqlite -> +aiosqlite."""
    scheme, sep, rest = dsn.partition("://")
    if not sep:
        raise ConfigError(
            f"--dsn {dsn!r}: not a database URL (e.g. postgresql://user@host:5432/db)"
        )
    base = scheme.split("+", 1)[0].lower()
    if base in ("postgresql", "postgres"):
        return f"postgresql+psycopg://{rest}"
    if base == "sqlite":
        return f"sqlite+aiosqlite://{rest}"
    raise ConfigError(
        f"--dsn {dsn!r}: the demo supports postgresql:// and sqlite:// URLs"
    )


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def duration_from_env(default: float = DEFAULT_DURATION_S) -> float:
    value = os.environ.get(ENV_SECONDS)
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        raise ConfigError(f"{ENV_SECONDS}={value!r}: not a number of seconds") from None
    if seconds <= 0:
        raise ConfigError(f"{ENV_SECONDS}={value!r}: must be > 0")
    return seconds


def run_demo(
    scenario: str | Scenario = DEFAULT_SCENARIO,
    *,
    dsn: str | None = None,
    capture: Path | None = None,
    duration_s: float | None = None,
    warmup_s: float = DEFAULT_WARMUP_S,
    progress: TextIO | None = sys.stderr,
    http: str = "auto",
    loop: str = "auto",
    max_rate: float | None = None,
    attach: bool = False,
    inject: bool = False,
    traces: str | None = None,
) -> DemoResult:
    """Run `scenario` end to end and diagnose it; the capture is kept at `capture`.

    `http` and `loop` are uvicorn's `--http` (h11, httptools) and `--loop` (asyncio, uvloop);
    "auto" lets uvicorn pick (httptools and uvloop when installed). `max_rate` is `latprof
    run --max-rate` (None: its default, far above any scenario's rate). `attach`: start the
    service plainly and diagnose it with `latprof attach` over the load instead (`max_rate` and
    `warmup_s` do not apply: attach records no requests). `inject`: start it plainly and record
    it with `latprof attach --inject` over the load (no warm-up is skipped: the hooks come in
    after it). `traces`: start it traced with stock OpenTelemetry (`stock`) or also a GenAI
    instrumentation (`latprof.demo.otel.KINDS`), exporting OTLP/HTTP to `latprof receive`, and
    diagnose the traces it received (the capture is then OTLP JSON lines).
    """
    if sum((attach, inject, traces is not None)) > 1:
        raise ConfigError("attach, inject and traces: choose one")
    if traces is not None:
        from latprof.demo import otel

        if traces not in otel.KINDS:
            raise ConfigError(f"traces={traces!r}: choose one of {', '.join(otel.KINDS)}")
        absent = otel.missing(traces)
        if absent:
            raise ConfigError(f"the demo traced with {traces} needs {', '.join(absent)}: pip install {' '.join(absent)}")
    plainly = attach or inject or traces is not None
    spec = scenario if isinstance(scenario, Scenario) else get_scenario(scenario)
    if http not in HTTP_IMPLEMENTATIONS:
        raise ConfigError(f"http={http!r}: choose one of {', '.join(HTTP_IMPLEMENTATIONS)}")
    if loop not in LOOP_IMPLEMENTATIONS:
        raise ConfigError(f"loop={loop!r}: choose one of {', '.join(LOOP_IMPLEMENTATIONS)}")
    seconds = duration_from_env() if duration_s is None else duration_s
    if seconds <= 0:
        raise ConfigError("the demo duration must be > 0 s")
    capture = Path(
        capture or time.strftime("latprof-demo-%Y%m%d-%H%M%S.jsonl")
    ).resolve()
    if capture.exists():
        capture.unlink()  # `latprof run` appends; a demo starts afresh

    def say(message: str) -> None:
        if progress is not None:
            progress.write(f"latprof demo: {message}\n")
            progress.flush()

    with tempfile.TemporaryDirectory(prefix="latprof-demo-") as tmp:
        workdir = Path(tmp)
        url = (
            normalize_dsn(dsn) if dsn else f"sqlite+aiosqlite:///{workdir / 'demo.db'}"
        )
        db_label = "PostgreSQL" if url.startswith("postgresql") else "SQLite"
        server = "".join(
            f", --{name} {value}" for name, value in (("http", http), ("loop", loop)) if value != "auto"
        )
        say(f"scenario {spec.name}: {spec.summary} ({db_label}{server})")
        settings = dict(spec.provider)
        if traces is not None and traces != "stock":
            # OpenLLMetry and OpenInference mark the first chunk of any kind as the first token: the
            # role-only chunk goes with the first token, as OpenAI and vLLM send it (docs/genai.md)
            settings.setdefault("role_chunk_first", False)
        service_env: dict[str, str] = {}
        if spec.tls:  # a CA made for this run: the provider serves its certificate, the service trusts it
            certificate = LocalCertificate.make(workdir)
            settings.update(certificate.settings())
            service_env["LATPROF_DEMO_PROVIDER_CA"] = certificate.ca_file
        with Provider(ProviderConfig(**settings)) as provider:
            port = _free_port()
            # a provider that runs an engine's scheduler publishes its metrics: latprof scrapes them
            engines = ["--engine-metrics", provider.metrics_url] if settings.get("engine_max_running") else []
            env = {
                **os.environ,
                "LATPROF_DEMO_DSN": url,
                "LATPROF_DEMO_POOL_SIZE": str(spec.pool_size),
                "LATPROF_DEMO_PROVIDER_URL": provider.url,
                "LATPROF_DEMO_THREADPOOL_TOKENS": str(spec.threadpool_tokens),
                "LATPROF_DEMO_EXPORT_BLOCK_MS": str(spec.export_block_ms),
                "LATPROF_DEMO_LLM_MAX_CONNECTIONS": str(spec.llm_max_connections),
                **service_env,
            }
            service = [
                sys.executable, "-m", "uvicorn", "latprof.demo.service:app", "--host", "127.0.0.1",
                "--port", str(port), "--log-level", "warning", "--no-access-log",
                "--http", http, "--loop", loop,
            ]  # fmt: skip
            cmd = service if plainly else [
                sys.executable, "-m", "latprof", "run", "--no-report", "--out", str(capture), *engines,
                *(["--max-rate", f"{max_rate:g}"] if max_rate is not None else []), "--", *service,
            ]  # fmt: skip
            receiver: subprocess.Popen[bytes] | None = None
            receive_port = _free_port()
            if traces is not None:
                env.update({"LATPROF_DEMO_TRACES": traces,
                            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{receive_port}/v1/traces"})  # fmt: skip
            log_path = workdir / "service.log"
            sampler: subprocess.Popen[bytes] | None = None
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    cmd,
                    cwd=workdir,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                try:
                    base_url = f"http://127.0.0.1:{port}"
                    _wait_ready(proc, base_url, log_path)
                    say(
                        f"service up on {base_url} (pid {proc.pid}); {spec.rate_rps:g} requests/s for {seconds:g} s"
                    )
                    sampler = _start_attach(proc.pid, capture, seconds, workdir, inject, engines) if attach or inject else None
                    if traces is not None:  # before the load: the service sends spans from its first request on
                        receiver = _start_receive(capture, workdir, receive_port, engines)
                    load = drive(
                        base_url,
                        spec.path,
                        spec.rate_rps,
                        seconds,
                        progress=progress,
                        mix=spec.mix,
                        steps=spec.rate_steps,
                    )
                    if sampler is not None:
                        _finish_attach(sampler, workdir)
                finally:
                    if sampler is not None and sampler.poll() is None:  # the load failed: attach goes too
                        sampler.kill()
                        sampler.wait()
                    code = _stop(proc)
                    if receiver is not None:  # after the service flushed its spans at shutdown
                        _finish_receive(receiver, workdir)
            if load.errors and progress is not None:
                say(
                    f"{load.errors} requests failed, e.g. {load.error_samples[0] if load.error_samples else '?'}"
                )
            if not capture.exists():
                raise CollectorError(
                    f"the demo service wrote no capture (exit {code}): {_tail(log_path)}"
                )
        say(f"capture written to {capture}; diagnosing")
        inputs = [capture]
        if traces is not None and engines:
            from latprof.cli.receive import engine_capture_of

            inputs.append(engine_capture_of(capture))
        diagnosis = run_diagnosis(inputs, warmup_s=None if inject else warmup_s,
                                  source_kind="receive" if traces is not None else None)  # fmt: skip
    return DemoResult(spec, capture, diagnosis, load)


#: Seconds `latprof attach` takes to start sampling; its duration leaves them out of the load's.
ATTACH_START_S = 1.0


def _start_attach(pid: int, capture: Path, seconds: float, workdir: Path, inject: bool = False,
                  engines: Sequence[str] = ()) -> subprocess.Popen[bytes]:  # fmt: skip
    """`latprof attach --pid` (`--inject`) over the load: it samples (records) while the load runs and ends with it."""
    duration = max(1.0, seconds - ATTACH_START_S)
    cmd = [sys.executable, "-m", "latprof", "attach", "--pid", str(pid), "--duration", f"{duration:g}",
           "--out", str(capture), "--format", "json", "--output", str(workdir / "attach-report.json"),
           *(["--inject"] if inject else []), *engines]  # fmt: skip
    with open(workdir / "attach.log", "wb") as log:  # the child keeps its own descriptor
        return subprocess.Popen(cmd, cwd=workdir, stdout=log, stderr=subprocess.STDOUT)


def _finish_attach(sampler: subprocess.Popen[bytes], workdir: Path) -> None:
    _finish(sampler, "latprof attach", workdir / "attach.log", START_TIMEOUT_S)


def _finish(child: subprocess.Popen[bytes], what: str, log: Path, timeout_s: float) -> None:
    """Wait for `child` (`what`, logging to `log`) to exit on its own: killed after `timeout_s`, a `CollectorError` unless it exited 0."""
    try:
        code = child.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        raise CollectorError(f"{what} did not finish after the load") from None
    if code != 0:
        raise CollectorError(f"{what} exited with {code}: {_tail(log)}")


def _start_receive(capture: Path, workdir: Path, port: int, engines: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """`latprof receive` on loopback `port`, writing what the traced service sends to `capture`;
    returned once it accepts connections."""
    cmd = [sys.executable, "-m", "latprof", "receive", "--listen", f"127.0.0.1:{port}", "--out", str(capture),
           "--format", "json", "--output", str(workdir / "receive-report.json"), *engines]  # fmt: skip
    with open(workdir / "receive.log", "wb") as log:
        receiver = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if receiver.poll() is not None:
            raise CollectorError(f"latprof receive exited with {receiver.returncode}: {_tail(workdir / 'receive.log')}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
            return receiver
        except OSError:
            time.sleep(0.1)
    receiver.kill()
    receiver.wait()
    raise CollectorError(f"latprof receive did not listen within {START_TIMEOUT_S:g} s: {_tail(workdir / 'receive.log')}")


def _finish_receive(receiver: subprocess.Popen[bytes], workdir: Path) -> None:
    """SIGTERM: `latprof receive` writes what it received and its report, then exits."""
    receiver.send_signal(signal.SIGTERM)
    _finish(receiver, "latprof receive", workdir / "receive.log", STOP_TIMEOUT_S)


def _tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:].strip() or "(no output)"
    except OSError:
        return "(no output)"


def _wait_ready(proc: subprocess.Popen[bytes], base_url: str, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise CollectorError(
                f"the demo service exited with {proc.returncode}: {_tail(log_path)}"
            )
        try:
            if httpx.get(f"{base_url}/health", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise CollectorError(
        f"the demo service did not answer within {START_TIMEOUT_S:g} s: {_tail(log_path)}"
    )


def _stop(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM to `latprof run` (it forwards it to uvicorn), wait; kill its process group if it hangs."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _kill_tree(proc)
        return proc.wait()


def _children(pid: int) -> list[int]:
    """The pids of `pid`'s descendants (Linux /proc; none elsewhere)."""
    found: list[int] = []
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as stream:
            direct = [int(p) for p in stream.read().split()]
    except OSError:
        return found
    for child in direct:
        found += [child, *_children(child)]
    return found


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL `latprof run` and what it started, by pid (uvicorn runs in its own process group)."""
    for child in _children(proc.pid):
        try:
            os.kill(child, signal.SIGKILL)
        except OSError:
            continue
    proc.kill()


if __name__ == "__main__":  # python -m latprof.demo.run [SCENARIO]
    from latprof.report import renderers

    result = run_demo(*(sys.argv[1:2] or [DEFAULT_SCENARIO]))
    renderers.REPORT.render("text", result.report, sys.stdout)
