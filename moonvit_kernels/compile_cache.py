"""A disk cache of compiled kernels: NVRTC's cubins and numba's, keyed by everything that decides them.

The compile tier (tests/stages, class TestCompile), the X-ray's builds and the launchers compile the same kernels
again and again; a kernel compiles once per key:

    NVRTC (`nvrtc_check.compile_text`)   the exact source text, file name, name expressions, architecture,
                                         options, and the NVRTC / cuda-bindings versions
    numba (`compile_check._build_all`)   the registry entry (module, kernel, factory arguments, signature,
                                         register bound), the compiler and the versions of numba, numba-cuda,
                                         numba-cuda-mlir, llvmlite and nvJitLink, the architecture, and a
                                         digest of every Python file of this package (any edit recompiles)

An entry is one file: the sha256 of the rest, a JSON header (the report or the log and mangled names) and the
cubin's bytes, written to a temporary name and renamed, so a reader never sees half of one; an entry whose digest
does not match (truncated, altered) is a miss and compiles again. Failed compiles are not stored.
The folder is `$MOONVIT_COMPILE_CACHE`, else `compile/` in the per-user root of `private_dirs`;
`MOONVIT_COMPILE_CACHE=off` turns the cache off. The launchers load what it holds onto the GPU, so a folder
that another user could write, swap or own is never read nor written (`private_dirs.verified`; a warning names
it and the fix).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import struct
import tempfile
import warnings
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

from . import private_dirs

PACKAGE_DIR = Path(__file__).resolve().parent
ENV_VAR = "MOONVIT_COMPILE_CACHE"
_HEADER = struct.Struct("<Q")  # the JSON header's length in bytes
_DIGEST = hashlib.sha256().digest_size


def folder() -> Path | None:
    """Where entries live (not checked; `private_folder` checks it), or None when the cache is off."""
    where = os.environ.get(ENV_VAR, "")
    if where.lower() == "off":
        return None
    return Path(where) if where else private_dirs.root() / "compile"


def private_folder() -> Path | None:
    """`folder()` once every component of it is checked (`private_dirs.verified`; created, mode 0700, when
    missing); None when the cache is off or the folder is unsafe (a warning names it and the fix)."""
    try:
        where = folder()
        return None if where is None else private_dirs.verified(where, private_from=where)
    except private_dirs.UnsafeFolder as e:
        warnings.warn(f"the compile cache is not used ({ENV_VAR}=off silences this): {e}", RuntimeWarning, stacklevel=3)
        return None


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
    """The entry `name` (a `key`): (JSON header, cubin bytes), or None when absent, damaged, unsafe or off."""
    root = private_folder()
    if root is None:
        return None
    try:
        data = private_dirs.read_file(root / name)
    except OSError:
        return None
    digest, body = data[:_DIGEST], data[_DIGEST:]
    if hashlib.sha256(body).digest() != digest:
        return None
    try:
        (n,) = _HEADER.unpack_from(body)
        return json.loads(body[_HEADER.size : _HEADER.size + n]), body[_HEADER.size + n :]
    except (ValueError, struct.error):
        return None


def store(name: str, header: dict, cubin: bytes) -> None:
    """Write the entry `name` (atomically; a full disk or a read-only folder only costs the next compile)."""
    root = private_folder()
    if root is None:
        return
    text = json.dumps(header).encode()
    body = _HEADER.pack(len(text)) + text + cubin
    try:
        fd, tmp = tempfile.mkstemp(dir=root, prefix=f".{name}.")
        with os.fdopen(fd, "wb") as f:
            f.write(hashlib.sha256(body).digest() + body)
        os.replace(tmp, root / name)
    except OSError:
        pass
