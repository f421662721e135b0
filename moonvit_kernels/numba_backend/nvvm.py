"""NVVM, the compiler numba-cuda makes PTX with, and whether the linker takes what it makes.

numba-cuda compiles a kernel at its first launch: NVVM (libnvvm and libdevice) writes PTX, nvJitLink links it
for the device. numba-cuda brings neither: NVVM is the `nvidia-nvvm` wheel or part of a CUDA toolkit (found
through cuda.pathfinder, `CUDA_HOME` or a system install), and a CUDA image may hold NVRTC and nvJitLink without
it. Both ways this goes wrong would surface deep inside numba, at the first launch:
  - no NVVM at all (`DynamicLibNotFoundError` from cuda.pathfinder);
  - an NVVM newer than nvJitLink: NVVM 13.5 writes PTX ISA 9.5, which nvJitLink 13.0 rejects
    ("Unsupported .version 9.5; current version is '9.0'").

`require_nvvm()` runs before the first numba launch (`launch.check_launch`), once per process: it compiles a
one-line kernel to PTX and links it for sm_90 with nvJitLink, and raises `NvvmUnavailable` with one line
naming what is missing and the wheel and version that fix it. Where no NVVM is installed, a prepared copy is
used: `scripts/prepare_nvvm.py` packs libnvvm and libdevice out of the nvidia-nvvm wheel into
`gpu_toolchain/` beside the package (about 20 MB); `use_prepared_nvvm` checks its digests, unpacks it into a
private folder laid out as a CUDA home, and points `CUDA_HOME` there before NVVM is first loaded.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

from .compilers import simulator_on

PREPARED_ENV = "MOONVIT_GPU_TOOLCHAIN"  # a folder made by scripts/prepare_nvvm.py (default: gpu_toolchain/)
PREPARED_DIR = Path(__file__).resolve().parents[2] / "gpu_toolchain"
MANIFEST = "nvvm.json"
PROBE_ARCH = "sm_90"


class NvvmUnavailable(RuntimeError):
    """numba-cuda cannot compile here; the message is one line: what is missing, and what fixes it."""


def nvjitlink_version() -> tuple[int, int] | None:
    """nvJitLink's (major, minor), None when cuda-bindings cannot load it."""
    try:
        from cuda.bindings import nvjitlink

        major, minor = nvjitlink.version()
    except Exception:  # not installed, or its library missing
        return None
    return int(major), int(minor)


def max_ptx_isa(nvjitlink: tuple[int, int]) -> tuple[int, int] | None:
    """The newest PTX ISA an nvJitLink of that CUDA release links: CUDA 13.m -> 9.m (None for other majors)."""
    return (9, nvjitlink[1]) if nvjitlink[0] == 13 else None


def fix_hint(nvjitlink: tuple[int, int] | None) -> str:
    """How to get an NVVM that matches `nvjitlink`: the wheel and version, or the prepared folder."""
    wheel = f"nvidia-nvvm=={nvjitlink[0]}.{nvjitlink[1]}.*" if nvjitlink else "nvidia-nvvm==13.0.*"
    return f"fix: pip install '{wheel}' (nvJitLink's release), or offline: gpu_toolchain/ from scripts/prepare_nvvm.py"


def prepared_dir() -> Path:
    """Where a prepared NVVM is looked for: $MOONVIT_GPU_TOOLCHAIN, else gpu_toolchain/ beside the package."""
    return Path(os.environ.get(PREPARED_ENV) or PREPARED_DIR)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest(folder: Path) -> dict:
    """The prepared folder's manifest (version, archive name and digest, the files inside and their digests)."""
    manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    for key in ("version", "archive", "archive_sha256", "files"):
        if key not in manifest:
            raise NvvmUnavailable(f"{folder / MANIFEST} lacks {key!r}: make it again (scripts/prepare_nvvm.py)")
    return manifest


def unpack_prepared(folder: Path | None = None) -> Path | None:
    """Unpack the prepared NVVM in `folder` (default `prepared_dir()`) into `nvvm/` of this user's private root
    (`private_dirs`: nobody else can write, swap or own it) laid out as a CUDA home (`nvvm/lib64/libnvvm.so.4`,
    `nvvm/libdevice/libdevice.10.bc`) and return that folder, None when there is no prepared folder. The archive's
    digest is checked before it is opened and every unpacked file's after; a folder already unpacked is reused
    only while its files keep their digests (else unpacked again). NvvmUnavailable when the archive or a file
    fails its digest, or the private root is unsafe."""
    from .. import private_dirs

    folder = prepared_dir() if folder is None else folder
    if not (folder / MANIFEST).is_file():
        return None
    manifest = read_manifest(folder)
    archive = folder / manifest["archive"]
    try:
        home = private_dirs.folder("nvvm") / manifest["archive_sha256"][:16]
    except private_dirs.UnsafeFolder as e:
        raise NvvmUnavailable(str(e).replace("\n", " ")) from None
    if _unpacked(home, manifest):
        return home
    if not archive.is_file() or _sha256(archive) != manifest["archive_sha256"]:
        raise NvvmUnavailable(f"{archive} is missing or altered (sha256): make it again (scripts/prepare_nvvm.py)")
    staging = Path(tempfile.mkdtemp(dir=home.parent))
    with tarfile.open(archive, "r:xz") as tar:
        tar.extractall(staging, members=_members(tar, manifest), filter="data")
    if home.exists():
        shutil.rmtree(home)
    staging.rename(home)
    if not _unpacked(home, manifest):
        raise NvvmUnavailable(f"{archive} does not hold the files its manifest names: make it again")
    return home


def use_prepared_nvvm(folder: Path | None = None) -> Path | None:
    """`unpack_prepared`, then point numba-cuda at it: `CUDA_HOME` (its libdevice look-up) and libnvvm loaded (which
    cuda.pathfinder then finds as already loaded). None when there is no prepared folder."""
    home = unpack_prepared(folder)
    if home is None:
        return None
    os.environ["CUDA_HOME"] = str(home)
    _forget_cuda_home()
    ctypes.CDLL(str(home / "nvvm" / "lib64" / "libnvvm.so.4"), mode=ctypes.RTLD_GLOBAL)
    return home


def _forget_cuda_home() -> None:
    """cuda.pathfinder reads CUDA_HOME once per process; make it read the new value (where it caches it)."""
    try:
        from cuda.pathfinder._utils.env_vars import get_cuda_path_or_home
    except ImportError:  # another pathfinder: the preloaded library is found all the same
        return
    getattr(get_cuda_path_or_home, "cache_clear", lambda: None)()


def _members(tar: tarfile.TarFile, manifest: dict) -> list[tarfile.TarInfo]:
    wanted = set(manifest["files"])
    members = [m for m in tar.getmembers() if m.name in wanted and m.isfile()]
    if {m.name for m in members} != wanted:
        raise NvvmUnavailable(f"the NVVM archive lacks {sorted(wanted - {m.name for m in members})}: make it again")
    return members


def _unpacked(home: Path, manifest: dict) -> bool:
    """True when every file of the manifest is in `home` with its digest (read without following a link)."""
    from .. import private_dirs

    try:
        return all(private_dirs.sha256_of(home / name) == digest for name, digest in manifest["files"].items())
    except OSError:
        return False


def _probe(x):  # the one-line kernel require_nvvm compiles
    x[0] = 1.0


def _nvvm_loads() -> str | None:
    """None when cuda.pathfinder finds libnvvm as numba-cuda will look for it, else why not."""
    try:
        from cuda import pathfinder

        pathfinder.load_nvidia_dynamic_lib("nvvm")
    except Exception as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
    return None


@functools.cache
def require_nvvm() -> str:
    """Check, once per process and before the first numba compile, that numba-cuda can compile and link here:
    NVVM present (else the prepared copy, `use_prepared_nvvm`), its PTX linkable by nvJitLink. Returns a line
    saying which NVVM and PTX ISA; NvvmUnavailable (one line: what is missing, what fixes it) otherwise.
    Nothing to check under the CUDA simulator, which compiles nothing."""
    if simulator_on():
        return "CUDA simulator: no NVVM needed"
    from ._cuda import COMPILER
    from .compilers import NUMBA_CUDA

    if COMPILER != NUMBA_CUDA:
        return f"{COMPILER}: brings its own compiler"
    jitlink = nvjitlink_version()
    if jitlink is None:
        raise NvvmUnavailable(
            "numba kernels cannot link: nvJitLink is not installed (pip install 'nvidia-nvjitlink==13.0.*', "
            "part of numba-cuda[cu13])"
        )
    why = _nvvm_loads()
    source = "installed"
    if why is not None:
        home = use_prepared_nvvm()
        if home is None:
            raise NvvmUnavailable(f"numba kernels cannot compile: no NVVM (libnvvm) here; {fix_hint(jitlink)}")
        if (why := _nvvm_loads()) is not None:
            raise NvvmUnavailable(f"the prepared NVVM in {home} does not load ({why}); make it again")
        source = f"prepared ({home})"
    from ._cuda import cuda
    from .driverless import driverless_target, link, ptx_isa

    try:
        with driverless_target((9, 0)):
            ptx, _ = cuda.compile_ptx(_probe, "void(float32[::1])", cc=(9, 0))
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise NvvmUnavailable(
            f"numba kernels cannot compile: NVVM ({source}) failed on a one-line kernel ({type(e).__name__}: "
            f"{first[:200]}); {fix_hint(jitlink)}"
        ) from None
    isa = ptx_isa(ptx) or "?"
    try:
        link(ptx, PROBE_ARCH)
    except Exception as e:
        newest = max_ptx_isa(jitlink)
        takes = f" (it takes up to {newest[0]}.{newest[1]})" if newest else ""
        raise NvvmUnavailable(
            f"numba kernels cannot link: NVVM ({source}) writes PTX ISA {isa}, which nvJitLink "
            f"{jitlink[0]}.{jitlink[1]} cannot link{takes}; {fix_hint(jitlink)} [{str(e).splitlines()[0][:160]}]"
        ) from None
    return f"NVVM {source}: PTX ISA {isa}, linked for {PROBE_ARCH} by nvJitLink {jitlink[0]}.{jitlink[1]}"
