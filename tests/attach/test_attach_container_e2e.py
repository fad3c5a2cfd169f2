"""`latprof attach` from the host on a service in a container's namespaces (issue 18, point 5).

A container here is what docker and podman make underneath, made with `unshare` as root:
gunicorn in new PID, mount and network namespaces (its loopback brought up inside; it is PID 1
there), loaded by a client that runs in its network namespace (`nsenter --net`). The host
attaches by the host PID. What must hold: the stacks are sampled (py-spy reads the binary
through /proc/PID/root), the thread ids in the capture are the host's (so the wait channels
read are those threads'), and the accept queue and socket census are read in the service's
own network namespace (its port listens nowhere else). Skipped without root, unshare, nsenter
and ip (CI runs as root).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import psutil
import pytest

from attach.procs import NAMESPACE_LOAD, ROOT, free_port, gunicorn, needs_namespaces

pytestmark = pytest.mark.slow  # a real server in namespaces of its own, sampled from outside

def _only_child(pid: int, timeout_s: float = 10.0) -> int:
    """The PID of `pid`'s child once it has one (unshare --fork's child: PID 1 of the new namespace)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        children = psutil.Process(pid).children()
        if children:
            return int(children[0].pid)
        time.sleep(0.05)
    pytest.fail("unshare made no child")


def test_a_gunicorn_in_its_own_pid_mount_and_network_namespaces_is_attached_by_its_host_pid(tmp_path):
    needs_namespaces()
    port = free_port()  # free on the host too: were the host's sockets read, nothing would listen on it
    service = shlex.join(gunicorn(port, "-k", "gthread", "--threads", "6", "-w", "1"))
    box = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "--net", "--", "sh", "-c",
                            f"ip link set lo up && exec {service}"], cwd=ROOT, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)  # fmt: skip
    load, master = None, 0
    try:
        master = _only_child(box.pid)
        load = subprocess.Popen(["nsenter", f"--target={master}", "--net", sys.executable, "-c", NAMESPACE_LOAD, str(port),
                                 "/locked?ms=50", "6"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert load.stdout is not None and load.stdout.readline().startswith("LOADING"), "no load inside the namespace"
        time.sleep(1.0)
        capture = tmp_path / "attach.jsonl"
        done = subprocess.run([sys.executable, "-m", "latprof", "attach", "--pid", str(master), "--duration", "4",
                               "--format", "json", "--out", str(capture)],
                              cwd=ROOT, capture_output=True, text=True, timeout=90)  # fmt: skip
        processes = [psutil.Process(master), *psutil.Process(master).children(recursive=True)]
        host_tids = {t.id for p in processes for t in p.threads()}
        with open(f"/proc/{master}/status") as f:
            inside = f.read()
    finally:
        if load is not None:
            load.kill()
            load.communicate()
        if master:
            os.kill(master, signal.SIGKILL)  # PID 1 of the namespace: the kernel ends the rest of it, and unshare returns
        else:
            box.kill()
        box.communicate(timeout=20)
    assert "NSpid:\t%d\t1" % master in inside, "the service is not PID 1 of a namespace of its own"
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    print(report["verdict"], report["collection"])
    verdict = report["verdict"]
    # the same answer as for this service on the host (test_a_global_lock_in_a_threaded_server_gives_lock)
    assert (verdict["layer"], verdict["rule"]) == ("lock", "lock-contention"), verdict
    events = [json.loads(line) for line in capture.read_text().splitlines() if line.strip()]
    stack_tids = {e["tid"] for e in events if e.get("type") == "stack"}
    assert stack_tids and stack_tids <= host_tids, (stack_tids, host_tids)  # host TIDs: their wait channels are theirs
    assert any(e.get("wchan") for e in events if e.get("type") == "stack")  # and some were read
    queue = [e for e in events if e.get("type") == "gauge" and e.get("name") == "accept.queue_depth"]
    assert queue and {e["attrs"]["server.port"] for e in queue} == {port}  # the listening socket, found in its namespace
    in_flight = [e["value"] for e in events if e.get("type") == "gauge" and e.get("name") == "census.inbound.in_flight"]
    assert in_flight and max(in_flight) >= 3, in_flight  # six clients' requests, counted on its sockets
