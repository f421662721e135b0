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

Kernels. GEMMs and attention go through `routing`: on a compute capability 9.0 device (H100, H200)
the bf16 backend uses the Hopper kernels (gemm_bf16_sm90 when K % 8 == 0 and both operands are
16-byte aligned, flash_attn_sm90 for head dims <= 128), each behind a first-use self-check against
the mma.sync kernel (`selfcheck.FirstUseCheck`: on a mismatch it warns with a SelfCheckWarning
naming the kernel and the mma.sync kernel answers from then on); elsewhere, or with `hopper=False`
or MOONVIT_HOPPER=0, the mma.sync kernels. `backend.describe()` says which kernels are in use and
`backend.kernel_calls` counts the launches per kernel.

Stages (docs/model.md): patch GEMM -> + position grid -> N x [rmsnorm -> qkv GEMM -> RoPE -> attention ->
wo GEMM + residual -> rmsnorm -> fc0 GEMM + GELU(tanh) -> fc1 GEMM + residual] -> final rmsnorm ->
temporal mean + kh x kw merge -> proj.0 GEMM + GELU(erf) -> proj.2 GEMM -> rmsnorm.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .. import packing, reference
from ..config import VisionConfig
from ..weights import bf16_bits_to_float32, check_weights, float32_to_bf16_bits
from . import preflight as hopper_preflight
from . import routing
from . import sources as kcuda
from .launchers import dtype_name
from .selfcheck import FirstUseCheck, attention_probe, gemm_probe

DTYPES = ("bfloat16", "float32")


class CupyBackend:
    """The K3 vision tower on CUDA C kernels (CuPy RawModule); weights uploaded once."""

    name = "cupy"

    def __init__(
        self,
        config: VisionConfig,
        weights: Mapping[str, np.ndarray],
        dtype: str = "bfloat16",
        kernels: Any = None,
        hopper: bool | None = None,
        hopper_kernels: Any = None,
        preflight: Callable[[int], tuple[bool, str]] | None = None,
    ):
        """`kernels` is the launcher module (default `moonvit_kernels.cuda_backend.launchers`); another module with
        the same functions and an `array_module()` can stand in (the CPU emulation tests use one; its
        `compute_capability()`, when it has one, plays the device's).

        `hopper`: None (default) uses the Hopper kernels on compute capability 9.0 devices unless the
        environment sets MOONVIT_HOPPER=0; True demands them (ValueError on another device or with
        dtype float32); False never uses them. `hopper_kernels` is their launcher module (default
        `hopper_launchers`; the emulation tests pass `emulation.hopper`). `preflight(head_dim) -> (ok, why)`
        decides, before they are enabled, whether the Hopper kernels may run (default on a GPU:
        `preflight.hopper_gate`, their probes in a subprocess with a timeout; none with stand-in `kernels`)."""
        if dtype not in DTYPES:
            raise ValueError(f"CupyBackend dtype must be 'bfloat16' or 'float32', got {dtype!r}")
        check_weights(weights, config)
        kcuda.check_head_dim(config.head_dim)
        on_device = kernels is None
        if kernels is None:
            from . import launchers as kernels

            kernels.require_sm80()
            kernels.check_attention_supported(config.head_dim, dtype)  # this GPU's shared memory
            capability = str(kernels.array_module().cuda.Device().compute_capability)
        else:
            capability = kernels.compute_capability() if hasattr(kernels, "compute_capability") else None
        self.k = kernels
        self.xp = kernels.array_module()
        if hopper and dtype != "bfloat16":
            raise ValueError("hopper=True needs dtype 'bfloat16': the Hopper kernels take bf16 operands")
        self.hopper, self.hopper_reason = routing.hopper_enabled(hopper, capability, os.environ)
        if self.hopper and dtype != "bfloat16":
            self.hopper, self.hopper_reason = False, "off (float32 backend: the Hopper kernels are bf16)"
        if self.hopper and (preflight is not None or on_device):
            ok, why = (preflight or hopper_preflight.hopper_gate)(config.head_dim)
            if not ok:
                self.hopper, self.hopper_reason = False, f"off ({why})"
        self.capability = capability
        self.kernel_calls: Counter = Counter()  # launches per kernel name
        self._sm90_gemm = self._sm90_attention = None
        if self.hopper:
            if hopper_kernels is None:
                from . import hopper_launchers as hopper_kernels
            self._sm90_gemm = FirstUseCheck(
                routing.GEMM_SM90, hopper_kernels.gemm, kernels.gemm, gemm_probe(self.xp), rtol=1e-2
            )
            if routing.choose_attention(True, dtype, config.head_dim) == routing.ATTN_SM90:
                self._sm90_attention = FirstUseCheck(
                    routing.ATTN_SM90,
                    hopper_kernels.attention,
                    kernels.attention,
                    attention_probe(self.xp, config.head_dim),
                    rtol=1e-2,
                )
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

    # ------------------------------------------------------------------ kernel choice
    def gemm(self, a: Any, b: Any, **kwargs: Any) -> Any:
        """`kernels.gemm(a, b, **kwargs)` on the kernel `routing.choose_gemm` picks (Hopper behind its check)."""
        name = routing.choose_gemm(self.hopper, dtype_name(a), a.shape[-1], _aligned16(a) and _aligned16(b))
        if name == routing.GEMM_SM90 and self._sm90_gemm is not None:
            out = self._sm90_gemm(a, b, **kwargs)
            name = name if self._sm90_gemm.verified else routing.GEMM_BF16
        else:
            out = self.k.gemm(a, b, **kwargs)
        self.kernel_calls[name] += 1
        return out

    def attention(self, qkv: Any, cu_seqlens: Any, num_heads: int, head_dim: int, **kwargs: Any) -> Any:
        """`kernels.attention(...)` on the kernel `routing.choose_attention` picks (Hopper behind its check)."""
        name = routing.choose_attention(self.hopper, dtype_name(qkv), head_dim)
        if name == routing.ATTN_SM90 and self._sm90_attention is not None:
            out = self._sm90_attention(qkv, cu_seqlens, num_heads, head_dim, **kwargs)
            name = name if self._sm90_attention.verified else routing.ATTN_BF16
        else:
            out = self.k.attention(qkv, cu_seqlens, num_heads, head_dim, **kwargs)
        self.kernel_calls[name] += 1
        return out

    def describe(self) -> dict[str, str]:
        """Which kernels this backend uses, in words: {"device", "hopper", "gemm", "attention", "calls"}."""
        trusted = {routing.GEMM_SM90: routing.GEMM_BF16, routing.ATTN_SM90: routing.ATTN_BF16}

        def state(check: FirstUseCheck | None, plain: str) -> str:
            if check is None:
                return plain
            if check.verified is None:
                return f"{check.name} (first-use check against {trusted[check.name]} not run yet)"
            if check.verified:
                return f"{check.name} (passed its first-use check, max relative error {check.error:.2g})"
            return f"{trusted[check.name]} ({check.name} FAILED its first-use check)"

        bf16 = self.dtype == "bfloat16"
        gemm_plain = routing.GEMM_BF16 if bf16 else routing.GEMM_FP32
        gemm = state(self._sm90_gemm, gemm_plain)
        if self._sm90_gemm is not None:
            gemm += f"; {gemm_plain} when K % 8 != 0 or an operand is not 16-byte aligned"
        attn = routing.choose_attention(False, self.dtype, self.config.head_dim)
        return {
            "device": "unknown" if self.capability is None else f"sm_{self.capability}",
            "hopper": self.hopper_reason,
            "gemm": gemm,
            "attention": state(self._sm90_attention, attn),
            "calls": ", ".join(f"{k} x{v}" for k, v in sorted(self.kernel_calls.items())) or "none yet",
        }

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
        final_norm, merged, projected. Inputs are validated like the reference's; `pixel_values` (host
        arrays are uploaded as given) are checked and converted on the device (one flag read back), and
        only the small `grid_thws` is copied to the host."""
        cfg, k, xp = self.config, self.k, self.xp
        if hasattr(grid_thws, "get") and not isinstance(grid_thws, np.ndarray):
            grid_thws = grid_thws.get()
        batch = packing.as_batch(grid_thws, cfg)
        if xp is not np:
            if not isinstance(pixel_values, xp.ndarray):
                # host pixels travel as they are; the finiteness check and the bf16 rounding run on the device
                # (done on the host, they took ~10 ms of a 37 ms forward of 8 packed 448² images on an H200)
                pixel_values = xp.asarray(reference.as_array("pixel_values", pixel_values))
            pv = reference.check_pixels(pixel_values, batch.grid, cfg, xp)
        else:
            pv, _ = reference.validate_inputs(pixel_values, batch, cfg)
        act = self.dtype  # dtype of GEMM operands, qkv and attention output
        H, hd, eps = cfg.vt_num_attention_heads, cfg.head_dim, cfg.vit_norm_eps
        L = pv.shape[0]

        stages: dict[str, Any] = {}

        def keep(name: str, a: Any) -> None:
            if return_intermediates:
                stages[name] = self._as_float32(a)

        token_pos = xp.asarray(batch.token_positions)
        grid_dev = xp.asarray(batch.grid32)
        bounds = batch.cu_seqlens
        bounds_dev = xp.asarray(bounds)
        merge_src = xp.asarray(batch.merge_sources)

        x = self.gemm(self._upload_operand(pv.reshape(L, -1)), self.patch_w, out_dtype="float32")
        keep("patch_embed", x)
        k.add_position_embedding_inplace(
            x, token_pos, grid_dev, self.pos_w, self.time_table, cfg.pos_emb_interpolation_mode
        )
        keep("pos_emb", x)
        for i, w in enumerate(self.layers):
            h = k.rmsnorm(x, w["norm0"], eps, out_dtype=act)
            qkv = self.gemm(h, w["wqkv"], out_dtype=act)
            k.rope_inplace(qkv, token_pos, self.freqs, H, hd)
            o, _ = self.attention(qkv, bounds, H, hd, cu_seqlens_device=bounds_dev)
            self.gemm(o, w["wo"], epilogue="residual", residual=x, out=x)
            h = k.rmsnorm(x, w["norm1"], eps, out_dtype=act)
            m = self.gemm(h, w["fc0"], epilogue="gelu_tanh", out_dtype=act)
            self.gemm(m, w["fc1"], epilogue="residual", residual=x, out=x)
            keep(f"layer_{i}", x)
            if on_layer is not None:
                on_layer(i)
        xf = k.rmsnorm(x, self.final_norm, eps, out_dtype="float32")
        keep("final_norm", xf)
        merged = k.tpool_merge(xf, merge_src, cfg.merge_kernel_size, out_dtype=act)
        keep("merged", merged)
        h = self.gemm(merged, self.proj0, epilogue="gelu_erf", out_dtype=act)
        y = self.gemm(h, self.proj2, out_dtype="float32")
        projected = k.rmsnorm(y, self.post_norm, cfg.projector_ln_eps, out_dtype="float32")
        keep("projected", projected)

        sizes = batch.merged_sizes
        ends = np.cumsum(sizes).tolist()
        outputs = [projected[e - n : e] for n, e in zip(sizes, ends, strict=True)]
        if as_numpy:
            outputs = [_to_numpy(o) for o in outputs]
            stages = {name: _to_numpy(a) for name, a in stages.items()}
        return (outputs, stages) if return_intermediates else outputs


def _aligned16(a: Any) -> bool:
    """True when `a` is C-contiguous and starts at a 16-byte aligned address (CuPy or NumPy array)."""
    if not a.flags.c_contiguous:
        return False
    data = getattr(a, "data", None)
    address = int(data.ptr) if hasattr(data, "ptr") else int(a.ctypes.data)
    return address % 16 == 0


def _to_numpy(a: Any) -> np.ndarray:
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)
