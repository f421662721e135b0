"""The bundled data, shipped inside the package as `moonvit_kernels.data` (`[tool.setuptools.package-dir]` in
pyproject.toml maps this folder there); `moonvit_kernels.bundled` finds it in a clone and in an installed wheel.

- `tiny/`: a tiny bf16 checkpoint in the real K3 tensor names (`config.json`, `model.safetensors`) and
  `inputs.npz` (an image 1×6×8 and a 2-frame video 2×4×4, packed); made by `scripts/make_tiny_checkpoint.py`.
- `golden_tiny/`: every stage's values on those inputs, float32 and float64, with a README and provenance;
  made by `python -m moonvit_kernels golden --weights data/tiny --out data/golden_tiny --float64`.
- `photo/`: a public-domain photograph for the demo.

No code lives here.
"""
