"""An emulated CUDA device with CuPy's interface: the real launchers run on the CPU through it.

`launchers.py` and `hopper_launchers.py` take CuPy arrays, compile `RawModule`s and end in one launch
call, `kernel(grid, block, args, shared_mem=...)`. Inside `with device.activated():` (or after
`device.activate()`), the launchers' `array_module()` is this module instead of CuPy, so every
check, every argument cast, the launch geometry and the tensor-map encoding of the launchers run
unchanged, and only the last step differs: the kernel's source is compiled by g++ against the
emulator's stand-ins (`emulation/build.py`) and its blocks run on the CPU.

What the device enforces, as a GPU does (each refusal is a `LaunchError` naming the problem):
- arguments marshalled as CuPy marshals them: a device array by its pointer (8 bytes), a NumPy scalar
  by its dtype's bytes, a Python int as int64, a float as float64, a bool as bool, a structured
  NumPy scalar by value with its dtype's alignment (`make_aligned_dtype` records it); each size must
  equal the kernel parameter's and each alignment must be at least the parameter's;
- an array argument must live on the current device (a pointer from another GPU faults there);
- grid and block limits (block x, y <= 1024, z <= 64, x·y·z <= 1024; grid x < 2^31, y, z <= 65535);
- the register file's launch rule (`launch_rules.register_problem`) at the kernel's registers (the
  catalogue's bound, which the compile tier holds the real count to);
- dynamic shared memory above 48 KB only after `max_dynamic_shared_size_bytes` was raised, and never
  above the device's opt-in limit.
Arrays (`ndarray`, a NumPy subclass) carry the device they were made on; `empty` fills new memory with
NaN (float32), the bf16 NaN 0x7FC0 (uint16) or a large sentinel (integers), so an element a kernel
forgets to write fails the comparison.

Launches are contained: device memory is shared (`mmap` MAP_SHARED), and each launch runs the kernel in a
forked child (`moonvit_kernels.contained`) that writes it, so a kernel that aborts, dereferences a bad
pointer or never ends raises `LaunchError` naming the kernel, the signal and the block and thread it was
running, or the time limit (`time_limit`, MOONVIT_EMU_TIME_LIMIT seconds, default 600), and the Python
process lives on. A device array made by NumPy arithmetic (private memory) is copied to shared memory for
the launch and back after it. Every device array ends against a guard region (`emulation/guard.py`): a kernel
that reads or writes past an array's end (or before its start) raises `OutOfBounds` naming the block and
thread, the address and the argument it ran past; a write into the under 256 bytes between an array's end and
its guard (its start stays 256-byte aligned) is found after the launch; a read there is not (it reads NaN).
MOONVIT_EMU_CONTAIN=0 runs launches in this process (trusted kernels only: a fault there ends the process).
Within `tracing(recording)` the modules load their traced build and launches run in this process with
their memory accesses recorded (the X-ray's address traces, `emulation.tracing`).
What it cannot show: speed, registers, the device's exact transcendental functions, and races the barriers
do not order.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import mmap
import os
import re
import time
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np

from moonvit_kernels import contained, launch_rules, registry
from moonvit_kernels.tools.emulation import build, guard

EMULATED = True
__version__ = "emulator"

float16, float32, float64 = np.float16, np.float32, np.float64
int8, int16, int32, int64 = np.int8, np.int16, np.int32, np.int64
uint8, uint16, uint32, uint64 = np.uint8, np.uint16, np.uint32, np.uint64
bool_ = np.bool_

DEFAULT_SMEM = 48 * 1024  # dynamic shared memory a kernel may use before raising its attribute
_TIME_LIMIT = [contained.check_time_limit(os.environ.get("MOONVIT_EMU_TIME_LIMIT", "600"))]
_FORCE_CONTAIN = [False]
_REVERSED = [0]  # 1 within reversed_thread_order()
_TRACER: list[Any] = [None]  # the recording launches go through within tracing()
_Maps = dict[int, guard.GuardedMap]  # the guarded memory of a launch's array arguments, by argument index


class LaunchError(RuntimeError):
    """A launch the emulated device refuses (as a GPU would fail it), with the reason."""


class LaunchStopped(LaunchError):
    """A contained launch whose kernel crashed (`timed_out` False) or ran past the time limit (True)."""

    def __init__(self, message: str, timed_out: bool):
        super().__init__(message)
        self.timed_out = timed_out


class OutOfBounds(LaunchStopped):
    """A contained launch whose kernel read or wrote past the end (or before the start) of a device array."""

    def __init__(self, message: str):
        super().__init__(message, timed_out=False)


# ============================================================================ the devices
class _DeviceProps:
    def __init__(self, compute_capability: str, optin_smem: int, name: str):
        self.compute_capability = compute_capability
        self.optin_smem = optin_smem
        self.name = name


_PROPS: list[_DeviceProps] = []
_CURRENT = [0]


def configure(compute_capability: str = "90", optin_smem: int = 227 * 1024, count: int = 2) -> None:
    """Set the emulated machine: `count` identical devices of `compute_capability` ("90": H100/H200;
    "80": A100) with `optin_smem` bytes of opt-in shared memory per block. Device 0 becomes current."""
    if count < 1:
        raise ValueError(f"an emulated machine needs at least one device, got {count}")
    _PROPS[:] = [_DeviceProps(str(compute_capability), int(optin_smem), f"emulated sm_{compute_capability}")] * count
    _CURRENT[0] = 0


configure()


class Device:
    """`cupy.cuda.Device`: an emulated device by id; a context manager makes it current."""

    def __init__(self, device: int | None = None):
        self.id = _CURRENT[0] if device is None else int(device)
        if not 0 <= self.id < len(_PROPS):
            raise ValueError(f"no emulated device {self.id} (there are {len(_PROPS)})")
        self._previous: list[int] = []

    @property
    def compute_capability(self) -> str:
        return _PROPS[self.id].compute_capability

    def use(self) -> None:
        _CURRENT[0] = self.id

    def synchronize(self) -> None:
        pass

    def __enter__(self) -> Device:
        self._previous.append(_CURRENT[0])
        self.use()
        return self

    def __exit__(self, *exc: Any) -> None:
        _CURRENT[0] = self._previous.pop()

    def __repr__(self) -> str:
        return f"<emulated CUDA Device {self.id}>"


def _get_device() -> int:
    return _CURRENT[0]


def _device_attribute(attr: int, device: int) -> int:
    if attr == _runtime.cudaDevAttrMaxSharedMemoryPerBlockOptin:
        return _PROPS[device].optin_smem
    raise ValueError(f"the emulated device does not model attribute {attr}")


class _Event:
    """`cupy.cuda.Event`: records host wall time (the emulator's, not a GPU's)."""

    def __init__(self, *args: Any, **kwargs: Any):
        self.t = 0.0

    def record(self, stream: Any = None) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass


_runtime = SimpleNamespace(
    getDevice=_get_device,
    setDevice=lambda d: Device(d).use(),
    getDeviceCount=lambda: len(_PROPS),
    deviceGetAttribute=_device_attribute,
    getDeviceProperties=lambda d: {"name": _PROPS[d].name.encode(), "major": int(_PROPS[d].compute_capability) // 10},
    cudaDevAttrMaxSharedMemoryPerBlockOptin=97,
    runtimeGetVersion=lambda: 13000,
    driverGetVersion=lambda: 13000,
)
cuda = SimpleNamespace(
    Device=Device,
    runtime=_runtime,
    nvrtc=SimpleNamespace(getVersion=lambda: (13, 0)),
    Event=_Event,
    get_elapsed_time=lambda a, b: 1e3 * (b.t - a.t),
    Stream=SimpleNamespace(null=None),
)


# ============================================================================ arrays
class _Memory:
    __slots__ = ("ptr",)

    def __init__(self, ptr: int):
        self.ptr = ptr


class ndarray(np.ndarray):
    """A device array of the emulated device: NumPy memory that knows which device it lives on."""

    def __array_finalize__(self, obj: Any) -> None:
        self._device_id = getattr(obj, "_device_id", None)
        if self._device_id is None:
            self._device_id = _CURRENT[0]

    @property
    def data(self) -> _Memory:  # type: ignore[override]
        return _Memory(int(self.ctypes.data))

    @property
    def device(self) -> Device:  # type: ignore[override]
        return Device(self._device_id)

    def get(self) -> np.ndarray:
        """A host (NumPy) copy, as `cupy.ndarray.get()`."""
        return np.array(self.view(np.ndarray), copy=True)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.data.ptr, False), "version": 3}


def _allocate(shape: Any, dtype: Any, order: str = "C") -> ndarray:
    """Uninitialised device memory of the current device, in shared memory (a launch's child writes it)."""
    dt = np.dtype(dtype)
    nbytes = math.prod(np.atleast_1d(np.asarray(shape, dtype=np.int64)).tolist()) * dt.itemsize
    memory = guard.allocate(nbytes, f"shape {tuple(np.atleast_1d(shape).tolist())} {dt}, {nbytes} bytes")
    out = np.ndarray(shape, dt, buffer=memory, offset=memory.start, order=order).view(ndarray)
    out._device_id = _CURRENT[0]
    return out


def is_shared(a: np.ndarray) -> bool:
    """Whether `a`'s memory is shared memory (`mmap`): what a launch's forked child writes reaches this process."""
    base: Any = a
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, mmap.mmap)


def _on_device(a: np.ndarray) -> ndarray:
    """`a` as an array of the current device: copied to shared memory unless it is there already."""
    if is_shared(a):
        out = a.view(ndarray)
        out._device_id = _CURRENT[0]
        return out
    out = _allocate(a.shape, a.dtype, "F" if a.flags.f_contiguous and not a.flags.c_contiguous else "C")
    np.copyto(out, a, casting="no")
    return out


def asarray(a: Any, dtype: Any = None, order: str = "C") -> ndarray:
    """Upload `a` (a copy unless it is already an array of the current device with that dtype)."""
    if isinstance(a, ndarray) and a._device_id == _CURRENT[0] and (dtype is None or a.dtype == np.dtype(dtype)):
        return a
    host = np.asarray(a.view(np.ndarray) if isinstance(a, ndarray) else a, dtype=dtype)
    out = _allocate(host.shape, host.dtype, order if order in ("C", "F") else "C")
    np.copyto(out, host, casting="no")
    return out


array = asarray


def ascontiguousarray(a: Any, dtype: Any = None) -> ndarray:
    if isinstance(a, ndarray) and a.flags.c_contiguous and (dtype is None or a.dtype == np.dtype(dtype)):
        return a
    return asarray(a, dtype=dtype)


def _poison(dtype: np.dtype) -> Any:
    if dtype == np.uint16:
        return 0x7FC0  # a bf16 NaN
    if np.issubdtype(dtype, np.floating):
        return np.nan
    if np.issubdtype(dtype, np.integer):
        return np.iinfo(dtype).max
    return 0


def empty(shape: Any, dtype: Any = np.float64, order: str = "C") -> ndarray:
    """New device memory, filled with a poison value (NaN, bf16 NaN, the integer maximum)."""
    out = _allocate(shape, dtype, order)
    out.fill(_poison(out.dtype))
    return out


def empty_like(a: Any, dtype: Any = None) -> ndarray:
    return empty(np.shape(a), dtype=a.dtype if dtype is None else dtype)


def make_aligned_dtype(dtype: Any, *, alignment: int = -1, recurse: bool = True) -> np.dtype:
    """`cupy.make_aligned_dtype`: a structured dtype padded to `alignment`, which it also records
    (in the dtype's metadata) for the launch marshalling."""
    dt = np.dtype(dtype, align=True)
    align = max(dt.alignment, alignment)
    if alignment != -1 and alignment < dt.alignment:
        raise ValueError(f"alignment {alignment} is below the dtype's own {dt.alignment}")
    size = -(-dt.itemsize // align) * align
    padded = np.dtype({"names": dt.names, "formats": [dt.fields[n][0] for n in dt.names],
                       "offsets": [dt.fields[n][1] for n in dt.names], "itemsize": size})  # fmt: skip
    return np.dtype(padded, metadata={"__cuda_alignment__": align})


def _wrap(fn: Any) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        return _on_device(out) if isinstance(out, np.ndarray) and not isinstance(out, ndarray) else out

    call.__name__ = getattr(fn, "__name__", "call")
    return call


def __getattr__(name: str) -> Any:
    """The rest of NumPy's namespace, with array results as device arrays (zeros, where, isnan, ...)."""
    fn = getattr(np, name)
    return _wrap(fn) if callable(fn) and not isinstance(fn, type) else fn


# ============================================================================ modules and launches
class Function:
    """A kernel of an emulated `RawModule`: `kernel(grid, block, args, shared_mem=0)` as in CuPy."""

    def __init__(self, module: RawModule, name: str):
        self.module, self.name = module, name
        self.max_dynamic_shared_size_bytes = DEFAULT_SMEM
        # registers per thread: no GPU build here, so the catalogue's bound (the compile tier asserts the
        # real count stays at or below it); -1 for kernels the catalogue does not know
        self.num_regs = _catalogue_registers(name)
        self.local_size_bytes = -1

    @property
    def attributes(self) -> dict[str, int]:
        """CuPy's `Function.attributes` (the same keys), with what the emulated device knows: the catalogue's
        register bound, the raised dynamic shared memory, the device's compute capability; -1 where only a GPU
        binary would say (static shared and local memory)."""
        cc = int(_PROPS[_CURRENT[0]].compute_capability)
        return {
            "max_threads_per_block": 1024, "shared_size_bytes": -1, "const_size_bytes": -1,
            "local_size_bytes": self.local_size_bytes, "num_regs": self.num_regs, "ptx_version": cc,
            "binary_version": cc, "cache_mode_ca": 0,
            "max_dynamic_shared_size_bytes": self.max_dynamic_shared_size_bytes,
            "preferred_shared_memory_carveout": -1,
        }  # fmt: skip

    def __call__(self, grid: Sequence[int], block: Sequence[int], args: Sequence[Any], *, shared_mem: int = 0,
                 stream: Any = None, enable_cooperative_groups: bool = False) -> None:  # fmt: skip
        g, b = _dims(grid, "grid"), _dims(block, "block")
        _check_geometry(self.name, g, b)
        if self.num_regs > 0 and (why := launch_rules.register_problem(self.num_regs, math.prod(b))):
            raise LaunchError(f"{self.name}: too many resources requested for launch: {why}")
        props = _PROPS[_CURRENT[0]]
        if shared_mem > self.max_dynamic_shared_size_bytes:
            raise LaunchError(
                f"{self.name}: {shared_mem} B of dynamic shared memory without raising "
                f"max_dynamic_shared_size_bytes (now {self.max_dynamic_shared_size_bytes} B)"
            )
        if self.max_dynamic_shared_size_bytes > props.optin_smem:
            raise LaunchError(
                f"{self.name}: max_dynamic_shared_size_bytes {self.max_dynamic_shared_size_bytes} exceeds the device's "
                f"opt-in limit {props.optin_smem} B"
            )
        staging = _Staging() if contain() else None
        packed = [_marshal(self.name, i, a, staging) for i, a in enumerate(args)]
        maps = _argument_maps(args, staging)
        n = len(packed)
        ptrs = (ctypes.c_void_p * max(n, 1))(*[ctypes.addressof(buf) for buf, _, _ in packed])
        sizes = (ctypes.c_ulonglong * max(n, 1))(*[s for _, s, _ in packed])
        aligns = (ctypes.c_ulonglong * max(n, 1))(*[al for _, _, al in packed])
        err = ctypes.create_string_buffer(1024)
        regs = self.module.regs_at_entry(self.name, b)
        lib = self.module.library()

        def launch() -> tuple[int, bytes]:
            lib.emu_set_thread_order(ctypes.c_int(_REVERSED[0]))
            rc = lib.emu_launch(
                self.name.encode(), (ctypes.c_uint * 3)(*g), (ctypes.c_uint * 3)(*b), ctypes.c_ulonglong(shared_mem),
                ctypes.c_int(regs), ctypes.c_int(n), ptrs, sizes, aligns, err, ctypes.c_int(len(err)),
            )  # fmt: skip
            return rc, err.value

        if _TRACER[0] is not None:
            rc, message = _TRACER[0].launch(lib, args, launch)
        else:
            rc, message = launch() if staging is None else _contained_launch(self.name, lib, launch, maps)
        if rc:
            raise LaunchError(message.decode(errors="replace"))
        _check_canaries(self.name, maps)
        if staging is not None:
            staging.copy_back()


def contain() -> bool:
    """Whether launches run in a forked child (the default; MOONVIT_EMU_CONTAIN=0 runs them in this process,
    except within `contained_launches`; never within `tracing`, whose records stay in this process)."""
    wanted = _FORCE_CONTAIN[0] or os.environ.get("MOONVIT_EMU_CONTAIN", "1") != "0"
    return wanted and _TRACER[0] is None and contained.available()


@contextlib.contextmanager
def tracing(recording: Any) -> Iterator[Any]:
    """Within the block, modules load their traced build (`build.build_module(..., traced=True)`) and every
    launch runs in this process through `recording.launch(library, args, launch)` (`tracing.Recording`), which
    records the kernel's memory accesses."""
    saved = _TRACER[0]
    _TRACER[0] = recording
    try:
        yield recording
    finally:
        _TRACER[0] = saved


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Within the block, a contained launch still running after `seconds` is stopped (LaunchStopped)."""
    saved = _TIME_LIMIT[0]
    _TIME_LIMIT[0] = contained.check_time_limit(seconds)
    try:
        yield
    finally:
        _TIME_LIMIT[0] = saved


@contextlib.contextmanager
def reversed_thread_order() -> Iterator[None]:
    """Within the block, launches run warps, lanes and blocks in the opposite order (prelude.h): a kernel whose
    output changes depends on the order of its threads (a race)."""
    saved = _REVERSED[0]
    _REVERSED[0] = 1
    try:
        yield
    finally:
        _REVERSED[0] = saved


@contextlib.contextmanager
def contained_launches(seconds: float) -> Iterator[None]:
    """Within the block every launch is contained (whatever MOONVIT_EMU_CONTAIN says), with `seconds` each."""
    saved = _FORCE_CONTAIN[0]
    _FORCE_CONTAIN[0] = True
    try:
        with time_limit(seconds):
            yield
    finally:
        _FORCE_CONTAIN[0] = saved


_SIGNAL_MEANS = {
    "SIGSEGV": "an access outside any allocation: an index out of bounds, a null or stale pointer",
    "SIGBUS": "a misaligned or unmapped access",
    "SIGABRT": "the emulator or the kernel aborted",
    "SIGFPE": "an integer division by zero",
    "SIGILL": "an illegal instruction",
    "SIGTRAP": "a trap",
}


def _contained_launch(name: str, lib: ctypes.CDLL, launch: Any, maps: _Maps) -> tuple[int, bytes]:
    """`launch()` in a forked child: its (rc, message), or LaunchError naming the kernel when it crashed or
    ran past the time limit (OutOfBounds when it touched a guard region of a device array; `maps` are the
    arguments' memory by argument index)."""
    where = mmap.mmap(-1, 512)  # the child's fault handler writes the block, thread and address here

    def child() -> tuple[int, bytes]:
        lib.emu_report_faults(ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(where))), 512)
        return launch()

    limit = _TIME_LIMIT[0]
    try:
        return contained.run(child, time_limit=limit, what=name)
    except contained.TimedOut:
        raise LaunchStopped(
            f"{name}: your kernel did not finish in {limit:g} s and was stopped (an endless loop, or threads "
            "waiting for something that never comes?)",
            timed_out=True,
        ) from None
    except contained.Crashed as e:
        at = where[:].split(b"\0", 1)[0].decode(errors="replace")
        if e.signal_name == "SIGSEGV" and (bounds := _bounds_message(name, at, maps)):
            raise OutOfBounds(bounds + (f"\n{e.output}" if e.output else "")) from None
        what = _SIGNAL_MEANS.get(e.signal_name, "")
        text = f"{name}: the kernel crashed: {e.signal_name or 'exited'}" + (f" ({what})" if what else "")
        text += f" in {at}" if at else ""
        raise LaunchStopped(text + (f"\n{e.output}" if e.output else ""), timed_out=False) from None


_FAULT_AT = re.compile(r"^(?P<who>.*?), (?P<access>a read of |a write to )?address (?P<address>0x[0-9a-f]+)")


def _bounds_message(name: str, at: str, maps: _Maps) -> str | None:
    """The bounds error of a fault the handler reported as `at`, when its address is in a guard region."""
    fault = _FAULT_AT.match(at)
    found = guard.overrun(int(fault["address"], 16)) if fault else None
    if fault is None or found is None:
        return None
    memory, where = found
    owner = next((f"argument {i}" for i, m in maps.items() if m is memory), "a device array")
    access = (fault["access"] or "an access to ").strip()
    return (
        f"{name}: out-of-bounds access: {fault['who']} made {access} address {fault['address']}, {where} of {owner} "
        f"({memory.describe}, at 0x{memory.array_address:x})"
    )


def _argument_maps(args: Sequence[Any], staging: _Staging | None) -> _Maps:
    """The guarded memory of each device-array argument (its staged copy's when staged), by argument index."""
    maps: _Maps = {}
    for i, a in enumerate(args):
        if isinstance(a, ndarray):
            memory = guard.map_of(a if is_shared(a) or staging is None else staging.root_copy(_root(a)))
            if memory is not None:
                maps[i] = memory
    return maps


def _check_canaries(name: str, maps: _Maps) -> None:
    """OutOfBounds when the launch wrote between an argument array and its guard regions."""
    for i, memory in maps.items():
        if where := guard.dirty_canary(memory):
            raise OutOfBounds(
                f"{name}: out-of-bounds write into {where} of argument {i} ({memory.describe}; found after "
                "the launch, so the block and thread are unknown)"
            )


def _root(a: np.ndarray) -> np.ndarray:
    """The array owning `a`'s memory (`a` itself, or the array it is a view of)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


class _Staging:
    """Shared-memory copies of device arrays in private memory (made by NumPy arithmetic) for one launch."""

    def __init__(self) -> None:
        self.copies: list[tuple[np.ndarray, np.ndarray]] = []  # (the private root array, its shared copy)

    def pointer(self, a: np.ndarray) -> int:
        """The address the kernel gets for `a`: its own when shared, else the matching place in a copy."""
        ptr = int(a.ctypes.data)
        if is_shared(a):
            return ptr
        root = _root(a)
        return int(self.root_copy(root).ctypes.data) + ptr - int(root.ctypes.data)

    def root_copy(self, root: np.ndarray) -> np.ndarray:
        """The shared copy of private array `root` (made on first use)."""
        for r, copy in self.copies:
            if r is root:
                return copy
        memory = guard.allocate(root.nbytes, f"shape {root.shape} {root.dtype}, {root.nbytes} bytes")
        copy = np.ndarray(root.nbytes, np.uint8, buffer=memory, offset=memory.start)
        ctypes.memmove(copy.ctypes.data, root.ctypes.data, root.nbytes)
        self.copies.append((root, copy))
        return copy

    def copy_back(self) -> None:
        for root, copy in self.copies:
            ctypes.memmove(root.ctypes.data, copy.ctypes.data, root.nbytes)


class RawModule:
    """`cupy.RawModule(code=..., options=..., name_expressions=...)` on the emulated device.

    The options are kept (not interpreted) except `-arch=sm_90a`, which builds the module against the
    Hopper models. Without name expressions the module's `extern "C"` kernels are found by name."""

    def __init__(self, code: str | None = None, *, path: str | None = None, options: Sequence[str] = (),
                 name_expressions: Sequence[str] | None = None, backend: str = "nvrtc", jitify: bool = False,
                 regs_at_entry: Any = None):  # fmt: skip
        if code is None:
            raise ValueError(
                f"the emulated device compiles CUDA C source, not binaries: RawModule(code=...) (got path={path!r})"
            )
        self.code, self.options = code, tuple(options)
        self.names = tuple(name_expressions) if name_expressions else build.extern_c_kernels(code)
        self.hopper = any(o.replace("--gpu-architecture", "-arch").endswith("sm_90a") for o in self.options)
        cc = _PROPS[_CURRENT[0]].compute_capability
        if self.hopper and cc != "90":
            raise LaunchError(f"sm_90a code runs on compute capability 9.0 only; this device is sm_{cc}")
        self._regs = regs_at_entry
        self._functions: dict[str, Function] = {}

    def library(self) -> ctypes.CDLL:
        """The module's emulator library (`build.build_module`): its traced variant within `tracing()`."""
        return build.build_module(self.code, self.names, self.hopper, traced=_TRACER[0] is not None)

    def regs_at_entry(self, name: str, block: tuple[int, int, int]) -> int:
        """Registers per thread at entry (the Hopper model's setmaxnreg pool): the module's table, else the
        most `__launch_bounds__(threads, 1)` gives: 65536 / threads rounded down to 8, at most 255."""
        if callable(self._regs):
            got = self._regs(name)
            if got:
                return int(got)
        threads = math.prod(block)
        return min(255, (65536 // threads) // 8 * 8)

    def get_function(self, name: str) -> Function:
        if name not in self.names:
            raise ValueError(f"{name!r} is not a kernel of this module (name expressions: {', '.join(self.names)})")
        if name not in self._functions:
            self.library()  # build on first use, as CuPy compiles on first use
            self._functions[name] = Function(self, name)
        return self._functions[name]


@functools.cache
def _register_bounds() -> dict[str, int]:
    from moonvit_kernels.cuda_backend import sources as kcuda

    head_dims = tuple(range(8, kcuda.MAX_HEAD_DIM + 1, 8))
    specs = registry.kernel_specs(head_dims) + registry.hopper_specs(tuple(h for h in head_dims if h <= 128))
    return {s.name: s.max_registers for s in specs}


def _catalogue_registers(name: str) -> int:
    return _register_bounds().get(name, -1)


def _dims(d: Any, what: str) -> tuple[int, int, int]:
    t = (int(d),) if np.isscalar(d) else tuple(int(x) for x in d)
    if not 1 <= len(t) <= 3:
        raise LaunchError(f"{what} must have 1 to 3 dimensions, got {d!r}")
    return (*t, *(1,) * (3 - len(t)))  # type: ignore[return-value]


def _check_geometry(name: str, g: tuple[int, int, int], b: tuple[int, int, int]) -> None:
    if min(g) < 1 or min(b) < 1:
        raise LaunchError(f"{name}: empty launch, grid {g} block {b}")
    if g[0] > 2**31 - 1 or g[1] > 65535 or g[2] > 65535:
        raise LaunchError(f"{name}: grid {g} exceeds the limits (2^31 - 1, 65535, 65535)")
    if b[0] > 1024 or b[1] > 1024 or b[2] > 64 or math.prod(b) > 1024:
        raise LaunchError(f"{name}: block {b} exceeds the limits (1024, 1024, 64; 1024 threads)")


def _marshal(kernel: str, i: int, a: Any, staging: _Staging | None = None) -> tuple[Any, int, int]:
    """(a ctypes buffer holding the argument's bytes, its size, its alignment), as CuPy packs it; a device
    array by the address `staging` gives it (a contained launch)."""
    if isinstance(a, ndarray):
        if a._device_id != _CURRENT[0]:
            raise LaunchError(
                f"{kernel}: argument {i} lives on device {a._device_id}, the kernel runs on device {_CURRENT[0]} "
                "(an illegal address on a GPU)"
            )
        return ctypes.c_void_p(a.data.ptr if staging is None else staging.pointer(a)), 8, 8
    if isinstance(a, np.ndarray):
        raise LaunchError(f"{kernel}: argument {i} is a host (NumPy) array; upload it first (asarray)")
    if isinstance(a, bool):
        a = np.bool_(a)
    elif isinstance(a, int):
        a = np.int64(a)
    elif isinstance(a, float):
        a = np.float64(a)
    if isinstance(a, np.generic):
        raw = a.tobytes()
        meta = a.dtype.metadata or {}
        align = int(meta.get("__cuda_alignment__", a.dtype.alignment))
        buf = (ctypes.c_ubyte * (len(raw) + 64))()
        view = (ctypes.c_ubyte * len(raw)).from_address(ctypes.addressof(buf) + (-ctypes.addressof(buf)) % 64)
        ctypes.memmove(view, raw, len(raw))
        view._keep = buf  # type: ignore[attr-defined]
        return view, len(raw), align
    raise LaunchError(f"{kernel}: argument {i} has unsupported type {type(a).__name__}")


# ============================================================================ activation
@contextlib.contextmanager
def activated() -> Iterator[Any]:
    """Within the block, the launchers (`launchers`, `hopper_launchers`) run on this emulated device."""
    from moonvit_kernels.cuda_backend import launchers

    launchers.push_device_api(__import__(__name__, fromlist=["_"]))
    try:
        yield __import__(__name__, fromlist=["_"])
    finally:
        launchers.pop_device_api()


def activate() -> None:
    """Make this emulated device the launchers' device for the rest of the process (notebooks, gpu_check --simulate)."""
    from moonvit_kernels.cuda_backend import launchers

    launchers.push_device_api(__import__(__name__, fromlist=["_"]))


def tensor_map_encoder() -> Any:
    """The emulator's model of `cuTensorMapEncodeTiled`, with the driver's C signature (hopper.cuh)."""
    from moonvit_kernels.tools.emulation.tensor_map_encoder import encode_tiled_driver

    return encode_tiled_driver()
