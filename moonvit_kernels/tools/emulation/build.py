"""The one build recipe of the CPU emulator: CUDA C text + the stand-ins -> a shared library (g++).

`build_module(code, names, hopper=...)` is what the emulated device's `RawModule` calls: the module's
source text is compiled unchanged by the host C++ compiler (C++20) against the stand-ins for the CUDA
pieces it uses (`prelude.h`: threads as fibers, barriers, warp shuffles; `ptx.cuh` / `ptx_sm90.cuh`
+ `hopper.cuh`: the PTX instructions, written from the PTX ISA; `cuda_bf16.h`), with a generated
registry that gives every kernel named in `names` (CuPy's `name_expressions`, or the module's
`extern "C"` kernels) a launch thunk behind the one entry point `emu_launch` (`launch_entry.h`).
`build_module(..., traced=True)` is its instrumented variant for the X-ray's address tracer (`tracing`).
`build_library(...)` is the same recipe for the emulator's other libraries (the Hopper model probes,
the tensor-map encoder). Libraries are cached by a digest of everything that goes into them (texts, stand-ins,
flags, this file), so a source edit rebuilds and nothing else does, in `emulator/` of the per-user root of
`private_dirs` (a folder nobody else can write, swap or own; `UnsafeFolder` otherwise). Each library has
its sha256 beside it, written when it was built; `load` checks it before the library is opened, and
`build_library` rebuilds one that fails it (a truncated library would crash the process when loaded).

Every build passes `-fno-gnu-unique`: function-local statics of inline functions and templates (a
kernel's static __shared__ arrays) are otherwise STB_GNU_UNIQUE symbols, which the dynamic linker
makes one instance per process even across libraries loaded RTLD_LOCAL, so two emulator libraries
would silently share shared memory. `-fsanitize=alignment` turns a misaligned vector access (a
sticky fault on the GPU) into an abort with the address.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from moonvit_kernels import private_dirs

HERE = Path(__file__).resolve().parent
PORTABLE_STANDINS = ("prelude.h", "ptx.cuh", "cuda_bf16.h", "launch_entry.h")
HOPPER_STANDINS = ("prelude.h", "cuda_bf16.h", "hopper.cuh", "ptx_sm90.cuh", "launch_entry.h")
DYNAMIC_SMEM = "extern __shared__ __align__(16) unsigned char smem_raw[];"
_DYNAMIC_SMEM_ANY = re.compile(r"extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?unsigned\s+char\s+smem_raw\[\];")
_EXTERN_C_KERNEL = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(')
_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)

CXXFLAGS = (
    "-std=c++20",
    "-Og",  # builds ~40% shorter than at -O1, the emulated kernels as fast (measured on 2 cores)
    "-fPIC",
    "-fno-gnu-unique",
    "-shared",
    "-pthread",
    "-Wall",
    "-Wno-unknown-pragmas",
    "-Wno-unused-function",
    "-Wno-unused-variable",
    "-fsanitize=alignment",
    "-fno-sanitize-recover=all",
)


def compiler() -> str | None:
    """The host C++ compiler used ($CXX, else g++), or None when there is none."""
    return shutil.which(os.environ.get("CXX", "g++"))


def extern_c_kernels(code: str) -> tuple[str, ...]:
    """Names of the `extern "C" __global__` kernels in `code` (what CuPy finds without name expressions)."""
    return tuple(_EXTERN_C_KERNEL.findall(code))


def registry_source(names: Sequence[str], hopper: bool) -> str:
    """C++ text of the kernel registry: one launch thunk per name, and `emu_launch` (launch_entry.h)."""
    launcher = "HopperLaunch" if hopper else "emu_entry::PlainLaunch"
    lines = []
    if hopper:
        lines += [
            "struct HopperLaunch {",
            "  template <typename F>",
            "  static void go(dim3 g, dim3 b, size_t smem, int regs, F body) {",
            "    emu::hopper::launch_async(g, b, smem, regs, body);",
            "  }",
            "};",
        ]
    lines.append("static const emu_entry::Entry kEmuKernels[] = {")
    for name in names:
        lines.append(f"    {{{_c_string(name)}, &emu_entry::thunk<&{name}, {launcher}>}},")
    lines += [
        "};",
        'extern "C" int emu_kernel_count() { return int(sizeof kEmuKernels / sizeof kEmuKernels[0]); }',
        'extern "C" const char* emu_kernel_name(int i) { return kEmuKernels[i].name; }',
        'extern "C" int emu_launch(const char* name, const unsigned* grid, const unsigned* block,',
        "                          unsigned long long smem, int regs_at_entry, int nargs, void** args,",
        "                          const unsigned long long* sizes, const unsigned long long* aligns,",
        "                          char* err, int errlen) {",
        "  for (const auto& k : kEmuKernels)",
        "    if (std::strcmp(k.name, name) == 0) {",
        "      const emu_entry::Call c{name, dim3{grid[0], grid[1], grid[2]}, dim3{block[0], block[1], block[2]},",
        "                              size_t(smem), regs_at_entry, nargs, args, sizes, aligns};",
        "      return k.run(c, err, errlen);",
        "    }",
        '  return emu_entry::refuse(err, errlen, std::string("no kernel named ") + name + " in this module");',
        "}",
    ]
    return "\n".join(lines) + "\n"


def _c_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


# A header inlined by `sources.load_source` sits between `#line 1 "header"` and the `#line N "file.cu"`
# that returns to its includer; the instruction headers among them are swapped for their stand-ins.
_INLINED_PTX = re.compile(r'#line 1 "(ptx(?:_sm90)?\.cuh)"\n.*?\n#line (\d+) "([^"]+\.cu)"', re.DOTALL)


def for_emulator(code: str) -> str:
    """`code` as the emulator compiles it: the inlined instruction headers (`ptx.cuh`, `ptx_sm90.cuh`,
    inline PTX) replaced by `#include`s of their stand-ins, and the dynamic shared-memory declaration
    taken from the emulated block."""
    code = _INLINED_PTX.sub(lambda m: f'#include "{m.group(1)}"\n#line {m.group(2)} "{m.group(3)}"', code)
    return _DYNAMIC_SMEM_ANY.sub("unsigned char* smem_raw = emu::dynamic_smem();", code)


def build_library(
    files: Mapping[str, str],
    main: str,
    *,
    standins: Sequence[str],
    tag: str,
    extra_flags: Sequence[str] = (),
    replace_standins: Mapping[str, str] | None = None,
    units: Sequence[tuple[str, Sequence[str]]] | None = None,
    flags: Sequence[str] = CXXFLAGS,
) -> Path:
    """Compile `files` (name -> C++ text, written to one folder) with `main` as the translation unit,
    `prelude.h` force-included and `standins` (from this folder, or their replacement texts) on the
    include path; return the path of the cached shared library. `units` instead compiles several
    translation units, each with its own extra flags (the tracer instruments the kernels, not its
    hooks), and links them; `flags` replaces the default compiler flags."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("the CUDA C emulator needs a C++20 compiler (g++ >= 11); set CXX")
    replace = dict(replace_standins or {})
    standin_text = {n: replace.get(n) or (HERE / n).read_text(encoding="utf-8") for n in standins}
    units = list(units) if units else [(main, ())]
    h = hashlib.sha256()
    for name, text in sorted({**files, **{f"include/{n}": t for n, t in standin_text.items()}}.items()):
        h.update(name.encode() + b"\0" + text.encode() + b"\0")
    h.update(repr((cxx, tuple(flags), tuple(extra_flags), [(u, tuple(f)) for u, f in units])).encode())
    h.update(Path(__file__).read_bytes())
    build = private_dirs.folder("emulator", f"{tag}_{h.hexdigest()[:16]}")
    lib_path = build / f"lib{tag}.so"
    if intact(lib_path):
        return lib_path
    with _build_lock(build):  # a second process asking for the same library waits for it instead of building it too
        if not intact(lib_path):
            _compile(files, main, standin_text, build, lib_path, tag, cxx, flags, extra_flags, units)
    return lib_path


def _digest_path(lib_path: Path) -> Path:
    return lib_path.with_name(lib_path.name + ".sha256")


def intact(lib_path: Path) -> bool:
    """True when `lib_path` and the sha256 its build wrote beside it are there and agree."""
    try:
        want = private_dirs.read_file(_digest_path(lib_path)).decode("ascii").strip()
        return private_dirs.sha256_of(lib_path) == want
    except (OSError, UnicodeDecodeError):
        return False


def load(lib_path: Path, mode: int = ctypes.DEFAULT_MODE) -> ctypes.CDLL:
    """Open the library `build_library` returned, once its folder is checked again and its sha256 is the one
    written when it was built (RuntimeError otherwise: opening a damaged library can crash the process)."""
    private_dirs.verified(lib_path.parent, private_from=private_dirs.root())
    if not intact(lib_path):
        raise RuntimeError(f"{lib_path} is not the library that was built (sha256 differs): run again to rebuild it")
    return ctypes.CDLL(str(lib_path), mode=mode)


@contextlib.contextmanager
def _build_lock(build: Path) -> Iterator[None]:
    """An exclusive lock on `build` across processes (none where fcntl is missing: both then build, and the
    atomic rename keeps the result whole)."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    fd = os.open(build / ".lock", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)  # never truncates a file
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _compile(
    files: Mapping[str, str],
    main: str,
    standin_text: Mapping[str, str],
    build: Path,
    lib_path: Path,
    tag: str,
    cxx: str,
    flags: Sequence[str],
    extra_flags: Sequence[str],
    units: Sequence[tuple[str, Sequence[str]]],
) -> None:
    src, inc = build / "src", build / "include"
    src.mkdir(parents=True, exist_ok=True)
    inc.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (src / name).write_text(text, encoding="utf-8")
    for name, text in standin_text.items():
        (inc / name).write_text(text, encoding="utf-8")
    tmp = build / f"lib.{os.getpid()}.so"
    compile_flags = [f for f in (*flags, *extra_flags) if f != "-shared"]
    head = [cxx, *compile_flags, f"-I{inc}", f"-I{src}", "-include", str(inc / "prelude.h")]
    if len(units) == 1:
        _run([[*head, *units[0][1], "-shared", str(src / units[0][0]), "-o", str(tmp)]], tag)
    else:
        objects = [str(build / f"{Path(u).stem}.{os.getpid()}.o") for u, _ in units]
        _run([[*head, *f, "-c", str(src / u), "-o", o] for (u, f), o in zip(units, objects, strict=True)], tag)
        _run([[cxx, "-shared", "-pthread", *objects, "-o", str(tmp)]], tag)
    digest = build / f"lib.{os.getpid()}.sha256"
    digest.write_text(private_dirs.sha256_of(tmp) + "\n", encoding="ascii")
    os.replace(digest, _digest_path(lib_path))
    os.replace(tmp, lib_path)  # atomic: a concurrent builder never loads a half-written library


def _run(commands: Sequence[Sequence[str]], tag: str) -> None:
    """Run the compiler `commands` side by side; RuntimeError with the first failing one and its stderr."""
    running = [
        (cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)) for cmd in commands
    ]
    finished = [(cmd, p.communicate()[1], p.returncode) for cmd, p in running]
    for cmd, stderr, rc in finished:
        if rc != 0:
            raise RuntimeError(f"building the CUDA C emulator ({tag}) failed:\n{' '.join(cmd)}\n{stderr[-6000:]}")


@functools.cache
def build_module(code: str, names: tuple[str, ...], hopper: bool = False, traced: bool = False) -> ctypes.CDLL:
    """The emulator library of one module: `code` (a `.cu` text, local headers already inlined)
    and a launch thunk for each kernel in `names`. Hopper modules are built against the sm_90a
    models (wgmma, tensor copies, mbarrier, setmaxnreg) and launched by their scheduler. `traced`: the
    address tracer's variant of a portable module (`tracing`): the same unit compiled with
    `-fsanitize=thread` and `tracing.TRACE_FLAGS` against the ptx.cuh stand-in `tracing.patch_ptx`
    makes, linked with `trace_hooks.cpp`, which records the accesses the instrumentation reports."""
    missing = [n for n in _LOCAL_INCLUDE.findall(code) if n not in (*PORTABLE_STANDINS, *HOPPER_STANDINS)]
    if missing:
        raise ValueError(f"the module includes {missing}: inline local headers first (sources.load_source does)")
    if traced and hopper:
        raise ValueError("the address tracer instruments portable modules only (no Hopper models)")
    main = "module.cpp"
    files = {
        main: for_emulator(code) + '\n#include "launch_entry.h"\n' + registry_source(names, hopper),
    }
    if traced:
        lib_path = _build_traced(files, main)
    else:
        kernel_dir = HERE.parents[1] / "cuda_backend"  # the kernels' own headers (sm90.cuh, common.cuh)
        lib_path = build_library(
            files,
            main,
            standins=(*HOPPER_STANDINS, "sm90.cuh") if hopper else PORTABLE_STANDINS,
            replace_standins={"sm90.cuh": (kernel_dir / "sm90.cuh").read_text(encoding="utf-8")} if hopper else None,
            tag="hopper" if hopper else "module",
        )
    lib = load(lib_path)
    lib.emu_launch.restype = ctypes.c_int
    lib.emu_kernel_name.restype = ctypes.c_char_p
    return lib


def _build_traced(files: dict[str, str], main: str) -> Path:
    """The cached traced library of module unit `main` in `files` (see `build_module`)."""
    from moonvit_kernels.tools.emulation import tracing

    files = {**files, "trace_hooks.cpp": (HERE / "trace_hooks.cpp").read_text(encoding="utf-8")}
    return build_library(
        files,
        main,
        standins=PORTABLE_STANDINS,
        replace_standins={"ptx.cuh": tracing.patch_ptx((HERE / "ptx.cuh").read_text(encoding="utf-8"))},
        tag="traced",
        units=[(main, ("-fsanitize=thread",)), ("trace_hooks.cpp", ())],
        flags=tracing.TRACE_FLAGS,
    )
