"""Benchmark the CUDA C kernels (through CuPy; the Hopper ones on sm_90) and the CupyBackend tower on a GPU.

    PYTHONPATH=. python benchmarks/bench_cupy.py [--tokens 1024 4096] [--repeats 20] [--out DIR] [--skip-tower]

A thin wrapper over `moonvit_kernels.tools.gpu_check` (sections b and c, backends cuda and hopper), which holds
the timing (CUDA events, warm-up, median and p10..p90), the baselines measured in the same run
(cuBLAS bf16 through torch or fp16 through CuPy, cuBLAS fp32 through CuPy, torch SDPA, a
device-to-device copy), the re-checks of every timed output against NumPy, and the report
(report.md, results.csv with formulas and units, PNGs) stamped with the GPU and package versions.
Without a GPU it says so in one line and exits with status 2 (`--simulate` runs the emulator).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from moonvit_kernels.tools.gpu_check import main as gpu_check


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096], help="patches per image (square grid)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "bench_cupy")
    p.add_argument("--skip-tower", action="store_true", help="kernels only")
    p.add_argument("--simulate", action="store_true", help="no GPU: the CUDA C emulator on the CPU, tiny sizes")
    args = p.parse_args(argv)
    sections = "kernels" if args.skip_tower else "kernels,tower"
    forwarded = ["--backends", "cuda,hopper", "--sections", sections, "--out", str(args.out)]
    if args.simulate:  # the simulated plan's own tiny sizes and single runs
        forwarded.append("--simulate")
    else:
        forwarded += ["--tokens", *map(str, args.tokens), "--repeats", str(args.repeats)]
    return gpu_check(forwarded)


if __name__ == "__main__":
    sys.exit(main())
