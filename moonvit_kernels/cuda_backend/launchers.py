"""Python launchers for the CUDA C kernels in `moonvit_kernels/cuda_backend`, through CuPy.

Every launcher checks what CuPy does not (dtype, C-contiguity, shapes, the current device, the
alignment of every pointer a kernel reads or writes in vectors or pairs, the device's shared
memory) and raises a ValueError naming the array or limit, then casts every scalar argument
explicitly (np.int32 / np.float32: CuPy passes a Python int as 64 bits, which a kernel's `int`
parameter would misread). A misaligned vector access on the GPU is a sticky error that ends the
CUDA context of the whole process, so those checks happen on the host, before the launch.

bfloat16 arrays: CuPy has no bfloat16 dtype, so bf16 tensors are `cupy.uint16` arrays holding the
bf16 bit patterns (`to_bf16` / `from_bf16` convert). A dtype "name" below is "float32" or
"bfloat16". CuPy is imported lazily: this module imports without it, and the host-side index
tables (`token_positions`, `merge_sources`, `cu_seqlens_int32`, from `moonvit_kernels.packing`) need only NumPy.

Modules are compiled by NVRTC on first use (`cupy.RawModule`, template kernels through
`name_expressions`) with the same source text and options as the compile check
(`moonvit_kernels.tools.nvrtc_check`; CuPy appends `-ftz=true`, already in
`sources.compile_options`), with the CUDA headers of CuPy's own NVRTC major, and cached by CuPy on
disk. Everything cached per process (compute capability, shared-memory limit, modules, kernels
with their raised dynamic-shared-memory attribute) is keyed by the current device id, so each GPU
of a multi-GPU machine gets its own.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from moonvit_kernels import packing, registry
from moonvit_kernels.cuda_backend import rehearsal
from moonvit_kernels.cuda_backend import sources as kcuda

FLOAT32 = "float32"
BFLOAT16 = "bfloat16"
DTYPE_NAMES = (FLOAT32, BFLOAT16)
LOG2E = 1.4426950408889634


# The device API the launchers run on: CuPy, or a stand-in with CuPy's interface pushed here (the CPU
# emulator, `emulation.device.activated()`), so that tests run these very launchers without a GPU.
_DEVICE_APIS: list[Any] = []


def push_device_api(api: Any) -> None:
    """Run the launchers on `api` (a module with CuPy's interface) until `pop_device_api`."""
    _DEVICE_APIS.append(api)


def pop_device_api() -> None:
    _DEVICE_APIS.pop()


def _cupy() -> Any:
    if _DEVICE_APIS:
        return _DEVICE_APIS[-1]
    try:
        import cupy
    except ImportError as e:
        raise ImportError("the CUDA C kernels need CuPy: pip install -e '.[cuda13]' (or '.[cuda12]')") from e
    return cupy


def array_module() -> Any:
    """The array library these launchers take and return: CuPy, or the active emulated device."""
    return _cupy()


def is_emulated() -> bool:
    """True when the launchers run on the CPU emulator's device."""
    return bool(getattr(_cupy(), "EMULATED", False))


# ============================================================================ host-side index tables
# (one definition, in moonvit_kernels.packing; the names the CUDA C backend has always used)
cu_seqlens_int32 = packing.cu_seqlens
token_positions = packing.token_positions
merge_sources = packing.merge_sources


# ============================================================================ bf16 on the device
def to_bf16(x: Any) -> Any:
    """float32 CuPy array -> bf16 bits (uint16), round to nearest even, NaN kept as NaN."""
    cp = _cupy()
    x = cp.ascontiguousarray(x, dtype=cp.float32)
    u = x.view(cp.uint32)
    bits = ((u + cp.uint32(0x7FFF) + ((u >> 16) & cp.uint32(1))) >> 16).astype(cp.uint16)
    return cp.where(cp.isnan(x), cp.uint16(0x7FC0), bits)


def from_bf16(bits: Any) -> Any:
    """bf16 bits (uint16 CuPy array) -> float32 (exact)."""
    cp = _cupy()
    return (cp.ascontiguousarray(bits).astype(cp.uint32) << 16).view(cp.float32)


def dtype_name(a: Any) -> str:
    """ "float32" for float32 arrays, "bfloat16" for uint16 (bf16 bits); ValueError otherwise."""
    dt = np.dtype(a.dtype)
    if dt == np.float32:
        return FLOAT32
    if dt == np.uint16:
        return BFLOAT16
    raise ValueError(f"dtype {dt} is neither float32 nor bfloat16 (uint16 bits)")


def _storage_dtype(name: str) -> Any:
    if name not in DTYPE_NAMES:
        raise ValueError(f"dtype must be one of {DTYPE_NAMES}, got {name!r}")
    return np.float32 if name == FLOAT32 else np.uint16


# ============================================================================ checks
def device_pointer(a: Any) -> int:
    """The device address of array `a`: CuPy's `a.data.ptr`, else `__cuda_array_interface__["data"][0]`."""
    data = getattr(a, "data", None)
    if data is not None and hasattr(data, "ptr"):
        return int(data.ptr)
    return int(a.__cuda_array_interface__["data"][0])


def check_aligned(what: str, ptr: int, alignment: int, why: str) -> None:
    """ValueError naming `what` unless device address `ptr` is a multiple of `alignment` bytes (`why`: the
    accesses that need it). Pure host arithmetic: nothing reaches the GPU, whose misaligned-address
    fault would end the process's CUDA context."""
    if ptr % alignment:
        raise ValueError(
            f"{what} starts at device address {ptr:#x}, which is not {alignment}-byte aligned as {why} need "
            f"(offset {ptr % alignment} B); pass a fresh array or a view starting at a multiple of {alignment} bytes"
        )


def _device_array(a: Any, what: str, ndim: int, dtypes: tuple[str, ...] | None = None) -> str:
    """Check a CuPy array's kind, device, rank, dtype (names), C-contiguity and element alignment;
    return its dtype name."""
    cp = _cupy()
    if not isinstance(a, cp.ndarray):
        raise ValueError(f"{what} must be a CuPy array on the GPU, got {type(a).__name__}")
    if a.device.id != _device_id():
        raise ValueError(f"{what} lives on device {a.device.id} but the current device is {_device_id()}")
    if a.ndim != ndim:
        raise ValueError(f"{what} must be {ndim}-D, got shape {a.shape}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous (got strides {a.strides}); use cupy.ascontiguousarray")
    check_aligned(what, device_pointer(a), a.dtype.itemsize, "element accesses")
    if dtypes is None:
        return ""
    try:
        name = dtype_name(a)
    except ValueError:
        name = str(a.dtype)
    if name not in dtypes:
        raise ValueError(f"{what} has dtype {a.dtype}, expected {' or '.join(dtypes)} (bfloat16 = uint16 bits)")
    return name


def _int_array(a: Any, what: str, shape: tuple[int | None, ...]) -> None:
    cp = _cupy()
    if not isinstance(a, cp.ndarray) or a.dtype != cp.int32 or not a.flags.c_contiguous:
        raise ValueError(f"{what} must be a C-contiguous int32 CuPy array")
    if a.device.id != _device_id():
        raise ValueError(f"{what} lives on device {a.device.id} but the current device is {_device_id()}")
    check_aligned(what, device_pointer(a), 4, "int32 loads")
    if a.ndim != len(shape) or any(s is not None and s != d for s, d in zip(shape, a.shape, strict=True)):
        raise ValueError(f"{what} has shape {a.shape}, expected {tuple('*' if s is None else s for s in shape)}")


def _aligned(*arrays: Any, to: int = 16) -> bool:
    return all(device_pointer(a) % to == 0 for a in arrays)


def _vector_bytes(dtype: str, n: int) -> int:
    """Bytes of an `n`-element vector access in `dtype` (its alignment requirement)."""
    return n * (4 if dtype == FLOAT32 else 2)


# ============================================================================ the current device
def _device_id() -> int:
    """The current CUDA device (cudaGetDevice)."""
    return int(_cupy().cuda.runtime.getDevice())


def _api_name() -> str:
    api = _cupy()
    return getattr(api, "__name__", type(api).__name__)


def _device_key() -> tuple[str, int]:
    """(device API, current device): every per-process cache below is keyed by it."""
    return _api_name(), _device_id()


def _compute_capability(device_id: int) -> int:
    """Compute capability of device `device_id` as an int (90 for sm_90)."""
    return _cached_capability(_api_name(), device_id)


@functools.cache
def _cached_capability(api: str, device_id: int) -> int:
    return int(_cupy().cuda.Device(device_id).compute_capability)


# cudaDevAttrMaxSharedMemoryPerBlockOptin in the CUDA runtime's cudaDeviceAttr enum
_ATTR_SMEM_OPTIN = 97


def _optin_smem(device_id: int) -> int:
    """Shared memory one block may use on device `device_id` after opting in, bytes (read from the device)."""
    return _cached_optin_smem(_api_name(), device_id)


@functools.cache
def _cached_optin_smem(api: str, device_id: int) -> int:
    rt = _cupy().cuda.runtime
    attr = getattr(rt, "cudaDevAttrMaxSharedMemoryPerBlockOptin", _ATTR_SMEM_OPTIN)
    return int(rt.deviceGetAttribute(attr, device_id))


def _nvrtc_major() -> int | None:
    """Major version of the NVRTC CuPy compiles with (its headers must match), None when CuPy cannot say."""
    return _cached_nvrtc_major(_api_name())


@functools.cache
def _cached_nvrtc_major(api: str) -> int | None:
    try:
        return int(_cupy().cuda.nvrtc.getVersion()[0])
    except Exception:  # an old CuPy without the query: let the header search take any version
        return None


def require_sm80() -> None:
    """RuntimeError unless the current GPU is sm_80 or newer (bf16 mma.sync, ldmatrix, cp.async)."""
    dev = _device_id()
    cc = _compute_capability(dev)
    if cc < 80:
        raise RuntimeError(
            f"the CUDA C kernels need compute capability >= 8.0 (Ampere, Hopper), device {dev} is sm_{cc}"
        )


def check_attention_supported(head_dim: int, dtype: str) -> None:
    """ValueError unless attention at `head_dim` in `dtype` fits the current device's opt-in shared
    memory per block (read from the device; `sources.SUPPORTED_HEAD_DIMS` lists it per architecture)."""
    _storage_dtype(dtype)
    dev = _device_id()
    where = f"device {dev} (sm_{_compute_capability(dev)})"
    kcuda.check_attention_fits(head_dim, dtype, _optin_smem(dev), where)


# ============================================================================ modules
@functools.cache
def _module(device: tuple[str, int], source: str, names: tuple[str, ...]) -> Any:
    """The RawModule of `source` for `device` (API, id; called while it is current)."""
    cp = _cupy()
    require_sm80()
    if not is_emulated():
        from moonvit_kernels.cuda_backend.toolchain import check_toolchain

        check_toolchain()  # one clear message when a pip compiler is ahead of the driver
    options = kcuda.compile_options(_nvrtc_major())
    if is_emulated() and rehearsal.on():  # the build a GPU makes (CuPy's pipeline), then the emulator's
        rehearsal.cupy_build(source, kcuda.load_source(source), kcuda.compile_options(_real_cupy_nvrtc_major()), names)
    return cp.RawModule(code=kcuda.load_source(source), options=options, name_expressions=names)


def _real_cupy_nvrtc_major() -> int | None:
    """The NVRTC major of the installed CuPy (not of the emulated device), for a rehearsed GPU build."""
    try:
        import cupy

        return int(cupy.cuda.nvrtc.getVersion()[0])
    except Exception:  # no CuPy: the rehearsal says so itself
        return None


@functools.cache
def _kernel(device: tuple[str, int], source: str, name: str, head_dim: int = 128) -> tuple[Any, kcuda.KernelSpec]:
    """The compiled kernel `name` from `source` on `device` (API, id: the current one) and its catalogue
    entry, looked up once per device; the newest version that replaces it runs instead (`registry.running`).
    Kernels needing more than 48 KB of dynamic shared memory get the attribute raised on that device."""
    specs = [s for s in registry.kernel_specs((head_dim,)) if s.source == source]
    spec = next((s for s in specs if s.name == name), None)
    if spec is None:
        raise ValueError(f"{name} is not an instantiation of {source} in the kernel catalogue")
    spec = registry.running(spec.label).spec
    kernel = _module(device, source, tuple(s.name for s in specs)).get_function(spec.name)
    if spec.dynamic_smem > 48 * 1024:
        kernel.max_dynamic_shared_size_bytes = spec.dynamic_smem
    return kernel, spec


def _grid(n: int, what: str, limit: int = 65535) -> int:
    if n > limit:
        raise ValueError(f"{what}: {n} blocks exceed the grid limit {limit}")
    return n


# ============================================================================ GEMM
def gemm(
    a: Any,
    b: Any,
    *,
    epilogue: str = "none",
    residual: Any = None,
    out: Any = None,
    out_dtype: str = FLOAT32,
) -> Any:
    """`C[M, N] = epilogue(a[M, K] · b[N, K]ᵀ)`, `b` in nn.Linear layout [out, in].

    a, b bfloat16 (uint16 bits): tensor-core kernel (gemm_bf16.cu), fp32 accumulation, output
    float32 or bfloat16. a, b float32: SIMT kernel (gemm_fp32.cu), output float32.
    epilogue: "none", "gelu_tanh", "gelu_erf", or "residual" (C = residual + a·bᵀ; `residual` is
    [M, N] in the output dtype and may be `out` itself for an in-place update). Returns `out`."""
    cp = _cupy()
    if epilogue not in kcuda.EPILOGUES:
        raise ValueError(f"unknown epilogue {epilogue!r}; choose from {', '.join(kcuda.EPILOGUES)}")
    a_dt = _device_array(a, "gemm: a", 2, DTYPE_NAMES)
    b_dt = _device_array(b, "gemm: b", 2, DTYPE_NAMES)
    if a_dt != b_dt:
        raise ValueError(f"gemm: a is {a_dt} but b is {b_dt}; both must be float32 or both bfloat16")
    (M, K), (N, Kb) = a.shape, b.shape
    if K != Kb:
        raise ValueError(f"gemm: a {a.shape} and b {b.shape} disagree on K (b is [N, K], nn.Linear layout)")
    if min(M, N, K) < 1:
        raise ValueError(f"gemm: empty operand (M={M}, N={N}, K={K})")
    if out is not None:
        out_dtype = _device_array(out, "gemm: out", 2, DTYPE_NAMES)
        if out.shape != (M, N):
            raise ValueError(f"gemm: out has shape {out.shape}, expected {(M, N)}")
    _storage_dtype(out_dtype)
    if a_dt == FLOAT32 and out_dtype != FLOAT32:
        raise ValueError("gemm: the fp32 kernel writes float32 only")
    if epilogue == "residual":
        if residual is None:
            raise ValueError("gemm: epilogue 'residual' needs residual=[M, N]")
        r_dt = _device_array(residual, "gemm: residual", 2, (out_dtype,))
        if residual.shape != (M, N) or r_dt != out_dtype:
            raise ValueError(f"gemm: residual must be [{M}, {N}] {out_dtype}, got {residual.shape} {r_dt}")
    elif residual is not None:
        raise ValueError(f"gemm: residual given but epilogue is {epilogue!r}")
    if a_dt == BFLOAT16 and N % 2 == 0:  # the epilogue stores (and reads residual) in pairs of columns
        pair = _vector_bytes(out_dtype, 2)
        why = "the bf16 GEMM's paired stores (float2 / bf16x2, N even)"
        if out is not None:
            check_aligned("gemm: out", device_pointer(out), pair, why)
        if residual is not None:
            check_aligned("gemm: residual", device_pointer(residual), pair, why)
    if out is None:
        out = cp.empty((M, N), dtype=_storage_dtype(out_dtype))
    r = residual if residual is not None else out  # unread unless the epilogue is "residual"

    dev = _device_key()
    if a_dt == BFLOAT16:  # a and b: 16-byte cp.async chunks when aligned, else the scalar path
        kernel, spec = _kernel(dev, "gemm_bf16.cu", kcuda.gemm_bf16_name(out_dtype, epilogue))
        vec = K % 8 == 0 and _aligned(a, b)
        grid = (_grid(-(-N // 128), "gemm N tiles", 2**31 - 1), _grid(-(-M // 128), "gemm M tiles"))
    else:  # a and b: float4 loads when aligned, else scalar; C as float4 when N % 4 == 0 and aligned (kernel checks)
        kernel, spec = _kernel(dev, "gemm_fp32.cu", kcuda.gemm_fp32_name(epilogue))
        vec = K % 4 == 0 and _aligned(a, b)
        grid = (_grid(-(-N // 64), "gemm N tiles", 2**31 - 1), _grid(-(-M // 64), "gemm M tiles"))
    kernel(grid, (spec.threads,), (a, b, out, r, np.int32(M), np.int32(N), np.int32(K), np.int32(vec)))
    return out


# ============================================================================ RMSNorm
def rmsnorm(
    x: Any, weight: Any, eps: float, *, out: Any = None, out_dtype: str = FLOAT32, return_rstd: bool = False
) -> Any:
    """`out[r, :] = x[r, :] · rsqrt(mean(x[r, :]²) + eps) · weight` in fp32 over rows of `x [rows, D]`.

    x float32 or bfloat16, weight float32 [D]; `out` may be `x` when the dtypes match. With
    `return_rstd`, returns `(out, rstd [rows] float32)`."""
    cp = _cupy()
    in_dt = _device_array(x, "rmsnorm: x", 2, DTYPE_NAMES)
    _device_array(weight, "rmsnorm: weight", 1, (FLOAT32,))
    rows, D = x.shape
    if weight.shape != (D,):
        raise ValueError(f"rmsnorm: weight has shape {weight.shape}, expected ({D},)")
    if rows < 1 or D < 1:
        raise ValueError(f"rmsnorm: empty input {x.shape}")
    if not (isinstance(eps, (int, float, np.floating)) and eps > 0):
        raise ValueError(f"rmsnorm: eps must be a positive number, got {eps!r}")
    if out is not None:
        out_dtype = _device_array(out, "rmsnorm: out", 2, DTYPE_NAMES)
        if out.shape != x.shape:
            raise ValueError(f"rmsnorm: out has shape {out.shape}, expected {x.shape}")
    else:
        out = cp.empty((rows, D), dtype=_storage_dtype(out_dtype))
    if D % 4 == 0:  # the kernel reads and writes rows four elements per access
        why = "the kernel's 4-wide accesses (D % 4 == 0)"
        check_aligned("rmsnorm: x", device_pointer(x), _vector_bytes(in_dt, 4), why)
        check_aligned("rmsnorm: weight", device_pointer(weight), _vector_bytes(FLOAT32, 4), why)
        check_aligned("rmsnorm: out", device_pointer(out), _vector_bytes(out_dtype, 4), why)
    rstd = cp.empty((rows,), dtype=cp.float32)
    kernel, spec = _kernel(_device_key(), "rmsnorm.cu", kcuda.rmsnorm_name(in_dt, out_dtype))
    kernel(
        (_grid(rows, "rmsnorm rows", 2**31 - 1),), (spec.threads,), (x, weight, out, rstd, np.int32(D), np.float32(eps))
    )
    return (out, rstd) if return_rstd else out


# ============================================================================ RoPE
def rope_inplace(qkv: Any, token_pos: Any, freqs: Any, num_heads: int, head_dim: int) -> Any:
    """Rotate q and k of the packed `qkv [L, 3·Q]` in place (2D RoPE, interleaved pairs; v untouched).

    token_pos: `[L, 4]` int32 from `token_positions`; freqs: float32 `[head_dim/4]`,
    `f_i = 10000^(−4i/hd)` (`reference.rope_frequencies`). Returns qkv."""
    dt = _device_array(qkv, "rope: qkv", 2, DTYPE_NAMES)
    if head_dim % 4 or head_dim < 4 or num_heads < 1:
        raise ValueError(f"rope: head_dim={head_dim} must be a positive multiple of 4, num_heads={num_heads} >= 1")
    L, width = qkv.shape
    if width != 3 * num_heads * head_dim:
        raise ValueError(f"rope: qkv has {width} columns, expected 3·heads·head_dim = {3 * num_heads * head_dim}")
    _int_array(token_pos, "rope: token_pos", (L, 4))
    _device_array(freqs, "rope: freqs", 1, (FLOAT32,))
    if freqs.shape != (head_dim // 4,):
        raise ValueError(f"rope: freqs has shape {freqs.shape}, expected ({head_dim // 4},)")
    check_aligned("rope: qkv", device_pointer(qkv), _vector_bytes(dt, 4), "the kernel's 4-wide loads and stores")
    total = L * 2 * num_heads * (head_dim // 4)
    kernel, spec = _kernel(_device_key(), "rope.cu", kcuda.rope_name(dt))
    blocks = _grid(-(-total // spec.threads), "rope blocks", 2**31 - 1)
    kernel(
        (blocks,),
        (spec.threads,),
        (qkv, token_pos, freqs, np.int32(L), np.int32(num_heads), np.int32(head_dim)),
    )
    return qkv


# ============================================================================ attention
def attention(
    qkv: Any, cu_seqlens: Any, num_heads: int, head_dim: int, cu_seqlens_device: Any = None
) -> tuple[Any, Any]:
    """Packed non-causal attention over `qkv [L, 3·Q]` (after RoPE), items given by `cu_seqlens`.

    cu_seqlens: NumPy int array `[N + 1]` from 0 to L (it is checked on the host, then uploaded;
    pass the same values as an int32 CuPy array in `cu_seqlens_device` to skip the upload).
    bfloat16 qkv: tensor-core flash kernel; float32: the SIMT one. Scale 1/sqrt(head_dim),
    softmax in fp32. Returns `(out [L, Q] in qkv's dtype, lse [L, heads] float32)`, lse the
    natural-log log-sum-exp of the scaled scores."""
    cp = _cupy()
    dt = _device_array(qkv, "attention: qkv", 2, DTYPE_NAMES)
    check_attention_supported(head_dim, dt)
    if num_heads < 1:
        raise ValueError(f"attention: num_heads={num_heads} must be >= 1")
    L, width = qkv.shape
    Q = num_heads * head_dim
    if width != 3 * Q:
        raise ValueError(f"attention: qkv has {width} columns, expected 3·heads·head_dim = {3 * Q}")
    cu = np.asarray(cu_seqlens)
    if cu.ndim != 1 or cu.size < 2 or not np.issubdtype(cu.dtype, np.integer):
        raise ValueError(f"attention: cu_seqlens must be a 1-D integer NumPy array [N + 1], got {cu.shape} {cu.dtype}")
    if cu[0] != 0 or cu[-1] != L or np.any(np.diff(cu) < 1):
        raise ValueError(f"attention: cu_seqlens must rise strictly from 0 to L={L}, got {cu.tolist()[:8]}...")
    if dt == BFLOAT16:
        check_aligned("attention: qkv", device_pointer(qkv), 16, "the bf16 kernel's 16-byte cp.async loads")
    n_items = cu.size - 1
    max_len = int(np.max(np.diff(cu)))
    out = cp.empty((L, Q), dtype=_storage_dtype(dt))
    lse = cp.empty((L, num_heads), dtype=cp.float32)
    kernel, spec = _kernel(_device_key(), "attention.cu", kcuda.attention_name(head_dim, dt), head_dim)
    rows_per_block = 64 if dt == BFLOAT16 else 16  # BQ of AttnBf16Cfg / AttnFp32Cfg
    grid = (
        _grid(-(-max_len // rows_per_block), "attention query tiles", 2**31 - 1),
        _grid(num_heads, "attention heads"),
        _grid(n_items, "attention items"),
    )
    scale_log2 = np.float32(LOG2E / math.sqrt(head_dim))
    if cu_seqlens_device is None:
        cu_seqlens_device = cp.asarray(cu, dtype=cp.int32)
    else:
        _int_array(cu_seqlens_device, "attention: cu_seqlens_device", (cu.size,))
    kernel(
        grid,
        (spec.threads,),
        (qkv, out, lse, cu_seqlens_device, np.int32(num_heads), scale_log2),
        shared_mem=spec.dynamic_smem,
    )
    return out, lse


# ============================================================================ position embedding
def add_position_embedding_inplace(
    x: Any, token_pos: Any, grid_thws: Any, pos_weight: Any, time_table: Any, mode: str
) -> Any:
    """`x [L, D] += resize(pos_weight [H0, W0, D])[row, col] (+ time_table[frame] for videos)`, in place.

    token_pos `[L, 4]` and grid_thws `[N, 3]` int32 CuPy arrays; time_table float32 `[T0, D]`
    (`reference.time_sincos_table`); mode "bilinear" or "bicubic". Returns x."""
    _device_array(x, "pos_emb: x", 2, (FLOAT32,))
    L, D = x.shape
    _device_array(pos_weight, "pos_emb: pos_weight", 3, (FLOAT32,))
    H0, W0, Dw = pos_weight.shape
    if Dw != D:
        raise ValueError(f"pos_emb: pos_weight {pos_weight.shape} does not end in D={D}")
    _device_array(time_table, "pos_emb: time_table", 2, (FLOAT32,))
    if time_table.shape[1] != D:
        raise ValueError(f"pos_emb: time_table {time_table.shape} is not [T0, {D}]")
    _int_array(token_pos, "pos_emb: token_pos", (L, 4))
    _int_array(grid_thws, "pos_emb: grid_thws", (None, 3))
    if mode not in ("bilinear", "bicubic"):
        raise ValueError(f"pos_emb: mode must be 'bilinear' or 'bicubic', got {mode!r}")
    kernel, spec = _kernel(_device_key(), "pos_emb.cu", kcuda.pos_emb_name(mode))
    kernel(
        (_grid(L, "pos_emb tokens", 2**31 - 1),),
        (spec.threads,),
        (x, token_pos, grid_thws, pos_weight, time_table, np.int32(D), np.int32(H0), np.int32(W0)),
    )
    return x


# ============================================================================ merge
def tpool_merge(x: Any, merge_src: Any, merge_kernel_size: tuple[int, int], out_dtype: str = FLOAT32) -> Any:
    """Mean over frames + kh x kw gather: `x [L, D]` -> `[M, kh·kw·D]` (slot-major), M = rows of
    `merge_src` (`merge_sources`). x float32 or bfloat16."""
    cp = _cupy()
    in_dt = _device_array(x, "merge: x", 2, DTYPE_NAMES)
    kh, kw = (int(k) for k in merge_kernel_size)
    _int_array(merge_src, "merge: merge_src", (None, 4))
    M, D = merge_src.shape[0], x.shape[1]
    if M < 1 or kh < 1 or kw < 1:
        raise ValueError(f"merge: nothing to merge (M={M}, merge_kernel_size={(kh, kw)})")
    out = cp.empty((M, kh * kw * D), dtype=_storage_dtype(out_dtype))
    kernel, spec = _kernel(_device_key(), "merge.cu", kcuda.merge_name(in_dt, out_dtype))
    kernel(
        (_grid(M, "merge tokens", 2**31 - 1),),
        (spec.threads,),
        (x, out, merge_src, np.int32(D), np.int32(kh), np.int32(kw)),
    )
    return out
