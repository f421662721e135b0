"""Pack NVVM (libnvvm and libdevice) for a CUDA machine that has no nvidia-nvvm wheel and no network.

    python scripts/prepare_nvvm.py                       # nvidia-nvvm 13.0 from the package index -> gpu_toolchain/
    python scripts/prepare_nvvm.py --version 13.0 --out gpu_toolchain
    python scripts/prepare_nvvm.py --wheel nvidia_nvvm-13.0.88-....whl   # a wheel already downloaded

Run it on any machine with access to the package index (no GPU needed). It takes the two files numba-cuda
needs out of the nvidia-nvvm wheel (62 MB whole), writes them into `OUT/nvvm-<version>.tar.xz` (about 20 MB)
laid out as a CUDA home (`nvvm/lib64/libnvvm.so.4`, `nvvm/libdevice/libdevice.10.bc`), and `OUT/nvvm.json`
with the version and the sha256 of the archive and of each file. Carry OUT beside the source tree: the
numba backend (`moonvit_kernels.numba_backend.nvvm`) unpacks and checks it at the first compile, when no NVVM
is installed. Pick the version of the machine's nvJitLink (a CUDA 13.0 image: 13.0): a newer NVVM writes PTX
that nvJitLink rejects.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

# where each file lies in the wheel (CUDA 13 layout) -> where numba-cuda looks under CUDA_HOME
WHEEL_FILES = {
    "nvidia/cu13/lib/libnvvm.so.4": "nvvm/lib64/libnvvm.so.4",
    "nvidia/cu13/nvvm/libdevice/libdevice.10.bc": "nvvm/libdevice/libdevice.10.bc",
}
LINUX_X86_64_TAGS = tuple(f"manylinux{t}_x86_64" for t in ("2010", "2014", "_2_17", "_2_27", "_2_28"))
MAX_BYTES = 40 * 1024 * 1024  # what travels beside the source tree


def download_wheel(version: str, folder: Path) -> Path:
    """The nvidia-nvvm wheel of `version` (e.g. "13.0": the newest 13.0.x) for Linux x86-64, from the index."""
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
        *(f"--platform={tag}" for tag in LINUX_X86_64_TAGS), "--python-version", "3.12", "-d", str(folder),
        f"nvidia-nvvm=={version}.*",
    ]  # fmt: skip
    subprocess.run(command, check=True)
    wheels = sorted(folder.glob("nvidia_nvvm-*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"expected one nvidia-nvvm wheel in {folder}, found {[w.name for w in wheels]}")
    return wheels[0]


def wheel_version(wheel: Path) -> str:
    """`nvidia_nvvm-13.0.88-py3-none-manylinux....whl` -> "13.0.88"."""
    return wheel.name.split("-")[1]


def pack(wheel: Path, out: Path, preset: int = 6) -> dict:
    """Write OUT/nvvm-<version>.tar.xz and OUT/nvvm.json from `wheel`; return the manifest."""
    version = wheel_version(wheel)
    if not version.startswith("13."):
        raise SystemExit(f"{wheel.name}: only CUDA 13 wheels are laid out as WHEEL_FILES expects")
    out.mkdir(parents=True, exist_ok=True)
    archive = out / f"nvvm-{version}.tar.xz"
    files = {}
    with zipfile.ZipFile(wheel) as whl, tarfile.open(archive, "w:xz", preset=preset) as tar:
        names = set(whl.namelist())
        for inside, target in WHEEL_FILES.items():
            if inside not in names:
                raise SystemExit(f"{wheel.name} has no {inside}")
            data = whl.read(inside)
            files[target] = hashlib.sha256(data).hexdigest()
            info = tarfile.TarInfo(target)
            info.size, info.mode = len(data), 0o755 if target.endswith(".so.4") else 0o644
            tar.addfile(info, io.BytesIO(data))
    size = archive.stat().st_size
    if size > MAX_BYTES:
        raise SystemExit(f"{archive} is {size / 2**20:.1f} MiB, more than the {MAX_BYTES / 2**20:.0f} MiB allowed")
    manifest = {
        "what": "libnvvm and libdevice of the nvidia-nvvm wheel, for numba-cuda (scripts/prepare_nvvm.py)",
        "version": version,
        "wheel": wheel.name,
        "archive": archive.name,
        "archive_sha256": hashlib.sha256(archive.read_bytes()).hexdigest(),
        "files": files,
    }
    for stale in out.glob("nvvm-*.tar.xz"):
        if stale != archive:
            stale.unlink()
    (out / "nvvm.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {archive} ({size / 2**20:.1f} MiB) and {out / 'nvvm.json'} (NVVM {version})")
    return manifest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--version", default="13.0", help="nvidia-nvvm release to pack, e.g. 13.0 (nvJitLink's)")
    p.add_argument("--wheel", type=Path, help="use this nvidia-nvvm wheel instead of downloading one")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "gpu_toolchain")
    p.add_argument("--preset", type=int, default=6, choices=range(10), help="xz level: 6 ~20 MB in ~40 s, 0 faster")
    args = p.parse_args(argv)
    if args.wheel:
        pack(args.wheel, args.out, args.preset)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        pack(download_wheel(args.version, Path(tmp)), args.out, args.preset)
    return 0


if __name__ == "__main__":
    sys.exit(main())
