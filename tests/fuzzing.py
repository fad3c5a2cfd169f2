"""Junk for the input readers' fuzz tests (documents with values replaced or keys deleted, damaged
bytes), and the child process that reads it under a memory and a time limit."""

from __future__ import annotations

import importlib
import os
import random
import resource
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

import orjson


def mutations(doc: Any, rng: random.Random, count: int, junk: Sequence[Any]) -> list[Any]:
    """`count` copies of `doc`, each with one value somewhere replaced by one of `junk`, or one key deleted."""
    paths: list[list[Any]] = []

    def walk(node: Any, where: list[Any]) -> None:
        if where:
            paths.append(where)
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, [*where, key])
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, [*where, index])

    walk(doc, [])
    out = []
    for _ in range(count):
        copy = orjson.loads(orjson.dumps(doc))
        *parents, last = rng.choice(paths)
        node = copy
        for step in parents:
            node = node[step]
        if isinstance(node, dict) and rng.random() < 0.2:
            del node[last]
        else:
            node[last] = rng.choice(junk)
        out.append(copy)
    return out


def damaged(data: bytes, rng: random.Random) -> bytes:
    """`data` with 1 to 4 byte-level injuries: a byte changed, a run cut out, junk inserted, or the rest torn off."""
    raw = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if not raw:
            break  # cut to nothing by an earlier injury
        choice, at = rng.random(), rng.randrange(len(raw))
        if choice < 0.4:
            raw[at] = rng.randrange(256)
        elif choice < 0.7:
            del raw[at:at + rng.randint(1, 40)]
        elif choice < 0.85:
            raw[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        else:
            del raw[at:]
            break
    return bytes(raw)


# --- reading junk in a child process: no traceback, no hang, bounded memory ------------------------

#: Seconds one case may take; more is a hang (the child's alarm, then the parent kills it).
CASE_SECONDS = float(os.environ.get("LATPROF_FUZZ_CASE_SECONDS", "2"))
#: The child's address-space limit: a reader that blows up on a small file fails the test, not the machine.
MEMORY_BYTES = int(os.environ.get("LATPROF_FUZZ_MEMORY_MB", "1536")) << 20
#: The readers a child runs, by name (`capture_two_pass`: the cohort-first read checked against the full one).
TARGETS = ("capture", "otlp_json", "otlp_proto", "jaeger_json", "zipkin_json", "config", "capture_two_pass")


def long_marks() -> list[Any]:
    """The marks of the many-case fuzz tests: slow and long (CI runs them with `-m long`), none
    when `LATPROF_FUZZ_CASES` asks for a run of its own, which the default `-m 'not long'` would
    otherwise leave out (`LATPROF_FUZZ_CASES=10000 python -m pytest tests/fuzz`)."""
    import pytest

    return [] if os.environ.get("LATPROF_FUZZ_CASES") else [pytest.mark.slow, pytest.mark.long]


def fuzz_cases(default: int) -> int:
    """Cases per target: `LATPROF_FUZZ_CASES` when set (the long run sets 10000), else `default` (sized for CI)."""
    return int(os.environ.get("LATPROF_FUZZ_CASES", default))


class Outcome(NamedTuple):
    """What reading one case did: "read", "error" (latprof's input or config error), or a failure
    ("crash", "hang", "memory", "bad"), with the message or traceback and the seconds it took."""

    kind: str
    detail: str
    seconds: float

    @property
    def failed(self) -> bool:
        return self.kind not in ("read", "error")


def limit_memory(limit: int) -> Callable[[], None]:
    """A `preexec_fn` that caps the child's address space at `limit` bytes."""

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply


class Sandbox:
    """A child process that reads case files with latprof's readers, under an address-space limit
    and a time limit per case; one per test, restarted after a case kills it.

    The parent owns the clock too: a reader stuck in C code (where the child's alarm cannot
    interrupt it) is killed after `CASE_SECONDS` and a second, and reported as a hang.
    """

    def __init__(self, workdir: Path, *, memory_bytes: int = MEMORY_BYTES, case_seconds: float = CASE_SECONDS) -> None:
        self.workdir = workdir
        self.memory_bytes = memory_bytes
        self.case_seconds = case_seconds
        self.cases = 0
        self.outcomes: dict[str, int] = {}
        self._child: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            child.kill()
            child.wait()
            for pipe in (child.stdin, child.stdout):
                if pipe is not None:
                    pipe.close()

    def _start(self) -> subprocess.Popen[bytes]:
        if self._child is None or self._child.poll() is not None:
            self.close()
            self._child = subprocess.Popen(
                [sys.executable, __file__, str(self.case_seconds)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                preexec_fn=limit_memory(self.memory_bytes), cwd=self.workdir,
            )  # fmt: skip
            self._ask(self._child, {"target": "warm"}, 60.0)
        return self._child

    def _ask(self, child: subprocess.Popen[bytes], request: dict[str, Any], seconds: float) -> dict[str, Any] | None:
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(orjson.dumps(request) + b"\n")
        child.stdin.flush()
        ready, _, _ = select.select([child.stdout], [], [], seconds)
        line = child.stdout.readline() if ready else b""
        return orjson.loads(line) if line else None

    def read(self, target: str, data: bytes, name: str = "case") -> Outcome:
        """Write `data` to a file called `name` and read it as `target`; the child's verdict."""
        assert target in (*TARGETS, "selftest"), target
        path = self.workdir / name
        path.write_bytes(data)
        return self.read_path(target, path)

    def read_path(self, target: str, path: Path) -> Outcome:
        """Read the file at `path` as `target` in the child."""
        child = self._start()
        began = time.monotonic()
        try:
            answer = self._ask(child, {"target": target, "path": str(path)}, self.case_seconds + 1.0)
        except BrokenPipeError:
            answer = None
        seconds = time.monotonic() - began
        if answer is None:
            returncode = child.poll()
            self.close()
            if returncode is None:
                outcome = Outcome("hang", f"no answer in {seconds:.1f} s (killed)", seconds)
            elif returncode < 0:
                outcome = Outcome("crash", f"the child died of signal {-returncode}", seconds)
            else:
                outcome = Outcome("crash", f"the child exited with {returncode}", seconds)
        else:
            outcome = Outcome(answer["kind"], answer["detail"], answer["seconds"])
        self.cases += 1
        self.outcomes[outcome.kind] = self.outcomes.get(outcome.kind, 0) + 1
        return outcome


def check_one_line(message: str, path: str) -> str | None:
    """What is wrong with a message latprof shows the user about `path`, or None: one line, naming the file."""
    if any(breaks in message for breaks in "\n\r\v\f\x85\u2028\u2029"):  # what terminals and editors break lines at
        return f"a message of more than one line: {message!r}"
    if not message.startswith(f"{path}"):
        return f"a message that does not start with the file's name: {message!r}"
    return None


def _read_in_child(target: str, path: str) -> tuple[str, str]:
    """Read `path` as `target` and check what came back: (outcome kind, detail)."""
    from latprof.errors import ConfigError, InputError

    try:
        if target == "selftest":  # the harness's own test: what a broken reader would do
            what = Path(path).read_bytes()
            if what == b"hang":
                while True:
                    pass
            if what == b"memory":
                return "read", str(len(bytearray(8 << 30)))
            raise RuntimeError("a reader's bug")
        if target == "config":
            from latprof.ci.config import load_config

            load_config(path, search=False)
            return "read", ""
        if target == "capture_two_pass":
            return _two_pass_in_child(path)
        if target == "capture":
            from latprof.capture.reader import read_captures

            data = read_captures([path])
            problem = None if data.event_count else "read no events without an error"
            warnings = data.warnings
            spans: list[Any] = []
        else:
            module = importlib.import_module(f"latprof.collectors.traces.{target}")
            read = getattr(module, f"read_{target}")(path)
            warnings, spans = read.warnings, read.spans
            problem = None if spans else "read no spans without an error"
        for warning in warnings:
            problem = problem or check_one_line(warning, path)
        for span in spans:
            if not (len(span.trace_id) == 32 and len(span.span_id) == 16 and 0 < span.start_ns <= span.end_ns
                    and 0 <= span.kind <= 5 and 0 <= span.status_code <= 2 and type(span.name) is str):  # fmt: skip
                problem = problem or f"a span out of range: {span!r}"[:2000]
        return ("bad", problem) if problem else ("read", f"{len(spans)} spans, {len(warnings)} warnings")
    except (InputError, ConfigError) as exc:
        problem = check_one_line(str(exc), path)
        return ("bad", problem) if problem else ("error", str(exc))


def _wanted(request_ids: Any) -> set[str]:
    """Half of `request_ids`, the same half on every run: those whose CRC-32 is even."""
    import zlib

    return {rid for rid in request_ids if zlib.crc32(rid.encode("utf-8", "surrogatepass")) % 2 == 0}


def _deferred_lines(path: str) -> list[bytes]:
    """The lines of the capture at `path` a first pass (`read_captures(..., defer_segments=True)`)
    leaves unread, found independently of it: those starting with the writer's segment prefix,
    but the file's last line (which may be torn after a `}` of
    its attributes; a stream cut short has none). Meant for a file the full read accepted."""
    import gzip
    import zlib

    from latprof.capture.files import open_input
    from latprof.capture.reader import SEGMENT_LINE_PREFIX

    lines: list[bytes] = []
    stream = open_input(path)
    broken = False
    try:
        lines.extend(stream)
    except (EOFError, gzip.BadGzipFile, zlib.error):
        broken = True  # the full read stops there too; the last whole line before the cut is not the file's last
    finally:
        stream.close()
    candidates = lines if broken else lines[:-1]
    return [line for line in candidates if line.startswith(SEGMENT_LINE_PREFIX)]


def _two_pass_in_child(path: str) -> tuple[str, str]:
    """Read `path` with the cohort-first read (a first pass deferring the writer's segment lines,
    then `read_deferred_segments` for half the requests) and fully, and compare (outcome kind, detail).

    When the full read succeeds, the two passes must too, with the same requests, gauges, quality
    records, stack samples and headers; for each wanted request exactly the full read's segments
    (same order), for any other only those the first pass read (lines not in the writer's form);
    the counts (`deferred_segments`, `segment_count`, `orphan_deferred`) must add up. When the full
    read refuses the file, the two passes may refuse it too (one line naming the file) or read
    it (they do not parse the deferred lines of unwanted requests, so they can miss damage there).
    """
    from latprof.capture.format import decode
    from latprof.capture.reader import read_captures, read_deferred_segments
    from latprof.errors import InputError

    full_error = None
    try:
        full = read_captures([path])
    except InputError as exc:
        full, full_error = None, str(exc)
        problem = check_one_line(full_error, path)
        if problem:
            return "bad", f"full read: {problem}"
    try:
        two = read_captures([path], defer_segments=True)
        wanted = _wanted(r.request_id for r in two.requests)
        deferred_before = two.deferred_segments
        read_deferred_segments(two, wanted)
    except InputError as exc:
        problem = check_one_line(str(exc), path)
        if problem:
            return "bad", f"two-pass read: {problem}"
        if full is None:
            return "error", str(exc)
        return "bad", f"the full read succeeded, the two-pass read raised: {exc}"[:2000]
    for warning in two.warnings:
        problem = check_one_line(warning, path)
        if problem:
            return "bad", f"two-pass read: {problem}"
    if full is None:
        return "error", f"{full_error} (the two-pass read returned data)"

    def differ(what: str, a: Any, b: Any) -> tuple[str, str]:
        return "bad", f"{what} differ: full read {a!r}, two-pass read {b!r}"[:2000]

    for what in ("requests", "gauges", "quality", "samples", "headers"):
        if getattr(full, what) != getattr(two, what):
            return differ(what, getattr(full, what), getattr(two, what))
    deferred = _deferred_lines(path)
    if deferred_before != len(deferred) or two.deferred_segments != len(deferred):
        return "bad", f"deferred_segments is {two.deferred_segments}, {len(deferred)} lines are in the writer's form"
    # the segments of the deferred lines, by request (what the first pass left unread)
    from_deferred: dict[str, list[Any]] = {}
    unparsed = 0
    for line in deferred:
        try:
            d = orjson.loads(line)
            if d["type"] != "segment":  # a repeated "type" key: the full read took it for another event
                unparsed += 1
                continue
            segment = decode(d)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, IndexError):
            unparsed += 1  # none when the full read accepted the file (only its last line may be bad, and that one is not deferred)
            continue
        from_deferred.setdefault(segment.request_id, []).append(segment)
    for rid in {*full.segments_by_request, *two.segments_by_request}:
        expected = list(full.segments_by_request.get(rid, ()))
        if rid not in wanted:  # only the lines read in the first pass
            for segment in from_deferred.get(rid, ()):
                if segment in expected:
                    expected.remove(segment)
        got = two.segments_by_request.get(rid, [])
        if got != expected:
            whose = "wanted" if rid in wanted else "unwanted"
            return "bad", (f"segments of {whose} request {rid!r} differ: expected {[s.segment_id for s in expected]!r},"
                           f" two-pass read {[s.segment_id for s in got]!r}")[:2000]  # fmt: skip
    if two.segment_count != sum(map(len, two.segments_by_request.values())):
        return "bad", f"segment_count is {two.segment_count}, segments_by_request holds {sum(map(len, two.segments_by_request.values()))}"
    known = {r.request_id for r in two.requests}
    orphans = sum(len(v) for rid, v in from_deferred.items() if rid not in known)
    if not orphans <= two.orphan_deferred <= orphans + unparsed:
        return "bad", f"orphan_deferred is {two.orphan_deferred}, {orphans} deferred lines (and {unparsed} unparsed) are of unknown requests"
    return "read", f"{len(deferred)} deferred lines, {len(wanted)} of {len(known)} requests wanted"


class _Hang(BaseException):
    """The child's own alarm: a case took longer than its time."""


def _child_main(case_seconds: float) -> None:
    """The child's loop: one JSON request a line on stdin, one verdict a line on stdout."""
    import traceback

    reading = [False]

    def alarm(signum: int, frame: Any) -> None:
        if reading[0]:  # not once the case is over and the timer is being stopped
            raise _Hang

    signal.signal(signal.SIGALRM, alarm)
    for line in sys.stdin.buffer:
        request = orjson.loads(line)
        if request["target"] == "warm":
            for target in TARGETS[1:5]:
                importlib.import_module(f"latprof.collectors.traces.{target}")
            importlib.import_module("latprof.capture.reader")
            importlib.import_module("latprof.ci.config")
            importlib.import_module("latprof.engine").all_rules()
            importlib.import_module("opentelemetry.proto.trace.v1.trace_pb2")  # the protobuf reader imports it on first use

            kind, detail = "read", ""
            began = time.monotonic()
        else:
            began = time.monotonic()
            reading[0] = True
            signal.setitimer(signal.ITIMER_REAL, case_seconds)
            try:
                kind, detail = _read_in_child(request["target"], request["path"])
            except _Hang:
                kind, detail = "hang", "".join(traceback.format_exc(limit=-8))
            except MemoryError:
                kind, detail = "memory", "".join(traceback.format_exc(limit=-8))
            except BaseException:  # noqa: BLE001  (any other exception is the failure being looked for)
                kind, detail = "crash", traceback.format_exc()
            finally:
                reading[0] = False
                signal.setitimer(signal.ITIMER_REAL, 0)
        seconds = time.monotonic() - began
        sys.stdout.buffer.write(orjson.dumps({"kind": kind, "detail": detail, "seconds": seconds}) + b"\n")
        sys.stdout.buffer.flush()


if __name__ == "__main__":
    _child_main(float(sys.argv[1]))
