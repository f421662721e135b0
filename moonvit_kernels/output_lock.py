"""One run at a time per output place: `with output_lock(out, "fetch"): ...`.

The lock is a hidden file beside the output (`.NAME.moonvit_kernels.lock` in the folder holding `out`,
whether `out` is a file or a folder) that records who holds it (pid, command, start time), locked with
`fcntl.flock`: the kernel releases it when the holder exits, however it exits, so a crashed run leaves
no stale lock. A second run for the same `out` is refused (`OutputBusy`, naming the holder), or waits
when asked to (`wait=True`: a cache folder that several workers fill). The file is removed on release.
Where `fcntl` is missing (Windows) no lock is taken.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

SUFFIX = ".moonvit_kernels.lock"


class OutputBusy(ValueError):
    """Another run holds the lock of this output place."""


def lock_path(out: str | os.PathLike) -> Path:
    """The lock file of the output place `out` (beside it, so that `out` itself gains no file)."""
    out = Path(os.path.abspath(out))
    return out.parent / f".{out.name or 'root'}{SUFFIX}"


def holder(path: Path) -> str:
    """Who holds the lock file `path`, in words ("pid 41, `fetch`, started 2026-...")."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        return f"pid {record['pid']}, `{record['command']}`, started {record['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that is starting"


@contextlib.contextmanager
def output_lock(out: str | os.PathLike, command: str, wait: bool = False) -> Iterator[None]:
    """Hold the lock of output place `out` for the block; OutputBusy naming the holder when another run
    holds it (unless `wait`). Creates the folder that holds `out` if it is missing."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    path = lock_path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = _locked(path, fcntl, wait, out)
    try:
        started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        argv = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv and sys.argv[0] else ""
        record = {"pid": os.getpid(), "command": command, "argv": argv, "started": started}
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(record).encode())
        yield
    finally:
        path.unlink(missing_ok=True)  # before unlocking: a waiter then finds the file gone and opens a new one
        os.close(fd)


def _locked(path: Path, fcntl: object, wait: bool, out: str | os.PathLike) -> int:
    """An open descriptor of `path` holding its flock (the file still at `path` once locked)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))  # type: ignore[attr-defined]
        except BlockingIOError:
            os.close(fd)
            raise OutputBusy(
                f"{out}: in use by another run ({holder(path)}; lock {path}): wait for it to finish, "
                "or choose another output"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # the holder removed the file between our open and our lock: take the new one
