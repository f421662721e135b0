"""gpu_check: the whole pipeline under --simulate (CPU), its report layout, verdicts and exit statuses.

The full --simulate run (numba simulator + CUDA C emulator, tiny sizes) happens once per module;
the planted-failure and budget runs use the kernels section alone. What a GPU run adds (real
sizes, CUDA events, cuBLAS/SDPA baselines) cannot run here; the code paths it shares with the
simulated run are the ones checked.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from moonvit_kernels.config import VisionConfig
from moonvit_kernels.device import gpu_available, simulator_enabled
from moonvit_kernels.gpu_check import kernels as kernels_mod
from moonvit_kernels.gpu_check import run as run_mod
from moonvit_kernels.gpu_check import sections as sections_mod
from moonvit_kernels.gpu_check.plan import make_plan, parse_sections
from moonvit_kernels.gpu_check.report import CSV_FIELDS, Report
from moonvit_kernels.gpu_check.suite import count_outcomes
from moonvit_kernels.gpu_check.timing import measure, percentile
from moonvit_kernels.gpu_check.tower import stage_times, tower_flops, truncated_weights

ROOT = Path(__file__).resolve().parents[1]
needs_sim = pytest.mark.skipif(not simulator_enabled(), reason="--simulate needs numba's simulator in this process")
needs_emulator = pytest.mark.skipif(
    __import__("shutil").which(os.environ.get("CXX", "g++")) is None, reason="no C++ compiler for the CUDA C emulator"
)


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == CSV_FIELDS
        return list(reader)


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    """One full `--simulate` run: (exit status, output folder)."""
    if not simulator_enabled():
        pytest.skip("--simulate needs numba's simulator in this process")
    out = tmp_path_factory.mktemp("gpu_check")
    status = run_mod.main(["--simulate", "--out", str(out)])
    return status, out


# ============================================================================ the full simulated run
@pytest.mark.slow  # one full simulated run shared by three tests: ~45 s of CPU, more on a busy machine
@needs_emulator
def test_simulate_passes_and_writes_the_report_layout(simulated):
    status, out = simulated
    files = sorted(p.name for p in out.iterdir())
    assert status == 0, (out / "report.md").read_text()
    assert len(files) <= 8, files
    assert {"report.md", "results.csv", "pytest.log"} <= set(files)
    try:
        import matplotlib  # noqa: F401

        assert {"kernels_vs_baseline.png", "tower_stages.png"} <= set(files)
    except ImportError:
        assert "matplotlib is not installed" in (out / "report.md").read_text()
    text = (out / "report.md").read_text()
    for heading in ("## Machine", "## (a) GPU test tier", "## (b) Kernels vs baselines", "## (c) Whole tower",
                    "time per stage", "outputs vs the NumPy reference", "## (d) Verdicts"):  # fmt: skip
        assert heading in text, heading
    assert "mode: SIMULATE" in text and "finished" in text
    assert "Result:" in text and "0 fail, 0 error" in text and "exit status 0" in text
    assert "(no measurement)" not in text


@pytest.mark.slow
@needs_emulator
def test_simulate_csv_has_every_kernel_version_with_units_formulas_and_checks(simulated):
    _, out = simulated
    rows = read_csv(out / "results.csv")
    kernels = [r for r in rows if r["section"] == "kernels"]
    items = {(r["backend"], r["item"]) for r in kernels}
    for v in (1, 2, 3):
        assert ("numba", f"gemm v{v} wo+residual") in items
    for v in (1, 2):
        assert ("numba", f"attention v{v}") in items
    for name in ("rmsnorm", "rope (q, k in place)", "pos_emb (x in place)", "merge"):
        assert ("numba", name) in items
    for name in ("gemm_bf16 qkv", "gemm_fp32 qkv", "attention_bfloat16", "attention_float32", "rmsnorm fp32->bf16"):
        assert ("CUDA C", name) in items
    for name in ("gemm_bf16_sm90 bn128 qkv", "gemm_bf16_sm90 bn256 wo+residual", "flash_attn_sm90"):
        assert ("CUDA C", name) in items  # the Hopper kernels, on their emulator
    for r in kernels:
        assert r["unit"] in ("TFLOP/s", "GB/s") and r["formula"] and float(r["rate"]) > 0
        assert r["where"] in ("CUDA simulator (CPU)", "CUDA C emulator (CPU)"), r["where"]
        assert "host clock" in r["clock"]
        assert r["baseline"].endswith("(CPU)") and float(r["pct_of_baseline"]) > 0
        assert r["verdict"] == "pass" and float(r["check_err"]) <= float(r["check_tol"])
        assert r["peak"] == r["pct_of_peak"] == ""  # no GPU peak for a CPU number
    tower = [r for r in rows if r["section"] == "tower"]
    ours = {"numpy float64 (reference)", "numba fp32", "CUDA C fp32", "CUDA C bf16"}
    assert ours <= {r["backend"] for r in tower} <= ours | {"torch eager fp32 (CPU)"}  # torch: a baseline, if installed
    if any(r["backend"].startswith("torch") for r in tower):
        assert all(float(r["pct_of_baseline"]) > 0 for r in tower if r["backend"] in ("CUDA C fp32", "CUDA C bf16"))
    assert {r["item"] for r in tower} == {name for name, _ in make_plan(True, False).tower_cases}
    stages = [r for r in rows if r["section"] == "stages"]
    assert {"patch embed + pos emb + layer 0", "final norm + merge + projector"} <= {r["stage"] for r in stages}
    checks = [r for r in rows if r["section"] == "tower_check"]
    assert checks and all(r["verdict"] == "pass" for r in checks)
    assert any(r["backend"] == "CUDA C bf16 vs CUDA C fp32" for r in checks)


@pytest.mark.slow
@needs_emulator
def test_simulate_verdicts_one_line_per_item(simulated):
    _, out = simulated
    text = (out / "report.md").read_text()
    verdicts = text.split("## (d) Verdicts", 1)[1]
    lines = [line for line in verdicts.splitlines() if line.startswith("- **")]
    rows = read_csv(out / "results.csv")
    measured = [r for r in rows if r["section"] in ("kernels", "tower_check")]
    assert len(lines) >= len(measured)
    assert all(line.split("**")[1] in ("pass", "skip") for line in lines), lines
    assert any("pytest -m gpu" in line for line in lines)
    log = (out / "pytest.log").read_text()
    assert "-m gpu" in log and "skipped" in log


# ============================================================================ failures and exits
@needs_sim
@needs_emulator
def test_planted_wrong_kernel_fails_the_run(tmp_path, monkeypatch):
    """A merge kernel that leaves one output element unwritten (NaN) must give FAIL and exit status 1."""
    from moonvit_kernels.cuda_backend import emulation

    real = emulation.tpool_merge

    def broken(*args, **kwargs):
        out = real(*args, **kwargs)
        out.reshape(-1)[-1] = 0x7FC0 if out.dtype == np.uint16 else np.nan
        return out

    monkeypatch.setattr(emulation, "tpool_merge", broken)
    monkeypatch.setattr(sections_mod, "numba_cases", lambda *a, **k: iter(()))  # the CUDA C kernels only
    status = run_mod.main(["--simulate", "--sections", "kernels", "--out", str(tmp_path)])
    assert status == 1
    text = (tmp_path / "report.md").read_text()
    assert "- **FAIL** [kernels] CUDA C merge fp32->bf16" in text
    assert "exit status 1" in text
    bad = [r for r in read_csv(tmp_path / "results.csv") if r["verdict"] != "pass"]
    assert [r["item"] for r in bad] == ["merge fp32->bf16"] and bad[0]["check_err"] == "nan"


@needs_sim
def test_kernel_that_raises_is_an_error_not_a_crash(tmp_path, monkeypatch):
    def cases(*args, **kwargs):
        def build():
            raise RuntimeError("planted launch failure")

        yield "numba planted", build

    monkeypatch.setattr(sections_mod, "numba_cases", cases)
    monkeypatch.setattr(sections_mod, "cuda_kernels_module", lambda plan: (_ for _ in ()).throw(ImportError("none")))
    status = run_mod.main(["--simulate", "--sections", "b", "--out", str(tmp_path)])
    assert status == 1
    text = (tmp_path / "report.md").read_text()
    assert "**ERROR** [kernels] numba planted: RuntimeError: planted launch failure" in text
    assert "**skip** [kernels] CUDA C kernels: ImportError: none" in text


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
    monkeypatch.setattr(sections_mod, "cuda_kernels_module", lambda plan: (_ for _ in ()).throw(ImportError("none")))
    monkeypatch.setattr(sections_mod.Budget, "spent", lambda self: True)
    status = run_mod.main(["--simulate", "--sections", "kernels", "--budget-s", "5", "--out", str(tmp_path)])
    assert status == 0 and calls == []
    text = (tmp_path / "report.md").read_text()
    assert text.count("section budget") == 3


@pytest.mark.skipif(gpu_available(), reason="this machine has a GPU")
def test_without_gpu_and_without_simulate_one_clear_line_and_status_2(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run(
        [sys.executable, "-m", "moonvit_kernels.gpu_check", "--out", str(tmp_path / "o")],
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
    assert "--budget-s must be positive" in capsys.readouterr().err


# ============================================================================ pieces
def test_parse_sections_accepts_letters_and_names_in_report_order():
    assert parse_sections("c,a") == ("tests", "tower")
    assert parse_sections("kernels") == ("kernels",)
    with pytest.raises(ValueError, match="unknown section"):
        parse_sections("d")


def test_budget_scales_every_section():
    full = make_plan(False, False)
    small = make_plan(False, False, budget_s=full.total_budget / 2)
    for name, seconds in full.budgets.items():
        assert small.budgets[name] == pytest.approx(seconds / 2)
    assert make_plan(False, True).total_budget < 180 and full.total_budget < 480


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


def test_measure_caps_slow_calls_and_reports_spread():
    seq = iter([2.0, 1.0, 3.0, 9.0, 9.0])
    t = measure(lambda: None, lambda fn: next(seq), "fake", repeats=20, warmup=0, max_seconds=1.0)
    assert t.runs == 3 and t.median == 2.0 and t.p10 == pytest.approx(1.2) and t.p90 == pytest.approx(2.8)
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5


def test_report_is_rewritten_after_every_row(tmp_path):
    rep = Report(tmp_path, "test", "cmd")
    rep.add_row("kernels", item="k1", unit="GB/s", rate=1.5, verdict="pass")
    assert "IN PROGRESS" in (tmp_path / "report.md").read_text()
    assert [r["item"] for r in read_csv(tmp_path / "results.csv")] == ["k1"]
    rep.verdict("kernels", "k1", "FAIL", "rel err nan")
    assert rep.exit_status() == 1 and "**FAIL** [kernels] k1" in (tmp_path / "report.md").read_text()
    with pytest.raises(KeyError, match="unknown results.csv column"):
        rep.add_row("kernels", speed=3)


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
    from moonvit_kernels.gpu_check.baselines import Baselines
    from moonvit_kernels.gpu_check.timing import host_timer

    b = Baselines(simulate=False, repeats=2, warmup=0, seconds_per_item=1.0)
    b.torch, b.device = torch, "cpu"
    b.torch_timer = host_timer
    label, timing = b.get("attention", 16, 2, 8, "float32")
    assert "fastest of" in label and "math" in label.split("fastest of")[1], label
    assert timing is not None and timing.runs == 2 and timing.median > 0
    assert b.get("attention", 16, 2, 8, "float32") == (label, timing)  # cached per shape


@needs_sim
@needs_emulator
def test_bench_cupy_wrapper_runs_the_cuda_kernels_section(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_cupy", ROOT / "benchmarks" / "bench_cupy.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--simulate", "--skip-tower", "--out", str(tmp_path)]) == 0
    rows = read_csv(tmp_path / "results.csv")
    assert rows and {r["backend"] for r in rows} == {"CUDA C"} and {r["section"] for r in rows} == {"kernels"}


def test_too_old_packages_are_named():
    from moonvit_kernels.gpu_check.machine import too_old, version_tuple

    assert version_tuple("2.11.0+cu130") == (2, 11, 0)
    assert too_old("cupy", "12.3.0") and not too_old("cupy", "14.2.0")
    assert too_old("numba_cuda", "0.19.1") and not too_old("numba_cuda", "0.30.4")
    assert not too_old("torch", "1.0")  # no minimum: torch is optional


def test_datasheet_peaks_are_labelled_and_unknown_gpus_get_none():
    from moonvit_kernels.gpu_check.peaks import peak_for

    assert peak_for("NVIDIA H200", "TFLOP/s", "bfloat16->float32") == (989.0, "989 TFLOP/s bf16 dense (H200 datasheet)")
    assert peak_for("NVIDIA H100 80GB HBM3", "GB/s", "float32")[0] == 3350.0
    assert peak_for("NVIDIA H200", "TFLOP/s", "float32")[1].endswith("fp32 (H200 datasheet)")
    assert peak_for("NVIDIA GeForce RTX 4090", "GB/s", "float32") is None
    assert peak_for(None, "GB/s", "float32") is None


# ============================================================================ the Hopper rows
def test_hopper_rows_only_on_sm90_and_only_where_the_tensor_maps_fit():
    assert sections_mod.hopper_skip_reason("90") is None
    assert "compute capability 9.0" in sections_mod.hopper_skip_reason("80")
    assert "sm_100" in sections_mod.hopper_skip_reason("100")

    class Fake:  # nothing is built or launched: the case list only
        array_module = staticmethod(lambda: np)
        gemm = attention = None

    names = [
        n for n, _ in kernels_mod.hopper_cases(Fake, VisionConfig.k3(), np.array([[1, 4, 4]]), ("patch_embed", "qkv"))
    ]
    assert names == ["hopper gemm bn128 qkv", "hopper gemm bn256 qkv", "hopper attention"]  # patch K = 588: no TMA


def test_hopper_preflight_failure_names_the_kernel(monkeypatch):
    result = {"gemm_bf16_sm90 bn128": {"ok": False, "error": 0.4, "why": "gemm_bf16_sm90: first-use self-check failed"}}
    fake = subprocess.CompletedProcess([], 1, stdout=__import__("json").dumps(result) + "\n", stderr="")
    monkeypatch.setattr(sections_mod.subprocess, "run", lambda *a, **k: fake)
    with pytest.raises(RuntimeError, match="gemm_bf16_sm90: first-use self-check failed"):
        sections_mod.hopper_preflight(128)
    crashed = subprocess.CompletedProcess([], -6, stdout="", stderr="an illegal memory access was encountered")
    monkeypatch.setattr(sections_mod.subprocess, "run", lambda *a, **k: crashed)
    with pytest.raises(RuntimeError, match="exited -6: an illegal memory access"):
        sections_mod.hopper_preflight(128)

    def hangs(*args, timeout, **kwargs):
        raise subprocess.TimeoutExpired(args[0], timeout)

    monkeypatch.setattr(sections_mod.subprocess, "run", hangs)
    with pytest.raises(RuntimeError, match="still running after 12 s"):
        sections_mod.hopper_preflight(128, timeout_s=12)


@needs_sim
@needs_emulator
def test_wrong_hopper_kernel_fails_its_rows(tmp_path, monkeypatch):
    """The Hopper GEMM with the emulator's planted mismatch: its rows FAIL, the attention row passes."""
    from moonvit_kernels.cuda_backend.emulation import hopper

    class Faulty:
        array_module = staticmethod(hopper.array_module)
        attention = staticmethod(hopper.attention)

        @staticmethod
        def gemm(*args, **kwargs):
            return hopper.gemm(*args, fault=1, **kwargs)

    monkeypatch.setattr(sections_mod, "numba_cases", lambda *a, **k: iter(()))
    monkeypatch.setattr(sections_mod, "cuda_cases", lambda *a, **k: iter(()))
    monkeypatch.setattr(sections_mod, "hopper_kernels_module", lambda plan, timeout_s: Faulty)
    status = run_mod.main(["--simulate", "--sections", "kernels", "--out", str(tmp_path)])
    assert status == 1
    rows = read_csv(tmp_path / "results.csv")
    assert {r["item"]: r["verdict"] for r in rows} == {
        "gemm_bf16_sm90 bn128 qkv": "FAIL",
        "gemm_bf16_sm90 bn256 qkv": "FAIL",
        "gemm_bf16_sm90 bn128 wo+residual": "FAIL",
        "gemm_bf16_sm90 bn256 wo+residual": "FAIL",
        "flash_attn_sm90": "pass",
    }
