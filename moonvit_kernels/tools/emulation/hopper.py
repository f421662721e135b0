"""The Hopper (sm_90a) kernels on the CPU, and probes of the Hopper models one at a time.

`gemm_bf16_sm90.cu` and `flash_attn_sm90.cu` run only through the real `hopper_launchers` on the emulated
device (`emulation.device`), which compiles them unchanged by g++ against `prelude.h` (fibers, barriers),
`ptx_sm90.cuh` (the stand-in for the real `cuda_backend/ptx_sm90.cuh`) and `hopper.cuh`: models of
wgmma.mma_async, the wgmma matrix descriptor and swizzle modes, mbarrier, tensor maps and
cp.async.bulk.tensor, setmaxnreg, written from the PTX ISA and the driver API documentation (see
hopper.cuh's header for what each model does and checks). `gemm`, `attention` and `array_module` are
`hopper_launchers`' on that device from NumPy (`emulation.OnEmulator`; bf16 as uint16 bits), so this
module stands in for `hopper_launchers` where a launcher module is named (the pre-flight, gpu_check).
The probe library (`library`, `hopper_driver.cpp`) exposes each model for the layout tests
(tests/test_hopper_layouts.py). A misuse the models catch aborts the process with a message on
stderr, so tests of misuse call `run_forked`.
"""

from __future__ import annotations

import ctypes
import faulthandler
import functools
import os
from pathlib import Path

import numpy as np

from moonvit_kernels.cuda_backend import hopper_launchers
from moonvit_kernels.cuda_backend import sources as kcuda
from moonvit_kernels.tools.emulation import OnEmulator, build
from moonvit_kernels.tools.emulation.tensor_map_encoder import encode_tiled_driver  # noqa: F401 (API)

HERE = Path(__file__).resolve().parent
STANDINS = ("prelude.h", "cuda_bf16.h", "hopper.cuh", "ptx_sm90.cuh")
SMEM_BASE = 0x400  # shared address of dynamic shared memory's first byte in the model (hopper.cuh): 1024-aligned
SWIZZLE_MODE = {0: 0, 128: 1, 64: 2, 32: 3}  # span in bytes -> descriptor bits 62..63

_i = ctypes.c_int
_u = ctypes.c_uint
_u64 = ctypes.c_ulonglong
_p = ctypes.c_void_p


@functools.cache
def library() -> ctypes.CDLL:
    """Build (once per source version, cached; `build.build_library`) and load (`build.load`) the Hopper
    model probes (`hopper_driver.cpp`), against the kernels' own `sm90.cuh` (tensor map, descriptor encoder)."""
    files = {
        "hopper_driver.cpp": (HERE / "hopper_driver.cpp").read_text(encoding="utf-8"),
        "sm90.cuh": (kcuda.KERNEL_DIR / "sm90.cuh").read_text(encoding="utf-8"),
    }
    lib = build.load(build.build_library(files, "hopper_driver.cpp", standins=STANDINS, tag="hopper_probes"))
    lib.hop_desc_encode.restype = _u64
    lib.hop_desc_encode.argtypes = [_u, _u, _u, _i]
    lib.hop_desc_decode.argtypes = [_u64, _p]
    lib.hop_swizzle.restype = _u
    lib.hop_swizzle.argtypes = [_u, _i]
    lib.hop_kmajor_addr.restype = _u
    lib.hop_kmajor_addr.argtypes = [_u64, _i, _i]
    return lib


def _ptr(a: np.ndarray) -> ctypes.c_void_p:
    if not a.flags.c_contiguous:
        raise ValueError("emulation: arrays must be C-contiguous")
    return ctypes.c_void_p(a.ctypes.data)


# ============================================================================ the kernels
LAUNCHERS = OnEmulator(hopper_launchers)  # hopper_launchers on the emulated device, NumPy in and out
gemm = LAUNCHERS.gemm
attention = LAUNCHERS.attention
array_module = LAUNCHERS.array_module


def read_late(b: np.ndarray, elements: int = 8) -> np.ndarray:
    """`b` as the GEMM reads it when B's tensor map starts `elements` past B (the self-checks' planted
    mismatch, `gemm(a, read_late(b))`): every element `elements` later in memory, the last ones zero."""
    flat = np.ascontiguousarray(b).reshape(-1)
    return np.concatenate([flat[elements:], np.zeros(elements, b.dtype)]).reshape(b.shape)


# ============================================================================ probes of the models
def desc_encode(addr: int, lbo: int, sbo: int, swizzle_span: int) -> int:
    """The kernels' wgmma descriptor encoder (sm90.cuh) for a shared address and byte offsets."""
    return int(library().hop_desc_encode(addr, lbo, sbo, SWIZZLE_MODE[swizzle_span]))


def desc_decode(desc: int) -> dict[str, int]:
    """The model's reading of a descriptor: start, lbo, sbo (bytes), base_offset, mode."""
    out = np.zeros(5, np.uint32)
    library().hop_desc_decode(desc, _ptr(out))
    return dict(zip(("start", "lbo", "sbo", "base_offset", "mode"), (int(v) for v in out), strict=True))


def swizzle(addr: int, span: int) -> int:
    """The model's swizzle of a shared address for a span of 0 (none), 32, 64 or 128 bytes."""
    return int(library().hop_swizzle(addr, span))


def kmajor_addr(desc: int, mn: int, k: int) -> int:
    """Shared address the model reads element (mn, k) of a K-major wgmma operand from."""
    return int(library().hop_kmajor_addr(desc, mn, k))


def encode_tiled(g: np.ndarray, dims, strides, box, span: int, oob_nan: bool = False, esize: int = 2):
    """The model's cuTensorMapEncodeTiled: (rc, reason); rc 0 on success."""
    out = np.zeros(256, np.uint8)
    off = (-out.ctypes.data) % 64
    d = np.asarray(dims, np.uint64)
    s = np.asarray(list(strides) or [0], np.uint64)
    bx = np.asarray(box, np.uint32)
    why = ctypes.create_string_buffer(200)
    rc = library().hop_encode_tiled(
        ctypes.c_void_p(out.ctypes.data + off),
        _u(esize),
        _u(len(d)),
        _ptr(g),
        _ptr(d),
        _ptr(s),
        _ptr(bx),
        _i(span),
        _i(oob_nan),
        why,
        _i(200),
    )
    return int(rc), why.value.decode()


def tma_probe(g: np.ndarray, box: tuple[int, int], coords: tuple[int, int], span: int, oob_nan=False, dst_off=0):
    """One 2-D box load of the uint16 matrix g [rows, cols] at coords (c0 = column, c1 = row).

    Returns (landed, before, state): the box's raw shared bytes as uint16 [box1 * box0] once landed
    and between the issue and the wait, and [tx before the wait, try_wait(0), try_wait(1) after]."""
    g = np.ascontiguousarray(g, np.uint16)
    n = box[0] * box[1]
    landed = np.zeros(n, np.uint16)
    before = np.zeros(n, np.uint16)
    state = np.zeros(3, np.int32)
    rc = library().hop_tma_probe(
        _ptr(g),
        _u64(g.shape[0]),
        _u64(g.shape[1]),
        _u64(g.strides[0]),
        _u(box[0]),
        _u(box[1]),
        _i(span),
        _i(oob_nan),
        _i(coords[0]),
        _i(coords[1]),
        _u(dst_off),
        _ptr(landed),
        _ptr(before),
        _ptr(state),
    )
    if rc:
        raise ValueError("tensor map rejected (see stderr)")
    return landed, before, state


MBAR_OPS = {"init": 0, "arrive": 1, "expect_tx": 2, "complete_tx": 3, "try_wait": 4, "arrive_expect_tx": 5}


def mbar_script(steps: list[tuple[str, int]]) -> list[int]:
    """Run (op, arg) steps on one mbarrier in one thread; the try_wait results in order."""
    ops = np.asarray([MBAR_OPS[o] for o, _ in steps], np.int32)
    args = np.asarray([a for _, a in steps], np.int32)
    res = np.full(len(steps), -1, np.int32)
    library().hop_mbar_script(_ptr(ops), _ptr(args), _i(len(steps)), _ptr(res))
    return [int(v) for v in res[: sum(o == "try_wait" for o, _ in steps)]]


def wgmma_probe(image: np.ndarray, n: int, a_desc, b_desc, scale_d=1, init=None, flags=0, a_regs=None):
    """One wgmma m64nNk16 of one warpgroup over the shared-memory `image` (uint8, placed 1024-aligned).

    a_desc / b_desc: (offset in the image, lbo, sbo, swizzle span); `a_regs` [128, 4] uint32: A from
    registers instead (thread t's fragment). Returns (out, early): each thread's n/2 accumulator
    registers [128, n/2] after the wait and right after the issue."""
    image = np.ascontiguousarray(image, np.uint8)
    r = n // 2
    init = np.zeros((128, r), np.float32) if init is None else np.ascontiguousarray(init, np.float32)
    out = np.full((128, r), np.nan, np.float32)
    early = np.zeros((128, r), np.float32)
    ad = np.asarray([a_desc[0], a_desc[1], a_desc[2], SWIZZLE_MODE[a_desc[3]]], np.uint32)
    bd = np.asarray([b_desc[0], b_desc[1], b_desc[2], SWIZZLE_MODE[b_desc[3]]], np.uint32)
    regs = np.zeros((128, 4), np.uint32) if a_regs is None else np.ascontiguousarray(a_regs, np.uint32)
    if a_regs is not None:
        flags |= 8
    library().hop_wgmma_probe(
        _ptr(image),
        _i(image.size),
        _i(n),
        _ptr(ad),
        _ptr(bd),
        _i(scale_d),
        _ptr(init),
        _ptr(out),
        _ptr(early),
        _i(flags),
        _ptr(regs),
    )
    return out, early


def setmaxnreg_probe(counts: list[int], regs_at_entry: int, diverge: bool = False) -> None:
    """Warpgroup w calls setmaxnreg(|counts[w]|) (.inc if positive, .dec if negative)."""
    c = np.asarray(counts, np.int32)
    library().hop_setmaxnreg_probe(_i(len(c)), _i(regs_at_entry), _ptr(c), _i(int(diverge)))


def mbar_deadlock() -> None:
    """A wait on a barrier that never completes (the scheduler reports a deadlock and aborts)."""
    library().hop_mbar_deadlock()


def run_forked(fn, *args, **kwargs) -> tuple[int, str]:
    """Call fn(*args, **kwargs) in a forked child, since the models abort the process on misuse.

    Returns (exit code, the child's stderr): 0 when fn returned, -6 (SIGABRT) when a model aborted."""
    library()  # built and loaded before the fork, so the child only runs it
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            os.dup2(w, 2)
            faulthandler.disable()  # the abort is expected: no Python traceback dump
            fn(*args, **kwargs)
        except BaseException:
            code = 3
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        err = f.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), err
