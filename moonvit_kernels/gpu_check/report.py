"""The report: rows of measurements, verdicts and notes, rewritten to DIR after every change.

Files (all in the output folder): `report.md` (the machine, one table per section, the verdicts),
`results.csv` (one row per measurement; columns `CSV_FIELDS`, units and formulas in their own
columns). Both are written to a temporary name and renamed, so a run cut short leaves the last
complete version of each.
"""

from __future__ import annotations

import csv
import io
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CSV_FIELDS = (
    "section", "item", "backend", "where", "dtype", "shape", "tokens", "stage",
    "median_ms", "p10_ms", "p90_ms", "runs", "clock",
    "work", "unit", "rate", "formula",
    "baseline", "baseline_ms", "baseline_rate", "pct_of_baseline", "peak", "pct_of_peak",
    "check", "check_err", "check_tol", "verdict", "note",
)  # fmt: skip

PASS, FAIL, SKIP, ERROR = "pass", "FAIL", "skip", "ERROR"
FAILING = (FAIL, ERROR)

# (title, columns as (header, row key)) per section, in report order.
SECTIONS: dict[str, tuple[str, Sequence[tuple[str, str]]]] = {
    "tests": (
        "(a) GPU test tier (pytest -m gpu)",
        (("run", "item"), ("result", "check"), ("seconds", "median_s"), ("verdict", "verdict"), ("note", "note")),
    ),
    "kernels": (
        "(b) Kernels vs baselines (same run)",
        (
            ("kernel", "item"), ("backend", "backend"), ("dtype", "dtype"), ("shape", "shape"),
            ("median ms [p10..p90]", "time"), ("rate", "rate_unit"), ("formula", "formula"),
            ("baseline", "baseline"), ("baseline rate", "baseline_rate_unit"), ("% of baseline", "pct_of_baseline"),
            ("% of peak", "pct_of_peak"), ("check err (tol)", "check_text"), ("verdict", "verdict"),
        ),
    ),
    "tower": (
        "(c) Whole tower + projector: time per forward",
        (
            ("case", "item"), ("backend", "backend"), ("where", "where"), ("tokens", "tokens"), ("layers", "shape"),
            ("median ms [p10..p90]", "time"), ("rate", "rate_unit"), ("formula", "formula"),
            ("% of baseline", "pct_of_baseline"), ("note", "note"),
        ),
    ),
    "stages": (
        "(c) Whole tower: time per stage (events at layer boundaries, median run)",
        (("case", "item"), ("backend", "backend"), ("stage", "stage"), ("ms", "median_ms"), ("note", "note")),
    ),
    "tower_check": (
        "(c) Whole tower: outputs vs the NumPy reference",
        (
            ("case", "item"), ("backend", "backend"), ("compared", "shape"), ("check", "check"),
            ("rel err (tol)", "check_text"), ("verdict", "verdict"), ("note", "note"),
        ),
    ),
}  # fmt: skip


@dataclass
class Verdict:
    section: str
    item: str
    status: str
    number: str


@dataclass
class Report:
    """Everything gpu_check found so far; `write()` puts it on disk."""

    out_dir: Path
    mode: str
    command: str
    machine: list[tuple[str, str]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    finished: bool = False

    # ------------------------------------------------------------------ adding
    def add_row(self, section: str, **values: Any) -> dict[str, Any]:
        row = {key: "" for key in CSV_FIELDS}
        row["section"] = section
        for key, value in values.items():
            if key not in CSV_FIELDS:
                raise KeyError(f"unknown results.csv column {key!r}")
            row[key] = value
        self.rows.append(row)
        self.write()
        return row

    def verdict(self, section: str, item: str, status: str, number: str = "") -> None:
        self.verdicts.append(Verdict(section, item, status, number))
        print(f"  [{status}] {item}: {number}", flush=True)
        self.write()

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"  note: {text}", flush=True)
        self.write()

    @property
    def failed(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.status in FAILING]

    def exit_status(self) -> int:
        """1 when a correctness check failed or errored, else 0 (timings never fail)."""
        return 1 if self.failed else 0

    # ------------------------------------------------------------------ writing
    def write(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.out_dir / "report.md", self.markdown())
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
        w.writeheader()
        w.writerows({k: _csv_cell(r[k]) for k in CSV_FIELDS} for r in self.rows)
        _atomic_write(self.out_dir / "results.csv", buf.getvalue())

    def markdown(self) -> str:
        elapsed = time.time() - self.started
        state = "finished" if self.finished else "IN PROGRESS (partial: rewritten after every measurement)"
        lines = [
            "# moonvit_kernels gpu_check report",
            "",
            f"- mode: {self.mode}",
            f"- command: `{self.command}`",
            f"- started: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(self.started))}; "
            f"elapsed {elapsed:.0f} s; {state}",
            "",
            "## Machine",
            "",
            "| what | value |",
            "| --- | --- |",
        ]
        lines += [f"| {k} | {_md(v)} |" for k, v in self.machine]
        if self.notes:
            lines += ["", "## Notes", ""] + [f"- {n}" for n in self.notes]
        for section, (title, columns) in SECTIONS.items():
            rows = [r for r in self.rows if r["section"] == section]
            lines += ["", f"## {title}", ""]
            if not rows:
                lines.append("(no measurement)")
                continue
            lines.append("| " + " | ".join(h for h, _ in columns) + " |")
            lines.append("|" + " --- |" * len(columns))
            for r in rows:
                lines.append("| " + " | ".join(_md(_cell(r, key)) for _, key in columns) + " |")
        lines += ["", "## (d) Verdicts", ""]
        for v in self.verdicts:
            lines.append(f"- **{v.status}** [{v.section}] {v.item}: {v.number}")
        counts = {s: sum(v.status == s for v in self.verdicts) for s in (PASS, FAIL, ERROR, SKIP)}
        lines += [
            "",
            f"Result: {counts[PASS]} pass, {counts[FAIL]} fail, {counts[ERROR]} error, {counts[SKIP]} skipped; "
            f"exit status {self.exit_status()} (correctness only: timings never fail the run).",
            "",
        ]
        return "\n".join(lines)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _num(x: Any, digits: int = 4) -> str:
    if isinstance(x, float):
        if not math.isfinite(x):
            return str(x)
        return f"{x:.{digits}g}"
    return str(x)


def _csv_cell(x: Any) -> Any:
    return _num(x, 6) if isinstance(x, float) else x


def _cell(r: dict[str, Any], key: str) -> str:
    """Derived display cells; plain keys are printed as they are."""
    if key == "time":
        if r["median_ms"] == "":
            return ""
        return f"{_num(r['median_ms'])} [{_num(r['p10_ms'])}..{_num(r['p90_ms'])}]"
    if key == "rate_unit":
        return f"{_num(r['rate'])} {r['unit']}" if r["rate"] != "" else ""
    if key == "baseline_rate_unit":
        return f"{_num(r['baseline_rate'])} {r['unit']}" if r["baseline_rate"] != "" else ""
    if key == "check_text":
        if r["check_err"] == "":
            return r["check"]
        return f"{_num(r['check_err'], 2)} ({_num(r['check_tol'], 2)})"
    if key == "median_s":
        return _num(r["median_ms"] / 1e3, 3) if r["median_ms"] != "" else ""
    if key in ("pct_of_baseline", "pct_of_peak"):
        return f"{_num(r[key], 3)}%" if r[key] != "" else ""
    if key in ("median_ms", "p10_ms", "p90_ms"):
        return _num(r[key])
    return _num(r[key])


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")
