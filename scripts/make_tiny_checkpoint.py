"""Regenerate `data/tiny/`: a tiny bf16 checkpoint in real K3 tensor names, plus bundled inputs.

    python scripts/make_tiny_checkpoint.py [OUT_DIR]   # default: data/tiny of this clone (shipped in the wheel)

Writes `config.json` (a whole-model config holding `vision_config`), `model.safetensors`
(VisionConfig.tiny(), random weights with seed 0, stored as bfloat16) and `inputs.npz`
(`pixel_values`, `grid_thws`: one 6x8-patch image and one 2-frame 4x4-patch video packed together).
Deterministic: running it again gives byte-identical files.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from moonvit_kernels.config import VisionConfig
from moonvit_kernels.weights import random_weights, save_checkpoint

GRID_THWS = np.array([[1, 6, 8], [2, 4, 4]], dtype=np.int64)


def bundled_inputs(config: VisionConfig, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Smooth colour ramps plus noise, normalised to about [-1, 1], cut into patches `[L, 3, p, p]`."""
    rng = np.random.default_rng(seed)
    p = config.patch_size
    items = []
    for t, h, w in GRID_THWS.tolist():
        yy, xx = np.meshgrid(np.linspace(-1, 1, h * p), np.linspace(-1, 1, w * p), indexing="ij")
        for f in range(t):
            img = np.stack([xx, yy, np.sin(3 * xx + 2 * yy + f)], axis=-1) * 0.8
            img = img + 0.2 * rng.standard_normal(img.shape)
            # [H, W, C] -> [h, p, w, p, C] -> [h, w, C, p, p]
            patches = img.reshape(h, p, w, p, 3).transpose(0, 2, 4, 1, 3).reshape(h * w, 3, p, p)
            items.append(patches)
    return np.concatenate(items).astype(np.float32), GRID_THWS.copy()


TINY = Path(__file__).resolve().parents[1] / "data" / "tiny"


def main(out: str | Path = TINY) -> None:
    """Write the tiny checkpoint and its inputs into `out`."""
    config = VisionConfig.tiny()
    out_dir = Path(out)
    save_checkpoint(out_dir, random_weights(config, seed=0), config, dtype="bfloat16")
    pixel_values, grid_thws = bundled_inputs(config)
    np.savez(out_dir / "inputs.npz", pixel_values=pixel_values, grid_thws=grid_thws)
    print(f"wrote {out_dir}: config.json, model.safetensors (bf16), inputs.npz {pixel_values.shape}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
