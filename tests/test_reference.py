"""The NumPy oracle (`moonvit_kernels.reference`) checked stage by stage.

Every stage is compared with a second formulation written here independently (literal loops,
scalar code, complex numbers, explicit softmax) in float64, and with facts worked out by hand
from docs/model.md. The whole tower is then checked end to end against a forward pass assembled only
from this file's own formulations. Sizes are tiny and awkward (odd, non-square, not powers of 2).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import assert_close, fp32_rtol, random_pixels

from moonvit_kernels import reference as ref
from moonvit_kernels.config import VisionConfig
from moonvit_kernels.weights import random_weights

TINY = VisionConfig.tiny()
TIGHT = dict(rtol=1e-12, atol=1e-12)  # float64 vs float64, different summation order


def rnd(shape, seed, scale=1.0):
    return scale * np.random.default_rng(seed).standard_normal(shape)


# ============================================================================ independent formulations
def conv2d_loop(image: np.ndarray, weight: np.ndarray, p: int) -> np.ndarray:
    """Conv2d(3, D, kernel=p, stride=p, no bias) as literal loops: image [3, H, W] -> [H/p, W/p, D]."""
    C, Hi, Wi = image.shape
    D = weight.shape[0]
    out = np.zeros((Hi // p, Wi // p, D))
    for r in range(Hi // p):
        for c in range(Wi // p):
            for o in range(D):
                acc = 0.0
                for ch in range(C):
                    for ky in range(p):
                        for kx in range(p):
                            acc += image[ch, r * p + ky, c * p + kx] * weight[o, ch, ky, kx]
                out[r, c, o] = acc
    return out


def cut_patches(image: np.ndarray, p: int) -> np.ndarray:
    """image [3, h·p, w·p] -> patches [h·w, 3, p, p] in (row, column) order."""
    _, Hi, Wi = image.shape
    return np.stack(
        [image[:, r * p : (r + 1) * p, c * p : (c + 1) * p] for r in range(Hi // p) for c in range(Wi // p)]
    )


def bilinear_scalar(grid: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """docs/model.md's bilinear (align_corners=False) for one output pixel at a time."""
    H, W, D = grid.shape
    out = np.zeros((out_h, out_w, D))

    def source(d: int, n_in: int, n_out: int) -> tuple[int, int, float]:
        s = (d + 0.5) * n_in / n_out - 0.5
        s = max(s, 0.0)
        lo = int(math.floor(s))
        hi = min(lo + 1, n_in - 1)
        return lo, hi, s - lo

    for y in range(out_h):
        y0, y1, ly = source(y, H, out_h)
        for x in range(out_w):
            x0, x1, lx = source(x, W, out_w)
            top = (1 - lx) * grid[y0, x0] + lx * grid[y0, x1]
            bottom = (1 - lx) * grid[y1, x0] + lx * grid[y1, x1]
            out[y, x] = (1 - ly) * top + ly * bottom
    return out


def keys_kernel(dist: float, a: float = -0.75) -> float:
    """Keys' cubic convolution kernel W(|x|) written piecewise."""
    x = abs(dist)
    if x <= 1.0:
        return (a + 2) * x**3 - (a + 3) * x**2 + 1
    if x < 2.0:
        return a * x**3 - 5 * a * x**2 + 8 * a * x - 4 * a
    return 0.0


def bicubic_scalar(grid: np.ndarray, out_h: int, out_w: int, a: float = -0.75) -> np.ndarray:
    """docs/model.md's bicubic (align_corners=False, 4 clamped taps per axis) for one output pixel at a time."""
    H, W, D = grid.shape
    out = np.zeros((out_h, out_w, D))
    for y in range(out_h):
        sy = (y + 0.5) * H / out_h - 0.5
        iy = math.floor(sy)
        for x in range(out_w):
            sx = (x + 0.5) * W / out_w - 0.5
            ix = math.floor(sx)
            acc = np.zeros(D)
            for ty in range(iy - 1, iy + 3):
                wy = keys_kernel(sy - ty, a)
                for tx in range(ix - 1, ix + 3):
                    wx = keys_kernel(sx - tx, a)
                    acc += wy * wx * grid[min(max(ty, 0), H - 1), min(max(tx, 0), W - 1)]
            out[y, x] = acc
    return out


def rope_complex(x: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """RoPE as complex multiplication: pairs (x[2j], x[2j+1]) -> complex, times exp(i·angle)."""
    z = x[..., 0::2] + 1j * x[..., 1::2]
    z = z * np.exp(1j * angles)[:, None, :]
    out = np.empty_like(x)
    out[..., 0::2] = z.real
    out[..., 1::2] = z.imag
    return out


def rope_rotate_half(x: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """The WRONG convention (GPT-NeoX rotate-half): pairs (x[j], x[j + hd/2])."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def rope_angles_by_hand(h: int, w: int, hd: int, swap: bool = False) -> np.ndarray:
    """Angles [h·w, hd/2] from docs/model.md's words: slot 2i turns by column·f_i, slot 2i+1 by row·f_i."""
    ang = np.zeros((h * w, hd // 2))
    for r in range(h):
        for c in range(w):
            for i in range(hd // 4):
                f = 10000.0 ** (-4 * i / hd)
                ang[r * w + c, 2 * i] = (r if swap else c) * f
                ang[r * w + c, 2 * i + 1] = (c if swap else r) * f
    return ang


def attention_loop(q, k, v, bounds):
    """Per item, per head: explicit scores, full softmax in float64; returns (o, lse)."""
    L, H, hd = q.shape
    o = np.zeros((L, H, hd))
    lse = np.zeros((L, H))
    for s, e in zip(bounds[:-1], bounds[1:], strict=True):
        for head in range(H):
            for i in range(s, e):
                scores = np.array([np.dot(q[i, head], k[j, head]) / math.sqrt(hd) for j in range(s, e)])
                ex = np.exp(scores - scores.max())
                o[i, head] = (ex / ex.sum()) @ v[s:e, head]
                lse[i, head] = math.log(sum(math.exp(float(sc)) for sc in scores))
    return o, lse


def merge_loop(x: np.ndarray, grid_thws, kh: int, kw: int) -> list[np.ndarray]:
    """docs/model.md's merge by explicit indices: merged token i·(w/kw)+j, slot a·kw+b <- patch (kh·i+a)·w + kw·j+b."""
    out, start = [], 0
    for t, h, w in grid_thws:
        m = np.zeros(((h // kh) * (w // kw), kh * kw, x.shape[1]))
        for i in range(h // kh):
            for j in range(w // kw):
                for a in range(kh):
                    for b in range(kw):
                        patch = (kh * i + a) * w + (kw * j + b)
                        frames = [x[start + f * h * w + patch] for f in range(t)]
                        m[i * (w // kw) + j, a * kw + b] = sum(frames) / t
        out.append(m)
        start += t * h * w
    return out


def rmsnorm_formula(x, g, eps):
    x = np.asarray(x, np.float64)
    return x / np.sqrt((x**2).mean(axis=-1, keepdims=True) + eps) * g


def gelu_erf_formula(x):
    return np.vectorize(lambda v: 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))))(x)


def gelu_tanh_formula(x):
    return np.vectorize(lambda v: 0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3))))(x)


def independent_forward(pixels, grid_thws, weights, cfg: VisionConfig) -> list[np.ndarray]:
    """The whole tower + projector from this file's formulations only, in float64."""
    W = {k: np.asarray(v, np.float64) for k, v in weights.items()}
    D, H, hd, Q = cfg.vt_hidden_size, cfg.vt_num_attention_heads, cfg.head_dim, cfg.qkv_hidden_size
    kh, kw = cfg.merge_kernel_size
    L = pixels.shape[0]
    x = pixels.reshape(L, -1).astype(np.float64) @ W["vision_tower.patch_embed.proj.weight"].reshape(D, -1).T
    pos, angles = [], []
    half = D // 2
    for t, h, w in grid_thws:
        g = bilinear_scalar(W["vision_tower.patch_embed.pos_emb.weight"], h, w).reshape(h * w, D)
        for f in range(t):
            time = np.zeros(D)
            if t > 1:
                for i in range(half):
                    omega = 10000.0 ** (-i / half)
                    time[i], time[half + i] = math.sin(f * omega), math.cos(f * omega)
            pos.append(g + time)
            angles.append(rope_angles_by_hand(h, w, hd))
    x = x + np.concatenate(pos)
    angles = np.concatenate(angles)
    bounds = np.concatenate([[0], np.cumsum([t * h * w for t, h, w in grid_thws])])
    eps = cfg.vit_norm_eps
    for i in range(cfg.vt_num_hidden_layers):
        b = f"vision_tower.encoder.blocks.{i}."
        qkv = rmsnorm_formula(x, W[b + "norm0.weight"], eps) @ W[b + "wqkv.weight"].T
        q = rope_complex(qkv[:, :Q].reshape(L, H, hd), angles)
        k = rope_complex(qkv[:, Q : 2 * Q].reshape(L, H, hd), angles)
        o, _ = attention_loop(q, k, qkv[:, 2 * Q :].reshape(L, H, hd), bounds)
        x = x + o.reshape(L, Q) @ W[b + "wo.weight"].T
        mid = rmsnorm_formula(x, W[b + "norm1.weight"], eps) @ W[b + "mlp.fc0.weight"].T
        x = x + gelu_tanh_formula(mid) @ W[b + "mlp.fc1.weight"].T
    x = rmsnorm_formula(x, W["vision_tower.encoder.final_layernorm.weight"], eps)
    outs = []
    for m in merge_loop(x, grid_thws, kh, kw):
        y = gelu_erf_formula(m.reshape(m.shape[0], -1) @ W["mm_projector.proj.0.weight"].T)
        y = y @ W["mm_projector.proj.2.weight"].T
        outs.append(rmsnorm_formula(y, W["mm_projector.post_norm.weight"], cfg.projector_ln_eps))
    return outs


# ============================================================================ 1. patch embedding
def test_patch_embed_equals_literal_conv_loop():
    p, D, h, w = 3, 5, 2, 3
    image = rnd((3, h * p, w * p), 1)
    weight = rnd((D, 3, p, p), 2)
    got = ref.patch_embed(cut_patches(image, p), weight)
    assert_close(got, conv2d_loop(image, weight, p).reshape(h * w, D), **TIGHT, name="patch_embed")


def test_patch_embed_flattening_order_matters():
    # A weight read in (kx, ky) order instead of (ky, kx) would give a different answer: the test can tell.
    p, D = 3, 4
    image = rnd((3, 2 * p, p), 3)
    weight = rnd((D, 3, p, p), 4)
    conv = conv2d_loop(image, weight, p).reshape(2, D)
    wrong = ref.patch_embed(cut_patches(image, p), weight.transpose(0, 1, 3, 2).copy())
    assert np.abs(wrong - conv).max() > 1e-3


# ============================================================================ 2. position embedding
RESIZES = [(5, 7, 9, 4), (5, 7, 3, 11), (4, 4, 2, 2), (3, 6, 7, 6), (6, 5, 13, 2), (2, 3, 1, 1)]


@pytest.mark.parametrize(("H0", "W0", "oh", "ow"), RESIZES)
def test_bilinear_equals_scalar_formula(H0, W0, oh, ow):
    grid = rnd((H0, W0, 3), 10 + oh)
    got = ref.interpolate_pos_grid(grid, oh, ow, "bilinear")
    assert_close(got, bilinear_scalar(grid, oh, ow), **TIGHT, name="bilinear")


@pytest.mark.parametrize(("H0", "W0", "oh", "ow"), RESIZES)
def test_bicubic_equals_scalar_formula(H0, W0, oh, ow):
    grid = rnd((H0, W0, 3), 20 + oh)
    got = ref.interpolate_pos_grid(grid, oh, ow, "bicubic")
    assert_close(got, bicubic_scalar(grid, oh, ow), **TIGHT, name="bicubic")


def test_bicubic_coefficient_is_minus_075_not_minus_05():
    grid = rnd((5, 7, 3), 30)
    got = ref.interpolate_pos_grid(grid, 9, 4, "bicubic")
    assert np.abs(got - bicubic_scalar(grid, 9, 4, a=-0.5)).max() > 1e-3


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_same_size_interpolation_is_exactly_identity(mode):
    grid = rnd((6, 5, 4), 31).astype(np.float32)
    assert np.array_equal(ref.interpolate_pos_grid(grid, 6, 5, mode), grid)
    assert np.array_equal(ref.interpolation_matrix(7, 7, mode), np.eye(7))


def test_bilinear_matrix_by_hand():
    # in=2 -> out=4: s = (d+0.5)/2 - 0.5 = -0.25 (clamped to 0), 0.25, 0.75, 1.25 (upper neighbour clamped).
    expected = np.array([[1.0, 0.0], [0.75, 0.25], [0.25, 0.75], [0.0, 1.0]])
    assert np.array_equal(ref.interpolation_matrix(2, 4, "bilinear"), expected)
    # in=4 -> out=2 (down): s = 0.5, 2.5 -> halfway between neighbours.
    expected = np.array([[0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.5, 0.5]])
    assert np.array_equal(ref.interpolation_matrix(4, 2, "bilinear"), expected)


def test_bicubic_matrix_row_by_hand():
    # in=4 -> out=8, output 2: s = 2.5·0.5 − 0.5 = 0.75, floor 0, t = 0.75; A = −0.75:
    #   W(1.75) = A·1.75³ − 5A·1.75² + 8A·1.75 − 4A = −0.03515625   (tap −1, clamped to 0)
    #   W(0.75) = (A+2)·0.75³ − (A+3)·0.75² + 1   =  0.26171875    (tap 0)
    #   W(0.25) = (A+2)·0.25³ − (A+3)·0.25² + 1   =  0.87890625    (tap 1)
    #   W(1.25) = A·1.25³ − 5A·1.25² + 8A·1.25 − 4A = −0.10546875  (tap 2)
    row = ref.interpolation_matrix(4, 8, "bicubic")[2]
    assert_close(row, [-0.03515625 + 0.26171875, 0.87890625, -0.10546875, 0.0], 0, 1e-15, "bicubic row 2")
    # Every row sums to 1 (clamped taps keep their weight), both modes, up and down.
    for mode in ("bilinear", "bicubic"):
        for n_in, n_out in ((4, 8), (7, 3), (5, 12)):
            assert_close(ref.interpolation_matrix(n_in, n_out, mode).sum(axis=1), np.ones(n_out), 0, 1e-14)


def test_unknown_interpolation_mode_rejected():
    with pytest.raises(ValueError, match="nearest"):
        ref.interpolation_matrix(3, 5, "nearest")


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_interpolation_matches_torch(mode):
    torch = pytest.importorskip("torch", reason="torch not installed: F.interpolate comparison skipped")
    F = torch.nn.functional
    grid = rnd((5, 7, 3), 40)
    for oh, ow in ((9, 4), (3, 11), (5, 7), (2, 2)):
        t = torch.from_numpy(grid).permute(2, 0, 1)[None]
        want = F.interpolate(t, size=(oh, ow), mode=mode, align_corners=False)[0].permute(1, 2, 0).numpy()
        assert_close(ref.interpolate_pos_grid(grid, oh, ow, mode), want, 1e-10, 1e-10, f"{mode} {oh}x{ow}")


def test_time_table_by_hand():
    D, T = 10, 4
    table = ref.time_sincos_table(D, T)
    assert table.shape == (T, D)
    assert np.array_equal(table[0, : D // 2], np.zeros(D // 2))
    assert np.array_equal(table[0, D // 2 :], np.ones(D // 2))
    for f in range(T):
        for i in range(D // 2):
            omega = 10000.0 ** (-i / (D // 2))
            assert math.isclose(table[f, i], math.sin(f * omega), abs_tol=1e-15)
            assert math.isclose(table[f, D // 2 + i], math.cos(f * omega), abs_tol=1e-15)


def test_position_embedding_image_gets_grid_video_gets_grid_plus_time():
    cfg = TINY
    pos = rnd((cfg.init_pos_emb_height, cfg.init_pos_emb_width, cfg.vt_hidden_size), 41)
    D, half = cfg.vt_hidden_size, cfg.vt_hidden_size // 2
    h, w, t = 4, 10, 3
    image = ref.position_embedding(np.array([[1, h, w]]), pos, cfg)
    assert_close(image, bilinear_scalar(pos, h, w).reshape(h * w, D), **TIGHT, name="image pos")
    video = ref.position_embedding(np.array([[t, h, w]]), pos, cfg).reshape(t, h * w, D)
    time = ref.time_sincos_table(D, cfg.init_pos_emb_time)
    for f in range(t):
        assert_close(video[f], image + time[f], **TIGHT, name=f"video frame {f}")
    # Frame 0 of a video vs the image: +1 on the cos half, nothing on the sin half.
    diff = video[0] - image
    assert np.array_equal(diff[:, :half], np.zeros((h * w, half)))
    assert_close(diff[:, half:], np.ones((h * w, half)), 0, 1e-12, "frame 0 cos half")
    # Native size: the learned grid itself, untouched.
    native = ref.position_embedding(np.array([[1, cfg.init_pos_emb_height, cfg.init_pos_emb_width]]), pos, cfg)
    assert np.array_equal(native, pos.reshape(-1, D))
    # Packed: concatenated in item order.
    packed = ref.position_embedding(np.array([[1, h, w], [t, h, w]]), pos, cfg)
    assert np.array_equal(packed, np.concatenate([image, video.reshape(t * h * w, D)]))


# ============================================================================ 3a. RoPE
HD = 24  # a multiple of 4, not a power of 2


def test_rope_angles_match_spec_words():
    assert_close(ref.rope_angles(3, 5, HD, np.float64), rope_angles_by_hand(3, 5, HD), 1e-14, 0, "angles")
    f = ref.rope_frequencies(HD)
    assert f.dtype == np.float32
    assert_close(f, [10000.0 ** (-4 * i / HD) for i in range(HD // 4)], 1e-6, 0, "f_i (fp32)")


def test_apply_rope_equals_complex_form():
    h, w = 3, 5
    x = rnd((h * w, 2, HD), 50)
    angles = ref.rope_angles(h, w, HD, np.float64)
    assert_close(ref.apply_rope(x, angles), rope_complex(x, angles), **TIGHT, name="rope")


def single_pair_errors(rope_fn, angle_fn) -> float:
    """Max error of `rope_fn` vs docs/model.md's by-hand rule on vectors with one nonzero pair."""
    h, w = 3, 5
    angles = angle_fn(h, w, HD)
    worst = 0.0
    rng = np.random.default_rng(51)
    for r in range(h):
        for c in range(w):
            for i in range(HD // 4):
                f = 10000.0 ** (-4 * i / HD)
                for first, turn in ((4 * i, c * f), (4 * i + 2, r * f)):
                    a, b = rng.uniform(0.5, 2.0, 2) * rng.choice([-1, 1], 2)
                    x = np.zeros((1, 1, HD))
                    x[0, 0, first], x[0, 0, first + 1] = a, b
                    want = np.zeros(HD)
                    want[first] = a * math.cos(turn) - b * math.sin(turn)
                    want[first + 1] = a * math.sin(turn) + b * math.cos(turn)
                    got = rope_fn(x, angles[r * w + c : r * w + c + 1])[0, 0]
                    worst = max(worst, float(np.abs(got - want).max()))
    return worst


def test_rope_single_pair_by_hand():
    def angles(h, w, hd):
        return ref.rope_angles(h, w, hd, np.float64)

    assert single_pair_errors(ref.apply_rope, angles) < 1e-12
    # The same check catches the two classic mistakes: rotate-half, and width/height slots swapped.
    assert single_pair_errors(rope_rotate_half, angles) > 0.1
    assert single_pair_errors(ref.apply_rope, lambda h, w, hd: rope_angles_by_hand(h, w, hd, swap=True)) > 0.1


def test_rope_rotate_half_fails_the_complex_form_check():
    x = rnd((15, 2, HD), 52)
    angles = ref.rope_angles(3, 5, HD, np.float64)
    with pytest.raises(AssertionError):
        assert_close(rope_rotate_half(x, angles), rope_complex(x, angles), **TIGHT, name="rotate-half")


def test_rope_scores_depend_only_on_relative_offset():
    h, w = 6, 7
    angles = ref.rope_angles(h, w, HD, np.float64)
    q, k = rnd((1, 1, HD), 53), rnd((1, 1, HD), 54)

    def score(pq, pk):
        rq = ref.apply_rope(q, angles[pq[0] * w + pq[1]][None])
        rk = ref.apply_rope(k, angles[pk[0] * w + pk[1]][None])
        return float(np.dot(rq.ravel(), rk.ravel()))

    pairs = [((1, 2), (3, 1)), ((0, 4), (5, 0)), ((2, 2), (2, 6)), ((4, 0), (0, 5))]
    for pq, pk in pairs:
        base = score(pq, pk)
        for dr, dc in ((1, 0), (0, 1), (-1, 1)):
            sq, sk = (pq[0] + dr, pq[1] + dc), (pk[0] + dr, pk[1] + dc)
            if all(0 <= p[0] < h and 0 <= p[1] < w for p in (sq, sk)):
                assert math.isclose(score(sq, sk), base, rel_tol=1e-10, abs_tol=1e-10), (pq, pk, dr, dc)
    # ... and does depend on the offset (the check is not vacuous): row and column offsets both matter.
    assert abs(score((1, 2), (3, 1)) - score((1, 2), (3, 2))) > 1e-3
    assert abs(score((1, 2), (3, 1)) - score((1, 2), (4, 1))) > 1e-3


def test_rope_frames_reuse_the_2d_table():
    grid = np.array([[1, 2, 3], [3, 4, 2]])
    packed = ref.rope_angles_packed(grid, HD, np.float64)
    assert packed.shape == (6 + 3 * 8, HD // 2)
    assert np.array_equal(packed[:6], ref.rope_angles(2, 3, HD, np.float64))
    table = ref.rope_angles(4, 2, HD, np.float64)
    for f in range(3):
        assert np.array_equal(packed[6 + 8 * f : 6 + 8 * (f + 1)], table)


# ============================================================================ 3b. norms, activations
@pytest.mark.parametrize("rows", [1, 7])
def test_rmsnorm_and_rstd(rows):
    x = rnd((rows, 33), 60, scale=3.0)
    g = 1 + 0.25 * rnd(33, 61)
    eps = 1e-5
    out, rstd = ref.rmsnorm(x, g, eps, return_rstd=True)
    assert_close(out, rmsnorm_formula(x, g, eps), **TIGHT, name="rmsnorm")
    assert_close(rstd, [1 / math.sqrt(sum(v * v for v in row) / 33 + eps) for row in x], **TIGHT, name="rstd")
    out32, rstd32 = ref.rmsnorm(x.astype(np.float32), g.astype(np.float32), eps, return_rstd=True)
    assert out32.dtype == np.float32 and rstd32.dtype == np.float32
    assert_close(out32, rmsnorm_formula(x.astype(np.float32), g.astype(np.float32), eps), fp32_rtol(33), 1e-6)
    # float16 input is normed in float32 (never below float32)
    assert ref.rmsnorm(x.astype(np.float16), g, eps).dtype == np.float32


def test_gelus_match_formulas_and_differ():
    x = np.concatenate([np.linspace(-6, 6, 61), rnd(40, 62, scale=2.0)])
    assert_close(ref.gelu_tanh(x.copy()), gelu_tanh_formula(x), **TIGHT, name="gelu_tanh")
    assert_close(ref.gelu_erf(x), gelu_erf_formula(x), **TIGHT, name="gelu_erf")
    assert_close(ref.gelu_tanh(x.astype(np.float32)), gelu_tanh_formula(x), 1e-6, 1e-6, "gelu_tanh fp32")
    assert_close(ref.gelu_erf(x.astype(np.float32)), gelu_erf_formula(x), 1e-6, 1e-6, "gelu_erf fp32")
    assert np.abs(ref.gelu_tanh(x.copy()) - ref.gelu_erf(x)).max() > 1e-4


# ============================================================================ 3c. attention
def packed_qkv(sizes, H=2, hd=12, seed=70):
    L = sum(sizes)
    q, k, v = (rnd((L, H, hd), seed + i, scale=1.5) for i in range(3))
    return q, k, v, np.concatenate([[0], np.cumsum(sizes)])


def test_attention_equals_per_item_softmax_loop_with_lse():
    q, k, v, bounds = packed_qkv([5, 1, 9])
    o, lse = ref.attention(q, k, v, bounds, return_lse=True)
    o_loop, lse_loop = attention_loop(q, k, v, bounds)
    assert_close(o, o_loop, **TIGHT, name="attention o")
    assert_close(lse, lse_loop, **TIGHT, name="attention lse")


def test_attention_float32_close_to_float64():
    q, k, v, bounds = packed_qkv([7, 4])
    o32, lse32 = ref.attention(*(a.astype(np.float32) for a in (q, k, v)), bounds, return_lse=True)
    o_loop, lse_loop = attention_loop(*(a.astype(np.float32).astype(np.float64) for a in (q, k, v)), bounds)
    assert o32.dtype == np.float32
    assert_close(o32, o_loop, fp32_rtol(7), 1e-5, "attention fp32")
    assert_close(lse32, lse_loop, fp32_rtol(12), 1e-5, "lse fp32")


@pytest.mark.parametrize("budget", [1, 7, 50])
def test_attention_chunking_gives_same_result(budget):
    q, k, v, bounds = packed_qkv([5, 1, 9])
    o_full, lse_full = ref.attention(q, k, v, bounds, return_lse=True)
    o, lse = ref.attention(q, k, v, bounds, return_lse=True, score_budget=budget)
    assert_close(o, o_full, **TIGHT, name=f"chunked o (budget {budget})")
    assert_close(lse, lse_full, **TIGHT, name=f"chunked lse (budget {budget})")


def test_attention_items_do_not_see_each_other():
    q, k, v, bounds = packed_qkv([6, 5])
    o = ref.attention(q, k, v, bounds)
    q2, k2, v2 = q.copy(), k.copy(), v.copy()
    for a in (q2, k2, v2):
        a[6:] = rnd(a[6:].shape, 77, scale=3.0)
    o2 = ref.attention(q2, k2, v2, bounds)
    assert np.array_equal(o2[:6], o[:6])
    assert np.abs(o2[6:] - o[6:]).max() > 1e-2
    # As one item, the same tokens do mix: the packing is what isolates them.
    joint = ref.attention(q, k, v, np.array([0, 11]))
    assert np.abs(joint[:6] - o[:6]).max() > 1e-3


# ============================================================================ 5. merge
@pytest.mark.parametrize("kernel", [(2, 2), (1, 2), (3, 2)])
def test_merger_equals_index_loops(kernel):
    kh, kw = kernel
    grid = [(1, 3 * kh, 2 * kw), (3, kh, 3 * kw), (2, 2 * kh, kw)]
    L = sum(t * h * w for t, h, w in grid)
    x = rnd((L, 5), 80)
    got = ref.tpool_patch_merger(x, np.array(grid), kernel)
    want = merge_loop(x, grid, kh, kw)
    assert len(got) == len(want)
    for i, (g, wnt) in enumerate(zip(got, want, strict=True)):
        assert_close(g, wnt, **TIGHT, name=f"merged item {i}")


def test_merged_token_zero_holds_patches_0_1_w_w1():
    h, w = 4, 6
    x = rnd((h * w, 3), 81)
    merged = ref.tpool_patch_merger(x, np.array([[1, h, w]]), (2, 2))[0]
    assert merged.shape == (h * w // 4, 4, 3)
    assert np.array_equal(merged[0], x[[0, 1, w, w + 1]])
    # second merged token of row 0: patches 2, 3, w+2, w+3; first of merged row 1: 2w, 2w+1, 3w, 3w+1
    assert np.array_equal(merged[1], x[[2, 3, w + 2, w + 3]])
    assert np.array_equal(merged[w // 2], x[[2 * w, 2 * w + 1, 3 * w, 3 * w + 1]])


def test_merger_temporal_mean():
    t, h, w = 3, 2, 4
    x = rnd((t * h * w, 3), 82)
    video = ref.tpool_patch_merger(x, np.array([[t, h, w]]), (2, 2))[0]
    frames = [
        ref.tpool_patch_merger(x[f * h * w : (f + 1) * h * w], np.array([[1, h, w]]), (2, 2))[0] for f in range(t)
    ]
    assert_close(video, (frames[0] + frames[1] + frames[2]) / 3, **TIGHT, name="temporal mean")


# ============================================================================ 6. projector
def test_projector_equals_formula():
    cfg = TINY
    weights = random_weights(cfg, seed=3)
    merged = rnd((5, cfg.merged_hidden_size), 90)
    got = ref.projector(merged, weights, cfg)
    W0 = weights["mm_projector.proj.0.weight"].astype(np.float64)
    W2 = weights["mm_projector.proj.2.weight"].astype(np.float64)
    g = weights["mm_projector.post_norm.weight"].astype(np.float64)
    want = rmsnorm_formula(gelu_erf_formula(merged @ W0.T) @ W2.T, g, cfg.projector_ln_eps)
    assert got.shape == (5, cfg.text_hidden_size)
    assert_close(got, want, 1e-11, 1e-11, "projector")
    # tanh GELU in the projector would be a different model: the test can tell.
    wrong = rmsnorm_formula(gelu_tanh_formula(merged @ W0.T) @ W2.T, g, cfg.projector_ln_eps)
    assert np.abs(wrong - got).max() > 1e-6


# ============================================================================ the whole tower
PACKED = np.array([[1, 4, 10], [3, 2, 4]])  # image (interpolated 6x6 -> 4x10) + 3-frame video


@pytest.fixture(scope="module")
def tiny_weights():
    return random_weights(TINY, seed=5)


def test_vision_forward_equals_independent_forward(tiny_weights):
    pixels = random_pixels(PACKED, TINY.patch_size, seed=7, dtype=np.float64)
    got = ref.vision_forward(pixels, PACKED, tiny_weights, TINY, dtype=np.float64)
    want = independent_forward(pixels, PACKED.tolist(), tiny_weights, TINY)
    assert [g.shape for g in got] == [(10, TINY.text_hidden_size), (2, TINY.text_hidden_size)]
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_close(g, w, 1e-12, 1e-12, f"item {i}")  # measured on CPU: max |diff| ~3e-15


def test_vision_forward_float32_agrees_with_float64(tiny_weights):
    pixels = random_pixels(PACKED, TINY.patch_size, seed=8)
    out32 = ref.vision_forward(pixels, PACKED, tiny_weights, TINY)
    out64 = ref.vision_forward(pixels, PACKED, tiny_weights, TINY, dtype=np.float64)
    for i, (a, b) in enumerate(zip(out32, out64, strict=True)):
        assert a.dtype == np.float32 and b.dtype == np.float64
        assert_close(a, b, fp32_rtol(TINY.merged_hidden_size, 16), 1e-4, f"fp32 vs fp64 item {i}")


def test_vision_forward_intermediates(tiny_weights):
    pixels = random_pixels(PACKED, TINY.patch_size, seed=9)
    outputs, stages = ref.vision_forward(pixels, PACKED, tiny_weights, TINY, return_intermediates=True)
    L, D, M = 40 + 24, TINY.vt_hidden_size, 10 + 2
    names = ["patch_embed", "pos_emb"] + [f"layer_{i}" for i in range(TINY.vt_num_hidden_layers)]
    names += ["final_norm", "merged", "projected"]
    assert list(stages) == names
    shapes = [(L, D)] * (len(names) - 2) + [(M, TINY.merged_hidden_size), (M, TINY.text_hidden_size)]
    assert [s.shape for s in stages.values()] == shapes
    assert all(s.dtype == np.float32 for s in stages.values())
    pos = ref.position_embedding(PACKED, tiny_weights["vision_tower.patch_embed.pos_emb.weight"], TINY)
    assert_close(stages["pos_emb"] - stages["patch_embed"], pos, 1e-5, 1e-5, "pos_emb stage")
    assert np.array_equal(np.concatenate(outputs), stages["projected"])
    plain = ref.vision_forward(pixels, PACKED, tiny_weights, TINY)
    for a, b in zip(plain, outputs, strict=True):
        assert np.array_equal(a, b)


def test_packed_items_equal_separate_runs(tiny_weights):
    pixels = random_pixels(PACKED, TINY.patch_size, seed=10)
    packed = ref.vision_forward(pixels, PACKED, tiny_weights, TINY)
    n0 = 40
    alone = [
        ref.vision_forward(pixels[:n0], PACKED[:1], tiny_weights, TINY)[0],
        ref.vision_forward(pixels[n0:], PACKED[1:], tiny_weights, TINY)[0],
    ]
    for i in range(2):
        assert_close(packed[i], alone[i], fp32_rtol(TINY.merged_hidden_size), 1e-5, f"item {i} packed vs alone")
    # Changing the video's pixels changes the video's output and leaves the image's alone.
    changed = pixels.copy()
    changed[n0:] = random_pixels(PACKED[1:], TINY.patch_size, seed=11)
    after = ref.vision_forward(changed, PACKED, tiny_weights, TINY)
    assert_close(after[0], packed[0], fp32_rtol(TINY.merged_hidden_size), 1e-6, "image after video changed")
    assert np.abs(after[1] - packed[1]).max() > 1e-2
