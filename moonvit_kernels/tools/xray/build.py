"""Build every kernel's cubin per architecture (through the compile tiers) and cache it on disk.

numba kernels: `tools.compile_check.build_cubins(cc)` in a subprocess with the CUDA simulator
off (numba can only compile for a GPU in a process where the simulator was never on).
CUDA C kernels: `tools.nvrtc_check.build_cubins(arch, head_dims)` (NVRTC, in this process); for
sm_90 also the Hopper kernels, built for sm_90a (the code they run on an sm_90 device; their Binary's
`arch` says sm_90a).
Each build lands in `<cache>/<backend>.<arch>/` (cubins + `index.json`), keyed by a digest of the
kernel sources, so a second report over unchanged sources costs nothing.

    python -m moonvit_kernels.tools.xray.build numba sm_90 DIR   (the subprocess entry point)
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from moonvit_kernels.tools import SOURCE_ROOT
from moonvit_kernels.tools.xray.cubin import kernel_resources

PACKAGE_DIR = SOURCE_ROOT / "moonvit_kernels"
BACKENDS = ("numba", "cuda")
_ARCH_CC = {"sm_80": (8, 0), "sm_86": (8, 6), "sm_89": (8, 9), "sm_90": (9, 0)}
HOPPER_ARCH = "sm_90a"


@dataclass
class Binary:
    """One compiled kernel instantiation for one architecture, with its resources."""

    backend: str  # "numba" or "cuda"
    label: str  # kernel + specialisation, e.g. "gemm_v3_none", "flash_attn_bf16_hd128"
    arch: str
    cubin_path: str
    registers: int
    static_shared: int  # bytes of static __shared__, without the 1 KiB reserve (from the cubin)
    stack_bytes: int
    spill_stores: int = 0
    spill_loads: int = 0
    threads: int | None = None  # launch block size the catalogue knows (CUDA C kernels)
    dynamic_shared: int = 0  # launch dynamic shared memory (CUDA C kernels)
    problems: list[str] = field(default_factory=list)

    @property
    def cubin(self) -> bytes:
        return Path(self.cubin_path).read_bytes()


def sources_digest(backend: str, extra: str = "") -> str:
    """A digest of one backend's kernel sources (numba modules; or .cu/.cuh files, their catalogue and
    the NVRTC tier), of the kernel registry, of this module and of the tool versions."""
    h = hashlib.sha256(extra.encode())
    if backend == "numba":
        files = sorted((PACKAGE_DIR / "numba_backend").glob("*.py")) + [PACKAGE_DIR / "tools" / "compile_check.py"]
    else:
        files = sorted(p for p in (PACKAGE_DIR / "cuda_backend").iterdir() if p.suffix in (".cu", ".cuh")) + [
            PACKAGE_DIR / "cuda_backend" / "sources.py",
            PACKAGE_DIR / "cuda_backend" / "nvrtc.py",
            PACKAGE_DIR / "tools" / "nvrtc_check.py",
        ]
    files.append(PACKAGE_DIR / "registry.py")  # what is built, with which bounds
    for path in [*files, Path(__file__)]:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    h.update((Path(__file__).parent / "cubin.py").read_bytes())
    for dist in ("numba-cuda", "nvidia-nvjitlink", "nvidia-cuda-nvrtc"):
        try:
            from importlib.metadata import version

            h.update(f"{dist}={version(dist)}".encode())
        except Exception:
            pass
    return h.hexdigest()[:16]


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """Where builds are cached: `cache_dir`, else $MOONVIT_XRAY_CACHE, else `xray/` under this user's private cache
    root (`private_dirs`: another user cannot fill it with false numbers)."""
    if not (cache_dir or os.environ.get("MOONVIT_XRAY_CACHE")):
        from moonvit_kernels import private_dirs

        return private_dirs.folder("xray")
    root = cache_dir or os.environ.get("MOONVIT_XRAY_CACHE")
    return Path(root)


def _resources(cubin: bytes, arch: str) -> dict[str, int]:
    res = kernel_resources(cubin, arch)
    if len(res) != 1:  # one kernel per cubin: both tiers build each instantiation alone
        raise RuntimeError(f"expected one kernel in the cubin, found {sorted(res)}")
    return next(iter(res.values()))


# ============================================================================ numba (subprocess side)
def _build_numba_into(arch: str, out: Path) -> None:
    from moonvit_kernels.tools import compile_check

    out.mkdir(parents=True, exist_ok=True)
    index = []
    for label, cubin, report in compile_check.build_cubins(cc=_ARCH_CC[arch]):
        path = out / f"{label}.{arch}.cubin"
        path.write_bytes(cubin)
        res = _resources(cubin, arch)
        index.append(
            asdict(
                Binary(
                    backend="numba",
                    label=label,
                    arch=arch,
                    cubin_path=str(path),
                    registers=res.get("registers", report.registers or -1),
                    static_shared=res.get("static_shared", 0),
                    stack_bytes=report.stack_bytes or res.get("stack_bytes", 0),
                    spill_stores=report.spill_stores or 0,
                    spill_loads=report.spill_loads or 0,
                    problems=report.problems(),
                )
            )
        )
    (out / "index.json").write_text(json.dumps(index, indent=1), encoding="utf-8")


def _build_cuda_into(arch: str, out: Path, head_dims: tuple[int, ...]) -> None:
    from moonvit_kernels.tools import nvrtc_check

    out.mkdir(parents=True, exist_ok=True)
    index = []
    workers = min(2, os.cpu_count() or 1)
    built = nvrtc_check.build_cubins(arch, head_dims, workers=workers)
    if arch == "sm_90":  # the sm_90a kernels run on sm_90 devices: they belong in its report
        built += nvrtc_check.build_cubins(HOPPER_ARCH, head_dims, workers=workers)
    for filename, cubin, report in built:
        if not cubin:
            continue
        path = out / filename
        path.write_bytes(cubin)
        res = _resources(cubin, report.arch)
        info = report.info
        index.append(
            asdict(
                Binary(
                    backend="cuda",
                    label=report.spec.label or filename.split(".")[0],
                    arch=report.arch,
                    cubin_path=str(path),
                    registers=res.get("registers", info.registers if info else -1),
                    static_shared=res.get("static_shared", 0),
                    stack_bytes=info.stack_bytes if info else res.get("stack_bytes", 0),
                    spill_stores=info.spill_stores if info else 0,
                    spill_loads=info.spill_loads if info else 0,
                    threads=report.spec.threads,
                    dynamic_shared=report.spec.dynamic_smem,
                    problems=list(report.problems),
                )
            )
        )
    (out / "index.json").write_text(json.dumps(index, indent=1), encoding="utf-8")


# ============================================================================ the caller's side
def binaries(
    backend: str, arch: str, cache_dir: str | os.PathLike | None = None, head_dims: tuple[int, ...] = (128,)
) -> list[Binary]:
    """Every kernel of `backend` built for `arch` (from the cache when the sources are unchanged)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not one of {BACKENDS}")
    if arch not in _ARCH_CC:
        raise ValueError(f"arch {arch!r} is not one of {sorted(_ARCH_CC)}")
    extra = f"{backend}:{arch}:{head_dims}"
    out = cache_root(cache_dir) / sources_digest(backend, extra) / f"{backend}.{arch}"
    index = out / "index.json"
    if not index.exists():
        if backend == "cuda":
            _build_cuda_into(arch, out, tuple(head_dims))
        else:
            env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
            env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_DIR.parent), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
            r = subprocess.run(
                [sys.executable, "-m", "moonvit_kernels.tools.xray.build", "numba", arch, str(out)],
                capture_output=True,
                text=True,
                env=env,
                timeout=1800,
            )
            if r.returncode != 0 or not index.exists():
                raise RuntimeError(f"building the numba cubins for {arch} failed:\n{r.stderr[-3000:]}")
    return [Binary(**d) for d in json.loads(index.read_text(encoding="utf-8"))]


def _build_selected_into(arch: str, out: Path, request: dict) -> None:
    """Build chosen package kernels (`labels`) and/or functions of a Python file (`file`, `entries`)."""
    import importlib.util

    from moonvit_kernels import registry
    from moonvit_kernels.tools import compile_check

    wanted_labels = set(request.get("labels", ()))
    todo = [
        (e.python_function(), e.numba_signature(), e.max_registers)
        for e in registry.numba_entries()
        if e.label in wanted_labels
    ]
    if request.get("file"):
        spec = importlib.util.spec_from_file_location("xray_snippet", request["file"])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        todo += [(getattr(module, fn), signature, 255) for fn, signature in request.get("entries", ())]
    out.mkdir(parents=True, exist_ok=True)
    index = []
    for fn, signature, limit in todo:
        report, cubin = compile_check.build_kernel(fn, signature, limit, "selected", _ARCH_CC[arch])
        if cubin is None:
            raise RuntimeError(f"{fn.__name__}: {report.error}")
        path = out / f"{fn.__name__}.{arch}.cubin"
        path.write_bytes(cubin)
        res = _resources(cubin, arch)
        index.append(
            asdict(
                Binary("numba", fn.__name__, arch, str(path), res["registers"], res["static_shared"],
                       report.stack_bytes or 0, report.spill_stores or 0, report.spill_loads or 0)
            )
        )  # fmt: skip
    (out / "index.json").write_text(json.dumps(index, indent=1), encoding="utf-8")


def compile_numba(
    out_dir: str | os.PathLike,
    labels: Sequence[str] = (),
    file: str | os.PathLike | None = None,
    entries: Sequence[tuple[str, str]] = (),
    arch: str = "sm_90",
) -> list[Binary]:
    """Compile a few numba kernels for `arch` in a subprocess (simulator off), without caching:
    package kernels named by `labels` (their cubin labels, e.g. "gemm_v3_none") and functions of the
    Python `file` given as `entries` [(function name, numba signature)]. Binaries in order built."""
    out = Path(out_dir)
    request = {"labels": list(labels), "file": str(file) if file else None, "entries": [list(e) for e in entries]}
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_DIR.parent), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    r = subprocess.run(
        [sys.executable, "-m", "moonvit_kernels.tools.xray.build", "numba-select", arch, str(out), json.dumps(request)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    if r.returncode != 0:
        raise RuntimeError(f"compiling {labels or entries} failed:\n{r.stderr[-3000:]}")
    return [Binary(**d) for d in json.loads((out / "index.json").read_text(encoding="utf-8"))]


def main(argv: list[str] | None = None) -> int:
    """Subprocess entry: `numba ARCH DIR` builds every numba kernel for ARCH into DIR;
    `numba-select ARCH DIR JSON` builds those named in JSON (see `compile_numba`)."""
    args = sys.argv[1:] if argv is None else argv
    if not ((len(args) == 3 and args[0] == "numba") or (len(args) == 4 and args[0] == "numba-select")):
        usage = "usage: python -m moonvit_kernels.tools.xray.build numba ARCH DIR | numba-select ARCH DIR JSON"
        print(usage, file=sys.stderr)
        return 2
    os.environ.pop("NUMBA_ENABLE_CUDASIM", None)
    if args[0] == "numba":
        _build_numba_into(args[1], Path(args[2]))
    else:
        _build_selected_into(args[1], Path(args[2]), json.loads(args[3]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
