"""Differences between the real headers' inline PTX, the table of emulation/ptx_models.py and the stand-ins.

Each function returns a list of problems, one readable paragraph each (empty: they agree):
`asm_problems` — every asm statement of the real sources against its table row, both ways;
`stand_in_problems` — every row's stand-in defined in the emulator, calling the model the row names;
`model_problems` — within a row, the PTX string against the model call's arguments (ldmatrix's `.trans`,
wgmma's shape, A operand and immediates, setmaxnreg's direction).
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from moonvit_kernels.tools.emulation.asm_statements import AsmStatement, Operand, definitions, normalise, parse
from moonvit_kernels.tools.emulation.ptx_models import MODELS, WGMMA_IMMEDIATES, PtxModel

TABLE = "moonvit_kernels/tools/emulation/ptx_models.py"
_TOKEN = re.compile(r"%\d+|[^\s,{}\[\];]+|[,{}\[\];]")


def _where(header: str, line: int | None, function: str) -> str:
    return f"{function} (moonvit_kernels/cuda_backend/{header}{'' if line is None else f':{line}'})"


def template_difference(expected: str, found: str) -> str:
    """Where two normalised PTX templates first differ, token by token, with the tokens around it."""
    e, f = _TOKEN.findall(expected), _TOKEN.findall(found)
    i = next((k for k, (a, b) in enumerate(zip(e, f, strict=False)) if a != b), min(len(e), len(f)))
    lo = max(0, i - 6)
    text = (
        f"first difference at token {i}: expected {e[i] if i < len(e) else '<end>'!r}, "
        f"found {f[i] if i < len(f) else '<end>'!r}\n"
        f"    expected: ...{' '.join(e[lo : i + 6])}...\n    found:    ...{' '.join(f[lo : i + 6])}..."
    )
    if len(expected) <= 200 and len(found) <= 200:
        text += f"\n    expected template: {expected!r}\n    found template:    {found!r}"
    return text


def wgmma_immediates(template: str) -> dict[str, str]:
    """The named immediates after the predicate of a wgmma.mma_async template (empty if none)."""
    m = re.search(r"wgmma\.mma_async\S* \{[^}]*\}, (\{[^}]*\}|%\d+), %\d+, p, ([^;]*);", template)
    if not m:
        return {}
    names = [k for k in WGMMA_IMMEDIATES if not (m.group(1).startswith("{") and k == "imm-trans-a")]
    values = [v.strip() for v in m.group(2).split(",")]
    found = dict(zip(names, values, strict=False))
    if len(values) != len(names):
        found["count"] = str(len(values))
    return found


def _operand_differences(row: PtxModel, st: AsmStatement) -> list[str]:
    lines = []
    for kind, first, exp, got in (
        ("output", 0, row.outputs, st.outputs),
        ("input", len(st.outputs), row.inputs, st.inputs),
    ):
        if len(exp) != len(got):
            lines.append(f"{len(exp)} {kind} operands expected, {len(got)} found")
        for k, (a, b) in enumerate(zip(exp, got, strict=False)):
            if a != b:
                lines.append(f"{kind} %{first + k}: expected {_show(a)}, found {_show(b)}")
    return lines


def _show(op: Operand) -> str:
    return f'"{op[0]}"({op[1]})'


def _differences(row: PtxModel, st: AsmStatement) -> list[str]:
    lines = []
    if row.template != st.template:
        want, have = wgmma_immediates(row.template), wgmma_immediates(st.template)
        for name in sorted(set(want) | set(have)):
            if want.get(name) != have.get(name):
                lines.append(f"wgmma {name}: expected {want.get(name)}, found {have.get(name)}")
        lines.append("instruction differs: " + template_difference(row.template, st.template))
    lines += _operand_differences(row, st)
    if row.clobbers != st.clobbers:
        lines.append(f"clobbers: expected {list(row.clobbers)}, found {list(st.clobbers)}")
    return lines


def asm_problems(sources: dict[str, str], models: tuple[PtxModel, ...] = MODELS) -> list[str]:
    """Every asm statement of `sources` (path -> text) without an equal row in `models`, and every row
    without its asm statement."""
    problems = []
    found: dict[tuple[str, str], AsmStatement] = {}
    for header, text in sources.items():
        for st in parse(text, header):
            key = (st.header, st.function)
            if key in found:
                problems.append(
                    f"{_where(st.header, st.line, st.function)}: a second asm statement in one function "
                    f"(the table holds one per function; the first is at line {found[key].line})"
                )
            found[key] = st
    rows = {(r.header, r.function): r for r in models}
    for key, st in found.items():
        if key not in rows:
            problems.append(
                f"{_where(st.header, st.line, st.function)}: asm statement with no row in {TABLE}\n"
                f"    found template: {st.template!r}\n    found operands: outputs {st.outputs}, inputs {st.inputs}"
            )
    for key, row in rows.items():
        st = found.get(key)
        if st is None:
            problems.append(
                f"{_where(row.header, None, row.function)}: the row of {TABLE} has no asm statement in that "
                f"function\n    expected template: {row.template!r}"
            )
            continue
        lines = _differences(row, st)
        if lines:
            problems.append(
                f"{_where(st.header, st.line, st.function)} differs from its model in {TABLE} "
                f"(stand-in {row.stand_in}):\n  " + "\n  ".join(lines)
            )
    return problems


def _param_count(params: str) -> int:
    params = re.sub(r",?\s*EMU_SITE_ARG", "", params).strip()
    depth, count = 0, 1 if params else 0
    for ch in params:
        depth += ch in "(<["
        depth -= ch in ")>]"
        count += ch == "," and depth == 0
    return count


def stand_in_problems(
    emulator: dict[str, str], sources: dict[str, str], models: tuple[PtxModel, ...] = MODELS
) -> list[str]:
    """Rows whose stand-in is not defined in emulation/<header>, takes another number of parameters than the
    real function, does not make the row's model calls, or calls a model the emulator does not define;
    immediates ("n" operands) the stand-in does not use."""
    problems = []
    defined = {name for text in emulator.values() for name in definitions(text)}
    for row in models:
        stand_in_header = PurePosixPath(row.header).name
        where = f"stand-in {row.stand_in} of emulation/{stand_in_header} (row {row.header} {row.function})"
        stand_in = definitions(emulator.get(stand_in_header, "")).get(row.stand_in)
        if stand_in is None:
            problems.append(f"{where}: not defined")
            continue
        real = definitions(sources.get(row.header, "")).get(row.function)
        if real is not None and _param_count(real.params) != _param_count(stand_in.params):
            problems.append(f"{where}: parameters ({stand_in.params}) do not match the real ({real.params})")
        body = normalise(stand_in.body)
        for call in row.model:
            if normalise(call) not in body:
                problems.append(f"{where}: does not call the model {call!r}\n    its body: {body!r}")
            callee = call.split("(")[0].split("::")[-1]
            if callee not in defined:
                problems.append(f"{where}: the model {callee} is not defined in the emulator's headers")
        for constraint, expr in row.inputs:
            if constraint == "n" and not re.search(rf"\b{re.escape(expr)}\b", body):
                problems.append(f"{where}: does not use the immediate {expr} that the PTX takes as %n")
    return problems


def _args(call: str) -> list[str]:
    return [a.strip() for a in call[call.index("(") + 1 : call.rindex(")")].split(",")]


def model_problems(models: tuple[PtxModel, ...] = MODELS) -> list[str]:
    """Rows whose PTX string says one thing and whose model call another."""
    problems = []
    for row in models:
        where = f"row {row.header} {row.function} of {TABLE}"
        if row.template.startswith("ldmatrix"):
            trans = ".trans." in row.template.split()[0]
            if _args(row.model[0])[-1] != ("true" if trans else "false"):
                problems.append(f"{where}: the PTX {'has' if trans else 'lacks'} .trans, the model is {row.model[0]}")
        if row.template.startswith("setmaxnreg"):
            inc = ".inc." in row.template
            if _args(row.model[0])[-1] != ("true" if inc else "false"):
                problems.append(f"{where}: the PTX is {'.inc' if inc else '.dec'}, the model is {row.model[0]}")
        shape = re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16\.f32\.bf16\.bf16", row.template)
        if shape:
            n, args = int(shape.group(1)), _args(row.model[0])
            imm = wgmma_immediates(row.template)
            a_in_regs = "imm-trans-a" not in imm
            expected = {k: v for k, v in WGMMA_IMMEDIATES.items() if not (a_in_regs and k == "imm-trans-a")}
            if imm != expected:
                problems.append(f"{where}: immediates {imm}, the model computes {expected}")
            if args[1] != str(n) or len(row.outputs) != n // 2:
                problems.append(
                    f"{where}: m64n{n}k16 with {len(row.outputs)} accumulators, the model takes n={args[1]}"
                )
            if (args[5] != "nullptr") != a_in_regs:
                problems.append(
                    f"{where}: A {'in registers' if a_in_regs else 'in shared memory'}, model {row.model[0]}"
                )
            scale = re.search(r"setp\.ne\.b32 p, %(\d+), 0;", row.template)
            operands = [*row.outputs, *row.inputs]
            if not scale or operands[int(scale.group(1))][1] != "scale_d" or args[4] != "scale_d != 0":
                problems.append(f"{where}: scale-d is not the predicate of the scale_d operand passed to the model")
    return problems
