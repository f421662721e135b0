"""The PTX each emulator stand-in models: one row per device function of the real headers that holds an
`asm` statement (tests/test_ptx_conformance.py holds the real headers and the stand-ins to this table).

A row reads "the stand-in `stand_in` of emulation/<header>, by calling `model`, implements exactly this
PTX": the template with all modifiers (whitespace normalised as `asm_statements.normalise` does), the
output and input operands in order as (constraint, expression) — expression i is what `%i` names — and
the clobbers. `model` holds the calls the stand-in makes (none: the stand-in's body is the model itself).
The wgmma rows are generated from the immediates the model computes with (WGMMA_IMMEDIATES).
"""

from __future__ import annotations

from dataclasses import dataclass

from moonvit_kernels.tools.emulation.asm_statements import Operand


@dataclass(frozen=True)
class PtxModel:
    header: str  # the real header, relative to cuda_backend; the stand-in lives in emulation/<header>
    function: str
    template: str
    outputs: tuple[Operand, ...]
    inputs: tuple[Operand, ...]
    clobbers: tuple[str, ...]
    stand_in: str
    model: tuple[str, ...]


MEMORY = ("memory",)

# What emu::hopper::run_op computes for wgmma.mma_async: D = A·Bᵀ (+ D when scale-d), A and B K-major
# (not transposed) and not negated. The register-A form has no imm-trans-a.
WGMMA_IMMEDIATES = {"imm-scale-a": "1", "imm-scale-b": "1", "imm-trans-a": "0", "imm-trans-b": "0"}


def _regs(first: int, count: int) -> str:
    return ", ".join(f"%{i}" for i in range(first, first + count))


def _wgmma(n: int, a_in_regs: bool) -> PtxModel:
    """The row of wgmma_m64n{n}k16_rs / _ss: accumulators d[0..n/2) as %0.., then A, B, scale-d (a predicate)."""
    acc = n // 2
    accumulators = tuple(("+f", f"d[{i}]") for i in range(acc))
    names = [k for k in WGMMA_IMMEDIATES if not (a_in_regs and k == "imm-trans-a")]
    immediates = ", ".join(WGMMA_IMMEDIATES[k] for k in names)
    if a_in_regs:
        a, b, scale = "{" + _regs(acc, 4) + "}", f"%{acc + 4}", acc + 5
        inputs = (*(("r", f"a[{i}]") for i in range(4)), ("l", "desc_b"), ("r", "scale_d"))
        model = f"emu::hopper::wgmma_issue(d, {n}, 0, desc_b, scale_d != 0, a, site)"
    else:
        a, b, scale = f"%{acc}", f"%{acc + 1}", acc + 2
        inputs = (("l", "desc_a"), ("l", "desc_b"), ("r", "scale_d"))
        model = f"emu::hopper::wgmma_issue(d, {n}, desc_a, desc_b, scale_d != 0, nullptr, site)"
    name = f"wgmma_m64n{n}k16_{'rs' if a_in_regs else 'ss'}"
    template = (
        f"{{ .reg .pred p; setp.ne.b32 p, %{scale}, 0; wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 "
        f"{{{_regs(0, acc)}}}, {a}, {b}, p, {immediates}; }}"
    )
    return PtxModel("ptx_sm90.cuh", name, template, accumulators, inputs, MEMORY, name, (model,))


def _row(header, function, template, outputs=(), inputs=(), clobbers=MEMORY, model=()) -> PtxModel:
    model = (model,) if isinstance(model, str) else tuple(model)
    return PtxModel(header, function, template, tuple(outputs), tuple(inputs), clobbers, function, model)


_LDMATRIX_OUT = tuple(("=r", f"r[{i}]") for i in range(4))
_TMA = "cp.async.bulk.tensor.{}d.shared::cluster.global.mbarrier::complete_tx::bytes"
_MAP = ("l", "reinterpret_cast<unsigned long long>(map)")
_DST, _BAR = ("r", "sm90_smem_addr(dst)"), ("r", "sm90_smem_addr(bar)")

# fmt: off
MODELS: tuple[PtxModel, ...] = (
    # ---------------------------------------------------------------- ptx.cuh (sm_80)
    _row("ptx.cuh", "cp_async_16", "cp.async.cg.shared.global [%0], [%1], 16, %2;",
         inputs=[("r", "smem_u32(smem_dst)"), ("l", "gmem_src"), ("r", "src_bytes")]),
    _row("ptx.cuh", "cp_async_commit", "cp.async.commit_group;"),
    _row("ptx.cuh", "cp_async_wait", "cp.async.wait_group %0;", inputs=[("n", "N")]),
    _row("ptx.cuh", "ldmatrix_x4", "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];",
         outputs=_LDMATRIX_OUT, inputs=[("r", "smem_u32(smem_row)")], model="emu_ldmatrix(r, p, false)"),
    _row("ptx.cuh", "ldmatrix_x4_trans", "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];",
         outputs=_LDMATRIX_OUT, inputs=[("r", "smem_u32(smem_row)")], model="emu_ldmatrix(r, p, true)"),
    _row("ptx.cuh", "mma_bf16_16816",
         "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
         "{%0, %1, %2, %3};",
         outputs=[("+f", f"d[{i}]") for i in range(4)],
         inputs=[*(("r", f"a[{i}]") for i in range(4)), ("r", "b0"), ("r", "b1")], clobbers=()),
    # ---------------------------------------------------------------- ptx_sm90.cuh (sm_90a)
    _row("ptx_sm90.cuh", "mbar_init", "mbarrier.init.shared::cta.b64 [%0], %1;",
         inputs=[("r", "sm90_smem_addr(bar)"), ("r", "count")],
         model="emu::hopper::mbar_init(sm90_smem_addr(bar), count, site)"),
    _row("ptx_sm90.cuh", "fence_mbarrier_init", "fence.mbarrier_init.release.cluster;",
         model="emu::hopper::fence_mbarrier_init()"),
    _row("ptx_sm90.cuh", "mbar_arrive", "mbarrier.arrive.shared::cta.b64 _, [%0];",
         inputs=[("r", "sm90_smem_addr(bar)")], model="emu::hopper::mbar_arrive(sm90_smem_addr(bar))"),
    _row("ptx_sm90.cuh", "mbar_arrive_expect_tx", "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;",
         inputs=[("r", "sm90_smem_addr(bar)"), ("r", "bytes")],
         model=["emu::hopper::mbar_expect_tx(sm90_smem_addr(bar), bytes)",
                "emu::hopper::mbar_arrive(sm90_smem_addr(bar))"]),
    _row("ptx_sm90.cuh", "mbar_try_wait",
         "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }",
         outputs=[("=r", "ok")], inputs=[("r", "sm90_smem_addr(bar)"), ("r", "parity")],
         model="emu::hopper::mbar_try_wait_parity(sm90_smem_addr(bar), parity)"),
    _row("ptx_sm90.cuh", "tma_load_2d", _TMA.format(2) + " [%0], [%1, {%2, %3}], [%4];",
         inputs=[_DST, _MAP, ("r", "c0"), ("r", "c1"), _BAR],
         model="emu::hopper::tma_load_2d(sm90_smem_addr(dst), map, c0, c1, sm90_smem_addr(bar), site)"),
    _row("ptx_sm90.cuh", "tma_load_3d", _TMA.format(3) + " [%0], [%1, {%2, %3, %4}], [%5];",
         inputs=[_DST, _MAP, ("r", "c0"), ("r", "c1"), ("r", "c2"), _BAR],
         model="emu::hopper::tma_load(sm90_smem_addr(dst), map, 3, c, sm90_smem_addr(bar), site)"),
    _row("ptx_sm90.cuh", "tma_prefetch_map", "prefetch.tensormap [%0];", inputs=[_MAP],
         model="emu::hopper::read_map(map)"),
    _row("ptx_sm90.cuh", "fence_proxy_async", "fence.proxy.async.shared::cta;",
         model="emu::hopper::fence_proxy_async()"),
    _row("ptx_sm90.cuh", "wgmma_fence", "wgmma.fence.sync.aligned;", model="emu::hopper::wgmma_fence()"),
    _row("ptx_sm90.cuh", "wgmma_commit", "wgmma.commit_group.sync.aligned;", model="emu::hopper::wgmma_commit()"),
    _row("ptx_sm90.cuh", "wgmma_wait", "wgmma.wait_group.sync.aligned %0;", inputs=[("n", "N")],
         model="emu::hopper::wgmma_wait(N)"),
    # no instruction: pins the accumulators across the asynchronous MMA; the stand-in does nothing
    _row("ptx_sm90.cuh", "wgmma_fence_operands", "", outputs=[("+f", "d[i]")]),
    _wgmma(128, a_in_regs=False),
    _wgmma(256, a_in_regs=False),
    _wgmma(64, a_in_regs=False),
    _wgmma(64, a_in_regs=True),
    _wgmma(128, a_in_regs=True),
    _row("ptx_sm90.cuh", "setmaxnreg_inc", "setmaxnreg.inc.sync.aligned.u32 %0;", inputs=[("n", "REGS")],
         clobbers=(), model="emu::hopper::setmaxnreg(REGS, true)"),
    _row("ptx_sm90.cuh", "setmaxnreg_dec", "setmaxnreg.dec.sync.aligned.u32 %0;", inputs=[("n", "REGS")],
         clobbers=(), model="emu::hopper::setmaxnreg(REGS, false)"),
)
# fmt: on
