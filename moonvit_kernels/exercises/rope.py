"""Notebook 03's exercises: 2D RoPE — the pair rotation, a token's position in a packed batch, the fused epilogue."""

from __future__ import annotations

import numpy as np

from .. import reference
from .core import FP32_EPS, OUT, Case, Exercise, Suspect, awkward, ceil_div, gemm_bound

NB = "03_rope_2d"
TILE = 16


def _grid_positions(h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    rows, cols = np.divmod(np.arange(h * w), w)
    return rows.astype(np.int32), cols.astype(np.int32)


def _rotate(x: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """`x [L, hd]` rotated by `angles [L, hd/2]` (slot j = dims 2j, 2j+1)."""
    return reference.apply_rope(x[:, None, :], angles)[:, 0, :]


def _swap_axes(angles: np.ndarray) -> np.ndarray:
    out = angles.copy()
    out[:, 0::2], out[:, 1::2] = angles[:, 1::2], angles[:, 0::2]
    return out


# ============================================================================ rotate pairs
def rotate_case(rng: np.random.Generator, h: int, w: int, hd: int) -> Case:
    L = h * w
    x = awkward(rng, (L, hd))
    rows, cols = _grid_positions(h, w)
    angles = reference.rope_angles(h, w, hd).astype(np.float64)  # fp32 frequencies, as the kernel's
    pair = np.abs(x[:, 0::2]) + np.abs(x[:, 1::2])
    return Case(
        args=[x, rows, cols, OUT, np.int32(hd)],
        out_shape=(L, hd),
        grid=L,
        block=hd // 4,
        expected=_rotate(x.astype(np.float64), angles),
        bound=np.repeat(32 * FP32_EPS * (1 + angles) * pair, 2, axis=1) + 1e-30,
        arg_names="x, rows, cols, out, head_dim",
        axes=("tokens", "dims"),
        label=f"a {h}×{w} grid ({'taller' if h > w else 'wider'} than {'wide' if h > w else 'tall'}), head_dim {hd}",
    )


def rotate_cases(rng: np.random.Generator) -> list[Case]:
    return [rotate_case(rng, 5, 7, 16), rotate_case(rng, 6, 4, 24)]


def _rotate_swapped(case: Case) -> np.ndarray:
    x, rows, cols = case.args[0], case.args[1], case.args[2]
    h, w = int(rows.max()) + 1, int(cols.max()) + 1
    angles = reference.rope_angles(h, w, x.shape[1]).astype(np.float64)
    return _rotate(x.astype(np.float64), _swap_axes(angles))


# ============================================================================ token position
def position_case(items: tuple[tuple[int, int, int], ...]) -> Case:
    grid_thws = np.array(items, dtype=np.int32)
    sizes = np.prod(grid_thws.astype(np.int64), axis=1)
    cu = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    L = int(cu[-1])
    want = np.concatenate([np.tile(np.stack(np.divmod(np.arange(h * w), w), axis=1), (t, 1)) for t, h, w in items])
    groups = [(int(cu[i]), int(cu[i + 1]), f"item {i}") for i in range(len(items))]
    text = ", ".join(f"{'a ' + str(t) + '-frame video' if t > 1 else 'an image'} of {h}×{w}" for t, h, w in items)
    return Case(
        args=[grid_thws, cu, np.int32(len(items)), OUT, np.int32(L)],
        out_shape=(L, 2),
        grid=ceil_div(L, 32),
        block=32,
        expected=want,
        bound=0.0,
        arg_names="grid_thws, cu_seqlens, n_items, pos, L",
        axes=("tokens", "entries (0 = row, 1 = col)"),
        out_dtype=np.int32,
        label=f"{len(items)} packed items: {text}",
        row_groups=groups,
    )


def _no_frame_restart(case: Case) -> np.ndarray:
    """(row, col) counted from the item's start, frames not restarting at (0, 0)."""
    parts = [np.stack(np.divmod(np.arange(t * h * w), w), axis=1) for t, h, w in case.args[0].tolist()]
    return np.concatenate(parts).astype(np.float64)


def position_cases(rng: np.random.Generator) -> list[Case]:
    return [position_case(((2, 3, 5), (1, 4, 3))), position_case(((1, 2, 7), (3, 2, 2), (1, 1, 4)))]


# ============================================================================ fused epilogue
def fused_case(rng: np.random.Generator, h: int, w: int, heads: int, hd: int, din: int) -> Case:
    L, Q = h * w, heads * hd
    x = awkward(rng, (L, din))
    wqkv = awkward(rng, (3 * Q, din), scale=0.3)
    rows, cols = _grid_positions(h, w)
    plain = x.astype(np.float64) @ wqkv.astype(np.float64).T
    angles = reference.rope_angles(h, w, hd).astype(np.float64)
    want = plain.copy()
    for s in (0, 1):  # q and k are rotated, v is not
        part = plain[:, s * Q : (s + 1) * Q].reshape(L, heads, hd)
        want[:, s * Q : (s + 1) * Q] = reference.apply_rope(part, angles).reshape(L, Q)
    g = gemm_bound(x, wqkv)
    pair_g = np.repeat(np.maximum(g[:, 0::2], g[:, 1::2]), 2, axis=1)
    pair_abs = np.repeat(np.abs(plain[:, 0::2]) + np.abs(plain[:, 1::2]), 2, axis=1)
    bound = 2 * pair_g + 32 * FP32_EPS * (1 + angles.max()) * pair_abs + 1e-30
    pairs = 3 * Q // 2
    return Case(
        args=[x, wqkv, rows, cols, OUT, np.int32(L), np.int32(din), np.int32(heads), np.int32(hd)],
        out_shape=(L, 3 * Q),
        grid=(ceil_div(pairs, TILE), ceil_div(L, TILE)),
        block=(TILE, TILE),
        expected=want,
        bound=bound,
        arg_names="x, W, rows, cols, qkv, L, Din, heads, head_dim",
        axes=("tokens", "columns (q | k | v)"),
        label=f"a {h}×{w} grid, {heads} heads of head_dim {hd} (Q = {Q}), Din = {din}",
    )


def _fused_v_rotated(case: Case) -> np.ndarray:
    """q, k and v all rotated."""
    x, wqkv, rows, cols = case.args[:4]
    heads, hd = int(case.args[7]), int(case.args[8])
    L, Q = x.shape[0], heads * hd
    h, w = int(rows.max()) + 1, int(cols.max()) + 1
    plain = x.astype(np.float64) @ wqkv.astype(np.float64).T
    angles = reference.rope_angles(h, w, hd).astype(np.float64)
    return reference.apply_rope(plain.reshape(L, 3 * heads, hd), angles).reshape(L, 3 * Q)


def fused_cases(rng: np.random.Generator) -> list[Case]:
    return [fused_case(rng, 3, 5, 2, 8, 20), fused_case(rng, 4, 3, 3, 12, 9)]


EXERCISES = (
    Exercise(
        "rope_rotate_pairs",
        NB,
        "rotate the width pair (4i, 4i+1) by col·f_i and the height pair (4i+2, 4i+3) by row·f_i",
        rotate_cases,
        (
            "Thread i owns dims 4i … 4i+3: two complex pairs that share the frequency f_i but not the position — "
            "one turns with the token's column, the other with its row.",
            "(a, b) -> (a·cos θ − b·sin θ, a·sin θ + b·cos θ); the pair (4i, 4i+1) with θ = cols[l]·f_i (width), "
            "(4i+2, 4i+3) with θ = rows[l]·f_i (height). Token 0 sits at (0, 0): a kernel that copies x is right "
            "only there.",
        ),
        suspects=(
            Suspect(
                "a kernel that turns the width pair by the row and the height pair by the column writes: "
                "dims 4i, 4i+1 go with cols[l], dims 4i+2, 4i+3 with rows[l]",
                _rotate_swapped,
            ),
        ),
    ),
    Exercise(
        "rope_token_position",
        NB,
        "the (row, col) of token l of a packed batch: find its item, then its place in the frame",
        position_cases,
        (
            "cu_seqlens[n] is where item n starts; inside an item, the tokens run frame by frame, each frame row "
            "by row.",
            "Find the item n with cu_seqlens[n] <= l < cu_seqlens[n + 1]; p = (l − cu_seqlens[n]) mod (h·w) "
            "(every frame of a video restarts at (0, 0)); row = p // w, col = p mod w, with (h, w) of item n.",
        ),
        suspects=(
            Suspect(
                "a kernel whose frames do not restart at (0, 0) writes: frame f of a video holds positions "
                "(l − cu_seqlens[n]) mod (h·w), not rows h, h + 1, …",
                _no_frame_restart,
            ),
        ),
    ),
    Exercise(
        "rope_qkv_epilogue",
        NB,
        "fusion: the wqkv GEMM rotates q and k in its epilogue, before the store",
        fused_cases,
        (
            "Output column c sits in one of three slots (q, k, v) and, within its slot, in one head at dim "
            "d = c mod head_dim; only q and k columns (c < 2·Q) turn.",
            "i = d // 4, f_i = THETA^(−4i/head_dim); it turns by cols[m]·f_i when d mod 4 < 2 (width pair), by "
            "rows[m]·f_i otherwise. Rotate (c0, c1) -> (c0·cos − c1·sin, c0·sin + c1·cos); v columns are stored "
            "as they are.",
        ),
        suspects=(
            Suspect(
                "a kernel that rotates the v columns too writes: only q and k columns (c < 2·Q) carry RoPE",
                _fused_v_rotated,
            ),
        ),
    ),
)
