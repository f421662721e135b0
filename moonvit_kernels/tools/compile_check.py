"""Compile tier: build every numba.cuda kernel for a real GPU (sm_90, H100/H200) without one, with each compiler.

Run `python -m moonvit_kernels.tools.compile_check` for a table of
kernel | registers | spill bytes | stack | shared memory, or add `--json` for machine-readable output.
`--arch sm_80|sm_89|sm_90` picks the target (default sm_90); `--compiler` picks numba-cuda,
numba-cuda-mlir, or `each` installed one (the default: one process per compiler, in parallel);
`--sass` also disassembles every kernel (nvdisasm) and holds its innermost loops to the SASS budgets
below; `--cubin-dir DIR` also writes each kernel's binary as `DIR/<kernel>.<arch>.cubin` (numba-cuda,
e.g. `gemm_v3_gelu_tanh.sm_90.cubin`, one per specialisation) or `DIR/<kernel>.<arch>.mlir.cubin`
(numba-cuda-mlir) for `nvdisasm -c`. From Python: `build_cubins(cc)` -> `[(label, cubin, report)]` with
the compiler of this process (`_cuda.COMPILER`). The exit status is 1 when any kernel fails a check.

What is checked, per kernel and compiler:
  1. The compiler builds it to PTX for the target (`cuda.compile_ptx(..., cc=...)`, with the driver
     lookups both compilers make replaced by the target: `driverless_target`). This catches typing
     errors the CUDA simulator lets through (it runs kernels as plain Python).
  2. nvJitLink (the `nvidia-nvjitlink` wheel, a numba-cuda[cu13] dependency, called through
     `cuda.bindings.nvjitlink`) assembles the PTX to SASS with `-verbose`; its info log
     (ptxas's `-v` report) gives registers per thread, spill stores/loads, stack frame and shared memory.
  3. No spills, and registers per thread <= the kernel's limit. `register_table_problems` compares the
     registers with the compiler's table (`registers.registers_for`, from the registry: what the launch checks use).
  4. With `--sass`: no loop keeps a variable in local memory (LDL and STL), and the hot loops keep their budgets
     (`MAX_INSTRUCTIONS_PER_FFMA`, `MAX_PASS_INSTRUCTIONS`), the same for both compilers.
The pip-installed toolkit is used on purpose: a system `ptxas` may be older and reject newer PTX.

Which kernels: every numba entry of `moonvit_kernels.registry` (`KernelEntry.python_function()` with the
signature its module holds, `KernelEntry.numba_signature()`), each held to its entry's `max_registers`
(`launch_rules.max_registers_for(threads_per_block)` where the launch shape needs fewer than
DEFAULT_MAX_REGISTERS: above it the block cannot launch; registers go to warps in units of 256 and to each
of an SM's 4 sub-partitions, so 168 for 384 threads, not 170).

The simulator must be off in this process (`NUMBA_ENABLE_CUDASIM` unset or 0): `main` removes the
variable before numba is first imported, so the tests run this module in a subprocess.
Shared memory as ptxas reports it includes the 1 KiB that sm_90 reserves in every block that uses any.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from moonvit_kernels.numba_backend.driverless import driverless_target, link, ptx_isa

TARGET_CC = (9, 0)
# Architectures `--arch` accepts: A100, L4/RTX 40xx, H100/H200.
ARCHES = {"sm_80": (8, 0), "sm_89": (8, 9), "sm_90": (9, 0)}
DEFAULT_MAX_REGISTERS = 128
PACKAGE = "moonvit_kernels.numba_backend"

# SASS budgets of innermost loops (`--sass`; measured on sm_90, compile-only, model, no GPU), per compiler
# (today the same for both):
# - every innermost loop with FFMAs in a kernel whose registry entry has `hot_loop`: at most this many instructions per
#   FFMA (numba `for ... in range` loops cost ~24 at attention v2's hd 128; `while` loops 1.6-3.4);
MAX_INSTRUCTIONS_PER_FFMA = {"numba-cuda": 4.0, "numba-cuda-mlir": 4.0}
# - the innermost loop holding a barrier in these kernels (rope's per-head pass: 29 instructions under
#   numba-cuda, 32 under numba-cuda-mlir): at most this many;
MAX_PASS_INSTRUCTIONS = {"numba-cuda": {"rope2d_kernel": 32}, "numba-cuda-mlir": {"rope2d_kernel": 32}}
# - no innermost loop of any kernel both stores and loads local memory: that keeps a variable in a stack
#   frame across iterations (find_item's binary search under numba-cuda-mlir when lo/hi were updated in an
#   if/else). A loop that only fills a local array is allowed (libdevice's cos/sin slow path for huge
#   angles stores its 6-word table in a loop; the hot path never runs it).


@dataclass
class KernelReport:
    """What the compile tier learnt about one kernel; `error` is None when it compiled."""

    module: str
    kernel: str
    signature: str
    max_registers: int
    registers: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    stack_bytes: int | None = None
    shared_bytes: int | None = None
    error: str | None = None
    compiler: str = ""  # `_cuda.COMPILER` that built it
    ptx_version: str | None = None  # the PTX ISA of its PTX, e.g. "9.0" (a CUDA 13.0 driver accepts up to 9.0)
    # with `--sass`: the kernel's innermost loops, {"size", "fma", "ldl", "stl", "bar"} instruction counts each
    loops: list[dict[str, int]] | None = None

    @property
    def spill_bytes(self) -> int | None:
        if self.spill_stores is None or self.spill_loads is None:
            return None
        return self.spill_stores + self.spill_loads

    def problems(self) -> list[str]:
        """Why this kernel fails the tier (empty list: it passes)."""
        if self.error is not None:
            return [f"does not compile: {self.error}"]
        out = []
        if self.registers is None or self.spill_bytes is None:
            out.append("ptxas report not found in the nvJitLink log")
            return out
        if self.spill_bytes:
            out.append(f"spills ({self.spill_stores} bytes stored, {self.spill_loads} bytes loaded)")
        if self.registers > self.max_registers:
            out.append(f"uses {self.registers} registers, limit {self.max_registers}")
        return out + self.sass_problems()

    def sass_problems(self) -> list[str]:
        """The innermost loops that break a SASS budget of this kernel's compiler (empty without `loops`)."""
        if self.loops is None:
            return []
        out = []
        for loop in self.loops:
            if loop["ldl"] and loop["stl"]:
                out.append(
                    f"a variable in local memory across loop iterations: {loop['ldl']} LDL and {loop['stl']} STL "
                    f"in a loop of {loop['size']} instructions"
                )
        from moonvit_kernels import registry

        per_fma = MAX_INSTRUCTIONS_PER_FFMA.get(self.compiler)
        if per_fma is not None and self.kernel.split("#")[0] in registry.hot_loop_labels():
            for loop in self.loops:
                if loop["fma"] and loop["size"] / loop["fma"] > per_fma:
                    out.append(f"hot loop of {loop['size']} instructions for {loop['fma']} FFMA (limit {per_fma}/FFMA)")
        limit = MAX_PASS_INSTRUCTIONS.get(self.compiler, {}).get(self.kernel.split("#")[0])
        if limit is not None:
            for loop in self.loops:
                if loop["bar"] and loop["size"] > limit:
                    out.append(f"loop with a barrier of {loop['size']} instructions (limit {limit})")
        return out

    @property
    def ok(self) -> bool:
        return not self.problems()

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "spill_bytes": self.spill_bytes, "ok": self.ok, "problems": self.problems()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KernelReport:
        names = cls.__dataclass_fields__.keys()
        return cls(**{k: v for k, v in d.items() if k in names})


# ============================================================================ the ptxas report
_FUNCTION_PROPERTIES = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_LINKER_SUMMARY = re.compile(r"used (\d+) registers.*?(\d+) stack, (\d+) bytes smem", re.IGNORECASE)
_PTXAS_REGISTERS = re.compile(r"Used (\d+) registers")


def parse_ptxas_log(log: str) -> dict[str, int]:
    """Read registers, spills, stack and shared memory of the (single) kernel in a ptxas `-v` log.

    Lines used: `N bytes stack frame, N bytes spill stores, N bytes spill loads` (ptxas) and
    nvJitLink's `used N registers, ..., N stack, N bytes smem, ...`. With several functions in one
    log the largest value of each field is returned. Missing fields are absent from the dict.
    """
    out: dict[str, int] = {}

    def keep(key: str, value: str) -> None:
        out[key] = max(out.get(key, 0), int(value))

    for stack, stores, loads in _FUNCTION_PROPERTIES.findall(log):
        keep("stack_bytes", stack)
        keep("spill_stores", stores)
        keep("spill_loads", loads)
    for registers, stack, smem in _LINKER_SUMMARY.findall(log):
        keep("registers", registers)
        keep("stack_bytes", stack)
        keep("shared_bytes", smem)
    if "registers" not in out:
        for registers in _PTXAS_REGISTERS.findall(log):
            keep("registers", registers)
    return out


# ============================================================================ compiling
def check_kernel(
    fn: Callable,
    signature: str,
    max_registers: int = DEFAULT_MAX_REGISTERS,
    module: str = "",
    cc: tuple[int, int] = TARGET_CC,
) -> KernelReport:
    """Compile one kernel's Python function for `signature` to PTX then SASS (`sm_{cc}`); never raises."""
    return build_kernel(fn, signature, max_registers, module, cc)[0]


def build_kernel(
    fn: Callable,
    signature: str,
    max_registers: int = DEFAULT_MAX_REGISTERS,
    module: str = "",
    cc: tuple[int, int] = TARGET_CC,
) -> tuple[KernelReport, bytes | None]:
    """`check_kernel`, also returning the kernel's cubin for `sm_{cc}` (None when it did not compile)."""
    from moonvit_kernels.numba_backend._cuda import COMPILER, cuda

    report = KernelReport(
        module=module, kernel=fn.__name__, signature=signature, max_registers=int(max_registers), compiler=COMPILER
    )
    try:
        from moonvit_kernels.numba_backend.nvvm import require_nvvm

        require_nvvm()  # NVVM found (or the prepared one unpacked) and its PTX linkable, before the first compile
        with driverless_target(cc):
            ptx, _ = cuda.compile_ptx(fn, signature, cc=cc)
        report.ptx_version = ptx_isa(ptx)
        cubin, log = link(ptx, arch_name(cc))
    except Exception as e:  # a compile error is a result of this tier, not a crash of it
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else ""
        report.error = f"{type(e).__name__}: {first_line}"[:500]
        return report, None
    for key, value in parse_ptxas_log(log).items():
        setattr(report, key, value)
    return report, cubin


def arch_name(cc: tuple[int, int]) -> str:
    """`(9, 0)` -> `"sm_90"`."""
    return f"sm_{cc[0]}{cc[1]}"


def parse_arch(arch: str) -> tuple[int, int]:
    """`"sm_90"` -> `(9, 0)`; only the architectures in ARCHES."""
    if arch not in ARCHES:
        raise ValueError(f"arch {arch!r} is not one of {sorted(ARCHES)}")
    return ARCHES[arch]


def kernel_modules() -> list[str]:
    """Names of the modules holding the registry's numba kernels, sorted."""
    from moonvit_kernels import registry

    return sorted({e.module_path for e in registry.numba_entries()})


def check_all(modules: Sequence[str] | None = None, cc: tuple[int, int] = TARGET_CC) -> list[KernelReport]:
    """Compile every registry numba kernel of `modules` (full module names; default: all of them)."""
    return [report for report, _ in _build_all(modules, cc)]


def build_cubins(
    cc: tuple[int, int] = TARGET_CC, modules: Sequence[str] | None = None
) -> list[tuple[str, bytes, KernelReport]]:
    """Every kernel's cubin for `sm_{cc}`: `(label, cubin bytes, report)` per compiled instantiation.

    `label` is the kernel's specialised name (e.g. `gemm_v3_gelu_tanh`, `attention_v2_hd128_q32_k16`),
    safe as a file name. Kernels that fail to compile are left out (their reports say why: `check_all`).
    Needs a process where numba runs with the CUDA simulator off (raises RuntimeError otherwise).
    """
    from moonvit_kernels.numba_backend._cuda import COMPILER
    from moonvit_kernels.numba_backend.compilers import NUMBA_CUDA

    if COMPILER == NUMBA_CUDA and importlib.import_module("numba").config.ENABLE_CUDASIM:
        raise RuntimeError("build_cubins needs numba with the CUDA simulator off: run it in a fresh process")
    out = []
    for report, cubin in _build_all(modules, cc):
        if cubin is not None:
            out.append((_file_label(report.kernel), cubin, report))
    return out


def cubin_name(report: KernelReport, cc: tuple[int, int]) -> str:
    """`<kernel>.sm_XY.cubin` (numba-cuda) or `<kernel>.sm_XY.mlir.cubin` (numba-cuda-mlir)."""
    from moonvit_kernels.numba_backend.compilers import NUMBA_CUDA_MLIR

    suffix = ".mlir" if report.compiler == NUMBA_CUDA_MLIR else ""
    return f"{_file_label(report.kernel)}.{arch_name(cc)}{suffix}.cubin"


def _file_label(kernel: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", kernel)


def write_cubins(directory: str, cc: tuple[int, int] = TARGET_CC, modules: Sequence[str] | None = None) -> list[str]:
    """Write `<label>.sm_XY.cubin` for every kernel into `directory` (created); returns the paths written."""
    return _write_cubins(directory, _build_all(modules, cc), cc)


def _write_cubins(directory: str, built: list[tuple[KernelReport, bytes | None]], cc: tuple[int, int]) -> list[str]:
    os.makedirs(directory, exist_ok=True)
    paths = []
    for report, cubin in built:
        if cubin is not None:
            path = os.path.join(directory, cubin_name(report, cc))
            with open(path, "wb") as f:
                f.write(cubin)
            paths.append(path)
    return paths


def innermost_loops(cubin: bytes) -> list[dict[str, int]]:
    """Instruction counts of the innermost loops of a cubin's kernels (nvdisasm): size, FFMAs, LDL, STL, barriers."""
    from moonvit_kernels.tools.xray.sass import disassemble

    def count(loop: Any, opcode: str) -> int:
        return sum(i.opcode == opcode for i in loop.own)

    return [
        {
            "size": loop.size,
            "fma": loop.fmas,
            "ldl": count(loop, "LDL"),
            "stl": count(loop, "STL"),
            "bar": loop.mix["bar"],
        }
        for fn in disassemble(cubin)
        if not fn.name.startswith("__")
        for loop in fn.innermost
    ]


def _add_loops(built: list[tuple[KernelReport, bytes | None]]) -> None:
    for report, cubin in built:
        if cubin is not None:
            report.loops = innermost_loops(cubin)


def _build_all(modules: Sequence[str] | None, cc: tuple[int, int]) -> list[tuple[KernelReport, bytes | None]]:
    from moonvit_kernels import registry

    built: list[tuple[KernelReport, bytes | None]] = []
    broken: set[str] = set()  # modules that do not import: one report each
    for entry in registry.numba_entries(modules):
        if entry.module in broken:
            continue
        try:
            fn, signature = entry.python_function(), entry.numba_signature()
        except Exception as e:
            broken.add(entry.module)
            built.append((KernelReport(entry.module, "<import>", "", 0, error=f"{type(e).__name__}: {e}"[:500]), None))
            continue
        built.append(_build_entry(entry, fn, signature, cc))
    _disambiguate([report for report, _ in built])
    return built


NUMBA_DISTS = ("numba", "numba-cuda", "numba-cuda-mlir", "llvmlite", "nvidia-nvjitlink", "cuda-bindings")


def _build_entry(entry: Any, fn: Callable, signature: str, cc: tuple[int, int]) -> tuple[KernelReport, bytes | None]:
    """`build_kernel` for registry entry `entry`, read back from `compile_cache` when this package's sources, the
    compiler and the entry are those of an earlier build."""
    from moonvit_kernels import compile_cache
    from moonvit_kernels.numba_backend._cuda import COMPILER

    name = compile_cache.key(
        "numba",
        [COMPILER, compile_cache.versions(*NUMBA_DISTS), compile_cache.package_digest(), cc, entry.module_path,
         entry.kernel, entry.args, signature, entry.max_registers],
    )  # fmt: skip
    hit = compile_cache.load(name)
    if hit is not None:
        return KernelReport.from_dict(hit[0]), hit[1]
    report, cubin = build_kernel(fn, signature, entry.max_registers, entry.module, cc)
    if cubin is not None:
        compile_cache.store(name, asdict(report), cubin)
    return report, cubin


def _disambiguate(reports: list[KernelReport]) -> None:
    """Number kernels that share a module and a name (e.g. one factory, several variants)."""
    seen: dict[tuple[str, str], int] = {}
    for r in reports:
        seen[(r.module, r.kernel)] = seen.get((r.module, r.kernel), 0) + 1
    count: dict[tuple[str, str], int] = {}
    for r in reports:
        key = (r.module, r.kernel)
        if seen[key] > 1:
            count[key] = count.get(key, 0) + 1
            r.kernel = f"{r.kernel}#{count[key]}"


# ============================================================================ output
def format_table(reports: Sequence[KernelReport], cc: tuple[int, int] = TARGET_CC) -> str:
    """A fixed-width table: module | kernel | registers (limit) | spill bytes | stack | shared | status."""
    header = ("module", "kernel", "registers", "spill bytes", "stack", "shared mem", "status")
    rows = [header]
    for r in reports:

        def show(v: int | None) -> str:
            return "-" if v is None else str(v)

        registers = "-" if r.registers is None else f"{r.registers} / {r.max_registers}"
        status = "ok" if r.ok else "FAIL: " + "; ".join(r.problems())
        rows.append(
            (r.module, r.kernel, registers, show(r.spill_bytes), show(r.stack_bytes), show(r.shared_bytes), status)
        )
    widths = [max(len(row[i]) for row in rows[:]) for i in range(len(header) - 1)]
    lines = []
    for i, row in enumerate(rows):
        lines.append(" | ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)) + " | " + row[-1])
        if i == 0:
            lines.append("-+-".join("-" * w for w in widths) + "-+-" + "-" * len(header[-1]))
    failed = sum(not r.ok for r in reports)
    by = " and ".join(sorted({r.compiler for r in reports if r.compiler})) or "numba"
    lines.append(
        f"\n{len(reports)} kernels compiled for sm_{cc[0]}{cc[1]} by {by} (registers per thread, bytes per block; "
        f"shared as ptxas reports it: on sm_90 with the 1 KiB reserve of each block): {failed} failed"
    )
    return "\n".join(lines)


def register_table_problems(reports: Sequence[KernelReport]) -> list[str]:
    """Kernels missing from their compiler's register table (`registers.registers_for`, from the registry), above
    it (the launch checks read it), or more than `registry.REGISTER_SPREAD` below it (a number no build of the
    listed toolchains produced: a placeholder)."""
    from moonvit_kernels import registry
    from moonvit_kernels.numba_backend.registers import registers_for

    out = []
    for r in reports:
        if r.registers is None:
            continue
        table = registers_for(r.compiler)
        stored = table.get(r.kernel)
        if stored is None:
            out.append(
                f"{r.compiler}: {r.kernel} has no registry entry with its registers (moonvit_kernels/registry.py)"
            )
        elif r.registers > stored:
            out.append(
                f"{r.compiler}: {r.kernel} uses {r.registers} registers, the table holds {stored}: regenerate it"
            )
        elif stored - r.registers > registry.REGISTER_SPREAD:
            out.append(
                f"{r.compiler}: {r.kernel} uses {r.registers} registers, the table holds {stored}, more than "
                f"{registry.REGISTER_SPREAD} above any measured build: measure it (registry.REGISTERS_MEASURED_WITH)"
            )
    return out


def toolchain_problem() -> str | None:
    """None when this process's nvJitLink is one the registry's register numbers were measured with, else why."""
    from moonvit_kernels import registry
    from moonvit_kernels.numba_backend.nvvm import nvjitlink_version

    found = nvjitlink_version()
    if found is None:
        return "nvJitLink is not installed"
    have = f"{found[0]}.{found[1]}"
    if have not in registry.REGISTER_NVJITLINKS:
        return (
            f"the registry's register numbers were measured with nvJitLink {', '.join(registry.REGISTER_NVJITLINKS)}, "
            f"this is {have}: measure every kernel with it and add it to registry.REGISTER_NVJITLINKS"
        )
    return None


# ============================================================================ one process per compiler
def _build_here(
    compiler: str, modules: Sequence[str] | None, cc: tuple[int, int], sass: bool
) -> list[tuple[KernelReport, bytes | None]]:
    """Build with `compiler` in this process (it must be the one `_cuda` chose, or `_cuda` not imported yet)."""
    from moonvit_kernels.numba_backend.compilers import ENV_VAR

    os.environ[ENV_VAR] = compiler
    from moonvit_kernels.numba_backend._cuda import COMPILER

    if COMPILER != compiler:
        raise RuntimeError(f"this process already builds with {COMPILER}; run {compiler} in a fresh process")
    from moonvit_kernels.numba_backend.nvvm import NvvmUnavailable, require_nvvm

    try:
        require_nvvm()  # what a launcher checks first: a missing or mismatched NVVM is one report, not 25 errors
    except NvvmUnavailable as e:
        return [(KernelReport("-", "<toolchain>", "", 0, error=str(e)[:500], compiler=compiler), None)]
    built = _build_all(modules, cc)
    if sass:
        _add_loops(built)
    return built


def _build_elsewhere(compilers: Sequence[str], argv: Sequence[str]) -> list[KernelReport]:
    """Run this command once per compiler, in parallel subprocesses (`--compiler C --json` added to `argv`)."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    children = {
        c: subprocess.Popen(
            [sys.executable, "-m", f"{PACKAGE}.compile_check", *argv, "--compiler", c, "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for c in compilers
    }
    reports = []
    for compiler, child in children.items():
        out, err = child.communicate()
        try:
            reports += [KernelReport.from_dict(d) for d in json.loads(out)]
        except json.JSONDecodeError:
            tail = (err or out).strip().splitlines()[-1:] or ["no output"]
            reports.append(KernelReport("-", "<compile_check>", "", 0, error=tail[0][:500], compiler=compiler))
    return reports


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: compile every kernel with each compiler, print the tables (or JSON); exit 1 on any failure."""
    from moonvit_kernels.numba_backend.compilers import COMPILERS, compiler_name, installed, installed_compilers

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print a JSON list of per-kernel reports")
    parser.add_argument("--module", action="append", help="only this kernel module (e.g. attention); repeatable")
    parser.add_argument("--arch", default=arch_name(TARGET_CC), choices=sorted(ARCHES), help="target architecture")
    parser.add_argument(
        "--compiler",
        default="each",
        choices=("each", *COMPILERS, "mlir"),
        help="which compiler builds the kernels (default: each installed one, one process each)",
    )
    parser.add_argument("--sass", action="store_true", help="also hold every kernel's loops to the SASS budgets")
    parser.add_argument(
        "--cubin-dir", metavar="DIR", help="also write every kernel's cubin to DIR as <kernel>.<arch>[.mlir].cubin"
    )
    args = parser.parse_args(argv)
    cc = parse_arch(args.arch)
    if "numba" in sys.modules and os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        parser.error("numba was already imported with NUMBA_ENABLE_CUDASIM on; run this in a fresh process")
    os.environ.pop("NUMBA_ENABLE_CUDASIM", None)
    compilers = installed_compilers() if args.compiler == "each" else [compiler_name(args.compiler)]
    missing = [c for c in compilers if not installed(c)]
    if missing or not compilers:
        parser.error(f"compiler not installed: {', '.join(missing) or 'numba-cuda or numba-cuda-mlir'}")
    modules = None if not args.module else [f"{PACKAGE}.{m}" for m in args.module]
    if len(compilers) > 1:
        passed = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--json"]
        passed = [a for i, a in enumerate(passed) if a != "--compiler" and (i == 0 or passed[i - 1] != "--compiler")]
        reports = _build_elsewhere(compilers, passed)
    else:
        built = _build_here(compilers[0], modules, cc, args.sass)
        reports = [report for report, _ in built]
        if args.cubin_dir:
            _write_cubins(args.cubin_dir, built, cc)
    if args.json:
        print(json.dumps([r.to_dict() for r in reports], indent=1))
    else:
        for compiler in compilers:
            print(format_table([r for r in reports if r.compiler == compiler], cc) + "\n")
    return 0 if reports and all(r.ok for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
