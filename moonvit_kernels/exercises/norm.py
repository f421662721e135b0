"""Notebook 02's exercises: RMSNorm, one block of 32 threads per row."""

from __future__ import annotations

import math

import numpy as np

from .. import reference
from .core import FP32_EPS, OUT, Case, Exercise, awkward
from .perf import traffic_check

NB = "02_rmsnorm"
THREADS, EPS = 32, 1e-5


def rmsnorm_case(rng: np.random.Generator, rows: int, cols: int, label: str) -> Case:
    x = awkward(rng, (rows, cols), scale=2.0)
    x[rows // 2] *= 1e-3  # one nearly-zero row: eps matters there
    weight = (1.0 + 0.3 * rng.standard_normal(cols)).astype(np.float32)
    want, rstd = reference.rmsnorm(x.astype(np.float64), weight.astype(np.float64), EPS, return_rstd=True)
    bound = 8 * FP32_EPS * math.sqrt(cols) * np.abs(x) * rstd[:, None] * np.abs(weight) + 1e-30
    return Case(
        args=[x, weight, OUT, np.int32(rows), np.int32(cols), np.float32(EPS)],
        out_shape=(rows, cols),
        grid=rows,
        block=THREADS,
        expected=want,
        bound=bound,
        arg_names="x, weight, out, rows, cols, eps",
        axes=("rows", "columns"),
        label=f"{rows} rows × {cols} columns, one block of {THREADS} threads per row: {label}",
    )


def rmsnorm_cases(rng: np.random.Generator) -> list[Case]:
    return [
        rmsnorm_case(rng, 7, 75, "75 is not a multiple of 32"),  # the coalescing trace runs on this one
        rmsnorm_case(rng, 4, 20, "fewer columns than threads"),
    ]


EXERCISES = (
    Exercise(
        "rmsnorm_reduction",
        NB,
        "the shared-memory tree that adds the block's 32 partial sums",
        rmsnorm_cases,
        (
            "32 partial sums sit in partial[0..31]. Halve the number of sums at each step, and make the whole "
            "block wait between steps: a thread must not read a sum another thread is still writing.",
            "stride = THREADS/2, then 8, 4, 2, 1: threads tid < stride add partial[tid + stride] into partial[tid]; "
            "every thread reaches a cuda.syncthreads() after each step (keep it outside the if).",
        ),
    ),
    Exercise(
        "rmsnorm_sum_and_scale",
        NB,
        "the strided loops: each thread sums x² over its columns, then scales them",
        rmsnorm_cases,
        (
            "A block of 32 threads covers a whole row, whatever its length: thread tid takes every 32nd column, "
            "starting at its own.",
            "for j in range(tid, cols, THREADS): acc += x[row, j]²; after the reduction the same loop writes "
            "out[row, j] = x[row, j]·r·weight[j], with r = 1/√(Σx²/cols + eps) — divide by cols, not by THREADS.",
            "Why strided and not a contiguous chunk per thread: the 32 lanes of a warp load together, so in one "
            "step they should touch 32 neighbouring columns (one 128-byte line). Lane tid taking columns "
            "tid·chunk … tid·chunk + chunk − 1 spreads each step over chunk× as many sectors: uncoalesced.",
        ),
        perf=traffic_check(global_arrays=("x", "weight", "out"), max_factor=2.0),
        perf_case=0,  # 75 columns: a chunk of 3 per thread (with 20 columns a chunk is 1 column, coalesced)
    ),
)
