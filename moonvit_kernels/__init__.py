"""moonvit_kernels: the Kimi K3 vision tower (MoonViT-V2), kernel by kernel.

`VisionConfig` holds the model's hyper-parameters, `reference` is the NumPy oracle of every
stage, `weights` reads and writes checkpoints in the real tensor names; `load_checkpoint` opens a local
checkpoint folder or fetches the vision tensors of an `hf://` / `http(s)://` one (`checkpoints`).

The names below are imported on first use (PEP 562), so importing a submodule such as
`moonvit_kernels.tools.gpu_check` needs nothing beyond the standard library until it asks for more: a missing
dependency then reaches gpu_check's own error report instead of ending the command before it starts.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> the submodule that defines it
_EXPORTS = {
    "VisionConfig": "config",
    "load_checkpoint": "checkpoints",
    "load_weights": "weights",
    "random_weights": "weights",
    "save_weights": "weights",
    "vision_forward": "reference",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'moonvit_kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
