"""SASS of a cubin (nvdisasm from the `nvidia-cuda-nvdisasm` wheel): instruction mix and innermost loops.

`disassemble(cubin)` runs `nvdisasm -c -ndf` and returns, per kernel (function section), its
instructions in address order. A loop is a backward branch: a `BRA` whose target label lies at or
before the branch; its body is every instruction from the target to the branch. An innermost
loop contains no other loop. A loop's own instructions are those of its body outside any loop
nested in it (for an innermost loop: the whole body). The hot loop of a kernel is the loop with the
most FMA-class instructions (FFMA, or HMMA / HGMMA for tensor-core kernels) among its own
instructions — an innermost loop whenever the FMAs sit in one, else a main loop whose nested loops
only stage data (the tensor-core kernels); a kernel with tensor-core MMAs in some loop takes the
loop with the most MMAs, an innermost one on a tie (not an epilogue's GELU FFMAs) — and its cost
is instructions per FMA: its own instructions (NOPs excluded) divided by its own FMAs (by its MMAs
when it has any). One HGMMA (wgmma m64nNk16) does 64·N·16 multiply-adds, 32x-64x an HMMA's
(m16n8k16), so compare that cost within one generation only; `generation_counts` counts the
instructions that tell the generations apart (HGMMA / UTMALDG of the Hopper kernels vs HMMA /
LDGSTS of the mma.sync ones).
A fully unrolled `for` leaves no branch, so only loops that really iterate are found.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

CATEGORIES = (
    "fma",  # FFMA, FFMA2: fp32 fused multiply-add
    "mma",  # HMMA, HGMMA, IMMA, DMMA: tensor cores
    "fp",  # other floating point (FADD, FMUL, MUFU, FMNMX, F2F, HFMA2 ...)
    "lds",  # shared loads (LDS, LDSM)
    "sts",  # shared stores
    "ldg",  # global loads (LDG, LDGSTS = cp.async)
    "stg",  # global stores
    "local",  # LDL / STL: local memory (spills, stack arrays)
    "bar",  # BAR, barriers
    "shfl",  # SHFL
    "int",  # integer, address and predicate arithmetic, moves, conversions of indices
    "uniform",  # U* instructions of the uniform datapath and constant loads
    "control",  # branches, convergence, exit
    "other",
)

_FMA = {"FFMA", "FFMA2", "DFMA"}
_MMA = {"HMMA", "HGMMA", "IMMA", "DMMA", "BMMA", "QGMMA", "WGMMA"}
_FP = {
    "FADD", "FMUL", "FMNMX", "MUFU", "FSETP", "FSEL", "FCHK", "F2F", "F2I", "I2F", "FRND", "FSWZADD", "HADD2",
    "HMUL2", "HFMA2", "HMNMX2", "HSETP2", "F2FP", "FADD2", "FMUL2", "DADD", "DMUL", "FMNMX3",
}  # fmt: skip
_INT = {
    "IMAD", "IADD3", "IADD", "LEA", "SHF", "SHL", "SHR", "LOP3", "LOP", "ISETP", "SEL", "IMNMX", "MOV", "S2R",
    "CS2R", "PRMT", "IABS", "POPC", "FLO", "VIADD", "VIMNMX", "IMUL", "PLOP3", "P2R", "R2P", "BMSK", "BREV",
    "SGXT", "I2I", "IDP", "VOTE", "VIADDMNMX", "I2IP", "LEPC", "S2UR", "R2UR", "CSMTEST", "IMNMX3",
}  # fmt: skip
_CONTROL = {"BRA", "BRX", "BSSY", "BSYNC", "EXIT", "RET", "CALL", "JMP", "WARPSYNC", "YIELD", "BPT", "KILL"}

# Modifiers may hold lowercase letters (the wgmma shape of `HGMMA.64x128x16.F32.BF16`): a modifier runs
# from its dot to the next dot or space.
_INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Za-z0-9_]+)*)([^;]*);")
_LABEL = re.compile(r"^\s*(\.L_\w+):")
_SECTION = re.compile(r"^\s*\.section\s+\.text\.(\S+?),")
_TARGET = re.compile(r"`\(?(\.L_\w+)\)?")


@dataclass
class Instruction:
    """One SASS instruction: address, opcode (no modifiers), modifiers, operand text, predicate."""

    address: int
    opcode: str
    modifiers: str
    operands: str
    predicate: str = ""

    @property
    def category(self) -> str:
        return categorize(self.opcode, self.modifiers, self.operands)

    def __str__(self) -> str:
        pred = f"{self.predicate} " if self.predicate else ""
        return f"{pred}{self.opcode}{self.modifiers} {self.operands.strip()}".strip()


@dataclass
class Loop:
    """A backward branch's body: instructions [start, end] (addresses), the branch at `end`."""

    start: int
    end: int
    instructions: list[Instruction] = field(default_factory=list)  # the whole body
    innermost: bool = True
    own: list[Instruction] = field(default_factory=list)  # the body outside nested loops

    @property
    def mix(self) -> Counter:
        """Instruction mix of the loop's own instructions."""
        return mix(self.own)

    @property
    def fmas(self) -> int:
        m = self.mix
        return m["fma"] + m["mma"]

    @property
    def size(self) -> int:
        """Own instructions, NOPs excluded."""
        return sum(1 for i in self.own if i.opcode != "NOP")

    @property
    def per_fma(self) -> float | None:
        """Instructions per FFMA (or per HMMA for a tensor-core loop); None without any."""
        m = self.mix
        n = m["mma"] or m["fma"]
        return self.size / n if n else None


@dataclass
class Function:
    """One kernel's SASS and the loops found in it."""

    name: str
    instructions: list[Instruction]
    loops: list[Loop]

    @property
    def mix(self) -> Counter:
        return mix(self.instructions)

    @property
    def innermost(self) -> list[Loop]:
        return [lp for lp in self.loops if lp.innermost]

    @property
    def fma_loops(self) -> list[Loop]:
        """Innermost loops holding at least one FMA-class instruction."""
        return [lp for lp in self.innermost if lp.fmas]

    @property
    def hot_loop(self) -> Loop | None:
        """The loop with the most own FMA-class instructions (None if no loop has any)."""
        candidates = [lp for lp in self.loops if lp.fmas]
        if not candidates:
            return None
        if any(lp.mix["mma"] for lp in candidates):  # tensor cores: the most MMAs, innermost first (not a
            # loop holding a peeled MMA step and a GELU epilogue's FFMAs, as the sm90 GEMMs' tile loop does)
            return max(candidates, key=lambda lp: (lp.mix["mma"], lp.innermost, lp.fmas, -lp.start))
        return max(candidates, key=lambda lp: (lp.fmas, lp.innermost, -lp.start))


# Hopper (wgmma, tensor copies) vs Ampere (mma.sync, cp.async) instructions, in that order
GENERATION_OPCODES = ("HGMMA", "UTMALDG", "HMMA", "LDGSTS")


def generation_counts(fn: Function, opcodes: tuple[str, ...] = GENERATION_OPCODES) -> dict[str, int]:
    """How many of each opcode in `opcodes` (default HGMMA, UTMALDG, HMMA, LDGSTS) the kernel's SASS holds."""
    counts = Counter(i.opcode for i in fn.instructions)
    return {op: counts.get(op, 0) for op in opcodes}


def generation_text(counts: dict[str, int]) -> str:
    """`"HGMMA=4 UTMALDG=2 HMMA=0 LDGSTS=0"`."""
    return " ".join(f"{op}={n}" for op, n in counts.items())


def categorize(opcode: str, modifiers: str = "", operands: str = "") -> str:
    """The CATEGORIES entry of one instruction."""
    if opcode in _FMA:
        return "fma"
    if opcode in _MMA:
        return "mma"
    if opcode == "HFMA2" and ".MMA" in modifiers and "-RZ, RZ" in operands:
        return "int"  # `HFMA2.MMA Rd, -RZ, RZ, a, b` materialises a constant: a move
    if opcode in _FP:
        return "fp"
    if opcode in ("LDS", "LDSM"):
        return "lds"
    if opcode == "STS":
        return "sts"
    if opcode in ("LDG", "LDGSTS", "LD", "LDGDEPBAR", "UTMALDG"):
        return "ldg"
    if opcode in ("STG", "ST", "RED", "ATOMG", "ATOM", "UTMASTG"):
        return "stg"
    if opcode in ("LDL", "STL"):
        return "local"
    if opcode in ("BAR", "DEPBAR", "ARRIVES", "SYNCS", "MEMBAR"):
        return "bar"
    if opcode == "SHFL":
        return "shfl"
    if opcode in _INT:
        return "int"
    if opcode.startswith("U") or opcode in ("LDC", "ULDC"):
        return "uniform"
    if opcode in _CONTROL:
        return "control"
    return "other"


def mix(instructions: list[Instruction]) -> Counter:
    """Instruction count per category (NOPs left out)."""
    return Counter(i.category for i in instructions if i.opcode != "NOP")


@functools.cache
def nvdisasm_path() -> str | None:
    """The nvdisasm executable: $NVDISASM, the pip wheel `nvidia-cuda-nvdisasm`, or PATH; None if absent."""
    if os.environ.get("NVDISASM") and os.path.isfile(os.environ["NVDISASM"]):
        return os.environ["NVDISASM"]
    try:
        import nvidia

        for root in nvidia.__path__:
            for sub in ("cu13/bin", "cu12/bin", "cuda_nvdisasm/bin"):
                candidate = Path(root) / sub / "nvdisasm"
                if candidate.is_file():
                    return str(candidate)
    except ImportError:
        pass
    return shutil.which("nvdisasm")


def disassemble_text(cubin: bytes) -> str:
    """`nvdisasm -c` of a cubin; RuntimeError if nvdisasm is missing or fails."""
    exe = nvdisasm_path()
    if exe is None:
        raise RuntimeError("nvdisasm not found: pip install nvidia-cuda-nvdisasm (or set NVDISASM)")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        r = subprocess.run([exe, "-c", "-ndf", str(path)], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"nvdisasm failed: {r.stderr.strip()[:500]}")
    return r.stdout


def parse(text: str) -> list[Function]:
    """Functions of an `nvdisasm -c` listing, each with its instructions and loops."""
    functions: list[Function] = []
    name = None
    insns: list[Instruction] = []
    labels: dict[str, int] = {}
    pending: list[str] = []
    branches: list[tuple[int, str]] = []

    def close() -> None:
        if name is not None:
            functions.append(Function(name, insns, find_loops(insns, labels, branches)))

    for line in text.splitlines():
        if m := _SECTION.match(line):
            close()
            name, insns, labels, pending, branches = m.group(1), [], {}, [], []
            continue
        if name is None:
            continue
        if m := _LABEL.match(line):
            pending.append(m.group(1))
            continue
        if m := _INSN.search(line):
            addr = int(m.group(1), 16)
            ins = Instruction(addr, m.group(3), m.group(4), m.group(5), (m.group(2) or "").strip())
            insns.append(ins)
            for label in pending:
                labels[label] = addr
            pending = []
            if ins.opcode == "BRA" and (t := _TARGET.search(ins.operands)):
                branches.append((addr, t.group(1)))
    close()
    return functions


def find_loops(insns: list[Instruction], labels: dict[str, int], branches: list[tuple[int, str]]) -> list[Loop]:
    """Loops from backward branches (target address <= branch address), innermost flagged.

    Several backward branches to one target make one loop (the last branch closes it). A loop whose
    body holds only the branch (the `BRA` to itself after EXIT) is not a loop of the program."""
    ends: dict[int, int] = {}
    for addr, label in branches:
        target = labels.get(label)
        if target is not None and target <= addr:
            ends[target] = max(ends.get(target, addr), addr)
    loops = []
    for start, end in sorted(ends.items()):
        body = [i for i in insns if start <= i.address <= end]
        if sum(1 for i in body if i.opcode != "NOP") <= 1:
            continue
        loops.append(Loop(start, end, body))
    for lp in loops:
        nested = [o for o in loops if o is not lp and lp.start <= o.start and o.end <= lp.end]
        lp.innermost = not nested
        lp.own = [i for i in lp.instructions if not any(o.start <= i.address <= o.end for o in nested)]
    return loops


def disassemble(cubin: bytes) -> list[Function]:
    """Parsed SASS of every kernel in `cubin`."""
    return parse(disassemble_text(cubin))


def disassemble_file(path: str | os.PathLike) -> list[Function]:
    """Parsed SASS of the cubin at `path`; the listing is cached beside it as `<path>.sass`."""
    path = Path(path)
    listing = path.with_name(path.name + ".sass")
    if listing.exists() and listing.stat().st_mtime >= path.stat().st_mtime:
        return parse(listing.read_text(encoding="utf-8"))
    text = disassemble_text(path.read_bytes())
    tmp = listing.with_name(f"{listing.name}.{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, listing)
    return parse(text)
