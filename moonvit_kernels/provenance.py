"""What made an output folder (`provenance.json`), so that a folder never mixes the results of two runs.

    {"format": "moonvit_kernels golden 1",
     "made_with": {"checkpoint": <weights.checkpoint_digest>, "config": <digest>, ...},
     ...}                                       # anything else the command records (files, paths)

`made_with` holds what decides the values written: the checkpoint's content digest, the config's
digest, the preprocessing settings, and per command whatever else does (encode-dataset: the shard
size; golden: the inputs). A command `claim`s its output folder before any compute: the same
provenance continues (or resumes) there; another one is refused naming what differs, unless the
caller overwrites; the command's files in a folder without a provenance (an older version, another
program) count as another provenance. Readers `check` the record before trusting the folder.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .atomic import write_text

PROVENANCE = "provenance.json"


# ============================================================================ digests
def digest_json(value: Any) -> str:
    """sha256 of a JSON-ready value, keys sorted (a config's `to_dict()`, settings)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def digest_arrays(arrays: Iterable[np.ndarray]) -> str:
    """sha256 over arrays' dtypes, shapes and C-ordered bytes (inputs such as pixel_values, grid_thws)."""
    digest = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        digest.update(json.dumps([a.dtype.str, list(a.shape)]).encode())
        digest.update(a.tobytes())
    return digest.hexdigest()


def file_digest(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes, read in 1 MiB pieces."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for piece in iter(lambda: f.read(2**20), b""):
            digest.update(piece)
    return digest.hexdigest()


# ============================================================================ the record
def read(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The provenance record of `folder`, None when it has none; ValueError naming an unreadable one."""
    path = Path(folder) / PROVENANCE
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: unreadable ({type(e).__name__}: {e})") from None
    if not isinstance(record, dict) or not isinstance(record.get("made_with"), dict):
        raise ValueError(f"{path}: not a provenance record (no 'made_with' object)")
    return record


def write(folder: str | os.PathLike, record: Mapping[str, Any]) -> Path:
    """Write `record` as `folder/provenance.json` (atomically); returns its path."""
    path = Path(folder) / PROVENANCE
    write_text(path, json.dumps(dict(record), indent=2, sort_keys=True) + "\n")
    return path


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """What differs between two `made_with` dicts, one phrase per key ("rows_per_shard 8 -> 3")."""

    def short(v: Any) -> str:
        if isinstance(v, str) and len(v) == 64:  # a sha256
            return v[:12]
        return json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else str(v)

    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            inner = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
            out.append(f"{key} ({', '.join(f'{k} {short(a.get(k))} -> {short(b.get(k))}' for k in inner)})")
        else:
            out.append(f"{key} {short(a)} -> {short(b)}")
    return out


def claim(
    folder: str | os.PathLike,
    fmt: str,
    made_with: Mapping[str, Any],
    owned: Callable[[str], bool],
    overwrite: bool,
    what: str,
) -> list[Path]:
    """May `folder` receive outputs of format `fmt` made with `made_with`? Returns the files of an
    earlier run with another provenance (the command's files, `owned(name)`, and the record) for the
    caller to replace — none when the provenance is the same, or the folder holds none of them.
    ValueError naming the folder and what differs when there are such files and not `overwrite`."""
    folder = Path(folder)
    made_with = json.loads(json.dumps(dict(made_with)))  # as the record will read back (tuples as lists)
    if not folder.is_dir():
        return []
    earlier = sorted(p for p in folder.iterdir() if p.is_file() and p.name != PROVENANCE and owned(p.name))
    try:
        old = read(folder)
    except ValueError as e:
        if not overwrite:
            raise ValueError(f"{e}: pass --overwrite to replace the {what} in {folder}") from None
        return [*earlier, folder / PROVENANCE]
    if old is not None and old.get("format") == fmt and old["made_with"] == made_with:
        return []
    if old is None and not earlier:
        return []
    if not overwrite:
        if old is None:
            names = ", ".join(p.name for p in earlier[:3]) + (", ..." if len(earlier) > 3 else "")
            reason = f"holds {what} ({names}) without {PROVENANCE}: made by an older version or another program"
        elif old.get("format") != fmt:
            reason = f"holds {old.get('format')!r} output, not {fmt!r}"
        else:
            reason = f"holds {what} made with another " + "; ".join(differences(old["made_with"], made_with))
        raise ValueError(f"{folder}: {reason}: pass --overwrite to replace them, or choose another output folder")
    return [*earlier, *([folder / PROVENANCE] if old is not None else [])]


def check(folder: str | os.PathLike, fmt: str, what: str) -> dict[str, Any]:
    """The record of a folder about to be read; ValueError when it has none or one of another format."""
    record = read(folder)
    if record is None:
        raise ValueError(
            f"{folder}: no {PROVENANCE}: not {what}, or made by an older version; write it again (--overwrite)"
        )
    if record.get("format") != fmt:
        raise ValueError(f"{Path(folder) / PROVENANCE}: format {record.get('format')!r}, expected {fmt!r}")
    return record
