"""The report: rows of measurements, verdicts and notes, rewritten to DIR after every change.

Files (all in the output folder): `report.md` (the item running now, problems first, the machine,
one table per section, the verdicts), `results.csv` (one row per measurement; columns `CSV_FIELDS`,
units and formulas in their own columns), `diagnostics.md` (toolchain versions and paths, registers
and spills of every loaded binary, the Hopper ptxas log, each backend's `describe()`). Each is written
to a temporary name and renamed, so a run cut short leaves the last complete version of each.

Derived columns are filled here, when a row arrives: a kernel's % of the peak measured in the same
run (rows of section "peaks", matched by `peak_key`), a tower backend's % of the torch baseline of
the same case.
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
    "median_ms", "p10_ms", "p90_ms", "runs", "clock", "cold_ms", "host_us", "gap_free",
    "work", "unit", "rate", "cold_rate", "formula",
    "baseline", "baseline_ms", "baseline_rate", "pct_of_baseline", "peak", "pct_of_peak",
    "peak_key", "measured_peak", "pct_of_measured_peak", "model", "model_ms", "model_ratio",
    "check", "check_err", "check_tol", "verdict", "note",
)  # fmt: skip

PASS, FAIL, SKIP, ERROR = "pass", "FAIL", "skip", "ERROR"
PARTIAL, TIMEOUT, CRASH = "partial", "TIMEOUT", "CRASH"
FAILING = (FAIL, ERROR, TIMEOUT, CRASH)
STATUSES = (PASS, PARTIAL, FAIL, ERROR, TIMEOUT, CRASH, SKIP)
DIAGNOSTICS_FILE = "diagnostics.md"
ERRORS_FILE = "errors.log"

# (title, columns as (header, row key)) per section, in report order.
SECTIONS: dict[str, tuple[str, Sequence[tuple[str, str]]]] = {
    "tests": (
        "(a) GPU test tier (pytest -m gpu)",
        (("run", "item"), ("result", "check"), ("seconds", "median_s"), ("verdict", "verdict"), ("note", "note")),
    ),
    "peaks": (
        "(b) Attainable peaks measured in this run",
        (
            ("peak", "item"), ("where", "where"), ("shape", "shape"), ("median ms [p10..p90]", "time"),
            ("rate", "rate_unit"), ("formula", "formula"), ("note", "note"),
        ),
    ),
    "kernels": (
        "(b) Kernels vs baselines (same run; checked before timing)",
        (
            ("kernel", "item"), ("backend", "backend"), ("dtype", "dtype"), ("shape", "shape"),
            ("check err (tol)", "check_text"), ("device ms/call [p10..p90]", "time"), ("ms, L2 flushed", "cold_ms"),
            ("host µs/call", "host_us"), ("rate", "rate_unit"), ("formula", "formula"),
            ("% of baseline", "baseline_text"), ("% of measured peak", "pct_of_measured_peak"),
            ("% of datasheet", "pct_of_peak"), ("X-ray bound", "model_text"), ("measured / bound", "model_ratio"),
            ("verdict", "verdict"),
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
    echo: bool = True  # print verdicts and notes (a parent whose workers print them passes False)
    machine: list[tuple[str, str]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    diagnostics: list[tuple[str, str]] = field(default_factory=list)
    running: str = ""
    started: float = field(default_factory=time.time)
    finished: bool = False
    peaks: dict[str, tuple[float, str]] = field(default_factory=dict)  # peak_key -> (rate, label)
    tower_baselines: dict[str, tuple[str, float]] = field(default_factory=dict)  # case -> (label, median ms)

    # ------------------------------------------------------------------ adding
    def add_row(self, section: str, **values: Any) -> dict[str, Any]:
        row = {key: "" for key in CSV_FIELDS}
        row["section"] = section
        for key, value in values.items():
            if key not in CSV_FIELDS:
                raise KeyError(f"unknown results.csv column {key!r}")
            row[key] = value
        self._derive(row)
        self.rows.append(row)
        self.write()
        return row

    def _derive(self, row: dict[str, Any]) -> None:
        """Fill the columns that depend on rows seen before (measured peaks, the tower's torch baseline)."""
        if row["section"] == "peaks" and row["peak_key"] and isinstance(row["rate"], float):
            self.peaks[row["peak_key"]] = (row["rate"], f"{row['item']} ({row['where']})")
        elif row["section"] == "kernels" and row["peak_key"] in self.peaks and isinstance(row["rate"], float):
            rate, label = self.peaks[row["peak_key"]]
            row["measured_peak"] = label
            row["pct_of_measured_peak"] = 100.0 * row["rate"] / rate
        elif row["section"] == "tower" and isinstance(row["median_ms"], float):
            if str(row["backend"]).startswith("torch"):
                self.tower_baselines[row["item"]] = (row["backend"], row["median_ms"])
            elif row["item"] in self.tower_baselines and not str(row["backend"]).startswith("numpy"):
                label, ms = self.tower_baselines[row["item"]]
                row.update(baseline=label, baseline_ms=ms, pct_of_baseline=100.0 * ms / row["median_ms"])

    def verdict(self, section: str, item: str, status: str, number: str = "") -> None:
        self.verdicts.append(Verdict(section, item, status, number))
        if self.echo:
            print(f"  [{status}] {item}: {number}", flush=True)
        self.write()

    def note(self, text: str) -> None:
        self.notes.append(text)
        if self.echo:
            print(f"  note: {text}", flush=True)
        self.write()

    def diagnostic(self, title: str, text: str) -> None:
        self.diagnostics.append((title, text))
        self.write()

    def apply(self, event: dict[str, Any]) -> None:
        """Apply one event of a worker's results file (`events.py`)."""
        kind = event.get("ev")
        if kind == "row":
            self.add_row(event["section"], **event["values"])
        elif kind == "verdict":
            self.verdict(event["section"], event["item"], event["status"], event.get("number", ""))
        elif kind == "note":
            self.note(event["text"])
        elif kind == "machine":
            self.machine += [(str(k), str(v)) for k, v in event["rows"]]
            self.write()
        elif kind == "diagnostic":
            self.diagnostic(event["title"], event["text"])

    @property
    def failed(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.status in FAILING]

    def exit_status(self) -> int:
        """1 when a check failed or errored, or an item timed out or crashed, else 0 (timings never fail)."""
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
        if self.diagnostics:
            text = ["# gpu_check diagnostics", "", f"- command: `{self.command}`", ""]
            for title, body in self.diagnostics:
                text += [f"## {title}", "", "```", body.rstrip(), "```", ""]
            _atomic_write(self.out_dir / DIAGNOSTICS_FILE, "\n".join(text))

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
        ]
        if self.running:
            lines.append(f"- running now: {self.running}")
        problems = [v for v in self.verdicts if v.status in FAILING or v.status == PARTIAL]
        lines += ["", "## Problems (read first)", ""]
        lines += [f"- **{v.status}** [{v.section}] {v.item}: {v.number}" for v in problems] or ["- none so far"]
        lines += ["", "## Machine", "", "| what | value |", "| --- | --- |"]
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
        counts = {s: sum(v.status == s for v in self.verdicts) for s in STATUSES}
        lines += [
            "",
            "Result: "
            + ", ".join(f"{n} {s.lower()}" for s, n in counts.items() if n or s in (PASS, FAIL))
            + f"; exit status {self.exit_status()} (checks, errors, timeouts and crashes only: timings never fail).",
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
        if r["rate"] == "":
            return ""
        flushed = f"; {_num(r['cold_rate'])} L2 flushed" if r["cold_rate"] != "" else ""
        return f"{_num(r['rate'])}{flushed} {r['unit']}"
    if key == "baseline_text":
        if r["pct_of_baseline"] == "":
            return r["baseline"]
        return f"{_num(r['pct_of_baseline'], 3)}% of {r['baseline']}"
    if key == "model_text":
        if r["model_ms"] == "":
            return r["model"]
        return f"{_num(r['model_ms'])} ms ({r['model']})"
    if key == "check_text":
        if r["check_err"] == "":
            return r["check"]
        return f"{_num(r['check_err'], 2)} ({_num(r['check_tol'], 2)})"
    if key == "median_s":
        return _num(r["median_ms"] / 1e3, 3) if r["median_ms"] != "" else ""
    if key in ("pct_of_baseline", "pct_of_peak", "pct_of_measured_peak"):
        return f"{_num(r[key], 3)}%" if r[key] != "" else ""
    return _num(r[key])


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")
