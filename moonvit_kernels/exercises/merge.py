"""Notebook 05's exercises: the kh×kw patch merge (mean over frames) and the projector GEMM that gathers it."""

from __future__ import annotations

import numpy as np

from .. import reference
from .core import FP32_EPS, OUT, Case, Exercise, Suspect, awkward, ceil_div, gemm_bound

NB = "05_merge_and_projector"
TILE = 16


def merged(
    x: np.ndarray, t: int, h: int, w: int, kh: int, kw: int, frames: int | None = None, divisor: float | None = None
) -> np.ndarray:
    """`[(h/kh)·(w/kw), kh·kw·D]` float64 merged rows of one item; `frames`/`divisor` model the bugs
    "only the first frames" and "divided by the wrong count" (the mean over all t frames otherwise)."""
    if frames is None and divisor is None:
        (m,) = reference.tpool_patch_merger(x.astype(np.float64), np.array([[t, h, w]]), (kh, kw))
        return m.reshape(m.shape[0], -1)
    f = t if frames is None else frames
    d = t if divisor is None else divisor
    (m,) = reference.tpool_patch_merger(x[: f * h * w].astype(np.float64), np.array([[f, h, w]]), (kh, kw))
    return m.reshape(m.shape[0], -1) * f / d


def _shape_text(t: int, h: int, w: int, D: int, kh: int, kw: int) -> str:
    video = f"a {t}-frame video" if t > 1 else "an image"
    return f"{video} of {h}×{w} patches, D = {D}, merge kh×kw = {kh}×{kw}"


def merge_case(rng: np.random.Generator, t: int, h: int, w: int, D: int, kh: int, kw: int) -> Case:
    x = awkward(rng, (t * h * w, D))
    want = merged(x, t, h, w, kh, kw)
    return Case(
        args=[x, OUT, np.int32(t), np.int32(h), np.int32(w), np.int32(D), np.int32(kh), np.int32(kw)],
        out_shape=want.shape,
        grid=want.shape[0],
        block=32,
        expected=want,
        bound=4 * FP32_EPS * np.abs(want) + 4 * FP32_EPS * np.abs(x).max(),
        arg_names="x, out, t, h, w, D, kh, kw",
        axes=("merged tokens", "columns (slot·D + d)"),
        label=_shape_text(t, h, w, D, kh, kw),
    )


def merge_cases(rng: np.random.Generator) -> list[Case]:
    return [merge_case(rng, 2, 6, 4, 5, 2, 2), merge_case(rng, 3, 4, 6, 3, 2, 3)]


def _params(case: Case) -> tuple[np.ndarray, int, int, int, int, int]:
    ints = [int(a) for a in case.args if isinstance(a, np.int32)]
    t, h, w = ints[:3]
    kh, kw = ints[-2:]
    return case.args[0], t, h, w, kh, kw


def gather_case(rng: np.random.Generator, t: int, h: int, w: int, D: int, kh: int, kw: int, N: int) -> Case:
    x = awkward(rng, (t * h * w, D))
    a = merged(x, t, h, w, kh, kw)
    b = awkward(rng, (N, a.shape[1]))
    M = a.shape[0]
    grid = (ceil_div(N, TILE), ceil_div(M, TILE))
    return Case(
        args=[x, b, OUT, *(np.int32(v) for v in (t, h, w, D, N, kh, kw))],
        out_shape=(M, N),
        grid=grid,
        block=(TILE, TILE),
        expected=a @ b.astype(np.float64).T,
        bound=gemm_bound(a, b) * 2,
        arg_names="x, B, C, t, h, w, D, N, kh, kw",
        axes=("merged tokens m", "columns n"),
        label=f"{_shape_text(t, h, w, D, kh, kw)}; N = {N}: a {grid[1]}×{grid[0]} grid",
    )


def gather_cases(rng: np.random.Generator) -> list[Case]:
    return [gather_case(rng, 2, 4, 6, 5, 2, 2, 19), gather_case(rng, 3, 4, 6, 3, 2, 3, 13)]


def _gather_model(frames: int | None, divisor: str | None) -> object:
    def model(case: Case) -> np.ndarray:
        x, t, h, w, kh, kw = _params(case)
        d = {None: None, "kh": kh, "kw": kw}[divisor]
        a = merged(x, t, h, w, kh, kw, frames=None if frames is None else min(frames, t), divisor=d)
        return a @ case.args[1].astype(np.float64).T

    return model


EXERCISES = (
    Exercise(
        "merge_index",
        NB,
        "which patch slot (a, b) of merged token m comes from, for any kh × kw",
        merge_cases,
        (
            "The merged grid is (h/kh) × (w/kw): merged token m sits at (i, j) in it and covers a kh × kw block of "
            "patches. Slots run row-major inside the block.",
            "i = m // (w/kw), j = m mod (w/kw); slot = a·kw + b, so a = slot // kw, b = slot mod kw; it reads "
            "patch (kh·i + a)·w + (kw·j + b) of every frame (frame f starts at row f·h·w of x).",
        ),
    ),
    Exercise(
        "fused_gather_gemm",
        NB,
        "the projector GEMM reading its A operand straight from x through the merge index",
        gather_cases,
        (
            "x has only D columns: the merged row m is never stored. Column k of it is slot k // D, channel "
            "k mod D, and its value is a mean over the frames.",
            "slot = k // D, d = k mod D, a = slot // kw, b = slot mod kw; patch = (kh·i + a)·w + (kw·j + b) with "
            "i = m // (w/kw), j = m mod (w/kw); A[m, k] = (Σ_f x[f·h·w + patch, d]) / t over all t frames.",
        ),
        suspects=(
            Suspect(
                "a kernel that averages 2 frames and divides by kh writes: sum over all t frames and divide by t "
                "(t = 2 = kh only by coincidence in the K3 image case)",
                _gather_model(2, "kh"),
            ),
            Suspect(
                "a kernel that divides the frame sum by kh instead of t writes: the mean is over frames",
                _gather_model(None, "kh"),
            ),
            Suspect(
                "a kernel that reads only the first 2 frames writes: loop over all t frames",
                _gather_model(2, None),
            ),
        ),
    ),
)
