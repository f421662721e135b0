"""Second formulations of every stage, written from docs/model.md without the package's code: literal loops,
scalar formulas, complex numbers. The reference (`moonvit_kernels.reference`) is checked against them stage by
stage (tests/stages/) and as a whole tower (`independent_forward`, tests/test_reference.py)."""

from __future__ import annotations

import math

import numpy as np

from moonvit_kernels.config import VisionConfig

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
