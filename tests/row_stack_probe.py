"""The numpy 2.5 shim probe, run as a script with the CUDA simulator off (both tiers run this one file through
`helpers.row_stack_probe`):

    python tests/row_stack_probe.py [--simulate-numpy-2.5]

numpy 2.5 removed `np.row_stack`, which numba-cuda 0.30's arrayobj overloads at import (upstream issue 907).
The probe imports that module without the shim (does it still break?), then compiles a kernel through
`_cuda`'s scoped shim. `--simulate-numpy-2.5` deletes `np.row_stack` first (the main suite's older numpy).
Prints one JSON line: [what the unshimmed import said, the compiler, compiled ok, error, np.row_stack left].
"""

import importlib
import json
import sys

import numpy as np

if "--simulate-numpy-2.5" in sys.argv:
    import moonvit_kernels.reference  # noqa: F401 (scipy's numpy clone reads numpy.__all__, which names row_stack)

    if hasattr(np, "row_stack"):
        delattr(np, "row_stack")
import numba.cuda  # noqa: E402, F401

try:
    importlib.import_module("numba.cuda.np.arrayobj")
    unshimmed = "imported"
except AttributeError as e:
    unshimmed = str(e)
for name in [m for m in sys.modules if m.startswith("numba.cuda.np.arrayobj")]:
    del sys.modules[name]
from moonvit_kernels.numba_backend._cuda import COMPILER, cuda, float32  # noqa: E402
from moonvit_kernels.tools.compile_check import check_kernel  # noqa: E402


def twice(out, x):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x * float32(2.0)


report = check_kernel(twice, "void(float32[::1], float32)")
print(json.dumps([unshimmed, COMPILER, report.ok, report.error, hasattr(np, "row_stack")]))
