"""Named regions of a source file, for showing code in the notebooks without cutting strings by hand.

A region is the lines between a start marker and its end marker, each a comment line of its own:
`// region: NAME` … `// endregion` in CUDA C (`.cu`, `.cuh`), `# region: NAME` … `# endregion` in Python.
Regions may nest; the text returned leaves out every marker line.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from types import ModuleType

_START = re.compile(r"^\s*(?://|#)\s*region:\s*(\S+)\s*$")
_END = re.compile(r"^\s*(?://|#)\s*endregion\s*$")


def _source_path(source: str | os.PathLike | ModuleType) -> Path:
    if isinstance(source, ModuleType):
        if not getattr(source, "__file__", None):
            raise ValueError(f"module {source.__name__} has no source file")
        return Path(source.__file__)
    return Path(source)


def regions(source: str | os.PathLike | ModuleType) -> dict[str, tuple[int, int]]:
    """Every region of a file (a path, or a module: its `__file__`): name -> (first, last) line numbers
    (1-based) of its content, between the markers. ValueError naming the file and line of an end marker
    without a start, a start never closed, or a name used twice."""
    path = _source_path(source)
    found: dict[str, tuple[int, int]] = {}
    open_ones: list[tuple[str, int]] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if m := _START.match(line):
            name = m.group(1)
            if name in found or any(name == n for n, _ in open_ones):
                raise ValueError(f"{path}:{number}: region {name!r} is defined twice")
            open_ones.append((name, number))
        elif _END.match(line):
            if not open_ones:
                raise ValueError(f"{path}:{number}: endregion without a region")
            name, start = open_ones.pop()
            found[name] = (start + 1, number - 1)
    if open_ones:
        name, start = open_ones[-1]
        raise ValueError(f"{path}:{start}: region {name!r} is never closed (no endregion)")
    return found


def region(source: str | os.PathLike | ModuleType, name: str) -> str:
    """The text of region `name` of a file (a path, or a module: its `__file__`), without marker lines
    (nested regions' markers included). ValueError naming the file, the region and the regions it has."""
    path = _source_path(source)
    found = regions(path)
    if name not in found:
        have = ", ".join(sorted(found)) or "none"
        raise ValueError(f"{path}: no region {name!r} (its regions: {have})")
    first, last = found[name]
    lines = path.read_text(encoding="utf-8").splitlines()[first - 1 : last]
    return "\n".join(line for line in lines if not (_START.match(line) or _END.match(line)))
