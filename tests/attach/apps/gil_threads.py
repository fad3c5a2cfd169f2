"""A plain Python process whose three threads run Python on the CPU: nothing but GIL contention.

`python tests/attach/apps/gil_threads.py [THREADS]`: starts THREADS (default 3) threads that
compute in pure Python, prints `READY` and runs until killed (it exits by itself after 120 s).
No lock of its own: a sampler that calls their waits lock contention is wrong.
"""

from __future__ import annotations

import sys
import threading
import time


def spin() -> None:
    total = 0
    while True:
        for i in range(10_000):
            total += i * i


def main() -> None:
    for n in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
        threading.Thread(target=spin, name=f"spin-{n}", daemon=True).start()
    print("READY", flush=True)
    time.sleep(120)


if __name__ == "__main__":
    main()
