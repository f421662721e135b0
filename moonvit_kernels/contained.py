"""Run untrusted kernel code in a forked child: the caller survives a crash and an endless loop.

`run(fn, time_limit=...)` calls `fn()` in a child forked from this process (so it sees every object and
library loaded here) and returns what `fn` returned (pickled back through a pipe) or raises what it raised.
The child's stdout and stderr (C `printf` included) are forwarded to `sys.stdout` / `sys.stderr` as they
arrive, so a notebook shows them. A child killed by a signal (abort, segmentation fault, bus error) raises
`Crashed`; one still running after `time_limit` seconds is killed and raises `TimedOut`; Ctrl-C in the
parent kills the child and propagates. Writes the child makes to ordinary memory are lost with it: results
come back as the return value or through shared memory (`mmap` MAP_SHARED, as the emulated device's arrays).
POSIX only (fork).
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import functools
import io
import math
import os
import pickle
import select
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

_CHUNK = 65536


class ContainedFailure(RuntimeError):
    """The child did not return: it crashed or ran out of time. `output` is the tail of its stderr."""

    def __init__(self, message: str, output: str = ""):
        super().__init__(message)
        self.output = output


class Crashed(ContainedFailure):
    """The child was killed by a signal (`signal_name`: SIGSEGV, SIGABRT, SIGBUS, ...)."""

    def __init__(self, message: str, output: str, signal_name: str):
        super().__init__(message, output)
        self.signal_name = signal_name


class TimedOut(ContainedFailure):
    """The child was still running after the time limit and was killed."""


def available() -> bool:
    return hasattr(os, "fork")


def check_time_limit(seconds: float) -> float:
    """`seconds` as a float when it is a positive finite number, else ValueError."""
    value = float(seconds)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"a time limit must be a positive number of seconds, got {seconds!r}")
    return value


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def exit_text(returncode: int) -> str:
    """How a child process ended, from its return code: 'signal SIGABRT' (negative: killed by that signal),
    else 'exit status N'."""
    if returncode >= 0:
        return f"exit status {returncode}"
    name = signal_name(-returncode)
    return name if name.startswith("signal ") else f"signal {name}"


def run(fn: Callable[[], Any], *, time_limit: float, what: str = "the call") -> Any:
    """`fn()` in a forked child with `time_limit` seconds; its result, or its exception re-raised here."""
    limit = check_time_limit(time_limit)
    _flush_parent()
    pipes = [os.pipe() for _ in range(3)]  # result, stdout, stderr
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        _child(fn, pipes)
    for _, w in pipes:
        os.close(w)
    reads = [r for r, _ in pipes]
    try:
        status, result, err = _collect(pid, reads, limit)
    except BaseException:  # Ctrl-C or an error here: the child must not outlive the call
        _kill(pid)
        raise
    finally:
        for r in reads:
            with contextlib.suppress(OSError):
                os.close(r)
    if status is None:
        raise TimedOut(f"{what} did not finish in {limit:g} s and was stopped", _tail(err))
    if os.WIFSIGNALED(status):
        name = signal_name(os.WTERMSIG(status))
        raise Crashed(f"{what} was killed by {name}", _tail(err), name)
    if not result:
        raise Crashed(f"{what} exited with status {os.waitstatus_to_exitcode(status)} without a result", _tail(err), "")
    kind, value = pickle.loads(result)
    if kind == "raised":
        raise value
    return value


def _flush_parent() -> None:
    """Flush Python's and C's output buffers, so the child does not inherit (and print) them again."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(Exception):
        _libc().fflush(None)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None)


def _child(fn: Callable[[], Any], pipes: list[tuple[int, int]]) -> None:  # pragma: no cover - the child
    code = 0
    try:
        for r, _ in pipes:
            os.close(r)
        (_, result_w), (_, out_w), (_, err_w) = pipes
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C reaches the parent, which kills this child
        if faulthandler.is_enabled():
            faulthandler.disable()  # a crash is reported by the parent, not by a Python traceback dump here
        try:
            payload = pickle.dumps(("returned", fn()))
        except BaseException as e:  # noqa: BLE001 - every exception goes back to the parent
            payload = _pickled_exception(e)
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        _libc().fflush(None)
        with os.fdopen(result_w, "wb") as f:
            f.write(payload)
        for fd in (1, 2, out_w, err_w):  # the parent sees EOF now, before this process's memory is torn down
            os.close(fd)
    except BaseException:  # noqa: BLE001
        code = 3
    os._exit(code)


def _pickled_exception(e: BaseException) -> bytes:
    try:
        payload = pickle.dumps(("raised", e))
        pickle.loads(payload)
        return payload
    except Exception:  # an exception that does not survive pickling: its type name and text
        return pickle.dumps(("raised", RuntimeError(f"{type(e).__name__}: {e}")))


def _collect(pid: int, reads: list[int], limit: float) -> tuple[int | None, bytes, bytes]:
    """Read the child's result and forward its output until it closes them: (wait status, result, stderr);
    the status is 0 when a result came, None when the time limit ran out first (the child is then killed)."""
    result_r, out_r, err_r = reads
    result, err = bytearray(), bytearray()
    open_fds = set(reads)
    deadline = time.monotonic() + limit
    poller = select.poll()
    for fd in reads:
        poller.register(fd, select.POLLIN)
    _reap_finished()
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            _kill(pid)
            return None, bytes(result), bytes(err)
        for fd, _ in poller.poll(max(1, int(left * 1000))):
            chunk = os.read(fd, _CHUNK)
            if not chunk:
                poller.unregister(fd)
                open_fds.discard(fd)
            elif fd == result_r:
                result += chunk
            else:
                _forward(sys.stdout if fd == out_r else sys.stderr, chunk)
                if fd == err_r:
                    err += chunk
                    del err[: max(0, len(err) - 8 * _CHUNK)]
    if result:  # it returned: reaped later, so that its exit (tearing down a copy of this process) costs no wait
        _UNREAPED.append(pid)
        return 0, bytes(result), bytes(err)
    _, status = os.waitpid(pid, 0)
    return status, bytes(result), bytes(err)


_UNREAPED: list[int] = []  # children that returned their result, not yet waited for


def _reap_finished() -> None:
    for pid in list(_UNREAPED):
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == 0:
                continue
        _UNREAPED.remove(pid)


def _forward(stream: Any, chunk: bytes) -> None:
    with contextlib.suppress(Exception):
        stream.write(chunk.decode(errors="replace"))
        stream.flush()


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _tail(err: bytes, lines: int = 12) -> str:
    return "\n".join(err.decode(errors="replace").strip().splitlines()[-lines:])
