"""Notebook 04's exercises: softmax attention — two passes, the online rescale, and the tiled flash loop."""

from __future__ import annotations

import math

import numpy as np

from .core import FP32_EPS, OUT, Case, Exercise, Suspect, awkward, ceil_div

NB = "04_attention"
HD = 16  # head dim of the one-thread-per-query exercises (a compile-time constant in their kernels)
FLASH_HD, FLASH_BQ, FLASH_BK = 8, 4, 8  # the flash exercise: 4 query rows × 8 keys per tile, 32 threads


def _softmax_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """float64 `softmax(q·kᵀ·scale)·v` and the error bound of an fp32 kernel computing it."""
    s = (q.astype(np.float64) @ k.astype(np.float64).T) * scale
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    want = p @ v.astype(np.float64)
    smax = np.abs(s).max(axis=1, keepdims=True)
    bound = 16 * FP32_EPS * (1 + smax) * math.sqrt(k.shape[0]) * (p @ np.abs(v.astype(np.float64))) + 1e-6 * FP32_EPS
    return want, bound


def attention_case(rng: np.random.Generator, L: int) -> Case:
    q = awkward(rng, (L, HD), scale=4.0)  # scores pass ±200: exp without the max overflows fp32
    k = awkward(rng, (L, HD), scale=4.0)
    v = awkward(rng, (L, HD))
    scale = np.float32(1.0 / math.sqrt(HD))
    want, bound = _softmax_attention(q, k, v, float(scale))
    blocks = ceil_div(L, 32)
    return Case(
        args=[q, k, v, OUT, np.int32(L), scale],
        out_shape=(L, HD),
        grid=blocks,
        block=32,
        expected=want,
        bound=bound,
        arg_names="q, k, v, out, L, scale",
        axes=("queries", "dims"),
        label=f"L = {L} queries and keys, scores up to ±{float(np.abs(q @ k.T).max() * scale):.0f}, "
        f"{blocks} block{'s' if blocks > 1 else ''} of 32 threads",
    )


def attention_cases(rng: np.random.Generator) -> list[Case]:
    return [attention_case(rng, 23), attention_case(rng, 37)]


def _no_rescale(case: Case) -> np.ndarray:
    """One pass, l and acc never multiplied by exp(m_old − m_new)."""
    q, k, v, _, L, scale = case.args
    s = (q.astype(np.float64) @ k.astype(np.float64).T) * float(scale)
    m = np.maximum.accumulate(s, axis=1)
    p = np.exp(s - m)
    return (p @ v.astype(np.float64)) / p.sum(axis=1, keepdims=True)


# ============================================================================ the flash loop
def flash_tiles_table(cu: np.ndarray) -> np.ndarray:
    """`[T, 2]` int32 (item, first query row) of every FLASH_BQ-row query tile; tiles never straddle items."""
    rows = [(i, q0) for i in range(len(cu) - 1) for q0 in range(int(cu[i]), int(cu[i + 1]), FLASH_BQ)]
    return np.array(rows, dtype=np.int32).reshape(-1, 2)


def flash_case(rng: np.random.Generator, lengths: tuple[int, ...], negative: bool = False) -> Case:
    """`negative`: every score of every item is below −4 (keys point away from the queries), so a key past
    the item's end that is not masked (score 0 from its zero-filled row) outweighs every real key — the
    missing mask fails at any seed, not only when the random scores happen to be low."""
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    L = int(cu[-1])
    q = awkward(rng, (L, FLASH_HD), scale=5.0)
    k = awkward(rng, (L, FLASH_HD), scale=5.0)
    v = awkward(rng, (L, FLASH_HD))
    if negative:
        u = np.full(FLASH_HD, 1.0 / math.sqrt(FLASH_HD))
        q = (u * rng.uniform(4.0, 6.0, (L, 1)) + 0.3 * rng.standard_normal((L, FLASH_HD))).astype(np.float32)
        k = (-u * rng.uniform(4.0, 6.0, (L, 1)) + 0.3 * rng.standard_normal((L, FLASH_HD))).astype(np.float32)
    scale = np.float32(1.0 / math.sqrt(FLASH_HD))
    want = np.empty((L, FLASH_HD))
    bound = np.empty((L, FLASH_HD))
    for a, b in zip(cu[:-1], cu[1:], strict=True):
        want[a:b], bound[a:b] = _softmax_attention(q[a:b], k[a:b], v[a:b], float(scale))
    tiles = flash_tiles_table(cu)
    groups = [(int(a), int(b), f"item {i}") for i, (a, b) in enumerate(zip(cu[:-1], cu[1:], strict=True))]
    return Case(
        args=[q, k, v, cu, tiles, OUT, scale],
        out_shape=(L, FLASH_HD),
        grid=len(tiles),
        block=(FLASH_BK, FLASH_BQ),
        expected=want,
        bound=bound,
        arg_names="q, k, v, cu_seqlens, tiles, out, scale",
        axes=("queries", "dims"),
        label=f"{len(lengths)} packed items of {', '.join(map(str, lengths))} tokens: {len(tiles)} query tiles of "
        f"{FLASH_BQ}, key tiles of {FLASH_BK} (the last of each item partial)"
        + (", every score negative (an unmasked key past the end would outweigh them all)" if negative else ""),
        row_groups=groups,
    )


def flash_cases(rng: np.random.Generator) -> list[Case]:
    return [flash_case(rng, (6, 13)), flash_case(rng, (3, 17, 9)), flash_case(rng, (5, 11), negative=True)]


def _flash_model(case: Case, rescale: bool = True, mask: bool = True, across_items: bool = False) -> np.ndarray:
    """The tile loop in NumPy, with one of its steps optionally wrong (for the suspects)."""
    q, k, v, cu = (a.astype(np.float64) if a.dtype != np.int32 else a for a in case.args[:4])
    scale = float(case.args[6])
    out = np.empty_like(q)
    L = q.shape[0]
    for a, b in zip(cu[:-1], cu[1:], strict=True):
        lo, hi = (0, L) if across_items else (int(a), int(b))
        for r in range(int(a), int(b)):
            m, l_sum, acc = -np.inf, 0.0, np.zeros(q.shape[1])
            for k0 in range(lo, hi, FLASH_BK):
                keys = np.arange(k0, k0 + FLASH_BK)
                inside = keys < hi
                kk = np.where(inside[:, None], k[np.minimum(keys, L - 1)], 0.0)
                vv = np.where(inside[:, None], v[np.minimum(keys, L - 1)], 0.0)
                s = kk @ (q[r] * scale)
                if mask:
                    s = np.where(inside, s, -np.inf)
                m_new = max(m, s.max())
                p = np.exp(s - m_new)
                alpha = np.exp(m - m_new) if rescale else 1.0
                l_sum = l_sum * alpha + p.sum()
                acc = acc * alpha + p @ vv
                m = m_new
            out[r] = acc / l_sum
    return out


EXERCISES = (
    Exercise(
        "attention_softmax",
        NB,
        "one thread per query: the row maximum, then the exp-weights and their sum",
        attention_cases,
        (
            "exp overflows float32 above about 88.7 and these scores pass ±200 (each case names its largest). "
            "softmax(s) = softmax(s − c) for any c: choose c so that no exponent is positive.",
            "Pass 1: m = the maximum over keys of the scaled scores. Pass 2: p = exp(s − m), l += p, "
            "acc[d] += p·v[j, d]; the cell divides acc by l.",
        ),
    ),
    Exercise(
        "online_softmax_rescale",
        NB,
        "one pass over the keys: rescale the running sums whenever the maximum grows",
        attention_cases,
        (
            "Everything accumulated so far was weighted by exp(s − m_old). When a key raises the maximum to m_new, "
            "those weights must become exp(s − m_new).",
            "alpha = exp(m_old − m_new) (0 on the first key, where m_old = −inf; 1 when the maximum did not grow): "
            "l = l·alpha + p and acc[d] = acc[d]·alpha + p·v[j, d], with p = exp(s − m_new).",
        ),
        suspects=(
            Suspect(
                "a one-pass kernel that never rescales writes: l and acc must be multiplied by "
                "exp(m_old − m_new) when the maximum grows",
                _no_rescale,
            ),
        ),
    ),
    Exercise(
        "flash_attention_tiles",
        NB,
        "attention v2's loop: the query tile in shared memory, key/value tiles streamed, online softmax, barriers",
        flash_cases,
        (
            "One block per tile of 4 query rows of one item (tiles[b] = (item, first row)). Thread (ty, tx): query "
            "row ty of the tile, key tx of the current key tile — and output dim tx (BK = HD = 8). Keys and values "
            "of the item come through shared memory 8 at a time; each row keeps a running max m_i and sum l_i, as "
            "in the online-softmax exercise, with a whole tile of keys per step.",
            "Before the loop: q_s[ty, tx] = q[row, tx]·scale (0 for rows past the item's end), then a barrier. "
            "For k0 in range(kv_start, kv_end, BK): barrier; threads stage rows ty and ty + 4 of k_s and v_s "
            "(key k0 + r, 0 past kv_end); barrier; s = Σ_d q_s[ty, d]·k_s[tx, d], −inf for keys past kv_end; "
            "s_s[ty, tx] = s; barrier.",
            "Then m_new = max(m_i, s_s[ty, 0..BK−1]); p_s[ty, tx] = exp(s − m_new); alpha = exp(m_i − m_new); "
            "barrier; l_i = l_i·alpha + Σ_j p_s[ty, j]; acc = acc·alpha + Σ_j p_s[ty, j]·v_s[j, tx]; m_i = m_new. "
            "Every barrier is reached by every thread (never inside an if that depends on the thread).",
        ),
        suspects=(
            Suspect(
                "a tile loop that never rescales writes: when a key tile raises the row maximum, l_i and acc must "
                "be multiplied by alpha = exp(m_i − m_new)",
                lambda case: _flash_model(case, rescale=False),
            ),
            Suspect(
                "a tile loop that does not mask the keys past the item's end writes: in the last, partial key "
                "tile the missing keys must score −inf (they count as exp(0 − m) otherwise)",
                lambda case: _flash_model(case, mask=False),
            ),
            Suspect(
                "a kernel whose queries attend to every key of the packed batch writes: keys run from "
                "cu_seqlens[item] to cu_seqlens[item + 1] only — packed items never see each other",
                lambda case: _flash_model(case, across_items=True),
            ),
        ),
    ),
)
