"""Section (b): every kernel version timed against its baseline, and its timed output re-checked.

A `KernelCase` holds one kernel at one shape: `run()` (what is timed), `check(go)` (resets the
inputs and poisons the outputs, calls `go()` to run the kernel once — `run` itself, or `run`
under a timer when that single run is also the timed one — and compares the result with a
float64 NumPy computation on a sample of rows: GEMM rows and attention query rows are
independent, so a row sample checks them exactly), the work (FLOPs or bytes moved, with the
formula), the baseline it is compared with (`baselines.Baselines`), the arrays it writes, and what
the X-ray needs for its bound (`model.xray_bound`: catalogue label, FLOPs, compulsory DRAM bytes).

Each stage has one function here that makes its case for every backend (`gemm_case`, `attention_case`,
`rmsnorm_case`, `rope_case`, `pos_emb_case`, `merge_case`); a backend brings its arrays (`NumbaArrays`,
`XpArrays`), its launch and the names its report rows carry (`Names`). FLOPs and bytes come from
`moonvit_kernels.launch_model` at the case's sizes (`case_sizes`). `numba_cases` lists the numba.cuda kernels
(device arrays; a GPU or the simulator), `cuda_cases` the CUDA C kernels through a launcher module with the
API of `cuda_backend.launchers` (CuPy on a GPU, `emulation.OnEmulator(launchers)` on the CPU), `hopper_cases`
the Hopper kernels (gemm_bf16_sm90 at both tile widths, flash_attn_sm90) through `hopper_launchers` (sm_90
GPUs) or `emulation.hopper`. All yield `(name, case)` pairs: a `Case` knows its report fields (`info`) at once
and allocates nothing until it is called, so that nothing is allocated before the section's budget allows it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from moonvit_kernels import launch_model as lm
from moonvit_kernels import reference as ref
from moonvit_kernels import registry
from moonvit_kernels.checks import (
    attention_want,
    bf16_round,
    gemm_want,
    merge_want,
    random,
    rel_err,
    rope_want,
    sample_rows,
    to_host,
)
from moonvit_kernels.config import VisionConfig
from moonvit_kernels.weights import float32_to_bf16_bits

TOL_FP32 = 1e-4  # max|got − want| / max|want| for fp32 outputs (fp32 accumulation over K <= 4096)
TOL_BF16_ACC = 1e-3  # bf16 operands (rounded values used by the reference too), fp32 output
TOL_BF16_OUT = 1e-2  # bf16 outputs: rounding of the output, 2^-9 relative, plus accumulation

F32, BF16 = "float32", "bfloat16"
_BYTES = {F32: 4, BF16: 2}
_SHORT = {F32: "f32", BF16: "bf16"}
POSITIONS_BYTES = 16  # token_positions [L, 4] int32, per token: the CUDA C rope reads it


# ============================================================================ what a case is
@dataclass(frozen=True)
class Info:
    """A case's report fields, known before anything is allocated."""

    item: str
    backend: str
    dtype: str
    shape: str
    tokens: int
    work: float
    unit: str  # "TFLOP/s" or "GB/s"
    formula: str
    baseline: tuple[Any, ...]  # arguments of Baselines.get
    model: tuple[str, float, float]  # (X-ray catalogue label, FLOPs, compulsory DRAM bytes) of one call


@dataclass(frozen=True)
class KernelCase(Info):
    run: Callable[[], Any]
    check: Callable[[Callable[[], Any]], tuple[float, float]]  # check(go): reset, go() runs the kernel, compare
    outputs: Callable[[], list[Any]]  # the arrays the last run wrote (for --inject-fault wrong)


Built = tuple[Callable[[], Any], Callable[[Callable[[], Any]], tuple[float, float]], Callable[[], list[Any]]]


@dataclass(frozen=True)
class Case:
    """`info` now; `arrays()` (which allocates the inputs and returns run, check, outputs) when called."""

    info: Info
    arrays: Callable[[], Built]

    def __call__(self) -> KernelCase:
        run, check, outputs = self.arrays()
        return KernelCase(**vars(self.info), run=run, check=check, outputs=outputs)


Builder = Callable[[], KernelCase]


@dataclass(frozen=True)
class Names:
    """How one backend's report names a case (item, backend, dtype column, X-ray catalogue label), the seed of
    its random inputs, and its shape column where the stage's usual one is not it."""

    item: str
    backend: str
    dtype: str
    xray: str
    seed: int
    shape: str = ""


# ============================================================================ sizes and work
def grid_tokens(grid: np.ndarray) -> int:
    """Tokens of a grid_thws [N, 3]: Σ t·h·w."""
    return int(np.sum(np.prod(grid, axis=1)))


def case_sizes(c: VisionConfig, grid: np.ndarray) -> lm.Sizes:
    """The launch model's sizes of a case: config `c`'s widths at the grid's tokens."""
    return lm.Sizes.of(c, grid_tokens(grid))


def gemm_shapes(c: VisionConfig, L: int) -> dict[str, tuple[int, int, int, str]]:
    """name -> (M, N, K, epilogue) of the model's GEMMs for L tokens (projector on L/4 merged tokens)."""
    D, Q, I, T, P = c.vt_hidden_size, c.qkv_hidden_size, c.vt_intermediate_size, c.text_hidden_size, c.patch_dim
    Km = c.merged_hidden_size
    M4 = max(1, L // (c.merge_kernel_size[0] * c.merge_kernel_size[1]))
    return {
        "patch_embed": (L, D, P, "none"),
        "qkv": (L, 3 * Q, D, "none"),
        "wo+residual": (L, D, Q, "residual"),
        "fc0+gelu_tanh": (L, I, D, "gelu_tanh"),
        "fc1+residual": (L, D, I, "residual"),
        "proj0+gelu_erf": (M4, Km, Km, "gelu_erf"),
        "proj2": (M4, T, Km, "none"),
    }


def _flops_info(n: Names, shape: str, L: int, model: lm.Model, formula: str, baseline: tuple[Any, ...]) -> Info:
    """A compute-bound case: its rate counts the model's FLOPs; the X-ray's bound takes its FLOPs and DRAM bytes."""
    bound = (n.xray, model.flops, float(model.dram_bytes))
    return Info(n.item, n.backend, n.dtype, n.shape or shape, L, model.flops, "TFLOP/s", formula, baseline, bound)


def _bytes_info(n: Names, shape: str, L: int, model: lm.Model, nbytes: float, formula: str) -> Info:
    """A memory-bound case: its rate counts `nbytes` (`formula`), compared with a device-to-device copy of as
    many bytes; the X-ray's bound takes the model's FLOPs and `nbytes`."""
    nbytes = int(nbytes)
    bound = (n.xray, model.flops, float(nbytes))
    return Info(
        n.item, n.backend, n.dtype, n.shape or shape, L, nbytes, "GB/s", f"{formula} B", ("copy", nbytes), bound
    )


def _tol(dtype: str) -> float:
    """The tolerance of an output in `dtype` computed from operands it holds exactly."""
    return TOL_BF16_OUT if dtype == BF16 else TOL_FP32


def _nan_if_not_finite(*errors: float) -> float:
    """The largest of `errors`, NaN when any is not finite."""
    return max(errors) if math.isfinite(sum(errors)) else float("nan")


# ============================================================================ arrays
class NumbaArrays:
    """numba device arrays (a GPU or the simulator), float32."""

    def __init__(self) -> None:
        from numba import cuda

        self.cuda = cuda

    def up(self, a: np.ndarray, dtype: str) -> tuple[Any, np.ndarray]:
        """`a` (float32) on the device, and the values it holds."""
        if dtype != F32:
            raise ValueError(f"the numba kernels take float32, not {dtype}")
        return self.cuda.to_device(a), a

    def poison(self, shape: tuple[int, ...], dtype: str) -> Any:
        """A device array of `shape` full of NaN."""
        return self.cuda.to_device(np.full(shape, np.nan, np.float32))

    def fill(self, dst: Any, src: Any) -> None:
        """`dst[...] = src` (a host or device array)."""
        dst.copy_to_device(src)

    def copy(self, a: Any) -> Any:
        """A new device array holding `a`."""
        out = self.cuda.device_array_like(a)
        out.copy_to_device(a)
        return out

    def host(self, a: Any) -> np.ndarray:
        return a.copy_to_host()


class XpArrays:
    """Arrays of `xp` (CuPy, or the emulator's array module); bf16 as uint16 bits."""

    def __init__(self, xp: Any) -> None:
        self.xp = xp

    def up(self, a: np.ndarray, dtype: str) -> tuple[Any, np.ndarray]:
        """`a` on the device in `dtype` (bf16 = uint16 bits) and the values it holds (float32 host)."""
        if dtype == BF16:
            return self.xp.asarray(float32_to_bf16_bits(a)), bf16_round(a)
        return self.xp.array(a, dtype=np.float32, copy=True), a  # a copy: NumPy (the emulator) would alias

    def poison(self, shape: tuple[int, ...], dtype: str) -> Any:
        """A device array of `shape` full of NaN in `dtype`."""
        if dtype == BF16:
            return self.xp.asarray(np.full(shape, 0x7FC0, np.uint16))
        return self.xp.asarray(np.full(shape, np.nan, np.float32))

    def fill(self, dst: Any, src: Any) -> None:
        """`dst[...] = src` (a host or device array)."""
        dst[...] = self.xp.asarray(src)

    def copy(self, a: Any) -> Any:
        """A new device array holding `a`."""
        return a.copy()

    def host(self, a: Any) -> np.ndarray:
        return to_host(a)


# ============================================================================ one function per stage
# Each takes the backend's arrays `arr`, its `Names` and `bind`: called with the case's device arrays when the
# case is built, `bind` returns the call that runs the backend's kernel once on them.
def gemm_case(
    arr: Any,
    n: Names,
    bind: Callable[..., Callable[[], Any]],
    shape: tuple[int, int, int, str],
    L: int,
    operands: str,
    out_dtype: str,
) -> Case:
    """C[M, N] = epilogue(A[M, K]·B[N, K]ᵀ) at `shape` = (M, N, K, epilogue), B in nn.Linear layout, operands and
    C in the given dtypes (a residual is read from C); `bind(a, b, epilogue, residual, out)`."""
    M, N, K, epi = shape
    model = lm.gemm_mnk(M, N, K, epi, _BYTES[operands], _BYTES[out_dtype])
    kind = "gemm_bf16" if operands == BF16 else "gemm_fp32"
    info = _flops_info(n, f"{M}x{N}x{K}", L, model, f"2·{M}·{N}·{K}", (kind, M, N, K))
    tol = TOL_FP32 if operands == F32 else (TOL_BF16_OUT if out_dtype == BF16 else TOL_BF16_ACC)

    def arrays() -> Built:
        rng = np.random.default_rng(n.seed)
        a_d, a = arr.up(random(rng, (M, K)), operands)
        b_d, b = arr.up(random(rng, (N, K), 1 / math.sqrt(K)), operands)
        r = random(rng, (M, N), 2.0) if epi == "residual" else None
        out = arr.poison((M, N), out_dtype) if r is None else arr.up(r, F32)[0]
        run = bind(a_d, b_d, epi, None if r is None else out, out)

        def check(go: Callable[[], Any]) -> tuple[float, float]:
            arr.fill(out, arr.poison((M, N), out_dtype) if r is None else r)
            go()
            rows = sample_rows(M)
            want = gemm_want(a[rows], b, epi, None if r is None else r[rows])
            return rel_err(arr.host(out)[rows], want), tol

        return run, check, lambda: [out]

    return Case(info, arrays)


def attention_case(arr: Any, n: Names, bind: Callable[[Any], Callable[[], Any]], at: lm.Sizes, dtype: str) -> Case:
    """Attention over one item of L tokens, `qkv [L, 3Q]` in `dtype`; `bind(qkv)`'s call returns (o, lse)."""
    L, H, hd, Q = at.tokens, at.heads, at.head_dim, at.qkv
    model = lm.attention(_BYTES[dtype], None, at=at)
    info = _flops_info(n, f"L={L} H={H} hd={hd}", L, model, f"4·{L}²·{Q}", ("attention", L, H, hd, dtype))

    def arrays() -> Built:
        rng = np.random.default_rng(n.seed)
        qkv_d, qkv = arr.up(random(rng, (L, 3 * Q)), dtype)
        once = bind(qkv_d)
        result: dict[str, Any] = {}

        def run() -> Any:
            result["o"], result["lse"] = once()

        def check(go: Callable[[], Any]) -> tuple[float, float]:
            go()
            rows = sample_rows(L, 32)
            want_o, want_lse = attention_want(qkv, [0, L], H, hd, rows)
            err_o = rel_err(arr.host(result["o"])[rows], want_o)
            err_l = rel_err(arr.host(result["lse"])[rows], want_lse)
            return _nan_if_not_finite(err_o, err_l), _tol(dtype)

        return run, check, lambda: [result["o"]]

    return Case(info, arrays)


def rmsnorm_case(
    arr: Any,
    n: Names,
    bind: Callable[[Any, Any, Any], Callable[[], Any]],
    c: VisionConfig,
    at: lm.Sizes,
    out_dtype: str,
) -> Case:
    """RMSNorm of `x [L, D]` float32 into `out [L, D]` in `out_dtype`; `bind(x, weight, out)`. Its rate counts
    the launch model's bytes less the rstd [L] fp32 the kernel also writes."""
    L, D = at.tokens, at.hidden
    model = lm.rmsnorm(4, _BYTES[out_dtype], at)
    formula = f"{L}·{D}·(4+{_BYTES[out_dtype]})+{D}·4"
    info = _bytes_info(n, f"{L}x{D}", L, model, model.dram_bytes - 4 * L, formula)

    def arrays() -> Built:
        rng = np.random.default_rng(n.seed)
        x_d, x = arr.up(random(rng, (L, D), 1.5), F32)
        w = (1 + 0.25 * rng.standard_normal(D)).astype(np.float32)
        out = arr.poison((L, D), out_dtype)
        run = bind(x_d, arr.up(w, F32)[0], out)

        def check(go: Callable[[], Any]) -> tuple[float, float]:
            arr.fill(out, arr.poison((L, D), out_dtype))
            go()
            return rel_err(arr.host(out), ref.rmsnorm(x.astype(np.float64), w, c.vit_norm_eps)), _tol(out_dtype)

        return run, check, lambda: [out]

    return Case(info, arrays)


def rope_case(
    arr: Any,
    n: Names,
    bind: Callable[[Any], Callable[[], Any]],
    at: lm.Sizes,
    grid: np.ndarray,
    dtype: str,
    table_bytes: int = 0,
) -> Case:
    """2D RoPE in place on q and k of `qkv [L, 3Q]` in `dtype`; `bind(qkv)`. Its rate counts the launch model's
    bytes plus `table_bytes` per token of an index table the launch reads."""
    L, H, hd, Q = at.tokens, at.heads, at.head_dim, at.qkv
    model = lm.rope(_BYTES[dtype], at)
    formula = f"2·{L}·2·{Q}·{_BYTES[dtype]}" + (f"+{L}·{table_bytes}" if table_bytes else "")
    info = _bytes_info(n, f"{L}x{3 * Q}", L, model, model.dram_bytes + table_bytes * L, formula)

    def arrays() -> Built:
        rng = np.random.default_rng(n.seed)
        start, qkv = arr.up(random(rng, (L, 3 * Q)), dtype)
        work = arr.copy(start)
        run = bind(work)

        def check(go: Callable[[], Any]) -> tuple[float, float]:
            arr.fill(work, start)
            go()
            return rel_err(arr.host(work), rope_want(qkv, grid, H, hd)), _tol(dtype)

        return run, check, lambda: [work]

    return Case(info, arrays)


def pos_emb_case(
    arr: Any,
    n: Names,
    bind: Callable[[Any, Any], Callable[[], Any]],
    c: VisionConfig,
    at: lm.Sizes,
    grid: np.ndarray,
) -> Case:
    """`x [L, D] += resize(pos_weight)` in place, float32; `bind(x, pos_weight)`. Its rate counts the launch
    model's bytes less the position-embedding table's (x read and written)."""
    L, D = at.tokens, at.hidden
    model = lm.pos_emb(c.pos_emb_interpolation_mode, at)
    info = _bytes_info(n, f"{L}x{D}", L, model, model.dram_bytes - 4 * at.grid_h * at.grid_w * D, f"2·{L}·{D}·4")

    def arrays() -> Built:
        rng = np.random.default_rng(n.seed)
        start, x = arr.up(random(rng, (L, D)), F32)
        work = arr.copy(start)
        pos_w = (0.5 * rng.standard_normal((c.init_pos_emb_height, c.init_pos_emb_width, D))).astype(np.float32)
        run = bind(work, arr.up(pos_w, F32)[0])

        def check(go: Callable[[], Any]) -> tuple[float, float]:
            arr.fill(work, start)
            go()
            want = x.astype(np.float64) + ref.position_embedding(grid, pos_w.astype(np.float64), c)
            return rel_err(arr.host(work), want), TOL_FP32

        return run, check, lambda: [work]

    return Case(info, arrays)


def merged_rows(grid: np.ndarray, merge_kernel_size: tuple[int, int]) -> int:
    """Rows of the merge's output: Σ (h / kh)·(w / kw) over the grid's items."""
    kh, kw = merge_kernel_size
    return int(sum((h // kh) * (w // kw) for _, h, w in grid.tolist()))


def merge_case(
    arr: Any,
    n: Names,
    bind: Callable[[Any], tuple[Callable[[], Any], Any]],
    c: VisionConfig,
    at: lm.Sizes,
    grid: np.ndarray,
    out_dtype: str,
) -> Case:
    """The kh x kw merge gather `x [L, D]` float32 -> `[M, kh·kw·D]` in `out_dtype`; `bind(x)` returns the call
    (which returns the output) and the output it writes into (poisoned before a check), or None when each call
    makes a new one."""
    L, D = at.tokens, at.hidden
    model = lm.merge(4, _BYTES[out_dtype], at)
    info = _bytes_info(n, f"{L}x{D}", L, model, model.dram_bytes, f"{L}·{D}·(4+{_BYTES[out_dtype]})")

    def arrays() -> Built:
        rng = np.random.default_rng(n.seed)
        x_d, x = arr.up(random(rng, (L, D)), F32)
        once, out = bind(x_d)
        result: dict[str, Any] = {}

        def run() -> Any:
            result["out"] = once()

        def check(go: Callable[[], Any]) -> tuple[float, float]:
            if out is not None:
                arr.fill(out, arr.poison(out.shape, out_dtype))
            go()
            return rel_err(arr.host(result["out"]), merge_want(x, grid, c.merge_kernel_size)), _tol(out_dtype)

        return run, check, lambda: [result["out"]]

    return Case(info, arrays)


# ============================================================================ numba.cuda kernels
def numba_cases(
    c: VisionConfig,
    grid: np.ndarray,
    gemm_names: tuple[str, ...],
    v1_threads: int | None,
    versions: tuple[int, ...],
    attention_versions: tuple[int, ...],
) -> Iterator[tuple[str, Case]]:
    """The numba kernels (fp32): GEMM `versions` per shape, attention `attention_versions`, rmsnorm, rope,
    pos_emb, merge."""
    from moonvit_kernels.numba_backend import attention as attention_k
    from moonvit_kernels.numba_backend import gemm as gemm_k
    from moonvit_kernels.numba_backend import merge as merge_k
    from moonvit_kernels.numba_backend import pos_emb as pos_emb_k
    from moonvit_kernels.numba_backend import rmsnorm as rmsnorm_k
    from moonvit_kernels.numba_backend import rope as rope_k
    from moonvit_kernels.numba_backend.launch import cu_seqlens_table, grid_table, item_table

    arr = NumbaArrays()
    at = case_sizes(c, grid)
    L, D, H, hd = at.tokens, at.hidden, at.heads, at.head_dim
    shapes = gemm_shapes(c, L)
    mks, mode = c.merge_kernel_size, c.pos_emb_interpolation_mode
    g32 = grid_table(grid)
    to_device = arr.cuda.to_device

    def names(item: str, xray: str, seed: int, shape: str = "") -> Names:
        return Names(item, "numba", F32, xray, seed, shape)

    for name in gemm_names:
        for v in versions:

            def gemm(a: Any, b: Any, epi: str, res: Any, out: Any, v: int = v) -> Callable[[], Any]:
                return lambda: gemm_k.gemm(a, b, epilogue=epi, residual=res, out=out, version=v)

            n = names(f"gemm v{v} {name}", f"gemm_v{v}_{shapes[name][3]}", 100 + v)
            yield f"numba gemm v{v} {name}", gemm_case(arr, n, gemm, shapes[name], L, F32, F32)

    for v in attention_versions:
        kw = {"threads": v1_threads} if (v == 1 and v1_threads) else {}

        def attention(qkv: Any, v: int = v, kw: dict = kw) -> Callable[[], Any]:
            cu = np.array([0, L], dtype=np.int32)
            return lambda: attention_k.attention(qkv, cu, H, version=v, **kw)

        n = names(f"attention v{v}", f"attention_v{v}", 200 + v)
        yield f"numba attention v{v}", attention_case(arr, n, attention, at, F32)

    def rmsnorm(x: Any, w: Any, out: Any) -> Callable[[], Any]:
        return lambda: rmsnorm_k.rmsnorm(x, w, c.vit_norm_eps, out=out)

    yield "numba rmsnorm", rmsnorm_case(arr, names("rmsnorm", "rmsnorm_kernel_t256", 300), rmsnorm, c, at, F32)

    def rope(qkv: Any) -> Callable[[], Any]:
        g_d, cu_d = to_device(g32), to_device(cu_seqlens_table(g32))
        return lambda: rope_k.rope2d(qkv, g_d, cu_d, H, hd)

    n = names("rope (q, k in place)", "rope2d_kernel", 301)
    yield "numba rope", rope_case(arr, n, rope, at, grid, F32)

    def pos_emb(x: Any, pos_w: Any) -> Callable[[], Any]:
        t_d, items_d = to_device(pos_emb_k.time_table(D, c.init_pos_emb_time)), to_device(item_table(g32))
        return lambda: pos_emb_k.add_position_embedding(x, pos_w, t_d, items_d, mode=mode)

    n = names("pos_emb (x in place)", f"add_pos_emb_{mode}", 302)
    yield "numba pos_emb", pos_emb_case(arr, n, pos_emb, c, at, grid)

    M, width = merged_rows(grid, mks), mks[0] * mks[1] * D

    def merge(x: Any) -> tuple[Callable[[], Any], Any]:
        items_d, out = to_device(item_table(g32, mks)), arr.poison((M, width), F32)
        return (lambda: merge_k.merge_gather(x, items_d, mks, M, out=out)), out

    n = names("merge", "merge_gather_kernel", 303, f"{L}x{D} -> {M}x{width}")
    yield "numba merge", merge_case(arr, n, merge, c, at, grid, F32)


# ============================================================================ CUDA C kernels
def _gemm_out_dtype(name: str, operands: str, epi: str) -> str:
    """The output dtype the backend gives GEMM `name` (fp32 for the residual stream, patch and proj2)."""
    if operands == F32 or epi == "residual" or name in ("patch_embed", "proj2"):
        return F32
    return BF16


def cuda_cases(k: Any, c: VisionConfig, grid: np.ndarray, gemm_names: tuple[str, ...]) -> Iterator[tuple[str, Case]]:
    """The CUDA C kernels through launcher module `k`: bf16 GEMM per shape, fp32 GEMM, attention
    bf16/fp32, rmsnorm fp32->bf16, rope bf16, pos_emb, merge fp32->bf16."""
    xp = k.array_module()
    arr = XpArrays(xp)
    at = case_sizes(c, grid)
    L, D, H, hd = at.tokens, at.hidden, at.heads, at.head_dim
    shapes = gemm_shapes(c, L)
    mks, mode = c.merge_kernel_size, c.pos_emb_interpolation_mode

    def names(item: str, dtype: str, xray: str, seed: int) -> Names:
        return Names(item, "CUDA C", dtype, registry.running(xray).label, seed)  # the version the launcher runs

    for name, operands in [(name, BF16) for name in gemm_names] + [("qkv", F32)]:
        epi = shapes[name][3]
        out = _gemm_out_dtype(name, operands, epi)
        xray = f"gemm_bf16_tc_{_SHORT[out]}_{epi}" if operands == BF16 else f"gemm_fp32_simt_{epi}"
        n = names(f"gemm_{'bf16' if operands == BF16 else 'fp32'} {name}", f"{operands}->{out}", xray, 400)
        yield f"cuda gemm {operands} {name}", gemm_case(arr, n, _xp_gemm(k.gemm, out), shapes[name], L, operands, out)

    for dtype in (BF16, F32):
        n = names(f"attention_{dtype}", dtype, f"flash_attn_{_SHORT[dtype]}_hd{hd}", 500)
        yield f"cuda attention {dtype}", attention_case(arr, n, _xp_attention(k.attention, xp, at), at, dtype)

    def rmsnorm(x: Any, w: Any, out: Any) -> Callable[[], Any]:
        return lambda: k.rmsnorm(x, w, c.vit_norm_eps, out=out, out_dtype=BF16)

    n = names("rmsnorm fp32->bf16", f"{F32}->{BF16}", "rmsnorm_rows_f32_bf16", 600)
    yield "cuda rmsnorm", rmsnorm_case(arr, n, rmsnorm, c, at, BF16)

    def rope(qkv: Any) -> Callable[[], Any]:
        tp, freqs = xp.asarray(k.token_positions(grid)), xp.asarray(ref.rope_frequencies(hd, dtype=np.float32))
        return lambda: k.rope_inplace(qkv, tp, freqs, H, hd)

    n = names("rope bf16 (q, k in place)", BF16, "rope_2d_inplace_bf16", 601)
    yield "cuda rope", rope_case(arr, n, rope, at, grid, BF16, POSITIONS_BYTES)

    def pos_emb(x: Any, pos_w: Any) -> Callable[[], Any]:
        tp, g_d = xp.asarray(k.token_positions(grid)), xp.asarray(grid.astype(np.int32))
        time_tab = xp.asarray(ref.time_sincos_table(D, c.init_pos_emb_time).astype(np.float32))
        return lambda: k.add_position_embedding_inplace(x, tp, g_d, pos_w, time_tab, mode)

    n = names("pos_emb (x in place)", F32, f"add_pos_emb_{mode}", 602)
    yield "cuda pos_emb", pos_emb_case(arr, n, pos_emb, c, at, grid)

    def merge(x: Any) -> tuple[Callable[[], Any], None]:
        sources = xp.asarray(k.merge_sources(grid, mks))
        return (lambda: k.tpool_merge(x, sources, mks, BF16)), None

    n = names("merge fp32->bf16", f"{F32}->{BF16}", "tpool_merge_f32_bf16", 603)
    yield "cuda merge", merge_case(arr, n, merge, c, at, grid, BF16)


def _xp_gemm(gemm: Callable[..., Any], out_dtype: str) -> Callable[..., Callable[[], Any]]:
    """`bind` for a GEMM with the launchers' signature, writing `out_dtype`."""

    def bind(a: Any, b: Any, epi: str, res: Any, out: Any) -> Callable[[], Any]:
        return lambda: gemm(a, b, epilogue=epi, residual=res, out=out, out_dtype=out_dtype)

    return bind


def _xp_attention(attention: Callable[..., Any], xp: Any, at: lm.Sizes) -> Callable[[Any], Callable[[], Any]]:
    """`bind` for an attention with the launchers' signature: one item of all L tokens."""
    bounds = np.array([0, at.tokens], dtype=np.int64)

    def bind(qkv: Any) -> Callable[[], Any]:
        bounds_dev = xp.asarray(bounds.astype(np.int32))  # uploaded once, as the backend does per forward
        return lambda: attention(qkv, bounds, at.heads, at.head_dim, cu_seqlens_device=bounds_dev)

    return bind


# ============================================================================ Hopper (sm_90a) kernels
def hopper_cases(
    hk: Any, c: VisionConfig, grid: np.ndarray, gemm_names: tuple[str, ...], block_ns: tuple[int, ...] = (128, 256)
) -> Iterator[tuple[str, Case]]:
    """The Hopper kernels through `hk` (hopper_launchers on a GPU, emulation.hopper on the CPU): bf16
    gemm_bf16_sm90 per shape (K % 8 == 0 only) and tile width, then flash_attn_sm90 (head_dim <= 128),
    checked like the mma.sync kernels and against the same baselines (cuBLAS, SDPA)."""
    arr = XpArrays(hk.array_module())
    at = case_sizes(c, grid)
    shapes = gemm_shapes(c, at.tokens)
    for name in gemm_names:
        K, epi = shapes[name][2:]
        if K % 8:  # the tensor maps need 16-byte rows; the backend takes gemm_bf16_tc there
            continue
        out = _gemm_out_dtype(name, BF16, epi)
        for bn in block_ns:

            def gemm(*args: Any, bn: int = bn, **kwargs: Any) -> Any:
                return hk.gemm(*args, block_n=bn, **kwargs)

            xray = f"gemm_bf16_sm90_bn{bn}_{_SHORT[out]}_{epi}"
            n = Names(f"gemm_bf16_sm90 bn{bn} {name}", "CUDA C", f"{BF16}->{out}", xray, 400)
            yield (
                f"hopper gemm bn{bn} {name}",
                gemm_case(arr, n, _xp_gemm(gemm, out), shapes[name], at.tokens, BF16, out),
            )
    if at.head_dim % 8 == 0 and at.head_dim <= 128:
        n = Names("flash_attn_sm90", "CUDA C", BF16, f"flash_attn_sm90_hd{at.head_dim}", 500)
        yield "hopper attention", attention_case(arr, n, _xp_attention(hk.attention, arr.xp, at), at, BF16)
