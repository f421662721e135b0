"""CuPy launchers for the Hopper kernels (gemm_bf16_sm90.cu, flash_attn_sm90.cu) — NOT YET RUN ON A GPU.

Same API as `launchers.gemm` / `launchers.attention` for bf16 operands. Differences from the
mma.sync launchers:
- the kernels need sm_90a (wgmma, setmaxnreg), so each file is compiled here by NVRTC for sm_90a
  to a cubin (`nvrtc.compile_text` with the run-time options, `sources.runtime_options`) and
  loaded with `cupy.RawModule(path=...)`; kernels are looked up by their mangled names (on the CPU
  emulator's device the source itself is built);
- the operands are passed as tensor maps (`tensor_maps.encode`: the driver's encoder on a GPU, the
  emulator's model of it on the CPU), by value, as 64-byte aligned 128-byte structs (a NumPy
  structured scalar; CuPy passes structs by value);
- the blocks use more than 48 KB of dynamic shared memory (`max_dynamic_shared_size_bytes`).
Use them only behind `selfcheck.FirstUseCheck` (trusted side: the mma.sync launchers) on devices
of compute capability 9.0. `SMEM_BYTES` mirror the kernels' configs (checked against the emulator).
"""

from __future__ import annotations

import functools
import os
import tempfile
from typing import Any

import numpy as np

from moonvit_kernels import registry
from moonvit_kernels.cuda_backend import launchers, nvrtc, rehearsal, tensor_maps
from moonvit_kernels.cuda_backend import sources as kcuda

GEMM_SOURCE, ATTENTION_SOURCE = "gemm_bf16_sm90.cu", "flash_attn_sm90.cu"
GEMM_THREADS, ATTENTION_THREADS = 384, 256
ATTENTION_HEAD_DIMS = tuple(range(8, 129, 8))
MAPS_KEPT = 256  # encoded tensor maps kept (a K3 forward meets ~10 distinct buffers per layer shape)


def array_module() -> Any:
    """The launchers' device API (`launchers.array_module`: CuPy, or the CPU emulator's device)."""
    return launchers.array_module()


def gemm_smem_bytes(block_n: int) -> int:
    """GemmSm90Cfg<BN>::SMEM_BYTES (`sources.gemm_sm90_smem_bytes`)."""
    return kcuda.gemm_sm90_smem_bytes(block_n)


def attention_smem_bytes(head_dim: int) -> int:
    """AttnSm90Cfg<HD>::SMEM_BYTES (`sources.attention_sm90_smem_bytes`)."""
    return kcuda.attention_sm90_smem_bytes(head_dim)


def gemm_name(out_dtype: str, epilogue: str, block_n: int = 128) -> str:
    return kcuda.gemm_sm90_name(out_dtype, epilogue, block_n)


def attention_name(head_dim: int) -> str:
    return kcuda.attention_sm90_name(head_dim)


def gemm_names() -> tuple[str, ...]:
    return tuple(gemm_name(o, e, bn) for bn in (128, 256) for o in ("float32", "bfloat16") for e in kcuda.EPILOGUES)


# ptxas logs (registers, spills) of the Hopper modules this process built, by source: gpu_check reports them
BUILD_LOGS: dict[str, str] = {}


def _regs_at_entry(name: str) -> int | None:
    """Registers per thread the kernel `name` starts with (its catalogue bound: __launch_bounds__ decides it)."""
    return next((s.max_registers for s in registry.hopper_specs(ATTENTION_HEAD_DIMS) if s.name == name), None)


@functools.cache
def _module(device: tuple[str, int], source: str, names: tuple[str, ...]) -> tuple[Any, dict[str, str]]:
    """(RawModule, {name expression: symbol}) of `source` built for sm_90a, for `device` (API, id).

    On a GPU: NVRTC compiles a cubin with the run-time options (`sources.runtime_options`), loaded
    by `RawModule(path=...)`, kernels found by their mangled names. On the emulated device the same
    source text goes to the emulator, which builds it against its sm_90a models — the GEMM with all its
    instantiations in one library (one g++ build of the 16 takes about 3x one of a single instantiation, and the
    tests ask for all 16)."""
    cp = array_module()
    if launchers.is_emulated():
        if rehearsal.on():  # the build a GPU makes, its cubin not loaded; then the emulator's
            _rehearse_build(source, names)
        built = gemm_names() if source == GEMM_SOURCE and set(names) <= set(gemm_names()) else names
        module = cp.RawModule(
            code=kcuda.load_source(source), options=(f"-arch={kcuda.HOPPER_ARCH}",), name_expressions=built,
            regs_at_entry=_regs_at_entry,
        )  # fmt: skip
        return module, {n: n for n in names}
    path, lowered = _build_cubin(source, names)
    return cp.RawModule(path=path), lowered


def _rehearse_build(source: str, names: tuple[str, ...]) -> None:
    """`_build_cubin` as on a GPU, the cubin then deleted (`rehearsal`); noted as not rehearsed without NVRTC."""
    what = f"nvrtc.compile_text {source} {', '.join(names)} ({kcuda.HOPPER_ARCH})"
    try:
        nvrtc.nvrtc_version()
    except Exception as e:  # a base install: no NVRTC library to build with
        rehearsal.record(what, f"not rehearsed: NVRTC is not available ({e})")
        return
    path, _ = _build_cubin(source, names)
    rehearsal.record(what, f"built: {os.path.getsize(path)} B cubin")
    os.unlink(path)


def _build_cubin(source: str, names: tuple[str, ...]) -> tuple[str, dict[str, str]]:
    """NVRTC's sm_90a cubin of `source` with the run-time options, written to a temporary file: (its path,
    {name expression: mangled name}); its ptxas log is kept in BUILD_LOGS."""
    cubin, log, lowered = nvrtc.compile_text(kcuda.load_source(source), source, names, kcuda.HOPPER_ARCH, strict=False)
    BUILD_LOGS[source] = log
    fd, path = tempfile.mkstemp(suffix=f".{source}.sm_90a.cubin")
    with os.fdopen(fd, "wb") as f:
        f.write(cubin)
    return path, lowered


def _kernel(source: str, name: str, names: tuple[str, ...], smem: int) -> Any:
    """The kernel `name` of `source` on the current device, its dynamic shared memory limit raised to `smem`."""
    return _device_kernel(launchers._device_key(), source, name, names, smem)


@functools.cache
def _device_kernel(device: tuple[str, int], source: str, name: str, names: tuple[str, ...], smem: int) -> Any:
    """`_kernel` looked up once per device: the attribute is a driver call, not a per-launch cost."""
    module, lowered = _module(device, source, names)
    kernel = module.get_function(lowered[name])
    kernel.max_dynamic_shared_size_bytes = smem
    return kernel


@functools.cache
def _map_dtype(api: str) -> np.dtype:
    return array_module().make_aligned_dtype(np.dtype([("opaque", np.uint64, (16,))]), alignment=64)


def _encoder() -> Any:
    """The final step of tensor-map encoding: the driver's entry point, or the emulator's model of it."""
    return array_module().tensor_map_encoder() if launchers.is_emulated() else None


def _map_arg(m: tensor_maps.TiledMap, address: int) -> Any:
    """The tensor map as a by-value kernel argument (a 128-byte struct aligned to 64)."""
    if address % 16:
        raise ValueError(f"tensor maps need 16-byte aligned global addresses, got {address:#x}")
    return _encoded_map(launchers._device_key(), m, address)


@functools.lru_cache(maxsize=MAPS_KEPT)
def _encoded_map(device: tuple[str, int], m: tensor_maps.TiledMap, address: int) -> Any:
    """`_map_arg`, encoded once per (device, map, address): a map is a function of these alone, and a forward
    meets the same buffers again (the memory pool hands them back), so encoding on every launch costs only host
    time. The H200 run (benchmarks/results/H200-2026-12-04-full) measured the Hopper launches at 53-125 µs of
    host time per call against 18-74 µs for the mma.sync ones, and the 448² tower slower with them (14.1 ms)
    than without (10.8 ms)."""
    words = tensor_maps.encode(m, address, _encoder())
    return np.frombuffer(words.tobytes(), dtype=_map_dtype(array_module().__name__))[0]  # read-only bytes


def _check_bf16(*arrays: Any) -> None:
    for a in arrays:
        if a.dtype != np.uint16 or not a.flags.c_contiguous:
            raise ValueError("the Hopper kernels take C-contiguous bf16 arrays (uint16 bits)")


def check_gemm_args(a: Any, b: Any, epilogue: str, residual: Any, out: Any, out_dtype: str, block_n: int) -> None:
    """ValueError naming the problem unless gemm_bf16_sm90 can take these arguments: bf16 C-contiguous
    a [M, K] and b [N, K] with K % 8 == 0, a known epilogue, residual [M, N] exactly when the epilogue
    is "residual" (in the output dtype), out [M, N] float32 or bf16, block_n 128 or 256. Host-side
    only (array attributes), so it runs before anything reaches the GPU."""
    _check_bf16(a, b)
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"gemm: a and b must be 2-D, got {a.shape} and {b.shape}")
    (M, K), (N, Kb) = a.shape, b.shape
    if Kb != K:
        raise ValueError(f"gemm: inner dimensions differ (A has K={K}, B has K={Kb})")
    if epilogue not in kcuda.EPILOGUES:
        raise ValueError(f"unknown epilogue {epilogue!r}; choose from {', '.join(kcuda.EPILOGUES)}")
    if block_n not in kcuda.HOPPER_GEMM_BLOCK_N:
        raise ValueError(f"gemm_bf16_sm90 tiles are {kcuda.HOPPER_GEMM_BLOCK_N} columns wide, not {block_n}")
    tensor_maps.gemm_operand_map(M, K)  # K % 8 == 0, non-empty
    if out is not None:
        if out.shape != (M, N) or out.dtype not in (np.float32, np.uint16) or not out.flags.c_contiguous:
            raise ValueError(f"gemm: out must be C-contiguous [{M}, {N}] float32 or bf16, got {out.shape} {out.dtype}")
        out_dtype = "float32" if out.dtype == np.float32 else "bfloat16"
    if out_dtype not in ("float32", "bfloat16"):
        raise ValueError(f"gemm: out_dtype must be 'float32' or 'bfloat16', got {out_dtype!r}")
    if (epilogue == "residual") != (residual is not None):
        raise ValueError(f"gemm: residual must be given exactly for the 'residual' epilogue (epilogue={epilogue!r})")
    if residual is not None:
        want = np.float32 if out_dtype == "float32" else np.uint16
        if residual.shape != (M, N) or residual.dtype != want or not residual.flags.c_contiguous:
            raise ValueError(f"gemm: residual must be C-contiguous [{M}, {N}] {out_dtype}, got {residual.shape}")


def check_attention_args(qkv: Any, cu_seqlens: Any, num_heads: int, head_dim: int) -> np.ndarray:
    """ValueError naming the problem unless flash_attn_sm90 can take these arguments: bf16 C-contiguous
    qkv [L, 3·num_heads·head_dim], head_dim a multiple of 8 up to 128, cu_seqlens non-decreasing from
    0 to L. Returns cu_seqlens as int32 (host)."""
    _check_bf16(qkv)
    if head_dim not in ATTENTION_HEAD_DIMS:
        raise ValueError(f"flash_attn_sm90 supports head dims {ATTENTION_HEAD_DIMS[0]}..128 in steps of 8")
    if qkv.ndim != 2 or qkv.shape[1] != 3 * num_heads * head_dim:
        raise ValueError(f"qkv has shape {qkv.shape}; expected [L, {3 * num_heads * head_dim}] columns (3·H·hd)")
    cu = np.asarray(cu_seqlens.get() if hasattr(cu_seqlens, "get") else cu_seqlens).astype(np.int64)
    if cu.ndim != 1 or cu.size < 2 or cu[0] != 0 or cu[-1] != qkv.shape[0] or np.any(np.diff(cu) < 0):
        raise ValueError(f"cu_seqlens must rise from 0 to L={qkv.shape[0]}, got {cu.tolist()[:8]}")
    return cu.astype(np.int32)


def gemm(a, b, *, epilogue="none", residual=None, out=None, out_dtype="float32", block_n: int = 128):
    """C = epilogue(a·bᵀ) by gemm_bf16_sm90 (bf16 a [M, K], b [N, K], K % 8 == 0); see launchers.gemm."""
    check_gemm_args(a, b, epilogue, residual, out, out_dtype, block_n)
    cp = array_module()
    M, K = a.shape
    N = b.shape[0]
    map_a = _map_arg(tensor_maps.gemm_operand_map(M, K), a.data.ptr)
    map_b = _map_arg(tensor_maps.gemm_operand_map(N, K, block_n), b.data.ptr)
    if out is None:
        out = cp.empty((M, N), dtype=cp.float32 if out_dtype == "float32" else cp.uint16)
    r = out if residual is None else residual
    name = gemm_name("float32" if out.dtype == cp.float32 else "bfloat16", epilogue, block_n)
    smem = gemm_smem_bytes(block_n)
    kernel = _kernel(GEMM_SOURCE, name, (name,), smem)  # one instantiation per module: a short first build
    grid = ((N + block_n - 1) // block_n, (M + 127) // 128, 1)
    kernel(grid, (GEMM_THREADS, 1, 1), (map_a, map_b, out, r, np.int32(M), np.int32(N), np.int32(K)), shared_mem=smem)
    return out


def attention(qkv, cu_seqlens, num_heads, head_dim, cu_seqlens_device=None):
    """Packed non-causal attention by flash_attn_sm90 (bf16 qkv, head_dim % 8 == 0, <= 128); see launchers.attention."""
    cu_host = check_attention_args(qkv, cu_seqlens, num_heads, head_dim)
    cp = array_module()
    L = qkv.shape[0]
    cu = cp.asarray(cu_host) if cu_seqlens_device is None else cu_seqlens_device
    sw, raw = (_map_arg(m, qkv.data.ptr) for m in tensor_maps.attention_qkv_maps(L, num_heads, head_dim))
    out = cp.empty((L, num_heads * head_dim), dtype=cp.uint16)
    lse = cp.empty((L, num_heads), dtype=cp.float32)
    smem = attention_smem_bytes(head_dim)
    name = attention_name(head_dim)
    kernel = _kernel(ATTENTION_SOURCE, name, (name,), smem)
    grid = ((int(np.max(np.diff(cu_host))) + 63) // 64, num_heads, cu_host.size - 1)
    scale_log2 = np.float32(head_dim**-0.5 * 1.4426950408889634)
    kernel(grid, (ATTENTION_THREADS, 1, 1), (sw, raw, out, lse, cu, np.int32(num_heads), scale_log2), shared_mem=smem)
    return out, lse
