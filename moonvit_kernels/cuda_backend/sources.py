"""The CUDA C kernels (`*.cu` beside this file): their text, their compile options, how their templates are
spelled and sized.

Both the CuPy launchers (`moonvit_kernels.cuda_backend.launchers`) and the GPU-less compile check
(`moonvit_kernels.tools.nvrtc_check`) read this module, so they compile the same text with the same
options; which instantiations exist is `moonvit_kernels.registry` (`kernel_specs`, `specs_for(arch)`):

- `load_source(name)` returns a `.cu` file with its local `#include "x.cuh"` headers inlined (CuPy
  caches compiled kernels by source text, so a header edit must change the text it sees);
- `compile_options()` the NVRTC options (C++17, `-ftz=true` as CuPy adds it, the include directory for
  `cuda_bf16.h` of the CUDA major the NVRTC in use belongs to);
- `KernelSpec`: one instantiation (file, C++ name, block size, dynamic shared memory, register bound); the
  C++ name and shared-memory helpers below say how a `.cu` template is spelled and sized;
- `OPTIN_SMEM_PER_BLOCK` / `SUPPORTED_HEAD_DIMS`: the shared memory a block may use per architecture
  and the attention head dims that fit it.

The portable files need sm_80 or newer (bf16 mma.sync, ldmatrix, cp.async); the GPU tier targets sm_90.
The Hopper files (`HOPPER_SOURCES`: wgmma, tensor copies) build for sm_90a only (`KernelSpec.archs`).

Three ways to exercise them (each stage's tests: tests/stages/test_<stage>.py): on a GPU through CuPy (`launchers`);
compiled for sm_80/sm_90 without a GPU (`python -m moonvit_kernels.tools.nvrtc_check`,
tests/test_nvrtc_compile.py); run on the CPU by the emulator in `emulation/` (the same `.cu`
files through g++).
"""

from __future__ import annotations

import functools
import glob
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parent

# Portable files: sm_80 or newer (bf16 mma.sync, ldmatrix, cp.async), built for every architecture.
PORTABLE_SOURCES = ("gemm_fp32.cu", "gemm_bf16.cu", "attention.cu", "rmsnorm.cu", "rope.cu", "pos_emb.cu", "merge.cu")
# Hopper files: wgmma, tensor copies, setmaxnreg, i.e. sm_90a's arch-specific features; built for sm_90a
# only (a plain sm_90 build rejects them, and sm_90a code runs on compute capability 9.0 alone).
# Their CPU emulator is emulation/hopper.py (the portable files' emulator, emulation/__init__.py,
# builds PORTABLE_SOURCES only).
HOPPER_SOURCES = ("gemm_bf16_sm90.cu", "flash_attn_sm90.cu")
SOURCES = PORTABLE_SOURCES + HOPPER_SOURCES
HOPPER_ARCH = "sm_90a"

BF16 = "__nv_bfloat16"  # the C++ spelling of bfloat16 in template arguments

# GEMM epilogues: name -> the EPI_* number in common.cuh
EPILOGUES = {"none": 0, "gelu_tanh": 1, "gelu_erf": 2, "residual": 3}

# Attention head dims: any multiple of 8 up to MAX_HEAD_DIM, and on each GPU only those whose shared
# memory fits its opt-in limit (checked at launch against the device's own attribute).
# Why 240: the bf16 kernel keeps O (HDP/2 floats per thread), the Q fragments and S in registers.
# Built with these options by NVRTC 13.5 (compile tier, no GPU), hd 216..256 take 254-255 of the
# 255 registers a thread can have; hd 256 spills on sm_80 (8 B stores / 16 B loads; without -ftz it
# spilled on sm_90 too, and hd 248 on sm_80), and hd 248/256 need 168,960 B of shared memory, more
# than sm_80's 166,912 B. 240 is the largest head dim that builds without spills for sm_80 and
# sm_90 and fits an A100; tests/test_nvrtc_compile.py builds it.
MAX_HEAD_DIM = 240

# Shared memory one block may use after opting in (cudaDevAttrMaxSharedMemoryPerBlockOptin), bytes.
# Source: CUDA C++ Programming Guide, "Technical Specifications per Compute Capability" (maximum
# shared memory per thread block: 163 KB for 8.0/8.7, 99 KB for 8.6/8.9/12.0, 227 KB for 9.0/10.0),
# as in the Ampere, Ada and Hopper tuning guides. The launchers read the real value from the device;
# this table serves the compile check and the head-dim table below.
OPTIN_SMEM_PER_BLOCK = {
    "sm_80": 163 * 1024,  # A100, A30: 166,912 B
    "sm_86": 99 * 1024,  # RTX 30xx, A10, A40: 101,376 B
    "sm_87": 163 * 1024,  # Jetson Orin
    "sm_89": 99 * 1024,  # L4, L40S, RTX 40xx
    "sm_90": 227 * 1024,  # H100, H200: 232,448 B
    "sm_90a": 227 * 1024,  # the same GPUs, arch-specific features on (the Hopper kernels' target)
    "sm_100": 227 * 1024,  # B200
    "sm_120": 99 * 1024,  # RTX 50xx
}

# Largest supported attention head dim per architecture (every multiple of 8 from 8 up to it works),
# (bf16 kernel, fp32 kernel): MAX_HEAD_DIM capped by OPTIN_SMEM_PER_BLOCK through attention_smem_bytes.
#   arch                      opt-in smem / block   bf16 (tensor cores)   fp32 (SIMT)
#   sm_80, sm_87              166,912 B             8..240                8..240
#   sm_86, sm_89, sm_120      101,376 B             8..144                8..240
#   sm_90, sm_100             232,448 B             8..240                8..240
# (hd 152/160 need 107,520 B in bf16; K3's hd 128 needs 87,040 B and runs everywhere.)
SUPPORTED_HEAD_DIMS = {
    "sm_80": (240, 240),
    "sm_86": (144, 240),
    "sm_87": (240, 240),
    "sm_89": (144, 240),
    "sm_90": (240, 240),
    "sm_90a": (240, 240),
    "sm_100": (240, 240),
    "sm_120": (144, 240),
}

_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.MULTILINE)


def load_source(name: str) -> str:
    """The text of kernel file `name` with its local `#include "..."` headers inlined once each."""
    if name not in SOURCES:
        raise ValueError(f"unknown kernel source {name!r}; known: {', '.join(SOURCES)}")
    return _inline(name, set())


def _inline(name: str, seen: set[str]) -> str:
    path = KERNEL_DIR / name
    text = path.read_text(encoding="utf-8")

    def expand(match: re.Match) -> str:
        header = match.group(1)
        if header in seen:
            return f"// (already included: {header})"
        seen.add(header)
        body = _inline(header, seen).replace("#pragma once", "")
        return f'#line 1 "{header}"\n{body}\n#line {text.count(chr(10), 0, match.end()) + 2} "{name}"'

    return _LOCAL_INCLUDE.sub(expand, text)


_VERSION_DEFINES = (
    ("cuda.h", re.compile(r"^#define\s+CUDA_VERSION\s+(\d+)", re.MULTILINE)),
    ("cuda_runtime_api.h", re.compile(r"^#define\s+CUDART_VERSION\s+(\d+)", re.MULTILINE)),
)


def header_cuda_version(include_dir: str | os.PathLike) -> int | None:
    """The CUDA version the headers in `include_dir` declare (CUDA_VERSION in cuda.h, else CUDART_VERSION
    in cuda_runtime_api.h; 12080 means 12.8), or None when neither file says."""
    for name, pattern in _VERSION_DEFINES:
        path = Path(include_dir) / name
        if path.is_file() and (m := pattern.search(path.read_text(encoding="utf-8", errors="replace"))):
            return int(m.group(1))
    return None


def nvrtc_major_of_bindings() -> int | None:
    """Major version of the NVRTC that cuda-bindings loads (the compile check's), None without cuda-bindings."""
    try:
        from cuda.bindings import nvrtc

        err, major, _minor = nvrtc.nvrtcVersion()
    except Exception:  # cuda-bindings or the NVRTC library missing
        return None
    return int(major) if err == nvrtc.nvrtcResult.NVRTC_SUCCESS else None


def include_candidates(nvrtc_major: int | None) -> list[str]:
    """Directories that may hold `cuda_bf16.h`, in order of preference: $MOONVIT_CUDA_INCLUDE, the one
    cuda.pathfinder finds, the pip wheels' layouts (`nvidia/cu<major>/include` of CUDA 13+,
    `nvidia/cuda_runtime/include` of CUDA 12) on sys.path, $CUDA_PATH, $CUDA_HOME, /usr/local/cuda and
    /usr/local/cuda-<major>.*."""
    candidates = []
    if os.environ.get("MOONVIT_CUDA_INCLUDE"):
        candidates.append(os.environ["MOONVIT_CUDA_INCLUDE"])
    try:
        from cuda.pathfinder import find_nvidia_header_directory

        found = find_nvidia_header_directory("cudart")
        if found:
            candidates.append(str(found))
    except Exception:  # pathfinder missing or unable to look: fall through to the usual places
        pass
    wheel_dirs = [f"cu{nvrtc_major}"] if nvrtc_major is not None else ["cu*"]
    for entry in sys.path:
        root = Path(entry or ".") / "nvidia"
        for pattern in (*wheel_dirs, "cuda_runtime"):
            candidates.extend(str(d) for d in sorted(root.glob(f"{pattern}/include"), reverse=True))
    for env in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(env):
            candidates.append(os.path.join(os.environ[env], "include"))
    candidates.append("/usr/local/cuda/include")
    if nvrtc_major is not None:
        candidates.extend(sorted(glob.glob(f"/usr/local/cuda-{nvrtc_major}.*/include"), reverse=True))
    return list(dict.fromkeys(candidates))  # first occurrence of each


def select_include_dir(candidates: Sequence[str], nvrtc_major: int | None) -> str:
    """The first candidate holding `cuda_bf16.h` whose headers' CUDA major equals `nvrtc_major` (any
    version when None); a directory whose version cannot be read is taken only when none matches, one
    of another major never (NVRTC 12 rejects CUDA 13 headers and the reverse). RuntimeError listing
    what each candidate holds when nothing fits."""
    unknown, seen = [], []
    for c in candidates:
        if not os.path.isfile(os.path.join(c, "cuda_bf16.h")):
            seen.append(f"{c} (no cuda_bf16.h)")
            continue
        version = header_cuda_version(c)
        if version is None:
            unknown.append(c)
            seen.append(f"{c} (version unknown)")
        elif nvrtc_major is None or version // 1000 == nvrtc_major:
            return c
        else:
            seen.append(f"{c} (CUDA {version // 1000}.{version % 1000 // 10})")
    if unknown:
        return unknown[0]
    wanted = f"CUDA {nvrtc_major} " if nvrtc_major is not None else ""
    hint = f"nvidia-cuda-runtime-cu{nvrtc_major}" if nvrtc_major == 12 else "'cuda-toolkit[cudart]'"
    raise RuntimeError(
        f"no {wanted}headers with cuda_bf16.h for NVRTC {nvrtc_major} (looked in: {', '.join(seen) or 'nowhere'}). "
        f"Install them (pip install {hint}) or set MOONVIT_CUDA_INCLUDE to the include directory of the "
        "CUDA toolkit whose NVRTC is in use."
    )


@functools.cache
def cuda_include_dir(nvrtc_major: int | None = None) -> str:
    """Include directory (holding `cuda_bf16.h`) whose CUDA major matches the NVRTC that compiles:
    `nvrtc_major` (the launchers pass CuPy's), else the one cuda-bindings loads (the compile check's).
    See `include_candidates` for where it looks and `select_include_dir` for the choice."""
    if nvrtc_major is None:
        nvrtc_major = nvrtc_major_of_bindings()
    return select_include_dir(include_candidates(nvrtc_major), nvrtc_major)


# CuPy appends -ftz=true to every NVRTC compile (cupy/cuda/compiler.py, _compile_with_cache_cuda), so
# it is part of the one option set: the compile check then measures the binaries CuPy runs, and the
# emulator flushes fp32 denormals the same way (emulation/prelude.h). Single-precision arithmetic,
# division, sqrt and the approximate transcendentals (ex2.approx.ftz, rsqrt.approx.ftz) read and write
# subnormal floats as signed zero; conversions and bf16 bit moves are not flushed.
FTZ_OPTION = "-ftz=true"


def compile_options(nvrtc_major: int | None = None) -> tuple[str, ...]:
    """NVRTC options shared by CuPy, the compile check and the cubin dump (the architecture is added by
    each): C++17, flush-to-zero as CuPy compiles, and the CUDA include directory matching the NVRTC major."""
    return ("--std=c++17", FTZ_OPTION, f"-I{cuda_include_dir(nvrtc_major)}")


def runtime_options(arch: str, nvrtc_major: int | None = None) -> tuple[str, ...]:
    """The options a launcher compiles a module with when it drives NVRTC itself (the Hopper cubins):
    `compile_options`, the architecture, and ptxas -v (its register / spill log is kept). Only options
    every NVRTC from CUDA 12.4 on accepts: the target tier compiles every kernel with exactly these."""
    return (*compile_options(nvrtc_major), f"--gpu-architecture={arch}", "-Xptxas=-v")


# ============================================================================ the catalogue (moonvit_kernels.registry)
@dataclass(frozen=True)
class KernelSpec:
    """One kernel instantiation: where it lives, how it is launched, what the compile check asserts."""

    source: str  # file in SOURCES
    name: str  # C++ name expression (template arguments included), as CuPy's get_function takes it
    threads: int  # threads per block the launcher uses
    max_registers: int  # per-thread bound checked at compile time (keeps the intended occupancy)
    dynamic_smem: int = 0  # bytes of dynamic shared memory per block at launch
    max_stack: int = 0  # bytes of local-memory stack frame allowed (spills are never allowed)
    label: str = ""  # file-name-safe kernel + specialisation, e.g. "gemm_bf16_tc_bf16_gelu_tanh"
    archs: tuple[str, ...] = ()  # the only architectures it is built for; () = every one without an "a" suffix

    def builds_for(self, arch: str) -> bool:
        """True when the compile tier builds this instantiation for `arch`: an arch-specific kernel
        (`archs` given) for those archs only, a portable one for every arch except the "a" variants
        (an sm_90a build of portable code would repeat the sm_90 one)."""
        return arch in self.archs if self.archs else not arch.endswith("a")


def gemm_bf16_name(out: str, epilogue: str) -> str:
    """`gemm_bf16_tc<OutT, EPI>`; out is "float32" or "bfloat16"."""
    return f"gemm_bf16_tc<{'float' if out == 'float32' else BF16}, {EPILOGUES[epilogue]}>"


def gemm_fp32_name(epilogue: str) -> str:
    return f"gemm_fp32_simt<{EPILOGUES[epilogue]}>"


def attention_name(head_dim: int, dtype: str) -> str:
    """`flash_attn_bf16<HD>` or `flash_attn_fp32<HD>`."""
    return f"flash_attn_{'bf16' if dtype == 'bfloat16' else 'fp32'}<{int(head_dim)}>"


def attention_smem_bytes(head_dim: int, dtype: str) -> int:
    """Dynamic shared memory of the attention kernels (mirrors AttnBf16Cfg / AttnFp32Cfg in attention.cu)."""
    if dtype == "bfloat16":
        hdp = (head_dim + 15) // 16 * 16
        return (64 + 2 * 2 * 64) * (hdp + 8) * 2  # Q tile + 2 stages of K and V tiles, bf16
    return (16 * head_dim + 32 * (head_dim + 1) + 32 * head_dim) * 4  # Q, K (padded), V tiles, fp32


def check_head_dim(head_dim: int) -> None:
    """ValueError unless the attention kernels support `head_dim` (a multiple of 8, 8..MAX_HEAD_DIM) on some GPU."""
    if not isinstance(head_dim, int) or head_dim % 8 or not 8 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(
            f"head_dim={head_dim!r} unsupported: the attention kernels need a multiple of 8 in 8..{MAX_HEAD_DIM}"
        )


def max_attention_head_dim(dtype: str, smem_limit: int) -> int:
    """The largest head dim (multiple of 8, <= MAX_HEAD_DIM) whose attention kernel in `dtype` fits
    `smem_limit` bytes of shared memory per block; 0 when none does."""
    fitting = [hd for hd in range(8, MAX_HEAD_DIM + 1, 8) if attention_smem_bytes(hd, dtype) <= smem_limit]
    return max(fitting, default=0)


def check_attention_fits(head_dim: int, dtype: str, smem_limit: int, where: str) -> None:
    """ValueError unless attention at `head_dim` in `dtype` fits `smem_limit` bytes per block (`where`
    names the GPU in the message)."""
    check_head_dim(head_dim)
    need = attention_smem_bytes(head_dim, dtype)
    if need > smem_limit:
        raise ValueError(
            f"attention head_dim={head_dim} ({dtype}) needs {need:,} B of shared memory per block, more than the "
            f"{smem_limit:,} B {where} allows; the largest head dim that fits there is "
            f"{max_attention_head_dim(dtype, smem_limit)} (see sources.SUPPORTED_HEAD_DIMS)"
        )


# ============================================================================ the Hopper kernels
# Tile widths of gemm_bf16_sm90 (its BN template argument) and the (output, epilogue) pairs the backend
# launches (CupyBackend.forward): the compile tier builds these, not every combination.
HOPPER_GEMM_BLOCK_N = (128, 256)
HOPPER_GEMM_USES = (
    ("float32", "none"),
    ("float32", "residual"),
    ("bfloat16", "none"),
    ("bfloat16", "gelu_tanh"),
    ("bfloat16", "gelu_erf"),
)
HOPPER_MAX_HEAD_DIM = 128  # flash_attn_sm90: head dims 8..128 in steps of 8


def gemm_sm90_name(out: str, epilogue: str, block_n: int = 128) -> str:
    """`gemm_bf16_sm90<OutT, EPI, BN>`; out is "float32" or "bfloat16", block_n 128 or 256."""
    return f"gemm_bf16_sm90<{'float' if out == 'float32' else BF16}, {EPILOGUES[epilogue]}, {int(block_n)}>"


def attention_sm90_name(head_dim: int) -> str:
    """`flash_attn_sm90<HD>`."""
    return f"flash_attn_sm90<{int(head_dim)}>"


def gemm_sm90_smem_bytes(block_n: int) -> int:
    """GemmSm90Cfg<BN>::SMEM_BYTES: 4 stages of A (128 x 64) and B (BN x 64) bf16, 8 barriers (no alignment
    slack: dynamic shared memory is declared __align__(1024))."""
    return 4 * (128 * 64 * 2 + block_n * 64 * 2) + 2 * 4 * 8


def attention_sm90_smem_bytes(head_dim: int) -> int:
    """AttnSm90Cfg<HD>::SMEM_BYTES: Q, 2 stages of K, raw V and transposed V, 9 barriers (no alignment slack)."""
    db = (head_dim + 63) // 64
    q = k = vraw = db * 64 * 128
    vt = 64 * db * 64 * 2
    return q + 2 * (k + vraw + vt) + 8 * (1 + 4 * 2)


def _type_name(dtype: str) -> str:
    return "float" if dtype == "float32" else BF16


def rmsnorm_name(in_dtype: str, out_dtype: str) -> str:
    return f"rmsnorm_rows<{_type_name(in_dtype)}, {_type_name(out_dtype)}>"


def rope_name(dtype: str) -> str:
    return f"rope_2d_inplace<{_type_name(dtype)}>"


def pos_emb_name(mode: str) -> str:
    return f"add_pos_emb<{2 if mode == 'bilinear' else 4}>"


def merge_name(in_dtype: str, out_dtype: str) -> str:
    return f"tpool_merge<{_type_name(in_dtype)}, {_type_name(out_dtype)}>"


DTYPES = ("float32", "bfloat16")


def specs_by_source(specs: list[KernelSpec]) -> dict[str, list[KernelSpec]]:
    """Group specs by file (one NVRTC program per file)."""
    out: dict[str, list[KernelSpec]] = {}
    for s in specs:
        out.setdefault(s.source, []).append(s)
    return out
