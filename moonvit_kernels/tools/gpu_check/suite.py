"""Section (a): the `gpu` tier of the test suite in a subprocess, with a time limit.

`python -m pytest -o addopts= -m gpu -v -rs -p no:cacheprovider [--timeout] <files>` runs from the source tree (the
folder holding `tests/`), its whole output goes to `pytest.log`, and the outcome of every test is
counted from the `-v` lines, so a run stopped at the time limit still gives counts. The files run in
the order given (the plan puts the CuPy tests first). A tier stopped at its time limit with no failure
is "partial", never "pass".
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from moonvit_kernels.tools import SOURCE_ROOT
from moonvit_kernels.tools.gpu_check.report import ERROR, FAIL, PARTIAL, PASS, SKIP

OUTCOME = re.compile(r"^\S+::\S+.*?\s(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", re.MULTILINE)
SUMMARY = re.compile(r"^=+ (.*?) in [\d.]+s.* =+$", re.MULTILINE)


def source_root() -> Path:
    """The folder that holds the package and `tests/` (a source tree)."""
    return SOURCE_ROOT


def count_outcomes(log: str) -> dict[str, int]:
    """Per-test outcomes from pytest -v output: {'passed': n, 'failed': n, 'error': n, 'skipped': n, ...}."""
    counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0, "xfail": 0, "xpass": 0}
    names = {
        "PASSED": "passed",
        "FAILED": "failed",
        "ERROR": "error",
        "SKIPPED": "skipped",
        "XFAIL": "xfail",
        "XPASS": "xpass",
    }
    for m in OUTCOME.finditer(log):
        counts[names[m.group(1)]] += 1
    return counts


def tier_status(
    counts: dict[str, int], summary: str, rc: int, timed_out: bool, limit_s: float, simulate: bool
) -> tuple[str, str]:
    """(verdict, note) of a tier run: FAIL/ERROR on any failure; "partial" when stopped at its time limit
    (never "pass": later tests did not run); pass when tests passed; else skip, saying why."""
    bad = counts["failed"] + counts["error"] + counts["xpass"]
    note = summary
    if timed_out:
        note = f"stopped at the {limit_s:.0f} s limit: counts cover the tests that finished"
    elif rc not in (0, 1, 5) and not bad:
        bad = 1
        note = f"pytest exited with status {rc} (collection or internal error: see pytest.log)"
    if bad:
        return (FAIL if counts["failed"] else ERROR), note
    if timed_out:
        return PARTIAL, note
    if counts["passed"]:
        return PASS, note
    why = "no GPU (--simulate): the gpu tier skips itself" if simulate else "no gpu test passed (see pytest.log -rs)"
    return SKIP, f"{note}; {why}" if note else why


def run_suite(report: Any, files: tuple[str, ...], limit_s: float, simulate: bool) -> None:
    """Run the gpu tier of `files` for at most `limit_s` seconds; one row and one verdict on `report`."""
    root = source_root()
    log_path = report.out_dir / "pytest.log"
    missing = [f for f in files if not (root / f).exists()]
    if missing:
        log_path.write_text(f"not run: {', '.join(missing)} not found under {root} (not a source tree)\n")
        report.add_row("tests", item="pytest -m gpu", check="not run", verdict=SKIP, note=f"missing {missing}")
        report.verdict("tests", "pytest -m gpu", SKIP, f"test files not found under {root}")
        return
    try:
        import pytest  # noqa: F401
    except ImportError:
        log_path.write_text("not run: pytest is not installed\n")
        report.add_row("tests", item="pytest -m gpu", check="not run", verdict=SKIP, note="pytest not installed")
        report.verdict("tests", "pytest -m gpu", SKIP, "pytest is not installed")
        return
    # The project's addopts (pytest-xdist workers, pytest-timeout) are replaced: one process owns the GPU,
    # and a machine without those plugins still runs the tier.
    cmd = [sys.executable, "-m", "pytest", "-o", "addopts=", "-m", "gpu", "-v", "-rs", "-p", "no:cacheprovider"]
    if importlib.util.find_spec("pytest_timeout") is not None:
        cmd.append(f"--timeout={max(60, int(limit_s))}")
    cmd += files
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("PYTHONUNBUFFERED", "1")
    print(f"[tests] {' '.join(cmd)} (limit {limit_s:.0f} s, log {log_path})", flush=True)
    t0 = time.monotonic()
    timed_out = False
    with open(log_path, "w", encoding="utf-8") as log:
        log.write(f"$ {' '.join(cmd)}\n(cwd {root}; time limit {limit_s:.0f} s)\n\n")
        log.flush()
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=max(1.0, limit_s))
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)  # the pytest process group we started, nothing else
            rc = proc.wait()
    seconds = time.monotonic() - t0
    text = log_path.read_text(encoding="utf-8", errors="replace")
    if timed_out:
        with open(log_path, "a", encoding="utf-8") as log:
            log.write(f"\n\ngpu_check: stopped at the time limit ({limit_s:.0f} s); later tests did not run\n")
    counts = count_outcomes(text)
    summary = SUMMARY.findall(text)
    result = ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "no test ran"
    status, note = tier_status(counts, summary[-1] if summary else "", rc, timed_out, limit_s, simulate)
    report.add_row(
        "tests",
        item="pytest -m gpu " + " ".join(files),
        check=result,
        median_ms=seconds * 1e3,
        runs=1,
        clock="host clock",
        verdict=status,
        note=note,
    )
    report.verdict("tests", "pytest -m gpu", status, f"{result} in {seconds:.0f} s" + (f" ({note})" if note else ""))
