"""Processes the --inject tests inject into (run as scripts: `python targets.py MODE ...`).

- `plain DIR`: prints READY, then every 10 ms answers a `DIR/ask` file with `DIR/answer`
  (JSON: latprof modules imported, threads, main-thread ticks) until killed.
- `blocked DIR SECONDS`: prints READY, sleeps SECONDS in one C call (time.sleep) in its only
  thread, then writes `DIR/answer` the same way and exits.
"""

from __future__ import annotations

import json
import os
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
    }
    tmp = os.path.join(folder, "answer.tmp")
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, os.path.join(folder, "answer"))


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
