"""The parent's side of a run: each unit in a worker process, with hard time limits, whatever breaks.

`Supervisor.run(unit, deadline)` starts `python -m moonvit_kernels.gpu_check.worker SPEC` in a process
group of its own (a fresh interpreter: nothing is forked from this process), its stdout on ours, its
stderr appended to errors.log, and follows the results file line by line, applying each event to the
report as it arrives (the item a worker announces is in report.md as "running now" while it runs).

    the worker finishes                      -> the unit is done
    an item runs past its limit              -> TIMEOUT for that item; the process group is killed;
                                                a fresh worker continues at the next item
    the worker dies (signal, exit status)    -> CRASH for the item it was running (signal or status
                                                named, the stack faulthandler printed is in errors.log);
                                                a fresh worker continues at the next item
    a sticky CUDA error (the worker says so) -> ERROR was recorded; a fresh worker continues
    start-up (imports, set-up) runs too long -> TIMEOUT, or dies: CRASH, for "<unit> start-up"; the unit stops
    the run's watchdog time is reached      -> the running item is killed (TIMEOUT), the rest skipped

Limits: `startup_timeout_s` before the worker lists its items, then per item `item_timeout_s`
(`tower_item_timeout_s` for tower cases; the pytest tier and the pre-flight get their own budget plus
a margin), never more than SECTION_GRACE_S past the section's budget, never past the run's deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moonvit_kernels.contained import exit_text
from moonvit_kernels.tools import SOURCE_ROOT
from moonvit_kernels.tools.gpu_check.events import RESULTS_FILE, read_events
from moonvit_kernels.tools.gpu_check.report import CRASH, ERRORS_FILE, SKIP, TIMEOUT, Report

POLL_S = 0.1
SECTION_GRACE_S = 30.0  # an item may outlive its section's budget by this much before it is killed


@dataclass
class _Worker:
    """What the parent knows about the worker running now."""

    proc: subprocess.Popen
    spawned: float
    names: list[str] | None = None
    current: tuple[int, str, float] | None = None  # (index, item, started)
    last_activity: float = field(default_factory=time.time)
    last_end: int = -1
    done: bool = False
    sticky: int | None = None


class Supervisor:
    """Runs units in workers for one gpu_check run (see the module docstring)."""

    worker: tuple[str, ...] = ("-m", "moonvit_kernels.tools.gpu_check.worker")  # python's arguments before SPEC

    def __init__(
        self,
        report: Report,
        options: dict[str, Any],
        sections: tuple[str, ...],
        plan: Any,
        scratch: Path,
        gpu: str | None,
        fault: str | None,
        run_deadline: float,
    ):
        self.report, self.options, self.sections, self.plan = report, options, sections, plan
        self.scratch, self.gpu, self.fault, self.run_deadline = scratch, gpu, fault, run_deadline
        self.out_dir = report.out_dir
        self.events = self.out_dir / RESULTS_FILE
        self.errors = self.out_dir / ERRORS_FILE
        self.shared: dict[str, Any] = {}
        self.spawns = 0

    # ------------------------------------------------------------------ limits
    def item_limit(self, unit: Any) -> float:
        plan = self.plan
        if unit.section == "tests":
            return plan.budgets["tests"] + 60.0
        if unit.family == "Hopper pre-flight":
            return plan.preflight_timeout_s + 30.0
        if unit.section == "tower":
            return plan.tower_item_timeout_s
        return plan.item_timeout_s

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SOURCE_ROOT), env.get("PYTHONPATH", "")]))
        env["PYTHONUNBUFFERED"] = "1"
        if self.plan.simulate:
            env["NUMBA_ENABLE_CUDASIM"] = "1"
            env["MOONVIT_REHEARSE_GPU_BUILDS"] = "1"  # the launchers also run the GPU's builds (rehearsal.py)
        else:
            env.pop("NUMBA_ENABLE_CUDASIM", None)
        return env

    def _log(self, text: str) -> None:
        with open(self.errors, "a", encoding="utf-8") as f:
            f.write(f"\n=== {time.strftime('%H:%M:%S')} {text}\n")

    # ------------------------------------------------------------------ one unit
    def run(self, unit: Any, deadline: float) -> None:
        """Run `unit` to its end in as many workers as it takes; its section's budget ends at `deadline`."""
        first, restarts, t0 = 0, 0, time.time()
        if deadline <= t0 < self.run_deadline:
            self.report.verdict(unit.section, unit.name, SKIP, "not run: its section's budget was spent")
            return
        while True:
            if time.time() >= self.run_deadline:
                self.report.verdict(
                    unit.section, unit.name, SKIP, "not run: the run's time limit (watchdog) was reached"
                )
                return
            w, why = self._one_worker(unit, first, deadline)
            names = w.names or []
            if w.done or why == "":
                break
            if why == "sticky":
                first = (w.sticky if w.sticky is not None else w.last_end) + 1
                self.report.note(
                    f"{unit.name}: the CUDA context was lost at item {first - 1}; a fresh worker continues"
                )
            elif w.names is None:  # start-up: a fresh worker would fail the same way
                self._record(unit, f"{unit.name} start-up", why, w)
                break
            elif w.current is None:  # between items (or after the last one, at exit)
                self._record(unit, f"{unit.name} after item {w.last_end}", why, w)
                first = w.last_end + 1
            else:
                self._record(unit, w.current[1], why, w)
                first = w.current[0] + 1
            if why.startswith("watchdog"):
                for name in names[first:]:
                    self.report.verdict(
                        unit.section, name, SKIP, "not run: the run's time limit (watchdog) was reached"
                    )
                break
            restarts += 1
            if first >= len(names) or restarts > len(names) + 1:
                break
        self.report.running = ""
        self.report.note(f"{unit.name}: {time.time() - t0:.1f} s in {restarts + 1} worker(s)")

    def _record(self, unit: Any, item: str, why: str, w: _Worker) -> None:
        status = TIMEOUT if why.startswith(("timeout", "watchdog")) else CRASH
        if unit.family == "Hopper pre-flight":  # the Hopper units must not run after a pre-flight that never finished
            self.shared["hopper"] = {"ok": False, "why": f"the pre-flight's worker ended in {status} ({why})"}
        self.report.verdict(unit.section, item, status, why)
        self._log(f"{status} {unit.name} / {item}: {why} (worker pid {w.proc.pid}; its stderr is above)")

    def _one_worker(self, unit: Any, first: int, deadline: float) -> tuple[_Worker, str]:
        """Run one worker from item `first`; (its state, why it stopped: "" done, "sticky", "timeout ...",
        "watchdog ...", or the exit text of a crash)."""
        self.spawns += 1
        spec = {
            "unit": {"section": unit.section, "family": unit.family},
            "options": self.options,
            "sections": list(self.sections),
            "first": first,
            "deadline": deadline,
            "out": str(self.out_dir),
            "events": str(self.events),
            "scratch": str(self.scratch),
            "gpu": self.gpu,
            "fault": self.fault,
            "shared": self.shared,
        }
        spec_path = self.scratch / f"spec_{self.spawns}.json"
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        offset = self.events.stat().st_size if self.events.exists() else 0
        self._log(f"worker {self.spawns}: {unit.name} from item {first}")
        with open(self.errors, "a", encoding="utf-8") as err:
            proc = subprocess.Popen(
                [sys.executable, *self.worker, str(spec_path)],
                stderr=err, env=self._env(), start_new_session=True,
            )  # fmt: skip
        w = _Worker(proc, time.time())
        item_limit, startup_limit = self.item_limit(unit), self.plan.startup_timeout_s
        why = ""
        try:
            while True:
                events, offset = read_events(self.events, offset)
                self._apply(unit, w, events, item_limit)
                code = proc.poll()
                if code is not None:
                    events, offset = read_events(self.events, offset)
                    self._apply(unit, w, events, item_limit)
                    if w.sticky is not None or code == 3 and not w.done:
                        why = "sticky"
                    elif not w.done:
                        why = f"{exit_text(code)} (the worker died; its stack is in errors.log)"
                    break
                now = time.time()
                limit = w.last_activity + (startup_limit if w.names is None else item_limit)
                if now >= self.run_deadline:
                    why = f"watchdog: the run's {self.plan.total_budget:.0f} s limit was reached while it ran"
                elif now >= deadline + SECTION_GRACE_S:
                    why = f"timeout: its section's budget ran out {SECTION_GRACE_S:.0f} s before (killed)"
                elif now >= limit:
                    what = "start-up" if w.names is None else "item"
                    waited, allowed = now - w.last_activity, limit - w.last_activity
                    why = f"timeout: killed after {waited:.0f} s (the {what} limit is {allowed:.0f} s)"
                if why:
                    self._kill(proc)
                    events, offset = read_events(self.events, offset)
                    self._apply(unit, w, events, item_limit)
                    if w.done:
                        why = ""
                    break
                time.sleep(POLL_S)
        except BaseException:  # SIGTERM, Ctrl-C: the worker must not outlive the run
            self._kill(proc)
            raise
        return w, why

    def _apply(self, unit: Any, w: _Worker, events: list[dict[str, Any]], item_limit: float) -> None:
        for ev in events:
            kind = ev.get("ev")
            w.last_activity = time.time()
            if kind == "items":
                w.names = list(ev["names"])
            elif kind == "start":
                w.current = (int(ev["index"]), str(ev["item"]), time.time())
                self.report.running = (
                    f"{unit.name}: {ev['item']} (started {time.strftime('%H:%M:%S')}, limit {item_limit:.0f} s)"
                )
                self.report.write()
            elif kind == "end":
                w.current, w.last_end = None, int(ev["index"])
                self.report.running = ""
            elif kind == "sticky":
                w.sticky = int(ev["index"])
            elif kind == "share":
                self.shared[str(ev["key"])] = ev["value"]
            elif kind == "done":
                w.done = True
            else:
                self.report.apply(ev)

    def _kill(self, proc: subprocess.Popen) -> None:
        """Kill the worker's process group (the worker and what it started: pytest, a pre-flight), nothing else."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
