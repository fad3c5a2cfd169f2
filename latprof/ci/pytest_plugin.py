"""The `latprof` pytest fixture: run a service under `latprof run` in a test and hold its capture to the config's checks.

Loaded in every pytest session of an environment where latprof is installed (entry point
`pytest11`), so importing this module costs only the standard library and pytest: the
analysis is imported when a test first calls `latprof.check`. `-p no:latprof` turns it off.

    def test_chat_p99_has_no_known_fault(latprof):
        service = latprof.run("uvicorn", "app:app", "--port", "8000", ready_url="http://127.0.0.1:8000/health")
        drive_load("http://127.0.0.1:8000")
        latprof.check(service.stop())  # fails the test with one line per failed check

`check` uses the config `check_paths` finds from the working directory (`[tool.latprof]`,
latprof.toml), unless `config=` or `--latprof-config FILE` / the ini key `latprof_config`
names one. Checks that fail at level "warning" do not fail the test: they are listed in a
"latprof" report section of the test and in a summary at the end of the session (not as
Python warnings, which `filterwarnings = error` would turn into errors).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence, Union

import pytest

if TYPE_CHECKING:
    from latprof.ci.checks import CheckRun
    from latprof.ci.config import Config

    StrPath = Union[str, os.PathLike[str]]

#: Seconds `Service.stop` waits after SIGINT before it kills what the service started.
STOP_TIMEOUT_S = 30.0
#: How much of a service's output a failure message quotes (its end).
LOG_TAIL_CHARS = 3000
_WARNINGS = pytest.StashKey[list[str]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("latprof", "latprof: which layer owns the p99 (the `latprof` fixture)")
    group.addoption(
        "--latprof-config", dest="latprof_config", metavar="FILE", default=None,
        help="Config file (pyproject.toml with [tool.latprof], or latprof.toml) for `latprof.check` in tests"
        " [default: ini latprof_config, else the one found from the working directory].",
    )  # fmt: skip
    parser.addini("latprof_config", "Config file for `latprof.check` in tests, relative to the ini file.", type="paths", default=[])


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_WARNINGS] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    lines = config.stash.get(_WARNINGS, [])
    if lines:
        terminalreporter.write_sep("=", "latprof warnings")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture
def latprof(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Latprof]:
    """Run services under `latprof run` and check captures; services still running at teardown are stopped."""
    fixture = Latprof(request, tmp_path / "latprof")
    try:
        yield fixture
    finally:
        fixture.close()


class Service:
    """A command running under `latprof run`, recording into `capture`; its output goes to `log`."""

    def __init__(self, proc: subprocess.Popen[bytes], cmd: Sequence[str], capture: Path, log: Path) -> None:
        self.proc = proc
        self.cmd = list(cmd)
        self.capture = capture
        self.log = log
        #: `latprof run`'s exit code (the service's; 128+N when signal N ended it), once stopped.
        self.returncode: int | None = None
        self.killed = False

    @property
    def pid(self) -> int:
        """The pid of `latprof run` (the service is its child)."""
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        """The end of what the service (and `latprof run`) wrote to stdout and stderr."""
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no output)"
        return text[-LOG_TAIL_CHARS:].strip() or "(no output)"

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> Path:
        """SIGINT to `latprof run` (it forwards it to the service, which flushes its capture) and
        wait; after `timeout_s`, SIGKILL to what it started. Returns the capture's path.

        Fails the test when `latprof run` refused to record (no process loaded the hooks) or no
        capture was written.
        """
        self._terminate(timeout_s)
        refused = [line for line in self.output().splitlines() if line.startswith("latprof: error:")]
        if refused or not self.capture.exists():
            pytest.fail(f"latprof: `{_shell(self.cmd)}` wrote no capture (latprof run exited with {self.returncode});"
                        f" its output:\n{self.output()}", pytrace=False)  # fmt: skip
        return self.capture

    def _terminate(self, timeout_s: float) -> None:
        if self.running:
            started = _descendants(self.proc.pid)  # kept: `latprof run` may be gone before them
            try:
                self.proc.send_signal(signal.SIGINT)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.killed = True
                self.proc.kill()
                self.proc.wait()
            _kill(started)  # what is left of what it started, by pid
        self.returncode = self.proc.wait()

    def __repr__(self) -> str:
        state = "running" if self.running else f"exited {self.proc.returncode}"
        return f"<latprof Service pid={self.pid} {state} {_shell(self.cmd)!r}>"


def _default_sigint() -> None:
    """In the child before exec: SIGINT back to its default disposition (an ignored signal stays ignored across exec)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Latprof:
    """What the `latprof` fixture returns: `run` starts a service under `latprof run`, `check` gates a capture."""

    def __init__(self, request: pytest.FixtureRequest, workdir: Path) -> None:
        self._request = request
        self.workdir = workdir
        self.services: list[Service] = []

    def run(self, *cmd: str, env: dict[str, str] | None = None, cwd: StrPath | None = None,
            ready_url: str | None = None, ready_timeout_s: float = 30.0) -> Service:  # fmt: skip
        """Start `cmd` under `latprof run --no-report`; with `ready_url`, wait until it answers.

        `env` is added to this process's environment. The service's output goes to a log file,
        quoted when it fails to start.
        """
        if not cmd:
            raise TypeError("latprof.run() needs a command, e.g. latprof.run('uvicorn', 'app:app')")
        self.workdir.mkdir(parents=True, exist_ok=True)
        n = len(self.services) + 1
        capture, log = self.workdir / f"service-{n}.jsonl", self.workdir / f"service-{n}.log"
        argv = [sys.executable, "-m", "latprof", "run", "--no-report", "--out", str(capture), "--", *cmd]
        # A background job of a non-interactive shell (how CI runners often start pytest) inherits
        # SIGINT ignored, and so would `latprof run` and the service: `stop` would wait out its timeout
        # and kill the service before its capture's last flush. The service gets SIGINT as from a terminal.
        restore = _default_sigint if signal.getsignal(signal.SIGINT) == signal.SIG_IGN else None
        with open(log, "wb") as out:
            # Own session: Ctrl-C in the terminal reaches pytest only, and teardown stops the service.
            proc = subprocess.Popen(argv, cwd=cwd, env={**os.environ, **(env or {})}, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=restore)  # fmt: skip
        service = Service(proc, cmd, capture, log)
        self.services.append(service)
        if ready_url is not None:
            self._wait_ready(service, ready_url, ready_timeout_s)
        return service

    def _wait_ready(self, service: Service, url: str, timeout_s: float) -> None:
        import urllib.error
        import urllib.request

        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, never a proxy
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not service.running:
                service._terminate(0)
                pytest.fail(f"latprof: `{_shell(service.cmd)}` exited with {service.returncode} before {url} answered;"
                            f" its output:\n{service.output()}", pytrace=False)  # fmt: skip
            try:
                with opener.open(url, timeout=1.0):
                    return
            except urllib.error.HTTPError as exc:  # it answered; a 5xx health check is not ready yet
                exc.close()
                if exc.code < 500:
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        service._terminate(5.0)
        pytest.fail(f"latprof: `{_shell(service.cmd)}` did not answer {url} within {timeout_s:g} s; its output:\n"
                    f"{service.output()}", pytrace=False)  # fmt: skip

    def check(self, *paths: StrPath, config: StrPath | Config | None = None, baseline: StrPath | None = None,
              skip_warmup_s: float | None = None) -> CheckRun:  # fmt: skip
        """Diagnose `paths` and run the configured checks (`latprof check`); fail the test when one fails.

        `config` is a config file or a `latprof.ci.config.Config` (default: `--latprof-config`, the
        ini's `latprof_config`, else the file found from the working directory). Bad input or
        config fails the test with latprof's one-line error. Returns the `CheckRun`.
        """
        from latprof.ci.checks import check_paths
        from latprof.ci.config import Config
        from latprof.errors import LatprofError
        from latprof.report.renderers.check_common import tally

        if not paths:
            raise TypeError("latprof.check() needs at least one capture or trace file")
        if config is None:
            config = self._default_config()
        try:
            if isinstance(config, Config):
                run = check_paths(paths, config=config, baseline=baseline, warmup_s=skip_warmup_s)
            else:
                run = check_paths(paths, config_path=config, baseline=baseline, warmup_s=skip_warmup_s)
        except LatprofError as exc:
            pytest.fail(f"latprof: {exc}", pytrace=False)
        self._record(run)
        if run.failed:
            lines = [f"latprof check: {tally(run)} ({', '.join(run.inputs)})"]
            for result in run.failed:
                lines.append(f"{result.title}: {' '.join(result.message.split())}")
                if result.fix:
                    lines.append(f"    fix: {' '.join(result.fix.split())}")
            lines.append(f"verdict: {run.report.verdict.summary}")
            pytest.fail("\n".join(lines), pytrace=False)
        return run

    def _default_config(self) -> Path | None:
        config = self._request.config
        option = config.getoption("latprof_config", None)
        if option:
            return Path(config.invocation_params.dir, option)
        ini: list[Path] = config.getini("latprof_config")
        return ini[0] if ini else None

    def _record(self, run: CheckRun) -> None:
        """Every result in the test's "latprof" report section; warnings also in the session's summary."""
        import io

        from latprof.report import renderers

        text = io.StringIO()
        renderers.CHECK.render("text", run, text)
        self._request.node.add_report_section("call", "latprof", text.getvalue())
        nodeid = self._request.node.nodeid
        for result in run.warnings:
            self._request.config.stash[_WARNINGS].append(f"{nodeid}: {result.title}: {' '.join(result.message.split())}")

    def close(self) -> None:
        """Stop every service this fixture started that is still running."""
        for service in self.services:
            service._terminate(STOP_TIMEOUT_S)


def _descendants(pid: int) -> list[Any]:
    """The processes `pid` started, as `psutil.Process` objects: they know their start time, so a reused pid is not taken for them."""
    import psutil

    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return []


def _kill(processes: Sequence[Any]) -> None:
    import psutil

    for process in processes:
        try:
            if process.is_running():
                process.kill()
        except psutil.Error:  # gone meanwhile, or not ours to kill
            pass


def _shell(cmd: Sequence[str]) -> str:
    import shlex

    return shlex.join(cmd)
