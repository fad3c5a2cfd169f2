"""What runs in the target, where it finds its orders, and how it answers.

**The workspace** is a directory latprof creates in the target's /tmp (seen through
`/proc/PID/root` across mount namespaces) with `mkdir` mode 0700 - it fails if the name
exists - then opens with `O_NOFOLLOW` and checks it is a directory of latprof's own; every
file latprof puts in it is created with `O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0600. When
latprof runs as root for a process of another user, the directory and its files are handed
to that user (`fchown`), so the target can write its capture there and no third user can
replace what the target will run. The target writes, per injection `NAME`:
`status-NAME.json` (replaced atomically at each step) and `capture-NAME.jsonl`.

**The code** queued by the injector runs in the target's main thread at a safe point and does
as little as possible there: if the payload file still exists (latprof removes it when it
gives up), it starts a bare thread (`_thread.start_new_thread`: no lock of the `threading`
module, which the interrupted code might hold) and returns. That thread runs the payload
file, which uses only the standard library until it has checked that `latprof` imports in the
target's own environment (sys.path is not touched: another environment's packages are never
mixed into a live service) and is the same protocol version; then
`latprof.collectors.hooks.injected` takes over.

**The lease.** latprof touches `lease` every `LEASE_TOUCH_S`; the target removes its hooks
when the lease is older than `injected.LEASE_S` (latprof died), when `stop` appears, or at its own
deadline, whichever comes first.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from typing import Any

from latprof.collectors.hooks.injected import PROTOCOL
from latprof.errors import CollectorError

__all__ = ["LEASE_TOUCH_S", "PROTOCOL", "Workspace", "bootstrap", "payload"]

#: latprof touches the lease this often (the target detaches when it is `injected.LEASE_S` old).
LEASE_TOUCH_S = 1.0
_DIR_PREFIX = "latprof-inject-"


@dataclass
class Workspace:
    """The private directory of one `attach --inject` in one target's file system."""

    #: The path as the target sees it, and as latprof reaches it.
    inside: str
    here: str
    uid: int
    gid: int
    _fd: int

    @classmethod
    def create(cls, root: str, uid: int, gid: int) -> Workspace:
        """A new directory under the target's /tmp (`root` + /tmp), owned by `uid`:`gid`, mode 0700."""
        for _ in range(10):
            inside = f"/tmp/{_DIR_PREFIX}{secrets.token_hex(8)}"
            here = root + inside
            try:
                os.mkdir(here, 0o700)
            except FileExistsError:
                continue
            except OSError as exc:
                raise CollectorError(f"cannot create {inside} in the target's file system: {exc.strerror or exc}") from None
            break
        else:
            raise CollectorError("cannot create a private directory in the target's /tmp")
        fd = os.open(here, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            os.close(fd)
            raise CollectorError(f"{here} is not latprof's own private directory; refusing to use it")
        if (uid, gid) != (st.st_uid, st.st_gid):
            os.fchown(fd, uid, gid)
        return cls(inside, here, uid, gid, fd)

    def write(self, name: str, data: bytes) -> str:
        """Create the new file `name` (mode 0600, the target's) with `data`; its path as the target sees it."""
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=self._fd)
        try:
            os.write(fd, data)
            if (self.uid, self.gid) != (os.geteuid(), os.getegid()):
                os.fchown(fd, self.uid, self.gid)
        finally:
            os.close(fd)
        return f"{self.inside}/{name}"

    def remove(self, name: str) -> None:
        try:
            os.unlink(name, dir_fd=self._fd)
        except OSError:
            pass

    def touch(self, name: str) -> None:
        """Set `name`'s times to now (the lease), creating it if needed."""
        try:
            os.utime(name, dir_fd=self._fd, follow_symlinks=False)
        except FileNotFoundError:
            self.write(name, b"")
        except OSError:
            pass

    def read_json(self, name: str) -> dict[str, Any] | None:
        """The JSON object the target wrote to `name`, or None (not yet, or torn)."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=self._fd)
        except OSError:
            return None
        try:
            data = os.read(fd, 1 << 20)
        finally:
            os.close(fd)
        try:
            value = json.loads(data)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def path(self, name: str) -> str:
        """Where latprof reads `name`."""
        return f"{self.here}/{name}"

    def close(self, keep: bool = False) -> None:
        """Remove the directory and everything in it, unless `keep`."""
        try:
            os.close(self._fd)
        except OSError:
            pass
        if not keep:
            shutil.rmtree(self.here, ignore_errors=True)


def bootstrap(payload_path: str) -> str:
    """The code run in the target's main thread at the safe point: start a bare thread that runs
    `payload_path`, if it still exists. Defines no name in `__main__`; raises nothing."""
    thread_code = (
        "try:\n"
        f" exec(compile(open({payload_path!r},'rb').read(),{payload_path!r},'exec'),{{'__name__':'__latprof_inject__'}})\n"
        "except BaseException:\n"
        " pass\n"
    )
    return (
        "try:\n"
        f"    __import__('posix').stat({payload_path!r})\n"
        f"    __import__('_thread').start_new_thread(exec, ({thread_code!r}, {{}}))\n"
        "except BaseException:\n"
        "    pass\n"
    )


def payload(config: dict[str, Any]) -> str:
    """The payload file: standard library only until `latprof` is known to import in the target."""
    return _PAYLOAD.replace("CONFIG_JSON", repr(json.dumps(config)))


_PAYLOAD = '''\
"""latprof attach --inject: run by a thread latprof started in this process; removed after."""
def _latprof_inject():
    import json, os, sys, time
    config = json.loads(CONFIG_JSON)
    folder, name = config["dir"], config["name"]

    def status(state, **values):
        values.update(state=state, pid=os.getpid(), time=time.time())
        tmp = f"{folder}/status-{name}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, json.dumps(values).encode())
        finally:
            os.close(fd)
        os.replace(tmp, f"{folder}/status-{name}.json")

    if time.time() > config["start_by"]:
        return  # latprof gave up on this process before it got here
    where = {"executable": sys.executable, "prefix": sys.prefix, "python": sys.version.split()[0]}
    if "threading" not in sys.modules:
        status("refused", reason="the process has not imported threading; importing it from this thread would"
               " confuse its idea of the main thread", **where)
        return
    status("alive", **where)
    before = frozenset(sys.modules)
    try:
        from latprof.collectors.hooks import injected
    except BaseException as exc:
        status("not-importable", error=f"{type(exc).__name__}: {exc}"[:300], **where)
        return
    if getattr(injected, "PROTOCOL", None) != config["protocol"]:
        status("refused", reason=f"latprof in the service's environment speaks protocol {getattr(injected, 'PROTOCOL', None)},"
               f" this latprof {config['protocol']}: install the same latprof version there", **where)
        return
    try:
        injected.start(config, status, before)
    except BaseException as exc:
        status("failed", error=f"{type(exc).__name__}: {exc}"[:300], **where)


try:
    _latprof_inject()
finally:
    del _latprof_inject
'''
