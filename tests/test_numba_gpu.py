"""gpu tier: the numba forward at real K3 sizes and the register table on this GPU (skipped without a GPU).

Each numba kernel's own real-size check lives with its stage (tests/stages/test_<stage>.py, class TestGpu), at
the sizes of `tiers.GPU_GRID`: an image and a video packed together, D = 1024, 12 heads of 128.
"""

import numpy as np
import pytest
from helpers import assert_close, random_pixels
from tiers import GPU_GRID, K3

from moonvit_kernels import reference as ref
from moonvit_kernels.compare import compare_stages
from moonvit_kernels.model import MoonViT
from moonvit_kernels.weights import random_weights

pytestmark = pytest.mark.gpu


def test_numba_forward_real_dimensions():
    cfg = K3.replace(vt_num_hidden_layers=2)
    w = random_weights(cfg, seed=5)
    pv = random_pixels(GPU_GRID, cfg.patch_size, seed=6)
    out, stages = MoonViT(cfg, w, backend="numba").forward(pv, GPU_GRID, return_intermediates=True, as_numpy=True)
    ref_out, ref_stages = ref.vision_forward(pv, GPU_GRID, w, cfg, dtype=np.float64, return_intermediates=True)
    report = compare_stages(stages, ref_stages, names=("numba (GPU)", "numpy float64"))
    assert report.ok, report.table()
    for o, r in zip(out, ref_out, strict=True):
        assert_close(o, r, rtol=2e-3, atol=2e-3, name="projected")


def test_register_table_holds_for_this_gpus_compiler():
    """The launch checks trust the compiler's table in `registers.KERNEL_REGISTERS` (from nvJitLink in the
    compile tier); the driver compiles the same PTX itself here, and its counts must not exceed the table either."""
    from moonvit_kernels import registry
    from moonvit_kernels.numba_backend._cuda import COMPILER, cuda
    from moonvit_kernels.numba_backend.registers import registers_for

    KERNEL_REGISTERS = registers_for(COMPILER)

    over = {}
    for entry in registry.numba_entries():
        fn = entry.python_function()
        regs = cuda.jit(entry.numba_signature())(fn).get_regs_per_thread()
        regs = max(regs.values()) if isinstance(regs, dict) else regs
        if regs > KERNEL_REGISTERS.get(fn.__name__, 0):
            over[fn.__name__] = (regs, KERNEL_REGISTERS.get(fn.__name__))
    assert not over, f"(this GPU's registers, table) for kernels above the table: {over}"
