"""Pre-flight of the Hopper kernels: run them once, in a subprocess with a timeout, before they are enabled.

A Hopper kernel that has never run on this GPU may fault (the CUDA context is lost for the rest of the
process) or hang (an mbarrier phase that never completes). So before `CupyBackend` (or gpu_check) uses
gemm_bf16_sm90 / flash_attn_sm90, `preflight()` runs the probes below in a fresh process
(`python -m moonvit_kernels.cuda_backend.preflight`) and waits at most `timeout_s`: a fault or a hang
costs that subprocess only, and the verdict says why.

Probes (`probe_plan`), each compared with float64 NumPy on the same bf16 values, outputs poisoned first:

    gemm       M = 130 (two 128-row tiles, a tail), N = 264 (3 tiles of BN 128, 2 of BN 256, a tail),
               K = 520 (9 k-tiles of 64: the 4-stage ring of full/empty barriers wraps twice, plus a K tail),
               at BN 128 and 256, fp32 output (plain) and bf16 output (gelu_tanh epilogue)
    attention  2 heads over packed items of 1, 300 and 45 tokens (the 300-token item takes 5 KV tiles of
               64: the 2-stage ring wraps twice; the 1-token item is a lone query), at head dims 64, 72,
               128 and the model's

Verdict cache: on a real sm_90 device (`device_key()`), the verdict is stored under
`$MOONVIT_CACHE_DIR` (default `~/.cache/moonvit_kernels`)`/preflight/<key>.json`, the key a digest of
the Hopper kernels' sources and launchers, the probe plan, the driver version and the device name, so a
machine pays the pre-flight once per kernel version. Delete the file (or set MOONVIT_PREFLIGHT_CACHE=0)
to run it again. `MOONVIT_PREFLIGHT_TIMEOUT` overrides the default timeout (seconds).

`hopper_gate(head_dim)` is what the backend calls: (True, "") when the pre-flight passed, else
(False, why) and one `PreflightWarning` per process naming why. `selfcheck.FirstUseCheck` remains the
numeric guard at the first real call.

Test hook: MOONVIT_PREFLIGHT_FAULT=hang|crash|wrong makes the probe subprocess sleep forever, abort, or
perturb one output (the tests of the containment use it; nothing else sets it).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import math
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from moonvit_kernels.contained import exit_text

HOPPER_MODULE = "moonvit_kernels.cuda_backend.hopper_launchers"
DEFAULT_TIMEOUT_S = 180.0  # NVRTC builds of 4 GEMM + 4 attention instantiations (~1 s each here) + the probes
FAULT_ENV = "MOONVIT_PREFLIGHT_FAULT"
GEMM_SHAPE = (130, 264, 520)  # (M, N, K): see the module docstring
GEMM_BLOCK_NS = (128, 256)
ATTENTION_LENS = (1, 300, 45)
ATTENTION_HEADS = 2
HEAD_DIMS = (64, 72, 128)
TOL_BF16_OUT = 1e-2
TOL_FP32_OUT = 2e-3


class PreflightWarning(RuntimeWarning):
    """The Hopper kernels failed (or did not finish) their pre-flight; the mma.sync kernels are used."""


@dataclass
class Verdict:
    """The outcome of one pre-flight: ok, why not (empty when ok), per-probe results, seconds, cached."""

    ok: bool
    why: str
    probes: dict[str, dict[str, Any]] = field(default_factory=dict)
    seconds: float = 0.0
    cached: bool = False


def probe_head_dims(head_dim: int | None = None) -> tuple[int, ...]:
    """The head dims the attention probes cover: HEAD_DIMS plus the model's (when the kernel takes it)."""
    dims = set(HEAD_DIMS)
    if head_dim is not None and head_dim % 8 == 0 and 8 <= head_dim <= 128:
        dims.add(head_dim)
    return tuple(sorted(dims))


def probe_plan(head_dims: Sequence[int]) -> list[str]:
    """Names of the probes, in the order they run."""
    names = [f"gemm bn{bn} {out}" for bn in GEMM_BLOCK_NS for out in ("fp32 none", "bf16 gelu_tanh")]
    return names + [f"attention hd{hd}" for hd in head_dims]


# ============================================================================ the probes (in the subprocess)
def _bf16_values(rng: np.random.Generator, shape: tuple[int, ...], scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Random non-uniform values (`checks.random`): (bf16 bits, the float64 values they hold)."""
    from moonvit_kernels.checks import random
    from moonvit_kernels.weights import bf16_bits_to_float32, float32_to_bf16_bits

    bits = float32_to_bf16_bits(random(rng, shape, scale))
    return bits, bf16_bits_to_float32(bits).astype(np.float64)


def _fault(kind: str) -> None:
    if kind == "hang":
        while True:
            time.sleep(3600)
    if kind == "crash":
        os.abort()


def run_probes(hopper: Any, head_dims: Sequence[int], fault: str = "") -> dict[str, dict[str, Any]]:
    """Run every probe through launcher module `hopper` (`gemm(..., block_n=)`, `attention`, `array_module`)
    in this process: {probe: {"ok", "error", "tol", "why"}}. An exception is that probe's failure."""
    from moonvit_kernels.checks import attention_want, gemm_want, rel_err, to_host

    _fault(fault)
    xp = hopper.array_module()
    rng = np.random.default_rng(90)
    M, N, K = GEMM_SHAPE
    a_bits, a = _bf16_values(rng, (M, K), 1.0)
    b_bits, b = _bf16_values(rng, (N, K), K**-0.5)
    a_dev, b_dev = xp.asarray(a_bits), xp.asarray(b_bits)
    results: dict[str, dict[str, Any]] = {}

    def record(name: str, errors: list[float], tol: float, why: str = "") -> None:
        err = max(errors) if errors and all(math.isfinite(e) for e in errors) else math.inf
        ok = not why and math.isfinite(err) and err <= tol
        results[name] = {"ok": ok, "error": err, "tol": tol, "why": why or ("" if ok else f"rel err {err:.3g}")}

    for bn in GEMM_BLOCK_NS:
        for name, out_dtype, epilogue, want, tol in (
            (f"gemm bn{bn} fp32 none", "float32", "none", gemm_want(a, b, "none"), TOL_FP32_OUT),
            (f"gemm bn{bn} bf16 gelu_tanh", "bfloat16", "gelu_tanh", gemm_want(a, b, "gelu_tanh"), TOL_BF16_OUT),
        ):
            bf16 = out_dtype == "bfloat16"
            poison = np.full((M, N), 0x7FC0, np.uint16) if bf16 else np.full((M, N), np.nan, np.float32)
            try:
                out = hopper.gemm(a_dev, b_dev, epilogue=epilogue, out=xp.asarray(poison), block_n=bn)
                got = to_host(out)
                if fault == "wrong":
                    got[M - 1, N - 1] += 1.0
                    fault = ""
                record(name, [rel_err(got, want)], tol)
            except Exception as e:
                record(name, [], tol, f"{type(e).__name__}: {e}")
    lens = np.asarray(ATTENTION_LENS)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    for hd in head_dims:
        name = f"attention hd{hd}"
        bits, qkv = _bf16_values(rng, (int(cu[-1]), 3 * ATTENTION_HEADS * hd), 1.5)
        try:
            o, lse = hopper.attention(xp.asarray(bits), cu, ATTENTION_HEADS, hd)
            want_o, want_lse = attention_want(qkv, cu, ATTENTION_HEADS, hd)
            record(name, [rel_err(to_host(o), want_o), rel_err(to_host(lse), want_lse)], TOL_BF16_OUT)
        except Exception as e:
            record(name, [], TOL_BF16_OUT, f"{type(e).__name__}: {e}")
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m moonvit_kernels.cuda_backend.preflight [--hopper MODULE] [--head-dims HD ...]`: run the probes
    on launcher module MODULE (default: hopper_launchers, the current GPU) and print one JSON line
    {probe: {"ok", "error", "tol", "why"}}; exit status 0 when all pass, 1 otherwise."""
    p = argparse.ArgumentParser(prog="python -m moonvit_kernels.cuda_backend.preflight", description=main.__doc__)
    p.add_argument("--hopper", default=HOPPER_MODULE, help="launcher module of the Hopper kernels")
    p.add_argument("--head-dims", type=int, nargs="+", default=list(HEAD_DIMS))
    args = p.parse_args(argv)
    results = run_probes(importlib.import_module(args.hopper), args.head_dims, os.environ.get(FAULT_ENV, ""))
    print(json.dumps(results), flush=True)
    return 0 if all(r["ok"] for r in results.values()) else 1


# ============================================================================ the caller's side
def _source_root() -> str:
    return str(Path(__file__).resolve().parents[2])


def preflight(
    hopper_module: str = HOPPER_MODULE,
    head_dims: Sequence[int] = HEAD_DIMS,
    timeout_s: float | None = None,
    cache_key: str | None = None,
) -> Verdict:
    """Run the probes on `hopper_module` in a subprocess that may take at most `timeout_s` seconds (default
    DEFAULT_TIMEOUT_S, or $MOONVIT_PREFLIGHT_TIMEOUT). With `cache_key` (`device_key()` on a real sm_90
    device), a stored verdict is returned without running anything, and a new one is stored."""
    path = _cache_path(cache_key)
    if path is not None and path.exists():
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
            return Verdict(**{**stored, "cached": True})
        except (ValueError, TypeError, OSError):
            pass  # an unreadable entry is run again
    if timeout_s is None:
        timeout_s = float(os.environ.get("MOONVIT_PREFLIGHT_TIMEOUT", DEFAULT_TIMEOUT_S))
    try:
        verdict = _run_subprocess(hopper_module, head_dims, timeout_s)
    except Exception as e:  # the probe process could not even start
        return Verdict(False, f"pre-flight could not run: {type(e).__name__}: {e}")
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            tmp.write_text(json.dumps(asdict(verdict)), encoding="utf-8")
            os.replace(tmp, path)
        except OSError:
            pass  # an unwritable cache: the verdict holds for this process only
    return verdict


def _run_subprocess(hopper_module: str, head_dims: Sequence[int], timeout_s: float) -> Verdict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_source_root(), env.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "moonvit_kernels.cuda_backend.preflight", "--hopper", hopper_module, "--head-dims"]
    cmd += [str(h) for h in head_dims]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()  # the probe process we started, nothing else
        proc.communicate()
        why = f"pre-flight did not finish in {timeout_s:.0f} s (a Hopper kernel hangs, or the build is too slow)"
        return Verdict(False, why, seconds=time.monotonic() - t0)
    seconds = time.monotonic() - t0
    try:
        probes = json.loads(out.strip().splitlines()[-1])
    except (IndexError, ValueError):
        tail = " | ".join((err or out).strip().splitlines()[-3:])[:400]
        return Verdict(False, f"pre-flight process exited with {exit_text(proc.returncode)}: {tail}", seconds=seconds)
    bad = {k: v.get("why") or f"rel err {v.get('error')}" for k, v in probes.items() if not v.get("ok")}
    if bad or proc.returncode != 0:
        why = "pre-flight failed: " + "; ".join(f"{k}: {v}" for k, v in bad.items()) if bad else "no probe result"
        return Verdict(False, why, probes, seconds)
    return Verdict(True, "", probes, seconds)


def sources_digest() -> str:
    """Digest of what the verdict depends on: the Hopper kernels (includes inlined), their launchers and tensor
    maps, and this module (the probes)."""
    from . import sources as kcuda

    h = hashlib.sha256()
    for name in kcuda.HOPPER_SOURCES:
        h.update(kcuda.load_source(name).encode())
    here = Path(__file__).resolve().parent
    for name in ("hopper_launchers.py", "tensor_maps.py", "preflight.py"):
        h.update((here / name).read_bytes())
    return h.hexdigest()[:20]


def device_key(device_name: str, driver_version: str, head_dims: Sequence[int]) -> str:
    """The cache key of a verdict on device `device_name` under driver `driver_version`."""
    text = f"{sources_digest()}|{device_name}|{driver_version}|{','.join(map(str, head_dims))}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _cache_path(key: str | None) -> Path | None:
    if key is None or os.environ.get("MOONVIT_PREFLIGHT_CACHE", "1") == "0":
        return None
    root = Path(os.environ.get("MOONVIT_CACHE_DIR") or Path.home() / ".cache" / "moonvit_kernels")
    return root / "preflight" / f"{key}.json"


def current_device_key(head_dims: Sequence[int]) -> str:
    """`device_key` of CuPy's current device (name and CUDA driver version)."""
    import cupy as cp

    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return device_key(name, str(cp.cuda.runtime.driverGetVersion()), head_dims)


_VERDICTS: dict[tuple, Verdict] = {}  # per process: one pre-flight, one warning


def hopper_gate(
    head_dim: int,
    hopper_module: str = HOPPER_MODULE,
    timeout_s: float | None = None,
    on_device: bool = True,
) -> tuple[bool, str]:
    """May the Hopper kernels be used for a model of `head_dim`? (True, "") or (False, why), after the
    pre-flight (once per process; on a device, cached on disk). A failure warns once (PreflightWarning)."""
    dims = probe_head_dims(head_dim)
    memo = (hopper_module, dims)
    if memo not in _VERDICTS:
        try:
            key = current_device_key(dims) if on_device else None
        except Exception:  # no device identity: run it, store nothing
            key = None
        verdict = _VERDICTS[memo] = preflight(hopper_module, dims, timeout_s, key)
        if not verdict.ok:
            warnings.warn(
                f"Hopper kernels off for this process: {verdict.why}; the mma.sync kernels are used",
                PreflightWarning,
                stacklevel=3,
            )
    verdict = _VERDICTS[memo]
    return verdict.ok, verdict.why


if __name__ == "__main__":
    sys.exit(main())
