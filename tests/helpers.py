"""Test helpers: random pixels, file-size limits, snapshots, the numpy 2.5 shim probe; the error measures
(closeness with NaN/Inf failing, tolerances from CONTRIBUTING.md) are `moonvit_kernels.checks`, re-exported here."""

from __future__ import annotations

import contextlib

import numpy as np

from moonvit_kernels.checks import FP32_EPS, assert_close, fp32_rtol  # noqa: F401


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def random_pixels(grid_thws, patch_size: int, seed: int = 0, dtype=np.float32) -> np.ndarray:
    """Non-uniform random patches `[Σ t·h·w, 3, p, p]` for a grid."""
    L = int(np.sum(np.prod(np.asarray(grid_thws), axis=1)))
    r = np.random.default_rng(seed)
    return (r.standard_normal((L, 3, patch_size, patch_size)) * 0.7 + r.uniform(-0.3, 0.3)).astype(dtype)


@contextlib.contextmanager
def file_size_limit(nbytes: int):
    """A disk that fills up: `ulimit -f` for this process (RLIMIT_FSIZE, SIGXFSZ ignored), so that a
    write taking any file past `nbytes` fails with OSError (EFBIG), as a full disk fails with ENOSPC."""
    import resource
    import signal

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def snapshot(folder) -> dict:
    """Every file below `folder` (hidden ones too): relative path -> bytes."""
    from pathlib import Path

    root = Path(folder)
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@contextlib.contextmanager
def read_only_folder(folder):
    """`folder` made so that nobody can write in it: chmod 555, or for root (who ignores modes) the
    immutable attribute; pytest skips (saying why) where neither works."""
    import subprocess

    import pytest

    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o555)
    immutable = False
    try:
        (folder / ".probe").touch()
    except OSError:
        pass
    else:
        (folder / ".probe").unlink()
        immutable = subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0
        if not immutable:
            folder.chmod(0o755)
            pytest.skip("cannot make a read-only folder here (root, and no chattr)")
    try:
        yield folder
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        folder.chmod(0o755)


def non_square(rows: int, cols: int) -> tuple[int, int]:
    """`(rows, cols)`, refused when equal: on a square grid a row stride taken from the wrong dimension, or rows
    and columns swapped, reads the same element and the test cannot fail."""
    if rows == cols:
        raise ValueError(f"a {rows}x{cols} grid is square: a transpose or stride bug would pass; use rows != cols")
    return rows, cols


def row_stack_probe(*args: str, timeout: float = 300) -> list:
    """tests/row_stack_probe.py run with `args` in a fresh interpreter, the CUDA simulator off and numba's default
    compiler: its JSON line [what the unshimmed import said, the compiler, compiled ok, error, np.row_stack left]."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_ENABLE_CUDASIM", "MOONVIT_NUMBA_COMPILER")}
    probe = Path(__file__).with_name("row_stack_probe.py")
    r = subprocess.run([sys.executable, str(probe), *args], capture_output=True, text=True, env=env, timeout=timeout)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])
