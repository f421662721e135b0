"""The inline-asm statements of CUDA C source text, and the function definitions around them.

`parse(text, header)` finds every `asm` / `asm volatile` statement: the template (adjacent string
literals concatenated, C escapes decoded, whitespace normalised), the output and input operands as
(constraint, expression) pairs in order, the clobbers, the enclosing function and the line.
`definitions(text)` maps each function defined in a text to its parameters and body (used for the
emulator's stand-ins). Comments are ignored; `// region:` markers may sit inside a statement.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

BACKEND_DIR = Path(__file__).resolve().parents[2] / "cuda_backend"
EMULATION_DIR = Path(__file__).resolve().parent

Operand = tuple[str, str]  # (constraint, expression), whitespace normalised


@dataclass(frozen=True)
class AsmStatement:
    header: str  # path relative to cuda_backend, e.g. "ptx.cuh"
    line: int
    function: str
    template: str
    outputs: tuple[Operand, ...]
    inputs: tuple[Operand, ...]
    clobbers: tuple[str, ...]


@dataclass(frozen=True)
class Definition:
    name: str
    line: int
    params: str
    body: str
    span: tuple[int, int]  # offsets of the body's braces in the text


_STRING = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\", "'": "'"}


def normalise(text: str) -> str:
    """`text` with every run of whitespace (newlines included) made one space, and none at either end."""
    return " ".join(text.split())


def _blank(text: str, strings: bool) -> str:
    """`text` with comments (and, if `strings`, preprocessor lines and the contents of string literals)
    replaced by spaces; newlines and offsets are kept."""
    out = list(text)

    def spaces(start: int, end: int) -> None:
        for j in range(start, end):
            if text[j] != "\n":
                out[j] = " "

    i, n, line_start = 0, len(text), 0
    while i < n:
        if text[i] == "\n":
            line_start = i + 1
        if text.startswith("//", i) or (strings and text[i] == "#" and not text[line_start:i].strip()):
            end = n if text.find("\n", i) < 0 else text.find("\n", i)
            spaces(i, end)
            i = end
        elif text.startswith("/*", i):
            end = n if text.find("*/", i) < 0 else text.find("*/", i) + 2
            spaces(i, end)
            i = end
        elif text[i] == '"':
            m = _STRING.match(text, i)
            end = m.end() if m else i + 1
            if strings:
                spaces(i + 1, end - 1)
            i = end
        elif text[i] == "'":
            i = text.index("'", i + 2 if text[i + 1] == "\\" else i + 1) + 1
        else:
            i += 1
    return "".join(out)


def _closing(code: str, start: int) -> int:
    """Offset of the bracket closing the one at `start` in `code` (strings and comments already harmless)."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    depth, opener, closer = 0, code[start], pairs[code[start]]
    for i in range(start, len(code)):
        depth += (code[i] == opener) - (code[i] == closer)
        if depth == 0:
            return i
    raise ValueError(f"unbalanced {opener!r} at offset {start}")


def _split_top(code: str, masked: str, sep: str) -> list[str]:
    """`code` cut at each `sep` of `masked` (same text, strings blanked) outside brackets."""
    parts, depth, last = [], 0, 0
    for i, ch in enumerate(masked):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == sep and depth == 0:
            parts.append(code[last:i])
            last = i + 1
    return [*parts, code[last:]]


def _decode(literal: str) -> str:
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(0)), literal)


def _operands(section: str, masked: str) -> tuple[Operand, ...]:
    found = []
    for part in _split_top(section, masked, ","):
        if not part.strip():
            continue
        m = re.fullmatch(r'\s*"([^"]*)"\s*\((.*)\)\s*', part, re.DOTALL)
        if not m:
            raise ValueError(f"not an asm operand: {part.strip()!r}")
        found.append((m.group(1), normalise(m.group(2))))
    return tuple(found)


def definitions(text: str) -> dict[str, Definition]:
    """Name -> the first definition (`name(params) {body}`) of each function in `text`, at any depth."""
    masked, code = _blank(text, strings=True), _blank(text, strings=False)
    found: dict[str, Definition] = {}
    for m in re.finditer(r"\b([A-Za-z_]\w*)\s*\(", masked):
        if m.group(1) in ("if", "for", "while", "switch", "return", "sizeof", "asm"):
            continue
        close = _closing(masked, m.end() - 1)
        after = re.match(r"\s*(const\s*)?\{", masked[close + 1 :])
        if not after or m.group(1) in found:
            continue
        body_open = close + after.end()
        body_close = _closing(masked, body_open)
        found[m.group(1)] = Definition(
            name=m.group(1),
            line=text.count("\n", 0, m.start()) + 1,
            params=normalise(code[m.end() : close]),
            body=code[body_open + 1 : body_close],
            span=(body_open, body_close),
        )
    return found


def parse(text: str, header: str) -> list[AsmStatement]:
    """Every asm statement of `text` (a file called `header`), in order of appearance."""
    code = _blank(text, strings=False)
    masked = _blank(text, strings=True)
    defs = definitions(text).values()
    statements = []
    for m in re.finditer(r"\basm\b(\s+volatile\b)?\s*\(", masked):
        close = _closing(masked, m.end() - 1)
        inner, minner = code[m.end() : close], masked[m.end() : close]
        sections = _split_top(inner, minner, ":")
        msections = _split_top(minner, minner, ":")
        sections += [""] * (4 - len(sections))
        msections += [""] * (4 - len(msections))
        enclosing = [d.name for d in defs if d.span[0] < m.start() < d.span[1]]
        statements.append(
            AsmStatement(
                header=header,
                line=text.count("\n", 0, m.start()) + 1,
                function=enclosing[-1] if enclosing else "<file scope>",
                template=normalise("".join(_decode(s) for s in _STRING.findall(sections[0]))),
                outputs=_operands(sections[1], msections[1]),
                inputs=_operands(sections[2], msections[2]),
                clobbers=tuple(_decode(s) for s in _STRING.findall(sections[3])),
            )
        )
    return statements


def count_asm_keywords(text: str) -> int:
    """How many `asm` keywords `text` holds outside comments and strings (what `parse` must account for)."""
    return len(re.findall(r"\basm\b", _blank(text, strings=True)))


def real_sources(root: Path = BACKEND_DIR) -> dict[str, str]:
    """Relative path -> text of every .cu / .cuh file under cuda_backend, the emulator's stand-ins excluded."""
    files = sorted(p for ext in ("*.cu", "*.cuh") for p in root.rglob(ext) if EMULATION_DIR not in p.parents)
    return {str(p.relative_to(root)): p.read_text(encoding="utf-8") for p in files}


def emulator_sources(root: Path = EMULATION_DIR) -> dict[str, str]:
    """File name -> text of the emulator's CUDA stand-in headers."""
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(root.glob("*.cuh"))}
