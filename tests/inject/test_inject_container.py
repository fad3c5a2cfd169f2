"""`latprof attach --inject` from the host into a service in a container's namespaces.

The container is what docker and podman make underneath, made with `unshare` as root: uvicorn
in new PID, mount and network namespaces, with a /tmp of its own (a tmpfs the host cannot see
at /tmp), PID 1 there; loaded by a client inside its network namespace (`nsenter --net`).
What must hold: latprof reads the service's libraries and creates its workspace through
/proc/PID/root (the workspace is in the container's /tmp, not the host's), the hooks record,
and detach works. Skipped without root, unshare, nsenter and ip (CI runs as root).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from attach.procs import NAMESPACE_LOAD, ROOT, free_port, needs_namespaces

from latprof.inject import target as targets

pytestmark = pytest.mark.slow

def test_a_uvicorn_in_its_own_namespaces_with_its_own_tmp_is_injected_by_its_host_pid(tmp_path):
    needs_namespaces()
    port = free_port()
    # A /tmp of its own; a repository that lives under /tmp (a CI clone) is bound back into it.
    keep = ""
    if ROOT.is_relative_to("/tmp"):
        keep = f"mkdir -p {ROOT} && mount --bind /mnt/{ROOT.relative_to('/tmp')} {ROOT} && "
    service = (f"mount --bind /tmp /mnt && mount -t tmpfs tmpfs /tmp && {keep}ip link set lo up && exec {sys.executable}"
               f" -m uvicorn tests.inject.apps.ids_app:app --port {port} --http h11 --loop asyncio --log-level warning")  # fmt: skip
    box = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "--mount", "--net", "--", "sh", "-c", service],
                           cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    load, pid = None, 0
    try:
        deadline = time.monotonic() + 10
        while not pid:
            children = psutil.Process(box.pid).children()
            pid = children[0].pid if children else 0
            assert box.poll() is None, f"the container did not start: {box.communicate()[1]}"
            assert time.monotonic() < deadline, "unshare made no child"
            time.sleep(0.05)
        load = subprocess.Popen(["nsenter", f"--target={pid}", "--net", sys.executable, "-c", NAMESPACE_LOAD, str(port), "/work", "4"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert load.stdout is not None and load.stdout.readline().startswith("LOADING"), "no load inside the namespace"
        done = subprocess.run([sys.executable, "-m", "latprof", "attach", "--pid", str(pid), "--inject", "--duration", "3",
                               "--format", "json", "--out", str(tmp_path / "c.jsonl")],
                              cwd=ROOT, capture_output=True, text=True, timeout=90)  # fmt: skip
        with open(f"/proc/{pid}/status") as f:
            inside = f.read()
        # Its files are reached through /proc/PID/root: the payload latprof wrote there was read by it,
        # from a /tmp the host does not see (had it been written to the host's /tmp, nothing would record).
        assert targets.inspect(pid).root == f"/proc/{pid}/root"
        assert load.stdin is not None
        load.stdin.close()
        failures = int(load.stdout.read().split()[-1])
    finally:
        if load is not None and load.poll() is None:
            load.kill()
        if load is not None:
            load.wait()
            for pipe in (load.stdin, load.stdout):
                if pipe is not None and not pipe.closed:
                    pipe.close()
        if pid:
            os.kill(pid, signal.SIGKILL)
        else:
            box.kill()
        box.communicate(timeout=20)
    assert "NSpid:\t%d\t1" % pid in inside, "the service is not PID 1 of a namespace of its own"
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["source"]["method"] == "inject" and report["window"]["requests"] > 20
    (process,) = report["collection"]["injected"]
    assert process["outcome"] == "recorded" and process["detach"]["restored"] == process["detach"]["patched"] > 0
    assert failures == 0
