"""Notebook 06's exercises: the position-grid resize and the MLP GEMM with its GELU fused."""

from __future__ import annotations

import math

import numpy as np

from .. import reference
from .core import FP32_EPS, OUT, Case, Exercise, Suspect, awkward, ceil_div, gemm_bound

NB = "06_full_encoder"
TILE = 16


def _bilinear(grid: np.ndarray, h: int, w: int, align_corners: bool = False, swap_scales: bool = False) -> np.ndarray:
    """`[h·w, D]` float64 bilinear resize of `grid [H0, W0, D]`, written out (for the suspects' variants)."""
    H0, W0 = grid.shape[:2]
    ry, rx = (W0 / h, H0 / w) if swap_scales else (H0 / h, W0 / w)

    def coords(n: int, n0: int, ratio: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        i = np.arange(n, dtype=np.float64)
        s = i * (n0 - 1) / max(n - 1, 1) if align_corners else np.maximum((i + 0.5) * ratio - 0.5, 0.0)
        lo = np.minimum(np.floor(s).astype(int), n0 - 1)
        hi = np.minimum(lo + 1, n0 - 1)
        return lo, hi, s - lo

    y0, y1, ly = coords(h, H0, ry)
    x0, x1, lx = coords(w, W0, rx)
    g = grid.astype(np.float64)
    top = (1 - lx)[None, :, None] * g[y0][:, x0] + lx[None, :, None] * g[y0][:, x1]
    bottom = (1 - lx)[None, :, None] * g[y1][:, x0] + lx[None, :, None] * g[y1][:, x1]
    return ((1 - ly)[:, None, None] * top + ly[:, None, None] * bottom).reshape(h * w, -1)


def pos_case(rng: np.random.Generator, H0: int, W0: int, h: int, w: int, D: int) -> Case:
    grid = awkward(rng, (H0, W0, D))
    want = reference.interpolate_pos_grid(grid.astype(np.float64), h, w, "bilinear").reshape(h * w, -1)
    return Case(
        args=[grid, OUT, np.int32(h), np.int32(w)],
        out_shape=want.shape,
        grid=h * w,
        block=32,
        expected=want,
        bound=np.full(want.shape, 16 * FP32_EPS * np.abs(grid).max()),  # a convex mix of 4 values
        arg_names="grid, out, h, w",
        axes=("patches (row·w + col)", "channels"),
        label=f"a {H0}×{W0} grid of D = {D} resized to {h}×{w} patches",
    )


def pos_cases(rng: np.random.Generator) -> list[Case]:
    return [pos_case(rng, 6, 6, 4, 9, 7), pos_case(rng, 5, 8, 7, 3, 3)]


def _pos_model(**kwargs: bool) -> object:
    def model(case: Case) -> np.ndarray:
        h, w = int(case.args[2]), int(case.args[3])
        return _bilinear(case.args[0], h, w, **kwargs)

    return model


def gelu_case(rng: np.random.Generator, M: int, N: int, K: int) -> Case:
    a = awkward(rng, (M, K))
    b = awkward(rng, (N, K), scale=0.5)
    prod = a.astype(np.float64) @ b.astype(np.float64).T
    grid = (ceil_div(N, TILE), ceil_div(M, TILE))
    return Case(
        args=[a, b, OUT, np.int32(M), np.int32(N), np.int32(K)],
        out_shape=(M, N),
        grid=grid,
        block=(TILE, TILE),
        expected=reference.gelu_tanh(prod),
        bound=2 * gemm_bound(a, b) + 8 * FP32_EPS * np.abs(prod),
        arg_names="A, B, C, M, N, K",
        axes=("rows m", "columns n"),
        label=f"M = {M}, N = {N}, K = {K}: a {grid[1]}×{grid[0]} grid",
        out_tile=(TILE, TILE),
    )


def gelu_cases(rng: np.random.Generator) -> list[Case]:
    return [gelu_case(rng, 23, 19, 30), gelu_case(rng, 40, 7, 17)]


def _gelu_erf(case: Case) -> np.ndarray:
    a, b = case.args[0].astype(np.float64), case.args[1].astype(np.float64)
    return reference.gelu_erf(a @ b.T)


GELU_C = math.sqrt(2.0 / math.pi)

EXERCISES = (
    Exercise(
        "pos_emb_bilinear",
        NB,
        "resize the learned position grid bilinearly, F.interpolate(align_corners=False)",
        pos_cases,
        (
            "align_corners=False treats each value as the centre of a cell: output cell r covers source "
            "coordinates scaled by H0/h, measured between cell centres (the +0.5 / −0.5).",
            "sy = (r + 0.5)·(H0/h) − 0.5, clamped at 0; y0 = floor(sy) (at most H0 − 1), y1 = min(y0 + 1, H0 − 1), "
            "weight ly = sy − y0 on y1; the same along columns with W0/w; mix the 4 taps.",
        ),
        suspects=(
            Suspect(
                "the align_corners=True formula writes (s = r·(H0 − 1)/(h − 1)): a different sampling grid",
                _pos_model(align_corners=True),
            ),
            Suspect(
                "a kernel that scales rows by W0/h and columns by H0/w writes: rows resize H0 -> h, columns W0 -> w",
                _pos_model(swap_scales=True),
            ),
        ),
    ),
    Exercise(
        "gelu_tanh_epilogue",
        NB,
        "the MLP's fc0 GEMM with its GELU (tanh form) fused into the store",
        gelu_cases,
        (
            "Apply the activation to the float32 sum just before C[m, n] is written — the tanh form, not erf "
            "(that one is the projector's).",
            f"gelu_tanh(v) = 0.5·v·(1 + tanh(√(2/π)·(v + 0.044715·v³))), √(2/π) = {GELU_C:.6f}.",
        ),
        suspects=(
            Suspect("the erf form of GELU writes (the projector's): the encoder MLP uses the tanh form", _gelu_erf),
        ),
    ),
)
