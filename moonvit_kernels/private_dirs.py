"""Private folders for what this package builds and then loads: cubins (`compile_cache`), the emulator's shared
libraries (`tools/emulation/build.py`) and the unpacked NVVM (`numba_backend/nvvm.py`).

Code loaded from a folder another user can write, swap or name runs as this user. So every cache lives under one
per-user root, `$XDG_CACHE_HOME/moonvit_kernels` (else `~/.cache/moonvit_kernels`), or where no cache home is
usable `<temp dir>/moonvit_kernels-<user id>`. Each call walks the path from `/` one component at a time, opening
each with O_NOFOLLOW relative to its parent (so no component is a link that could be flipped after the check):
the folders above the root must be owned by this user or root and, unless sticky (like /tmp), writable by no one
else; the root and every folder below it must be owned by this user and open to no one else (mode 0700, made so
atomically by `mkdir`). Nobody else can then change what a path under the root names, so the digest a loader
checks is the digest of what it loads. A folder that fails raises `UnsafeFolder`, naming it and the fix.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from pathlib import Path

ROOT_NAME = "moonvit_kernels"
_POSIX = hasattr(os, "getuid") and hasattr(os, "O_NOFOLLOW")


class UnsafeFolder(PermissionError):
    """A folder code would be loaded from that another user could write, swap or own; the message says which
    folder and what fixes it. Not a RuntimeError: it is no compile error of the source."""


def candidate_roots() -> list[Path]:
    """Where the per-user root may go, best first: the cache home ($XDG_CACHE_HOME when absolute, else
    ~/.cache), then the temp dir."""
    out = []
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    home = Path(xdg) if os.path.isabs(xdg) else Path(os.path.expanduser("~")) / ".cache"
    if home.is_absolute():
        out.append(home / ROOT_NAME)
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    out.append(Path(tempfile.gettempdir()) / f"{ROOT_NAME}-{uid}")
    return out


def root() -> Path:
    """The per-user root (created, mode 0700, when missing), verified anew on every call; UnsafeFolder naming
    every place tried when none is usable."""
    problems = []
    for where in candidate_roots():
        try:
            where.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # ~/.cache may not exist yet
        except OSError:
            pass
        try:
            return verified(where, private_from=where)
        except UnsafeFolder as e:
            problems.append(str(e))
    raise UnsafeFolder("no private cache folder is usable:\n  " + "\n  ".join(problems))


def folder(*parts: str) -> Path:
    """The private folder `root()/parts...` (each part created, mode 0700, when missing)."""
    base = root()
    return verified(base.joinpath(*parts), private_from=base)


def verified(path: Path, private_from: Path) -> Path:
    """`path`, made absolute and its links resolved above `private_from`, after checking every component (see
    the module's docstring); folders from `private_from` down are created (mode 0700) when missing."""
    path, private_from = Path(os.path.abspath(path)), Path(os.path.abspath(private_from))
    if private_from != path and private_from not in path.parents:
        raise ValueError(f"{private_from} is not {path} or a folder above it")
    below = path.relative_to(private_from).parts
    shared = Path(os.path.realpath(private_from.parent))
    if not _POSIX:
        shared.joinpath(private_from.name, *below).mkdir(mode=0o700, parents=True, exist_ok=True)
        return shared.joinpath(private_from.name, *below)
    return _walk(shared, (private_from.name, *below))


def _walk(shared: Path, private: tuple[str, ...]) -> Path:
    """Open `shared` (links already resolved) and then each of `private` below it, checking each; the path."""
    fd, here = os.open("/", os.O_RDONLY | os.O_DIRECTORY), Path("/")
    try:
        _check_shared(fd, here)
        steps = [(name, False) for name in shared.parts[1:]] + [(name, True) for name in private]
        for name, is_private in steps:
            child = _step(fd, here / name, create=is_private)
            os.close(fd)
            fd, here = child, here / name
            (_check_private if is_private else _check_shared)(fd, here)
        return here
    finally:
        os.close(fd)


def _step(parent_fd: int, path: Path, create: bool) -> int:
    """Open folder `path` (its name in the open folder `parent_fd`) without following a link; made first, mode
    0700, when `create`."""
    try:
        if create:
            try:
                os.mkdir(path.name, 0o700, dir_fd=parent_fd)
            except FileExistsError:
                pass
        return os.open(path.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd)
    except OSError as e:
        if os.path.islink(path):
            raise UnsafeFolder(_fix(path, "is a symbolic link, which could be pointed elsewhere")) from None
        raise UnsafeFolder(_fix(path, f"cannot be opened as a folder ({e.strerror})")) from None


def _check_shared(fd: int, path: Path) -> None:
    st = os.fstat(fd)
    if st.st_uid not in (0, os.getuid()):
        raise UnsafeFolder(_fix(path, f"belongs to user id {st.st_uid}, who could swap the folders inside it"))
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise UnsafeFolder(_fix(path, f"may be written by others (mode {st.st_mode & 0o7777:04o}, not sticky)"))


def _check_private(fd: int, path: Path) -> None:
    st = os.fstat(fd)
    if st.st_uid != os.getuid():
        raise UnsafeFolder(_fix(path, f"belongs to user id {st.st_uid}, not to this user ({os.getuid()})"))
    if st.st_mode & 0o077:
        raise UnsafeFolder(_fix(path, f"is open to others (mode {st.st_mode & 0o777:04o}, not 0700)"))


def _fix(path: Path, problem: str) -> str:
    return (
        f"{path} {problem}: code built there is loaded into this process, so it must be this user's alone. "
        f"Fix: remove it (rm -rf '{path}', as its owner or root) and run again, or set XDG_CACHE_HOME or TMPDIR "
        "to a folder of your own"
    )


def read_file(path: Path) -> bytes:
    """The bytes of the regular file `path` in a `verified` folder, opened without following a link."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(f"{path} is not a regular file")
        return f.read()


def sha256_of(path: Path) -> str:
    """The sha256 (hex) of the regular file `path`, opened without following a link."""
    return hashlib.sha256(read_file(path)).hexdigest()
