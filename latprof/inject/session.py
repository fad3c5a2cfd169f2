"""`latprof attach --pid PID --inject`: load the hooks into each worker, record, remove them, merge.

1. **Which processes.** The Python workers of a server master (its Python descendants that
   share one of its listening sockets: gunicorn workers, uvicorn `--workers` children), never
   the master itself - workers it forks later would inherit the patches without a watchdog.
   A process that serves itself (a worker, a single-process server) is injected itself.
2. **One at a time.** Each process is inspected (`target.inspect`), checked (its Python, its
   user: another user's process needs `allow_other_user`), given a payload in a private
   workspace (`payload.Workspace`), and injected (`mechanism`). latprof waits up to
   `SAFE_POINT_S` for its main thread to reach a safe point (the payload's first status); if
   it does not, the payload is removed - the code queued in the process then does nothing
   when it runs - and the process is left as it was. Then up to `LOAD_S` for the hooks to
   load, before the next process.
3. **Recording** for `duration_s` from when the last process started recording; latprof renews
   each workspace's lease every second meanwhile.
4. **Detach**: a `stop` file in each workspace; each process removes its hooks and says how it
   went (`detached` status). Its capture is appended to `out`, followed by an `injected`
   quality record per process: the outcome, how long it was held, the hooks and what each
   could see, and the detach's account (attributes restored, threads, modules left imported).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import orjson

from latprof.capture.format import encode, make_header
from latprof.errors import CollectorError, InputError
from latprof.events import QualityRecord
from latprof.inject import target as targets
from latprof.inject.mechanism import Injection, Injector, injector_for
from latprof.inject.payload import LEASE_TOUCH_S, PROTOCOL, Workspace, bootstrap, payload
from latprof.semconv import NOTE_INJECTED

#: A process whose main thread reaches no safe point within this many seconds is left alone.
SAFE_POINT_S = 5.0
#: ... and one that reached it has this long to import latprof and load its hooks.
LOAD_S = 20.0
#: After `stop`, each process has this long to remove its hooks and say so.
DETACH_S = 10.0
#: The watchdog's deadline in each process: this long after latprof means to stop it.
WATCHDOG_GRACE_S = 10.0
#: What the code in the process says, in order (`latprof.inject.payload`, `latprof.collectors.hooks.injected`).
_STATES = ("alive", "recording", "refused", "not-importable", "failed", "detached")


@dataclass
class Injected:
    """What happened in one process."""

    pid: int
    name: str
    #: "recorded", or why not: "refused", "no-safe-point", "not-importable", "failed", "exited"
    outcome: str
    message: str = ""
    python: str = ""
    held_ms: float | None = None
    hooks: list[str] = field(default_factory=list)
    coverage: dict[str, str] = field(default_factory=dict)
    detach: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "outcome": self.outcome, "message": self.message, "python": self.python,
                "held_ms": self.held_ms, "hooks": self.hooks, "coverage": self.coverage, "detach": self.detach}  # fmt: skip


class InjectSession:
    """One `attach --inject`: `run()` injects, records for `duration_s`, detaches, writes `out`."""

    def __init__(
        self,
        pid: int,
        out: str,
        *,
        duration_s: float,
        hooks: list[str],
        max_rate: float,
        allow_other_user: bool = False,
        subprocesses: bool = True,
        on_progress: Callable[[str], None] | None = None,
    ) -> None:
        self.pid = pid
        self.out = out
        self.duration_s = duration_s
        self.hooks = hooks
        self.max_rate = max_rate
        self.allow_other_user = allow_other_user
        self.subprocesses = subprocesses
        self.on_progress = on_progress or (lambda message: None)
        self.results: list[Injected] = []
        self._stop = threading.Event()
        self._workspaces: dict[tuple[str, int, int], Workspace] = {}
        self._recording: list[tuple[Injected, Workspace]] = []

    def stop(self) -> None:
        """End the recording early (Ctrl-C); what was recorded is kept."""
        self._stop.set()

    @property
    def recording(self) -> list[Injected]:
        """The processes whose hooks are recording now (or were, once the session ended)."""
        return [result for result, _ in self._recording]

    def processes(self) -> list[int]:
        """The processes to inject: the workers of a server master, else the process itself."""
        if not os.path.exists(f"/proc/{self.pid}"):
            raise CollectorError(f"no process with PID {self.pid}")
        workers = targets.workers(self.pid)
        if workers and not self.subprocesses:
            raise CollectorError(f"PID {self.pid} is a server master with workers {', '.join(map(str, workers))}:"
                                 " latprof never injects into a master; inject into a worker with --pid WORKER")  # fmt: skip
        return workers or [self.pid]

    def run(self) -> list[Injected]:
        pids = self.processes()
        checked = [self._check(pid) for pid in pids]  # every refusal before anything is touched (target, injector)
        try:
            self._write(b"")  # the capture must be writable before any process is changed
        except OSError as exc:
            raise InputError(f"{self.out}: cannot write: {exc.strerror or exc}") from None
        lease = threading.Thread(target=self._renew, name="latprof-inject-lease", daemon=True)
        lease.start()
        try:
            for index, (target, injector) in enumerate(checked):
                if self._stop.is_set():
                    break
                remaining = len(checked) - index - 1
                self.results.append(self._inject(target, injector, f"p{index}", remaining))
            if self._recording:
                self.on_progress(f"recording in {len(self._recording)} process(es) for {self.duration_s:g} s")
                self._stop.wait(self.duration_s)
        finally:
            self._detach_all()
            self._stop.set()
            lease.join(2)
            self._collect()
            for workspace in self._workspaces.values():
                workspace.close()
        return self.results

    # -- one process ---------------------------------------------------------------------------

    def _check(self, pid: int) -> tuple[targets.Target, Injector]:
        target = targets.inspect(pid)
        injector = injector_for(target)  # refuses what it does not support
        if target.uid != os.geteuid() and not self.allow_other_user:
            raise CollectorError(f"PID {pid} runs as another user (uid {target.uid}): its hooks would run latprof's code"
                                 " with that user's rights; pass --allow-other-user to inject anyway")  # fmt: skip
        return target, injector

    def _workspace(self, target: targets.Target) -> Workspace:
        key = (target.root, target.uid, target.gid)
        if key not in self._workspaces:
            self._workspaces[key] = Workspace.create(target.root, target.uid, target.gid)
            self._workspaces[key].touch("lease")
        return self._workspaces[key]

    def _inject(self, target: targets.Target, injector: Injector, name: str, remaining: int) -> Injected:
        result = Injected(target.pid, name, "failed", python=target.version)
        workspace = self._workspace(target)
        now = time.time()
        deadline = now + (remaining + 1) * (SAFE_POINT_S + LOAD_S) + self.duration_s + WATCHDOG_GRACE_S
        config = {"dir": workspace.inside, "name": name, "protocol": PROTOCOL, "hooks": self.hooks,
                  "max_rate": self.max_rate, "start_by": now + SAFE_POINT_S, "deadline": deadline,
                  "target_pid": target.pid}  # fmt: skip
        payload_file = f"payload-{name}.py"
        path = workspace.write(payload_file, payload(config).encode())
        self.on_progress(f"injecting into PID {target.pid} (CPython {target.version})")
        try:
            injection: Injection = injector.inject(target, bootstrap(path))
        except CollectorError as exc:
            workspace.remove(payload_file)
            result.message = str(exc)
            result.outcome = "exited" if not os.path.exists(f"/proc/{target.pid}") else "failed"
            return result
        result.held_ms = injection.held_ms
        status = self._wait_status(workspace, name, _STATES, now + SAFE_POINT_S + 0.5)  # any: it may be past alive
        if status is None:
            workspace.remove(payload_file)  # the queued code finds no payload when it runs: nothing happens
            status = workspace.read_json(f"status-{name}.json")  # it may have started in between
            if status is None:
                result.outcome = "no-safe-point"
                result.message = (f"PID {target.pid} reached no safe point within {SAFE_POINT_S:g} s (its main thread ran"
                                  " no Python code: blocked in a C call or a long sleep, or idle in one); it was left"
                                  " unchanged")  # fmt: skip
                return result
        status = self._wait_status(workspace, name, ("recording", "refused", "not-importable", "failed", "detached"),
                                   time.time() + LOAD_S) or status
        workspace.remove(payload_file)
        state = status.get("state")
        if state == "recording":
            result.outcome = "recorded"
            result.hooks = [str(h) for h in status.get("hooks", ())]
            result.coverage = {str(k): str(v) for k, v in dict(status.get("coverage", {})).items()}
            self._recording.append((result, workspace))
        elif state == "not-importable":
            result.outcome = "not-importable"
            result.message = (f"latprof is not importable in PID {target.pid}'s environment ({status.get('prefix')}:"
                              f" {status.get('error')}); install it there, e.g. `{status.get('executable')} -m pip install"
                              " latprof`, and run again")  # fmt: skip
        elif state == "refused":
            result.outcome = "refused"
            result.message = f"PID {target.pid} refused: {status.get('reason')}"
        elif state == "failed":
            result.message = f"PID {target.pid} could not start recording: {status.get('error')}"
        else:
            result.message = f"PID {target.pid} did not load its hooks within {LOAD_S:g} s (last status: {state})"
        return result

    @staticmethod
    def _wait_status(workspace: Workspace, name: str, states: tuple[str, ...], until: float) -> dict[str, Any] | None:
        while True:
            status = workspace.read_json(f"status-{name}.json")
            if status is not None and status.get("state") in states:
                return status
            if time.time() > until:
                return None
            time.sleep(0.02)

    # -- the end -------------------------------------------------------------------------------

    def _renew(self) -> None:
        while not self._stop.wait(LEASE_TOUCH_S):
            for workspace in list(self._workspaces.values()):
                workspace.touch("lease")

    def _detach_all(self) -> None:
        for workspace in {id(ws): ws for _, ws in self._recording}.values():
            workspace.touch("stop")
        until = time.time() + DETACH_S
        for result, workspace in self._recording:
            status = self._wait_status(workspace, result.name, ("detached",), until)
            if status is None:
                result.detach = {"reason": f"no answer within {DETACH_S:g} s"}
                continue
            result.detach = {key: status.get(key) for key in ("reason", "patched", "restored", "not_restored",
                             "threads_before", "threads_after", "modules_imported")}  # fmt: skip

    def _collect(self) -> None:
        """Append each recorded process's capture, then one `injected` record per process, to `out`."""
        for result, workspace in self._recording:
            try:
                with open(workspace.path(f"capture-{result.name}.jsonl"), "rb") as f:
                    data = f.read()
            except OSError as exc:
                result.message = f"its capture could not be read: {exc.strerror or exc}"
                continue
            if data and not data.endswith(b"\n"):
                data = data[: data.rfind(b"\n") + 1]  # a torn last line (it was killed mid-write)
            self._write(data)
        lines = [orjson.dumps(make_header("run", method="inject", target_pid=self.pid, pid=self.pid))]
        now = time.time_ns()
        for result in self.results:
            record = QualityRecord(NOTE_INJECTED, now, result.pid, result.message or result.outcome, 1, result.to_dict())
            lines.append(orjson.dumps(encode(record)))
        self._write(b"\n".join(lines) + b"\n")

    def _write(self, data: bytes) -> None:
        with open(self.out, "ab") as f:
            f.write(data)
