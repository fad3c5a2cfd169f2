"""Run a command with latprof's hooks in every Python process it starts; forward signals; learn what was lost."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from latprof.collectors.hooks.bootstrap import ENV_STATUS_DIR, HOOKS, hook_names
from latprof.digests import ENV_DIGEST_KEY, new_key
from latprof.errors import InputError

#: The folder whose `sitecustomize.py` loads the hooks; put first on the command's PYTHONPATH.
SITE_DIR = Path(__file__).resolve().parent / "_site"
ENV_CAPTURE = "LATPROF_CAPTURE"
ENV_HOOKS = "LATPROF_HOOKS"
ENV_MAX_RATE = "LATPROF_MAX_RATE"

#: Signals sent to `latprof run` that go on to the command.
FORWARDED_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2") if hasattr(signal, name)
)


def available_hooks() -> list[str]:
    """Names of the hooks `--hooks` may choose from, in name order."""
    return hook_names()


def select_hooks(hooks: str, disable: Sequence[str] = ()) -> list[str]:
    """The hooks `--hooks NAMES` and `--disable NAMES` (each comma-separated) leave; ["all"] for all.

    Raises `ConfigError` for an unknown name, or when every hook is disabled."""
    from latprof.errors import ConfigError

    known = available_hooks()
    wanted = [name.strip() for name in hooks.split(",") if name.strip()]
    if wanted != ["all"]:
        unknown = sorted(set(wanted) - set(known))
        if unknown:
            raise ConfigError(f"--hooks: no hook {', '.join(unknown)} (known: {', '.join(known)})")
    disabled = {name.strip() for item in disable for name in item.split(",") if name.strip()}
    if disabled:
        unknown = sorted(disabled - set(known))
        if unknown:
            raise ConfigError(f"--disable: no hook {', '.join(unknown)} (known: {', '.join(known)})")
        wanted = [name for name in (known if wanted == ["all"] else wanted) if name not in disabled]
        if not wanted:
            raise ConfigError("--disable: every hook is disabled; nothing would be recorded")
    return wanted


def describe_hooks() -> list[tuple[str, str]]:
    """(name, the first line of its module's documentation) of every hook, in name order."""
    return [(name, (HOOKS[name].__doc__ or "").strip().partition("\n")[0]) for name in hook_names()]


def hooked_environment(
    capture: Path, hooks: str = "all", environ: dict[str, str] | None = None, max_rate: float | None = None,
    status_dir: Path | None = None,
) -> dict[str, str]:
    """The command's environment: where to record, which hooks, how many requests a second at
    most (None: the hooks' default; 0: all), where each process leaves its writer's totals, the
    session's conversation-digest key (`latprof.digests`), and latprof's sitecustomize first."""
    env = dict(os.environ if environ is None else environ)
    env[ENV_CAPTURE] = str(capture.resolve())
    env[ENV_HOOKS] = hooks
    # One key per session: a conversation's digest is the same in every process of the service.
    env[ENV_DIGEST_KEY] = env.get(ENV_DIGEST_KEY) or new_key()
    if status_dir is not None:
        env[ENV_STATUS_DIR] = str(status_dir.resolve())
    else:
        env.pop(ENV_STATUS_DIR, None)
    if max_rate is not None:
        env[ENV_MAX_RATE] = f"{max_rate:g}"
    else:
        env.pop(ENV_MAX_RATE, None)
    env["PYTHONPATH"] = os.pathsep.join([str(SITE_DIR)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def check_capture_path(capture: Path) -> None:
    """Refuse, before the command starts, a capture path latprof could not append to and read
    back (`InputError`): a directory, a device or FIFO (`/dev/full`, a pipe), an unwritable place."""
    try:
        capture.parent.mkdir(parents=True, exist_ok=True)
        mode = capture.stat().st_mode if capture.exists() else None
        if mode is not None and not stat.S_ISREG(mode):
            what = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise InputError(f"--out {capture}: {what}; a capture is a file latprof appends to and reads back")
        fd = os.open(capture, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o644)
        os.close(fd)
    except OSError as exc:
        raise InputError(f"--out {capture}: cannot write: {exc.strerror or exc}") from None


def _start_in_own_group_dying_with_latprof() -> Callable[[], None]:
    """The command's `preexec_fn`: its own process group (Ctrl-C reaches latprof only), and SIGTERM
    when latprof dies, even by SIGKILL (Linux `PR_SET_PDEATHSIG`): the service stops as it does on
    SIGTERM, closing its capture, instead of running on unwatched, holding its port. Elsewhere
    only the process group."""
    prctl: Any = None
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before fork: the child only calls it
        except (OSError, AttributeError):
            prctl = None
    latprof_pid = os.getpid()

    def preexec() -> None:
        os.setpgrp()
        if prctl is not None:
            prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
            if os.getppid() != latprof_pid:  # latprof died before that: there is no one to wait for
                os._exit(128 + int(signal.SIGTERM))

    return preexec


def run_with_hooks(
    cmd: Sequence[str], capture: Path, hooks: str = "all", max_rate: float | None = None, status_dir: Path | None = None
) -> int:
    """Run `cmd` recording into `capture`; return its exit code (128 + N when killed by signal N).

    The command runs in its own process group, and the signals in `FORWARDED_SIGNALS` that
    reach latprof are passed on to it once: Ctrl-C in a terminal reaches latprof only, and
    the service sees one SIGINT, not two. When latprof dies without forwarding (SIGKILL), the
    command gets SIGTERM (Linux). Each process's writer leaves its totals in `status_dir`
    (`writer_statuses`).
    """
    capture.parent.mkdir(parents=True, exist_ok=True)
    env = hooked_environment(capture, hooks, max_rate=max_rate, status_dir=status_dir)
    try:
        proc = subprocess.Popen(list(cmd), env=env, preexec_fn=_start_in_own_group_dying_with_latprof())
    except FileNotFoundError:
        raise InputError(f"{cmd[0]}: command not found") from None
    except PermissionError:
        raise InputError(f"{cmd[0]}: permission denied") from None

    def forward(signum: int, frame: object) -> None:
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    previous = {}
    for signum in FORWARDED_SIGNALS:
        try:
            previous[signum] = signal.signal(signum, forward)
        except (OSError, ValueError):
            continue
    try:
        code: int = proc.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 128 - code if code < 0 else code


def writer_statuses(status_dir: Path) -> list[dict[str, Any]]:
    """The totals each process's writer left in `status_dir` when it closed, by pid: `events`
    written, `dropped` (lost), `errors`, `last_error`, `closed` (its closing record reached the
    capture). A process that was killed left none."""
    import orjson

    statuses = []
    try:
        names = sorted(os.listdir(status_dir))
    except OSError:
        return []
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            status = orjson.loads((status_dir / name).read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue
        if isinstance(status, dict) and isinstance(status.get("pid"), int):
            statuses.append(status)
    return sorted(statuses, key=lambda s: int(s["pid"]))


def losses(statuses: list[dict[str, Any]], capture: Path) -> list[str]:
    """One line per process whose losses the capture cannot tell: its closing record (with its
    totals) did not reach the capture, because writing there failed."""
    lines = []
    for status in statuses:
        if status.get("closed") or not any(status.get(k) for k in ("events", "dropped", "errors")):
            continue  # the capture holds its totals and drop records (the report says them), or it had nothing
        dropped, written = int(status.get("dropped", 0)), int(status.get("events", 0))
        why = f" (last error: {status['last_error']})" if status.get("last_error") else ""
        lines.append(
            f"pid {status['pid']}: could not write to {capture}{why}: {dropped} events lost,"
            f" {written} written; the capture does not hold this process's totals nor its end"
        )
    return lines


def processes_with_hooks(capture: Path) -> set[int]:
    """The pids that wrote a "hooks loaded" record into `capture` (none when it does not exist or
    is not a regular file)."""
    import orjson

    pids: set[int] = set()
    try:
        if not capture.is_file():
            return pids
        with open(capture, "rb") as stream:
            for line in stream:
                if b'"hooks_loaded"' in line:
                    try:
                        record = orjson.loads(line)
                    except orjson.JSONDecodeError:
                        continue
                    if isinstance(record, dict) and record.get("kind") == "hooks_loaded":
                        pids.add(int(record.get("pid", 0)))
    except OSError:
        return set()
    return pids
