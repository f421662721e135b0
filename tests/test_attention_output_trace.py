"""flash_attn_bf16's output stores, traced on the CPU emulator (moonvit_kernels.tools.xray.emulator_trace).

The kernel's accumulator fragment holds 4-byte bf16 pairs; it stages the normalised O tile through shared
memory (the Q tile's space) and writes whole 16-byte chunks of rows, so each warp store request on `out`
touches only the 32-byte sectors its bytes fill (hd 128: 2 rows x 256 bytes = 16 sectors), where the pairs
touched twice that. The staging itself must not trade that for bank conflicts. Results of the kernel at
awkward sizes (row tails, head dims 8..128) are checked against the reference in tests/stages/test_attention.py.
"""

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_flash_attn_bf16_writes_whole_rows_of_out():
    from moonvit_kernels.tools.emulation import compiler
    from moonvit_kernels.tools.xray import emulator_trace, trace

    if compiler() is None:
        pytest.skip("no C++ compiler for the emulator")
    (job,) = [j for j in emulator_trace.jobs() if j.name == "flash_attn_bf16"]
    sites = trace.merge_sites(trace.analyse(job.run()))
    (store,) = [s for s in sites if s.kind == "STG" and s.array == "out"]
    assert (store.per_request, store.factor, store.worst) == (16, 1, 1), store
    assert "uint4" in store.code and store.where.startswith("attention.cu:"), store
    # the staging: fragment pairs into the Q tile's rows, then 16-byte row chunks back out
    staged = [s for s in sites if s.space == "shared" and s.array == "Qs"]
    (stage,) = [s for s in staged if s.store and s.where.startswith("common.cuh:")]  # store_float2 of the pairs
    (restage,) = [s for s in staged if not s.store and s.where == store.where]
    assert (stage.per_request, stage.factor) == (1, 1), stage
    assert (restage.per_request, restage.factor) == (4, 1), restage  # 512 bytes: 4 quarter-warp wavefronts
