"""The real headers' inline PTX is exactly what the CPU emulator models (issue 28, class 1).

The emulator replaces ptx.cuh and ptx_sm90.cuh with stand-ins, so the CPU tiers never read the real asm
strings. emulation/ptx_models.py names, for each device function holding an `asm` statement, the PTX its
stand-in implements; here every asm statement under cuda_backend is held to that table both ways
(instruction and modifiers, operand order and constraints, immediates, clobbers), every row's stand-in must
exist and call the model the row names, and within a row the string must agree with the model's arguments.

Planted faults, applied to the header text in memory: `.trans` dropped from ldmatrix_x4_trans, a wgmma
transpose or scale immediate flipped, two mma.sync operands swapped, an operand's constraint changed, a
statement added or removed, a stand-in calling the wrong model. Each must be reported by name and line.
"""

from __future__ import annotations

import dataclasses

import pytest

from moonvit_kernels.tools.emulation import asm_statements, ptx_conformance, ptx_models

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(120)]

SOURCES = asm_statements.real_sources()
EMULATOR = asm_statements.emulator_sources()


def _report(problems: list[str]) -> str:
    return "\n\n".join(problems)


def _mutated(sources: dict[str, str], header: str, old: str, new: str) -> dict[str, str]:
    """`sources` with the first `old` of `header` replaced by `new` (which must occur: the fault is planted)."""
    assert old in sources[header], f"planted fault no longer applies: {old!r} not in {header}"
    return {**sources, header: sources[header].replace(old, new, 1)}


def test_every_asm_statement_matches_its_model():
    assert not (problems := ptx_conformance.asm_problems(SOURCES)), _report(problems)


def test_every_stand_in_exists_and_calls_its_model():
    assert not (problems := ptx_conformance.stand_in_problems(EMULATOR, SOURCES)), _report(problems)


def test_each_ptx_string_agrees_with_its_model_call():
    assert not (problems := ptx_conformance.model_problems()), _report(problems)


def test_the_parser_accounts_for_every_asm_keyword():
    """No asm statement escapes the check: every `asm` keyword of the real sources is a parsed statement."""
    for header, text in SOURCES.items():
        assert len(asm_statements.parse(text, header)) == asm_statements.count_asm_keywords(text), header
    assert {r.header for r in ptx_models.MODELS} == {"ptx.cuh", "ptx_sm90.cuh"}
    assert len(ptx_models.MODELS) == sum(len(asm_statements.parse(t, h)) for h, t in SOURCES.items())


def test_the_parser_reads_sections_across_comments_and_literals():
    text = (
        "// asm in a comment\n"
        "template <int N>\n__device__ void f(float (&d)[2], unsigned x) {\n"
        '  asm volatile("{\\n.reg .pred p;\\n"\n  // region: r\n  "op.x %0, %1, %2;\\n}\\n"\n'
        '      : "+f"(d[0]), "=r"(y) : "r"(smem( x )), "n"(N) : "memory", "cc");\n'
        '  asm("" ::: "memory");\n}\n'
    )
    first, second = asm_statements.parse(text, "t.cuh")
    assert (first.function, first.line, first.template) == ("f", 4, "{ .reg .pred p; op.x %0, %1, %2; }")
    assert first.outputs == (("+f", "d[0]"), ("=r", "y"))
    assert first.inputs == (("r", "smem( x )"), ("n", "N"))
    assert first.clobbers == ("memory", "cc")
    assert (second.template, second.outputs, second.inputs, second.clobbers) == ("", (), (), ("memory",))


# (header, old text, new text, what the report must say: function, file:line, expected vs found)
PLANTED = {
    "ldmatrix .trans dropped": (
        "ptx.cuh",
        "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
        [
            "ldmatrix_x4_trans (moonvit_kernels/cuda_backend/ptx.cuh:40)",
            "expected 'ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16', "
            "found 'ldmatrix.sync.aligned.m8n8.x4.shared.b16'",
        ],
    ),
    "wgmma imm-trans-a flipped": (
        "ptx_sm90.cuh",
        "}, %64, %65, p, 1, 1, 0, 0;",
        "}, %64, %65, p, 1, 1, 1, 0;",
        ["wgmma_m64n128k16_ss (moonvit_kernels/cuda_backend/ptx_sm90.cuh:103)", "imm-trans-a: expected 0, found 1"],
    ),
    "wgmma imm-scale-b flipped (A in registers)": (
        "ptx_sm90.cuh",
        "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;",
        "}, {%32, %33, %34, %35}, %36, p, 1, -1, 0;",
        ["wgmma_m64n64k16_rs (moonvit_kernels/cuda_backend/ptx_sm90.cuh:180)", "imm-scale-b: expected 1, found -1"],
    ),
    "wgmma scale-d predicate inverted": (
        "ptx_sm90.cuh",
        "setp.ne.b32 p, %130, 0;",
        "setp.eq.b32 p, %130, 0;",
        [
            "wgmma_m64n256k16_ss (moonvit_kernels/cuda_backend/ptx_sm90.cuh:128)",
            "expected 'setp.ne.b32', found 'setp.eq.b32'",
        ],
    ),
    "mma.sync A operands swapped": (
        "ptx.cuh",
        '"r"(a[1]), "r"(a[2])',
        '"r"(a[2]), "r"(a[1])',
        [
            "mma_bf16_16816 (moonvit_kernels/cuda_backend/ptx.cuh:49)",
            'input %5: expected "r"(a[1]), found "r"(a[2])',
            'input %6: expected "r"(a[2]), found "r"(a[1])',
        ],
    ),
    "mma.sync B registers swapped in the string": (
        "ptx.cuh",
        "{%8, %9}",
        "{%9, %8}",
        ["mma_bf16_16816 (moonvit_kernels/cuda_backend/ptx.cuh:49)", "expected '%8', found '%9'"],
    ),
    "cp.async global address as a 32-bit register": (
        "ptx.cuh",
        '"l"(gmem_src)',
        '"r"(gmem_src)',
        [
            "cp_async_16 (moonvit_kernels/cuda_backend/ptx.cuh:22)",
            'input %1: expected "l"(gmem_src), found "r"(gmem_src)',
        ],
    ),
    "cp.async.wait_group immediate fixed at 0": (
        "ptx.cuh",
        '"n"(N)',
        '"n"(0)',
        ["cp_async_wait (moonvit_kernels/cuda_backend/ptx.cuh:30)", 'input %0: expected "n"(N), found "n"(0)'],
    ),
    "tma coordinates swapped": (
        "ptx_sm90.cuh",
        '"r"(c0), "r"(c1), "r"(c2)',
        '"r"(c1), "r"(c0), "r"(c2)',
        ["tma_load_3d (moonvit_kernels/cuda_backend/ptx_sm90.cuh:68)", 'input %2: expected "r"(c0), found "r"(c1)'],
    ),
    "memory clobber dropped": (
        "ptx_sm90.cuh",
        '"r"(count) : "memory");',
        '"r"(count));',
        ["mbar_init (moonvit_kernels/cuda_backend/ptx_sm90.cuh:22)", "clobbers: expected ['memory'], found []"],
    ),
    "asm statement added": (
        "rope.cu",
        "#include",
        '__device__ void trap_here() { asm volatile("trap;"); }\n#include',
        ["trap_here (moonvit_kernels/cuda_backend/rope.cu:", "asm statement with no row", "found template: 'trap;'"],
    ),
    "asm statement removed": (
        "ptx_sm90.cuh",
        'asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");',
        "",
        ["fence_proxy_async (moonvit_kernels/cuda_backend/ptx_sm90.cuh)", "has no asm statement"],
    ),
}


@pytest.mark.parametrize("name", PLANTED)
def test_a_planted_fault_in_the_real_header_is_reported(name):
    header, old, new, expected = PLANTED[name]
    report = _report(ptx_conformance.asm_problems(_mutated(SOURCES, header, old, new)))
    for text in expected:
        assert text in report, f"{name}: {text!r} missing from the report:\n{report}"


STAND_IN_FAULTS = {
    "ldmatrix_x4_trans modelled without trans": (
        "ptx.cuh",
        "emu_ldmatrix(r, p, true)",
        "emu_ldmatrix(r, p, false)",
        "stand-in ldmatrix_x4_trans of emulation/ptx.cuh (row ptx.cuh ldmatrix_x4_trans): does not call the model",
    ),
    "a stand-in missing": (
        "ptx_sm90.cuh",
        "inline void fence_proxy_async()",
        "inline void fence_proxy_async_renamed()",
        "stand-in fence_proxy_async of emulation/ptx_sm90.cuh (row ptx_sm90.cuh fence_proxy_async): not defined",
    ),
    "wgmma stand-in of another shape": (
        "ptx_sm90.cuh",
        "wgmma_issue(d, 256,",
        "wgmma_issue(d, 128,",
        "stand-in wgmma_m64n256k16_ss of emulation/ptx_sm90.cuh (row ptx_sm90.cuh wgmma_m64n256k16_ss): does not call",
    ),
    "setmaxnreg stand-in ignoring its immediate": (
        "ptx_sm90.cuh",
        "emu::hopper::setmaxnreg(REGS, true)",
        "emu::hopper::setmaxnreg(240, true)",
        "does not use the immediate REGS",
    ),
}


@pytest.mark.parametrize("name", STAND_IN_FAULTS)
def test_a_planted_fault_in_a_stand_in_is_reported(name):
    header, old, new, expected = STAND_IN_FAULTS[name]
    report = _report(ptx_conformance.stand_in_problems(_mutated(EMULATOR, header, old, new), SOURCES))
    assert expected in report, f"{name}: {expected!r} missing from the report:\n{report}"


def _row(function: str) -> ptx_models.PtxModel:
    return next(r for r in ptx_models.MODELS if r.function == function)


def _replaced_row(function: str, **changes) -> tuple[ptx_models.PtxModel, ...]:
    return tuple(dataclasses.replace(r, **changes) if r.function == function else r for r in ptx_models.MODELS)


ROW_FAULTS = {
    "ldmatrix .trans row on the plain model": (
        _replaced_row("ldmatrix_x4_trans", model=("emu_ldmatrix(r, p, false)",)),
        "the PTX has .trans, the model is emu_ldmatrix(r, p, false)",
    ),
    "wgmma row with a transposed B": (
        _replaced_row(
            "wgmma_m64n64k16_ss", template=_row("wgmma_m64n64k16_ss").template.replace("1, 1, 0, 0;", "1, 1, 0, 1;")
        ),
        "immediates {'imm-scale-a': '1', 'imm-scale-b': '1', 'imm-trans-a': '0', 'imm-trans-b': '1'}",
    ),
    "wgmma row on a model of another width": (
        _replaced_row("wgmma_m64n128k16_rs", model=(_row("wgmma_m64n128k16_rs").model[0].replace("128", "64"),)),
        "m64n128k16 with 64 accumulators, the model takes n=64",
    ),
    "wgmma register-A row on the shared-memory model": (
        _replaced_row(
            "wgmma_m64n64k16_rs", model=(_row("wgmma_m64n64k16_rs").model[0].replace(", a, site", ", nullptr, site"),)
        ),
        "A in registers",
    ),
    "setmaxnreg.dec row on the increasing model": (
        _replaced_row("setmaxnreg_dec", model=("emu::hopper::setmaxnreg(REGS, true)",)),
        "the PTX is .dec",
    ),
}


@pytest.mark.parametrize("name", ROW_FAULTS)
def test_a_row_whose_string_and_model_disagree_is_reported(name):
    models, expected = ROW_FAULTS[name]
    report = _report(ptx_conformance.model_problems(models))
    assert expected in report, f"{name}: {expected!r} missing from the report:\n{report}"
