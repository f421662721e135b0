"""The one registry of kernel instantiations, numba and CUDA C (the sm_90a Hopper ones included).

Every tool derives its list from `REGISTRY`: the CUDA C catalogue (`cuda_backend.sources.kernel_specs`,
`hopper_specs`, `specs_for`), the numba compile tier (`tools.compile_check`) and the launch checks'
register tables (`numba_backend.registers`), the X-ray's model of each kernel (`tools.xray.catalogue.describe`)
and which trace stands for it (`tools.xray.jobs_numba`, `tools.xray.emulator_trace`), the kernel a CUDA C launcher
runs (`running`). Adding a kernel version means
writing the kernel and appending its entry here.

An entry (`KernelEntry`) says
  - what it is: `stage` (gemm, rmsnorm, rope, attention, merge, pos_emb, input_check), `version` (v1, v2, ...
    for numba, "CUDA bf16 tc", "CUDA sm90 wgmma", ...), `backend` ("numba" | "cuda"), `label` (the
    file-name-safe name of the cubins, the X-ray rows and the register tables; for numba the kernel's
    Python function name) and `specialisation` (what the label adds: epilogue, head dim, dtypes);
  - where its code is: CUDA C `source` (.cu file) and `name` (the C++ name expression, template arguments
    included) and `archs` (the only architectures it builds for; () = every one without an "a" suffix);
    `replaces`: the label of the CUDA C instantiation whose launches this newer version takes over (same file,
    same parameters and grid; its own block size and shared memory): the launchers run the newest
    (`running`), the older one stays compiled and listed;
    numba `module` (of numba_backend), `kernel` (the module attribute that gives the kernel: a function
    called with `args`, a dict indexed by them, or the kernel itself) and `signature` (the module attribute
    holding its numba signature);
  - how it launches at K3: `threads` per block and `dynamic_smem` bytes;
  - its register bound: `max_registers` (the compile tiers hold every build to it), `max_stack` (CUDA C
    stack frame allowed) and, for numba, `registers` per compiler (what ptxas reports: the launch checks'
    table, `registers_for`);
  - `model`: its FLOP / byte model at K3 sizes (`launch_model`);
  - `trace_job`: the X-ray trace that stands for it (None: untraced) and `trace_size` what that trace launches;
    `hot_loop`: its inner loops are held to the SASS budget per FFMA; `notebook`: the notebook whose
    prediction table lists it; `check`: the stage whose correctness check applies to it.

What a new kernel version needs besides its kernel file is its entry here (and its stage test): the compile
tiers, the register tables, the SASS budgets, the X-ray (model, trace), the notebooks' prediction tables and
gpu_check's timed versions (`versions`; a CUDA C version through the launchers, which run `running(label)`) all
read this list.

Attention entries of the CUDA C backend exist per head dim: `PerHeadDim` makes one for each head dim asked
(`entries(head_dims)`); every other entry is fixed. Nothing here imports numba or a CUDA compiler.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import launch_model as lm
from . import launch_rules
from .cuda_backend import sources as cu

BACKENDS = ("numba", "cuda")
STAGES = ("gemm", "rmsnorm", "rope", "attention", "merge", "pos_emb", "input_check")
COMPILERS = ("numba-cuda", "numba-cuda-mlir")  # numba_backend.compilers.COMPILERS (that module stays import-free)
NUMBA_PACKAGE = "moonvit_kernels.numba_backend"
# Every head dim the CUDA C attention kernels support somewhere: what `find` searches for a label.
ALL_HEAD_DIMS = tuple(range(8, cu.MAX_HEAD_DIM + 1, 8))


@dataclass(frozen=True)
class KernelEntry:
    """One kernel instantiation of either backend (see the module docstring for each field)."""

    backend: str
    stage: str
    version: str
    label: str
    threads: int
    max_registers: int
    model: lm.Model
    specialisation: str = ""
    dynamic_smem: int = 0
    max_stack: int = 0
    trace_job: str | None = None
    trace_size: tuple = ()  # what its trace job launches (per stage, see xray.jobs_numba); for the job's first entry
    hot_loop: bool = False  # its innermost FFMA loops are held to the SASS budget per FFMA (compile_check)
    notebook: str = ""  # the notebook whose X-ray prediction table lists it ("01".."06"; "" none)
    check: str = ""  # the check case: `checks.<check>_want` is the expected result (defaults to `stage`)
    # CUDA C
    source: str = ""
    name: str = ""
    archs: tuple[str, ...] = ()
    replaces: str = ""  # the label whose launch this newer version takes over (same file, same parameters)
    # numba
    module: str = ""
    kernel: str = ""
    args: tuple = ()
    signature: str = ""
    registers: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.check:
            object.__setattr__(self, "check", self.stage)
        where = f"registry entry {self.label or '(no label)'}"
        if self.backend not in BACKENDS:
            raise ValueError(f"{where}: backend {self.backend!r} is not one of {BACKENDS}")
        if self.stage not in STAGES:
            raise ValueError(f"{where}: stage {self.stage!r} is not one of {STAGES}")
        if not self.label or not self.label.replace("_", "").isalnum():
            raise ValueError(f"{where}: the label must be letters, digits and underscores (a file name)")
        if self.threads < 1 or not 1 <= self.max_registers <= 255:
            raise ValueError(f"{where}: threads={self.threads} must be >= 1, max_registers 1..255")
        if self.backend == "cuda":
            if self.source not in cu.SOURCES or not self.name:
                raise ValueError(f"{where}: a CUDA C entry needs a source in {cu.SOURCES} and a C++ name")
        elif self.replaces:
            raise ValueError(f"{where}: a numba version is chosen by its number, not by `replaces`")
        else:
            if not (self.module and self.kernel and self.signature):
                raise ValueError(f"{where}: a numba entry needs its module, kernel and signature attributes")
            missing = [c for c in COMPILERS if c not in self.registers]
            if missing:
                raise ValueError(f"{where}: no register count for {', '.join(missing)}")

    @property
    def spec(self) -> cu.KernelSpec:
        """The CUDA C entry as the compile tier and the launchers take it."""
        if self.backend != "cuda":
            raise ValueError(f"{self.label} is a {self.backend} kernel: it has no CUDA C KernelSpec")
        return cu.KernelSpec(
            self.source,
            self.name,
            self.threads,
            self.max_registers,
            self.dynamic_smem,
            self.max_stack,
            self.label,
            self.archs,
        )

    @property
    def module_path(self) -> str:
        """The numba entry's module, e.g. `moonvit_kernels.numba_backend.gemm`."""
        return f"{NUMBA_PACKAGE}.{self.module}"

    def dispatcher(self) -> Any:
        """The numba entry's kernel as its launcher calls it (a numba dispatcher); imports its module."""
        target = getattr(importlib.import_module(self.module_path), self.kernel)
        if isinstance(target, Mapping):
            return target[self.args[0] if len(self.args) == 1 else self.args]
        return target(*self.args) if self.args else target

    def python_function(self) -> Callable:
        """The numba entry's Python function (what `cuda.compile_ptx` takes); imports its module."""
        target = self.dispatcher()
        return getattr(target, "py_func", target)

    def want(self) -> Callable:
        """The float64 expected result of this entry's check case: `moonvit_kernels.checks.<check>_want`."""
        from . import checks

        want = getattr(checks, f"{self.check}_want", None)
        if want is None:
            raise ValueError(f"registry entry {self.label}: check case {self.check!r} has no checks.{self.check}_want")
        return want

    def numba_signature(self) -> str:
        """The numba entry's signature string, from its module."""
        return str(getattr(importlib.import_module(self.module_path), self.signature))


@dataclass(frozen=True)
class PerHeadDim:
    """Entries made per attention head dim: `make(hd)` (one or more, in order) for each head dim asked that
    `accepts(hd)` (which may raise ValueError for a head dim no GPU supports)."""

    make: Callable[[int], tuple[KernelEntry, ...]]
    accepts: Callable[[int], bool]


# ============================================================================ numba
# Registers per thread ptxas reports, per compiler: the largest over REGISTER_ARCHES and REGISTER_NVJITLINKS (13.0:
# the target tier, what a driver-580 machine has; 13.5: the main venv). The compile tiers check the toolchain they
# have: it must be one of these, no kernel may use more than its number, and none may sit more than
# REGISTER_SPREAD below it (a placeholder). Regenerate with
#     MOONVIT_NUMBA_COMPILER=numba-cuda-mlir python -m moonvit_kernels.tools.compile_check --json --arch sm_80
#     (and sm_89, sm_90; `--compiler each` builds with every installed compiler)
# The compile tier fails when a compiler reports more than its number or a compiled kernel lacks one; a number
# is raised only with the reason written beside it. numba-cuda-mlir 0.6 (first table) is above numba-cuda for
# gemm v1 (40 on sm_89: every index is multiplied by the array's run-time stride, even on a `::1` axis, so the
# unrolled k-loop keeps a pointer per load), merge, bilinear pos_emb (its own schedule; no spills); below it for
# bicubic pos_emb and attention v2.
NC, MLIR = COMPILERS
REGISTER_ARCHES = ("sm_80", "sm_89", "sm_90")
REGISTER_NVJITLINKS = ("13.0", "13.5")
# Which toolchains produced each compiler's numbers. numba-cuda's were re-measured with both nvJitLinks on every arch
# on 2026-12-04 and equal the max of those 6 builds for every kernel; CI measures them again (main venv: 13.5,
# sm_90; target tier: 13.0, sm_80 and sm_90). numba-cuda-mlir's come from its 0.6 builds, and CI cannot re-measure
# them (the GPU image has no numba-cuda-mlir): `pip install -e ".[compile,mlir]"` then
# `python -m moonvit_kernels.tools.compile_check --compiler each --arch ARCH` for each of REGISTER_ARCHES.
REGISTERS_MEASURED_WITH = {
    NC: "numba-cuda 0.30 with nvJitLink 13.0 and 13.5 on sm_80, sm_89, sm_90 (checked in CI)",
    MLIR: "numba-cuda-mlir 0.6 with nvJitLink 13.0 and 13.5 on sm_80, sm_89, sm_90 (not measurable in CI)",
}
# The widest measured gap between one build (toolchain, arch) and a kernel's number: gemm v3, 72 on sm_89 vs 96
REGISTER_SPREAD = 24
_NUMBA_GEMM_EPILOGUES = ("none", "gelu_tanh", "gelu_erf", "residual")  # numba_backend.gemm.EPILOGUES
# version: (tile_m, tile_n of the shared loads (gemm.TILES), threads per block, {compiler: registers}, trace M, N, K,
# register-blocked: its inner loop keeps the SASS budget per FFMA (compile_check --sass))
_NUMBA_GEMM = {
    1: (None, None, 256, {NC: 30, MLIR: 40}, (16, 16, 48), False),
    2: (16, 16, 256, {NC: 40, MLIR: 40}, (16, 16, 48), False),
    3: (64, 64, 256, {NC: 96, MLIR: 96}, (64, 64, 32), True),
}
_NUMBA_TOWER_GEMM = 3  # the version the numba tower runs (numba_backend.backend): the one notebooks 05, 06 predict
_TOWER_NOTEBOOK = {"gelu_erf": "05", "gelu_tanh": "06", "residual": "06"}  # the projector's GELU, the encoder's
_NUMBA_V1_THREADS = 128  # numba_backend.attention.V1_THREADS
_NUMBA_V2_BLOCK = (32, 16)  # numba_backend.attention.V2_BLOCK_Q, V2_BLOCK_K
_NUMBA_ATTENTION_REGISTERS = {  # (version, head_dim): {compiler: registers}
    # 48 -> 53 (sm_90): find_item's two-select update (which keeps numba-cuda-mlir out of local
    # memory) changes numba-cuda's allocation here; no spills, and 128 threads still fit 9 blocks per SM
    (1, 128): {NC: 53, MLIR: 49},
    (1, 24): {NC: 130, MLIR: 128},  # numba-cuda 129 -> 130: nvJitLink 13.0 on sm_89/sm_90 (13.5: 129)
    # numba-cuda 72 -> 80: nvJitLink 13.0 on sm_80 (13.5: 72), no spills; numba-cuda-mlir: 13.0 on sm_80 (13.5: 64)
    (2, 128): {NC: 80, MLIR: 71},
    (2, 24): {NC: 56, MLIR: 56},
}
_NUMBA_RMSNORM_THREADS = (32, 64, 128, 256)  # numba_backend.rmsnorm.BLOCK_SIZES; K3 (D = 1024) launches 256
_NUMBA_DEFAULT_MAX_REGISTERS = 128  # compile_check.DEFAULT_MAX_REGISTERS


def _numba(stage: str, label: str, threads: int, model: lm.Model, registers: dict[str, int], **kw: Any) -> KernelEntry:
    kw.setdefault("version", "v1")
    kw.setdefault("max_registers", _NUMBA_DEFAULT_MAX_REGISTERS)
    kw.setdefault("signature", "SIGNATURE")
    return KernelEntry("numba", stage, label=label, threads=threads, model=model, registers=registers, **kw)


def _numba_entries() -> list[KernelEntry]:
    out = []
    for v, (tile_m, tile_n, threads, regs, trace_mnk, blocked) in _NUMBA_GEMM.items():
        for ep in _NUMBA_GEMM_EPILOGUES:
            out.append(
                _numba(
                    "gemm", f"gemm_v{v}_{ep}", threads, lm.gemm(ep, 4, 4, tile_m, tile_n), regs, version=f"v{v}",
                    specialisation=ep, module="gemm", kernel="KERNELS", args=(v, ep), trace_job=f"gemm_v{v}",
                    trace_size=trace_mnk, hot_loop=blocked,
                    notebook="01" if ep == "none" else _TOWER_NOTEBOOK[ep] if v == _NUMBA_TOWER_GEMM else "",
                )
            )  # fmt: skip
    t1 = _NUMBA_V1_THREADS
    bq, bk = _NUMBA_V2_BLOCK
    for hd in (lm.HD, 24):  # K3's head dim, and the tiny config's (24: not a tile multiple)
        out.append(
            _numba(
                "attention", f"attention_v1_hd{hd}_t{t1}", t1, lm.attention_at(hd, 4, None),
                _NUMBA_ATTENTION_REGISTERS[(1, hd)], version="v1", specialisation=f"hd{hd} t{t1}",
                module="attention", kernel="attention_v1_kernel", args=(hd, t1), signature="SIGNATURE_V1",
                max_registers=launch_rules.max_registers_for(t1), trace_job="attention_v1" if hd == lm.HD else None,
                trace_size=(40,), notebook="04" if hd == lm.HD else "",
            )
        )  # fmt: skip
    for hd in (lm.HD, 24):
        out.append(
            _numba(
                "attention", f"attention_v2_hd{hd}_q{bq}_k{bk}", bq * bk,
                # the QK loop and the PV loop do L²·hd multiply-adds each
                lm.attention_at(hd, 4, bq, fma_shares=(0.5, 0.5)),
                _NUMBA_ATTENTION_REGISTERS[(2, hd)], version="v2", specialisation=f"hd{hd} q{bq} k{bk}",
                module="attention", kernel="attention_v2_kernel", args=(hd, bq, bk), signature="SIGNATURE_V2",
                max_registers=launch_rules.max_registers_for(bq * bk),
                trace_job="attention_v2" if hd == lm.HD else None, trace_size=(32,), hot_loop=True,
                notebook="04" if hd == lm.HD else "",
            )
        )  # fmt: skip
    for t in _NUMBA_RMSNORM_THREADS:
        out.append(
            _numba(
                "rmsnorm", f"rmsnorm_kernel_t{t}", t, lm.rmsnorm(4, 4).but(k3=t == 256), {NC: 40, MLIR: 40},
                specialisation=f"t{t}", module="rmsnorm", kernel="kernel_for", args=(t,), trace_job="rmsnorm",
                trace_size=(1024,), notebook="02" if t == 256 else "",
            )
        )  # fmt: skip
    out.append(
        _numba("rope", "rope2d_kernel", 128, lm.rope(4), {NC: 36, MLIR: 34}, module="rope", kernel="rope2d_kernel",
               trace_job="rope", trace_size=(12, 128), notebook="03")
    )  # fmt: skip
    out.append(
        _numba("merge", "merge_gather_kernel", 128, lm.merge(4, 4), {NC: 60, MLIR: 64},  # MLIR: 13.0, sm_80 (13.5: 63)
               module="merge", kernel="merge_gather_kernel", trace_job="merge", trace_size=(1024,), notebook="05")
    )  # fmt: skip
    for mode, regs in (("bilinear", {NC: 48, MLIR: 54}), ("bicubic", {NC: 80, MLIR: 62})):
        out.append(
            _numba("pos_emb", f"add_pos_emb_{mode}", 128, lm.pos_emb(mode), regs, specialisation=mode,
                   module="pos_emb", kernel="KERNELS", args=(mode,), trace_job=f"pos_emb_{mode}", trace_size=(1024,),
                   notebook="06" if mode == "bilinear" else "")
        )  # fmt: skip
    out.append(
        _numba("input_check", "first_nonfinite_row_kernel", 256, lm.input_check(), {NC: 30, MLIR: 30},
               module="input_check", kernel="first_nonfinite_row_kernel")
    )  # fmt: skip
    return out


# ============================================================================ CUDA C
# Register bounds, from the occupancy each kernel is designed for (`launch_rules`: registers go to warps
# in units of 256, 16,384 per SM sub-partition): the GEMMs run 256 threads with 2 blocks per SM, 4 warps
# per sub-partition -> <= 4,096 per warp = 128 per thread. The bf16 attention's shared memory
# decides its occupancy: at hd 128 a block takes 87,040 B + 1,024 B the system reserves per block,
# so an SM holds 2 blocks on sm_90 (228 KB = 233,472 B per SM) but only 1 on sm_80 (164 KB =
# 167,936 B < 2 x 88,064 B) and sm_86/89 (100 KB); 2 blocks of 4 warps at 255 registers (8,192 per
# warp, 2 warps per sub-partition) fit the register file, so it may use up to 255, the hardware cap (it
# keeps Q fragments, O and S accumulators in registers). The memory-bound kernels stay small.
REG_GEMM_BF16 = 128
REG_GEMM_FP32 = 128
REG_ATTN_BF16 = 255
REG_ATTN_FP32 = 128
REG_SMALL = 64
# __launch_bounds__(384, 1): 168, the most with which 12 warps launch (3 per SM sub-partition, 5,376 registers
# per warp: `launch_rules`); setmaxnreg redistributes them
REG_GEMM_SM90 = launch_rules.max_registers_for(384)
# __launch_bounds__(256, 2): two blocks of 8 warps share an SM, so each thread may hold what 512 threads can
REG_ATTN_SM90 = launch_rules.max_registers_for(2 * 256)
# sincosf keeps a 28-byte array on the stack for its slow path (|angle| > ~1e5, Payne-Hanek
# reduction); RoPE angles are < 512 rad and never take it, so that frame is allowed and never touched.
STACK_SINCOSF = 32

_BYTES = {"float32": 4, "bfloat16": 2}


def _tag(dtype: str) -> str:
    """Short dtype tag for labels: "f32" or "bf16"."""
    return "f32" if dtype == "float32" else "bf16"


def _cuda(stage: str, version: str, label: str, source: str, name: str, threads: int, max_registers: int,
          model: lm.Model, **kw: Any) -> KernelEntry:  # fmt: skip
    return KernelEntry("cuda", stage, version, label, threads, max_registers, model, source=source, name=name, **kw)


def _portable_attention_accepts(head_dim: int) -> bool:
    cu.check_head_dim(head_dim)  # ValueError for a head dim no GPU runs
    return True


def _flash_attention(dtype: str, hd: int) -> KernelEntry:
    tag = _tag(dtype)
    bf16 = dtype == "bfloat16"
    peak = "mma_sync" if bf16 else "fp32"
    return _cuda(
        "attention", f"CUDA flash {tag}", f"flash_attn_{tag}_hd{hd}", "attention.cu", cu.attention_name(hd, dtype),
        128, REG_ATTN_BF16 if bf16 else REG_ATTN_FP32, lm.attention_at(hd, _BYTES[dtype], 64 if bf16 else 16, peak),
        specialisation=f"hd{hd}", dynamic_smem=cu.attention_smem_bytes(hd, dtype),
        trace_job=f"flash_attn_{tag}" if hd == lm.HD else None, notebook="04" if hd == lm.HD else "",
    )  # fmt: skip


def _sm90_attention(hd: int) -> tuple[KernelEntry]:
    entry = _cuda(
        "attention", "CUDA sm90 wgmma", f"flash_attn_sm90_hd{hd}", "flash_attn_sm90.cu", cu.attention_sm90_name(hd),
        256, REG_ATTN_SM90, lm.attention_at(hd, 2, 64, "wgmma"), specialisation=f"hd{hd}",
        dynamic_smem=cu.attention_sm90_smem_bytes(hd), archs=(cu.HOPPER_ARCH,), notebook="08" if hd == lm.HD else "",
    )  # fmt: skip
    return (entry,)


def _portable_entries() -> list[KernelEntry | PerHeadDim]:
    out: list[KernelEntry | PerHeadDim] = []
    for o in cu.DTYPES:
        for epi in cu.EPILOGUES:
            out.append(
                _cuda(
                    "gemm", "CUDA bf16 tc", f"gemm_bf16_tc_{_tag(o)}_{epi}", "gemm_bf16.cu", cu.gemm_bf16_name(o, epi),
                    256, REG_GEMM_BF16, lm.gemm(epi, 2, _BYTES[o], 128, 128, "mma_sync"),
                    specialisation=f"out {_tag(o)}, {epi}", trace_job="gemm_bf16_tc",
                    notebook={("float32", "none"): "04", ("bfloat16", "gelu_erf"): "05",
                              ("bfloat16", "gelu_tanh"): "06"}.get((o, epi), ""),
                )
            )  # fmt: skip
    for epi in cu.EPILOGUES:
        out.append(
            _cuda(
                "gemm", "CUDA fp32 simt", f"gemm_fp32_simt_{epi}", "gemm_fp32.cu", cu.gemm_fp32_name(epi), 256,
                REG_GEMM_FP32, lm.gemm(epi, 4, 4, 64, 64), specialisation=epi, trace_job="gemm_fp32_simt",
                notebook="01" if epi == "none" else "",
            )
        )  # fmt: skip
    out.append(
        PerHeadDim(
            lambda hd: (_flash_attention("bfloat16", hd), _flash_attention("float32", hd)), _portable_attention_accepts
        )
    )
    for i in cu.DTYPES:
        for o in cu.DTYPES:
            pair, same = f"{_tag(i)}_{_tag(o)}", i == o
            out.append(
                _cuda(
                    "rmsnorm", "CUDA", f"rmsnorm_rows_{pair}", "rmsnorm.cu", cu.rmsnorm_name(i, o), 256, REG_SMALL,
                    lm.rmsnorm(_BYTES[i], _BYTES[o]), specialisation=f"{_tag(i)}->{_tag(o)}",
                    trace_job=f"rmsnorm_rows_{_tag(i)}" if same else None, notebook="02" if same else "",
                )
            )  # fmt: skip
            out.append(
                _cuda(
                    "merge", "CUDA", f"tpool_merge_{pair}", "merge.cu", cu.merge_name(i, o), 256, REG_SMALL,
                    lm.merge(_BYTES[i], _BYTES[o]), specialisation=f"{_tag(i)}->{_tag(o)}",
                    trace_job="tpool_merge_f32" if pair == "f32_f32" else None,
                    notebook="05" if pair == "f32_f32" else "",
                )
            )  # fmt: skip
    for dt in cu.DTYPES:
        out.append(
            _cuda(
                "rope", "CUDA", f"rope_2d_inplace_{_tag(dt)}", "rope.cu", cu.rope_name(dt), 256, REG_SMALL,
                lm.rope(_BYTES[dt]), specialisation=_tag(dt), max_stack=STACK_SINCOSF, notebook="03",
            )
        )  # fmt: skip
    for mode in ("bilinear", "bicubic"):
        out.append(
            _cuda("pos_emb", "CUDA", f"add_pos_emb_{mode}", "pos_emb.cu", cu.pos_emb_name(mode), 256, REG_SMALL,
                  lm.pos_emb(mode), specialisation=mode)
        )  # fmt: skip
    return out


def _hopper_entries() -> list[KernelEntry | PerHeadDim]:
    """gemm_bf16_sm90 at both tile widths for the backend's (output, epilogue) pairs, flash_attn_sm90 at the
    head dims it supports (<= HOPPER_MAX_HEAD_DIM)."""
    out: list[KernelEntry | PerHeadDim] = []
    for bn in cu.HOPPER_GEMM_BLOCK_N:
        for o, epi in cu.HOPPER_GEMM_USES:
            out.append(
                _cuda(
                    "gemm", "CUDA sm90 wgmma", f"gemm_bf16_sm90_bn{bn}_{_tag(o)}_{epi}", "gemm_bf16_sm90.cu",
                    cu.gemm_sm90_name(o, epi, bn), 384, REG_GEMM_SM90, lm.gemm(epi, 2, _BYTES[o], 128, bn, "wgmma"),
                    specialisation=f"BN {bn}, out {_tag(o)}, {epi}", dynamic_smem=cu.gemm_sm90_smem_bytes(bn),
                    archs=(cu.HOPPER_ARCH,), notebook="08" if (bn, o, epi) == (128, "bfloat16", "none") else "",
                )
            )  # fmt: skip
    out.append(PerHeadDim(_sm90_attention, lambda hd: hd <= cu.HOPPER_MAX_HEAD_DIM))
    return out


# The registry, in the order the tools list it (numba, then the portable CUDA C files, then sm_90a).
REGISTRY: list[KernelEntry | PerHeadDim] = [*_numba_entries(), *_portable_entries(), *_hopper_entries()]


# ============================================================================ queries
# Results that depend on the registry alone, kept for the REGISTRY object they were computed from (the launch
# checks ask for a register table at every launch): a replaced or grown registry computes them afresh.
_MEMO: dict[tuple, tuple[list, int, Any]] = {}


def _memo(key: tuple, compute: Callable[[], Any]) -> Any:
    hit = _MEMO.get(key)
    if hit is None or hit[0] is not REGISTRY or hit[1] != len(REGISTRY):
        hit = _MEMO[key] = (REGISTRY, len(REGISTRY), compute())
    return hit[2]


@functools.cache
def _made(item: PerHeadDim, head_dim: int) -> tuple[KernelEntry, ...]:
    return tuple(item.make(head_dim))


def entries(
    head_dims: Iterable[int] = (lm.HD,), backend: str | None = None, where: Callable[[KernelEntry], bool] | None = None
) -> list[KernelEntry]:
    """Every registry entry of `backend` (None: both) that `where` selects, in registry order, the per-head-dim
    ones made at each of `head_dims` they accept (ValueError for a head dim no GPU supports, when such an entry
    is selected)."""
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not one of {BACKENDS}")
    head_dims = tuple(head_dims)

    def selected(e: KernelEntry) -> bool:
        return (backend is None or e.backend == backend) and (where is None or where(e))

    out = []
    for item in REGISTRY:
        if isinstance(item, PerHeadDim):
            out += [e for hd in head_dims for e in _made(item, hd) if selected(e) and item.accepts(hd)]
        elif selected(item):
            out.append(item)
    return out


def find(backend: str, label: str) -> KernelEntry | None:
    """The entry of `backend` called `label` (attention at any head dim the kernels support), None if none is."""
    index = _memo(("find", backend), lambda: {e.label: e for e in entries(ALL_HEAD_DIMS, backend)})
    return index.get(label)


def running(label: str) -> KernelEntry:
    """The CUDA C entry the launchers run where `label`'s kernel is asked for: the newest version that takes
    its launch over (following `replaces`), else `label`'s own. ValueError when no CUDA C entry is `label`, or
    when a replacing entry lives in another file, belongs to another stage or has a rival."""
    entry = find("cuda", label)
    if entry is None:
        raise ValueError(f"no CUDA C kernel is called {label!r}")
    successors = _memo(("replaced by",), _replacements)
    while entry.label in successors:
        entry = successors[entry.label]
    return entry


def _replacements() -> dict[str, KernelEntry]:
    """{replaced label: the entry that replaces it}, each replacement checked against what it replaces."""
    out: dict[str, KernelEntry] = {}
    for e in entries(ALL_HEAD_DIMS, "cuda", lambda e: bool(e.replaces)):
        old = find("cuda", e.replaces)
        where = f"registry entry {e.label} replaces {e.replaces!r}"
        if old is None:
            raise ValueError(f"{where}: no CUDA C entry has that label")
        if (old.stage, old.source) != (e.stage, e.source):
            raise ValueError(f"{where}: a version replaces one of its own stage and file ({old.stage}, {old.source})")
        if e.replaces in out:
            raise ValueError(f"{where}: {out[e.replaces].label} replaces it too")
        out[e.replaces] = e
    return out


def numba_entries(modules: Iterable[str] | None = None) -> list[KernelEntry]:
    """The numba entries (what the compile tier builds), only those of `modules` (full module names) if given."""
    wanted = None if modules is None else set(modules)
    return entries(backend="numba", where=lambda e: wanted is None or e.module_path in wanted)


def register_table(compiler: str) -> dict[str, int]:
    """Registers per thread of every numba kernel built by `compiler` ({label: registers}; shared: read only)."""
    if compiler not in COMPILERS:
        raise ValueError(f"no register table for compiler {compiler!r}: expected one of {sorted(COMPILERS)}")
    return _memo(("registers", compiler), lambda: {e.label: e.registers[compiler] for e in numba_entries()})


def traced_by(backend: str, job: str, labels: Iterable[str] | None = None) -> list[str]:
    """Labels of `backend` whose `trace_job` is `job` (among `labels` when given; else the K3 registry)."""
    if labels is None:
        return [e.label for e in entries(backend=backend) if e.trace_job == job]
    return [lb for lb in labels if (e := find(backend, lb)) is not None and e.trace_job == job]


def versions(backend: str, stage: str) -> tuple[int, ...]:
    """The numbered versions (`v1`, `v2`, ...) of `stage` in `backend`, in order: gpu_check times each."""
    found = {int(e.version[1:]) for e in entries(backend=backend, where=lambda e: e.stage == stage)
             if e.version[:1] == "v" and e.version[1:].isdigit()}  # fmt: skip
    return tuple(sorted(found))


def hot_loop_labels() -> frozenset[str]:
    """The numba kernels whose innermost FFMA loops are held to the SASS budget per FFMA (`compile_check`)."""
    return _memo(("hot",), lambda: frozenset(e.label for e in numba_entries() if e.hot_loop))


def notebook_kernels(notebook: str) -> tuple[tuple[str, str], ...]:
    """(backend, label) of every kernel notebook `notebook`'s prediction table lists, numba first."""
    chosen = entries(where=lambda e: e.notebook == notebook)
    return tuple((e.backend, e.label) for e in sorted(chosen, key=lambda e: BACKENDS.index(e.backend)))


def trace_jobs(backend: str) -> dict[str, KernelEntry]:
    """{trace job: the first entry it stands for} of `backend`, in registry order: what the X-ray traces."""
    jobs: dict[str, KernelEntry] = {}
    for e in entries(backend=backend):
        if e.trace_job:
            jobs.setdefault(e.trace_job, e)
    return jobs


# ============================================================================ the CUDA C catalogue, derived
def kernel_specs(head_dims: tuple[int, ...] = (128,)) -> list[cu.KernelSpec]:
    """Every CUDA C instantiation the launchers use, attention at the given head dims: the portable ones, then
    the sm_90a ones (`hopper_specs`; see `KernelSpec.archs` / `specs_for(arch)`). ValueError for a head dim
    no GPU supports."""
    return [e.spec for e in entries(head_dims, "cuda")]


def hopper_specs(head_dims: tuple[int, ...] = (128,)) -> list[cu.KernelSpec]:
    """The sm_90a instantiations: gemm_bf16_sm90 at both tile widths for the backend's (output, epilogue)
    pairs, flash_attn_sm90 at those of `head_dims` it supports (<= 128)."""
    return [e.spec for e in entries(head_dims, "cuda", lambda e: cu.HOPPER_ARCH in e.archs)]


def specs_for(arch: str, head_dims: tuple[int, ...] = (128,)) -> list[cu.KernelSpec]:
    """The CUDA C instantiations the compile tier builds for `arch` (`KernelSpec.builds_for`)."""
    return [s for s in kernel_specs(head_dims) if s.builds_for(arch)]
