"""Performance checks of an exercise, by the X-ray's tracer: coalescing and bank conflicts, measured.

The kernel runs once more under numba's CUDA simulator with every array wrapped (`xray.trace`), so each
warp's addresses at each source line are recorded and costed (`xray.counters`): 32-byte sectors per
global request, wavefronts per shared-memory request, each against the ideal for the bytes asked for.
A site worse than the exercise's limit fails the check with what is slow and why ("model, no GPU":
addresses, not timings).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .core import OUT, Case

PerfCheck = Callable[[Any, Case], tuple[list[str], list[str]]]


def _traced_sites(kernel: Any, case: Case) -> tuple[list, list]:
    from moonvit_kernels.tools.xray import trace

    names = [n.strip() for n in case.arg_names.split(",")]
    out = np.full(case.out_shape, case.fill, dtype=case.out_dtype)
    args = [out if a is OUT else (a.copy() if isinstance(a, np.ndarray) else a) for a in case.args]
    records = trace.run_traced(kernel, case.grid, case.block, args, names)
    return trace.merge_sites(trace.analyse(records)), records


def _lane_stride(records: Sequence[tuple], site: Any) -> int | None:
    """The most common byte distance between neighbouring lanes in the site's requests."""
    from moonvit_kernels.tools.xray import trace

    strides: dict[int, int] = {}
    for (space, name, where, store, *_), accesses in trace.requests(records).items():
        if (space, name, where[1], store) != (site.space, site.array, site.line, site.store) or len(accesses) < 2:
            continue
        by_lane = dict((lane, addr) for lane, addr, _ in accesses)
        for lane in range(31):
            if lane in by_lane and lane + 1 in by_lane:
                d = by_lane[lane + 1] - by_lane[lane]
                strides[d] = strides.get(d, 0) + 1
    return max(strides, key=strides.get) if strides else None


def _site_text(site: Any) -> str:
    kind = "store to" if site.store else "load of"
    code = f" `{site.code}`" if site.code else ""
    return f"the {kind} {site.array} (line {site.line}{code})"


def traffic_check(
    global_arrays: Sequence[str] = (),
    shared_arrays: Sequence[str] = (),
    max_factor: float = 2.0,
    max_shared_factor: float | None = None,
) -> PerfCheck:
    """A perf check: every global access of `global_arrays` within `max_factor` × the ideal sectors, and
    every shared access of `shared_arrays` within `max_shared_factor` (default `max_factor`) × the ideal
    wavefronts ("*": every array). A shared limit of 1.0 is what notebook 07 teaches: a padded row of 33
    words is conflict-free, one of 34 words is a 2-way conflict (2 wavefronts) and counts as slow."""
    shared_limit = max_factor if max_shared_factor is None else max_shared_factor

    def check(kernel: Any, case: Case) -> tuple[list[str], list[str]]:
        from numba import config

        if not config.ENABLE_CUDASIM:
            return [], ["(coalescing and bank conflicts are traced only under the CUDA simulator: not checked here)"]
        sites, records = _traced_sites(kernel, case)
        problems, seen = [], []
        for s in sites:
            wanted = global_arrays if s.space == "global" else shared_arrays
            if not s.requests or not ("*" in wanted or s.array in wanted):
                continue
            unit = "sectors" if s.space == "global" else "wavefronts"
            seen.append(f"{s.kind} {s.array} {s.per_request:.1f} {unit}/request ({s.factor:.2g}× ideal)")
            if s.factor <= (max_factor if s.space == "global" else shared_limit) + 1e-9:
                continue
            stride = _lane_stride(records, s)
            ideal = s.ideal / s.requests
            if s.space == "global":
                why = (
                    f"neighbouring lanes (threadIdx.x) touch addresses {stride} bytes apart instead of one element "
                    "apart, so a warp's request spreads over many more 32-byte sectors than its bytes fill and most "
                    "of every sector moved is wasted"
                    + (
                        " (a thread that walks its own contiguous chunk of the row puts its neighbours a chunk away)"
                        if abs(stride) < 32
                        else ""
                    )
                    + ". Make threadIdx.x run along the array's last (contiguous) index: lane l takes element "
                    "l, l + 32, … (a strided loop)"
                    if stride is not None and abs(stride) > 8
                    else "the warp's addresses are scattered over many 32-byte sectors"
                )
                problems.append(
                    f"{_site_text(s)} is uncoalesced: it costs {s.per_request:.1f} sectors per warp request where "
                    f"{ideal:.1f} would hold its bytes ({s.factor:.1f}× the traffic): {why}."
                )
            else:
                if stride is not None and stride % 128 == 0 and stride:
                    why = (
                        f"neighbouring lanes touch words {stride} bytes apart: a stride that is a multiple of 32 words "
                        "(128 bytes) puts them all in one bank, served one after another. Pad the row by one element"
                    )
                elif stride is not None and stride % 8 == 0 and stride:
                    words = abs(stride) // 4
                    why = (
                        f"neighbouring lanes touch words {words} apart (a row of {words} words): bank = "
                        f"{words}·lane mod 32 repeats every {32 // math.gcd(words, 32)} lanes, so "
                        f"{math.gcd(words, 32)} lanes share each bank. Only an odd row length is conflict-free: pad "
                        "a row of 32 to 33 words, not 34"
                    )
                else:
                    why = "several lanes want different words of the same bank and are served one after another"
                problems.append(
                    f"{_site_text(s)} takes {s.per_request:.1f} wavefronts per warp request where {ideal:.1f} would do "
                    f"({s.factor:.1f}-way bank conflicts): {why}."
                )
        notes = [f"traced (CUDA simulator, model, no GPU): {'; '.join(seen)}"] if seen else []
        return problems, notes

    return check
