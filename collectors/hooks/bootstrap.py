"""Start recording in this process when `latprof run` started it: the writer and every hook."""

from __future__ import annotations

import os
import sys
from types import ModuleType
from typing import Mapping

from latprof.capture.writer import CaptureWriter, install_flush_on_signals
from latprof.collectors.hooks import (
    agent_tools,
    aiohttp_client,
    aiohttp_web,
    anthropic,
    asgi,
    asyncio_loop,
    asyncpg,
    httpx,
    litellm,
    locks,
    openai,
    psycopg_pool,
    redis,
    runtime,
    sleeps,
    sqlalchemy,
    threads,
    wsgi,
)
from latprof.events import QualityRecord
from latprof.semconv import NOTE_HOOKS_LOADED, NOTES_ACTIVITY

#: A folder `latprof run` reads after the command: each process's writer leaves its totals
#: there when it closes (what it wrote and lost), which `latprof run` reports even when the
#: capture itself could not be written.
ENV_STATUS_DIR = "LATPROF_STATUS_DIR"

#: Every hook by the name `--hooks` knows it by: a module whose `scaffold` (`_scaffold.Hook`)
#: says what it patches in which library versions, with an `install()` that patches each library
#: when the service imports it (importing a hook module patches nothing) and an `uninstall()`.
HOOKS: dict[str, ModuleType] = {
    module.__name__.rpartition(".")[2]: module
    for module in (
        agent_tools, aiohttp_client, aiohttp_web, anthropic, asgi, asyncio_loop, asyncpg, httpx, litellm, locks, openai,
        psycopg_pool, redis, sleeps, sqlalchemy, threads, wsgi,
    )
}  # fmt: skip


def hook_names() -> list[str]:
    """The name of every hook, in name order."""
    return sorted(HOOKS)


def install_hooks(names: list[str]) -> list[str]:
    """Install the named hooks; return those that installed. A hook that fails is counted, not fatal."""
    installed = []
    for name in names:
        try:
            if HOOKS[name].install() is not False:
                installed.append(name)
        except Exception as exc:
            runtime.count_error(name, exc)
    return installed


def install_from_environment(environ: Mapping[str, str] = os.environ) -> list[str]:
    """Record into `$LATPROF_CAPTURE` with the hooks of `$LATPROF_HOOKS` (default all).

    Does nothing without `LATPROF_CAPTURE`, or when this process already records. Writes a
    "hooks loaded" record naming the hooks, which `latprof run` looks for.
    """
    path = environ.get(runtime.ENV_CAPTURE)
    if not path or runtime.active():
        return []
    writer = CaptureWriter(path, source="run", status_dir=environ.get(ENV_STATUS_DIR) or None)
    runtime.start(writer)
    install_flush_on_signals(writer)
    max_rate = _max_rate(environ.get(runtime.ENV_MAX_RATE))
    runtime.configure_sampling(max_rate)
    wanted = environ.get(runtime.ENV_HOOKS, "all")
    available = hook_names()
    names = available if wanted in ("", "all") else [n for n in wanted.split(",") if n in available]
    installed = install_hooks(names)
    _installed[:] = installed
    runtime.emit(
        QualityRecord(
            NOTE_HOOKS_LOADED,
            runtime.now_ns(),
            runtime.pid(),
            ", ".join(installed) or "no hooks",
            1,
            {"collectors": installed, "executable": sys.executable, "max_rate": max_rate, NOTES_ACTIVITY: True},
        )
    )
    return installed


def _max_rate(value: str | None) -> float:
    """`$LATPROF_MAX_RATE` as a number of requests a second (0: record all); the default when unset or bad."""
    if value is None or not value.strip():
        return runtime.DEFAULT_MAX_RATE
    try:
        rate = float(value)
    except ValueError:
        rate = -1.0
    if not 0 <= rate < float("inf"):
        runtime.count_error("bootstrap", ValueError(f"{runtime.ENV_MAX_RATE}={value!r} is not a rate; using the default"),
                            own_message=True)  # fmt: skip
        return runtime.DEFAULT_MAX_RATE
    return rate


def _announce_after_fork() -> None:
    """A forked worker (gunicorn) inherits the hooks: say so in its own records too (not a child
    of a process latprof injected into: it drops them, `injected._leave_child`)."""
    if runtime.active() and not runtime.injected:
        runtime.emit(
            QualityRecord(
                NOTE_HOOKS_LOADED,
                runtime.now_ns(),
                runtime.pid(),
                "inherited from the parent process",
                1,
                {
                    "collectors": list(_installed),
                    "executable": sys.executable,
                    "forked": True,
                    "max_rate": runtime.sampler.max_rate,
                    NOTES_ACTIVITY: True,
                },
            )
        )


_installed: list[str] = []
# Registered after the writer's own fork handler (imported above), which empties the buffer
# the child inherited: this record must come after that.
os.register_at_fork(after_in_child=_announce_after_fork)
