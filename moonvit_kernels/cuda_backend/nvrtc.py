"""NVRTC, the compiler that turns a CUDA C file into a cubin: the run-time build of the Hopper kernels
(`hopper_launchers`) and the compile tier's (`moonvit_kernels.tools.nvrtc_check`), one function.

`compile_text(text, filename, names, arch, strict)` compiles with the launchers' run-time options
(`sources.runtime_options`), plus warnings as errors and spill warnings when `strict` (the compile tier's);
a compile that succeeded once is read back from `compile_cache`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from moonvit_kernels import compile_cache
from moonvit_kernels.cuda_backend import sources as kcuda


class CompileError(RuntimeError):
    """NVRTC rejected a source (the message holds NVRTC's log)."""


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise RuntimeError("the compile check needs cuda-bindings (pip install 'numba-cuda[cu13]')") from e
    return nvrtc


@functools.cache
def nvrtc_version() -> tuple:
    """NVRTC's (major, minor) and the cuda-bindings version that calls it."""
    return tuple(_checked(_nvrtc().nvrtcVersion(), "nvrtcVersion")), compile_cache.versions("cuda-bindings")


def _checked(result: tuple, what: str):
    nvrtc = _nvrtc()
    err, *rest = result
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"{what} failed: {err}")
    return rest[0] if len(rest) == 1 else rest


def nvrtc_options(arch: str, strict: bool = True) -> list[str]:
    """NVRTC options for `arch`: the run-time options the launchers compile with (`sources.runtime_options`:
    the shared options, the architecture, ptxas -v for the register log) and, for the compile check
    (`strict`), warnings as errors and spill warnings. `-Werror=all-warnings` is a compile-tier option
    only: NVRTC 13.0 (the CUDA of driver 580) does not know it."""
    opts = list(kcuda.runtime_options(arch))
    if strict:
        opts += ["-Werror=all-warnings", "-Xptxas=--warn-on-spills"]
    return opts


def compile_cubin(source: str, names: Sequence[str], arch: str) -> tuple[bytes, str, dict[str, str]]:
    """Compile kernel file `source` (local headers inlined) to a cubin for `arch`; see `compile_text`."""
    return compile_text(kcuda.load_source(source), source, names, arch)


def compile_text(
    text: str, filename: str, names: Sequence[str], arch: str, strict: bool = True
) -> tuple[bytes, str, dict[str, str]]:
    """Compile CUDA C++ `text` with the name expressions `names` for `arch` (`nvrtc_options(arch, strict)`;
    the launchers compile with `strict=False`, the run-time options).

    Returns (cubin, NVRTC + ptxas log, {name expression: mangled name}); CompileError on failure. A compile
    that succeeded once is read back from `compile_cache` (the key holds the text, names, arch and options)."""
    opts = nvrtc_options(arch, strict)
    entry = compile_cache.key("nvrtc", [text, filename, tuple(names), arch, tuple(opts), nvrtc_version()])
    hit = compile_cache.load(entry)
    if hit is not None:
        header, cubin = hit
        return cubin, header["log"], header["lowered"]
    cubin, log, lowered = _compile_text(text, filename, names, arch, opts)
    compile_cache.store(entry, {"log": log, "lowered": lowered}, cubin)
    return cubin, log, lowered


def _compile_text(
    text: str, filename: str, names: Sequence[str], arch: str, options: Sequence[str]
) -> tuple[bytes, str, dict[str, str]]:
    nvrtc = _nvrtc()
    prog = _checked(nvrtc.nvrtcCreateProgram(text.encode(), filename.encode(), 0, [], []), "nvrtcCreateProgram")
    try:
        for n in names:
            _checked(nvrtc.nvrtcAddNameExpression(prog, n.encode()), f"nvrtcAddNameExpression({n})")
        opts = [o.encode() for o in options]
        (status,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        size = _checked(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        buf = b" " * size
        _checked(nvrtc.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
        log = buf.rstrip(b"\0 ").decode(errors="replace")
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(f"{filename} for {arch}: {status}\n{log}")
        lowered = {}
        for n in names:
            mangled = _checked(nvrtc.nvrtcGetLoweredName(prog, n.encode()), f"nvrtcGetLoweredName({n})")
            lowered[n] = mangled.decode() if isinstance(mangled, bytes) else str(mangled)
        size = _checked(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        cubin = b" " * size
        _checked(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        return cubin, log, lowered
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
