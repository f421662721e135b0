"""The results file: what a worker found, one JSON object per line, appended and flushed as it goes.

A worker (one unit of work in a process of its own) writes through an `EventWriter`, which has the
methods the sections call on a report (`add_row`, `verdict`, `note`) plus the worker's own
(`items`, `start`, `end`, `done`, ...). The parent reads new complete lines with `read_events` and
applies them to the `Report`; a line is on disk before the item it announces starts, so whatever
kills a worker, the parent knows which item was running.

Events (key "ev"): items {names}, start {index, item}, end {index, item}, row {section, values},
verdict {section, item, status, number}, note {text}, machine {rows}, diagnostic {title, text},
sticky {index, item, error} (the CUDA context is lost: the worker exits, the parent restarts it),
done {}.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

RESULTS_FILE = "results.jsonl"


def _plain(value: Any) -> Any:
    """JSON-able form of NumPy scalars and other odd values."""
    if hasattr(value, "item"):
        return value.item()
    return str(value)


class EventWriter:
    """Appends events to the results file (flushed line by line) and prints progress to stdout."""

    def __init__(self, path: Path, out_dir: Path, echo: bool = True):
        self.path = Path(path)
        self.out_dir = Path(out_dir)
        self.echo = echo
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115  (kept open for the worker's life)

    def emit(self, ev: str, **fields: Any) -> None:
        line = json.dumps({"ev": ev, "t": time.time(), **fields}, default=_plain)
        self._file.write(line + "\n")
        self._file.flush()

    # ------------------------------------------------------------------ the report's methods
    def add_row(self, section: str, **values: Any) -> dict[str, Any]:
        self.emit("row", section=section, values=values)
        return values

    def verdict(self, section: str, item: str, status: str, number: str = "") -> None:
        if self.echo:
            print(f"  [{status}] {item}: {number}", flush=True)
        self.emit("verdict", section=section, item=item, status=status, number=number)

    def note(self, text: str) -> None:
        if self.echo:
            print(f"  note: {text}", flush=True)
        self.emit("note", text=text)

    def machine(self, rows: list[tuple[str, str]]) -> None:
        self.emit("machine", rows=[list(r) for r in rows])

    def diagnostic(self, title: str, text: str) -> None:
        self.emit("diagnostic", title=title, text=text)

    # ------------------------------------------------------------------ the worker's own
    def items(self, names: list[str]) -> None:
        self.emit("items", names=names)

    def start(self, index: int, item: str) -> None:
        if self.echo:
            print(f"[{item}] ...", flush=True)
        self.emit("start", index=index, item=item)

    def end(self, index: int, item: str) -> None:
        self.emit("end", index=index, item=item)

    def sticky(self, index: int, item: str, error: str) -> None:
        self.emit("sticky", index=index, item=item, error=error)

    def done(self) -> None:
        self.emit("done")

    def close(self) -> None:
        self._file.close()


def read_events(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """Complete lines of `path` from byte `offset` on, parsed: (events, the offset after the last one)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset
    events = []
    for line in data[: end + 1].splitlines():
        if line.strip():
            try:
                events.append(json.loads(line))
            except ValueError:  # a torn line (never expected: lines are written whole)
                events.append({"ev": "note", "text": f"unreadable results line: {line[:120]!r}"})
    return events, offset + end + 1
