"""The compile tier: build every CUDA C kernel with NVRTC for real GPU architectures, no GPU needed.

    python -m moonvit_kernels.tools.nvrtc_check [--arch sm_90 ...] [--head-dims 128 24 ...]
    python -m moonvit_kernels.tools.nvrtc_check --cubin-dir DIR [--arch sm_90 sm_90a] [--head-dims 128]

Each `.cu` file in `moonvit_kernels/cuda_backend` is compiled to a cubin by NVRTC from the pip
wheels (`cuda-bindings` + `nvidia-cuda-nvrtc`, headers from `nvidia-cuda-runtime`) with the same
source text, options (`sources.compile_options`: C++17, `-ftz=true` as CuPy compiles, headers of
the NVRTC's CUDA major) and template instantiations the CuPy launchers use, plus:
`-Werror=all-warnings` (front-end warnings fail the build) and `-Xptxas=-v,--warn-on-spills`
(ptxas reports registers, spills and shared memory per kernel). The report is a table
kernel | arch | registers | spills | stack | shared memory, and a kernel fails when it did not
compile, spills, has a larger stack frame than allowed (`KernelSpec.max_stack`), exceeds its
register bound (`KernelSpec.max_registers`) or the register file's launch rule (`launch_rules`:
per warp, per SM sub-partition), or needs more shared memory than the architecture gives a block.

Architectures: sm_80 and sm_90 build the portable files; sm_90a (`--gpu-architecture=sm_90a`, the
arch-specific features wgmma, tensor copies and setmaxnreg) builds the Hopper files
(`sources.HOPPER_SOURCES`) and nothing else (`KernelSpec.builds_for`). All instantiations of one
file go to NVRTC in one program per architecture.

`--cubin-dir DIR` also writes each instantiation's cubin, built on its own (one NVRTC program per
kernel, so the file holds that kernel only), as `DIR/<label>.<arch>.cubin` with the catalogue's
label (`gemm_bf16_tc_bf16_gelu_tanh.sm_90.cubin`, `flash_attn_bf16_hd128.sm_90.cubin`), and
`DIR/manifest.json` (per file: kernel name expression, mangled name, ptxas figures, status), for
disassembly with `nvdisasm` or `cuobjdump -sass`. Without `--arch` it builds sm_90 only (add
`--arch sm_90 sm_90a` for the Hopper kernels' cubins, e.g. `gemm_bf16_sm90_bn128_bf16_gelu_tanh.sm_90a.cubin`).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import re
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from moonvit_kernels import launch_rules, registry
from moonvit_kernels.cuda_backend import sources as kcuda
from moonvit_kernels.cuda_backend.nvrtc import CompileError, compile_cubin, compile_text, nvrtc_options, nvrtc_version  # noqa: F401

# Worker processes start by spawn: a fork of a process with other threads (the X-ray runs this beside a
# thread that imports modules) can copy a held import lock into the child, which then waits forever.
_SPAWN = multiprocessing.get_context("spawn")

ARCHS = ("sm_80", "sm_90", "sm_90a")  # sm_90a: the Hopper files only
# Shared memory one block may use after opting in (cudaFuncAttributeMaxDynamicSharedMemorySize).
SMEM_PER_BLOCK = kcuda.OPTIN_SMEM_PER_BLOCK


def check_arch(arch: str) -> None:
    """ValueError unless `arch` is one the check knows the shared-memory limit of."""
    if arch not in SMEM_PER_BLOCK:
        raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(SMEM_PER_BLOCK)}")


# Head dims compiled by default: the real model (128), the tiny test config (24), and one more.
DEFAULT_HEAD_DIMS = (128, 24, 64)


@dataclass
class PtxasInfo:
    """What ptxas -v says about one entry function."""

    registers: int = -1
    stack_bytes: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    static_smem: int = 0


@dataclass
class KernelReport:
    """One kernel instantiation compiled for one architecture, and the limits it broke."""

    spec: kcuda.KernelSpec
    arch: str
    info: PtxasInfo | None
    problems: list[str] = field(default_factory=list)
    mangled: str = ""  # the entry function's symbol in the cubin ("" when it did not compile)

    @property
    def ok(self) -> bool:
        return not self.problems


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas_log(log: str) -> dict[str, PtxasInfo]:
    """Per entry function (mangled name): registers, stack, spills, static shared memory from ptxas -v."""
    infos: dict[str, PtxasInfo] = {}
    entry = props_of = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            entry = m.group(1)
            infos.setdefault(entry, PtxasInfo())
        elif m := _PROPS.search(line):
            props_of = m.group(1)
        elif (m := _STACK.search(line)) and props_of in infos:
            info = infos[props_of]
            info.stack_bytes, info.spill_stores, info.spill_loads = (int(g) for g in m.groups())
        elif (m := _USED.search(line)) and entry is not None:
            infos[entry].registers = int(m.group(1))
            if s := _SMEM.search(line):
                infos[entry].static_smem = int(s.group(1))
    return infos


def warnings_in(log: str) -> list[str]:
    """Lines of a build log that report a warning (ptxas warnings are not errors by themselves)."""
    return [line.strip() for line in log.splitlines() if "warning" in line.lower()]


# ============================================================================ the check
def judge(spec: kcuda.KernelSpec, info: PtxasInfo | None, arch: str, warnings: Sequence[str] = ()) -> list[str]:
    """The limits `spec` breaks on `arch`, given ptxas's report `info` and the build's warnings."""
    problems = [f"warning: {w}" for w in warnings]
    if info is None or info.registers < 0:
        return [*problems, "no ptxas report for this kernel (not instantiated?)"]
    if info.spill_stores or info.spill_loads:
        problems.append(f"spills {info.spill_stores} B stores / {info.spill_loads} B loads")
    if info.stack_bytes > spec.max_stack:
        problems.append(f"{info.stack_bytes} B stack frame (local memory) > allowed {spec.max_stack} B")
    if info.registers > spec.max_registers:
        problems.append(f"{info.registers} registers > bound {spec.max_registers}")
    if register_problem := launch_rules.register_problem(info.registers, spec.threads):
        problems.append(register_problem)
    smem = info.static_smem + spec.dynamic_smem
    limit = SMEM_PER_BLOCK.get(arch, 48 * 1024)
    if smem > limit:
        problems.append(f"{smem} B shared memory > {limit} B per block on {arch}")
    return problems


def check_source(source: str, specs: Sequence[kcuda.KernelSpec], arch: str) -> list[KernelReport]:
    """Compile one file for one arch and judge each of its kernels against its limits."""
    try:
        _, log, lowered = compile_cubin(source, [s.name for s in specs], arch)
    except CompileError as e:
        return [KernelReport(s, arch, None, [f"did not compile: {e}"]) for s in specs]
    infos = parse_ptxas_log(log)
    warns = warnings_in(log)
    reports = []
    for s in specs:
        info = infos.get(lowered.get(s.name, ""))
        reports.append(KernelReport(s, arch, info, judge(s, info, arch, warns), lowered.get(s.name, "")))
    return reports


def build_cubin(spec: kcuda.KernelSpec, arch: str) -> tuple[bytes, KernelReport]:
    """Compile one instantiation alone for `arch` (its cubin holds that kernel only) and judge it.

    Returns (cubin, report); the cubin is b"" when NVRTC rejected the source (the report says why)."""
    try:
        cubin, log, lowered = compile_cubin(spec.source, [spec.name], arch)
    except CompileError as e:
        return b"", KernelReport(spec, arch, None, [f"did not compile: {e}"])
    info = parse_ptxas_log(log).get(lowered.get(spec.name, ""))
    return cubin, KernelReport(spec, arch, info, judge(spec, info, arch, warnings_in(log)), lowered.get(spec.name, ""))


def _cubin_job(job: tuple[kcuda.KernelSpec, str]) -> tuple[str, bytes, KernelReport]:
    spec, arch = job
    cubin, report = build_cubin(spec, arch)
    return cubin_filename(spec, arch), cubin, report


def cubin_filename(spec: kcuda.KernelSpec, arch: str) -> str:
    """`<label>.<arch>.cubin`, e.g. `flash_attn_bf16_hd128.sm_90.cubin`."""
    return f"{spec.label}.{arch}.cubin"


def build_cubins(
    arch: str = "sm_90", head_dims: Sequence[int] = (128,), workers: int = 1
) -> list[tuple[str, bytes, KernelReport]]:
    """Every catalogue instantiation (attention at `head_dims`) built alone for `arch`, with the
    launchers' options (`sources.compile_options`) plus the check's (`nvrtc_options`).

    Returns `(file name, cubin bytes, report)` per instantiation, in catalogue order; ValueError for
    an architecture without a shared-memory entry in `sources.OPTIN_SMEM_PER_BLOCK`. Only the
    instantiations built for `arch` (`registry.specs_for`): sm_90a gives the Hopper kernels alone."""
    check_arch(arch)
    jobs = [(s, arch) for s in registry.specs_for(arch, tuple(head_dims))]
    if workers <= 1:
        return [_cubin_job(j) for j in jobs]
    with ProcessPoolExecutor(max_workers=workers, mp_context=_SPAWN) as pool:
        return list(pool.map(_cubin_job, jobs))


def write_cubins(built: Sequence[tuple[str, bytes, KernelReport]], directory: str | Path) -> list[Path]:
    """Write each non-empty cubin into `directory` (created) and `manifest.json`; return the paths written."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written, manifest = [], []
    for filename, cubin, r in built:
        if cubin:
            (out / filename).write_bytes(cubin)
            written.append(out / filename)
        manifest.append(
            {
                "file": filename if cubin else None,
                "kernel": r.spec.name,
                "label": r.spec.label,
                "source": r.spec.source,
                "arch": r.arch,
                "mangled": r.mangled,
                "threads": r.spec.threads,
                "dynamic_smem": r.spec.dynamic_smem,
                "ptxas": asdict(r.info) if r.info else None,
                "problems": r.problems,
            }
        )
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    written.append(out / "manifest.json")
    return written


def _check_job(job: tuple[str, tuple[kcuda.KernelSpec, ...], str]) -> list[KernelReport]:
    return check_source(*job)


def run_checks(
    archs: Sequence[str] = ARCHS,
    head_dims: Sequence[int] = DEFAULT_HEAD_DIMS,
    workers: int = 1,
    stages: Sequence[str] | None = None,
) -> list[KernelReport]:
    """Compile every kernel instantiation (of the registry `stages` only, when given) for every arch it builds
    for (`KernelSpec.builds_for`); one NVRTC program per (file, arch)."""
    wanted = None
    if stages is not None:
        wanted = {e.label for e in registry.entries(tuple(head_dims), "cuda") if e.stage in stages}
    jobs = [
        (src, tuple(specs), arch)
        for arch in archs
        for src, specs in kcuda.specs_by_source(
            [s for s in registry.specs_for(arch, tuple(head_dims)) if wanted is None or s.label in wanted]
        ).items()
    ]
    if workers <= 1:
        results = [_check_job(j) for j in jobs]
    else:
        with ProcessPoolExecutor(max_workers=workers, mp_context=_SPAWN) as pool:
            results = list(pool.map(_check_job, jobs))
    return [r for rs in results for r in rs]


def format_table(reports: Sequence[KernelReport]) -> str:
    """kernel | arch | registers | spills | shared memory | status, one row per report."""
    head = ("kernel", "arch", "registers", "spills st/ld B", "stack B", "shared memory static + dynamic B", "status")
    rows = [head]
    for r in reports:
        i = r.info
        regs = f"{i.registers} (<= {r.spec.max_registers})" if i else "-"
        spills = f"{i.spill_stores}/{i.spill_loads}" if i else "-"
        stack = f"{i.stack_bytes} (<= {r.spec.max_stack})" if i else "-"
        smem = f"{i.static_smem} + {r.spec.dynamic_smem}" if i else "-"
        status = "ok" if r.ok else "FAIL: " + "; ".join(p.splitlines()[0] for p in r.problems)
        rows.append((r.spec.name, r.arch, regs, spills, stack, smem, status))
    widths = [max(len(row[c]) for row in rows) for c in range(len(head) - 1)]
    lines = []
    for k, row in enumerate(rows):
        lines.append(" | ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)) + " | " + row[-1])
        if k == 0:
            lines.append("-+-".join("-" * w for w in widths) + "-+-------")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the table; exit status 1 when any kernel fails its limits."""
    p = argparse.ArgumentParser(prog="python -m moonvit_kernels.tools.nvrtc_check", description=__doc__.splitlines()[0])
    p.add_argument("--arch", nargs="+", help="GPU architectures (default: sm_80 sm_90 sm_90a; sm_90 with --cubin-dir)")
    p.add_argument("--head-dims", nargs="+", type=int, default=list(DEFAULT_HEAD_DIMS), help="attention head dims")
    p.add_argument("--workers", type=int, default=2, help="parallel NVRTC processes")
    p.add_argument("--cubin-dir", help="also write every instantiation's cubin and manifest.json here")
    args = p.parse_args(argv)
    try:
        archs = args.arch or (["sm_90"] if args.cubin_dir else list(ARCHS))
        for a in archs:
            check_arch(a)
        for hd in args.head_dims:
            kcuda.check_head_dim(hd)
    except ValueError as e:
        p.error(str(e))
    if args.cubin_dir:
        built = [b for a in archs for b in build_cubins(a, args.head_dims, args.workers)]
        written = write_cubins(built, args.cubin_dir)
        print(f"wrote {len(written) - 1} cubins and manifest.json to {args.cubin_dir}")
        reports = [r for _, _, r in built]
    else:
        reports = run_checks(archs, args.head_dims, args.workers)
    print(format_table(reports))
    failed = [r for r in reports if not r.ok]
    for r in failed:
        for prob in r.problems:
            print(f"\n{r.spec.name} [{r.arch}]: {prob}", file=sys.stderr)
    print(f"\n{len(reports) - len(failed)}/{len(reports)} kernel builds within limits")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
