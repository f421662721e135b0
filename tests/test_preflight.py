"""The Hopper kernels' pre-flight: probes that wrap the pipeline rings, a subprocess with a timeout, a verdict
cached per device, and the backend turning Hopper off (one warning) when the pre-flight fails or hangs."""

from __future__ import annotations

import os
import re
import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from moonvit_kernels.config import VisionConfig
from moonvit_kernels.cuda_backend import preflight
from moonvit_kernels.cuda_backend import sources as kcuda
from moonvit_kernels.tools.emulation import compiler
from moonvit_kernels.weights import random_weights

TESTS = Path(__file__).resolve().parent
STAND_IN = "hopper_stand_ins"  # tests/hopper_stand_ins.py, imported by the pre-flight subprocess
EMULATED = "moonvit_kernels.tools.emulation.hopper"
needs_cxx = pytest.mark.skipif(compiler() is None, reason="no C++ compiler (g++ >= 11) for the Hopper emulation")
PARITY_BUG = ("mbar_wait(&full[s], (kt / STAGES) & 1u);", "mbar_wait(&full[s], 0u);")  # consumers skip the wait


@pytest.fixture
def stand_in(monkeypatch, tmp_path):
    """The NumPy stand-in on the subprocess's path, a private verdict cache, no verdict remembered."""
    monkeypatch.setenv("PYTHONPATH", f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("MOONVIT_STAND_IN", "numpy")
    monkeypatch.setenv("MOONVIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(preflight.FAULT_ENV, raising=False)
    monkeypatch.setattr(preflight, "_VERDICTS", {})


def _config(source: str) -> dict[str, int]:
    """The `static constexpr int` values of a Hopper kernel's config struct (the first one in the file)."""
    text = (kcuda.KERNEL_DIR / source).read_text()
    return {k: int(v) for k, v in re.findall(r"\b([A-Z]+) = (\d+)\b", text.split("struct", 2)[1])}


def test_probes_wrap_every_pipeline_ring_twice():
    """The GEMM probe spans > 2 row tiles' worth of M, > 256 columns (both tile widths tile N at least twice)
    and more than 2 x STAGES k-tiles; the attention probe has an item of > 2 x STAGES KV tiles and a 1-token item."""
    g = _config("gemm_bf16_sm90.cu")
    M, N, K = preflight.GEMM_SHAPE
    assert M > g["BM"] and N > 256 and K % 8 == 0
    assert -(-K // g["BK"]) > 2 * g["STAGES"], "the 4-stage ring of full/empty barriers must wrap at least twice"
    a = _config("flash_attn_sm90.cu")
    assert max(preflight.ATTENTION_LENS) / a["BKV"] > 2 * a["STAGES"] and 1 in preflight.ATTENTION_LENS
    probes = set(preflight.probe_plan((64, 128)))
    assert probes >= {"gemm bn128 fp32 none", "gemm bn256 bf16 gelu_tanh", "attention hd64", "attention hd128"}
    assert preflight.probe_head_dims(24) == (24, 64, 72, 128) and preflight.probe_head_dims(136) == (64, 72, 128)


def test_verdicts_pass_fail_crash_and_hang(stand_in, monkeypatch):
    """Through the subprocess: exact kernels pass; a perturbed output fails naming the probe; an abort and a
    hang are verdicts too, the hang within its timeout."""
    ok = preflight.preflight(STAND_IN, (64,), timeout_s=120)
    assert ok.ok and not ok.why and set(ok.probes) == set(preflight.probe_plan((64,))), ok.why
    monkeypatch.setenv(preflight.FAULT_ENV, "wrong")
    wrong = preflight.preflight(STAND_IN, (64,), timeout_s=120)
    assert not wrong.ok and "gemm bn128 fp32 none: rel err" in wrong.why
    monkeypatch.setenv(preflight.FAULT_ENV, "crash")
    crashed = preflight.preflight(STAND_IN, (64,), timeout_s=120)
    assert not crashed.ok and "exited with signal SIGABRT" in crashed.why
    monkeypatch.setenv(preflight.FAULT_ENV, "hang")
    t0 = time.monotonic()
    hung = preflight.preflight(STAND_IN, (64,), timeout_s=3)
    assert time.monotonic() - t0 < 10
    assert not hung.ok and "did not finish in 3 s" in hung.why


def test_verdict_is_cached_per_device_and_source(stand_in, monkeypatch):
    key = preflight.device_key("NVIDIA H200", "13000", (64,))
    assert key != preflight.device_key("NVIDIA H100 80GB HBM3", "13000", (64,))
    assert key != preflight.device_key("NVIDIA H200", "12080", (64,))
    first = preflight.preflight(STAND_IN, (64,), timeout_s=120, cache_key=key)
    assert first.ok and not first.cached
    monkeypatch.setenv(preflight.FAULT_ENV, "hang")  # would time out if it ran again
    again = preflight.preflight(STAND_IN, (64,), timeout_s=2, cache_key=key)
    assert again.ok and again.cached
    monkeypatch.setattr(preflight, "sources_digest", lambda: "another kernel version")
    assert preflight.device_key("NVIDIA H200", "13000", (64,)) != key


class _Sm90Emulation:
    """The portable emulator presenting itself as a compute capability 9.0 device (nothing is launched here)."""

    def __getattr__(self, name):
        from moonvit_kernels.cuda_backend import launchers
        from moonvit_kernels.tools import emulation

        return getattr(emulation.OnEmulator(launchers), name)

    @staticmethod
    def compute_capability() -> str:
        return "90"


def test_user_path_hang_turns_hopper_off_once_with_a_warning(stand_in, monkeypatch):
    """CupyBackend on an "sm_90 device": the pre-flight runs in a subprocess; planted hang -> after the timeout
    the backend runs without the Hopper kernels, with one PreflightWarning naming why, and says so."""
    from moonvit_kernels.cuda_backend.backend import CupyBackend

    monkeypatch.setenv(preflight.FAULT_ENV, "hang")
    config = VisionConfig.tiny()
    weights = random_weights(config, 5)

    def gate(head_dim: int):
        return preflight.hopper_gate(head_dim, STAND_IN, timeout_s=3, on_device=False)

    t0 = time.monotonic()
    with pytest.warns(preflight.PreflightWarning, match="did not finish in 3 s") as caught:
        backend = CupyBackend(config, weights, "bfloat16", kernels=_Sm90Emulation(), preflight=gate)
    assert time.monotonic() - t0 < 12
    assert len(caught) == 1 and backend.hopper is False
    assert backend.describe()["hopper"].startswith("off (pre-flight did not finish in 3 s")
    assert backend.describe()["gemm"] == "gemm_bf16_tc"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the verdict is remembered: no second pre-flight, no second warning
        again = CupyBackend(config, weights, "bfloat16", kernels=_Sm90Emulation(), preflight=gate)
    assert again.hopper is False


def test_backend_without_a_preflight_is_unchanged_on_stand_in_kernels(monkeypatch):
    """Stand-in `kernels` (the emulators) run no pre-flight unless one is passed; a passing one keeps Hopper on."""
    from moonvit_kernels.cuda_backend.backend import CupyBackend

    config = VisionConfig.tiny()
    weights = random_weights(config, 5)
    assert CupyBackend(config, weights, "bfloat16", kernels=_Sm90Emulation()).hopper is True
    calls = []

    def passing(head_dim: int):
        calls.append(head_dim)
        return True, ""

    assert CupyBackend(config, weights, "bfloat16", kernels=_Sm90Emulation(), preflight=passing).hopper is True
    assert calls == [config.head_dim]


@pytest.mark.slow  # builds the Hopper emulator from the planted copy: ~15 s of CPU
@needs_cxx
def test_planted_barrier_parity_bug_fails_the_preflight(monkeypatch, tmp_path):
    """Consumers that wait on the full barriers with parity 0 in every round read a stage before its refill
    lands: the old first-use probe (K = 72, 2 k-tiles) never wraps the 4-stage ring and passed it; the pre-flight
    (K = 520, 9 k-tiles) fails, the emulator naming the race."""
    planted = tmp_path / "kernels"
    planted.mkdir()
    for path in kcuda.KERNEL_DIR.iterdir():
        if path.suffix in (".cu", ".cuh"):
            shutil.copy(path, planted / path.name)
    text = (planted / "gemm_bf16_sm90.cu").read_text()
    assert text.count(PARITY_BUG[0]) == 1
    (planted / "gemm_bf16_sm90.cu").write_text(text.replace(*PARITY_BUG))
    monkeypatch.setenv("PYTHONPATH", f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("MOONVIT_STAND_IN", "planted")
    monkeypatch.setenv("MOONVIT_PLANTED_KERNEL_DIR", str(planted))
    verdict = preflight.preflight(STAND_IN, (64,), timeout_s=600)
    assert not verdict.ok
    assert "SIGABRT" in verdict.why and "wgmma" in verdict.why, verdict.why  # the contained launch names the signal


@needs_cxx
def test_emulated_hopper_kernels_pass_their_probes_in_process():
    """The unplanted kernels on the Hopper emulator pass every probe (the same run as a GPU's pre-flight)."""
    from moonvit_kernels.tools.emulation import hopper

    results = preflight.run_probes(hopper, (24, 128))
    assert all(r["ok"] for r in results.values()), results
    assert all(np.isfinite(r["error"]) and r["error"] <= r["tol"] for r in results.values())
