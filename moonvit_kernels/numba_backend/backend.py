"""The `numba` backend: the whole tower and projector with the numba.cuda kernels.

Weights are uploaded once (float32, checkpoint layout `[out, in]`: every linear layer is the
GEMM `x · Wᵀ`). Activations stay on the device from the patch GEMM to the projector's norm, and
intermediates are copied to the host only when asked for. Per call, the small int32 tables
(grid, items, cu_seqlens, attention tiles) are built, checked and uploaded once, and the encoder
layers' activations live in one workspace allocated once (`Workspace`): the number of device
allocations and uploads does not grow with the number of layers. Runs on a GPU, or on the CPU
under numba's CUDA simulator (slow: tiny configs only). The weights live on the device that was
current at construction; `forward` refuses to run while another device is current.

Per call (docs/model.md stage numbers):
  1  x = pixels [L, 3·p·p] · W_patchᵀ                          gemm
  2  x += interpolated grid (+ time[f] for video frames)       add_position_embedding (in place)
  3  per layer: a = rmsnorm(x); qkv = a · wqkvᵀ; rope2d(qkv) in place (§4);
     o = attention(qkv) (§5); x = o · woᵀ + x; a = rmsnorm(x);
     h = gelu_tanh(a · fc0ᵀ); x = h · fc1ᵀ + x                  (residual adds fused in the GEMMs)
     then x = rmsnorm(x, final_layernorm)
  6  merged [M, kh·kw·D] = frame mean + kh×kw gather            merge
  7  y = rmsnorm(gelu_erf(merged · P0ᵀ) · P2ᵀ, post_norm)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import packing
from ..config import VisionConfig
from ..reference import layer_weight_names, validate_inputs
from ..weights import check_weights
from . import _cuda
from . import attention as attention_k
from . import gemm as gemm_k
from . import merge as merge_k
from . import pos_emb as pos_emb_k
from . import rmsnorm as rmsnorm_k
from . import rope as rope_k
from ._cuda import cuda
from .compilers import ENV_VAR, compiler_name
from .input_check import first_nonfinite_row
from .launch import device_array, is_device_array


@dataclass
class Workspace:
    """Device buffers of the encoder layers for L tokens, allocated once per forward and reused by
    every layer: `a [L, D]` (normed x), `rstd [L]`, `qkv [L, 3Q]`, `o [L, Q]`, `lse [L, H]`,
    `h [L, I]` (MLP hidden)."""

    a: Any
    rstd: Any
    qkv: Any
    o: Any
    lse: Any
    h: Any

    @classmethod
    def allocate(cls, L: int, D: int, Q: int, H: int, intermediate: int) -> Workspace:
        return cls(
            a=device_array((L, D)),
            rstd=device_array(L),
            qkv=device_array((L, 3 * Q)),
            o=device_array((L, Q)),
            lse=device_array((L, H)),
            h=device_array((L, intermediate)),
        )


class NumbaBackend:
    """MoonViT on numba.cuda kernels (float32); see the module docstring for the stage order."""

    name = "numba"

    def __init__(
        self,
        config: VisionConfig,
        weights: Mapping[str, np.ndarray],
        dtype: str = "float32",
        gemm_version: int = 3,
        attention_version: int = 2,
        compiler: str | None = None,
    ):
        """`compiler` (`numba-cuda`, `numba-cuda-mlir`/`mlir`, or None: whichever this process uses) must name
        `_cuda.COMPILER`, which is chosen when the kernels are first imported (`$MOONVIT_NUMBA_COMPILER`)."""
        if dtype != "float32":
            raise ValueError(f"the numba backend computes in float32, not {dtype!r}")
        if gemm_version not in gemm_k.VERSIONS:
            raise ValueError(f"gemm_version must be one of {gemm_k.VERSIONS}, got {gemm_version!r}")
        if attention_version not in attention_k.VERSIONS:
            raise ValueError(f"attention_version must be one of {attention_k.VERSIONS}, got {attention_version!r}")
        asked = compiler_name(compiler)
        if asked is not None and asked != _cuda.COMPILER:
            raise ValueError(
                f"compiler={compiler!r}, but this process's numba kernels were built with {_cuda.compiler_label()}: "
                f"the compiler is chosen once, before the kernels are imported; set {ENV_VAR}={asked} "
                "in the environment of a new process"
            )
        check_weights(weights, config)
        self.config = config
        self.device_id = _cuda.current_device_id()
        self.gemm_version = gemm_version
        self.attention_version = attention_version
        D = config.vt_hidden_size

        def up(name: str, shape: tuple[int, ...] | None = None) -> Any:
            a = np.asarray(weights[name], dtype=np.float32)
            return cuda.to_device(np.ascontiguousarray(a if shape is None else a.reshape(shape)))

        self.patch_w = up("vision_tower.patch_embed.proj.weight", (D, config.patch_dim))
        self.pos_w = up("vision_tower.patch_embed.pos_emb.weight")
        self.time = cuda.to_device(pos_emb_k.time_table(D, config.init_pos_emb_time))
        self.layers = [
            {role: up(name) for role, name in layer_weight_names(i).items()} for i in range(config.vt_num_hidden_layers)
        ]
        self.final_norm = up("vision_tower.encoder.final_layernorm.weight")
        self.proj0 = up("mm_projector.proj.0.weight")
        self.proj2 = up("mm_projector.proj.2.weight")
        self.post_norm = up("mm_projector.post_norm.weight")

    def describe(self) -> dict[str, str]:
        """What runs the kernels, in words: {"compiler", "device", "gemm", "attention"}."""
        return {
            "compiler": _cuda.compiler_label(),
            "device": _cuda.device_label(self.device_id),
            "gemm": f"v{self.gemm_version}",
            "attention": f"v{self.attention_version}",
        }

    # ------------------------------------------------------------------ helpers
    def _check_device(self) -> None:
        """Raise unless the device current now is the one holding the weights."""
        current = _cuda.current_device_id()
        if current != self.device_id:
            raise RuntimeError(
                f"NumbaBackend: the weights were uploaded to CUDA {_cuda.device_label(self.device_id)}, but the "
                f"current device is {_cuda.device_label(current)}; call forward under "
                f"`with cuda.gpus[{self.device_id}]:` or build one backend per device"
            )

    def _gemm(self, a: Any, b: Any, epilogue: str = "none", residual: Any = None, out: Any = None) -> Any:
        return gemm_k.gemm(a, b, epilogue=epilogue, residual=residual, out=out, version=self.gemm_version)

    def _pixels_on_device(self, pixel_values: Any, batch: packing.PackedBatch) -> Any:
        """`[L, 3·p·p]` float32 on the device, validated (shape, dtype, finite); device arrays stay there."""
        p = self.config.patch_size
        L = batch.tokens
        if is_device_array(pixel_values) or hasattr(pixel_values, "__cuda_array_interface__"):
            pv = pixel_values if is_device_array(pixel_values) else cuda.as_cuda_array(pixel_values)
            if np.dtype(pv.dtype) != np.float32:
                raise ValueError(f"device pixel_values must be float32, got {np.dtype(pv.dtype)}")
            if tuple(pv.shape) != (L, 3, p, p):
                raise ValueError(f"pixel_values shape {tuple(pv.shape)} is not [L={L}, 3, {p}, {p}] for grid_thws")
            if not pv.is_c_contiguous():
                raise ValueError("device pixel_values must be C-contiguous")
            pv = pv.reshape(L, 3 * p * p)
            bad = first_nonfinite_row(pv)  # checked on the device: one int comes back
            if bad >= 0:
                raise ValueError(f"pixel_values holds non-finite values (NaN/Inf; first in patch {bad})")
            return pv
        pv, _ = validate_inputs(pixel_values, batch, self.config)
        return cuda.to_device(np.ascontiguousarray(pv.reshape(L, 3 * p * p)))

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        pixel_values: Any,
        grid_thws: Any,
        return_intermediates: bool = False,
        as_numpy: bool = False,
        on_layer: Callable[[int], None] | None = None,
    ) -> Any:
        """Per-item outputs `[n_merged_i, text_hidden]` (device arrays, or NumPy with `as_numpy`);
        with `return_intermediates`, also the stage dict of `reference.vision_forward` (NumPy).
        `on_layer(i)` is called after encoder block i."""
        self._check_device()
        c = self.config
        batch = packing.as_batch(grid_thws, c)
        x_in = self._pixels_on_device(pixel_values, batch)
        H, hd = c.vt_num_attention_heads, c.head_dim
        L = int(x_in.shape[0])
        grid_d = cuda.to_device(batch.grid32)
        tables = attention_k.attention_tables(batch.cu_seqlens, L)  # cu_seqlens + tiles, uploaded once
        ws = Workspace.allocate(L, c.vt_hidden_size, c.qkv_hidden_size, H, c.vt_intermediate_size)
        stages: dict[str, np.ndarray] = {}

        def keep(name: str, value: Any) -> None:
            if return_intermediates:
                stages[name] = value.copy_to_host()

        x = self._gemm(x_in, self.patch_w)
        keep("patch_embed", x)
        pos_emb_k.add_position_embedding(
            x, self.pos_w, self.time, cuda.to_device(batch.item_table), mode=c.pos_emb_interpolation_mode
        )
        keep("pos_emb", x)
        for i, layer in enumerate(self.layers):
            rmsnorm_k.rmsnorm(x, layer["norm0"], c.vit_norm_eps, out=ws.a, rstd=ws.rstd)
            self._gemm(ws.a, layer["wqkv"], out=ws.qkv)
            rope_k.rope2d(ws.qkv, grid_d, tables.cu, H, hd)
            attention_k.attention(ws.qkv, tables, H, version=self.attention_version, out=ws.o, lse=ws.lse)
            self._gemm(ws.o, layer["wo"], "residual", residual=x, out=x)
            rmsnorm_k.rmsnorm(x, layer["norm1"], c.vit_norm_eps, out=ws.a, rstd=ws.rstd)
            self._gemm(ws.a, layer["fc0"], "gelu_tanh", out=ws.h)
            self._gemm(ws.h, layer["fc1"], "residual", residual=x, out=x)
            keep(f"layer_{i}", x)
            if on_layer is not None:
                on_layer(i)
        rmsnorm_k.rmsnorm(x, self.final_norm, c.vit_norm_eps, out=x, rstd=ws.rstd)
        keep("final_norm", x)
        sizes = batch.merged_sizes
        merged = merge_k.merge_gather(x, batch.merge_item_table, c.merge_kernel_size, sum(sizes))
        keep("merged", merged)
        y = self._gemm(self._gemm(merged, self.proj0, "gelu_erf"), self.proj2)
        rmsnorm_k.rmsnorm(y, self.post_norm, c.projector_ln_eps, out=y)
        keep("projected", y)

        bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        y_out = y.copy_to_host() if as_numpy else y
        outputs = [y_out[s:e] for s, e in zip(bounds[:-1], bounds[1:], strict=True)]
        return (outputs, stages) if return_intermediates else outputs
