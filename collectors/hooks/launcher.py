"""Run a command with latprof's hooks loaded in every Python process it starts; forward signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from latprof.collectors.hooks.bootstrap import HOOKS, hook_names
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
    capture: Path, hooks: str = "all", environ: dict[str, str] | None = None, max_rate: float | None = None
) -> dict[str, str]:
    """The command's environment: where to record, which hooks, how many requests a second at
    most (None: the hooks' default; 0: all), and latprof's sitecustomize first."""
    env = dict(os.environ if environ is None else environ)
    env[ENV_CAPTURE] = str(capture.resolve())
    env[ENV_HOOKS] = hooks
    if max_rate is not None:
        env[ENV_MAX_RATE] = f"{max_rate:g}"
    else:
        env.pop(ENV_MAX_RATE, None)
    env["PYTHONPATH"] = os.pathsep.join([str(SITE_DIR)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def run_with_hooks(cmd: Sequence[str], capture: Path, hooks: str = "all", max_rate: float | None = None) -> int:
    """Run `cmd` recording into `capture`; return its exit code (128 + N when killed by signal N).

    The command runs in its own process group, and the signals in `FORWARDED_SIGNALS` that
    reach latprof are passed on to it once: Ctrl-C in a terminal reaches latprof only, and
    the service sees one SIGINT, not two.
    """
    capture.parent.mkdir(parents=True, exist_ok=True)
    env = hooked_environment(capture, hooks, max_rate=max_rate)
    group: dict[str, object] = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
    try:
        proc = subprocess.Popen(list(cmd), env=env, **group)  # type: ignore[call-overload]
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


def processes_with_hooks(capture: Path) -> set[int]:
    """The pids that wrote a "hooks loaded" record into `capture` (none when it does not exist)."""
    import orjson

    pids: set[int] = set()
    try:
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
