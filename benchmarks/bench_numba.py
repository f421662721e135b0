"""Benchmark the numba.cuda kernels, every version, and the whole `numba` forward on a GPU.

    PYTHONPATH=. python benchmarks/bench_numba.py [--tokens 1024] [--repeats 10] [--out DIR] [--skip-tower]
    PYTHONPATH=. python benchmarks/bench_numba.py --simulate     # a smoke run under the CUDA simulator

A thin wrapper over `moonvit_kernels.tools.gpu_check` (sections b and c, numba kernels only): every GEMM
version (v1 naive, v2 shared tiles, v3 register blocking) at the encoder's shapes vs cuBLAS fp32,
attention v1/v2 vs torch SDPA, the memory-bound kernels vs a device-to-device copy, timed with
CUDA events (median and p10..p90 after warm-up), TFLOP/s or GB/s with the formula, every timed
output re-checked against NumPy; the tower checked against the NumPy reference and timed per stage.
Without a GPU it says so in one line (status 2); what can be known without one is the compile
tier: `python -m moonvit_kernels.tools.compile_check`. Simulator times say nothing about a GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from moonvit_kernels.tools.gpu_check import main as gpu_check


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[1024], help="patches per image (square grid)")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "bench_numba")
    p.add_argument("--skip-tower", action="store_true", help="kernels only")
    p.add_argument("--simulate", action="store_true", help="no GPU: numba's CUDA simulator, tiny sizes")
    args = p.parse_args(argv)
    sections = "kernels" if args.skip_tower else "kernels,tower"
    forwarded = ["--backends", "numba", "--sections", sections, "--out", str(args.out)]
    if args.simulate:  # the simulated plan's own tiny sizes and single runs
        forwarded.append("--simulate")
    else:
        forwarded += ["--tokens", *map(str, args.tokens), "--repeats", str(args.repeats)]
    return gpu_check(forwarded)


if __name__ == "__main__":
    sys.exit(main())
