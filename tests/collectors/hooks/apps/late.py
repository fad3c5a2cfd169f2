"""The hooks loaded into a service that is already serving, as `latprof attach --inject` loads them: on a file the test writes.

A service started without latprof calls `start(probe)` when it is imported; a thread of its
own (`late-control`) then waits in `$LATE_CONTROL_DIR` for these files, in this order, and
answers each with `NAME.json` beside it:

- `install` (JSON: `{"hooks": [...], "capture": PATH}`): what the injection does - a
  `CaptureWriter` on PATH, `runtime.start`, every request recorded (`configure_sampling(0)`),
  `bootstrap.install_hooks` - after taking a snapshot of the process (below). Answers with the
  hooks installed, each one's `late_coverage()`, and when the hooks were in (`installed_ns`).
- `probe` (optional): the service's own `probe("installed")` and the threads, while the hooks record.
- `uninstall`: every hook's `uninstall()` (in reverse order, as the injection does),
  `runtime.stop()`, the writer closed; then, after `SETTLE_S`, the snapshot again. Answers
  with what differs from before the install: attributes that are not the very same object
  (`not_restored`), threads, and the service's `probe("after")`.

The snapshot: the `id()` of every callable attribute of every imported module, and of every
attribute of the classes defined in the modules of the libraries the hooks patch (so a
wrapper left anywhere, also on a name a module imported under its own, shows as a changed
id); the process's threads (`threading.enumerate()` and the kernel's count).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

#: How long after the uninstall the snapshot is taken: a loop's monitor is closed on the loop's
#: own thread, shortly after.
SETTLE_S = 0.3
POLL_S = 0.02

Probe = Callable[[str], dict[str, Any]]


def start(probe: Probe | None = None) -> None:
    """Wait for the test's files on a thread of the service's own (nothing without `$LATE_CONTROL_DIR`)."""
    folder = os.environ.get("LATE_CONTROL_DIR")
    if folder:
        threading.Thread(target=_control, args=(Path(folder), probe or (lambda phase: {})), name="late-control",
                         daemon=True).start()  # fmt: skip


def _answer(path: Path, body: dict[str, Any]) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(body, default=repr))
    partial.rename(path)


def _wait_for(path: Path) -> None:
    while not path.exists():
        time.sleep(POLL_S)


def _control(folder: Path, probe: Probe) -> None:
    try:
        _wait_for(folder / "install")
        order = json.loads((folder / "install").read_text())
        before = snapshot()
        threads_before = threads()
        probe_before = probe("before")

        from latprof.capture.writer import CaptureWriter
        from latprof.collectors.hooks import bootstrap, runtime

        writer = CaptureWriter(order["capture"], source="run")
        runtime.start(writer)
        runtime.configure_sampling(0)
        installed = bootstrap.install_hooks(order["hooks"])
        installed_ns = time.time_ns()
        during = snapshot()
        patched = sorted(key for key, value in during.items() if key in before and before[key] != value)
        _answer(folder / "install.json", {
            "installed": installed, "installed_ns": installed_ns, "patched": patched, "probe": probe_before,
            "coverage": {name: bootstrap.HOOKS[name].late_coverage() for name in installed},
            "scaffold_patched": sum(len(bootstrap.HOOKS[name].scaffold.patched) for name in installed),
        })  # fmt: skip

        while not (folder / "uninstall").exists():
            if (folder / "probe").exists() and not (folder / "probe.json").exists():
                _answer(folder / "probe.json", {**probe("installed"), "threads": threads()})
            time.sleep(POLL_S)
        for name in reversed(installed):
            bootstrap.HOOKS[name].uninstall()
        runtime.stop()
        writer.close()
        time.sleep(SETTLE_S)
        after = snapshot()
        _answer(folder / "uninstall.json", {
            "not_restored": sorted(key for key, value in before.items() if key in after and after[key] != value),
            "restored": sum(1 for key in patched if after.get(key) == before[key]),
            "threads_before": threads_before, "threads_after": threads(), "probe": probe("after"),
            "errors": runtime.errors(),
        })  # fmt: skip
    except BaseException as exc:  # said to the test, which fails on it
        _answer(folder / "failed.json", {"error": f"{type(exc).__name__}: {exc}"})
        raise


#: Top-level packages whose classes' attributes are in the snapshot: what the hooks patch.
LIBRARIES = frozenset({
    "threading", "time", "asyncio", "concurrent", "gunicorn", "flask", "werkzeug", "uvicorn", "anyio", "starlette",
    "fastapi", "sqlalchemy", "psycopg", "psycopg_pool", "asyncpg", "redis", "httpx", "httpcore", "httpx2", "httpcore2",
    "openai", "anthropic", "aiohttp", "langchain_core", "agents", "mcp",
})  # fmt: skip


def snapshot() -> dict[str, int]:
    """`module.name` and `module.Class.name` -> id() of the object there (see the module's notes)."""
    import sys

    out: dict[str, int] = {}
    classes: set[int] = set()
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict) or name.startswith(("latprof", "tests.")):
            continue
        deep = name.partition(".")[0] in LIBRARIES
        for attribute, value in list(namespace.items()):
            if callable(value):
                out[f"{name}.{attribute}"] = id(value)
            if deep and isinstance(value, type) and id(value) not in classes:
                classes.add(id(value))
                for member, inner in list(vars(value).items()):
                    out[f"{value.__module__}.{value.__qualname__}.{member}"] = id(inner)
    return out


def threads() -> dict[str, Any]:
    """This process's threads: their names (Python's) and how many the kernel counts."""
    return {"names": sorted(t.name for t in threading.enumerate()), "tasks": len(os.listdir("/proc/self/task"))}
