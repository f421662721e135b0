"""`CupyBackend`: the whole vision tower + projector on the GPU with the CUDA C kernels.

    backend = CupyBackend(config, weights, dtype="bfloat16")      # or "float32"
    outputs = backend.forward(pixel_values, grid_thws)           # list of [n_merged_i, T] CuPy arrays

Precision. Weights are uploaded once in the chosen dtype ("bfloat16": GEMM weights as bf16 bits;
norm gains and the position grid stay float32 arrays holding the bf16-rounded values, which is
what a bf16 model reads when it upcasts them). Activations stay on the device:

    x (residual stream)     float32 [L, D]     GEMM residual epilogues accumulate into it in place
    GEMM operands           dtype              rmsnorm writes them, GELU epilogues write them
    qkv, attention output   dtype              RoPE in place on qkv; softmax and lse in fp32
    accumulation, norms     float32            (tensor cores accumulate in fp32)

so the bf16 backend rounds only GEMM/attention operands, never the residual stream.

Stages (docs/model.md): patch GEMM -> + position grid -> N x [rmsnorm -> qkv GEMM -> RoPE -> attention ->
wo GEMM + residual -> rmsnorm -> fc0 GEMM + GELU(tanh) -> fc1 GEMM + residual] -> final rmsnorm ->
temporal mean + kh x kw merge -> proj.0 GEMM + GELU(erf) -> proj.2 GEMM -> rmsnorm.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .. import reference
from ..config import VisionConfig
from ..weights import bf16_bits_to_float32, check_weights, float32_to_bf16_bits
from . import sources as kcuda

DTYPES = ("bfloat16", "float32")


class CupyBackend:
    """The K3 vision tower on CUDA C kernels (CuPy RawModule); weights uploaded once."""

    name = "cupy"

    def __init__(
        self, config: VisionConfig, weights: Mapping[str, np.ndarray], dtype: str = "bfloat16", kernels: Any = None
    ):
        """`kernels` is the launcher module (default `moonvit_kernels.cuda_backend.launchers`); another module with
        the same functions and an `array_module()` can stand in (the CPU emulation tests use one)."""
        if dtype not in DTYPES:
            raise ValueError(f"CupyBackend dtype must be 'bfloat16' or 'float32', got {dtype!r}")
        check_weights(weights, config)
        kcuda.check_head_dim(config.head_dim)
        if kernels is None:
            from . import launchers as kernels

            kernels.require_sm80()
            kernels.check_attention_supported(config.head_dim, dtype)  # this GPU's shared memory
        self.k = kernels
        self.xp = kernels.array_module()
        self.config = config
        self.dtype = dtype
        D, p = config.vt_hidden_size, config.patch_size

        def gemm_weight(name: str, shape: tuple[int, ...] | None = None) -> Any:
            w = np.asarray(weights[name], dtype=np.float32)
            if shape is not None:
                w = w.reshape(shape)
            w = float32_to_bf16_bits(w) if dtype == "bfloat16" else np.ascontiguousarray(w)
            return self.xp.asarray(w)

        def fp32_weight(name: str) -> Any:
            w = np.asarray(weights[name], dtype=np.float32)
            if dtype == "bfloat16":
                w = bf16_bits_to_float32(float32_to_bf16_bits(w))
            return self.xp.asarray(np.ascontiguousarray(w))

        self.patch_w = gemm_weight("vision_tower.patch_embed.proj.weight", (D, 3 * p * p))
        self.pos_w = fp32_weight("vision_tower.patch_embed.pos_emb.weight")
        self.time_table = self.xp.asarray(
            reference.time_sincos_table(D, config.init_pos_emb_time).astype(np.float32)
        )  # computed, not stored in checkpoints
        self.freqs = self.xp.asarray(reference.rope_frequencies(config.head_dim, dtype=np.float32))
        self.layers = []
        for i in range(config.vt_num_hidden_layers):
            names = reference.layer_weight_names(i)
            self.layers.append(
                {
                    "norm0": fp32_weight(names["norm0"]),
                    "wqkv": gemm_weight(names["wqkv"]),
                    "wo": gemm_weight(names["wo"]),
                    "norm1": fp32_weight(names["norm1"]),
                    "fc0": gemm_weight(names["fc0"]),
                    "fc1": gemm_weight(names["fc1"]),
                }
            )
        self.final_norm = fp32_weight("vision_tower.encoder.final_layernorm.weight")
        self.proj0 = gemm_weight("mm_projector.proj.0.weight")
        self.proj2 = gemm_weight("mm_projector.proj.2.weight")
        self.post_norm = fp32_weight("mm_projector.post_norm.weight")

    # ------------------------------------------------------------------ helpers
    def _upload_operand(self, a: Any) -> Any:
        """A float32 array (host, or already on the device) as a contiguous GEMM operand in the backend dtype."""
        if isinstance(a, np.ndarray):
            a = np.ascontiguousarray(a, dtype=np.float32)
            return self.xp.asarray(float32_to_bf16_bits(a) if self.dtype == "bfloat16" else a)
        a = self.xp.ascontiguousarray(a, dtype=np.float32)
        return self.k.to_bf16(a) if self.dtype == "bfloat16" else a

    def _as_float32(self, a: Any) -> Any:
        """A fresh float32 copy of a device array (bf16 bits converted)."""
        return self.k.from_bf16(a) if a.dtype == np.uint16 else a.copy()

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        pixel_values: Any,
        grid_thws: Any,
        return_intermediates: bool = False,
        as_numpy: bool = False,
        on_layer: Callable[[int], None] | None = None,
    ) -> Any:
        """Tower + projector on `pixel_values [Σ t·h·w, 3, p, p]`, `grid_thws [N, 3]`.

        Returns one `[n_merged_i, text_hidden]` float32 array per item (CuPy, or NumPy with
        `as_numpy`); with `return_intermediates`, `(outputs, stages)` where `stages` holds float32
        copies under reference.vision_forward's names: patch_embed, pos_emb, layer_{i},
        final_norm, merged, projected. Inputs are validated like the reference's; device
        `pixel_values` (CuPy) are checked and converted on the device (one flag read back), and only
        the small `grid_thws` is copied to the host."""
        cfg, k, xp = self.config, self.k, self.xp
        if hasattr(grid_thws, "get") and not isinstance(grid_thws, np.ndarray):
            grid_thws = grid_thws.get()
        if xp is not np and isinstance(pixel_values, xp.ndarray):  # already on the device
            grid = reference.validate_grid_thws(grid_thws, cfg)
            pv = reference.check_pixels(pixel_values, grid, cfg, xp)
        else:
            pv, grid = reference.validate_inputs(pixel_values, grid_thws, cfg)
        act = self.dtype  # dtype of GEMM operands, qkv and attention output
        H, hd, eps = cfg.vt_num_attention_heads, cfg.head_dim, cfg.vit_norm_eps
        L = pv.shape[0]

        stages: dict[str, Any] = {}

        def keep(name: str, a: Any) -> None:
            if return_intermediates:
                stages[name] = self._as_float32(a)

        token_pos = xp.asarray(k.token_positions(grid))
        grid_dev = xp.asarray(grid.astype(np.int32))
        bounds = k.cu_seqlens_int32(grid)
        bounds_dev = xp.asarray(bounds)
        merge_src = xp.asarray(k.merge_sources(grid, cfg.merge_kernel_size))

        x = k.gemm(self._upload_operand(pv.reshape(L, -1)), self.patch_w, out_dtype="float32")
        keep("patch_embed", x)
        k.add_position_embedding_inplace(
            x, token_pos, grid_dev, self.pos_w, self.time_table, cfg.pos_emb_interpolation_mode
        )
        keep("pos_emb", x)
        for i, w in enumerate(self.layers):
            h = k.rmsnorm(x, w["norm0"], eps, out_dtype=act)
            qkv = k.gemm(h, w["wqkv"], out_dtype=act)
            k.rope_inplace(qkv, token_pos, self.freqs, H, hd)
            o, _ = k.attention(qkv, bounds, H, hd, cu_seqlens_device=bounds_dev)
            k.gemm(o, w["wo"], epilogue="residual", residual=x, out=x)
            h = k.rmsnorm(x, w["norm1"], eps, out_dtype=act)
            m = k.gemm(h, w["fc0"], epilogue="gelu_tanh", out_dtype=act)
            k.gemm(m, w["fc1"], epilogue="residual", residual=x, out=x)
            keep(f"layer_{i}", x)
            if on_layer is not None:
                on_layer(i)
        xf = k.rmsnorm(x, self.final_norm, eps, out_dtype="float32")
        keep("final_norm", xf)
        merged = k.tpool_merge(xf, merge_src, cfg.merge_kernel_size, out_dtype=act)
        keep("merged", merged)
        h = k.gemm(merged, self.proj0, epilogue="gelu_erf", out_dtype=act)
        y = k.gemm(h, self.proj2, out_dtype="float32")
        projected = k.rmsnorm(y, self.post_norm, cfg.projector_ln_eps, out_dtype="float32")
        keep("projected", projected)

        kh, kw = cfg.merge_kernel_size
        sizes = [(h_ // kh) * (w_ // kw) for _, h_, w_ in grid.tolist()]
        ends = np.cumsum(sizes).tolist()
        outputs = [projected[e - n : e] for n, e in zip(sizes, ends, strict=True)]
        if as_numpy:
            outputs = [_to_numpy(o) for o in outputs]
            stages = {name: _to_numpy(a) for name, a in stages.items()}
        return (outputs, stages) if return_intermediates else outputs


def _to_numpy(a: Any) -> np.ndarray:
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)
