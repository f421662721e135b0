"""gpu_check: one offline command that proves every kernel on a CUDA GPU and writes a report.

On a GPU machine, from the source tree, with nothing installed (no network, no pip):

    PYTHONPATH=. python3 -m moonvit_kernels.gpu_check --out $OUT            # under 8 min on one H100/H200
    PYTHONPATH=. python3 -m moonvit_kernels.gpu_check --out $OUT --quick    # under 3 min

Without a GPU (what the test suite runs): `--simulate` runs the same pipeline on the CPU (numba's
CUDA simulator, the CUDA C emulator, tiny sizes; every time is labelled simulator / emulator).
`--sections a,b,c` (tests, kernels, tower) runs a subset; `--budget-s S` caps the whole run.

Sections, each with its own time budget (the rest of a section is skipped, with a note, when it
is spent):
  (a) tests    `pytest -m gpu` on the numba and CuPy GPU tiers in a subprocess -> pytest.log
  (b) kernels  every kernel version at the real K3 sizes vs its baseline measured in the same run
               (cuBLAS, torch SDPA, a device-to-device copy): median and p10..p90 of CUDA-event
               timings after warm-up, TFLOP/s or GB/s with the formula, % of baseline; each timed
               output re-checked against a float64 NumPy computation
  (c) tower    the whole tower + projector on a 448² image, an 896² image and 8 packed 448² images:
               NumPy vs numba vs CUDA C fp32 vs CUDA C bf16, time per stage, each checked
               against the NumPy reference
  (d) verdicts one line per item, pass/fail and the number
Output (at most 8 files): report.md and results.csv (rewritten after every measurement, so a run
cut short leaves a report), pytest.log, kernels_vs_baseline.png, tower_stages.png.
Exit status: 0 all checks pass; 1 a correctness check failed (timings never fail); 2 no GPU
(without --simulate) or bad options.
Optional packages (numba, CuPy, torch, matplotlib, pytest) are imported lazily: a missing one is
reported and its checks are skipped.
"""

from .run import main

__all__ = ["main"]
