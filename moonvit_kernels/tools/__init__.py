"""The tools that check, measure and stand in for a GPU; the lesson (reference, kernels, launchers, model,
plots, exercises) lives outside this package and imports it only where a notebook teaches a tool
(tests/test_module_borders.py holds that border).

- `emulation/`: the CPU emulator of the CUDA C kernels (a device with CuPy's interface the launchers run on);
- `simulator.py`: what numba's CUDA simulator lacks (shared arrays filled with NaN, warp rules, thread order);
- `compile_check.py`, `nvrtc_check.py`: the compile tier (registers, spills, shared memory, SASS budgets);
- `xray/`: the kernel X-ray without a GPU (traces, SASS, rooflines);
- `gpu_check/`: the one-command report on a GPU (`python -m moonvit_kernels.gpu_check`).
"""

from pathlib import Path

SOURCE_ROOT = Path(__file__).resolve().parents[2]  # a source tree: the folder of moonvit_kernels/, tests/, benchmarks/
