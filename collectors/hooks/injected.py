"""Recording in a process `latprof attach --inject` loaded latprof into, and leaving it as it was.

Runs inside the service, started by the payload (`latprof.inject.payload`) on a thread of
its own, `latprof-inject` (what py-spy and `threading.enumerate()` show):

1. **Refuses** a process that already records (it runs under `latprof run`) or a
   free-threaded build, and says why in its status file.
2. **Starts** a capture writer on `capture-NAME.jsonl` in latprof's private directory, and
   installs the hooks asked for, as `latprof run` does at start-up - but no signal handler (it
   would replace the service's own, and only the main thread may set one). A "hooks loaded"
   record says which hooks loaded, with `method: inject` and what each can see in a process
   that was already serving (`late_coverage()` of each hook).
3. **Waits** for latprof's `stop` file, a lease latprof stopped renewing (it died: `LEASE_S`),
   or its own deadline - whichever comes first.
4. **Detaches**: every hook's `uninstall()` (each patched attribute back to the very same
   object, instance-level state such as loop probes undone), latprof's import finder taken
   off `sys.meta_path`, the writer flushed and closed (its thread ends), then this thread
   ends. Its last status says how many patched attributes are back, which threads remain,
   and which modules were imported while it ran (they stay imported: unloading modules is not
   safe). Fork handlers that the imported modules registered stay registered and do nothing.

A child the process forks while its hooks are in (multiprocessing, a pre-fork pool) drops
them at once (`_leave_child`): nothing would remove them there.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
import time
from typing import Any, Callable

from latprof.capture.writer import CaptureWriter
from latprof.collectors.hooks import bootstrap, runtime
from latprof.events import QualityRecord
from latprof.semconv import NOTE_HOOKS_LOADED, NOTES_ACTIVITY

#: What the payload of the latprof that injects must speak (it checks before anything else).
PROTOCOL = 1
#: The hooks are removed when latprof has not renewed its lease for this long (it died).
LEASE_S = 10.0
THREAD_NAME = "latprof-inject"
#: How often the thread looks for `stop`, the lease and the deadline.
POLL_S = 0.1
#: After the hooks are out, requests still in flight have this long to end and be written.
FINISH_S = 1.0

Status = Callable[..., None]


def start(config: dict[str, Any], status: Status, modules_before: frozenset[str] = frozenset()) -> None:
    """Check the process, then record on a thread of its own (the caller's thread ends).

    `modules_before`: `sys.modules` before the payload imported latprof (for the detach's account)."""
    if runtime.active():
        status("refused", reason="this process already records: it runs under `latprof run`")
        return
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        status("refused", reason="a free-threaded CPython: --inject is not supported there yet")
        return
    thread = threading.Thread(target=_run, args=(config, status, modules_before or frozenset(sys.modules)),
                              name=THREAD_NAME, daemon=True)
    thread.start()


def _run(config: dict[str, Any], status: Status, modules_before: frozenset[str]) -> None:
    patched: list[tuple[Any, str, Any]] = []
    installed: list[str] = []
    writer: CaptureWriter | None = None
    threads_before = _threads() - 1  # not this one
    folder, name = config["dir"], config["name"]
    try:
        writer = CaptureWriter(f"{folder}/capture-{name}.jsonl", source="run",
                               header_extra={"method": "inject", "target_pid": config.get("target_pid")})  # fmt: skip
        runtime.start(writer)
        runtime.injected = True
        runtime.configure_sampling(float(config.get("max_rate", runtime.DEFAULT_MAX_RATE)))
        installed = bootstrap.install_hooks([n for n in config["hooks"] if n in bootstrap.HOOKS])
        coverage = {hook: _coverage(hook) for hook in installed}
        runtime.emit(QualityRecord(
            NOTE_HOOKS_LOADED, runtime.now_ns(), runtime.pid(), ", ".join(installed) or "no hooks", 1,
            {"collectors": installed, "executable": sys.executable, "max_rate": runtime.sampler.max_rate,
             NOTES_ACTIVITY: True, "method": "inject", "coverage": coverage},
        ))  # fmt: skip
        status("recording", hooks=installed, coverage=coverage, started=time.time())
        reason = _wait(folder, float(config["deadline"]))
    except BaseException as exc:  # never into the service: say it, then undo what was done
        reason = f"failed: {type(exc).__name__}: {exc}"[:300]
    finally:
        patched = [(owner, attr, original) for hook in installed
                   for owner, attr, original, _ in getattr(bootstrap.HOOKS[hook], "scaffold").patched]  # fmt: skip
        _detach(installed, writer)
    not_restored = [f"{getattr(owner, '__qualname__', owner)}.{attr}" for owner, attr, original in patched
                    if vars(owner).get(attr) is not original]  # fmt: skip
    try:
        status("detached", reason=reason, patched=len(patched), restored=len(patched) - len(not_restored),
               not_restored=not_restored[:20], hooks=installed, threads_before=threads_before,
               threads_after=_threads() - 1,  # this one ends right after
               modules_imported=sorted(set(sys.modules) - modules_before)[:500])  # fmt: skip
    except Exception:
        pass


def _wait(folder: str, deadline: float) -> str:
    """Why recording ends: latprof's stop, a lease latprof stopped renewing, or the deadline."""
    while True:
        if os.path.lexists(f"{folder}/stop"):
            return "stopped by latprof"
        now = time.time()
        try:
            renewed = os.stat(f"{folder}/lease", follow_symlinks=False).st_mtime
        except OSError:
            renewed = 0.0
        if now - renewed > LEASE_S:
            return f"latprof stopped renewing its lease for {LEASE_S:g} s"
        if now > deadline:
            return "the injection's deadline passed"
        time.sleep(POLL_S)


def _detach(installed: list[str], writer: CaptureWriter | None) -> None:
    _uninstall(installed)
    runtime.forget_imports()
    # Requests that started while the hooks were in still end through their wrappers: give
    # them a moment to write their roots, rather than leave their segments without one.
    time.sleep(FINISH_S)
    runtime.report_errors(force=True)
    runtime.stop()
    runtime.injected = False
    if writer is not None:
        writer.close()


def _uninstall(installed: list[str]) -> None:
    for hook in reversed(installed):
        try:
            bootstrap.HOOKS[hook].uninstall()
        except Exception as exc:
            runtime.count_error(hook, exc)


def _leave_child() -> None:
    """In a child the injected process forked while recording: no watchdog runs here and
    latprof never asked for it, so the hooks go at once and nothing is recorded."""
    if not runtime.injected:
        return
    try:
        writer = runtime._writer
        _uninstall([name for name, module in bootstrap.HOOKS.items() if getattr(module, "scaffold").installed])
        runtime.forget_imports()
        runtime.stop()
        runtime.injected = False
        if writer is not None:
            writer.close()
    except Exception:
        pass


os.register_at_fork(after_in_child=_leave_child)


def _coverage(hook: str) -> str:
    try:
        late = getattr(bootstrap.HOOKS[hook], "late_coverage", None)
        return str(late()) if late is not None else ""
    except Exception as exc:
        runtime.count_error(hook, exc)
        return ""


def _threads() -> int:
    return threading.active_count()
