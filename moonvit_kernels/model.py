"""`MoonViT`: the whole vision tower + projector on a chosen backend.

    model = MoonViT(config, weights, backend="auto")     # "numpy", "numba", "cupy" or "auto"
    outputs = model(pixel_values, grid_thws)             # list of [n_merged_i, text_hidden]

Backends: "numpy" is the reference (`reference.vision_forward`, CPU); "numba" runs the
numba.cuda kernels (a GPU, or the CUDA simulator on the CPU); "cupy" runs the CUDA C kernels
(GPU only). "auto" picks "cupy" when a GPU and CuPy are present, else "numpy".

torch in, torch out: `pixel_values`/`grid_thws` may be torch tensors (CPU or CUDA), CuPy or numba
arrays, or any DLPack / `__cuda_array_interface__` object; device inputs reach the GPU backends
without a host round trip, and `as_torch=True` returns torch tensors sharing memory with the
outputs. Streams are synchronised explicitly (see `moonvit_kernels.interop`). torch is optional.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from . import interop, packing
from .config import VisionConfig
from .device import gpu_available, simulator_enabled
from .weights import check_weights

BACKENDS = ("numpy", "numba", "cupy")


def cupy_importable() -> bool:
    try:
        import cupy  # noqa: F401
    except Exception:
        return False
    return True


def resolve_backend(backend: str) -> str:
    """The concrete backend name for `backend` ("auto" resolved); ValueError for unknown names."""
    if backend == "auto":
        return "cupy" if gpu_available() and cupy_importable() else "numpy"
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)} or 'auto'")
    return backend


class NumpyBackend:
    """The NumPy reference as a backend (CPU, float32 or float64)."""

    name = "numpy"

    def __init__(self, config: VisionConfig, weights: Mapping[str, np.ndarray], dtype: str = "float32"):
        if dtype not in ("float32", "float64"):
            raise ValueError(f"the numpy backend computes in float32 or float64, not {dtype!r}")
        self.config, self.weights, self.dtype = config, weights, np.dtype(dtype)

    def forward(
        self,
        pixel_values: Any,
        grid_thws: Any,
        return_intermediates: bool = False,
        as_numpy: bool = True,
        on_layer: Callable[[int], None] | None = None,
    ):
        from .reference import vision_forward

        return vision_forward(
            pixel_values,
            grid_thws,
            self.weights,
            self.config,
            self.dtype,
            return_intermediates=return_intermediates,
            on_layer=on_layer,
        )


class MoonViT:
    """The K3 vision tower + projector; weights in checkpoint names, uploaded once by device backends."""

    def __init__(self, config: VisionConfig, weights: Mapping[str, Any], backend: str = "auto", **options: Any):
        weights = interop.weights_to_host(weights)  # a torch state dict is welcome; checked as NumPy
        check_weights(weights, config)
        self.config = config
        self.backend_name = resolve_backend(backend)
        if self.backend_name == "numpy":
            self.backend = NumpyBackend(config, weights, **options)
        elif self.backend_name == "numba":
            from .numba_backend.backend import NumbaBackend

            self.backend = NumbaBackend(config, weights, **options)
        else:
            if not gpu_available():
                raise ValueError("backend 'cupy' needs a CUDA GPU and none was found (use 'numpy' or 'numba')")
            if not cupy_importable():
                raise ValueError("backend 'cupy' needs CuPy: pip install -e '.[cuda12]' or '.[cuda13]'")
            from .cuda_backend.backend import CupyBackend

            self.backend = CupyBackend(config, weights, **options)

    @property
    def computes_on_host(self) -> bool:
        """True when the backend's arrays live in host memory (numpy, or numba on the CUDA simulator)."""
        return self.backend_name == "numpy" or (self.backend_name == "numba" and simulator_enabled())

    def forward(
        self,
        pixel_values: Any,
        grid_thws: Any,
        return_intermediates: bool = False,
        as_numpy: bool = False,
        on_layer: Callable[[int], None] | None = None,
        as_torch: bool = False,
    ):
        """Per-item outputs `[n_merged_i, text_hidden]` (and the stage dict with `return_intermediates`).

        Inputs: NumPy, torch (CPU/CUDA), CuPy, numba device arrays or DLPack objects (`interop`).
        Outputs are the backend's arrays (NumPy, numba device arrays, CuPy), NumPy with `as_numpy`,
        torch tensors sharing their memory with `as_torch` (stages too, where the backend keeps them:
        host copies for numba, device arrays for cupy).
        `on_layer(i)` is called after encoder block i (progress bars)."""
        if as_numpy and as_torch:
            raise ValueError("as_numpy and as_torch exclude each other: choose one output kind")
        if as_torch:
            interop.require_torch()
        host = self.computes_on_host
        device_inputs = interop.location(pixel_values) == "cuda" or interop.location(grid_thws) == "cuda"
        pv = interop.to_backend_pixels(pixel_values, self.backend_name, host)
        if isinstance(grid_thws, packing.PackedBatch):
            batch = packing.as_batch(grid_thws, self.config)
        else:  # validated and packed once, here: the backend takes the batch as it is
            batch = packing.pack(interop.to_host(grid_thws, "grid_thws"), self.config)
        interop.synchronize_torch_inputs(pixel_values, grid_thws)
        result = self.backend.forward(
            pv,
            batch,
            return_intermediates=return_intermediates,
            as_numpy=as_numpy or (as_torch and host),
            on_layer=on_layer,
        )
        if device_inputs or as_torch:
            interop.synchronize_backend(self.backend_name, host)
        return interop.outputs_to_torch(result) if as_torch else result

    __call__ = forward
