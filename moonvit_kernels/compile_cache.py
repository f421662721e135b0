"""A disk cache of compiled kernels: NVRTC's cubins and numba's, keyed by everything that decides them.

The compile tier (tests/stages, class TestCompile), the X-ray's builds and the launchers compile the same kernels
again and again; a kernel compiles once per key:

    NVRTC (`nvrtc_check.compile_text`)   the exact source text, file name, name expressions, architecture,
                                         options, and the NVRTC / cuda-bindings versions
    numba (`compile_check._build_all`)   the registry entry (module, kernel, factory arguments, signature,
                                         register bound), the compiler and the versions of numba, numba-cuda,
                                         numba-cuda-mlir, llvmlite and nvJitLink, the architecture, and a
                                         digest of every Python file of this package (any edit recompiles)

An entry is one file: a JSON header (the report or the log and mangled names) and the cubin's bytes, written
to a temporary name and renamed, so a reader never sees half of one. Failed compiles are not stored.
The folder is `$MOONVIT_COMPILE_CACHE`, else `<temp dir>/moonvit_compile_cache-<user id>`;
`MOONVIT_COMPILE_CACHE=off` turns the cache off. The launchers load what it holds onto the GPU, so a folder
that is not this user's own, or that others may write, is never read (`private_folder`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import struct
import tempfile
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parent
ENV_VAR = "MOONVIT_COMPILE_CACHE"
_HEADER = struct.Struct("<Q")  # the JSON header's length in bytes


def folder() -> Path | None:
    """Where entries live, or None when the cache is off."""
    where = os.environ.get(ENV_VAR, "")
    if where.lower() == "off":
        return None
    return Path(where) if where else Path(tempfile.gettempdir()) / f"moonvit_compile_cache-{_uid()}"


def _uid() -> int | str:
    return os.getuid() if hasattr(os, "getuid") else "user"


def private_folder(path: Path) -> bool:
    """Create folder `path` (mode 0700) when missing; True when it is owned by this user and nobody else may
    write in it (always True where the OS has no user ids). Code loaded from a shared temp dir would otherwise
    be whatever another user left there."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.stat()
    except OSError:
        return False
    if not hasattr(os, "getuid"):
        return True
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def key(kind: str, parts: Iterable[Any]) -> str:
    """A digest of `kind` and `parts` (each written as its repr, or as itself when bytes)."""
    h = hashlib.sha256(kind.encode())
    for p in parts:
        data = p if isinstance(p, bytes) else repr(p).encode()
        h.update(len(data).to_bytes(8, "little") + data)
    return f"{kind}-{h.hexdigest()[:32]}"


@functools.cache
def package_digest() -> str:
    """A digest of every Python file of this package (names and bytes)."""
    h = hashlib.sha256()
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        h.update(str(path.relative_to(PACKAGE_DIR)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@functools.cache
def versions(*dists: str) -> tuple[tuple[str, str], ...]:
    """(distribution, installed version or '-') for each of `dists`."""
    out = []
    for d in dists:
        try:
            out.append((d, metadata.version(d)))
        except metadata.PackageNotFoundError:
            out.append((d, "-"))
    return tuple(out)


def load(name: str) -> tuple[dict, bytes] | None:
    """The entry `name` (a `key`): (JSON header, cubin bytes), or None when absent, unreadable or off."""
    root = folder()
    if root is None or not private_folder(root):
        return None
    try:
        data = (root / name).read_bytes()
        (n,) = _HEADER.unpack_from(data)
        header = json.loads(data[_HEADER.size : _HEADER.size + n])
        return header, data[_HEADER.size + n :]
    except (OSError, ValueError, struct.error):
        return None


def store(name: str, header: dict, cubin: bytes) -> None:
    """Write the entry `name` (atomically; a full disk or a read-only folder only costs the next compile)."""
    root = folder()
    if root is None or not private_folder(root):
        return
    text = json.dumps(header).encode()
    try:
        fd, tmp = tempfile.mkstemp(dir=root, prefix=f".{name}.")
        with os.fdopen(fd, "wb") as f:
            f.write(_HEADER.pack(len(text)) + text + cubin)
        os.replace(tmp, root / name)
    except OSError:
        pass
