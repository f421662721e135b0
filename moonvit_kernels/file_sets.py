"""A fixed set of output files that a command replaces only where it recorded making them (`demo`, `rope`).

    owned = check_owned(record, FORMAT, paths)        # before the compute: ForeignFiles if one is in the way
    replace_set(record, FORMAT, {path: staged_file})  # every file staged, then all moved in

`record` is a JSON file ({"format", "files": {name: sha256}, "moving": {name: [sha256s]}}) in the folder of
the files. A file of the set's names is the command's own only when the record lists it with its current
sha256; any other is refused, never touched. The new files are written whole under temporary names first;
the record names both runs' files while they move in, so an interruption leaves a folder a rerun finishes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from .atomic import write_text
from .provenance import file_digest


class ForeignFiles(ValueError):
    """Files of the set's names that the command did not record making."""


def _recorded(record: Path, fmt: str) -> dict[str, set[str]]:
    """name -> the sha256s the record lets that file have; ForeignFiles when the record is not ours."""
    if not record.exists():
        return {}
    try:
        data = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        data = None
    if not isinstance(data, dict) or data.get("format") != fmt:
        raise ForeignFiles(f"{record}: not a {fmt!r} record: will not touch it; choose another output")
    allowed: dict[str, set[str]] = {}
    for name, digest in (data.get("files") or {}).items():
        allowed.setdefault(name, set()).add(digest)
    for name, digests in (data.get("moving") or {}).items():
        allowed.setdefault(name, set()).update(digests)
    return allowed


def check_owned(record: Path, fmt: str, paths: Iterable[Path]) -> dict[str, str]:
    """The files among `paths` the record lists with their current content (name -> sha256); ForeignFiles
    naming any other one that exists."""
    allowed = _recorded(record, fmt)
    owned, foreign = {}, []
    for path in paths:
        if not path.exists():
            continue
        digest = file_digest(path) if path.is_file() and path.name in allowed else None
        if digest is not None and digest in allowed[path.name]:
            owned[path.name] = digest
        else:
            foreign.append(path.name)
    if foreign:
        names = ", ".join(sorted(foreign))
        raise ForeignFiles(
            f"{record.parent}: holds {names} that this command did not write (not in {record.name} with that "
            "content): it will not touch them; move them away or choose another output"
        )
    return owned


def replace_set(record: Path, fmt: str, staged: Mapping[Path, Path]) -> None:
    """Move each staged file onto its path (beside `record`), after checking the paths are ours; the
    record lists both runs' files while they move, then the new ones with their sha256."""
    earlier = check_owned(record, fmt, staged)
    files = {path.name: file_digest(tmp) for path, tmp in staged.items()}
    moving = {name: sorted({earlier.get(name), files.get(name)} - {None}) for name in {*earlier, *files}}
    write_text(record, json.dumps({"format": fmt, "files": {}, "moving": moving}, indent=2) + "\n")
    for path, tmp in staged.items():
        os.replace(tmp, path)
    write_text(record, json.dumps({"format": fmt, "files": files}, indent=2, sort_keys=True) + "\n")
