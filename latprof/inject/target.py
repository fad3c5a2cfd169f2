"""What a process to inject into is: its CPython, its user, its workers, and where in its memory
the three functions the injection calls are.

Everything here is read from /proc without stopping the process. Files the target maps are
read through `/proc/PID/root` when it lives in another mount namespace (a container), so the
library read is the one it runs.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from latprof.errors import CollectorError
from latprof.inject.elf import ElfError, Symbols, read_symbols

#: The CPython lines the injection is tested on (`mechanism.injector_for` refuses the others).
SUPPORTED = ((3, 10), (3, 11), (3, 12), (3, 13))

#: The functions called in the target: libc's `mmap` (a page for the code, no allocator lock
#: involved), CPython's `Py_AddPendingCall` and `PyRun_SimpleString` (run at a safe point).
MMAP = "mmap"
ADD_PENDING_CALL = "Py_AddPendingCall"
RUN_SIMPLE_STRING = "PyRun_SimpleString"
_PYTHON_FUNCTIONS = frozenset({ADD_PENDING_CALL, RUN_SIMPLE_STRING})

_LIBPYTHON = re.compile(r"libpython(\d+)\.(\d+)(t?)\.so")
_EXECUTABLE = re.compile(r"python(\d+)\.(\d+)(t?)$")
_LIBC = re.compile(r"/libc(\.so\.6|-[0-9.]+\.so)$|/ld-musl-[^/]*\.so")


@dataclass
class Mapping:
    """A file mapped into the target: its path as the target sees it and where offset 0 is."""

    path: str
    start: int


@dataclass
class Target:
    """A Python process latprof may inject into."""

    pid: int
    uid: int
    gid: int
    #: (major, minor) of its CPython, and whether it is a free-threaded build.
    python: tuple[int, int]
    free_threaded: bool
    #: The file that holds CPython's functions (libpython, or the executable when static).
    python_file: str
    #: Address of each of `MMAP`, `ADD_PENDING_CALL`, `RUN_SIMPLE_STRING` in its memory.
    addresses: dict[str, int] = field(default_factory=dict)
    #: How files the target sees are reached from here: "" (the same mount namespace) or "/proc/PID/root".
    root: str = ""

    @property
    def version(self) -> str:
        return f"{self.python[0]}.{self.python[1]}" + ("t" if self.free_threaded else "")

    def here(self, path: str) -> str:
        """`path` as the target sees it, as latprof reaches it."""
        return self.root + path


def inspect(pid: int) -> Target:
    """The target `pid`, or a `CollectorError` that says in one line why it cannot be injected."""
    if pid <= 0 or not os.path.exists(f"/proc/{pid}"):
        raise CollectorError(f"no process with PID {pid}")
    uid, gid = owner(pid)
    root = "" if same_mount_namespace(pid) else f"/proc/{pid}/root"
    try:
        with open(f"/proc/{pid}/maps") as f:
            maps = f.read().splitlines()
        exe = os.readlink(f"/proc/{pid}/exe")
    except PermissionError:
        raise CollectorError(not_permitted(pid)) from None
    except OSError as exc:
        raise CollectorError(f"cannot read PID {pid}: {exc.strerror or exc}") from None
    mappings = _file_mappings(maps)
    libpython = next((m for m in mappings.values() if _LIBPYTHON.search(os.path.basename(m.path))), None)
    if libpython is not None:
        match = _LIBPYTHON.search(os.path.basename(libpython.path))
        python_map = libpython
    else:
        match = _EXECUTABLE.search(os.path.basename(exe))
        python_map = mappings.get(exe) or Mapping(exe, 0)
    if match is None:
        if "python" not in os.path.basename(exe).lower():
            raise CollectorError(f"PID {pid} ({os.path.basename(exe)}) is not a Python process")
        raise CollectorError(f"cannot tell which CPython PID {pid} runs: its executable {exe} names no version"
                             " and it maps no libpython")  # fmt: skip
    version = (int(match.group(1)), int(match.group(2)))
    target = Target(pid, uid, gid, version, bool(match.group(3)), python_map.path, root=root)
    if version not in SUPPORTED or target.free_threaded:
        return target  # the injector refuses it, with its own message; no symbols needed
    libc = next((m for m in mappings.values() if _LIBC.search(m.path)), None)
    if libc is None:
        raise CollectorError(f"PID {pid} maps no C library latprof knows (glibc or musl)")
    for mapping, wanted in ((python_map, _PYTHON_FUNCTIONS), (libc, frozenset({MMAP}))):
        try:
            symbols: Symbols = read_symbols(target.here(mapping.path), wanted)
        except ElfError as exc:
            raise CollectorError(f"cannot read the functions of PID {pid}'s {mapping.path}: {exc}") from None
        for name in wanted:
            address = symbols.address(name, mapping.start)
            if address is None:
                raise CollectorError(f"PID {pid}'s {mapping.path} does not export {name}")
            target.addresses[name] = address
    return target


def _file_mappings(maps: list[str]) -> dict[str, Mapping]:
    """Each file mapped from offset 0, by its path, at its lowest such address."""
    found: dict[str, Mapping] = {}
    for line in maps:
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or not parts[5].startswith("/") or int(parts[2], 16) != 0:
            continue
        path = parts[5]
        start = int(parts[0].split("-", 1)[0], 16)
        if path not in found or start < found[path].start:
            found[path] = Mapping(path, start)
    return found


def owner(pid: int) -> tuple[int, int]:
    """The effective user and group ids of `pid`."""
    uid = gid = -1
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    uid = int(line.split()[2])
                elif line.startswith("Gid:"):
                    gid = int(line.split()[2])
    except (OSError, ValueError, IndexError):
        raise CollectorError(f"no process with PID {pid}") from None
    return uid, gid


def same_mount_namespace(pid: int) -> bool:
    """Whether `pid` sees the same files at the same paths as latprof (no container, no PrivateTmp)."""
    try:
        theirs, ours = os.stat(f"/proc/{pid}/ns/mnt"), os.stat("/proc/self/ns/mnt")
    except OSError:
        return True  # not ours to read: then nothing else of it is either, and the error comes from there
    return (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)


def not_permitted(pid: int) -> str:
    return (f"not permitted to inject into PID {pid}: run latprof as the same user or root; check"
            " kernel.yama.ptrace_scope (0 or 1); in a container add --cap-add SYS_PTRACE")  # fmt: skip


def workers(pid: int) -> list[int]:
    """The Python worker processes of a server master: the Python descendants of `pid` that
    share one of its listening sockets (gunicorn workers, uvicorn `--workers` and `--reload`
    children). Empty when `pid` serves itself (it is a worker, or a single-process server)."""
    import psutil

    from latprof.collectors.attach.procfs import socket_inodes, tcp_rows
    from latprof.collectors.attach.pyspy import is_python

    mine = socket_inodes([pid])
    listening = {row.inode for row in tcp_rows(pid) if row.state == "0A" and row.inode in mine}
    if not listening:
        return []
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    return sorted(child.pid for child in children if is_python(child.pid) and socket_inodes([child.pid]) & listening)
