"""moonvit_kernels: the Kimi K3 vision tower (MoonViT-V2), kernel by kernel.

`VisionConfig` holds the model's hyper-parameters, `reference` is the NumPy oracle of every
stage, `weights` reads and writes checkpoints in the real tensor names; `load_checkpoint` opens a local
checkpoint folder or fetches the vision tensors of an `hf://` / `http(s)://` one (`checkpoints`).
"""

from .checkpoints import load_checkpoint
from .config import VisionConfig
from .reference import vision_forward
from .weights import load_weights, random_weights, save_weights

__version__ = "0.1.0"

__all__ = [
    "VisionConfig",
    "load_checkpoint",
    "load_weights",
    "random_weights",
    "save_weights",
    "vision_forward",
]
