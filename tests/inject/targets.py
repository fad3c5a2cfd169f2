"""Processes the --inject tests inject into (run as scripts: `python targets.py MODE ...`).

- `plain DIR`: prints READY, then every 10 ms answers a `DIR/ask` file with `DIR/answer`
  (JSON: latprof modules imported, threads, the import finders, the names in `__main__`,
  every signal's handler, and what a child it forks then has) until killed.
- `blocked DIR SECONDS`: prints READY, sleeps SECONDS in one C call (time.sleep) in its only
  thread, then writes `DIR/answer` the same way and exits.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time


def answer(folder: str) -> None:
    state = {
        "latprof_modules": sorted(m for m in sys.modules if m.startswith("latprof")),
        "threads": sorted(t.name for t in threading.enumerate()),
        "os_threads": len(os.listdir("/proc/self/task")),
        "meta_path": [type(f).__name__ for f in sys.meta_path],
        "main_names": sorted(n for n in vars(sys.modules["__main__"]) if not n.startswith("__")),
        "signals": {str(int(s)): repr(signal.getsignal(s)) for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)},
        "forked": forked(folder),
    }
    tmp = os.path.join(folder, "answer.tmp")
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, os.path.join(folder, "answer"))


def forked(folder: str) -> dict[str, object]:
    """What a child forked now has: its threads, and whether latprof records in it (its fork handlers ran)."""
    out = os.path.join(folder, "child")
    pid = os.fork()
    if pid == 0:
        runtime = sys.modules.get("latprof.collectors.hooks.runtime")
        state = {"threads": sorted(t.name for t in threading.enumerate()),
                 "recording": bool(runtime is not None and runtime.active())}
        with open(out, "w") as f:
            json.dump(state, f)
        os._exit(0)
    os.waitpid(pid, 0)
    with open(out) as f:
        return json.load(f)


def main() -> None:
    mode, folder = sys.argv[1], sys.argv[2]
    print("READY", flush=True)
    if mode == "blocked":
        time.sleep(float(sys.argv[3]))
        answer(folder)
        return
    ask = os.path.join(folder, "ask")
    while True:
        time.sleep(0.01)
        if os.path.exists(ask):
            os.remove(ask)
            answer(folder)


if __name__ == "__main__":
    main()
