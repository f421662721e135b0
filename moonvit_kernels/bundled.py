"""The small files shipped inside the package (a wheel has them too), found from any working directory.

- `TINY_DIR`: a tiny bf16 checkpoint in the real K3 tensor names (`config.json`, `model.safetensors`) and
  `inputs.npz` (an image 1×6×8 and a 2-frame video 2×4×4, packed); made by `scripts/make_tiny_checkpoint.py`.
- `GOLDEN_DIR`: every stage's values on those inputs, float32 and float64 (made by the `golden` command).
- `PHOTO`: a public-domain photograph for the demo.
"""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
TINY_DIR = DATA_DIR / "tiny"
GOLDEN_DIR = DATA_DIR / "golden_tiny"
PHOTO = DATA_DIR / "photo" / "grace_hopper.jpg"
