"""gpu_check: the pipeline under --simulate (CPU), its containment of hangs and crashes, its report and timing.

One `--simulate --quick` run (CUDA C and Hopper kernels on their emulators, the tower on them) is shared
by the layout tests. The containment runs use a few cheap CUDA C items (`--only`) with a fault injected
(`--inject-fault`): a hang must become TIMEOUT, a crash CRASH, a sticky CUDA error an ERROR after which a
fresh worker goes on, and in each case the other items are measured. What a GPU adds (real sizes, CUDA
events, cuBLAS/SDPA, clocks) cannot run here; the timing method is checked with a scripted device clock.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from moonvit_kernels.config import VisionConfig
from moonvit_kernels.device import gpu_available, simulator_enabled
from moonvit_kernels.tools.gpu_check import faults, worker
from moonvit_kernels.tools.gpu_check import kernels as kernels_mod
from moonvit_kernels.tools.gpu_check import plan as plan_mod
from moonvit_kernels.tools.gpu_check import run as run_mod
from moonvit_kernels.tools.gpu_check import sections as sections_mod
from moonvit_kernels.tools.gpu_check.events import EventWriter, read_events
from moonvit_kernels.tools.gpu_check.model import xray_bound
from moonvit_kernels.tools.gpu_check.plan import Unit, make_plan, parse_sections, units_for
from moonvit_kernels.tools.gpu_check.report import CSV_FIELDS, Report
from moonvit_kernels.tools.gpu_check.suite import count_outcomes, tier_status
from moonvit_kernels.tools.gpu_check.supervisor import Supervisor
from moonvit_kernels.tools.gpu_check.timing import KernelTiming, TorchClock, measure_kernel, percentile
from moonvit_kernels.tools.gpu_check.tower import stage_times, tower_flops, truncated_weights

ROOT = Path(__file__).resolve().parents[1]
needs_sim = pytest.mark.skipif(not simulator_enabled(), reason="--simulate needs numba's simulator in this process")
needs_emulator = pytest.mark.skipif(
    __import__("shutil").which(os.environ.get("CXX", "g++")) is None, reason="no C++ compiler for the CUDA C emulator"
)
CHEAP = ["--simulate", "--quick", "--sections", "kernels", "--backends", "cuda"]
CHEAP_ITEMS = "cuda rmsnorm,cuda rope,cuda merge"


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == CSV_FIELDS
        return list(reader)


def verdict_lines(out: Path) -> list[str]:
    text = (out / "report.md").read_text()
    return [line for line in text.split("## (d) Verdicts", 1)[1].splitlines() if line.startswith("- **")]


def events(out: Path) -> list[dict]:
    return read_events(out / "results.jsonl", 0)[0]


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """One `--simulate --quick` run on the CUDA C and Hopper kernels: (exit status, output folder, seconds)."""
    if not simulator_enabled():
        pytest.skip("--simulate needs numba's simulator in this process")
    out = tmp_path_factory.mktemp("gpu_check")
    t0 = time.monotonic()
    status = run_mod.main(["--simulate", "--quick", "--backends", "cuda,hopper", "--out", str(out)])
    return status, out, time.monotonic() - t0


# ============================================================================ the simulated run
@pytest.mark.slow  # one simulated run, ~30 s of CPU in ~10 worker processes, shared by the tests below
@needs_emulator
def test_quick_simulate_passes_and_writes_at_most_8_files(quick):
    status, out, _ = quick
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if not p.name.startswith("."))
    assert status == 0, (out / "report.md").read_text()
    assert len(files) <= 8 and all("/" not in f for f in files), files
    assert {"report.md", "results.csv", "results.jsonl", "errors.log", "diagnostics.md", "pytest.log"} <= set(files)
    text = (out / "report.md").read_text()
    for heading in ("## Problems (read first)", "## Machine", "## (a) GPU test tier", "measured in this run",
                    "## (b) Kernels vs baselines", "## (c) Whole tower", "outputs vs the NumPy reference",
                    "## (d) Verdicts"):  # fmt: skip
        assert heading in text, heading
    assert "mode: SIMULATE" in text and "finished" in text and "- none so far" in text
    assert "0 fail" in text and "exit status 0" in text and "running now" not in text
    assert all(line.split("**")[1] in ("pass", "skip") for line in verdict_lines(out))


@pytest.mark.slow
@needs_emulator
def test_quick_simulate_rows_carry_checks_timings_peaks_and_the_model(quick):
    _, out, _ = quick
    rows = read_csv(out / "results.csv")
    kernels = [r for r in rows if r["section"] == "kernels"]
    names = {r["item"] for r in kernels}
    assert {"gemm_bf16 qkv", "gemm_fp32 qkv", "attention_bfloat16", "rmsnorm fp32->bf16", "merge fp32->bf16"} <= names
    assert {"gemm_bf16_sm90 bn128 qkv", "gemm_bf16_sm90 bn256 qkv", "flash_attn_sm90"} <= names  # on the emulator
    for r in kernels:
        assert r["verdict"] == "pass" and float(r["check_err"]) <= float(r["check_tol"])
        assert r["where"] == "CUDA C emulator (CPU)" and r["clock"].startswith("host clock (emulator)")
        assert float(r["rate"]) > 0 and float(r["host_us"]) > 0 and r["gap_free"] == "n/a (host clock)"
        assert r["baseline"].endswith("(CPU)") and float(r["pct_of_baseline"]) > 0
        assert r["peak"] == r["pct_of_peak"] == ""  # no datasheet peak for a CPU number
        assert "(CPU)" in r["measured_peak"] and float(r["pct_of_measured_peak"]) > 0
        assert "H200 SXM datasheet, no GPU" in r["model"] and float(r["model_ms"]) > 0
        assert r["model_ratio"] == ""  # no ratio of a CPU time to a GPU bound
    peaks = {r["peak_key"] for r in rows if r["section"] == "peaks"}
    assert peaks == {"gemm bf16", "gemm fp32", "attention bfloat16", "attention float32", "copy"}
    tower = {r["backend"] for r in rows if r["section"] == "tower"}
    assert {"numpy float64 (reference)", "CUDA C fp32", "CUDA C bf16", "CUDA C bf16 hopper=False"} <= tower
    checks = [r for r in rows if r["section"] == "tower_check"]
    assert checks and all(r["verdict"] == "pass" for r in checks)
    assert {"CUDA C bf16 vs CUDA C fp32", "CUDA C bf16 vs CUDA C bf16 hopper=False"} <= {r["backend"] for r in checks}
    order = [e["item"] for e in events(out) if e["ev"] == "start"]
    assert order.index("cuda rmsnorm") < order.index("hopper pre-flight") < order.index("hopper gemm bn128 qkv")
    assert order.index("CUDA C fp32 image 2x4 patches (stands in for 448²)") > order.index("hopper attention")


@pytest.mark.slow
@needs_emulator
def test_quick_simulate_diagnostics_name_the_toolchain_and_the_kernels_used(quick):
    _, out, _ = quick
    diag = (out / "diagnostics.md").read_text()
    assert "NVRTC (cuda-bindings)" in diag and "nvJitLink" in diag and "NVVM (numba-cuda)" in diag
    assert "## Hopper pre-flight" in diag and '"gemm bn256 bf16 gelu_tanh"' in diag
    hopper_on = diag.split("describe() of tower backend CUDA C bf16 after", 1)[1].split("```", 2)[1]
    hopper_off = diag.split("describe() of tower backend CUDA C bf16 hopper=False", 1)[1].split("```", 2)[1]
    assert "gemm_bf16_sm90 x" in hopper_on and "flash_attn_sm90 x" in hopper_on
    assert "gemm_bf16_sm90" not in hopper_off and "gemm_bf16_tc x" in hopper_off
    starts = [e for e in events(out) if e["ev"] == "start"]
    ends = {(e["index"], e["item"]) for e in events(out) if e["ev"] == "end"}
    assert starts and all((e["index"], e["item"]) in ends for e in starts)  # every item announced, every one ended


# ============================================================================ containment
def _cheap_run(tmp_path: Path, *extra: str) -> tuple[int, Path, float]:
    out = tmp_path / "out"
    t0 = time.monotonic()
    status = run_mod.main([*CHEAP, "--only", CHEAP_ITEMS, "--out", str(out), *extra])
    return status, out, time.monotonic() - t0


def _measured(out: Path) -> set[str]:
    return {r["item"] for r in read_csv(out / "results.csv") if r["section"] == "kernels" and r["verdict"] == "pass"}


@needs_sim
@needs_emulator
def test_a_hang_is_a_timeout_and_the_other_items_are_measured(tmp_path):
    status, out, seconds = _cheap_run(tmp_path, "--inject-fault", "hang:cuda rope", "--item-timeout-s", "5")
    assert status == 1 and seconds < make_plan(True, True).total_budget
    text = (out / "report.md").read_text()
    assert "- **TIMEOUT** [kernels] cuda rope: timeout: killed after 5 s (the item limit is 5 s)" in text
    assert text.index("## Problems (read first)") < text.index("**TIMEOUT**") < text.index("## Machine")
    assert _measured(out) == {"rmsnorm fp32->bf16", "merge fp32->bf16"}
    assert "fault injected on purpose: --inject-fault hang:cuda rope" in text
    assert "TIMEOUT kernels:CUDA C / cuda rope" in (out / "errors.log").read_text()


@needs_sim
@needs_emulator
def test_a_crash_is_named_with_its_signal_and_the_other_items_are_measured(tmp_path):
    status, out, _ = _cheap_run(tmp_path, "--inject-fault", "crash:cuda rope")
    assert status == 1
    text = (out / "report.md").read_text()
    assert "- **CRASH** [kernels] cuda rope: signal SIGABRT" in text
    assert _measured(out) == {"rmsnorm fp32->bf16", "merge fp32->bf16"}
    log = (out / "errors.log").read_text()
    assert "Fatal Python error: Aborted" in log and "before_item" in log  # faulthandler's stack of the worker
    assert "CRASH kernels:CUDA C / cuda rope" in log


@needs_sim
@needs_emulator
def test_a_sticky_cuda_error_restarts_the_worker_and_the_rest_is_measured(tmp_path):
    status, out, _ = _cheap_run(tmp_path, "--inject-fault", "error:cuda rope")
    assert status == 1
    text = (out / "report.md").read_text()
    assert "- **ERROR** [kernels] cuda rope: RuntimeError: injected fault: an illegal memory access" in text
    assert "the CUDA context was lost at item 1; a fresh worker continues" in text
    assert _measured(out) == {"rmsnorm fp32->bf16", "merge fp32->bf16"}
    assert "Traceback (most recent call last)" in (out / "errors.log").read_text()


@needs_sim
@needs_emulator
def test_a_wrong_output_fails_its_check_and_is_not_timed(tmp_path):
    """In one process (--in-process): the perturbed merge FAILs with its error, untimed; the others pass."""
    out = tmp_path / "out"
    status = run_mod.main([*CHEAP, "--only", CHEAP_ITEMS, "--out", str(out), "--in-process",
                           "--inject-fault", "wrong:cuda merge"])  # fmt: skip
    assert status == 1
    rows = {r["item"]: r for r in read_csv(out / "results.csv") if r["section"] == "kernels"}
    assert rows["merge fp32->bf16"]["verdict"] == "FAIL" and rows["merge fp32->bf16"]["median_ms"] == ""
    assert float(rows["merge fp32->bf16"]["check_err"]) > 1.0
    assert rows["rope bf16 (q, k in place)"]["verdict"] == "pass"


def test_a_worker_that_dies_or_hangs_at_start_up_is_named_and_the_watchdog_ends_the_run(tmp_path, monkeypatch):
    """Workers replaced by interpreters that abort, then sleep: CRASH / TIMEOUT "<unit> start-up", and the
    run's watchdog (--budget-s) stops a hang that no item limit catches."""
    monkeypatch.setattr(Supervisor, "worker", ("-c", "import os; os.abort()"))
    status = run_mod.main(["--simulate", "--sections", "tests", "--out", str(tmp_path / "a")])
    assert status == 1
    text = (tmp_path / "a" / "report.md").read_text()
    assert "**CRASH** [machine] machine:machine start-up: signal SIGABRT" in text
    assert "**CRASH** [tests] tests:pytest start-up: signal SIGABRT" in text
    monkeypatch.setattr(Supervisor, "worker", ("-c", "import time; time.sleep(600)"))
    t0 = time.monotonic()
    status = run_mod.main(["--simulate", "--sections", "tests", "--budget-s", "3", "--out", str(tmp_path / "b")])
    assert status == 1 and time.monotonic() - t0 < 30
    text = (tmp_path / "b" / "report.md").read_text()
    assert "**TIMEOUT** [machine] machine:machine start-up: watchdog: the run's 3 s limit" in text
    assert "**skip** [tests] tests:pytest: not run: the run's time limit (watchdog) was reached" in text


def test_a_start_up_failure_still_writes_the_report_with_the_traceback(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "moonvit_kernels.tools.gpu_check.plan", None)  # its import fails
    assert run_mod.main(["--simulate", "--out", str(tmp_path)]) == 1
    text = (tmp_path / "report.md").read_text()
    assert "FAILED TO START" in text and "Traceback" in text and "ModuleNotFoundError" in text
    assert "Traceback" in (tmp_path / "errors.log").read_text()


def test_a_missing_dependency_still_writes_the_report_from_a_source_tree(tmp_path):
    """`python -m moonvit_kernels.gpu_check` on an image lacking a package the project imports (here numpy, made
    unimportable): the package's lazy `__init__` lets gpu_check start, and its report names the missing import."""
    fake = tmp_path / "site" / "numpy"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named numpy (planted by the test)')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(ROOT)])}
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "moonvit_kernels.tools.gpu_check", "--simulate", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 1, r.stderr[-2000:]
    text = (out / "report.md").read_text()
    assert "FAILED TO START" in text and "No module named numpy (planted by the test)" in text
    assert "planted by the test" in (out / "errors.log").read_text()


def test_the_recorder_passes_the_launchers_keywords_to_compile_text():
    """hopper_launchers calls `nvrtc_check.compile_text(text, file, names, arch, strict=False)`: the recorder's
    wrapper must take and pass every argument the launcher gives (a GPU run's Hopper builds go through it)."""
    from moonvit_kernels.tools.gpu_check.binaries import BinaryRecorder

    seen = []

    def compile_text(text, filename, names, arch, strict=True):
        seen.append(strict)
        return b"cubin", "ptxas info: Used 168 registers", {n: n for n in names}

    rec = BinaryRecorder()
    wrapped = rec._keep_log(compile_text)
    assert wrapped("src", "gemm_bf16_sm90.cu", ("k",), "sm_90a", strict=False)[0] == b"cubin"
    assert seen == [False] and rec.logs == [("gemm_bf16_sm90.cu k (sm_90a)", "ptxas info: Used 168 registers")]


def test_numba_table_asks_the_dispatcher_with_signature_objects(monkeypatch):
    """numba-cuda's `get_regs_per_thread(signature)` reads `signature.args`: the table passes the dispatcher's own
    `nopython_signatures` (a stand-in with numba-cuda's semantics), one row per compiled signature."""
    import types

    from moonvit_kernels import registry
    from moonvit_kernels.tools.gpu_check import binaries

    class Dispatcher:
        overloads = {("float32[::1]",): types.SimpleNamespace(regs_per_thread=40, local_mem_per_thread=0,
                                                              shared_mem_per_block=1024)}  # fmt: skip
        nopython_signatures = [types.SimpleNamespace(args=("float32[::1]",))]

        def get_regs_per_thread(self, signature=None):
            return self.overloads[signature.args].regs_per_thread

        def get_local_mem_per_thread(self, signature=None):
            return self.overloads[signature.args].local_mem_per_thread

        def get_shared_mem_per_block(self, signature=None):
            return self.overloads[signature.args].shared_mem_per_block

    entry = registry.numba_entries()[0]
    monkeypatch.setattr(registry, "numba_entries", lambda modules=None: [entry])
    monkeypatch.setattr(type(entry), "dispatcher", lambda self: Dispatcher())
    table = binaries.numba_table()
    assert f"{entry.label} | (float32[::1]) | 40 | 0 | 1024" in table, table


class TestNumbaBuildRehearsal:
    """Its own xdist scope: ~11 s of compiles that run beside this module's simulated run."""

    @pytest.mark.slow  # ~11 s: every numba kernel typed, compiled by NVVM and linked by numba-cuda, no GPU
    def test_the_numba_build_rehearsal_reads_registers_through_the_real_dispatchers(self):
        """`gpu_check.numba_build` (what --simulate's numba family runs): numba-cuda's real dispatchers compile every
        registry entry for an sm_90 device and its linker links them; `binaries.numba_table` reads each one's
        registers through the dispatcher API, as on a GPU."""
        from moonvit_kernels import registry
        from moonvit_kernels.numba_backend.compilers import NUMBA_CUDA, installed

        if not installed(NUMBA_CUDA) or importlib.util.find_spec("cuda.bindings") is None:
            pytest.skip("numba-cuda with cuda-bindings is needed")
        env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
        r = subprocess.run([sys.executable, "-m", "moonvit_kernels.tools.gpu_check.numba_build"], env=env,
                           capture_output=True, text=True, timeout=600)  # fmt: skip
        result = __import__("json").loads(r.stdout.strip().splitlines()[-1])
        if result["error"] and "NVVM" in result["error"] and result["built"] == 0:
            pytest.skip(f"this machine cannot compile numba kernels: {result['error']}")
        assert result["error"] is None, result["error"]
        rows = [line.split(" | ") for line in result["table"].splitlines()[1:]]
        labels = {e.label for e in registry.numba_entries()}
        assert {row[0] for row in rows} == labels and result["built"] == len(labels)
        assert all(row[2].isdigit() and 0 < int(row[2]) <= 255 and row[3].isdigit() for row in rows), rows


@needs_sim
def test_spent_budget_skips_the_rest_with_a_note(tmp_path, monkeypatch):
    calls = []

    def cases(*args, **kwargs):
        for i in range(3):

            def build(i=i):
                calls.append(i)
                raise AssertionError("never built: the budget is spent")

            yield f"numba item {i}", build

    monkeypatch.setattr(sections_mod, "numba_cases", cases)
    monkeypatch.setattr(sections_mod.Budget, "spent", lambda self: True)
    argv = ["--simulate", "--sections", "kernels", "--backends", "numba", "--in-process", "--out", str(tmp_path)]
    assert run_mod.main(argv) == 0 and calls == []
    text = (tmp_path / "report.md").read_text()
    assert text.count("section budget spent") == 4  # the three cases and the numba build rehearsal
    assert "numba GPU build (NVVM, numba-cuda's linker, sm_90): section budget spent" in text


@pytest.mark.skipif(gpu_available(), reason="this machine has a GPU")
def test_without_gpu_and_without_simulate_one_clear_line_and_status_2(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run(
        [sys.executable, "-m", "moonvit_kernels.tools.gpu_check", "--out", str(tmp_path / "o")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2
    assert r.stdout == ""
    assert r.stderr.strip().splitlines() == [run_mod.NO_GPU]
    assert not (tmp_path / "o").exists()


def test_bad_options_exit_2_naming_the_problem(capsys, tmp_path):
    assert run_mod.main(["--simulate", "--sections", "a,x", "--out", str(tmp_path)]) == 2
    assert "unknown section 'x'" in capsys.readouterr().err
    assert run_mod.main(["--simulate", "--budget-s", "0", "--out", str(tmp_path)]) == 2
    assert "--budget-s must be a positive number of seconds" in capsys.readouterr().err
    assert run_mod.main(["--simulate", "--inject-fault", "explode:x", "--out", str(tmp_path)]) == 2
    assert "KIND one of hang, crash, wrong, error" in capsys.readouterr().err
    assert run_mod.main(["--simulate", "--backends", "cuda,tpu", "--out", str(tmp_path)]) == 2
    assert "unknown backend tpu" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--tokens", "-64"], "--tokens -64: a token count is a positive square"),
        (["--tokens", "0"], "--tokens 0: a token count is a positive square"),
        (["--tokens", "1024", "2"], "--tokens 2: a token count is a positive square"),
        (["--budget-s", "nan"], "--budget-s must be a positive number of seconds, got nan"),
        (["--budget-s", "inf"], "--budget-s must be a positive number of seconds, got inf"),
        (["--budget-s", "-5"], "--budget-s must be a positive number of seconds, got -5"),
        (["--item-timeout-s", "nan"], "--item-timeout-s must be a positive number of seconds, got nan"),
        (["--item-timeout-s", "inf"], "--item-timeout-s must be a positive number of seconds, got inf"),
        (["--item-timeout-s", "0"], "--item-timeout-s must be a positive number of seconds, got 0"),
        (["--out", "{file}"], "is a file: the report needs a folder"),
        (["--out", "{file}/report"], "a file: the report needs a folder"),
    ],
)
def test_out_of_range_options_exit_2_with_one_line(argv, says, capsys, tmp_path):
    """Issue 31, finding 10: these gave tracebacks (tokens, a file as --out) or were accepted (NaN, inf)."""
    (tmp_path / "file").write_text("not a folder")
    argv = [a.replace("{file}", str(tmp_path / "file")) for a in argv]
    out = [] if "--out" in argv else ["--out", str(tmp_path / "o")]
    assert run_mod.main(["--simulate", *argv, *out]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpu_check: ") and says in err[0], err
    assert not (tmp_path / "o").exists() and (tmp_path / "file").read_text() == "not a folder"


# ============================================================================ pieces
def test_faults_parse_and_apply():
    f = faults.parse_fault("wrong:cuda merge")
    assert f == faults.Fault("wrong", "cuda merge") and f.hits("cuda merge L=1024") and not f.hits("cuda rope")
    assert faults.parse_fault(None) is None
    for bad in ("hang", "hang:", "boom:x"):
        with pytest.raises(ValueError, match="KIND:MATCH"):
            faults.parse_fault(bad)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        faults.before_item(faults.parse_fault("error:rope"), "cuda rope")
    faults.before_item(faults.parse_fault("crash:rope"), "cuda merge")  # not this item: nothing happens
    a, b = np.ones(4, np.float32), np.full(4, 0x3F80, np.uint16)
    faults.perturb(a)
    faults.perturb(b)
    assert a[-1] == 1001.0 and b[-1] == 0x4480 and a[0] == 1.0


def test_sticky_errors_are_told_apart():
    assert worker.is_sticky(RuntimeError("cudaErrorIllegalAddress: an illegal memory access was encountered"))
    assert worker.is_sticky(Exception("CUDA_ERROR_LAUNCH_FAILED: unspecified launch failure"))
    assert not worker.is_sticky(ValueError("gemm: inner dimensions differ"))
    assert not worker.is_sticky(MemoryError("out of memory"))


def test_events_are_read_by_complete_lines(tmp_path):
    w = EventWriter(tmp_path / "r.jsonl", tmp_path, echo=False)
    w.start(0, "a")
    w.add_row("kernels", item="a", rate=float("nan"))
    with open(tmp_path / "r.jsonl", "a") as f:
        f.write('{"ev": "end", "ind')  # a line being written
    got, offset = read_events(tmp_path / "r.jsonl", 0)
    assert [e["ev"] for e in got] == ["start", "row"] and np.isnan(got[1]["values"]["rate"])
    with open(tmp_path / "r.jsonl", "a") as f:
        f.write('ex": 0, "item": "a"}\n')
    more, _ = read_events(tmp_path / "r.jsonl", offset)
    assert more == [{"ev": "end", "index": 0, "item": "a"}]
    w.close()


class ScriptedClock:
    """A device clock whose marks read a scripted device timeline: each call of `fn` takes `call_s`, each flush
    `flush_s`, and the device reaches a mark only once the host has queued `lag` more operations after it."""

    device, label = True, "scripted"

    def __init__(self, call_s: float, flush_s: float, lag: int):
        self.call_s, self.flush_s, self.lag = call_s, flush_s, lag
        self.t, self.ops, self.flushes, self.marks = 0.0, 0, 0, []

    def run(self) -> None:
        self.t += self.call_s
        self.ops += 1

    def flush(self) -> None:
        self.t += self.flush_s
        self.flushes += 1
        self.ops += 1

    def flush_seconds(self) -> float:
        return self.flush_s

    def mark(self) -> tuple[float, int]:
        self.ops += 1
        return (self.t, self.ops)

    def seconds(self, a, b) -> float:
        return b[0] - a[0]

    def pending(self, mark) -> bool:
        return self.ops - mark[1] < self.lag

    def sync(self) -> None:
        pass


def test_measure_kernel_counts_calls_per_window_flushes_and_launch_gaps():
    clock = ScriptedClock(call_s=2e-6, flush_s=1e-4, lag=100)
    t = measure_kernel(clock.run, clock, repeats=4, warmup=1, inner=10, cold_repeats=3)
    assert isinstance(t, KernelTiming) and t.inner == 10 and t.warm.runs == 4 and t.cold.runs == 3
    assert t.warm.median == pytest.approx(2e-6) and t.cold.median == pytest.approx(2e-6)
    assert t.gap_free == "yes" and clock.flushes >= 4 + 3
    late = ScriptedClock(call_s=2e-6, flush_s=1e-4, lag=0)  # the device is always at the mark: the host is behind
    t = measure_kernel(late.run, late, repeats=3, warmup=0, inner=5, cold_repeats=2)
    assert t.gap_free == "no (3 of 3 warm, 2 of 2 cold windows opened early)"
    assert late.flushes >= 1 + 2 + 4 + 1 + 2  # doubled after each early window
    slow = ScriptedClock(call_s=0.2, flush_s=1e-4, lag=100)  # 0.2 s a call, 1 s per measurement
    t = measure_kernel(slow.run, slow, repeats=10, warmup=0, inner=20, cold_repeats=10, max_seconds=1.0)
    assert (t.inner, t.warm.runs, t.cold.runs) == (1, 3, 3) and t.warm.median == pytest.approx(0.2)


def test_torch_clock_reads_its_events():
    """TorchClock (torch's CUDA events, here a stand-in torch): a mark is a recorded event, seconds wait for the
    later one and convert its milliseconds, pending asks the event."""

    class Event:
        made: list = []

        def __init__(self, enable_timing: bool):
            self.recorded = self.waited = False
            self.made.append(self)

        def record(self):
            self.recorded = True

        def synchronize(self):
            self.waited = True

        def query(self):
            return self.waited

        def elapsed_time(self, other):
            return 2.5

    fake_torch = type("torch", (), {"cuda": type("cuda", (), {"Event": Event})})
    clock = TorchClock(fake_torch)
    a, b = clock.mark(), clock.mark()
    assert Event.made == [a, b] and a.recorded and b.recorded and clock.pending(b)
    assert clock.seconds(a, b) == pytest.approx(2.5e-3) and b.waited and not clock.pending(b)


def test_the_tools_find_the_source_tree():
    """The pytest tier's test files, the workers' PYTHONPATH and the X-ray's calibration runs are found from the
    one source-tree root (`tools.SOURCE_ROOT`), wherever the tools' modules sit in the package."""
    from moonvit_kernels.tools.gpu_check.suite import source_root
    from moonvit_kernels.tools.xray.calibration import results_files

    assert source_root() == ROOT and all((ROOT / f).exists() for f in make_plan(False, False).test_files)
    env = Supervisor._env(type("S", (), {"plan": make_plan(True, True)})())  # a worker's environment
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT)
    assert {p.parent.name for p in results_files()} >= {"H200-2026-12-04-full", "H200-2026-12-04-quick"}


def test_percentiles_interpolate():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([3.0, 1.0, 2.0], 10) == pytest.approx(1.2) and percentile([5.0], 90) == 5.0


def test_report_derives_percent_of_measured_peak_and_of_the_tower_baseline(tmp_path):
    rep = Report(tmp_path, "test", "cmd", echo=False)
    rep.add_row("peaks", item="gemm bf16: cuBLAS", where="GPU", unit="TFLOP/s", rate=800.0, peak_key="gemm bf16")
    row = rep.add_row("kernels", item="k1", unit="TFLOP/s", rate=200.0, peak_key="gemm bf16", verdict="pass")
    assert row["pct_of_measured_peak"] == 25.0 and row["measured_peak"] == "gemm bf16: cuBLAS (GPU)"
    rep.add_row("tower", item="case", backend="torch eager bf16", median_ms=10.0)
    row = rep.add_row("tower", item="case", backend="CUDA C bf16", median_ms=20.0)
    assert row["pct_of_baseline"] == 50.0 and row["baseline"] == "torch eager bf16"
    assert "IN PROGRESS" in (tmp_path / "report.md").read_text()
    rep.running = "kernels:CUDA C: cuda rope"
    rep.verdict("kernels", "k2", "CRASH", "signal SIGSEGV")
    text = (tmp_path / "report.md").read_text()
    assert "- running now: kernels:CUDA C: cuda rope" in text and rep.exit_status() == 1
    assert "- **CRASH** [kernels] k2: signal SIGSEGV" in text.split("## Machine")[0]
    with pytest.raises(KeyError, match="unknown results.csv column"):
        rep.add_row("kernels", speed=3)


def test_tier_cut_by_its_budget_is_partial_never_pass():
    counts = {"passed": 12, "failed": 0, "error": 0, "skipped": 0, "xfail": 0, "xpass": 0}
    assert tier_status(counts, "", -9, True, 35, False)[0] == "partial"
    assert tier_status(counts, "12 passed", 0, False, 35, False)[0] == "pass"
    assert tier_status({**counts, "failed": 1}, "", -9, True, 35, False)[0] == "FAIL"
    assert tier_status({**counts, "passed": 0}, "", 5, False, 35, True) == (
        "skip",
        "no GPU (--simulate): the gpu tier skips itself",
    )


def test_quick_order_is_cuda_c_then_hopper_then_numba_and_cupy_tests_first():
    plan = make_plan(False, True)
    assert plan.test_files[0] == "tests/test_cupy_gpu.py"
    names = [u.name for u in units_for(plan, ("tests", "kernels", "tower"))]
    assert names[:2] == ["machine:machine", "tests:pytest"]
    kernels = [n for n in names if n.startswith("kernels:")]
    assert kernels == ["kernels:CUDA C", "kernels:Hopper pre-flight", "kernels:Hopper", "kernels:numba"]
    tower = [n for n in names if n.startswith("tower:")]
    assert tower[:2] == ["tower:reference", "tower:torch"] and tower[-1] == "tower:numba fp32"
    assert units_for(make_plan(True, True), ("kernels",)) == [
        Unit("machine", "machine"), Unit("kernels", "CUDA C"), Unit("kernels", "Hopper pre-flight"),
        Unit("kernels", "Hopper"), Unit("kernels", "numba"),
    ]  # fmt: skip
    assert units_for(make_plan(True, True), ("tower",))[:3] == [
        Unit("machine", "machine"), Unit("kernels", "Hopper pre-flight"), Unit("tower", "reference"),
    ]  # fmt: skip


def test_budgets_fit_the_lease_and_scale():
    quick, full = make_plan(False, True), make_plan(False, False)
    assert quick.total_budget <= 360 and full.total_budget <= 540  # 6 and 9 minutes, the watchdog included
    assert sum(quick.budgets.values()) < quick.total_budget and sum(full.budgets.values()) < full.total_budget
    small = make_plan(False, False, budget_s=full.total_budget / 2)
    for name, seconds in full.budgets.items():
        assert small.budgets[name] == pytest.approx(seconds / 2)
    opts = plan_mod.plan_from_options({"simulate": True, "only": "cuda rope, merge", "item_timeout_s": 7})
    assert opts.only == ("cuda rope", "merge") and opts.wanted("cuda merge") and not opts.wanted("cuda rmsnorm")
    assert opts.item_timeout_s == opts.tower_item_timeout_s == 7.0


def test_parse_sections_accepts_letters_and_names_in_report_order():
    assert parse_sections("c,a") == ("tests", "tower")
    assert parse_sections("kernels") == ("kernels",)
    with pytest.raises(ValueError, match="unknown section"):
        parse_sections("d")


def test_count_outcomes_reads_verbose_lines_even_without_a_summary():
    log = (
        "tests/test_x.py::test_a[1-none] PASSED                         [ 10%]\n"
        "tests/test_x.py::test_a[2-none] FAILED                         [ 20%]\n"
        "tests/test_x.py::test_b SKIPPED (no CUDA GPU)                  [ 30%]\n"
        "tests/test_x.py::test_c ERROR                                  [ 40%]\n"
        "tests/test_x.py::test_d PASSED                                 [ 50%]\n"
    )
    c = count_outcomes(log)
    assert (c["passed"], c["failed"], c["skipped"], c["error"]) == (2, 1, 1, 1)


def test_rel_err_nan_and_shape_mismatch_fail():
    assert np.isnan(kernels_mod.rel_err(np.array([1.0, np.nan]), np.array([1.0, 2.0])))
    assert np.isnan(kernels_mod.rel_err(np.ones(3), np.ones(4)))
    assert kernels_mod.rel_err(np.array([1.0, 2.1]), np.array([1.0, 2.0])) == pytest.approx(0.05)
    rows = kernels_mod.sample_rows(1000, 64)
    assert rows[0] == 0 and rows[-1] == 999 and rows.size == 64


def test_tower_flops_match_the_plots_table():
    plots = pytest.importorskip("moonvit_kernels.plots")
    c = VisionConfig.k3()
    grid = np.array([[1, 32, 32]] * 3 + [[2, 16, 24]])
    assert tower_flops(c, grid) == sum(row.count for row in plots.flop_table(c, grid))


def test_truncated_weights_and_stage_times():
    from moonvit_kernels.weights import check_weights, random_weights

    c = VisionConfig.tiny()
    w = truncated_weights(random_weights(c, 0), 1)
    check_weights(w, c.replace(vt_num_hidden_layers=1))
    stages = stage_times([5.0, 2.0, 4.0, 3.0, 1.0])
    assert stages[0] == ("patch embed + pos emb + layer 0", 5.0)
    assert ("layer, median of layers 1..3", 3.0) in stages and ("layers 1..3, sum", 9.0) in stages
    assert stages[-1] == ("final norm + merge + projector", 1.0)


def test_sdpa_baseline_is_the_fastest_backend_that_runs():
    """The selection logic on torch's CPU kernels (on a GPU the same code times cuDNN/flash/efficient/math)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch.nn.attention")
    from moonvit_kernels.tools.gpu_check.baselines import Baselines
    from moonvit_kernels.tools.gpu_check.timing import HostClock

    b = Baselines(simulate=False, method=make_plan(True, True))
    b.torch, b.device, b.torch_clock = torch, "cpu", HostClock()
    label, timing = b.get("attention", 16, 2, 8, "float32")
    assert "fastest of" in label and "math" in label.split("fastest of")[1], label
    assert timing is not None and timing.warm.runs == 1 and timing.warm.median > 0
    assert b.get("attention", 16, 2, 8, "float32") == (label, timing)  # cached per shape


def test_the_xray_bound_is_given_or_no_model_is_said(monkeypatch):
    from moonvit_kernels.tools.gpu_check.model import xray_bound
    from moonvit_kernels.tools.xray import roofline

    gemm = ("gemm_bf16_tc_bf16_none", 2.0 * 1024 * 4608 * 1024, 2.0 * (1024 * 1024 + 4608 * 1024 + 1024 * 4608))
    got = xray_bound(gemm, "CUDA C", "NVIDIA H200")
    from moonvit_kernels.tools.xray.arch import GPUS

    assert got["model"] == "mma.sync-bound, mma_sync peak, H200 SXM datasheet"  # an mma.sync kernel: its own roof
    assert got["model_ms"] == pytest.approx(gemm[1] / GPUS["H200"].mma_sync_flops * 1e3)
    assert xray_bound(gemm, "CUDA C", "NVIDIA GeForce RTX 4090")["model"].startswith("no model (")
    monkeypatch.setattr(roofline, "bound", lambda *a: 1 / 0)
    assert xray_bound(gemm, "CUDA C", "NVIDIA H200") == {"model": "no model (ZeroDivisionError: division by zero)"}


def test_binary_table_reads_cupy_attributes_or_says_why_not():
    from moonvit_kernels.tools.gpu_check.binaries import BinaryRecorder, kernel_table

    class Kernel:
        attributes = {"num_regs": 168, "local_size_bytes": 0, "shared_size_bytes": 0,
                      "max_dynamic_shared_size_bytes": 197632, "binary_version": 90}  # fmt: skip

    class Broken:
        @property
        def attributes(self):
            raise RuntimeError("no context")

    table = kernel_table({"hopper_launchers: gemm_bf16_sm90 <bn128>": Kernel(), "launchers: rope": Broken()})
    assert "hopper_launchers: gemm_bf16_sm90 <bn128> | 168 | 0 | 0 | 197632 | 90" in table
    assert "launchers: rope | attributes unavailable (RuntimeError: no context)" in table
    rec = BinaryRecorder()
    keep = rec._keep_kernel("launchers")(lambda device, source, name, hd=128: (Kernel(), "spec"))
    assert keep(0, "rope.cu", "rope_2d_inplace<__nv_bfloat16>")[1] == "spec"
    assert list(rec.kernels) == ["launchers: rope.cu rope_2d_inplace<__nv_bfloat16>"]


def test_gpu_state_line_and_incompatible_packages():
    from moonvit_kernels.tools.gpu_check import machine

    line = machine.format_state(["1980", "3201", "412.50", "51", "0x0000000000000004"])
    assert line == "SM 1980 MHz, memory 3201 MHz, power 412.50 W, 51 °C, clock event reasons 0x0000000000000004"
    assert machine.gpu_state(simulate=True) == "absent (--simulate: no GPU)"
    assert machine.version_of("no_such_module_here") == "not installed"
    assert machine.version_tuple("2.11.0+cu130") == (2, 11, 0)
    assert machine.too_old("cupy", "12.3.0") and not machine.too_old("cupy", "14.2.0")


def test_datasheet_peaks_are_labelled_and_unknown_gpus_get_none():
    from moonvit_kernels.tools.gpu_check.peaks import peak_for, peak_key

    assert peak_for("NVIDIA H200", "TFLOP/s", "bfloat16->float32") == (989.0, "989 TFLOP/s bf16 dense (H200 datasheet)")
    assert peak_for("NVIDIA H100 80GB HBM3", "GB/s", "float32")[0] == 3350.0
    assert peak_for("NVIDIA GeForce RTX 4090", "GB/s", "float32") is None
    assert peak_for(None, "GB/s", "float32") is None
    assert peak_key("attention", "bfloat16") == "attention bfloat16" and peak_key("gemm_bf16", "x") == "gemm bf16"
    assert peak_key("copy", "float32->bfloat16") == "copy"


def test_hopper_rows_only_on_sm90_and_only_where_the_tensor_maps_fit():
    assert sections_mod.hopper_skip_reason("90") is None
    assert "compute capability 9.0" in sections_mod.hopper_skip_reason("80")

    class Fake:  # nothing is built or launched: the case list only
        array_module = staticmethod(lambda: np)
        gemm = attention = None

    names = [
        n for n, _ in kernels_mod.hopper_cases(Fake, VisionConfig.k3(), np.array([[1, 4, 4]]), ("patch_embed", "qkv"))
    ]
    assert names == ["hopper gemm bn128 qkv", "hopper gemm bn256 qkv", "hopper attention"]  # patch K = 588: no TMA


def _case_infos(plan) -> dict[tuple, kernels_mod.Info]:
    """(item, backend, shape, tokens) -> report fields of every kernel case `plan` times (nothing is built)."""
    fake = type("Fake", (), {"array_module": staticmethod(lambda: np), "gemm": None, "attention": None})
    c, infos = plan.kernel_config, {}
    for g in plan.kernel_grids:
        grid = np.array([g])
        for cases in (
            kernels_mod.numba_cases(c, grid, plan.numba_gemm_shapes, plan.v1_threads, plan.numba_gemm_versions,
                                    plan.numba_attention_versions),
            kernels_mod.cuda_cases(fake, c, grid, plan.cuda_gemm_shapes),
            kernels_mod.hopper_cases(fake, c, grid, plan.hopper_gemm_shapes, plan.hopper_block_ns),
        ):  # fmt: skip
            infos.update({(i.item, i.backend, i.shape, i.tokens): i for i in (case.info for _, case in cases)})
    return infos


def _evaluated(formula: str) -> float:
    """The number a work formula such as `2·1024·2·1536·2+1024·16 B` or `4·1024²·1536` writes out."""
    text = formula.removesuffix(" B").replace("·", "*").replace("²", "**2")
    assert re.fullmatch(r"[0-9*+()]+", text), formula
    return float(eval(text))


@pytest.mark.parametrize("run, quick", [("H200-2026-12-04-full", False), ("H200-2026-12-04-quick", True)])
def test_kernel_cases_count_the_work_the_h200_runs_counted(run, quick):
    """Every kernel row a committed H200 run measured is still timed, under the same item, dtype, shape and unit,
    with the same work (FLOPs or bytes, which the cases take from launch_model at their sizes) and the same X-ray
    bound, so that runs compare; each case's formula writes out its work."""
    rows = [json.loads(line) for line in (ROOT / "benchmarks" / "results" / run / "results.jsonl").open()]
    measured = [r["values"] for r in rows if r["ev"] == "row" and r["section"] == "kernels"]
    infos = _case_infos(plan_mod.make_plan(simulate=False, quick=quick))
    assert len(measured) > 30
    for row in measured:
        info = infos[row["item"], row["backend"], row["shape"], row["tokens"]]
        assert (info.dtype, info.unit, info.work) == (row["dtype"], row["unit"], row["work"]), row["item"]
        bound = xray_bound(info.model, info.backend, row["where"])
        assert bound["model"] == row["model"] and bound["model_ms"] == pytest.approx(row["model_ms"], rel=1e-12)
    for info in infos.values():
        assert _evaluated(info.formula) == info.work, info.item


def test_bench_wrappers_forward_their_options(monkeypatch):
    import importlib.util

    for name, backends in (("bench_cupy", "cuda,hopper"), ("bench_numba", "numba")):
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        bench = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench)
        seen: list[list[str]] = []

        def fake(argv, seen=seen):
            seen.append(argv)
            return 0

        monkeypatch.setattr(bench, "gpu_check", fake)
        assert bench.main(["--simulate", "--skip-tower", "--out", "x"]) == 0
        assert seen == [["--backends", backends, "--sections", "kernels", "--out", "x", "--simulate"]]


def test_a_unit_run_in_process_leaves_the_launchers_as_it_found_them(monkeypatch, tmp_path):
    """The binary recorder wraps the launchers' `_kernel` for a CUDA C unit (on the emulator too); run in the
    caller's process (--in-process, tests) it must put them back, or later code meets its wrapper."""
    from moonvit_kernels.cuda_backend import hopper_launchers, launchers

    before = (launchers._kernel, hopper_launchers._kernel)
    monkeypatch.setattr(worker, "unit_items", lambda spec, plan, sink, ctx: [])

    class Sink:
        def __getattr__(self, name):
            return lambda *args, **kwargs: None

    spec = {"unit": {"section": "kernels", "family": "CUDA C"}, "options": {"simulate": True, "quick": True},
            "deadline": time.time() + 60, "scratch": str(tmp_path)}  # fmt: skip
    assert worker.run_unit(spec, Sink()) == 0
    assert (launchers._kernel, hopper_launchers._kernel) == before and hasattr(launchers._kernel, "cache_clear")
