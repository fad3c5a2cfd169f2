"""Appends capture events to a JSON Lines file from inside the observed service's process.

Hooks call `CaptureWriter.emit()` on the service's own threads, so emit only appends the
event to a bounded in-memory buffer: no encoding, no I/O, no lock on the fast path, never an
exception. A daemon thread flushes the buffer every `flush_interval_s`: it encodes the events
there and writes each batch of whole lines with one `write()` under an exclusive `flock`, so
several processes (forked workers, unrelated services) append to one file without tearing
lines; a batch whose write fails (disk full, file size limit) is cut off the file again, so it
never leaves a torn line before later batches. Each process writes its own header first
(promising a closing record: `closes`); dropped events and the writer's own errors go into the
capture as quality records, and a clean close ends the process's part with a `closed` record
holding its totals, so a reader can tell a process that was killed from one that finished.
With `status_dir`, close() also leaves those totals in a small file there, for `latprof run`
to read when the capture itself could not be written. After `fork()` the child starts afresh
(own file description, header, buffer, thread and counters); at exit the writer flushes and
closes, and `install_flush_on_signals` flushes on SIGTERM/SIGINT before the signal does what
it would have done anyway (closing first when the signal ends the process).
"""

from __future__ import annotations

import atexit
import collections
import fcntl
import os
import signal
import stat
import threading
import time
import weakref
from types import FrameType
from typing import Any, Callable, Iterable, Union

import orjson

from latprof.capture import format as wire
from latprof.events import Event, QualityRecord
from latprof.semconv import LAST_ERROR, NOTE_CLOSED, NOTE_DROPPED, NOTE_ERROR

#: Name of the background flush thread (what py-spy and `threading.enumerate()` show).
THREAD_NAME = "latprof-capture-writer"

#: Attribute of a NOTE_ERROR record: the text of the last error swallowed, for debugging.
LAST_ERROR_ATTR = LAST_ERROR

# How long close() waits for the flush thread to finish a batch it is writing.
_JOIN_TIMEOUT_S = 2.0
# How long a flush from outside the flush thread (close() at exit, a signal handler) waits for a
# flush that is stuck (a hung file system): it gives up rather than hang the service.
_LOCK_TIMEOUT_S = 2.0
_MAX_ERROR_TEXT = 300

_SignalHandler = Union[Callable[[int, Union[FrameType, None]], Any], int, signal.Handlers, None]


class CaptureWriter:
    """A bounded, thread-safe, fork-safe appender of events to one capture file.

    `emit()`, `flush()` and `close()` never raise: failures are counted in `errors`, events
    that do not fit in the buffer (or arrive after close) in `dropped`, and both are written
    to the capture as quality records. A writer lives until `close()` or interpreter exit
    (its flush thread holds a reference to it).

    Concurrency: `emit()` appends to a `deque` (atomic) and takes a lock only when it drops an
    event. Flushes are serialised by a re-entrant lock; a signal handler that interrupts a
    flush running on the main thread defers its own flush-and-chain until that flush ends
    (see `install_flush_on_signals`), so a batch is never abandoned half-written.

    After `fork()`, the child closes its inherited copy of the file descriptor and reopens
    the path on its first flush: `flock` locks belong to the open file description, so a
    parent and child sharing one would not exclude each other.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        source: str = "run",
        flush_interval_s: float = 1.0,
        max_buffered_events: int = 100_000,
        header_extra: dict[str, Any] | None = None,
        status_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if not flush_interval_s > 0:
            raise ValueError(f"flush_interval_s must be > 0, got {flush_interval_s!r}")
        if max_buffered_events < 1:
            raise ValueError(f"max_buffered_events must be >= 1, got {max_buffered_events!r}")
        self.path: str = os.fspath(path)
        self.source = source
        self.flush_interval_s = float(flush_interval_s)
        self.max_buffered_events = int(max_buffered_events)
        self._header_extra = dict(header_extra or {})
        #: Where close() leaves this process's totals as `<pid>.json` (None: nowhere).
        self.status_dir = None if status_dir is None else os.fspath(status_dir)
        self._closed = False  # no more events accepted
        self._fd = -1
        self._fd_done = False  # the file was closed for good: never reopen it
        self._reset_process_state()
        _WRITERS.add(self)

    def _reset_process_state(self) -> None:
        """Set up everything that belongs to one process (at creation, and in a forked child)."""
        self._buffer: collections.deque[Event] = collections.deque()
        # Guards the file, the header flag, `_io_errors`, `_lost_in_writes` and the `_reported`
        # counts. Re-entrant because a signal handler runs on the main thread, possibly while
        # that thread holds the lock.
        self._io_lock = threading.RLock()
        # Guards increments of `_dropped` and `_other_errors` only; never held while taking
        # another lock, and never taken while holding `_io_lock` (no lock-order cycle).
        self._count_lock = threading.RLock()
        self._start_lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._header_written = False
        self._flushing = False  # the `_io_lock` holder is inside a flush
        self._close_requested = False  # close() ran inside a flush, which must close the file
        self._deferred: list[Callable[[], None]] = []  # signal chains waiting for a flush to end
        self._dropped = 0
        self._lost_in_writes = 0  # events of batches whose write failed (guarded by `_io_lock`)
        self._written = 0  # events written (guarded by `_io_lock`)
        self._closed_written = False  # the `closed` record is in the file
        self._dropped_reported = 0
        self._io_errors = 0
        self._other_errors = 0
        self._errors_reported = 0
        self._last_error = ""

    # --- the service's side: cheap and silent -------------------------------------------

    def emit(self, event: Event) -> None:
        """Buffer one event for the next flush; drop and count it when the buffer is full."""
        try:
            buffer = self._buffer
            # Check-then-append is not atomic: concurrent emitters may overshoot the bound
            # by at most one event each, which keeps memory bounded all the same.
            if len(buffer) < self.max_buffered_events and not self._closed:
                buffer.append(event)
                if self._thread is None:
                    self._start_thread()
                return
            with self._count_lock:
                self._dropped += 1
        except Exception as exc:
            self._count_error(exc)

    @property
    def dropped(self) -> int:
        """Events lost since start (or fork): buffer full, emitted after close, or in a failed write."""
        return self._dropped + self._lost_in_writes

    @property
    def written(self) -> int:
        """Events written to the capture since start (or fork)."""
        return self._written

    @property
    def closed_cleanly(self) -> bool:
        """close() wrote this process's `closed` record (with its totals) to the capture."""
        return self._closed_written

    @property
    def errors(self) -> int:
        """The writer's own errors swallowed: events that could not be encoded, failed writes."""
        return self._io_errors + self._other_errors

    @property
    def flush_thread_ident(self) -> int | None:
        """The `ident` of the flush thread while it runs (None before it started and after it ended):
        its CPU clock (`time.pthread_getcpuclockid`) is what writing the capture costs the process."""
        thread = self._thread
        return thread.ident if thread is not None and thread.is_alive() else None

    def flush(self) -> None:
        """Write everything buffered now, as one batch; never raises."""
        try:
            self._flush()
        except Exception as exc:
            self._count_error(exc)

    def close(self) -> None:
        """Flush what is buffered, stop the flush thread and close the file; idempotent."""
        try:
            if self._closed:
                return
            self._closed = True
            self._wake.set()
            thread = self._thread
            if thread is not None and thread is not threading.current_thread() and thread.is_alive():
                thread.join(_JOIN_TIMEOUT_S)
            try:
                self._flush(final=True)
            finally:
                # Events appended by emitters that checked `_closed` just before it was set.
                stranded = 0
                while self._buffer:
                    try:
                        self._buffer.popleft()
                    except IndexError:
                        break
                    stranded += 1
                if stranded:
                    with self._count_lock:
                        self._dropped += stranded
                self._write_status()
        except Exception as exc:
            self._count_error(exc)

    # --- the writer's side ------------------------------------------------------------------

    def _start_thread(self) -> None:
        # Non-blocking: whoever holds the lock is starting the thread already, and an emit
        # from a signal handler must never wait on its own interrupted frame.
        if not self._start_lock.acquire(blocking=False):
            return
        try:
            if self._thread is not None or self._closed:
                return
            thread = threading.Thread(target=self._run, args=(self._wake,), name=THREAD_NAME, daemon=True)
            # Set before start: a failed start (e.g. at interpreter shutdown) is not retried on
            # every emit; close(), atexit and signals still flush.
            self._thread = thread
            thread.start()
        finally:
            self._start_lock.release()

    def _run(self, wake: threading.Event) -> None:
        # `wake` is set only by close(), which does the final flush itself.
        while not wake.wait(self.flush_interval_s):
            self.flush()

    def _flush(self, final: bool = False) -> None:
        """Write what is buffered; with `final`, then close the file for good."""
        lock = self._io_lock
        # The flush thread waits for the file as long as it takes (emit never waits for it);
        # close() at exit and signal handlers give up on a stuck flush rather than hang.
        if not lock.acquire(timeout=-1 if threading.current_thread() is self._thread else _LOCK_TIMEOUT_S):
            raise TimeoutError(f"a flush of {self.path} has been stuck for over {_LOCK_TIMEOUT_S:g} s")
        try:
            if self._flushing:
                # Re-entered from a signal handler on this thread: the flush it interrupted
                # writes everything (and closes, if asked) when it resumes.
                self._close_requested |= final
                return
            self._flushing = True
            try:
                self._write_pending()
                if final or self._close_requested:
                    # What arrived while a flush close() interrupted wrote, and the closing record.
                    self._write_pending(closing=True)
                    self._close_file()
            finally:
                self._flushing = False
        finally:
            lock.release()
        self._run_deferred()

    def _write_pending(self, closing: bool = False) -> None:
        """Encode what is buffered and write it as one batch (caller holds `_io_lock`); `closing`
        ends it with the `closed` record, when this process has written anything."""
        buffer = self._buffer
        if self._fd_done:
            return
        if not buffer and self.dropped == self._dropped_reported and self.errors == self._errors_reported:
            if not (closing and self._header_written):
                return
        # One growing buffer: much faster than joining a list of small lines (3.5x measured).
        out = bytearray() if self._header_written else bytearray(self._header_line())
        n_events = 0
        # Take only what is there now, so a flush ends even while emitters keep emitting.
        for _ in range(len(buffer)):
            try:
                event = buffer.popleft()
            except IndexError:
                break
            try:
                out += orjson.dumps(wire.encode(event), option=orjson.OPT_APPEND_NEWLINE)
                n_events += 1
            except Exception as exc:
                self._io_error(exc)
        dropped, errors = self.dropped, self.errors
        for line in self._quality_lines(dropped - self._dropped_reported, errors - self._errors_reported):
            out += line
        if closing:
            out += self._closed_line(self._written + n_events, dropped, errors)
        try:
            self._write(out)
        except Exception as exc:
            self._io_error(exc)
            self._lost_in_writes += n_events  # the quality lines are retried with the next batch
            return
        self._written += n_events
        self._header_written = True
        self._dropped_reported, self._errors_reported = dropped, errors
        self._closed_written |= closing

    def _header_line(self) -> bytes:
        closes = {wire.HEADER_CLOSES: True}
        try:
            header = wire.make_header(self.source, **{**closes, **self._header_extra})
            return orjson.dumps(header, option=orjson.OPT_APPEND_NEWLINE)
        except Exception as exc:  # header_extra that JSON cannot hold: keep the standard fields
            self._io_error(exc)
            return orjson.dumps(wire.make_header(self.source, **closes), option=orjson.OPT_APPEND_NEWLINE)

    def _closed_line(self, events: int, dropped: int, errors: int) -> bytes:
        message = f"capture writer closed: {events} events written, {dropped} lost, {errors} errors"
        note = QualityRecord(NOTE_CLOSED, time.time_ns(), os.getpid(), message, 1,
                             {"events": events, "dropped": dropped, "errors": errors})  # fmt: skip
        return orjson.dumps(wire.encode(note), option=orjson.OPT_APPEND_NEWLINE)

    def _quality_lines(self, dropped: int, errors: int) -> list[bytes]:
        now, pid = time.time_ns(), os.getpid()
        lines: list[bytes] = []
        if dropped > 0:
            message = (
                f"capture writer dropped {dropped} events: buffer full"
                f" ({self.max_buffered_events} events), writer closed or a write failed"
            )
            note = QualityRecord(NOTE_DROPPED, now, pid, message, dropped)
            lines.append(orjson.dumps(wire.encode(note), option=orjson.OPT_APPEND_NEWLINE))
        if errors > 0:
            message = f"capture writer swallowed {errors} errors (events it could not encode, failed writes)"
            note = QualityRecord(NOTE_ERROR, now, pid, message, errors, {LAST_ERROR_ATTR: self._last_error})
            lines.append(orjson.dumps(wire.encode(note), option=orjson.OPT_APPEND_NEWLINE))
        return lines

    def _write(self, data: bytes | bytearray) -> None:
        """Append `data` with one write() under an exclusive flock (caller holds `_io_lock`)."""
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                st = os.fstat(fd)
                start = st.st_size if stat.S_ISREG(st.st_mode) else -1
                try:
                    _write_all(fd, data)
                except OSError:
                    if start >= 0:  # cut off what part of the batch got in: no torn line before the next one
                        try:
                            os.ftruncate(fd, start)
                        except OSError:
                            pass
                    raise
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError:
            # Reopen on the next flush: the descriptor may be what broke.
            self._fd = -1
            try:
                os.close(fd)
            except OSError:
                pass
            raise

    def _open(self) -> int:
        if self._fd < 0:
            parent = os.path.dirname(self.path)
            if parent:
                os.makedirs(parent, exist_ok=True)
            # Python makes it close-on-exec: exec'd children do not inherit it. Non-blocking: a
            # FIFO nobody reads fails at once (ENXIO) instead of blocking the flush for ever.
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o644)
        return self._fd

    def _close_file(self) -> None:
        self._fd_done = True
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def _write_status(self) -> None:
        """Leave this process's totals in `status_dir/<pid>.json` (whole, or not at all)."""
        if not self.status_dir:
            return
        try:
            status = {
                "pid": os.getpid(),
                "capture": self.path,
                "events": self._written,
                "dropped": self.dropped,
                "errors": self.errors,
                "last_error": self._last_error,
                "closed": self._closed_written,
            }
            final = os.path.join(self.status_dir, f"{os.getpid()}.json")
            fd = os.open(final + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK, 0o644)
            try:
                _write_all(fd, orjson.dumps(status))
            finally:
                os.close(fd)
            os.replace(final + ".tmp", final)
        except Exception as exc:
            self._count_error(exc)

    # --- errors, signals, fork ----------------------------------------------------------------

    def _io_error(self, exc: BaseException) -> None:
        """Count an error while holding `_io_lock` (so without taking `_count_lock`)."""
        self._io_errors += 1
        self._last_error = _describe(exc)

    def _count_error(self, exc: BaseException) -> None:
        try:
            with self._count_lock:
                self._other_errors += 1
            self._last_error = _describe(exc)
        except Exception:
            pass

    def _flush_then(self, chain: Callable[[], None]) -> None:
        """From a signal handler: flush, then run `chain` (what the signal would have done).

        When the signal interrupted a flush on this very thread, that flush cannot be
        finished from here, so the chain waits until it has ended (see `_run_deferred`).
        """
        nested = stuck = False
        try:
            if self._io_lock.acquire(timeout=_LOCK_TIMEOUT_S):
                try:
                    nested = self._flushing
                    if nested:
                        self._deferred.append(chain)
                finally:
                    self._io_lock.release()
            else:  # another thread's flush is stuck: do what the signal does without flushing
                stuck = True
                self._count_error(TimeoutError(f"a flush of {self.path} has been stuck for over {_LOCK_TIMEOUT_S:g} s"))
        except Exception as exc:
            self._count_error(exc)
        if nested:
            return
        if not stuck:
            self.flush()
        chain()

    def _run_deferred(self) -> None:
        # Signal handlers run on the main thread, and so must what they deferred: the chain
        # may raise KeyboardInterrupt, which belongs to the main thread's code.
        if not self._deferred or threading.current_thread() is not threading.main_thread():
            return
        while self._deferred:
            chain = self._deferred.pop(0)
            self.flush()
            chain()

    def _after_fork_in_child(self) -> None:
        # The parent's buffered events are the parent's to write; its thread is gone here and
        # its locks may have been held by a thread that no longer exists.
        fd, self._fd = self._fd, -1
        self._reset_process_state()
        if fd >= 0:
            try:
                os.close(fd)  # our copy only: the parent's descriptor and its flock stay
            except OSError:
                pass


def install_flush_on_signals(writer: CaptureWriter, signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT)) -> None:
    """Flush `writer` when one of `signals` arrives, then do what the previous handler did.

    A previous Python handler is called; a default disposition is restored and the signal
    re-raised, so the process dies by the signal as it would have; an ignored signal stays
    ignored. A signal whose handler was installed outside Python is left alone (it cannot be
    chained). Only the main thread can install handlers: elsewhere this does nothing. A
    handler the service installs later replaces this one, which is why the writer also
    flushes on a timer.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in signals:
        try:
            previous = signal.getsignal(signum)
            if previous is None:
                continue
            signal.signal(signum, _chaining_handler(writer, previous))
        except Exception:  # not a catchable signal, or not the main interpreter
            continue


def _chaining_handler(writer: CaptureWriter, previous: _SignalHandler) -> Callable[[int, FrameType | None], None]:
    def chain(signum: int, frame: FrameType | None) -> None:
        if previous == signal.SIG_DFL:
            writer.close()  # the process ends here, without atexit: its part of the capture is done
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        elif callable(previous):
            previous(signum, frame)
        # SIG_IGN: the signal was ignored before us and still is.

    def handler(signum: int, frame: FrameType | None) -> None:
        writer._flush_then(lambda: chain(signum, frame))

    return handler


def _write_all(fd: int, data: bytes | bytearray) -> None:
    written = 0
    view = memoryview(data)
    try:
        while written < len(data):  # short writes only happen when the disk is full
            n = os.write(fd, view[written:])
            if n <= 0:
                raise OSError(f"write() to fd {fd} wrote nothing")
            written += n
    except BaseException:
        if written and data[written - 1 : written] != b"\n":
            # End the torn line, so it costs the reader one line, not the next batch's.
            try:
                os.write(fd, b"\n")
            except OSError:
                pass
        raise


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:_MAX_ERROR_TEXT]


# Module-level hooks see every live writer without keeping any alive.
_WRITERS: weakref.WeakSet[CaptureWriter] = weakref.WeakSet()


def _close_all_at_exit() -> None:
    for writer in list(_WRITERS):
        writer.close()


def _reset_all_after_fork() -> None:
    for writer in list(_WRITERS):
        try:
            writer._after_fork_in_child()
        except Exception:
            pass


atexit.register(_close_all_at_exit)
os.register_at_fork(after_in_child=_reset_all_after_fork)
