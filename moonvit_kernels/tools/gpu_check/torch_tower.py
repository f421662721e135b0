"""PyTorch eager versions of the tower, used as baselines: NumPy reference vs torch on the CPU
(`cpu_reference`), and the GPU tower vs torch bf16 (cuBLAS + SDPA) in gpu_check's section (c).

torch is optional and is passed in (`torch` argument), never imported at module level.
"""

from __future__ import annotations

from typing import Any


def torch_weights(torch: Any, weights: Any, device: str = "cpu", dtype: Any = None) -> dict[str, Any]:
    """The checkpoint's NumPy weights as torch tensors on `device` in `dtype` (float32 by default)."""
    dtype = torch.float32 if dtype is None else dtype
    return {k: torch.from_numpy(v).to(device=device, dtype=dtype) for k, v in weights.items()}


def torch_forward(
    torch: Any,
    pixel_values: Any,
    grid_thws: Any,
    weights: Any,
    config: Any,
    device: str = "cpu",
    dtype: Any = None,
    w: Any = None,
) -> Any:
    """The tower + projector in PyTorch eager (written from docs/model.md, not from the kernels), for timing.

    float32 on the CPU by default; `device="cuda", dtype=torch.bfloat16` gives a GPU baseline built
    from cuBLAS GEMMs and SDPA. `w` may be weights already converted with `torch_weights`.
    Returns `[M_total, text_hidden]` (all items concatenated)."""
    F = torch.nn.functional
    dtype = torch.float32 if dtype is None else dtype
    w = torch_weights(torch, weights, device, dtype) if w is None else w
    D, Q, H = config.vt_hidden_size, config.qkv_hidden_size, config.vt_num_attention_heads
    hd = Q // H
    eps = config.vit_norm_eps

    def rms(x, g, e):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + e) * g

    x = (
        torch.from_numpy(pixel_values).to(device=device, dtype=dtype).reshape(pixel_values.shape[0], -1)
        @ w["vision_tower.patch_embed.proj.weight"].reshape(D, -1).T
    )
    pos = w["vision_tower.patch_embed.pos_emb.weight"]
    parts, cos_l, sin_l = [], [], []
    freqs = 1.0 / (10000.0 ** (torch.arange(0, hd, 4, device=device)[: hd // 4].float() / hd))
    for t, h, wd in grid_thws.tolist():
        grid = (
            pos
            if (h, wd) == tuple(pos.shape[:2])
            else F.interpolate(
                pos.permute(2, 0, 1)[None], size=(h, wd), mode=config.pos_emb_interpolation_mode, align_corners=False
            )[0].permute(1, 2, 0)
        )
        assert t == 1, "benchmark uses images"
        parts.append(grid.reshape(h * wd, D))
        rows = torch.arange(h, device=device).repeat_interleave(wd).float()
        cols = torch.arange(wd, device=device).repeat(h).float()
        ang = torch.stack([cols[:, None] * freqs, rows[:, None] * freqs], dim=-1).reshape(h * wd, hd // 2)
        cos_l.append(ang.cos())
        sin_l.append(ang.sin())
    x = x + torch.cat(parts)
    cos, sin = torch.cat(cos_l)[:, None, :].to(dtype), torch.cat(sin_l)[:, None, :].to(dtype)
    L = x.shape[0]
    sizes = (grid_thws[:, 0] * grid_thws[:, 1] * grid_thws[:, 2]).tolist()

    def rope(z):
        a, b = z[..., 0::2], z[..., 1::2]
        return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)

    for i in range(config.vt_num_hidden_layers):
        b = f"vision_tower.encoder.blocks.{i}."
        qkv = rms(x, w[b + "norm0.weight"], eps) @ w[b + "wqkv.weight"].T
        q, k, v = qkv.view(L, 3, H, hd).unbind(1)
        q, k = rope(q), rope(k)
        outs = [
            F.scaled_dot_product_attention(qi.transpose(0, 1), ki.transpose(0, 1), vi.transpose(0, 1)).transpose(0, 1)
            for qi, ki, vi in zip(q.split(sizes), k.split(sizes), v.split(sizes), strict=True)
        ]
        x = x + torch.cat(outs).reshape(L, Q) @ w[b + "wo.weight"].T
        hmid = rms(x, w[b + "norm1.weight"], eps) @ w[b + "mlp.fc0.weight"].T
        x = x + F.gelu(hmid, approximate="tanh") @ w[b + "mlp.fc1.weight"].T
    x = rms(x, w["vision_tower.encoder.final_layernorm.weight"], eps)
    kh, kw = config.merge_kernel_size
    merged = []
    start = 0
    for t, h, wd in grid_thws.tolist():
        item = x[start : start + t * h * wd].view(t, h // kh, kh, wd // kw, kw, D).permute(0, 1, 3, 2, 4, 5).mean(0)
        merged.append(item.reshape(-1, kh * kw * D))
        start += t * h * wd
    m = torch.cat(merged)
    y = F.gelu(m @ w["mm_projector.proj.0.weight"].T) @ w["mm_projector.proj.2.weight"].T
    return rms(y, w["mm_projector.post_norm.weight"], config.projector_ln_eps)
