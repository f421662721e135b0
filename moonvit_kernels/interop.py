"""torch / DLPack / `__cuda_array_interface__` in and out of `MoonViT`, without importing torch.

Inputs (`pixel_values`, `grid_thws`) may be NumPy arrays, torch tensors (CPU or CUDA), CuPy
arrays, numba device arrays, or any object with `__dlpack__` or `__cuda_array_interface__`.
Where they go depends on where the backend computes:

    backend                       host input              CUDA input
    numpy (CPU)                   zero-copy NumPy view    copied to the host (the CPU needs it)
    numba on the CUDA simulator   zero-copy NumPy view    (no GPU: cannot occur)
    numba on a GPU                uploaded by the backend numba device array, zero-copy
                                                          (`numba.cuda.as_cuda_array`)
    cupy                          uploaded by the backend CuPy array, zero-copy (`cupy.from_dlpack`)

`grid_thws` is a few integers and always goes to the host as int64. Weights (a state dict) may be
torch, CuPy or DLPack tensors too: they are taken to the host as NumPy once, when the model is built.

torch specifics: tensors that require grad are detached; `bfloat16` pixels (NumPy has no such
dtype) become float32 on their own device; non-contiguous CUDA tensors are made contiguous on
the device. Outputs with `as_torch=True` are torch tensors sharing memory with the backend's
outputs: `torch.from_numpy` for host outputs, `torch.from_dlpack` for CuPy arrays and
`torch.as_tensor(..., device="cuda")` (`__cuda_array_interface__`) for numba device arrays.

Streams. The backends launch on their own stream (CuPy's current stream, numba's default
stream), not on torch's. So, when a CUDA torch tensor is given, torch's current stream is
synchronised before the first launch (whatever torch queued that writes the input has finished),
and whenever CUDA inputs were given or torch outputs are asked for, the backend's work is
synchronised before `forward` returns (the outputs are complete before torch touches them).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

# DLPack device types (dlpack.h: DLDeviceType).
DLPACK_CPU, DLPACK_CUDA, DLPACK_CUDA_HOST, DLPACK_CUDA_MANAGED = 1, 2, 3, 13
HOST_DEVICE_TYPES = (DLPACK_CPU, DLPACK_CUDA_HOST)
CUDA_DEVICE_TYPES = (DLPACK_CUDA, DLPACK_CUDA_MANAGED)


def torch_module() -> Any:
    """The torch module if it has been imported by the caller (never imports it), else None."""
    return sys.modules.get("torch")


def is_torch_tensor(x: Any) -> bool:
    """True for a torch.Tensor (checked without importing torch)."""
    torch = torch_module()
    return torch is not None and isinstance(x, torch.Tensor)


def location(x: Any) -> str:
    """Where an array lives: "cuda" (device memory), "host" (CPU memory, or not an array yet:
    lists, scalars) or "other" (a DLPack device neither CPU nor CUDA, e.g. ROCm, Metal)."""
    if isinstance(x, np.ndarray):
        return "host"
    if is_torch_tensor(x):
        return "cuda" if x.device.type == "cuda" else ("host" if x.device.type == "cpu" else "other")
    if _has_cuda_array_interface(x):
        return "cuda"
    if hasattr(x, "__dlpack_device__"):
        device_type = int(x.__dlpack_device__()[0])
        if device_type in CUDA_DEVICE_TYPES:
            return "cuda"
        return "host" if device_type in HOST_DEVICE_TYPES else "other"
    return "host"


def _has_cuda_array_interface(x: Any) -> bool:
    try:  # torch raises on CPU tensors; a property may raise anything
        return getattr(x, "__cuda_array_interface__", None) is not None
    except Exception:  # noqa: BLE001
        return False


def _torch_pixels(t: Any) -> Any:
    """A torch tensor ready for export: detached, float32 if it was bfloat16, C-contiguous."""
    torch = torch_module()
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.contiguous()


def to_host(x: Any, name: str) -> Any:
    """`x` as a NumPy array (zero-copy for host memory; a copy for device memory); other objects
    (lists, nested sequences) are returned unchanged for the caller's validation to judge."""
    if isinstance(x, np.ndarray):
        return x
    where = location(x)
    if where == "other":
        device = tuple(x.__dlpack_device__())
        raise ValueError(f"{name} lives on DLPack device {device}: only CPU and CUDA memory are supported")
    if is_torch_tensor(x):
        return _torch_pixels(x).cpu().numpy()
    if where == "host":
        if not hasattr(x, "__dlpack__"):
            return x
        try:
            return np.from_dlpack(x)
        except (BufferError, TypeError, RuntimeError, ValueError) as e:
            raise ValueError(f"{name}: NumPy cannot read this {type(x).__name__} through DLPack ({e})") from None
    # CUDA memory from a non-torch producer: CuPy (`.get()`), numba (`.copy_to_host()`), else via a wrapper.
    for method in ("get", "copy_to_host"):
        if callable(getattr(x, method, None)):
            return np.asarray(getattr(x, method)())
    try:
        return _cupy_from(x).get()
    except ImportError:
        pass
    try:
        from numba import cuda

        return cuda.as_cuda_array(x).copy_to_host()
    except Exception as e:  # noqa: BLE001
        raise ValueError(
            f"{name} is in CUDA memory ({type(x).__name__}) and could not be copied to the host: "
            f"{type(e).__name__}: {e}"
        ) from None


def weights_to_host(weights: Any) -> Any:
    """A state dict whose vision tensors (torch — bfloat16 as float32 —, CuPy, DLPack) are NumPy
    arrays, for `weights.check_weights` and the backends; other entries (a text decoder) are left
    alone, not copied. A non-mapping is returned unchanged for the checks to name."""
    from .weights import is_vision_key

    if not isinstance(weights, Mapping):
        return weights
    return {
        k: to_host(v, f"weight {k!r}") if is_vision_key(k) and not isinstance(v, np.ndarray) else v
        for k, v in weights.items()
    }


def _cupy_from(x: Any) -> Any:
    import cupy

    return cupy.from_dlpack(x) if hasattr(x, "__dlpack__") else cupy.asarray(x)


def to_backend_pixels(x: Any, backend: str, host_backend: bool) -> Any:
    """`pixel_values` in the form `backend` takes without a host round trip (see the module table)."""
    if _native_array(x, backend):
        return x  # the backend's own array type (also numba's simulator arrays): its own checks apply
    if host_backend or location(x) != "cuda":
        return to_host(x, "pixel_values")
    if is_torch_tensor(x):
        x = _torch_pixels(x)
    if backend == "cupy":
        return _cupy_from(x)
    from numba import cuda

    if cuda.is_cuda_array(x):
        return cuda.as_cuda_array(x)
    return cuda.as_cuda_array(_cupy_from(x))  # DLPack-only producers: CuPy reads DLPack, numba reads CuPy


def _native_array(x: Any, backend: str) -> bool:
    """True for the array type a device backend handles itself: numba device arrays, CuPy arrays."""
    module = type(x).__module__.split(".")[0]
    return (backend == "numba" and module == "numba") or (backend == "cupy" and module == "cupy")


def synchronize_torch_inputs(*arrays: Any) -> None:
    """Wait for torch's current stream on the device of every CUDA torch tensor among `arrays`."""
    torch = torch_module()
    for a in arrays:
        if is_torch_tensor(a) and a.device.type == "cuda":
            torch.cuda.current_stream(a.device).synchronize()


def synchronize_backend(backend: str, host_backend: bool) -> None:
    """Wait until every kernel the backend queued has finished (a no-op for host backends)."""
    if host_backend:
        return
    if backend == "cupy":
        import cupy

        cupy.cuda.get_current_stream().synchronize()
    else:
        from numba import cuda

        cuda.synchronize()


def require_torch() -> Any:
    """The torch module, imported; ImportError with the install hint when torch is missing."""
    try:
        import torch
    except ImportError:
        raise ImportError("as_torch=True needs PyTorch: pip install torch (or pip install -e '.[torch]')") from None
    return torch


def to_torch(a: Any) -> Any:
    """A torch tensor sharing memory with `a` (NumPy, CuPy, numba device array, DLPack object)."""
    torch = require_torch()
    if is_torch_tensor(a):
        return a
    if isinstance(a, np.ndarray):
        return torch.from_numpy(a)
    if hasattr(a, "__dlpack__"):
        return torch.from_dlpack(a)
    if _has_cuda_array_interface(a):
        return torch.as_tensor(a, device="cuda")
    raise ValueError(f"cannot hand a {type(a).__name__} to torch (neither NumPy, DLPack nor CUDA array interface)")


def outputs_to_torch(result: Any) -> Any:
    """`MoonViT.forward`'s result (a list of outputs, or `(outputs, stages)`) with every array as torch."""
    if isinstance(result, tuple):
        outputs, stages = result
        return [to_torch(o) for o in outputs], {k: to_torch(v) for k, v in stages.items()}
    return [to_torch(o) for o in result]
