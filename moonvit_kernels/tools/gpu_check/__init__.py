"""gpu_check: one offline command that proves every kernel on a CUDA GPU and writes a report, whatever breaks.

On a GPU machine, from the source tree, with nothing installed (no network, no pip):

    timeout -k 20 400 env PYTHONPATH=. python3 -m moonvit_kernels.gpu_check --quick --out $OUT  # watchdog 345 s
    timeout -k 20 580 env PYTHONPATH=. python3 -m moonvit_kernels.gpu_check --out $OUT          # watchdog 525 s

Without a GPU (what the test suite runs): `--simulate` runs the same pipeline on the CPU (numba's CUDA
simulator, the CUDA C and Hopper emulators, tiny sizes; every time is labelled simulator / emulator).
`--sections a,b,c` (tests, kernels, tower), `--backends cuda,hopper,numba`, `--only NAME,...` (items
whose name contains one of them: a targeted rerun), `--budget-s S` (the watchdog), `--item-timeout-s S`,
`--inject-fault KIND:MATCH` (hang, crash, wrong, error: rehearses the containment), `--in-process`
(no workers; debugging only).

Containment (`supervisor.py`, `worker.py`): the run is cut into units (`plan.units_for`): the machine
and the measured peaks, the pytest tier, each kernel family (CUDA C, then the Hopper pre-flight and the
Hopper kernels, then numba), each tower backend. Each unit runs in a fresh worker process that appends
its results line by line to results.jsonl, announcing each item before it starts; the parent applies
them to the report as they come. An item past its limit is killed (TIMEOUT), a worker that dies is a
CRASH (its signal named, its stack in errors.log), a sticky CUDA error an ERROR; in each case a fresh
worker continues with the next item. A watchdog bounds the run; SIGTERM writes the report and exits.

Sections:
  (a) tests    `pytest -m gpu`, the CuPy tests first, then numba's -> pytest.log; stopped at its budget:
               "partial", never "pass"
  (b) kernels  the attainable peaks measured in the same run (cuBLAS bf16/fp32 8192³, the fastest SDPA at
               the K3 shape, a 1 GiB device copy), then every kernel version at the real K3 sizes: checked
               first against a float64 NumPy computation (a failed check is not timed), then timed
               (`timing.measure_kernel`: back-to-back calls between one pair of events behind queued L2
               flushes, so launch overhead stays out; L2-flushed single calls; host overhead per call),
               beside its baseline measured in the same run, % of the measured peak, % of the datasheet
               peak, and the X-ray's roofline bound with measured / bound
  (c) tower    the whole tower + projector on a 448² image, an 896² image and 8 packed 448² images:
               NumPy reference vs each backend (CUDA C fp32, CUDA C bf16 with the Hopper kernels on as
               the backend chooses and with hopper=False, numba fp32) stage by stage, time per stage, the
               torch eager baseline, full-depth cross-checks, each backend's `describe()`
  (d) verdicts one line per item; the report's first section lists the problems
Output (at most 8 files, no subfolder): report.md, results.csv, results.jsonl, errors.log, diagnostics.md
(toolchain, registers and spills of every loaded binary, the Hopper ptxas log and pre-flight),
pytest.log, kernels_vs_baseline.png, tower_stages.png.
Exit status: 0 all checks pass; 1 a check failed, or an item errored, timed out or crashed (timings never
fail); 2 no GPU (without --simulate) or bad options; 124 / 130 stopped by SIGTERM / Ctrl-C.
Optional packages (numba, CuPy, torch, matplotlib, pytest) are imported lazily in the workers: a missing
one is reported ("not installed", or "installed but incompatible" with the error) and its checks skipped.
"""

from moonvit_kernels.tools.gpu_check.run import main

__all__ = ["main"]
