"""The CUDA C modules' GPU build, rehearsed on the CPU emulator's device (`gpu_check --simulate`).

On a GPU the launchers build each module the way a GPU needs: the portable files through CuPy's
`RawModule` (its compile pipeline, `cupy.cuda.compiler`, which adds options of its own), the Hopper files
through `nvrtc_check.compile_text(..., strict=False)` to a cubin. On the emulated device g++ builds the same
text instead, so a fault in those steps (an option NVRTC 13.0 rejects, a header CuPy's pipeline does not
find, a wrapper with the wrong signature) would first show on the GPU. With `MOONVIT_REHEARSE_GPU_BUILDS=1`
(gpu_check --simulate sets it for its workers) the launchers on the emulated device also run those steps, up
to loading the binary, which needs a device: `cupy_build` runs CuPy's pipeline exactly as `RawModule` does
except for the device's compute capability (sm_90 given instead of read) and the final load;
`BUILDS` records each rehearsed build and its outcome for the report.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence

ENV_VAR = "MOONVIT_REHEARSE_GPU_BUILDS"
ARCH = "90"  # the compute capability CuPy would read from an H100 / H200
BUILDS: list[tuple[str, str]] = []  # (what was built, outcome)


def on() -> bool:
    """True when the launchers on the emulated device rehearse the GPU's builds too."""
    return os.environ.get(ENV_VAR, "") == "1"


def cupy_build(source: str, text: str, options: Sequence[str], names: Sequence[str]) -> dict[str, str] | None:
    """Compile `text` with CuPy's own pipeline as `cupy.RawModule(code=text, options=options,
    name_expressions=names)` would for an sm_90 device (CuPy's added options, its empty-file preprocess, NVRTC
    through CuPy's bindings), up to the cubin; returns {name expression: mangled name}. Records the outcome in
    BUILDS; without CuPy, records that the build was not rehearsed and returns None. A failed compile raises
    (CuPy's CompileException), as RawModule would on the GPU."""
    what = f"CuPy RawModule {source} [{len(names)} names] (sm_{ARCH})"
    try:
        from cupy.cuda import compiler
    except ImportError as e:
        BUILDS.append((what, f"not rehearsed: CuPy is not installed ({e})"))
        return None
    # the only device query of the pipeline, answered with ARCH (CuPy's own rule, compiler.py)
    original = compiler._get_arch_for_options_for_nvrtc

    def arch_option(arch: str | None = None) -> tuple[str, str]:
        arch = arch or ARCH
        if not compiler._use_ptx and int(arch) <= int(compiler._get_max_compute_capability()):
            return f"-arch=sm_{arch}", "cubin"
        return f"-arch=compute_{arch}", "ptx"

    compiler._get_arch_for_options_for_nvrtc = arch_option
    try:
        opts = (*options, "-ftz=true")  # what _compile_with_cache_cuda adds before compiling
        compiler._preprocess("", opts, ARCH, "nvrtc")
        log = io.StringIO()
        cubin, mapping = compiler.compile_using_nvrtc(
            text, opts, ARCH, f"{source}", tuple(names), log_stream=log, cache_in_memory=False
        )
    except Exception as e:
        BUILDS.append((what, f"FAILED: {type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"))
        raise
    finally:
        compiler._get_arch_for_options_for_nvrtc = original
    lowered = {n: (m.decode() if isinstance(m, bytes) else str(m)) for n, m in (mapping or {}).items()}
    missing = [n for n in names if n not in lowered]
    if missing:
        BUILDS.append((what, f"FAILED: no kernel for {missing}"))
        raise RuntimeError(f"CuPy's build of {source} has no kernel for {missing}")
    BUILDS.append((what, f"built: {len(cubin)} B cubin, {len(lowered)} kernels"))
    return lowered


def record(what: str, outcome: str) -> None:
    """Note a rehearsed build that another module ran (the Hopper cubins)."""
    BUILDS.append((what, outcome))


def text() -> str:
    """One line per rehearsed build, for gpu_check's diagnostics."""
    return "\n".join(f"{what}: {outcome}" for what, outcome in BUILDS) or "no GPU build was rehearsed"
