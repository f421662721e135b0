"""Files written whole or not at all, and output places checked before the work that fills them.

    with atomic_file(path) as f: f.write(data)        # a binary file object
    with atomic_path(path) as tmp: library.save(tmp)  # for writers that want a file name
    check_writable(path) / check_writable(folder, folder=True)   # before the compute

A file is written under a temporary name in the same folder (`.NAME.RANDOM.tmp.SUFFIX`: hidden, and
keeping the suffix that numpy and matplotlib look at), flushed to disk (fsync) and renamed over
`path` only when complete — a rename within one file system is atomic. A failure (a full disk, an
exception in the block) removes the temporary file and leaves an earlier file at `path` as it was.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np


def _temporary_name(path: Path) -> Path:
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".tmp{path.suffix}", dir=path.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(name, 0o666 & ~umask)  # mkstemp makes 0600; an output gets an ordinary file's mode
    return Path(name)


def _fsync(path: Path) -> None:
    """Flush a file's (or a folder's) data to disk; folders cannot be opened on every platform."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary file name beside `path`; renamed to `path` when the block ends without error.

    OSError from the block (a full disk) comes out naming `path`."""
    path = Path(path)
    tmp = _temporary_name(path)
    try:
        yield tmp
        _fsync(tmp)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        if e.filename is None or Path(e.filename) == tmp:
            raise OSError(e.errno or errno.EIO, f"cannot write {path}: {e.strerror or e}", str(path)) from None
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync(path.parent)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO[Any]]:
    """`open(path, mode)` written through `atomic_path` (mode "wb" or "w")."""
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_file writes new files (mode 'wb' or 'w'), not mode {mode!r}")
    with atomic_path(path) as tmp:
        with open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """`Path(path).write_bytes(data)`, atomically."""
    with atomic_file(path) as f:
        f.write(data)


def write_text(path: str | os.PathLike, text: str) -> None:
    """`Path(path).write_text(text)` (UTF-8), atomically."""
    with atomic_file(path, "w") as f:
        f.write(text)


def add_npy(archive: zipfile.ZipFile, name: str, array: np.ndarray) -> None:
    """Append `array` as `name.npy` to an open .npz archive (what `np.savez` does, one array at a time,
    so a writer holds one array in memory, not all of them)."""
    with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
        np.lib.format.write_array(member, np.asanyarray(array), allow_pickle=False)


# ============================================================================ checked before compute
def check_writable(path: str | os.PathLike, folder: bool = False) -> None:
    """ValueError naming the problem unless a file (`folder=True`: a folder) can be made at `path`:
    a part of the path that is a file, a folder where a file is wanted, or a folder the process may not
    write in. Creates nothing (a probe file in the nearest existing folder is removed at once)."""
    path = Path(path)
    if folder:
        if path.exists() and not path.is_dir():
            raise ValueError(f"{path}: is a file, not a folder")
        wanted = path
    else:
        if path.is_dir():
            raise ValueError(f"{path}: is a folder, not a file")
        wanted = path.parent
    existing = wanted
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{path}: cannot write there: {existing} is a file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".write-probe.", dir=existing)
    except OSError as e:
        raise ValueError(f"{path}: cannot write in {existing} ({e.strerror or e})") from None
    os.close(fd)
    os.unlink(probe)
